"""Intel GPUs through `xpu-smi` (XPU Manager's standalone CLI), JSON output.

`xpu-smi discovery -j` lists devices; `xpu-smi stats -d N -j` gives one device's
readings as `device_level: [{metrics_type, value}, ...]`. The CLI reports memory
used in MiB and energy in mJ (XPU Manager's units).
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from tokrecord.jsontypes import JSONObject

from .model import DeviceSample, ProbeError, run_tool

MIB = 1024 * 1024


def _load(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"xpu-smi {what} printed invalid JSON: {exc}") from exc


def parse_discovery(text: str) -> list[tuple[int, str, int | None]]:
    """(device id, name, memory bytes) per device."""
    data = _load(text, "discovery")
    out = []
    for dev in data.get("device_list", []):
        mem = dev.get("memory_physical_size_byte")
        out.append((int(dev["device_id"]), str(dev.get("device_name", "Intel GPU")),
                    None if mem in (None, "") else int(mem)))
    return out


def _metric(entries: list[JSONObject], kind: str) -> float | None:
    for e in entries:
        if e.get("metrics_type") == kind and e.get("value") is not None:
            return float(e["value"])
    return None


def parse_stats(text: str, name: str, mem_total: int | None) -> DeviceSample:
    data = _load(text, "stats")
    level = data.get("device_level", [])
    used_mib = _metric(level, "XPUM_STATS_MEMORY_USED")
    energy_mj = _metric(level, "XPUM_STATS_ENERGY")
    util = _metric(level, "XPUM_STATS_GPU_UTILIZATION")
    if util is None:
        util = _metric(level, "XPUM_STATS_ENGINE_GROUP_COMPUTE_ALL_UTILIZATION")
    return DeviceSample(
        backend="xpu-smi", index=int(data["device_id"]), name=name, util_pct=util,
        mem_used_bytes=None if used_mib is None else int(used_mib * MIB), mem_total_bytes=mem_total,
        power_w=_metric(level, "XPUM_STATS_POWER"),
        energy_j=None if energy_mj is None else energy_mj / 1000.0,
        sm_clock_mhz=_metric(level, "XPUM_STATS_GPU_FREQUENCY"),
        temp_c=_metric(level, "XPUM_STATS_GPU_CORE_TEMPERATURE"),
    )


class XpuSmiProbe:
    name = "xpu-smi"

    def __init__(self, exe: str) -> None:
        self._exe = exe
        self._devices = parse_discovery(self._run("discovery", "-j"))

    def _run(self, *args: str) -> str:
        return run_tool([self._exe, *args])

    def read(self) -> list[DeviceSample]:
        return [parse_stats(self._run("stats", "-d", str(i), "-j"), name, mem)
                for i, name, mem in self._devices]

    def close(self) -> None:
        pass


def detect_xpu() -> tuple[XpuSmiProbe | None, str | None]:
    exe = shutil.which("xpu-smi")
    if exe is None:
        return None, None  # silent: most machines have no Intel GPU and no tool
    try:
        probe = XpuSmiProbe(exe)
    except ProbeError as exc:
        return None, f"Intel: {exc}"
    return (probe, None) if probe._devices else (None, "Intel: xpu-smi lists no GPU")
