"""The leg-level verdict, its power and the planner's noise: hand-computed values, the
seed ABBA's own numbers, and a quick simulation (bench/verdict runs the full grid)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import abba_design
from tokrecord.experiment.power import noise_from_record
from tokrecord.experiment.stats import (
    AnalysisLeg,
    LegFigures,
    Noise,
    Verdict,
    blocks_for_power,
    fit_legs,
    hodges_lehmann,
    leg_analysis,
    pool_noise,
    power,
)

SEED = json.loads(
    (FIXTURES_DIR / "seeds" / "abba-experiment-record.json").read_text())
T_975_2 = 4.302652729749464  # t(0.975, 2 df)


def legs_from(shifts: dict[str, float], rows: np.ndarray, blocks: int = 1) -> list[AnalysisLeg]:
    """Rates = 100 * exp(row effect + the leg's shift), in design order."""
    out = []
    for leg in abba_design(blocks):
        rates = 100 * np.exp(rows + shifts[leg.name])
        out.append(AnalysisLeg(
            figures=LegFigures(name=leg.name, arm="candidate" if leg.treated else "control",
                               headline=float(np.median(rates)),
                               row_rates=tuple(float(r) for r in rates),
                               aggregate_cycle_ms=None, acceptance_rate=None),
            block=leg.block, treated=leg.treated))
    return out


ROWS3 = np.array([0.0, 0.5, -0.3])
SHIFTS = {"A1": 0.0, "B1": 0.03, "B2": 0.02, "A2": 0.01}


def test_hodges_lehmann_by_hand() -> None:
    # Walsh averages of (0, 1, 5): 0, 0.5, 2.5, 1, 3, 5 -> median (1 + 2.5) / 2
    assert hodges_lehmann(np.array([0.0, 1.0, 5.0])) == 1.75
    assert hodges_lehmann(np.array([2.0, 2.0, 2.0])) == 2.0


def test_one_block_by_hand() -> None:
    # No row noise: each leg's figure is its shift less the mean shift (0.015).
    # effect = (0.03 + 0.02)/2 - (0 + 0.01)/2 = 0.02; residuals +-0.005 in every leg:
    # RSS = 4 * 0.005^2 = 1e-4 on 4 - 2 = 2 df; s^2 = 5e-5; se = sqrt(s^2 * (1/2 + 1/2)).
    a = leg_analysis(legs_from(SHIFTS, ROWS3), 0.95, 1.0)
    se = math.sqrt(5e-5)
    assert a.df == 2 and a.blocks == 1 and a.legs == 4 and a.rows_used == 3
    assert a.ratio == pytest.approx(math.exp(0.02), rel=1e-12)
    assert a.ci_low == pytest.approx(math.exp(0.02 - T_975_2 * se), rel=1e-12)
    assert a.ci_high == pytest.approx(math.exp(0.02 + T_975_2 * se), rel=1e-12)
    assert (round(a.ci_low, 5), round(a.ci_high, 5)) == (0.98963, 1.05172)
    assert a.residual_sd_pct == pytest.approx(100 * math.sqrt(5e-5), rel=1e-12)
    assert a.leg_noise_sd_pct == pytest.approx(a.residual_sd_pct, rel=1e-12)  # no row noise
    assert a.row_noise_sd_pct == pytest.approx(0.0, abs=1e-9) and a.row_noise_df == 3 * 2
    assert a.leg_statistics == pytest.approx({"A1": -1.5, "B1": 1.5, "B2": 0.5, "A2": -0.5})
    assert a.verdict is Verdict.UNDECIDED  # the interval holds 1
    assert a.record_confidence == 0.98 and a.record_ci_low is not None
    assert a.record_ci_low < a.ci_low and a.record_verdict is Verdict.UNDECIDED
    assert a.reason.startswith("t(2) = 4.303 on 4 legs in 1 block(s), 3 rows each")


def test_linear_drift_moves_nothing_but_the_noise() -> None:
    """Within ABBA and BAAB blocks a linear trend is orthogonal to the treatment."""
    design = abba_design(2)
    base = {leg.name: (0.03 if leg.treated else 0.0) for leg in design}
    drifted = {leg.name: base[leg.name] + 0.004 * i for i, leg in enumerate(design)}
    flat = leg_analysis(legs_from(base, ROWS3, 2), 0.95, 1.0)
    moved = leg_analysis(legs_from(drifted, ROWS3, 2), 0.95, 1.0)
    assert flat.ratio == pytest.approx(math.exp(0.03), rel=1e-12)
    assert moved.ratio == pytest.approx(math.exp(0.03), rel=1e-12)
    assert moved.df == flat.df == 3 * 2 - 1
    assert moved.ci_high - moved.ci_low > flat.ci_high - flat.ci_low  # noise, not bias


def test_a_stalled_row_cannot_move_the_verdict() -> None:
    rng = np.random.default_rng(3)
    rows = rng.normal(0, 0.3, 13)
    legs = legs_from(SHIFTS, rows)
    clean = leg_analysis(legs, 0.95, 1.0)
    rates = list(legs[1].figures.row_rates)
    rates[4] *= 0.3  # B1 row 4 stalled
    stalled = [*legs[:1], legs[1].model_copy(update={"figures": legs[1].figures.model_copy(
        update={"row_rates": tuple(rates)})}), *legs[2:]]
    hit = leg_analysis(stalled, 0.95, 1.0)
    assert clean.ratio == pytest.approx(math.exp(0.02), rel=1e-9)
    assert hit.ratio == pytest.approx(clean.ratio, abs=0.002)
    # a mean of the log rates would have moved by log(0.3) / 13 / 2 = -4.6 %
    assert abs(math.log(hit.ratio / clean.ratio)) < 0.1 * abs(math.log(0.3) / 13 / 2)


def test_rows_without_a_rate_in_every_leg_are_left_out() -> None:
    legs = legs_from(SHIFTS, ROWS3)
    rates = list(legs[2].figures.row_rates)
    rates[1] = None  # type: ignore[call-overload]
    legs[2] = legs[2].model_copy(update={"figures": legs[2].figures.model_copy(
        update={"row_rates": tuple(rates)})})
    a = leg_analysis(legs, 0.95, 1.0)
    assert a.rows_used == 2 and a.ratio == pytest.approx(math.exp(0.02), rel=1e-12)


@pytest.mark.parametrize("change, reason", [
    ("no rows", "no row has a rate in every leg"),
    ("one arm", "both arms are needed"),
    ("three legs", "too few legs to estimate between-leg noise: 3 legs leave 1 degree(s) of "
     "freedom, 2 are needed"),
])
def test_undecided_names_its_reason(change: str, reason: str) -> None:
    legs = legs_from(SHIFTS, ROWS3)
    if change == "no rows":
        legs[0] = legs[0].model_copy(update={"figures": legs[0].figures.model_copy(
            update={"row_rates": (None, None, None)})})
    elif change == "one arm":
        legs = [leg.model_copy(update={"treated": True}) for leg in legs]
    else:
        legs = legs[:3]
    a = leg_analysis(legs, 0.95, 1.0)
    assert a.verdict is Verdict.UNDECIDED and a.record_verdict is Verdict.UNDECIDED
    assert a.ratio is None and a.ci_low is None and a.reason.startswith(reason)


def test_tight_legs_give_faster_and_no_difference() -> None:
    faster = leg_analysis(legs_from({"A1": 0.0, "B1": 0.05, "B2": 0.051, "A2": 0.001}, ROWS3),
                          0.95, 1.0)
    assert faster.verdict is Verdict.FASTER and faster.ci_low > 1.04
    same = leg_analysis(legs_from({"A1": 0.0, "B1": 0.0005, "B2": 0.001, "A2": 0.0005}, ROWS3),
                        0.95, 1.0)
    assert same.verdict is Verdict.NO_DIFFERENCE
    assert same.ci_low >= 0.99 and same.ci_high <= 1.01


# --------------------------------------------------------------------------- the seed ABBA


def test_the_seed_abba_by_its_leg_headlines() -> None:
    """The seed keeps only its legs' headlines: the leg-level fit on their logs gives
    +3.55 % with a 95 % interval of [-1.5 %, +8.9 %] on 2 df: UNDECIDED."""
    runs = SEED["runs"]
    names = ["A1", "B1", "B2", "A2"]
    y = [math.log(runs[n]["headline_tok_s"]) for n in names]
    fit = fit_legs(y, [1, 1, 1, 1], [False, True, True, False])
    assert not isinstance(fit, str)
    tau, se, df, s2 = fit
    # by hand: effect = mean(log B) - mean(log A)
    assert tau == pytest.approx((y[1] + y[2] - y[0] - y[3]) / 2, rel=1e-12)
    assert df == 2 and se == pytest.approx(math.sqrt(s2), rel=1e-12)
    assert math.exp(tau) == pytest.approx(1.035458, abs=1e-6)
    assert math.exp(tau - T_975_2 * se) == pytest.approx(0.984526, abs=1e-6)
    assert math.exp(tau + T_975_2 * se) == pytest.approx(1.089023, abs=1e-6)
    noise = noise_from_record(SEED, "seed")
    assert noise.leg_df == 2 and noise.sd_leg_pct == pytest.approx(1.172251, abs=1e-6)
    assert noise.sd_row_pct == 0.0 and "headlines only" in noise.sources[0]


def test_a_record_without_legs_gives_no_noise() -> None:
    with pytest.raises(ConfigError, match="not an experiment record"):
        noise_from_record({"schema": "x"}, "x.json")


# --------------------------------------------------------------------------- power


NOISE = Noise(sd_leg_pct=1.0, sd_row_pct=0.5)


def test_power_under_no_effect_is_the_false_faster_rate() -> None:
    for k in (1, 2, 3):
        assert power(0.0, NOISE, 13, k, 0.95, 0.0) == pytest.approx(0.025, abs=1e-4)


def test_power_grows_with_blocks_and_effect() -> None:
    by_blocks = [power(3.0, NOISE, 13, k, 0.95, 1.0) for k in (1, 2, 3, 4)]
    assert by_blocks == sorted(by_blocks) and by_blocks[0] < 0.5 < 0.9 < by_blocks[1]
    assert blocks_for_power(3.0, NOISE, 13, 0.95, 1.0) == 2
    assert blocks_for_power(1.0, NOISE, 13, 0.95, 1.0, most=3) is None
    by_effect = [power(e, NOISE, 13, 2, 0.95, 1.0) for e in (1, 2, 3, 5)]
    assert by_effect == sorted(by_effect)


def test_power_without_noise_is_certain_outside_the_band() -> None:
    quiet = Noise(sd_leg_pct=0, sd_row_pct=0)
    assert power(3.0, quiet, 13, 1, 0.95, 1.0) == 1.0
    assert power(0.5, quiet, 13, 1, 0.95, 1.0) == 0.0  # inside ±1 %: NO DIFFERENCE


def test_predicted_power_matches_a_simulation() -> None:
    """A quick version of bench/verdict's check, on the verdict itself."""
    rng = np.random.default_rng(11)
    design = abba_design(2)
    hits = 0
    trials = 300
    for _ in range(trials):
        rows = rng.normal(0, 0.3, 13)
        legs = []
        for leg in design:
            shift = rng.normal(0, 0.01) + (math.log(1.03) if leg.treated else 0.0)
            rates = 100 * np.exp(rows + shift + rng.normal(0, 0.005, 13))
            legs.append(AnalysisLeg(figures=LegFigures(
                name=leg.name, arm="x", headline=None, row_rates=tuple(map(float, rates)),
                aggregate_cycle_ms=None, acceptance_rate=None), block=leg.block,
                treated=leg.treated))
        hits += leg_analysis(legs, 0.95, 1.0).verdict is Verdict.FASTER
    # predicted 0.906; 3 standard errors of 300 trials is 5 points
    assert hits / trials == pytest.approx(power(3.0, NOISE, 13, 2, 0.95, 1.0), abs=0.06)


def test_pooled_noise_weights_by_degrees_of_freedom() -> None:
    pooled = pool_noise([Noise(sd_leg_pct=1.0, sd_row_pct=1.0, leg_df=2, sources=("a",)),
                         Noise(sd_leg_pct=2.0, sd_row_pct=0.0, leg_df=6, sources=("b",))])
    assert pooled.sd_leg_pct == pytest.approx(math.sqrt((2 * 1 + 6 * 4) / 8), rel=1e-12)
    assert pooled.sd_row_pct == pytest.approx(math.sqrt(2 / 8), rel=1e-12)
    assert pooled.leg_df == 8 and pooled.sources == ("a", "b")
