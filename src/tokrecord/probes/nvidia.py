"""NVIDIA: NVML through nvidia-ml-py, with `nvidia-smi --query-gpu` as the fallback.

NVML is read into a raw dict per device (the same keys as the captured fixture in
shared/fixtures/nvidia-h200: power in mW, energy in mJ, memory in bytes), then
converted by a pure function, so the parser is tested against real H200 values.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .model import DeviceProcess, DeviceSample, ProbeError, run_tool

QUERY_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total",
                "power.draw", "clocks.current.sm", "temperature.gpu")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
MIB = 1024 * 1024
# NVML's clocks-event reasons (nvmlClocksEventReason*) that mean the board slowed its
# clocks to protect itself. GpuIdle, ApplicationsClocksSetting, SyncBoost and
# DisplayClockSetting are left out: they are idleness or settings, not throttling.
NVML_THROTTLE_BITS: Final = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
}


def throttle_reasons(mask: int | None) -> tuple[str, ...] | None:
    """NVML's clocks-event reason mask as the names of the throttling reasons in it."""
    if mask is None:
        return None
    return tuple(name for bit, name in NVML_THROTTLE_BITS.items() if mask & bit)


def sample_from_nvml(raw: Mapping[str, Any]) -> DeviceSample:
    """A raw NVML reading (fixture keys) as a sample."""
    procs = raw.get("procs")
    return DeviceSample(
        backend="nvml", index=int(raw["index"]), name=str(raw["name"]),
        util_pct=_num(raw.get("util_gpu")),
        mem_used_bytes=_int(raw.get("mem_used")), mem_total_bytes=_int(raw.get("mem_total")),
        power_w=None if raw.get("power_mw") is None else raw["power_mw"] / 1000.0,
        energy_j=None if raw.get("energy_mj") is None else raw["energy_mj"] / 1000.0,
        sm_clock_mhz=_num(raw.get("sm_clock")), temp_c=_num(raw.get("temp")),
        throttle_reasons=throttle_reasons(raw.get("clocks_event_reasons")),
        processes=None if procs is None else tuple(
            DeviceProcess(pid=int(p[0]), mem_used_bytes=None if p[1] is None else int(p[1]))
            for p in procs),
    )


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _smi_value(text: str) -> float | None:
    """'81.52 W', '0 %', '883 MiB', '[N/A]' -> number or None."""
    head = text.strip().split(" ")[0]
    try:
        return float(head)
    except ValueError:
        return None


def _csv_rows(text: str, fields: Sequence[str] | None) -> list[dict[str, str]]:
    """Rows keyed by query field. Without `fields` the first line is nvidia-smi's
    header (`--format=csv`), whose names carry units: 'power.draw [W]'."""
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    if fields is None:
        if not rows:
            return []
        fields = [h.split(" [")[0].strip() for h in rows[0]]
        rows = rows[1:]
    out = []
    for row in rows:
        if len(row) != len(fields):
            raise ProbeError(f"nvidia-smi printed {len(row)} fields, expected {len(fields)}")
        out.append(dict(zip(fields, (v.strip() for v in row), strict=True)))
    return out


def _mib_bytes(text: str | None) -> int | None:
    v = None if text is None else _smi_value(text)
    return None if v is None else int(v * MIB)


def parse_query_csv(text: str, fields: Sequence[str] | None = QUERY_FIELDS) -> list[DeviceSample]:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader]` output; pass fields=None
    when the header line is present."""
    samples = []
    for i, v in enumerate(_csv_rows(text, fields)):
        def num(key: str, v: dict[str, str] = v) -> float | None:
            return _smi_value(v[key]) if key in v else None

        clock = "clocks.current.sm" if "clocks.current.sm" in v else "clocks.sm"
        samples.append(DeviceSample(
            backend="nvidia-smi", index=int(v.get("index", i)), name=v.get("name", "NVIDIA GPU"),
            util_pct=num("utilization.gpu"),
            mem_used_bytes=_mib_bytes(v.get("memory.used")),
            mem_total_bytes=_mib_bytes(v.get("memory.total")),
            power_w=num("power.draw"), sm_clock_mhz=num(clock), temp_c=num("temperature.gpu"),
        ))
    return samples


def parse_apps_csv(text: str, fields: Sequence[str] | None = APP_FIELDS
                   ) -> dict[str, list[DeviceProcess]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory` output ->
    processes by GPU uuid ('' when the query did not ask for the uuid)."""
    out: dict[str, list[DeviceProcess]] = {}
    for v in _csv_rows(text, fields):
        mem = v.get("used_memory", v.get("used_gpu_memory"))
        out.setdefault(v.get("gpu_uuid", ""), []).append(DeviceProcess(
            pid=int(v["pid"]), name=v.get("process_name"), mem_used_bytes=_mib_bytes(mem)))
    return out


class NvmlProbe:
    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(pynvml.nvmlDeviceGetCount())]

    def _optional(self, fn: Any, *args: Any) -> Any:
        # Some fields are unsupported on some boards (energy on older GPUs, clocks
        # in some MIG modes): None, not a failed probe.
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def _reasons(self, handle: Any) -> int:
        # Renamed from "throttle" to "event" reasons in NVML 12; older bindings have
        # only the old name.
        read = getattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self._nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(read(handle))

    def raw(self) -> list[dict[str, Any]]:
        nv = self._nv
        out = []
        try:
            for i, h in enumerate(self._handles):
                util = self._optional(nv.nvmlDeviceGetUtilizationRates, h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                procs = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, h)
                out.append({
                    "index": i, "name": nv.nvmlDeviceGetName(h),
                    "util_gpu": None if util is None else util.gpu,
                    "util_mem": None if util is None else util.memory,
                    "mem_used": mem.used, "mem_total": mem.total,
                    "power_mw": self._optional(nv.nvmlDeviceGetPowerUsage, h),
                    "energy_mj": self._optional(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                    "sm_clock": self._optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    "temp": self._optional(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    "clocks_event_reasons": self._optional(self._reasons, h),
                    "procs": None if procs is None else [[p.pid, p.usedGpuMemory] for p in procs],
                })
        except nv.NVMLError as exc:
            raise ProbeError(f"NVML read failed: {exc}") from exc
        return out

    def read(self) -> list[DeviceSample]:
        return [sample_from_nvml(r) for r in self.raw()]

    def close(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()


class NvidiaSmiProbe:
    name = "nvidia-smi"

    def __init__(self, exe: str) -> None:
        self._exe = exe

    def _run(self, *args: str) -> str:
        return run_tool([self._exe, *args], timeout=10)

    def read(self) -> list[DeviceSample]:
        samples = parse_query_csv(self._run(f"--query-gpu={','.join(QUERY_FIELDS)}",
                                            "--format=csv,noheader"))
        uuids = [line.strip() for line in
                 self._run("--query-gpu=uuid", "--format=csv,noheader").splitlines()]
        apps = parse_apps_csv(self._run(f"--query-compute-apps={','.join(APP_FIELDS)}",
                                        "--format=csv,noheader"))
        return [dataclasses.replace(s, processes=tuple(apps.get(u, [])))
                for s, u in zip(samples, uuids, strict=False)]

    def close(self) -> None:
        pass


def detect_nvidia() -> tuple[NvmlProbe | NvidiaSmiProbe | None, str | None]:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        nvml_note = "nvidia-ml-py is not installed"
    else:
        try:
            probe = NvmlProbe()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            nvml_note = f"NVML unavailable ({type(exc).__name__}: {exc})"
        else:
            if probe._handles:
                return probe, None
            probe.close()
            nvml_note = "NVML found no GPU"
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, f"NVIDIA: {nvml_note}; no nvidia-smi on PATH"
    smi = NvidiaSmiProbe(exe)
    try:
        if smi.read():
            return smi, f"NVIDIA: {nvml_note}; using nvidia-smi"
    except ProbeError as exc:
        return None, f"NVIDIA: {nvml_note}; {exc}"
    return None, f"NVIDIA: {nvml_note}; nvidia-smi lists no GPU"
