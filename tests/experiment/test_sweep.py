"""The sweep design: Williams balance counted, Dunnett critical values against published
tables, the fit and the best-arm rule on hand-made legs, exactness per arm."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from tokrecord.experiment.stats import LegFigures, Verdict
from tokrecord.experiment.sweep import (
    SweepLegInput,
    dunnett_critical,
    sweep_analysis,
    sweep_design,
    sweep_power,
    sweep_record_gate,
    williams_sequences,
)


@pytest.mark.parametrize("k", range(2, 9))
def test_williams_balances_position_and_carry_over(k: int) -> None:
    seqs = williams_sequences(k)
    assert len(seqs) == (k if k % 2 == 0 else 2 * k)
    assert all(sorted(s) == list(range(k)) for s in seqs)
    reps = len(seqs) // k
    for pos in range(k):  # each arm equally often in each position
        assert Counter(s[pos] for s in seqs) == {a: reps for a in range(k)}
    follows = Counter((s[i], s[i + 1]) for s in seqs for i in range(k - 1))
    # each ordered pair of distinct arms adjacent equally often; no arm follows itself
    assert follows == {(a, b): reps for a in range(k) for b in range(k) if a != b}


def test_odd_k_alternates_the_two_squares() -> None:
    seqs = williams_sequences(3)
    assert seqs[0] == (0, 1, 2) and seqs[1] == (2, 1, 0) and seqs[2] == (1, 2, 0)


def test_design_runs_every_arm_once_per_block() -> None:
    legs = sweep_design(("ctl", "x", "y", "z"), 5)
    assert len(legs) == 20
    for b in range(1, 6):
        assert sorted(leg.arm for leg in legs if leg.block == b) == ["ctl", "x", "y", "z"]
    assert legs[0].name == "A1" and {leg.name[0] for leg in legs if leg.arm == "z"} == {"D"}
    # block 5 starts the square again
    assert [leg.arm for leg in legs[16:]] == [leg.arm for leg in legs[:4]]


# Published two-sided and one-sided 0.05 Dunnett tables (Dunnett 1955/1964; e.g. the
# tables in Montgomery's Design and Analysis of Experiments), p comparisons, df.
@pytest.mark.parametrize(("p", "df", "two", "one"), [
    (1, 10, 2.23, 1.81), (2, 10, 2.57, 2.15), (3, 10, 2.76, 2.34), (4, 10, 2.89, 2.47),
    (5, 10, 2.99, 2.56), (2, 20, 2.38, 2.03), (4, 20, 2.65, 2.30),
])
def test_dunnett_matches_the_published_tables(p: int, df: int, two: float, one: float) -> None:
    assert dunnett_critical(p, df, 0.95) == pytest.approx(two, abs=0.006)
    assert dunnett_critical(p, df, 0.95, two_sided=False) == pytest.approx(one, abs=0.006)


def test_one_comparison_is_students_t() -> None:
    from scipy import stats

    for df in (2, 3, 7):
        assert dunnett_critical(1, df, 0.95) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-4)


def _legs(effects: dict[str, float], blocks: int, noise: dict[tuple[str, int], float],
          inexact: frozenset[str] = frozenset()) -> list[SweepLegInput]:
    """Legs with 5 rows each; every row of a leg at rate 100 * exp(arm effect + leg noise)."""
    out = []
    arms = list(effects)
    for b in range(1, blocks + 1):
        for i, arm in enumerate(arms):
            rate = 100 * math.exp(effects[arm] + noise.get((arm, b), 0.0))
            out.append(SweepLegInput(
                figures=LegFigures(name=f"{'ABCD'[i]}{b}", arm=arm, headline=rate,
                                   row_rates=(rate,) * 5, aggregate_cycle_ms=None,
                                   acceptance_rate=None),
                block=b, exact=arm not in inexact))
    return out


def test_fit_and_dunnett_interval_by_hand() -> None:
    # 3 arms x 2 blocks; block 1 noise +e, block 2 -e on arm "b" only: residuals are hand-made
    e = 0.01
    legs = _legs({"ctl": 0.0, "b": 0.06, "c": 0.0}, 2, {("b", 1): e, ("b", 2): -e})
    a = sweep_analysis(legs, ["ctl", "b", "c"], "ctl", 0.95, 1.0)
    assert a.df == 2 and a.blocks == 2
    # residuals of a two-way fit of the 3x2 table: b's cells +-2e/3, the others -+e/3
    s2 = (2 * (2 * e / 3) ** 2 + 4 * (e / 3) ** 2) / 2
    assert a.residual_sd_pct == pytest.approx(100 * math.sqrt(s2), rel=1e-9)
    # one-sided Dunnett at 0.975 (published one-sided table value at 2 comparisons, 2 df:
    # 5.53) is above the two-sided 5.418; the sweep spends 0.8 of alpha/2 a side, so its
    # value (at 1 - 0.02) is larger still
    assert dunnett_critical(2, 2, 0.975, two_sided=False) == pytest.approx(5.53, abs=0.01)
    assert dunnett_critical(2, 2, 0.975, two_sided=False) > dunnett_critical(2, 2, 0.95)
    c = dunnett_critical(2, 2, 0.98, two_sided=False)
    assert c > dunnett_critical(2, 2, 0.975, two_sided=False)
    assert a.critical_value == pytest.approx(c, rel=1e-12)
    se = math.sqrt(2 * s2 / 2)
    b = next(x for x in a.contrasts if x.arm == "b")
    assert b.ratio == pytest.approx(math.exp(0.06), rel=1e-12)
    assert b.ci_low == pytest.approx(math.exp(0.06 - c * se), rel=1e-9)
    assert b.ci_high == pytest.approx(math.exp(0.06 + c * se), rel=1e-9)
    assert b.verdict is Verdict.FASTER


def test_best_arm_claimed_only_when_it_clears_every_other() -> None:
    rng = np.random.default_rng(3)
    noise = {(a, b): float(rng.normal(0, 0.005)) for a in ("ctl", "x", "y") for b in range(1, 5)}
    clear = sweep_analysis(_legs({"ctl": 0.0, "x": 0.10, "y": 0.02}, 4, noise),
                           ["ctl", "x", "y"], "ctl", 0.95, 1.0)
    assert clear.best == "x" and "arm x is fastest" in clear.best_statement
    close = sweep_analysis(_legs({"ctl": 0.0, "x": 0.10, "y": 0.099}, 4, noise),
                           ["ctl", "x", "y"], "ctl", 0.95, 1.0)
    assert close.best is None and "no arm is singled out" in close.best_statement
    assert {c.verdict for c in close.contrasts} == {Verdict.FASTER}


def test_an_inexact_arm_is_never_best() -> None:
    rng = np.random.default_rng(4)
    noise = {(a, b): float(rng.normal(0, 0.005)) for a in ("ctl", "x", "y") for b in range(1, 5)}
    legs = _legs({"ctl": 0.0, "x": 0.10, "y": 0.05}, 4, noise, inexact=frozenset({"x"}))
    a = sweep_analysis(legs, ["ctl", "x", "y"], "ctl", 0.95, 1.0)
    assert a.best == "y" and "not token-exact, never best: x" in a.best_statement
    x = next(s for s in a.arm_summaries if s.arm == "x")
    assert not x.exact and x.inexact_legs == ("B1", "B2", "B3", "B4")
    # x is still reported against control, as fast as it is
    assert next(c for c in a.contrasts if c.arm == "x").verdict is Verdict.FASTER


def test_incomplete_blocks_are_dropped_and_named() -> None:
    legs = _legs({"ctl": 0.0, "x": 0.05, "y": 0.0}, 3, {("x", 1): 0.01, ("y", 2): 0.01})
    a = sweep_analysis(legs[:-1], ["ctl", "x", "y"], "ctl", 0.95, 1.0)
    assert a.dropped_blocks == (3,) and a.blocks == 2 and len(a.order) == 6


def test_too_few_blocks_make_no_claim() -> None:
    a = sweep_analysis(_legs({"ctl": 0.0, "x": 0.05}, 2, {}), ["ctl", "x"], "ctl", 0.95, 1.0)
    assert a.df == 1 and a.contrasts == () and a.best is None


def test_record_gate_needs_gates_family_wise_win_and_the_prior() -> None:
    rng = np.random.default_rng(5)
    noise = {(a, b): float(rng.normal(0, 0.005)) for a in ("ctl", "x", "y") for b in range(1, 5)}
    legs = _legs({"ctl": 0.0, "x": 0.10, "y": 0.02}, 4, noise)
    a = sweep_analysis(legs, ["ctl", "x", "y"], "ctl", 0.95, 1.0)
    every = {leg.figures.name: True for leg in legs}
    assert sweep_record_gate(a, every, None).passed
    assert sweep_record_gate(a, every, 100.0).passed  # x's slowest leg is ~110
    assert not sweep_record_gate(a, every, 200.0).passed
    failed = sweep_record_gate(a, {**every, "B3": False}, None)
    assert not failed.passed and "gates failed in B3" in failed.reasons[0]


def test_power_grows_with_blocks_and_effect() -> None:
    low = sweep_power(3.0, 2.0, 5, 2, 0.95)
    high = sweep_power(3.0, 2.0, 5, 8, 0.95)
    assert 0 <= low < high <= 1
    assert sweep_power(1.0, 2.0, 5, 8, 0.95) < high
    assert sweep_power(3.0, 2.0, 5, 1, 0.95) == 0.0


def test_family_false_faster_is_half_alpha_in_every_cell() -> None:
    from tokrecord.experiment.sweep import family_false_faster

    # P(some arm's interval above 1 | all equal, normal figures) is 0.8 alpha/2 exactly
    # (SWEEP_ALPHA_SHARE: room for the real figure's heavier tails, bench/verdict/sweep):
    # with two-sided Dunnett it was alpha/2 + P(some above and some below)/2, over the bar
    # at every k >= 3 (2.597 % at 3 arms x 2 blocks, 2.504 % at 5 arms x 4 blocks)
    for k, df in ((2, 6), (3, 2), (5, 12), (8, 21)):
        assert family_false_faster(k, df, 0.95) == pytest.approx(0.02, abs=2e-6)


def test_power_report_counts_legs_and_wall_time() -> None:
    from tokrecord.experiment.sweep import sweep_power_report

    r = sweep_power_report(5, 4, 1.11, 3.42, 13, 0.95, leg_s=43.0, effects=(5.0,))
    assert r.legs == 20 and r.df == 12 and r.wall_s == pytest.approx(20 * 43.0)
    assert r.leg_sd_pct == pytest.approx(math.sqrt(1.11**2 + (math.pi / 3) * 3.42**2 / 13))
    (e,) = r.entries
    assert e.blocks_for_target is not None and e.blocks_for_target > 4 > 0 < e.power < 0.9
