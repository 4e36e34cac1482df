"""Pairs, the paired bootstrap, the verdict and the record gate (pure functions).

Expected values are computed by hand or taken from seeds/abba-experiment-record.json.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.experiment.plan import Criteria, VerdictSpec
from tokrecord.experiment.stats import (
    BootstrapResult,
    LegFigures,
    PairResult,
    Verdict,
    pair_result,
    paired_bootstrap,
    pct_delta,
    record_gate,
    verdict,
)

SEED = json.loads(
    (FIXTURES_DIR / "seeds" / "abba-experiment-record.json").read_text()
)
RUNS = SEED["runs"]
REL = 1e-12


def leg(name: str, arm: str = "candidate", headline: float | None = 100.0,
        rows: tuple[float | None, ...] = (), cycle_ms: float | None = None,
        acceptance: float | None = None) -> LegFigures:
    return LegFigures(name=name, arm=arm, headline=headline, row_rates=rows,
                      aggregate_cycle_ms=cycle_ms, acceptance_rate=acceptance)


def seed_leg(name: str) -> LegFigures:
    run = RUNS[name]
    return leg(name, run["treatment"], run["headline_tok_s"], (1.0,),
               run["aggregate_cycle_ms"], run["accepted_draft_tokens"] / run["draft_tokens"])


# --------------------------------------------------------------------------- pct_delta / pairs


def test_pct_delta_on_seed_headlines() -> None:
    assert pct_delta(34.55070137147406, 32.826917069383214) == pytest.approx(
        5.251130645157587, rel=REL)
    assert pct_delta(33.89498511171744, 33.27343466250297) == pytest.approx(
        1.8680080836827928, rel=REL)
    assert pct_delta(110.0, 100.0) == pytest.approx(10.0, rel=REL)
    assert pct_delta(90.0, 100.0) == pytest.approx(-10.0, rel=REL)
    assert pct_delta(100.0, 100.0) == 0.0


@pytest.mark.parametrize("cand, ctrl", [("B1", "A1"), ("B2", "A2")])
def test_pair_result_reproduces_seed_pair_figures(cand: str, ctrl: str) -> None:
    expected = SEED["pair_results"][f"{cand}_vs_{ctrl}"]
    result = pair_result(seed_leg(cand), seed_leg(ctrl), Criteria())
    assert result.candidate == cand and result.control == ctrl
    assert result.headline_delta_pct == pytest.approx(expected["headline_delta_pct"], rel=REL)
    assert result.aggregate_cycle_saving_ms == pytest.approx(
        expected["aggregate_cycle_saving_ms"], rel=REL)
    assert result.acceptance_rate_delta_percentage_points == pytest.approx(
        expected["acceptance_rate_delta_percentage_points"], rel=REL, abs=1e-15)


def test_seed_cycle_saving_and_acceptance_deltas_by_hand() -> None:
    b1_a1 = pair_result(seed_leg("B1"), seed_leg("A1"), Criteria())
    # A1 92.43822692389881 - B1 88.94829874530673
    assert b1_a1.aggregate_cycle_saving_ms == pytest.approx(3.4899281785920806, rel=REL)
    # 4642/12040 on both legs: exactly no change
    assert b1_a1.acceptance_rate_delta_percentage_points == 0.0
    b2_a2 = pair_result(seed_leg("B2"), seed_leg("A2"), Criteria())
    # 100 * (4642/12040 - 4643/12033)
    assert b2_a2.acceptance_rate_delta_percentage_points == pytest.approx(
        -0.030739110855998453, rel=REL)
    assert b2_a2.acceptance_rate_delta_percentage_points == pytest.approx(
        SEED["pair_results"]["B2_vs_A2"]["acceptance_rate_delta_percentage_points"])


def test_missing_engine_figures_give_none() -> None:
    result = pair_result(leg("B1", rows=(11.0,)), leg("A1", "control", rows=(10.0,)), Criteria())
    assert result.aggregate_cycle_saving_ms is None
    assert result.acceptance_rate_delta_percentage_points is None
    # only one side known: still None, never a half-computed number
    one_sided = pair_result(leg("B1", rows=(11.0,), cycle_ms=5.0, acceptance=0.5),
                            leg("A1", "control", rows=(10.0,)), Criteria())
    assert one_sided.aggregate_cycle_saving_ms is None
    assert one_sided.acceptance_rate_delta_percentage_points is None


def test_row_wins_and_paired_median_even_count() -> None:
    # per-row deltas: +10, -10, +20, +5 -> sorted -10, 5, 10, 20 -> median 7.5; wins 3
    result = pair_result(leg("B1", headline=105.0, rows=(11.0, 9.0, 12.0, 10.5)),
                         leg("A1", "control", headline=100.0, rows=(10.0, 10.0, 10.0, 10.0)),
                         Criteria())
    assert result.candidate_row_wins == "3/4"
    assert result.paired_median_delta_pct == pytest.approx(7.5, rel=1e-12)
    assert result.headline_delta_pct == pytest.approx(5.0, rel=1e-12)
    assert result.passed and result.failed_criteria == ()


def test_row_wins_and_paired_median_odd_count() -> None:
    # per-row deltas: +20 (24 vs 20), -10 (9 vs 10), +5 (42 vs 40) -> median 5
    result = pair_result(leg("B2", rows=(24.0, 9.0, 42.0)),
                         leg("A2", "control", headline=99.0, rows=(20.0, 10.0, 40.0)),
                         Criteria())
    assert result.candidate_row_wins == "2/3"
    assert result.paired_median_delta_pct == pytest.approx(5.0, rel=1e-12)
    assert result.passed


def test_rows_without_rates_are_skipped() -> None:
    # comparable rows: 0 (+10 %), 3 (+30 %), 4 (-50 %); rows 1 and 2 have no rate on one side
    result = pair_result(leg("B1", rows=(11.0, None, 50.0, 13.0, 5.0)),
                         leg("A1", "control", headline=99.0, rows=(10.0, 10.0, None, 10.0, 10.0)),
                         Criteria())
    assert result.paired_median_delta_pct == pytest.approx(10.0, rel=1e-12)
    # row 2 (50 vs None) would have been a win: it is not counted; the denominator is the suite
    assert result.candidate_row_wins == "2/5"
    assert not result.passed
    assert result.failed_criteria == ("row wins 2/5 not > 0.5",)


def test_a_tie_is_not_a_win() -> None:
    result = pair_result(leg("B1", rows=(10.0, 10.0, 11.0)),
                         leg("A1", "control", headline=99.0, rows=(10.0, 10.0, 10.0)), Criteria())
    assert result.candidate_row_wins == "1/3"


def test_row_wins_exactly_half_is_not_more_than_half() -> None:
    half = pair_result(leg("B1", rows=(11.0, 11.0, 9.0, 9.5)),
                       leg("A1", "control", headline=90.0, rows=(10.0, 10.0, 10.0, 10.0)),
                       Criteria())
    # deltas +10, +10, -10, -5 -> median +2.5 > 0; headline +11.1 %; only the row wins fail
    assert half.candidate_row_wins == "2/4"
    assert half.paired_median_delta_pct == pytest.approx(2.5, rel=1e-12)
    assert not half.passed
    assert half.failed_criteria == ("row wins 2/4 not > 0.5",)
    more = pair_result(leg("B1", rows=(11.0, 11.0, 10.5, 9.5)),
                       leg("A1", "control", headline=90.0, rows=(10.0, 10.0, 10.0, 10.0)),
                       Criteria())
    assert more.candidate_row_wins == "3/4" and more.passed


def test_headline_criterion_fails_alone() -> None:
    # every row faster, but the headline (median) delta is negative
    result = pair_result(leg("B1", headline=99.0, rows=(11.0, 11.0, 11.0)),
                         leg("A1", "control", headline=100.0, rows=(10.0, 10.0, 10.0)),
                         Criteria())
    assert not result.passed
    assert len(result.failed_criteria) == 1
    assert result.failed_criteria[0].startswith("headline delta -1.000 % not > 0 %")


def test_headline_equal_to_threshold_fails() -> None:
    result = pair_result(leg("B1", headline=100.0, rows=(11.0,)),
                         leg("A1", "control", headline=100.0, rows=(10.0,)), Criteria())
    assert [f.split(" ")[0] for f in result.failed_criteria] == ["headline"]


def test_paired_median_criterion_fails_alone() -> None:
    # deltas +1, +1, +1: passes the default (> 0) but not a preregistered > 2 %
    criteria = Criteria(paired_median_delta_pct_gt=2.0)
    result = pair_result(leg("B1", headline=110.0, rows=(10.1, 20.2, 30.3)),
                         leg("A1", "control", headline=100.0, rows=(10.0, 20.0, 30.0)), criteria)
    assert result.paired_median_delta_pct == pytest.approx(1.0, rel=1e-9)
    assert result.failed_criteria == ("paired median delta 1.000 % not > 2 %",)


def test_every_failing_criterion_is_named() -> None:
    result = pair_result(leg("B1", headline=90.0, rows=(9.0, 9.0, 11.0)),
                         leg("A1", "control", headline=100.0, rows=(10.0, 10.0, 10.0)),
                         Criteria())
    names = [f.split(" delta")[0].split(" 1/")[0] for f in result.failed_criteria]
    assert names == ["headline", "paired median", "row wins"]
    assert result.candidate_row_wins == "1/3" and not result.passed


def test_no_comparable_rows_and_no_headline() -> None:
    result = pair_result(leg("B1", headline=None, rows=(None, None)),
                         leg("A1", "control", headline=100.0, rows=(10.0, 10.0)), Criteria())
    assert result.headline_delta_pct is None and result.paired_median_delta_pct is None
    assert result.candidate_row_wins == "0/2" and not result.passed
    assert result.failed_criteria[0] == "headline delta n/a % not > 0 %"
    assert result.failed_criteria[1] == "paired median delta n/a % not > 0 %"


# --------------------------------------------------------------------------- verdict


@pytest.mark.parametrize(
    "low, high, eq, expected",
    [
        (1.02, 1.08, 1.0, Verdict.FASTER),
        (1.005, 1.02, 1.0, Verdict.FASTER),  # excludes 1, reaches beyond +1 %
        (0.92, 0.98, 1.0, Verdict.SLOWER),
        (0.98, 0.995, 1.0, Verdict.SLOWER),
        (0.995, 1.005, 1.0, Verdict.NO_DIFFERENCE),
        (1.002, 1.008, 1.0, Verdict.NO_DIFFERENCE),  # excludes 1 but within ±1 %: too small
        (0.992, 0.998, 1.0, Verdict.NO_DIFFERENCE),
        (1 - 0.01, 1 + 0.01, 1.0, Verdict.NO_DIFFERENCE),  # the bounds are inclusive
        (0.98, 1.03, 1.0, Verdict.UNDECIDED),
        (0.995, 1.03, 1.0, Verdict.UNDECIDED),  # overlaps 1 and leaves the band
        (1.0, 1.05, 1.0, Verdict.UNDECIDED),  # a bound at exactly 1 does not exclude 1
        (0.95, 1.0, 1.0, Verdict.UNDECIDED),
        (1.0, 1.0, 0.0, Verdict.NO_DIFFERENCE),
        (1.001, 1.002, 0.0, Verdict.FASTER),
        (1.03, 1.04, 5.0, Verdict.NO_DIFFERENCE),  # a wide equivalence band swallows 3-4 %
        (1.03, 1.06, 5.0, Verdict.FASTER),
    ],
)
def test_verdict(low: float, high: float, eq: float, expected: Verdict) -> None:
    assert verdict(low, high, eq) is expected


def test_verdict_values_are_the_published_words() -> None:
    assert [v.value for v in Verdict] == ["FASTER", "SLOWER", "NO DIFFERENCE", "UNDECIDED"]


# --------------------------------------------------------------------------- paired bootstrap


def spec(samples: int = 2000, seed: int = 0, eq: float = 1.0) -> VerdictSpec:
    return VerdictSpec(bootstrap_samples=samples, seed=seed, equivalence_pct=eq)


def noisy_pair(n: int, seed: int, uplift: float = 1.05, noise: float = 0.03,
               base: float = 100.0) -> tuple[LegFigures, LegFigures]:
    rng = np.random.default_rng(seed)
    ctrl = base * (1 + 10 * noise * rng.standard_normal(n) ** 2)  # rows differ
    cand = ctrl * uplift * (1 + noise * rng.standard_normal(n))  # row-level noise
    return (leg("B", rows=tuple(float(x) for x in cand)),
            leg("A", "control", rows=tuple(float(x) for x in ctrl)))


def test_bootstrap_point_ratio_by_hand() -> None:
    # pair 1 medians 12 / 10, pair 2 medians 21 / 20 -> (12 + 21) / 2 / ((10 + 20) / 2) = 1.1
    p1 = (leg("B1", rows=(10.0, 12.0, 14.0)), leg("A1", "control", rows=(10.0, 10.0, 10.0)))
    p2 = (leg("B2", rows=(20.0, 22.0)), leg("A2", "control", rows=(20.0, 20.0)))
    result = paired_bootstrap([p1, p2], spec())
    assert result is not None
    assert result.ratio == pytest.approx(1.1, rel=1e-12)
    assert result.ci_low <= result.ratio <= result.ci_high
    assert result.samples == 2000 and result.seed == 0 and result.confidence == 0.95
    assert result.equivalence_pct == 1.0


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    pairs = [noisy_pair(13, 1), noisy_pair(13, 2)]
    a = paired_bootstrap(pairs, spec(seed=7))
    b = paired_bootstrap(pairs, spec(seed=7))
    c = paired_bootstrap(pairs, spec(seed=8))
    assert a is not None and b is not None and c is not None
    assert a == b
    assert (c.ci_low, c.ci_high) != (a.ci_low, a.ci_high)
    assert c.ratio == a.ratio  # the point estimate does not depend on the seed


def test_constant_uplift_on_every_row_gives_degenerate_ci() -> None:
    ctrl = (31.0, 47.5, 28.25, 33.0, 52.0, 40.0)
    cand = tuple(x * 1.05 for x in ctrl)
    pairs = [(leg("B1", rows=cand), leg("A1", "control", rows=ctrl)),
             (leg("B2", rows=cand[::-1]), leg("A2", "control", rows=ctrl[::-1]))]
    result = paired_bootstrap(pairs, spec())
    assert result is not None
    assert result.ratio == pytest.approx(1.05, rel=1e-12)
    assert result.ci_low == pytest.approx(1.05, rel=1e-12)
    assert result.ci_high == pytest.approx(1.05, rel=1e-12)
    assert result.verdict is Verdict.FASTER


def test_noisy_five_percent_uplift() -> None:
    result = paired_bootstrap([noisy_pair(40, 11), noisy_pair(40, 12)], spec())
    assert result is not None
    assert result.ratio == pytest.approx(1.05, abs=0.015)
    assert result.ci_low < 1.05 < result.ci_high
    assert result.ci_low > 1.0
    assert result.verdict is Verdict.FASTER is verdict(result.ci_low, result.ci_high, 1.0)


def test_ci_narrows_with_more_rows() -> None:
    small = paired_bootstrap([noisy_pair(8, 3), noisy_pair(8, 4)], spec())
    large = paired_bootstrap([noisy_pair(400, 3), noisy_pair(400, 4)], spec())
    assert small is not None and large is not None
    width_small = small.ci_high - small.ci_low
    width_large = large.ci_high - large.ci_low
    assert width_large < width_small / 3


def test_no_comparable_rows_in_one_pair_gives_none() -> None:
    good = (leg("B1", rows=(11.0, 12.0)), leg("A1", "control", rows=(10.0, 10.0)))
    bad = (leg("B2", rows=(None, 12.0)), leg("A2", "control", rows=(10.0, None)))
    assert paired_bootstrap([good, bad], spec()) is None
    assert paired_bootstrap([good], spec()) is not None


def test_rows_without_rates_are_dropped_from_the_bootstrap() -> None:
    cand = (21.0, None, 42.0, 63.0)
    ctrl = (20.0, 30.0, 40.0, 60.0)
    result = paired_bootstrap([(leg("B1", rows=cand), leg("A1", "control", rows=ctrl))], spec())
    assert result is not None
    assert result.ratio == pytest.approx(1.05, rel=1e-12)
    assert result.ci_low == pytest.approx(1.05, rel=1e-12)
    assert result.ci_high == pytest.approx(1.05, rel=1e-12)


def test_bootstrap_keeps_rows_paired() -> None:
    # Rows differ wildly (5 .. 5000 tok/s); the candidate is the control * 1.05 row by row,
    # with ±0.2 % noise. Resampling the two legs independently would give a CI spanning
    # orders of magnitude; resampling the same rows on both gives a tight CI around 1.05.
    rng = np.random.default_rng(5)
    ctrl = np.array([5.0, 5000.0, 40.0, 900.0, 12.0, 2500.0, 150.0, 70.0, 3300.0, 8.0, 600.0])
    cand = ctrl * 1.05 * (1 + 0.002 * rng.uniform(-1, 1, ctrl.size))
    pairs = [(leg("B1", rows=tuple(cand.tolist())), leg("A1", "control", rows=tuple(ctrl.tolist()))),
             (leg("B2", rows=tuple(cand[::-1].tolist())),
              leg("A2", "control", rows=tuple(ctrl[::-1].tolist())))]
    result = paired_bootstrap(pairs, spec(samples=5000))
    assert result is not None
    assert result.ci_high - result.ci_low < 0.01
    assert result.ci_low <= 1.05 * 1.002 and result.ci_high >= 1.05 * 0.998
    assert result.ratio == pytest.approx(1.05, abs=0.003)
    assert result.verdict is Verdict.FASTER


# --------------------------------------------------------------------------- record gate


def passed_pair(cand: str, ctrl: str, passed: bool = True) -> PairResult:
    return PairResult(candidate=cand, control=ctrl, headline_delta_pct=1.0,
                      candidate_row_wins="13/13", paired_median_delta_pct=1.0,
                      aggregate_cycle_saving_ms=None, acceptance_rate_delta_percentage_points=None,
                      passed=passed, failed_criteria=() if passed else ("headline",))


def boot(v: Verdict) -> BootstrapResult:
    return BootstrapResult(ratio=1.03, ci_low=1.01, ci_high=1.05, confidence=0.95,
                           samples=100, seed=0, equivalence_pct=1.0, verdict=v)


SEED_PRIOR = SEED["prior_approved_record"]["tok_s"]
GOOD_PAIRS = [passed_pair("B1", "A1"), passed_pair("B2", "A2")]


def seed_gate(**overrides: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "candidates": [seed_leg("B1"), seed_leg("B2")],
        "controls": [seed_leg("A1"), seed_leg("A2")],
        "pairs": GOOD_PAIRS, "quality_passed": True, "prior": SEED_PRIOR,
        "found": Verdict.FASTER, "require_faster": True,
    }
    args.update(overrides)
    return record_gate(**args)  # type: ignore[arg-type]


def test_record_gate_on_seed() -> None:
    gate = seed_gate()
    expected = SEED["record_gate"]
    assert gate.candidate_lower_start_tok_s == 33.89498511171744
    assert gate.candidate_higher_start_tok_s == 34.55070137147406
    assert gate.control_lower_start_tok_s == 32.826917069383214
    assert gate.prior_record_tok_s == 33.438926675602126
    assert gate.delta_vs_prior_record_tok_s == pytest.approx(0.45605843611531327, rel=REL)
    assert gate.delta_vs_prior_record_pct == pytest.approx(1.363854888464661, rel=REL)
    for key in ("candidate_lower_start_tok_s", "candidate_higher_start_tok_s",
                "control_lower_start_tok_s", "prior_record_tok_s",
                "delta_vs_prior_record_tok_s", "delta_vs_prior_record_pct"):
        assert getattr(gate, key) == pytest.approx(expected[key], rel=REL), key
    assert gate.strict_preregistered_record_pass is True
    assert gate.reasons == ()
    assert gate.verdict is Verdict.FASTER and gate.pairs_passed and gate.quality_passed_all_legs


def test_record_gate_order_of_legs_does_not_matter() -> None:
    gate = seed_gate(candidates=[seed_leg("B2"), seed_leg("B1")],
                     controls=[seed_leg("A2"), seed_leg("A1")])
    assert gate.candidate_lower_start_tok_s == 33.89498511171744
    assert gate.control_lower_start_tok_s == 32.826917069383214  # min of the controls


def test_record_gate_without_required_verdict() -> None:
    gate = seed_gate(found=None, require_faster=False)
    assert gate.strict_preregistered_record_pass and gate.reasons == () and gate.verdict is None
    gate = seed_gate(found=Verdict.NO_DIFFERENCE, require_faster=False)
    assert gate.strict_preregistered_record_pass and gate.verdict is Verdict.NO_DIFFERENCE


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"quality_passed": False}, "a quality gate did not pass in every leg"),
        ({"pairs": [passed_pair("B1", "A1"), passed_pair("B2", "A2", passed=False)]},
         "not every pair passed its preregistered criteria"),
        ({"pairs": []}, "not every pair passed its preregistered criteria"),
        ({"found": None}, "verdict is not computed, not FASTER"),
        ({"found": Verdict.NO_DIFFERENCE}, "verdict is NO DIFFERENCE, not FASTER"),
        ({"found": Verdict.UNDECIDED}, "verdict is UNDECIDED, not FASTER"),
        ({"found": Verdict.SLOWER}, "verdict is SLOWER, not FASTER"),
        ({"prior": 34.0}, "lower candidate headline 33.895 does not beat the prior record 34.000"),
        ({"prior": None}, "no prior record declared in the plan"),
    ],
)
def test_each_failing_condition_gives_its_reason(overrides: dict[str, object],
                                                 reason: str) -> None:
    gate = seed_gate(**overrides)
    assert gate.strict_preregistered_record_pass is False
    assert gate.reasons == (reason,)


def test_candidate_equal_to_prior_does_not_beat_it() -> None:
    gate = seed_gate(prior=33.89498511171744)
    assert gate.delta_vs_prior_record_tok_s == 0.0 and gate.delta_vs_prior_record_pct == 0.0
    assert not gate.strict_preregistered_record_pass
    assert gate.reasons[0].startswith("lower candidate headline 33.895 does not beat")


def test_no_prior_leaves_the_deltas_empty() -> None:
    gate = seed_gate(prior=None)
    assert gate.prior_record_tok_s is None
    assert gate.delta_vs_prior_record_tok_s is None and gate.delta_vs_prior_record_pct is None
    assert gate.candidate_lower_start_tok_s == 33.89498511171744


def test_candidate_leg_without_headline() -> None:
    gate = seed_gate(candidates=[seed_leg("B1"), leg("B2", headline=None)])
    assert gate.candidate_lower_start_tok_s is None
    assert gate.candidate_higher_start_tok_s == 34.55070137147406
    assert gate.reasons == ("a candidate leg has no headline",)
    assert not gate.strict_preregistered_record_pass


def test_every_reason_is_listed_together() -> None:
    gate = seed_gate(quality_passed=False, pairs=[], prior=None, found=None)
    assert gate.reasons == (
        "a quality gate did not pass in every leg",
        "not every pair passed its preregistered criteria",
        "no prior record declared in the plan",
        "verdict is not computed, not FASTER",
    )
