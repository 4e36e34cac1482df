"""The sequential stopping rule: spending, boundaries, looks; the plan's [sequential]."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from tokrecord.errors import ConfigError
from tokrecord.experiment.interim import abba_looks, sequential_analysis
from tokrecord.experiment.plan import (
    CURRENT_SEQUENTIAL_METHOD,
    Plan,
    SequentialMethod,
    Spending,
    load_plan,
    parse_plan,
)
from tokrecord.experiment.sequential import (
    _CODES,
    SEQUENTIAL_METHOD,
    SEQUENTIAL_METHOD_V2,
    Action,
    Design,
    LookInput,
    Outcome,
    Paths,
    adjusted_estimate,
    analyse,
    boundaries,
    draw_paths,
    run_paths,
    spent,
    t_boundaries,
    t_boundary,
    z_boundaries,
)
from tokrecord.experiment.stats import AnalysisLeg, LegFigures, Verdict

FIVE = (0.2, 0.4, 0.6, 0.8, 1.0)
BASE = {"name": "seq", "server": {"argv": ["llama-server", "-m", "m.gguf"], "model": "m"},
        "arms": {"control": {}, "candidate": {}}}


def test_obrien_fleming_boundaries_match_the_published_table() -> None:
    # Lan-DeMets O'Brien-Fleming-type spending, 5 equal looks, one-sided 0.025
    # (Jennison & Turnbull 2000, table 7.6; gsDesign and ldbounds give the same).
    found = z_boundaries(FIVE, 0.025, Spending.OBRIEN_FLEMING)
    assert found == pytest.approx((4.8769, 3.3569, 2.6803, 2.2898, 2.0310), abs=2e-3)


def test_pocock_boundaries_match_the_published_table() -> None:
    found = z_boundaries(FIVE, 0.025, Spending.POCOCK)
    assert found == pytest.approx((2.4380, 2.4268, 2.4101, 2.3966, 2.3860), abs=2e-3)


@pytest.mark.parametrize("spending", list(Spending))
def test_spending_ends_at_alpha_and_grows(spending: Spending) -> None:
    values = [spent(spending, 0.025, t) for t in np.linspace(0.05, 1, 20)]
    assert values[-1] == pytest.approx(0.025)
    assert all(b > a for a, b in itertools.pairwise(values))
    assert spent(spending, 0.025, 0.0) == 0.0


@pytest.mark.parametrize("spending", list(Spending))
def test_boundaries_spend_alpha_by_simulation(spending: Spending) -> None:
    """Brownian motion at unequal looks: the chance of crossing any boundary is the
    alpha spent at each look, cumulatively (Monte-Carlo error about 0.0005 here)."""
    fractions = (0.25, 0.4, 0.7, 1.0)
    bounds = np.array(z_boundaries(fractions, 0.025, spending))
    rng = np.random.default_rng(1)
    steps = np.diff(np.concatenate([[0.0], fractions]))
    s = np.cumsum(rng.normal(size=(400_000, 4)) * np.sqrt(steps), axis=1)
    crossed = np.maximum.accumulate(s / np.sqrt(fractions) > bounds, axis=1).mean(axis=0)
    want = [spent(spending, 0.025, t) for t in fractions]
    assert crossed == pytest.approx(want, abs=0.0015)


def test_t_boundary_keeps_the_nominal_level() -> None:
    assert t_boundary(1.959964, 10**6) == pytest.approx(1.96, abs=1e-3)
    assert t_boundary(1.959964, 5) == pytest.approx(2.5706, abs=1e-3)  # t(0.975, 5)


def _look(k: int, estimate: float, se: float, total: int = 4) -> LookInput:
    return LookInput(label=f"block {k}", fraction=k / total, estimate=estimate, se=se,
                     df=3 * k - 1)


def _analyse(looks: list[LookInput], total: int = 4, first: int = 1) -> object:
    fractions = [k / total for k in range(first, total + 1)]
    return analyse(looks, len(fractions), fractions, Spending.OBRIEN_FLEMING, 0.95, 0.98, 1.0)


def test_a_clear_effect_stops_at_its_look_with_the_repeated_interval() -> None:
    looks = [_look(2, 0.10, 0.01), _look(3, 0.10, 0.01)]
    found = analyse(looks, 3, [2 / 4, 3 / 4, 1.0], Spending.OBRIEN_FLEMING, 0.95, 0.98, 1.0)
    assert found.stopped and found.stopped_at == "block 2" and len(found.looks) == 1
    look = found.looks[0]
    assert look.action is Action.STOP and found.verdict is Verdict.FASTER
    c = t_boundary(z_boundaries((0.5, 0.75, 1.0), 0.025, Spending.OBRIEN_FLEMING)[0], 5)
    assert look.boundary == pytest.approx(c)
    assert found.ci_low == pytest.approx(math.exp(0.10 - c * 0.01))
    assert found.ci_high == pytest.approx(math.exp(0.10 + c * 0.01))
    assert look.statistic == pytest.approx(10.0)
    assert found.estimate_ratio == pytest.approx(math.exp(0.1))
    assert "biases" in found.estimate_note


def test_a_weak_look_goes_on_and_the_last_look_stops_undecided() -> None:
    looks = [_look(k, 0.02, 0.02) for k in (2, 3, 4)]
    found = analyse(looks, 3, [2 / 4, 3 / 4, 1.0], Spending.OBRIEN_FLEMING, 0.95, 0.98, 1.0)
    assert [lk.action for lk in found.looks] == [Action.CONTINUE, Action.CONTINUE, Action.STOP]
    assert found.stopped and found.stopped_at == "block 4"
    assert found.verdict is Verdict.UNDECIDED and found.record_verdict is Verdict.UNDECIDED


def test_unfinished_runs_have_no_verdict_yet() -> None:
    found = analyse([_look(2, 0.02, 0.02)], 3, [2 / 4, 3 / 4, 1.0],
                    Spending.OBRIEN_FLEMING, 0.95, 0.98, 1.0)
    assert not found.stopped and found.verdict is Verdict.UNDECIDED


def test_a_tight_interval_stops_no_difference() -> None:
    found = analyse([_look(2, 0.0, 0.0005)], 3, [2 / 4, 3 / 4, 1.0],
                    Spending.OBRIEN_FLEMING, 0.95, 0.98, 1.0)
    assert found.verdict is Verdict.NO_DIFFERENCE and found.stopped


def test_the_record_verdict_needs_the_wider_record_boundary() -> None:
    # Between the two boundaries: FASTER at 95 %, not at 98 %.
    zs = z_boundaries((0.5, 0.75, 1.0), 0.025, Spending.OBRIEN_FLEMING)
    zr = z_boundaries((0.5, 0.75, 1.0), 0.01, Spending.OBRIEN_FLEMING)
    t_mid = (t_boundary(zs[0], 5) + t_boundary(zr[0], 5)) / 2
    found = analyse([_look(2, t_mid * 0.01, 0.01)], 3, [2 / 4, 3 / 4, 1.0],
                    Spending.OBRIEN_FLEMING, 0.95, 0.98, 0.0)
    assert found.verdict is Verdict.FASTER and found.record_verdict is Verdict.UNDECIDED


def test_a_look_without_an_estimate_goes_on() -> None:
    empty = LookInput(label="block 1", fraction=0.25, estimate=None, df=0, reason="too few")
    found = analyse([empty], 4, [0.25, 0.5, 0.75, 1.0], Spending.POCOCK, 0.95, 0.98, 1.0)
    assert found.looks[0].action is Action.CONTINUE and found.looks[0].reason == "too few"
    assert found.looks[0].boundary is None


# --------------------------------------------------------------------------- the plan


def test_a_plan_without_sequential_keeps_its_hash_and_one_with_it_changes() -> None:
    plain = parse_plan(dict(BASE), "p.toml")
    same = parse_plan({**BASE, "sequential": None}, "p.toml")
    seq = parse_plan({**BASE, "sequential": {"max_blocks": 6}}, "p.toml")
    assert plain.sha256 == same.sha256
    assert b"sequential" not in plain.canonical()
    assert seq.sha256 != plain.sha256 and b'"max_blocks":6' in seq.canonical()
    assert seq.max_blocks == 6 and len(seq.legs) == 24 and seq.legs[-1] == ("B12", "candidate")
    assert seq.sequential is not None and seq.sequential.min_blocks == 2
    assert seq.sequential.spending is Spending.OBRIEN_FLEMING


def test_a_plan_file_gets_the_current_method_and_a_sealed_plan_keeps_its_own() -> None:
    """A [sequential] section that names no method gets rci-t/2 and seals it; a plan.json
    sealed before methods were named has none, ran under rci-t/1, and keeps its hash."""
    new = parse_plan({**BASE, "sequential": {"max_blocks": 4}}, "p.toml")
    assert new.sequential is not None and new.sequential.method is CURRENT_SEQUENTIAL_METHOD
    assert CURRENT_SEQUENTIAL_METHOD is SequentialMethod.RCI_T_2
    assert b'"method":"rci-t/2"' in new.canonical()
    legacy = {**BASE, "sequential": {"max_blocks": 4, "min_blocks": 2,
                                     "spending": "obrien-fleming", "equivalence_pct": None}}
    sealed = Plan.model_validate(legacy)
    assert sealed.sequential is not None and sealed.sequential.method is None
    assert sealed.sequential.method_in_force is SequentialMethod.RCI_T_1
    assert b"method" not in sealed.canonical()
    assert Plan.model_validate_json(sealed.canonical()).sha256 == sealed.sha256
    named = parse_plan({**BASE, "sequential": {"max_blocks": 4, "method": "rci-t/1"}}, "p")
    assert named.sequential is not None and named.sequential.method_in_force is \
        SequentialMethod.RCI_T_1
    with pytest.raises(ConfigError, match=r"key 'sequential\.method'"):
        parse_plan({**BASE, "sequential": {"max_blocks": 4, "method": "rci-z/9"}}, "p")


def _legs(blocks: int, effect: float) -> list[AnalysisLeg]:
    """ABBA legs with a leg effect that makes every look's t finite, and a log effect."""
    rng = np.random.default_rng(5)
    out = []
    for leg in Plan.model_validate({**BASE, "sequential": {"max_blocks": blocks}}).design_legs:
        shift = rng.normal(0, 0.02) + (effect if leg.treated else 0.0)
        rates = tuple(float(100 * math.exp(shift + x)) for x in rng.normal(0, 0.01, 5))
        out.append(AnalysisLeg(figures=LegFigures(name=leg.name, arm="x", headline=rates[0],
                                                  row_rates=rates, aggregate_cycle_ms=None,
                                                  acceptance_rate=None),
                               block=leg.block, treated=leg.treated))
    return out


def test_a_sealed_rci_t_1_plan_recomputes_with_rci_t_1_and_a_new_one_with_rci_t_2() -> None:
    """rci-t/1's boundaries are those main produced before rci-t/2 existed (so its records
    still verify); rci-t/2's spend 0.8 alpha, so they are wider and the record says so."""
    legacy = Plan.model_validate({**BASE, "sequential": {"max_blocks": 4,
                                                         "spending": "pocock"}})
    new = parse_plan({**BASE, "sequential": {"max_blocks": 4, "spending": "pocock"}}, "p")
    legs = _legs(4, 0.0)
    old = sequential_analysis(legacy, legs, adjust=False)
    now = sequential_analysis(new, legs, adjust=False)
    assert old.method == SEQUENTIAL_METHOD and now.method == SEQUENTIAL_METHOD_V2
    assert [lk.boundary for lk in old.looks] == pytest.approx(
        [2.9832612138280474, 2.9301503418882233, 2.7911882794769696], abs=1e-12)
    assert [lk.record_boundary for lk in old.looks] == pytest.approx(
        [3.859817900016379, 3.6781558227965503, 3.408593445891876], abs=1e-12)
    assert all(b.boundary > a.boundary for a, b in zip(old.looks, now.looks, strict=True))
    assert now.looks[-1].alpha_spent == pytest.approx(0.8 * 0.05)
    assert old.looks[-1].alpha_spent == pytest.approx(0.05)
    assert now.looks[0].boundary == boundaries(abba_looks(new.sequential), 0.95,
                                               Spending.POCOCK, SequentialMethod.RCI_T_2)[0]


def test_max_below_min_blocks_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text('name = "x"\n[server]\nargv = ["llama-server"]\nmodel = "m"\n'
                    "[arms.control]\n[arms.candidate]\n"
                    "[sequential]\nmax_blocks = 3\nmin_blocks = 4\n")
    with pytest.raises(ConfigError, match=r"plan\.toml: key 'sequential\.max_blocks': .*"
                       r"max_blocks \(3\) is less than min_blocks \(4\)"):
        load_plan(path)


def test_an_unknown_spending_names_the_key_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"p\.toml: key 'sequential\.spending': .*"
                       r"'obrien-fleming' or 'pocock'"):
        parse_plan({**BASE, "sequential": {"max_blocks": 4, "spending": "haybittle"}},
                   "p.toml")


@pytest.mark.parametrize(("extra", "match"), [
    ({"design": "aa", "arms": {"control": {}}}, "needs design 'abba'"),
    ({"blocks": 3}, "leave blocks out"),
])
def test_sequential_needs_an_abba_design_and_no_blocks(extra: dict[str, object],
                                                      match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_plan({**BASE, **extra, "sequential": {"max_blocks": 4}}, "p.toml")


@pytest.mark.parametrize("spending", list(Spending))
def test_t_boundaries_spend_alpha_for_abba_blocks_by_fresh_simulation(spending: Spending
                                                                      ) -> None:
    """Independent paths (another seed) of the ABBA model: per block one contrast and
    2 df of pure error, t on 3k - 1 df at blocks 2..5 of 5. The crossing rate over all
    looks is the alpha spent (Monte-Carlo error about 0.0005), where carrying the normal
    boundaries over at each df spends more."""
    units = (2, 3, 4, 5)
    bounds = t_boundaries(units, 5, 2, 0.025, spending)
    rng = np.random.default_rng(77)
    n = 200_000
    d = rng.standard_normal((n, 5))
    w = rng.chisquare(2, (n, 5))
    crossed = np.zeros(n, dtype=bool)
    carried = np.zeros(n, dtype=bool)
    zs = z_boundaries(tuple(u / 5 for u in units), 0.025, spending)
    for k, c, z in zip(units, bounds, zs, strict=True):
        mean = d[:, :k].mean(axis=1)
        ss = w[:, :k].sum(axis=1) + ((d[:, :k] - mean[:, None]) ** 2).sum(axis=1)
        t = mean / np.sqrt(ss / (3 * k - 1) / k)
        crossed |= t > c
        carried |= t > t_boundary(z, 3 * k - 1)
    assert crossed.mean() == pytest.approx(0.025, abs=0.0012)
    assert carried.mean() > crossed.mean()
    # rci-t/2 spends 0.8 alpha: its boundaries, on the same paths.
    wide = boundaries(Design(units=units, max_units=5, extra_df=2), 0.95, spending,
                      SequentialMethod.RCI_T_2)
    crossed_wide = np.zeros(n, dtype=bool)
    for k, c in zip(units, wide, strict=True):
        mean = d[:, :k].mean(axis=1)
        ss = w[:, :k].sum(axis=1) + ((d[:, :k] - mean[:, None]) ** 2).sum(axis=1)
        crossed_wide |= mean / np.sqrt(ss / (3 * k - 1) / k) > c
    assert crossed_wide.mean() == pytest.approx(0.02, abs=0.0011)


def test_t_boundaries_are_reproducible_and_checked() -> None:
    first = t_boundaries((2, 3, 4), 4, 2, 0.025, Spending.OBRIEN_FLEMING, sims=50_000)
    t_boundaries.cache_clear()
    assert t_boundaries((2, 3, 4), 4, 2, 0.025, Spending.OBRIEN_FLEMING, sims=50_000) == first
    with pytest.raises(ValueError, match="must increase"):
        t_boundaries((3, 2), 4, 2, 0.025, Spending.POCOCK)


# --------------------------------------------------------------------------- the estimate

POCOCK_8 = Design(units=tuple(range(2, 9)), max_units=8, extra_df=2)


def test_run_paths_stops_each_path_where_its_interval_first_decides() -> None:
    """Hand-made paths (sigma 1): FASTER at the first look, SLOWER at the second, NO
    DIFFERENCE at the first, and one undecided to the last."""
    design = Design(units=(1, 2, 3), max_units=3, extra_df=2)
    means = np.array([[3.0, 3.0, 3.0], [0.5, -3.0, -3.0], [0.01, 0.5, 0.5], [0.5, 0.5, 0.5]])
    ses = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.01, 1.0, 1.0], [1.0, 1.0, 1.0]])
    paths = Paths(design=design, means=means, ses=ses)
    outcome, stop, est = run_paths(paths, (2.0, 2.0, 2.0), 0.0, 1.0, band=0.1)
    assert [_CODES[o] for o in outcome] == [Outcome.FASTER, Outcome.SLOWER,
                                           Outcome.NO_DIFFERENCE, Outcome.UNDECIDED]
    assert stop.tolist() == [0, 1, 0, 2]
    assert est.tolist() == [3.0, -3.0, 0.01, 0.5]


def test_the_adjusted_estimate_pulls_an_early_stop_back_towards_no_change() -> None:
    c = boundaries(POCOCK_8, 0.95, Spending.POCOCK)
    se = 0.01
    early = 1.05 * c[0] * se  # just across the first boundary
    adjusted = adjusted_estimate(POCOCK_8, c, 0, early, se, 1.0)
    assert adjusted is not None and 0 < adjusted < early
    # Its defining equation, checked on fresh paths (another seed, 5x as many): the
    # expected estimate at the stop under the adjusted effect is the one observed.
    sigma = se * math.sqrt(2)
    fresh = draw_paths(POCOCK_8, 20_000, 4)
    _, _, at_stop = run_paths(fresh, c, adjusted, sigma, math.log1p(0.01))
    mc = at_stop.std() / math.sqrt(len(at_stop))
    assert at_stop.mean() == pytest.approx(early, abs=4 * mc + 0.002 * sigma)


def test_the_adjusted_estimate_reduces_the_bias_of_early_stopping() -> None:
    """At a true effect that Pocock's first looks often stop on, the plain estimate at the
    stop is biased up; the adjusted one, computed per path, much less (200 paths: about
    2 s, since each path solves its own equation on 4000 simulated paths)."""
    c = boundaries(POCOCK_8, 0.95, Spending.POCOCK)
    sigma, truth = 1.0, 1.4  # per-block sd, and an effect near the first boundaries
    paths = draw_paths(POCOCK_8, 200, 9)
    _, stop, at_stop = run_paths(paths, c, truth, sigma, 0.0)
    se = sigma * paths.ses[np.arange(200), stop]
    adjusted = [adjusted_estimate(POCOCK_8, c, int(j), float(e), float(s), 0.0)
                for j, e, s in zip(stop, at_stop, se, strict=True)]
    assert all(a is not None for a in adjusted)
    plain_bias = float(at_stop.mean()) - truth
    adjusted_bias = float(np.mean([a for a in adjusted if a is not None])) - truth
    assert plain_bias > 0.1
    assert abs(adjusted_bias) < plain_bias / 2


def test_analyse_records_the_adjusted_estimate_only_when_it_stopped() -> None:
    fractions = [k / 8 for k in POCOCK_8.units]
    looks = [LookInput(label="block 2", fraction=0.25, estimate=0.2, se=0.01, df=5)]
    found = analyse(looks, 7, fractions, Spending.POCOCK, 0.95, 0.98, 1.0, POCOCK_8)
    assert found.stopped and found.estimate_adjusted_ratio is not None
    assert found.estimate_adjustment is not None and "Whitehead" in found.estimate_adjustment
    weak = [LookInput(label="block 2", fraction=0.25, estimate=0.001, se=0.01, df=5)]
    going = analyse(weak, 7, fractions, Spending.POCOCK, 0.95, 0.98, 1.0, POCOCK_8)
    assert not going.stopped and going.estimate_adjusted_ratio is None
    plain = analyse(looks, 7, fractions, Spending.POCOCK, 0.95, 0.98, 1.0, POCOCK_8,
                    adjust=False)
    assert plain.estimate_adjusted_ratio is None and plain.estimate_ratio == found.estimate_ratio
