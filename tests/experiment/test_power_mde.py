"""The smallest effect a design finds with the target power (the demo prints it)."""

from __future__ import annotations

from tokrecord.experiment.power import min_detectable_effect
from tokrecord.experiment.stats import Noise, power


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
