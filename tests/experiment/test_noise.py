"""The noise diagnostic (experiment.noise): hand-computed cases and a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokrecord.experiment.noise import DIAGNOSIS_ONLY, best_line, noise_diagnostic
from tokrecord.probes.covariates import LegCovariates


def _leg(name: str, arm: str, log_rate: float, **cov: float) -> tuple[str, str, float, LegCovariates]:
    return name, arm, math.exp(log_rate), LegCovariates(**cov)


def test_within_arm_correlation_by_hand() -> None:
    # Arm A: log deviations 0, +.01, -.01, 0 against power 10, 11, 9, 10 (centred 0, 1, -1, 0).
    # Arm B, at another level and another power: deviations +.02, -.02, 0, 0 against power
    # 109, 111, 110, 110 (centred -1, +1, 0, 0). Sum xy = .02 - .04 = -.02; sum x^2 = 4;
    # sum y^2 = .001; r = -.02 / sqrt(.004) = -1 / sqrt(10).
    legs = [_leg("A1", "control", 0.0, gpu_power_w=10), _leg("B1", "candidate", 0.52, gpu_power_w=109),
            _leg("A2", "control", 0.01, gpu_power_w=11), _leg("B2", "candidate", 0.48, gpu_power_w=111),
            _leg("A3", "control", -0.01, gpu_power_w=9), _leg("B3", "candidate", 0.50, gpu_power_w=110),
            _leg("A4", "control", 0.0, gpu_power_w=10), _leg("B4", "candidate", 0.50, gpu_power_w=110)]
    d = noise_diagnostic(legs)
    fit = next(f for f in d.covariates if f.name == "gpu_power_w")
    assert fit.r == pytest.approx(-1 / math.sqrt(10))
    assert fit.share_explained == pytest.approx(0.1)
    assert fit.treatment_can_move and fit.legs == 8 and fit.df == 6
    assert d.best == "gpu_power_w" and d.best_r == pytest.approx(-1 / math.sqrt(10))
    # Deviations from each arm's mean log rate, in %, in run order.
    assert [leg.name for leg in d.legs] == ["A1", "B1", "A2", "B2", "A3", "B3", "A4", "B4"]
    assert [leg.deviation_pct for leg in d.legs] == pytest.approx([0, 2, 1, -2, -1, 0, 0, 0])
    # sd of the deviations on 8 legs less 2 arms: sqrt((1 + 1 + 4 + 4) / 6) %.
    assert d.residual_sd_pct == pytest.approx(math.sqrt(10 / 6))
    assert d.note == DIAGNOSIS_ONLY


def test_a_covariate_that_only_differs_between_arms_explains_nothing() -> None:
    # Pooled, power would track the rate perfectly (the faster arm draws more): within the
    # arms it is constant, so it explains none of the leg-to-leg variance.
    legs = [_leg(f"{a}{i}", arm, level + 0.01 * (-1) ** i, gpu_power_w=power)
            for i in range(1, 5) for a, arm, level, power in
            (("A", "control", 0.0, 200.0), ("B", "candidate", 0.5, 300.0))]
    d = noise_diagnostic(legs)
    fit = next(f for f in d.covariates if f.name == "gpu_power_w")
    assert fit.r is None and fit.share_explained is None
    assert d.best is None
    assert "no covariate" in best_line(d)


def test_adjacent_legs_and_episodes() -> None:
    # Alternating deviations: adjacent legs perfectly anti-correlated, no episode.
    alt = noise_diagnostic([_leg(f"A{i}", "control", 0.01 * (-1) ** i) for i in range(8)])
    assert alt.adjacent_r == pytest.approx(-1.0)
    assert alt.adjacent_pairs == 7 and alt.episodes == ()
    # Two adjacent legs 4 % low among steady ones: one episode, those two legs.
    rates = [0.0, 0.003, -0.002, -0.04, -0.04, 0.001, 0.002, -0.001]
    d = noise_diagnostic([_leg(f"L{i}", "control", r) for i, r in enumerate(rates)])
    assert [e.legs for e in d.episodes] == [("L3", "L4")]
    assert d.episodes[0].direction == "low"
    mean = 100 * sum(rates) / len(rates)
    assert d.episodes[0].mean_deviation_pct == pytest.approx(-4.0 - mean)


def test_legs_without_a_figure_are_left_out_and_missing_covariates_skipped() -> None:
    legs = [("A1", "control", 100.0, LegCovariates(ready_s=1.0)), ("A2", "control", 0.0, None),
            ("A3", "control", 101.0, None), ("A4", "control", 99.0, LegCovariates(ready_s=1.2))]
    d = noise_diagnostic(legs)
    assert [leg.name for leg in d.legs] == ["A1", "A3", "A4"]
    assert next(f for f in d.covariates if f.name == "ready_s").legs == 2


def test_simulation_share_explained_recovers_the_truth() -> None:
    """A covariate that drives half the leg variance is found to explain about half; an
    unrelated one about 1/(n-1), Pearson's r^2 under no relation."""
    rng = np.random.default_rng(33)
    n, sims = 24, 400
    driven, unrelated = [], []
    for _ in range(sims):
        x = rng.normal(size=n)
        z = rng.normal(size=n)
        y = 0.01 * (x + rng.normal(size=n))  # var from x: half
        legs = [(f"A{i}", "control", math.exp(y[i]),
                 LegCovariates(gpu_power_w=float(x[i]), host_load1=float(z[i]))) for i in range(n)]
        fits = {f.name: f for f in noise_diagnostic(legs).covariates}
        driven.append(fits["gpu_power_w"].share_explained)
        unrelated.append(fits["host_load1"].share_explained)
    assert np.mean(driven) == pytest.approx(0.5, abs=0.05)
    assert np.mean(unrelated) == pytest.approx(1 / (n - 1), abs=0.015)


def test_best_line_names_the_covariate_and_says_diagnosis_only() -> None:
    legs = [_leg(f"A{i}", "control", 0.01 * i, host_cpu_freq_mhz=2000 + i + (i % 2)) for i in range(6)]
    line = best_line(noise_diagnostic(legs))
    assert line.startswith("legs track host_cpu_freq_mhz best")
    assert "the treatment can move it" not in line  # an external covariate
    assert "diagnosis only, never adjusts the verdict" in line


def test_one_block_says_its_r_means_little() -> None:
    legs = [_leg("A1", "control", 0.0, ready_s=1.0), _leg("B1", "candidate", 0.5, ready_s=2.0),
            _leg("B2", "candidate", 0.52, ready_s=2.1), _leg("A2", "control", 0.01, ready_s=1.2)]
    d = noise_diagnostic(legs)
    # Centred: rates (-.005, +.005), (-.01, +.01); ready (-.1, +.1), (-.05, +.05).
    # xy = .002, x^2 = .025, y^2 = .00025: r = .002 / .0025 = 0.8.
    assert d.best == "ready_s" and d.best_r == pytest.approx(0.8)
    assert "(df 2: too few to mean much)" in best_line(d)
