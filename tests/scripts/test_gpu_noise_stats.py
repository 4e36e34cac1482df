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

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

# scipy.stats is imported in the tests that use it: every xdist worker collects every module,
# and importing it there costs each worker about 0.7 s of CPU (issue 28).


@pytest.fixture(scope="module")
def gpu_noise() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPTS))  # gpu_noise imports gpu_experiment, its neighbour
    try:
        yield importlib.import_module("gpu_noise")
    finally:
        sys.path.remove(str(SCRIPTS))


def test_bartlett_from_sds_matches_scipy_on_the_raw_samples(gpu_noise: ModuleType) -> None:
    from scipy import stats

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
    from scipy import stats

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


def _fake_interleaved(tmp: Path, figures: dict[str, float]) -> Path:
    """An ABBA directory as far as the interleaved summary reads it: experiment.jsonl's
    leg_end lines and each leg's summary.json."""
    import json

    exp = tmp / "il-pin-draft"
    lines = [{"event": "leg_end", "leg": "teacher", "status": "complete"}]
    for leg, fig in figures.items():
        run = exp / leg / "attempt-1"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"summary": {"tok_s_out": fig}}))
        lines.append({"event": "leg_end", "leg": leg, "status": "complete",
                      "run_dir": f"/elsewhere/{leg}/attempt-1"})
    lines.append({"event": "leg_end", "leg": "A9", "status": "failed", "run_dir": "x/y"})
    (exp / "experiment.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return exp


def test_interleaved_summary_by_hand(gpu_noise: ModuleType, tmp_path: Path) -> None:
    # Two ABBA blocks in run order: A1 B1 B2 A2 | B3 A3 A4 B4.
    figs = {"A1": 100.0, "B1": 110.0, "B2": 108.0, "A2": 104.0,
            "B3": 111.0, "A3": 98.0, "A4": 101.0, "B4": 109.0}
    d = gpu_noise.interleaved_summary(_fake_interleaved(tmp_path, figs), condition="pin", arm="draft")
    a, b = d["arms"]["control"], d["arms"]["candidate"]
    assert [x["leg"] for x in a["legs"]] == ["A1", "A2", "A3", "A4"]
    assert [x["leg"] for x in b["legs"]] == ["B1", "B2", "B3", "B4"]
    la = [math.log(figs[k]) for k in ("A1", "A2", "A3", "A4")]
    assert a["sd_pct"] == pytest.approx(100 * float(np.std(la, ddof=1)))
    assert a["df"] == 3
    # Within-block: block 1 holds A1, A2; block 2 A3, A4; (x1 - x2)^2 / 2 per block, averaged.
    w = math.sqrt(((la[0] - la[1]) ** 2 / 2 + (la[2] - la[3]) ** 2 / 2) / 2)
    assert a["sd_within_pct"] == pytest.approx(100 * w)
    assert a["df_within"] == 2
    lb = [math.log(figs[k]) for k in ("B1", "B2", "B3", "B4")]
    wb = math.sqrt(((lb[0] - lb[1]) ** 2 / 2 + (lb[2] - lb[3]) ** 2 / 2) / 2)
    r, lo, hi = d["ratio_within"]
    assert r == pytest.approx(w / wb)
    assert lo < r < hi
    assert "within-block sd" in gpu_noise.interleaved_table(d)


def test_interleaving_refuses_a_condition_that_cannot_alternate(gpu_noise: ModuleType,
                                                                tmp_path: Path) -> None:
    conds = gpu_noise.conditions()
    with pytest.raises(SystemExit, match="host load"):
        gpu_noise.interleave_plan_text(cond=conds["load"], arm="plain", server="s",
                                       models=tmp_path, suite=tmp_path / "s.jsonl",
                                       teacher="capture", wrapper=tmp_path / "w.sh", blocks=2)
    text = gpu_noise.interleave_plan_text(cond=conds["pin"], arm="draft", server="s",
                                          models=tmp_path, suite=tmp_path / "s.jsonl",
                                          teacher="capture", wrapper=tmp_path / "w.sh", blocks=2)
    # The prefix reaches the candidate only, through the wrapper's environment variable.
    cand = text.split("[arms.candidate]")[1]
    assert "GPUX_WRAP" in cand and "GPUX_WRAP" not in text.split("[arms.candidate]")[0]
