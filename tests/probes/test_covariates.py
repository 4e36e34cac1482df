"""A leg's covariates (probes.covariates), checked against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokrecord.probes.covariates import (
    COVARIATES,
    covariates_from_run_dir,
    from_telemetry_summary,
    leg_covariates,
)


def _sample(t_ns: int, *, util: float, clock: float, power: tuple[float, ...], temp: float,
            cpu: float, load1: float, freq: float | None = None) -> dict[str, Any]:
    return {"t_ns": t_ns,
            "host": {"cpu_util_pct": cpu, "load1": load1, "cpu_freq_mhz": freq, "cpu_count": 2,
                     "mem_used_bytes": 1, "mem_total_bytes": 2},
            "devices": [{"backend": "nvml", "index": i, "name": "G", "util_pct": util,
                         "sm_clock_mhz": clock, "power_w": p, "temp_c": temp}
                        for i, p in enumerate(power)]}


SAMPLES = [
    # Before the window: an idle GPU at its lowest clock; must not count.
    _sample(0, util=0, clock=345, power=(70, 70), temp=30, cpu=1, load1=0.1),
    _sample(10, util=40, clock=1980, power=(200, 100), temp=40, cpu=10, load1=1.0, freq=2000),
    _sample(20, util=60, clock=1900, power=(300, 100), temp=44, cpu=20, load1=2.0, freq=2100),
    _sample(30, util=50, clock=1960, power=(250, 90), temp=42, cpu=30, load1=3.0),
    # After the window.
    _sample(40, util=0, clock=345, power=(70, 70), temp=50, cpu=1, load1=0.1),
]
IDLE = [{"host": {"busy_processes": [{"pid": 1, "name": "zz", "cpu_pct": 50.0}]}},
        {"host": {"busy_processes": [{"pid": 7, "name": "yes", "cpu_pct": 99.0},
                                     {"pid": 8, "name": "cc1", "cpu_pct": 60.0}]}}]


def test_covariates_inside_the_window_only() -> None:
    c = leg_covariates(SAMPLES, (10, 30), idle_before=IDLE, ready_s=1.25, first_ttft_ms=120.0)
    assert c.samples_in_window == 3
    # Utilisation and clocks over both devices' readings in the window (each device alike).
    assert c.gpu_util_pct == pytest.approx(50.0)
    assert c.sm_clock_mhz_mean == pytest.approx((1980 + 1900 + 1960) / 3)
    assert c.sm_clock_mhz_min == 1900  # not the idle 345 outside the window
    # Power: summed over the two devices per sample, then averaged: (300 + 400 + 340) / 3.
    assert c.gpu_power_w == pytest.approx(1040 / 3)
    assert c.gpu_temp_c_max == 44  # not the 50 after the window
    assert c.host_cpu_pct == pytest.approx(20.0)
    assert c.host_load1 == pytest.approx(2.0)
    assert c.host_cpu_freq_mhz == pytest.approx(2050.0)  # the samples that had one
    # The last snapshot of the idle gate, the one that let the leg start.
    assert (c.busy_processes, c.busy_process_names) == (2, ("cc1", "yes"))
    assert (c.ready_s, c.first_ttft_ms, c.source) == (1.25, 120.0, "telemetry")
    assert set(c.values()) == set(COVARIATES)


def test_no_window_no_samples_no_figures() -> None:
    c = leg_covariates(SAMPLES, None)
    assert c.samples_in_window == 0
    assert c.gpu_util_pct is None and c.sm_clock_mhz_min is None and c.busy_processes is None


def test_from_a_slimmed_leg_the_summary_means() -> None:
    tel = {"power_w_mean": 251.3, "host_cpu_util_pct_mean": 7.0, "samples_in_window": 11,
           "devices": [{"util_pct_mean": 47.4, "temp_c_max": 42}]}
    c = from_telemetry_summary(tel, ready_s=1.2)
    assert (c.gpu_power_w, c.gpu_util_pct, c.gpu_temp_c_max, c.host_cpu_pct) == (251.3, 47.4, 42, 7.0)
    assert c.sm_clock_mhz_mean is None and c.source == "telemetry-summary"


def _leg_dir(tmp_path: Path, with_samples: bool) -> Path:
    run = tmp_path / "A1" / "attempt-1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "ready_seconds": 1.5, "telemetry": {"power_w_mean": 99.0, "devices": []}}))
    rows = [{"trace": {"t_send_ns": 10, "t_end_ns": 20}, "metrics": {"ttft_ms": 33.0}},
            {"trace": {"t_send_ns": 21, "t_end_ns": 30}, "metrics": {"ttft_ms": 5.0}}]
    (run / "rows.json").write_text(json.dumps({"rows": rows}))
    (run / "idle-before.jsonl").write_text("".join(json.dumps(s) + "\n" for s in IDLE))
    if with_samples:
        (run / "telemetry.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES)
                                             + '{"t_ns": 5')  # torn by a kill
    return run


def test_recomputed_from_the_files_a_leg_kept(tmp_path: Path) -> None:
    c = covariates_from_run_dir(_leg_dir(tmp_path, with_samples=True))
    assert c is not None
    # Window from the rows' traces: first send 10 to last byte 30.
    assert c.samples_in_window == 3 and c.sm_clock_mhz_min == 1900
    assert (c.ready_s, c.first_ttft_ms, c.busy_processes) == (1.5, 33.0, 2)


def test_recomputed_from_the_summary_when_the_samples_were_not_kept(tmp_path: Path) -> None:
    c = covariates_from_run_dir(_leg_dir(tmp_path, with_samples=False))
    assert c is not None and c.source == "telemetry-summary" and c.gpu_power_w == 99.0


def test_a_directory_without_a_summary_has_none(tmp_path: Path) -> None:
    assert covariates_from_run_dir(tmp_path) is None
