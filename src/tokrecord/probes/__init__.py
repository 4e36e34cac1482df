"""Probes: what the machine is doing, as immutable snapshots.

A probe reads one source (NVML, xpu-smi, amd-smi/rocm-smi, the host) and returns
device samples; a ProbeSet combines the detected probes with the host probe into
one Snapshot. Parsing is pure (raw tool output or raw readings -> samples) and is
tested against captured output; only `read()` touches the machine.

Units are fixed here so nothing downstream converts: bytes, watts, joules, MHz,
degrees C, percent.
"""

from __future__ import annotations

from collections.abc import Sequence

from .amd import detect_amd
from .host import HostProbe
from .model import (
    SCHEMA_SNAPSHOT,
    DeviceProbe,
    DeviceProcess,
    DeviceSample,
    HostProcess,
    HostReader,
    HostSample,
    ProbeError,
    ProbeSet,
    Snapshot,
    run_tool,
)
from .nvidia import detect_nvidia
from .xpu import detect_xpu

__all__ = [
    "SCHEMA_SNAPSHOT",
    "DeviceProbe",
    "DeviceProcess",
    "DeviceSample",
    "HostProcess",
    "HostReader",
    "HostSample",
    "ProbeError",
    "ProbeSet",
    "Snapshot",
    "detect",
    "run_tool",
]

def detect(*, exclude_pids: Sequence[int] = (), scan_processes: bool = True) -> ProbeSet:
    """Every backend that answers on this machine; the host probe always.

    A missing tool or library is a note, never an error: a CPU-only machine has
    no accelerator to probe, and says so.
    """
    devices: list[DeviceProbe] = []
    notes: list[str] = []
    for finder in (detect_nvidia, detect_xpu, detect_amd):
        probe, note = finder()
        if probe is not None:
            devices.append(probe)
        if note:
            notes.append(note)
    return ProbeSet(HostProbe(exclude_pids=exclude_pids, scan_processes=scan_processes),
                    devices, notes)
