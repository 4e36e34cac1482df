"""Probes: parsers against captured tool output, the idle gate's logic with a fake
probe, the telemetry figures against hand-computed values, and a real leg's
idle gates and telemetry on this host."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from paths import FIXTURES as FIXTURES_DIR
from probes_support import FakeClock
from tokrecord.experiment.leg import LegConfig, ServerSpec, run_leg
from tokrecord.probes import DeviceSample, HostSample, ProbeSet, Snapshot
from tokrecord.probes.amd import parse_amd_smi, parse_rocm_smi
from tokrecord.probes.hardware import describe
from tokrecord.probes.host import HostProbe, energy_delta_uj, rapl_domains
from tokrecord.probes.idle import IdleCriteria, IdleTimeout, busy_reasons, wait_idle
from tokrecord.probes.nvidia import parse_apps_csv, parse_query_csv, sample_from_nvml
from tokrecord.probes.telemetry import (
    TelemetryConfig,
    counter_energy,
    summarize_telemetry,
    trapezoid_energy,
)
from tokrecord.probes.xpu import parse_discovery, parse_stats
from tokrecord.suite import Suite, parse_suite

FIX = FIXTURES_DIR
H200 = FIX / "nvidia-h200"
MIB = 1024 * 1024
BUSY_FIELDS = ("timestamp", "utilization.gpu", "utilization.memory", "power.draw", "clocks.sm",
               "memory.used", "temperature.gpu", "pstate")


def host(cpu: float = 1.0) -> HostSample:
    return HostSample(cpu_util_pct=cpu, cpu_count=2, load1=0.1, mem_used_bytes=1 << 30,
                      mem_total_bytes=16 << 30)


def snap(*devices: DeviceSample, cpu: float = 1.0) -> Snapshot:
    return Snapshot(t_unix=0.0, host=host(cpu), devices=devices)


def nvml_idle() -> DeviceSample:
    return sample_from_nvml(json.loads((H200 / "idle" / "nvml.json").read_text())[0])


def nvml_busy() -> DeviceSample:
    b = json.loads((H200 / "busy" / "nvml-busy.json").read_text())
    # The busy capture kept only the fields that change; the rest as at idle.
    raw = {"index": 0, "name": "NVIDIA H200", "util_gpu": b["util"], "mem_used": b["mem"],
           "mem_total": 150754820096, "power_mw": b["power_mw"], "procs": b["procs"]}
    return sample_from_nvml(raw)


# --------------------------------------------------------------------------- NVIDIA


def test_nvml_idle_h200_values() -> None:
    d = nvml_idle()
    assert (d.backend, d.index, d.name) == ("nvml", 0, "NVIDIA H200")
    assert d.power_w == pytest.approx(123.576)  # 123576 mW
    assert d.energy_j == pytest.approx(2343.496)  # 2343496 mJ
    assert d.mem_used_bytes == 644939776 and d.mem_total_bytes == 150754820096
    assert (d.util_pct, d.sm_clock_mhz, d.temp_c) == (0.0, 405.0, 41.0)
    assert d.processes == ()


def test_nvml_busy_h200_values_and_reasons() -> None:
    d = nvml_busy()
    assert d.power_w == pytest.approx(692.583)
    assert d.processes is not None and [(p.pid, p.mem_used_bytes) for p in d.processes] == [
        (492, 916455424)]
    reasons = busy_reasons(snap(d), IdleCriteria())
    assert reasons == [
        "nvml GPU 0 utilization 100% > 5%",
        "nvml GPU 0 memory used 1498 MiB > 1024 MiB",  # 1570635776 / 2**20 = 1497.9
        "nvml GPU 0 held by 1 process(es) (pids 492)",
    ]
    # NVML counts ~615 MiB of reserved memory on an idle H200: under the default limit.
    assert busy_reasons(snap(nvml_idle()), IdleCriteria()) == []


def test_nvml_capture_by_our_own_probe_busy() -> None:
    """NvmlProbe.raw() on the H200 while a matmul loop ran (test_probes_gpu.py capture)."""
    (raw,) = json.loads((H200 / "nvml-tokrecord" / "nvml-busy.json").read_text())
    d = sample_from_nvml(raw)
    assert (d.util_pct, d.power_w, d.energy_j) == (99.0, 692.826, 5962.379)
    assert (d.sm_clock_mhz, d.temp_c, d.mem_total_bytes) == (1485.0, 58.0, 150754820096)
    assert d.processes is not None and d.processes[0].pid == 466
    assert len(busy_reasons(snap(d), IdleCriteria())) == 3
    (idle_raw,) = json.loads((H200 / "nvml-tokrecord" / "nvml-idle.json").read_text())
    assert busy_reasons(snap(sample_from_nvml(idle_raw)), IdleCriteria()) == []


def test_nvidia_smi_query_csv_with_header_idle() -> None:
    (d,) = parse_query_csv((H200 / "idle" / "nvidia-smi-query.csv").read_text(), fields=None)
    assert (d.index, d.name, d.util_pct, d.power_w) == (0, "NVIDIA H200", 0.0, 129.04)
    assert d.mem_used_bytes == 0 and d.mem_total_bytes == 143771 * MIB
    assert (d.sm_clock_mhz, d.temp_c) == (1980.0, 41.0)


def test_nvidia_smi_busy_then_after() -> None:
    busy = parse_query_csv((H200 / "busy" / "busy.csv").read_text(), BUSY_FIELDS)
    assert [s.power_w for s in busy] == [694.32, 693.54, 692.94]
    assert [s.sm_clock_mhz for s in busy] == [1500.0, 1530.0, 1545.0]
    assert all(s.util_pct == 100.0 and s.mem_used_bytes == 883 * MIB for s in busy)
    (after,) = parse_query_csv((H200 / "busy" / "after.csv").read_text(), BUSY_FIELDS)
    assert (after.util_pct, after.power_w, after.sm_clock_mhz) == (0.0, 81.52, 345.0)
    assert busy_reasons(snap(after), IdleCriteria()) == []
    assert busy_reasons(snap(busy[0]), IdleCriteria()) == ["nvidia-smi GPU 0 utilization 100% > 5%"]


def test_nvidia_smi_compute_apps() -> None:
    apps = parse_apps_csv((H200 / "busy" / "apps-busy.csv").read_text(), fields=None)
    (p,) = apps[""]
    assert (p.pid, p.name, p.mem_used_bytes) == (492, "python3", 874 * MIB)


def test_nvidia_smi_wrong_field_count_is_a_probe_error() -> None:
    from tokrecord.probes import ProbeError

    with pytest.raises(ProbeError, match="printed 2 fields, expected 8"):
        parse_query_csv("0, NVIDIA H200\n")


# --------------------------------------------------------------------------- Intel, AMD


def test_xpu_smi_discovery_and_stats() -> None:
    ((idx, name, mem),) = parse_discovery((FIX / "intel-xpu-smi" / "discovery.json").read_text())
    assert (idx, name, mem) == (0, "Intel(R) Data Center GPU Max 1550", 68719476736)
    d = parse_stats((FIX / "intel-xpu-smi" / "stats-busy.json").read_text(), name, mem)
    assert (d.backend, d.util_pct, d.power_w, d.sm_clock_mhz, d.temp_c) == (
        "xpu-smi", 97.5, 312.47, 1550.0, 53.0)
    assert d.mem_used_bytes == int(8108.5 * MIB)
    assert d.energy_j == pytest.approx(16169.744)  # 16169744 mJ
    idle = parse_stats((FIX / "intel-xpu-smi" / "stats-idle-no-gpu-util.json").read_text(), name, mem)
    assert idle.util_pct == 0.0  # falls back to the compute engine group
    assert idle.energy_j is None
    assert busy_reasons(snap(idle), IdleCriteria()) == []


def test_amd_smi_gpu_data_form() -> None:
    a, b = parse_amd_smi((FIX / "amd-smi" / "metric-gpu-data.json").read_text())
    assert (a.util_pct, a.power_w, a.sm_clock_mhz, a.temp_c) == (100.0, 689.0, 2100.0, 71.0)
    assert a.mem_used_bytes == 150123 * MIB and a.mem_total_bytes == 196592 * MIB
    assert a.energy_j == 1234567.5
    assert (b.util_pct, b.power_w, b.temp_c) == (None, None, None)  # "N/A" is unknown, not 0
    assert b.mem_used_bytes == 283 * MIB


def test_amd_smi_list_form_and_rocm_smi() -> None:
    (d,) = parse_amd_smi((FIX / "amd-smi" / "metric-list.json").read_text(), {0: "RX 7900"})
    assert (d.name, d.util_pct, d.power_w, d.temp_c) == ("RX 7900", 5.0, 22.0, 44.0)
    c0, c1 = sorted(parse_rocm_smi((FIX / "amd-smi" / "rocm-smi.json").read_text()),
                    key=lambda s: s.index)
    assert (c0.name, c0.util_pct, c0.power_w, c0.temp_c) == ("Radeon RX 7900 XT", 12.0, 22.0, 44.0)
    assert c0.mem_used_bytes == 1073741824 and c0.mem_total_bytes == 17163091968
    assert (c1.util_pct, c1.power_w, c1.temp_c) == (83.0, 241.0, 88.0)


# --------------------------------------------------------------------------- the idle gate


def sequence(*snaps: Snapshot) -> Iterator[Snapshot]:
    yield from snaps
    while True:
        yield snaps[-1]


def test_idle_gate_samples_past_a_workload_start_up() -> None:
    """The H200 capture: the first sample after a workload started still read idle."""
    startup = parse_query_csv((H200 / "busy" / "after.csv").read_text(), BUSY_FIELDS)[0]
    busy = parse_query_csv((H200 / "busy" / "busy.csv").read_text(), BUSY_FIELDS)
    snaps = sequence(snap(startup), *(snap(b) for b in busy), snap(startup))
    clock = FakeClock()
    seen: list[tuple[int, int]] = []
    result = wait_idle(lambda: next(snaps), IdleCriteria(interval_s=1, consecutive=3), "before",
                       sleep=clock.sleep, clock=clock,
                       on_snapshot=lambda s, r, run, e: seen.append((len(r), run)))
    assert result.passed and result.snapshots == 7 and result.seconds == 7.0
    # idle, busy x3 (run resets), then three idle in a row
    assert seen == [(0, 1), (1, 0), (1, 0), (1, 0), (0, 1), (0, 2), (0, 3)]


def test_idle_gate_times_out_with_the_reason() -> None:
    clock = FakeClock()
    result = wait_idle(lambda: snap(cpu=80.0), IdleCriteria(interval_s=1, timeout_s=10), "before",
                       sleep=clock.sleep, clock=clock)
    assert not result.passed
    assert result.snapshots == 10 and result.seconds == 10.0
    assert result.reason == "host CPU 80% > 25%"


def test_idle_gate_switched_off_takes_no_snapshot() -> None:
    def boom() -> Snapshot:
        raise AssertionError("no snapshot expected")

    result = wait_idle(boom, IdleCriteria(enabled=False), "after")
    assert result.skipped and result.passed and result.snapshots == 0


def test_busy_reasons_each_criterion() -> None:
    d = DeviceSample(backend="nvml", index=1, name="g", util_pct=3, mem_used_bytes=10 * MIB,
                     power_w=150.0, processes=())
    c = IdleCriteria(device_power_max_w=100, host_busy_processes_max=0)
    from tokrecord.probes import HostProcess

    h = dataclasses.replace(host(5.0), busy_processes=(HostProcess(pid=7, name="x", cpu_pct=90),))
    reasons = busy_reasons(Snapshot(t_unix=0, host=h, devices=(d,)), c)
    assert reasons == ["1 busy processes > 0: x[7]", "nvml GPU 1 power 150.0 W > 100 W"]
    # None switches a check off; unknown readings (None) never count as busy.
    unknown = DeviceSample(backend="xpu-smi", index=0, name="g")
    assert busy_reasons(snap(unknown), IdleCriteria()) == []


# --------------------------------------------------------------------------- telemetry figures


def test_counter_and_trapezoid_energy_hand_computed() -> None:
    counter = [(0, 100.0), (1_000_000_000, 300.0), (2_000_000_000, 700.0)]
    # counter at 0.5 s = 200 J, at 1.5 s = 500 J
    assert counter_energy(counter, 500_000_000, 1_500_000_000) == pytest.approx(300.0)
    assert counter_energy(counter, -1, 1_000_000_000) is None  # outside the samples
    power = [(0, 100.0), (1_000_000_000, 300.0)]
    assert trapezoid_energy(power, 0, 1_000_000_000) == pytest.approx(200.0)
    # from 0.5 s (200 W) to 1 s (300 W): 250 W x 0.5 s
    assert trapezoid_energy(power, 500_000_000, 1_000_000_000) == pytest.approx(125.0)
    assert trapezoid_energy(power, 0, 2_000_000_000) is None  # not covered


def _sample(t_s: float, energy: float | None, power: float) -> dict[str, Any]:
    return {"t_ns": int(t_s * 1e9), "host": {"cpu_util_pct": 50.0, "power_w": None,
                                             "energy_j": None},
            "devices": [{"backend": "nvml", "index": 0, "name": "NVIDIA H200", "power_w": power,
                         "energy_j": energy, "util_pct": 90.0, "mem_used_bytes": 5 * MIB,
                         "temp_c": 60.0}]}


def test_summarize_telemetry_from_an_energy_counter() -> None:
    samples = [_sample(t, 1000.0 + 150.0 * t, 150.0) for t in (0.0, 1.0, 2.0, 3.0)]
    s = summarize_telemetry(samples, interval_s=1.0, window_ns=(500_000_000, 2_500_000_000),
                            output_tokens=1000, headline_tok_s=100.0)
    # 150 W for 2 s = 300 J; 300 J / 1000 tokens; 100 tok/s at 150 W
    assert s.power_source == "accelerators" and s.energy_method == "counter"
    assert s.energy_j == pytest.approx(300.0) and s.power_w_mean == pytest.approx(150.0)
    assert s.joules_per_output_token == pytest.approx(0.3)
    assert s.tok_s_per_watt == pytest.approx(100.0 / 150.0)
    assert s.samples == 4 and s.samples_in_window == 2 and s.window_s == pytest.approx(2.0)
    (dev,) = s.devices
    assert dev.util_pct_mean == 90.0 and dev.temp_c_max == 60.0


def test_summarize_telemetry_trapezoid_without_counter_and_cpu_only() -> None:
    samples = [_sample(t, None, p) for t, p in ((0.0, 100.0), (1.0, 300.0), (2.0, 300.0))]
    s = summarize_telemetry(samples, interval_s=1.0, window_ns=(0, 2_000_000_000),
                            output_tokens=400, headline_tok_s=None)
    assert s.energy_method == "trapezoid" and s.energy_j == pytest.approx(200.0 + 300.0)
    assert s.joules_per_output_token == pytest.approx(1.25) and s.tok_s_per_watt is None
    cpu_only = [{"t_ns": t, "host": {"cpu_util_pct": 10.0}, "devices": []} for t in (0, 10)]
    c = summarize_telemetry(cpu_only, interval_s=1.0, window_ns=(0, 10), output_tokens=5,
                            headline_tok_s=10.0)
    assert c.energy_j is None and c.power_source is None
    assert c.notes == ("no accelerator found", "no host power source (RAPL not readable)")


# --------------------------------------------------------------------------- host, hardware


def test_rapl_counter_wraps(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    sub = tmp_path / "intel-rapl:0:0"  # a core sub-zone: not counted twice
    sub.mkdir()
    (sub / "name").write_text("core\n")
    assert [d.name for d in rapl_domains(tmp_path)] == ["package-0"]
    assert energy_delta_uj(900_000, 100_000, 1_000_000) == 200_000
    probe = HostProbe(rapl_root=tmp_path, scan_processes=False)
    (zone / "energy_uj").write_text("100000\n")  # wrapped: 0.2 J since construction
    sample = probe.read()
    assert sample.energy_j == pytest.approx(0.2)
    assert sample.power_w is not None and sample.power_w > 0


def test_hardware_from_probes() -> None:
    hw = describe(snap(nvml_idle()), cpu="AMD EPYC", os="Linux")
    assert hw["hw_class"] == "DISCRETE_GPU" and hw["gpu_count"] == 1
    assert hw["gpu_name"] == "NVIDIA H200" and hw["vram_gb"] == 150.8  # 150754820096 B
    assert hw["ram_gb"] == 17.2  # 16 GiB in decimal GB
    cpu = describe(snap(), cpu="AMD EPYC", os="Linux")
    assert (cpu["hw_class"], cpu["gpu_name"], cpu["vram_gb"]) == ("CPU_ONLY", None, None)


# --------------------------------------------------------------------------- a real leg


class _BusyHost:
    def read(self) -> HostSample:
        return host(97.0)


def _suite() -> Suite:
    text = "".join(json.dumps({"id": f"r{i}", "prompt": f"Explain idle gates, case {i}.",
                               "max_tokens": 150}) + "\n" for i in range(3))
    return parse_suite(text.encode(), "t")


FAKE = (sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--tok-s", "500")


def test_busy_machine_leg_does_not_start(tmp_path: Path) -> None:
    cfg = LegConfig(server=ServerSpec(argv=FAKE, model="m", ready_timeout_s=30), suite=_suite(),
                    idle=IdleCriteria(interval_s=0.05, consecutive=2, timeout_s=0.3))
    with pytest.raises(IdleTimeout, match=r"did not become idle within 0.3 s .*host CPU 97% > 25%"
                       r".*the leg did not start"):
        run_leg(cfg, tmp_path / "leg", probes=ProbeSet(_BusyHost()))
    out = tmp_path / "leg"
    assert not (out / "server.json").exists()  # never started
    idle = json.loads((out / "idle.json").read_text())
    assert idle["before"]["passed"] is False and idle["after"] is None
    assert len((out / "idle-before.jsonl").read_text().splitlines()) == idle["before"]["snapshots"]
    assert json.loads((out / "error.json").read_text())["status"] == "failed"
    gates = {g["name"]: g["status"] for g in json.loads((out / "gates.json").read_text())["gates"]}
    assert gates["idle_before"] == "fail" and gates["idle_after"] == "not tested"


def test_real_leg_idle_gates_and_telemetry_share_the_leg_clock(tmp_path: Path) -> None:
    idle = IdleCriteria(interval_s=0.05, consecutive=3, timeout_s=30, host_cpu_max_pct=None)
    cfg = LegConfig(server=ServerSpec(argv=FAKE, model="m", ready_timeout_s=30), suite=_suite(),
                    idle=idle, telemetry=TelemetryConfig(interval_s=0.1))
    result = run_leg(cfg, tmp_path / "leg")
    assert result.idle_before is not None and result.idle_before.passed
    assert result.idle_after is not None and result.idle_after.passed
    assert result.idle_before.snapshots == 3 and result.idle_before.seconds >= 0.15
    tel = result.telemetry
    assert tel is not None and tel.samples_in_window >= 3  # ~0.9 s of streaming at 0.1 s
    assert tel.output_tokens == 450 and tel.host_cpu_util_pct_mean is not None
    rows = json.loads((tmp_path / "leg" / "rows.json").read_text())["rows"]
    t_send = min(r["trace"]["t_send_ns"] for r in rows)
    t_end = max(r["trace"]["t_end_ns"] for r in rows)
    lines = [json.loads(x) for x in (tmp_path / "leg" / "telemetry.jsonl").read_text().splitlines()]
    assert tel.window_s == pytest.approx((t_end - t_send) / 1e9)
    assert sum(1 for x in lines if t_send <= x["t_ns"] <= t_end) == tel.samples_in_window
    assert lines[0]["t_ns"] < t_send and lines[-1]["t_ns"] > t_end  # sampled across the suite
    header = json.loads((tmp_path / "leg" / "telemetry.probes.json").read_text())
    if not header["backends"]:  # a CPU-only machine says why there is no energy
        assert "no accelerator found" in tel.notes
    hw = json.loads((tmp_path / "leg" / "hardware.json").read_text())
    assert hw["hw_class"] in ("CPU_ONLY", "DISCRETE_GPU") and hw["cpu_count"] >= 1


def test_probe_command_table_json_and_bad_criterion() -> None:
    from cli_support import cli_in_process

    # In process (tests/cli_support.py): what `probe` prints and exits with.
    cli = ["probe", "--interval", "0.1"]
    env = {"COLUMNS": "160", "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    table = cli_in_process(cli, env)
    assert table.returncode == 0, table.stderr
    assert "CPU util" in table.stdout and "snapshot 1/1:" in table.stdout
    as_json = cli_in_process([*cli, "--json", "--count", "2", "--idle", "host_cpu_max_pct=100"],
                             env)
    assert as_json.returncode == 0, as_json.stderr
    decoder = json.JSONDecoder()
    text, docs = as_json.stdout.strip(), []
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    assert len(docs) == 2 and all(d["busy"] == [] for d in docs)  # 100 % is never exceeded
    assert docs[0]["host"]["cpu_count"] >= 1
    bad = cli_in_process([*cli, "--idle", "host_cpu_max=5"], env)
    assert bad.returncode == 2 and "host_cpu_max" in bad.stderr


def test_a_failing_vendor_tool_is_a_probe_error_quoting_it() -> None:
    from tokrecord.probes import ProbeError, run_tool

    script = "import sys; sys.stderr.write('no devices were found'); sys.exit(3)"
    with pytest.raises(ProbeError, match=r"exited 3: no devices were found"):
        run_tool([sys.executable, "-c", script])
    with pytest.raises(ProbeError, match="nonexistent-smi failed"):
        run_tool(["/nonexistent/nonexistent-smi", "-j"])
    assert run_tool([sys.executable, "-c", "print('ok')"]) == "ok\n"


BURN = "import time\nend = time.time() + 30\nwhile time.time() < end:\n    pass\n"


def test_the_host_scan_names_other_busy_processes_and_never_our_own() -> None:
    # A real scan of /proc. Another process (a grandchild whose parent has exited, so no
    # longer in our family) burns a core, and so do our child and its child. CPU shares are
    # measured over real time: the scan is repeated until the other one shows (the event),
    # within a deadline.
    detach = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]],"
              " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    other = psutil.Process(int(subprocess.run([sys.executable, "-c", detach, BURN],
                                              capture_output=True, text=True, check=True).stdout))
    own = psutil.Popen([sys.executable, "-c", detach.replace("print(p.pid)", "p.wait()"), BURN])
    family = [own]
    try:
        deadline = time.monotonic() + 20
        while len(family) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # not a spin beside the cores the burners need
            family = [own, *own.children()]
        assert len(family) == 2
        probe = HostProbe()
        seen: list[set[int]] = []
        while time.monotonic() < deadline:
            time.sleep(0.1)
            busy = probe.read().busy_processes
            seen.append({p.pid for p in busy})
            if other.pid in seen[-1]:
                break
        assert other.pid in seen[-1], seen
        named = next(p for p in busy if p.pid == other.pid)
        assert named.name.startswith("python") and named.cpu_pct >= 10
        assert not {p.pid for p in family} & set().union(*seen), seen
    finally:
        for proc in [*family, other]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        own.wait()
