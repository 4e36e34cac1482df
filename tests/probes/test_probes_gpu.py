"""The NVML path on a real NVIDIA GPU: probe, idle gate and telemetry while a GPU
workload runs and after it ends, and a leg whose telemetry reads NVML.

Skipped where NVML finds no GPU (CI never has one); never faked as passed. Run on
a GPU machine with `pytest -m gpu -s tests/test_probes_gpu.py`; the figures are
printed, and with TOKRECORD_GPU_CAPTURE=DIR the raw NVML readings are written
there as fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokrecord.probes import ProbeSet
from tokrecord.probes.host import HostProbe
from tokrecord.probes.idle import IdleCriteria, wait_idle
from tokrecord.probes.telemetry import TelemetrySampler, read_samples, summarize_telemetry


def _nvml_probe():  # type: ignore[no-untyped-def]
    try:
        from tokrecord.probes.nvidia import NvmlProbe

        probe = NvmlProbe()
    except Exception:
        return None
    return probe if probe._handles else None


_PROBE = _nvml_probe()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_PROBE is None, reason="NVML finds no NVIDIA GPU here")]

# Only the GPU matters here; the device machine's host is not ours to judge.
GPU_IDLE = IdleCriteria(interval_s=0.5, consecutive=3, timeout_s=60, host_cpu_max_pct=None)
WORKLOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def _capture(name: str, data: object) -> None:
    target = os.environ.get("TOKRECORD_GPU_CAPTURE")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / name).write_text(json.dumps(data, indent=1) + "\n")


def _probes() -> ProbeSet:
    assert _PROBE is not None
    return ProbeSet(HostProbe(scan_processes=False), [_PROBE])


def test_nvml_reads_the_gpu() -> None:
    assert _PROBE is not None
    first = _PROBE.raw()
    time.sleep(1.0)
    second = _PROBE.raw()
    _capture("nvml-idle.json", second)
    for a, b in zip(first, second, strict=True):
        print(f"\nNVML GPU {b['index']}: {b['name']}, {b['util_gpu']} %, "
              f"{b['mem_used'] / 2**20:.0f}/{b['mem_total'] / 2**20:.0f} MiB, "
              f"{b['power_mw'] / 1000:.1f} W, energy {b['energy_mj'] / 1000:.1f} J, "
              f"SM {b['sm_clock']} MHz, {b['temp']} C, procs {b['procs']}")
        assert b["name"] and b["mem_total"] > 0 and b["power_mw"] > 0
        # The energy counter advances by about the power drawn over the second.
        joules = (b["energy_mj"] - a["energy_mj"]) / 1000
        assert 0.3 * b["power_mw"] / 1000 < joules < 3 * b["power_mw"] / 1000


def test_idle_gate_and_telemetry_during_and_after_a_gpu_workload(tmp_path: Path) -> None:
    probes = _probes()
    before = wait_idle(probes.snapshot, GPU_IDLE, "before")
    print(f"\nidle before the workload: passed={before.passed} in {before.seconds:.1f} s, "
          f"{before.snapshots} snapshots")
    assert before.passed, before.reason
    epoch = time.perf_counter_ns()
    sampler = TelemetrySampler(tmp_path / "telemetry.jsonl", 0.25, epoch)
    work = subprocess.Popen([sys.executable, "-c", WORKLOAD, "15"])
    try:
        time.sleep(5.0)  # past CUDA start-up: the first seconds read idle (see fixtures)
        t_busy0 = time.perf_counter_ns() - epoch
        busy = wait_idle(probes.snapshot, GPU_IDLE.model_copy(update={"timeout_s": 4.0}), "busy")
        t_busy1 = time.perf_counter_ns() - epoch
        _capture("nvml-busy.json", _PROBE.raw() if _PROBE else None)
        print(f"idle gate while busy: passed={busy.passed} after {busy.snapshots} snapshots: "
              f"{busy.reason}")
        assert not busy.passed
        assert busy.reason is not None and "utilization" in busy.reason
        assert work.wait(timeout=60) == 0
        after = wait_idle(probes.snapshot, GPU_IDLE, "after")
        t_after = time.perf_counter_ns() - epoch
        print(f"idle after the workload ended: passed={after.passed} in {after.seconds:.1f} s, "
              f"{after.snapshots} snapshots")
        assert after.passed, after.reason
        time.sleep(2.0)
    finally:
        if work.poll() is None:
            work.kill()
        problem = sampler.stop()
    assert problem is None
    samples, header = read_samples(tmp_path / "telemetry.jsonl")
    assert header is not None and header["backends"] == ["nvml"]
    hot = summarize_telemetry(samples, interval_s=0.25, window_ns=(t_busy0, t_busy1),
                              output_tokens=1, headline_tok_s=None)
    cool = summarize_telemetry(samples, interval_s=0.25,
                               window_ns=(t_after, t_after + 1_500_000_000),
                               output_tokens=1, headline_tok_s=None)
    print(f"telemetry busy: {hot.power_w_mean:.1f} W mean, {hot.energy_j:.1f} J over "
          f"{hot.window_s:.2f} s ({hot.energy_method}), util "
          f"{hot.devices[0].util_pct_mean:.0f} %, {hot.samples_in_window} samples")
    print(f"telemetry idle: {cool.power_w_mean:.1f} W mean, {cool.energy_j:.1f} J over "
          f"{cool.window_s:.2f} s ({cool.energy_method}), util "
          f"{cool.devices[0].util_pct_mean:.0f} %")
    assert hot.power_source == "accelerators" and hot.energy_method == "counter"
    assert hot.power_w_mean is not None and cool.power_w_mean is not None
    assert hot.power_w_mean > 2 * cool.power_w_mean
    assert hot.devices[0].util_pct_mean is not None and hot.devices[0].util_pct_mean > 50


def test_a_leg_on_the_gpu_machine_carries_nvml_energy(tmp_path: Path) -> None:
    from probes_support import FAST_IDLE
    from tokrecord.experiment.leg import LegConfig, ServerSpec, run_leg
    from tokrecord.probes.telemetry import TelemetryConfig
    from tokrecord.suite import parse_suite

    text = "".join(json.dumps({"id": f"r{i}", "prompt": f"GPU telemetry row {i}.",
                               "max_tokens": 300}) + "\n" for i in range(4))
    fake = (sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
            "--model", "{model}", "--tok-s", "400")
    cfg = LegConfig(server=ServerSpec(argv=fake, model="m", ready_timeout_s=30),
                    suite=parse_suite(text.encode(), "gpu"), idle=GPU_IDLE,
                    telemetry=TelemetryConfig(interval_s=0.2))
    assert FAST_IDLE.enabled  # the support module travels with the tests
    result = run_leg(cfg, tmp_path / "leg")
    tel = result.telemetry
    assert tel is not None
    print(f"\nleg on the GPU machine: {tel.output_tokens} tokens in {tel.window_s:.2f} s, "
          f"{tel.power_w_mean} W, {tel.energy_j} J ({tel.energy_method}), "
          f"{tel.joules_per_output_token} J/token, {tel.tok_s_per_watt} tok/s/W; "
          f"idle before {result.idle_before}, after {result.idle_after}")
    hw = json.loads((tmp_path / "leg" / "hardware.json").read_text())
    print(f"hardware: {hw}")
    assert tel.power_source == "accelerators" and tel.energy_method == "counter"
    assert tel.energy_j is not None and tel.energy_j > 0
    assert tel.joules_per_output_token is not None and tel.tok_s_per_watt is not None
    assert hw["hw_class"] == "DISCRETE_GPU" and hw["gpu_count"] >= 1
    gates = {g.name: g.status.value for g in result.gates}
    assert gates["idle_before"] == "pass" and gates["idle_after"] == "pass"
