"""The smallest effect a design finds with the target power (the demo prints it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokrecord.experiment.power import min_detectable_effect
from tokrecord.experiment.stats import Noise, leg_sd_pct, power

# scipy.stats is imported in the tests that use it: every xdist worker collects every module,
# and importing it there costs each worker about 0.7 s of CPU (issue 28).


def test_min_detectable_effect_is_where_power_crosses_the_target() -> None:
    noise = Noise(sd_leg_pct=2.0, sd_row_pct=2.0)
    by_blocks = [min_detectable_effect(noise, 13, k, 0.95, 1.0) for k in (1, 2, 3)]
    assert all(e is not None for e in by_blocks)
    assert by_blocks == sorted(by_blocks, reverse=True)  # more blocks find smaller effects
    for k, e in zip((1, 2, 3), by_blocks, strict=True):
        assert e is not None
        assert power(e, noise, 13, k, 0.95, 1.0) >= 0.9
        assert power(e - 0.1, noise, 13, k, 0.95, 1.0) < 0.9
    assert min_detectable_effect(Noise(sd_leg_pct=80.0, sd_row_pct=0.0), 13, 1, 0.95, 1.0) is None


def _power_by_scipy_stats(effect_pct: float, sd_pct: float, blocks: int, confidence: float,
                          equivalence_pct: float) -> float:
    """The power integral as first written, through scipy.stats' norm.sf and chi2.pdf:
    stats.power calls scipy.special with their formulas instead (8x faster)."""
    from scipy import integrate
    from scipy import stats as sps

    df = 3 * blocks - 1
    sigma, scale = sd_pct / 100, 1 / math.sqrt(blocks)
    delta, band = math.log1p(effect_pct / 100), math.log1p(equivalence_pct / 100)
    t = float(sps.t.ppf(0.5 + confidence / 2, df))

    def given(u: float) -> float:
        se_hat = sigma * u * scale
        need = max(t * se_hat, band - t * se_hat)
        return float(sps.norm.sf((need - delta) / (sigma * scale)))

    def density(u: float) -> float:
        return float(sps.chi2.pdf(df * u * u, df) * 2 * df * u)

    value = float(integrate.quad(lambda u: given(u) * density(u), 0, np.inf, limit=200)[0])
    return min(max(value, 0.0), 1.0)


@pytest.mark.parametrize(("effect", "sd_leg", "sd_row", "blocks"), [
    (0.0, 1.108, 3.418, 2), (3.0, 1.108, 3.418, 4), (5.0, 3.141, 5.501, 7),
    (1.0, 0.5, 5.0, 1), (10.0, 3.141, 5.501, 3), (2.0, 2.0, 0.0, 9)])
def test_power_is_the_scipy_stats_integral_to_the_bit(effect: float, sd_leg: float,
                                                       sd_row: float, blocks: int) -> None:
    noise = Noise(sd_leg_pct=sd_leg, sd_row_pct=sd_row)
    for confidence, band in ((0.95, 1.0), (0.98, 0.0)):
        fast = power(effect, noise, 13, blocks, confidence, band)
        assert fast == _power_by_scipy_stats(effect, leg_sd_pct(noise, 13), blocks, confidence,
                                             band)
