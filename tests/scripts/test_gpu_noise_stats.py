"""The statistics scripts/gpu_noise.py puts in docs/research/gpu-noise (issue 33)."""
from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from scipy import stats

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def gpu_noise() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPTS))  # gpu_noise imports gpu_experiment, its neighbour
    try:
        yield importlib.import_module("gpu_noise")
    finally:
        sys.path.remove(str(SCRIPTS))


def test_bartlett_from_sds_matches_scipy_on_the_raw_samples(gpu_noise: ModuleType) -> None:
    rng = np.random.default_rng(7)
    samples = [rng.normal(0, s, n) for s, n in ((1.0, 9), (2.5, 12), (0.7, 6), (1.2, 15))]
    items = [(float(np.std(x, ddof=1)), len(x) - 1) for x in samples]
    stat, df, p = gpu_noise.bartlett_sds(items)
    ref = stats.bartlett(*samples)
    assert df == 3
    assert stat == pytest.approx(ref.statistic, rel=1e-9)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_pooled_sd_by_hand(gpu_noise: ModuleType) -> None:
    # The two sessions' plain baselines: sqrt((1.869^2 * 8 + 0.588^2 * 8) / 16).
    sd, df = gpu_noise.pooled_sd([(1.869, 8), (0.588, 8)])
    assert df == 16
    assert sd == pytest.approx(math.sqrt((1.869**2 * 8 + 0.588**2 * 8) / 16))
    assert sd == pytest.approx(1.3854, abs=1e-4)


def _line(session: str, condition: str, sd: float) -> dict[str, Any]:
    return {"session": session, "condition": condition, "arm": "plain", "n_legs": 12,
            "mean_tok_s": 800.0, "sd_leg_pct": sd, "df_leg": 8, "sd_leg_ci": [0.0, 0.0],
            "sd_plain_pct": sd, "df_plain": 11, "sd_plain_ci": [0.0, 0.0], "sd_row_pct": 3.0,
            "experiment": f"aa-{condition}-plain"}


def test_analyse_compares_with_the_same_sessions_baseline(gpu_noise: ModuleType) -> None:
    lines = [_line("1", "base", 1.869), _line("2", "base", 0.588), _line("2", "pin", 1.359),
             _line("3", "cold", 2.0)]
    rows = {r.split("|")[2].strip(): r for r in gpu_noise.analyse(lines, None).splitlines()
            if r.startswith("| ") and "condition" not in r}
    same = gpu_noise.sd_ratio_interval(0.588, 8, 1.359, 8)
    assert f"{same[0]:.2f} [{same[1]:.2f}, {same[2]:.2f}] |" in rows["pin"]
    assert "pooled" not in rows["pin"]
    pooled_sd, pooled_df = gpu_noise.pooled_sd([(1.869, 8), (0.588, 8)])
    other = gpu_noise.sd_ratio_interval(pooled_sd, pooled_df, 2.0, 8)
    assert f"{other[0]:.2f} [{other[1]:.2f}, {other[2]:.2f}] (pooled baseline)" in rows["cold"]
    # The two baselines against each other, larger over smaller, as the README quotes.
    r, lo, hi = gpu_noise.sd_ratio_interval(1.869, 8, 0.588, 8)
    f_hi = stats.f.ppf(0.975, 8, 8)
    assert (lo, hi) == pytest.approx((r / math.sqrt(f_hi), r * math.sqrt(f_hi)))
    assert f"{r:.2f} [{lo:.2f}, {hi:.2f}]" in gpu_noise.analyse(lines, None)
