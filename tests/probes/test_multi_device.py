"""Two GPUs in one server: every card gated, metered and identified. A fake two-device
probe built from the real H200 captures (one card idle, one busy), so CI covers what a
2-GPU machine would show."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paths import FIXTURES
from probes_support import FakeClock
from tokrecord.probes import DeviceSample, HostSample, Snapshot
from tokrecord.probes.hardware import describe
from tokrecord.probes.idle import IdleCriteria, busy_reasons, wait_idle
from tokrecord.probes.nvidia import sample_from_nvml
from tokrecord.probes.telemetry import summarize_telemetry
from tokrecord.submit.verified import peak_vram_gb

H200 = FIXTURES / "nvidia-h200"
GIB = 1024 ** 3


def card(index: int, busy: bool) -> DeviceSample:
    idle = json.loads((H200 / "idle" / "nvml.json").read_text())[0]
    if not busy:
        return sample_from_nvml({**idle, "index": index})
    b = json.loads((H200 / "busy" / "nvml-busy.json").read_text())
    return sample_from_nvml({"index": index, "name": "NVIDIA H200", "util_gpu": b["util"],
                             "mem_used": b["mem"], "mem_total": 150754820096,
                             "power_mw": b["power_mw"], "procs": b["procs"]})


def snap(*devices: DeviceSample) -> Snapshot:
    return Snapshot(t_unix=0.0, host=HostSample(cpu_util_pct=1.0, cpu_count=32, load1=0.1,
                                                mem_used_bytes=1 << 30,
                                                mem_total_bytes=256 << 30), devices=devices)


def test_the_idle_gate_names_the_busy_card_only() -> None:
    reasons = busy_reasons(snap(card(0, busy=False), card(1, busy=True)), IdleCriteria())
    assert reasons and all(r.startswith("nvml GPU 1 ") for r in reasons)
    assert busy_reasons(snap(card(0, busy=False), card(1, busy=False)), IdleCriteria()) == []


def test_a_leg_waits_for_every_card() -> None:
    clock = FakeClock()
    result = wait_idle(lambda: snap(card(0, busy=False), card(1, busy=True)),
                       IdleCriteria(interval_s=1, timeout_s=5), "before",
                       sleep=clock.sleep, clock=clock)
    assert not result.passed and result.reason is not None
    assert result.reason.startswith("nvml GPU 1 ") and "GPU 0" not in result.reason


def sample(t_s: float, per_card: list[tuple[float, float, int]]) -> dict[str, Any]:
    """(energy J, power W, memory used bytes) per card at t_s."""
    return {"t_ns": int(t_s * 1e9), "host": {"cpu_util_pct": 5.0},
            "devices": [{"backend": "nvml", "index": i, "name": "NVIDIA H200", "energy_j": e,
                         "power_w": p, "mem_used_bytes": m, "util_pct": 80.0, "temp_c": 40.0}
                        for i, (e, p, m) in enumerate(per_card)]}


def test_telemetry_sums_the_cards_and_divides_the_total() -> None:
    # Card 0 draws 300 W, card 1 100 W, for the 2 s window: 600 J + 200 J = 800 J.
    samples = [sample(t, [(300.0 * t, 300.0, (10 + int(t)) * GIB), (100.0 * t, 100.0, 4 * GIB)])
               for t in (0.0, 1.0, 2.0, 3.0)]
    s = summarize_telemetry(samples, interval_s=1.0, window_ns=(0, 2_000_000_000),
                            output_tokens=400, headline_tok_s=200.0)
    assert [d.energy_j for d in s.devices] == pytest.approx([600.0, 200.0])
    assert s.energy_j == pytest.approx(800.0) and s.power_w_mean == pytest.approx(400.0)
    assert s.joules_per_output_token == pytest.approx(2.0)  # 800 J / 400 tokens
    assert s.tok_s_per_watt == pytest.approx(0.5)  # 200 tok/s / 400 W
    # Peak memory per card in the window (card 0: 12 GiB at 2 s), and in total for the payload.
    assert [d.mem_used_max_bytes for d in s.devices] == [12 * GIB, 4 * GIB]
    assert peak_vram_gb(s) == pytest.approx(round(16 * GIB / 1e9, 3))


def test_hardware_lists_both_cards() -> None:
    hw = describe(snap(card(0, busy=False), card(1, busy=False)), cpu="x", os="Linux")
    assert hw["gpu_count"] == 2 and hw["gpu_name"] == "NVIDIA H200"
    assert [a["index"] for a in hw["accelerators"]] == [0, 1]
