"""What the leg ran on, in the terms leaderboards ask for (hwClass, GPU, VRAM, CPU, RAM, OS).

Built from a probe snapshot, so it says what the probes saw, not what a user typed.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TypedDict

from .model import Snapshot

GB = 1e9  # leaderboards quote VRAM and RAM in decimal GB


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def os_name() -> str:
    try:
        info = platform.freedesktop_os_release()
        return f"{info.get('PRETTY_NAME', info.get('NAME', 'Linux'))} (kernel {platform.release()})"
    except OSError:
        return f"{platform.system()} {platform.release()}"


class AcceleratorJSON(TypedDict):
    backend: str
    index: int
    name: str
    mem_total_bytes: int | None


class HardwareJSON(TypedDict):
    """hardware.json: what the leg's probes saw (record.schema.Hardware reads it)."""

    hw_class: str
    gpu_name: str | None
    gpu_count: int
    vram_gb: float | None
    cpu: str
    cpu_count: int | None
    ram_gb: float
    os: str
    accelerators: list[AcceleratorJSON]


def describe(snap: Snapshot, *, cpu: str, os: str) -> HardwareJSON:
    """hw_class DISCRETE_GPU when an accelerator was probed, CPU_ONLY otherwise.

    UNIFIED (one memory pool for CPU and GPU) is not inferred: no probe here can
    tell it apart reliably, so it is left to the user to declare.
    """
    devs = snap.devices
    names = sorted({d.name for d in devs})
    vram = [d.mem_total_bytes for d in devs if d.mem_total_bytes is not None]
    return {
        "hw_class": "DISCRETE_GPU" if devs else "CPU_ONLY",
        "gpu_name": " + ".join(names) if names else None,
        "gpu_count": len(devs),
        "vram_gb": round(sum(vram) / GB, 1) if vram and len(vram) == len(devs) else None,
        "cpu": cpu,
        "cpu_count": snap.host.cpu_count,
        "ram_gb": round(snap.host.mem_total_bytes / GB, 1),
        "os": os,
        "accelerators": [{"backend": d.backend, "index": d.index, "name": d.name,
                          "mem_total_bytes": d.mem_total_bytes} for d in devs],
    }
