"""The probes' data: samples, snapshots, the probe interfaces and the ProbeSet."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

SCHEMA_SNAPSHOT = "tokrecord.snapshot/v1"

# The samples are frozen dataclasses, not pydantic models: the telemetry sampler, a process
# per leg, builds them and would otherwise spend 0.1 s of its 0.2 s of CPU importing pydantic
# and building validators. What pydantic did for them is done here: an int given for a float
# field is stored as a float (NVML reports integers), and `as_json` is its JSON dump.


def _floats(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, name, float(value))


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if hasattr(value, "as_json"):
        return value.as_json()
    return value


class _Sample:
    __slots__ = ()

    def as_json(self, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The sample as JSON types, fields in declaration order (pydantic's model_dump)."""
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)  # type: ignore[arg-type]
                if f.name not in exclude}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceProcess(_Sample):
    pid: int
    name: str | None = None
    mem_used_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample(_Sample):
    """One accelerator at one instant. None: the tool does not report it."""

    backend: str  # nvml | nvidia-smi | xpu-smi | amd-smi | rocm-smi
    index: int
    name: str
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    # A cumulative counter (NVML total energy, xpu-smi energy): exact energy over a
    # window without integrating sampled power.
    energy_j: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    processes: tuple[DeviceProcess, ...] | None = None  # None: the tool cannot list them
    # Why the clocks are held down right now, by name ("sw_thermal_slowdown", ...): ()
    # none; None: the tool does not say (nvidia-smi, AMD, Intel). Idle and user-set
    # clocks are not reasons: they are not the hardware protecting itself.
    throttle_reasons: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _floats(self, "util_pct", "power_w", "energy_j", "sm_clock_mhz", "temp_c")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostProcess(_Sample):
    pid: int
    name: str
    cpu_pct: float  # of one core, over the interval since the previous snapshot

    def __post_init__(self) -> None:
        _floats(self, "cpu_pct")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSample(_Sample):
    cpu_util_pct: float  # all cores, since the previous snapshot
    cpu_count: int
    load1: float
    mem_used_bytes: int
    mem_total_bytes: int
    power_w: float | None = None  # RAPL package power, when readable
    energy_j: float | None = None  # RAPL package energy counter (wraps; see host.py)
    # Mean current frequency over all cores, where the kernel exposes it (not in most VMs):
    # a covariate of host-bound legs, never a gate.
    cpu_freq_mhz: float | None = None
    busy_processes: tuple[HostProcess, ...] = ()

    def __post_init__(self) -> None:
        _floats(self, "cpu_util_pct", "load1", "power_w", "energy_j", "cpu_freq_mhz")


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot(_Sample):
    schema_id: str = SCHEMA_SNAPSHOT
    t_unix: float
    host: HostSample
    devices: tuple[DeviceSample, ...] = ()

    def __post_init__(self) -> None:
        _floats(self, "t_unix")

    def as_json(self, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
        """As pydantic dumped it by alias: the schema id under "schema"."""
        out = super(Snapshot, self).as_json(exclude)
        return {"schema": out.pop("schema_id"), **out}


class ProbeError(Exception):
    """A probe that was found but could not be read this time."""


def run_tool(argv: Sequence[str], timeout: float = 15.0) -> str:
    """A vendor tool's stdout; any failure (missing, hung, non-zero) as a ProbeError
    that quotes what the tool said."""
    name = Path(argv[0]).name
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"{name} failed: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:200]
        raise ProbeError(f"{name} {' '.join(argv[1:2])} exited {done.returncode}: {said}")
    return done.stdout


class DeviceProbe(Protocol):
    """One accelerator backend."""

    name: str

    def read(self) -> list[DeviceSample]: ...

    def close(self) -> None: ...


class HostReader(Protocol):
    def read(self) -> HostSample: ...


class ProbeSet:
    """The host probe plus every device probe found, read together."""

    def __init__(self, host: HostReader, devices: Sequence[DeviceProbe] = (),
                 notes: Sequence[str] = ()) -> None:
        self.host = host
        self.devices = list(devices)
        self.notes = list(notes)

    def snapshot(self) -> Snapshot:
        samples: list[DeviceSample] = []
        for probe in self.devices:
            try:
                samples.extend(probe.read())
            except ProbeError as exc:
                # A probe that worked at detection and fails now is worth knowing,
                # once, not a crash in the middle of a leg.
                note = f"{probe.name}: {exc}"
                if note not in self.notes:
                    self.notes.append(note)
        return Snapshot(t_unix=time.time(), host=self.host.read(), devices=tuple(samples))

    @property
    def backends(self) -> list[str]:
        return [p.name for p in self.devices]

    def close(self) -> None:
        for probe in self.devices:
            probe.close()
