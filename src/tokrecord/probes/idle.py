"""The idle gate: snapshots at an interval until N consecutive ones meet the
declared criteria, or a timeout.

Consecutive snapshots, not one: a workload that just started may still read 0 %
and idle power while it initialises (seen on the H200: the first sample 3 s after
a matmul loop started read 0 % and 81 W), so one quiet reading proves nothing.
Process lists are a criterion of their own for the same reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.errors import TokrecordError

from .model import Snapshot

MIB = 1024 * 1024


class IdleCriteria(BaseModel):
    """What "idle" means for a plan's `[idle]` section. None switches a check off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    interval_s: float = Field(default=1.0, gt=0)
    consecutive: int = Field(default=5, ge=1)
    timeout_s: float = Field(default=300.0, gt=0)
    host_cpu_max_pct: float | None = Field(default=25.0, ge=0, le=100)
    host_busy_processes_max: int | None = Field(default=None, ge=0)
    device_util_max_pct: float | None = Field(default=5.0, ge=0, le=100)
    device_mem_used_max_mib: float | None = Field(default=1024.0, ge=0)
    device_power_max_w: float | None = Field(default=None, gt=0)
    device_processes_max: int | None = Field(default=0, ge=0)


class IdleResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: str  # before | after
    passed: bool
    skipped: bool = False
    seconds: float
    snapshots: int
    reason: str | None  # why it failed: the last snapshot's reasons
    criteria: IdleCriteria


class IdleTimeout(TokrecordError):
    """The machine did not become idle in time: the leg does not start."""


def busy_reasons(snap: Snapshot, c: IdleCriteria) -> list[str]:
    """Every way this snapshot misses the criteria; [] means idle."""
    out = []
    h = snap.host
    if c.host_cpu_max_pct is not None and h.cpu_util_pct > c.host_cpu_max_pct:
        top = ", ".join(f"{p.name}[{p.pid}] {p.cpu_pct:.0f}%" for p in h.busy_processes[:3])
        out.append(f"host CPU {h.cpu_util_pct:.0f}% > {c.host_cpu_max_pct:g}%"
                   + (f" (busy: {top})" if top else ""))
    if c.host_busy_processes_max is not None and len(h.busy_processes) > c.host_busy_processes_max:
        names = ", ".join(f"{p.name}[{p.pid}]" for p in h.busy_processes[:5])
        out.append(f"{len(h.busy_processes)} busy processes > {c.host_busy_processes_max}: {names}")
    for d in snap.devices:
        tag = f"{d.backend} GPU {d.index}"
        if c.device_util_max_pct is not None and d.util_pct is not None \
                and d.util_pct > c.device_util_max_pct:
            out.append(f"{tag} utilization {d.util_pct:g}% > {c.device_util_max_pct:g}%")
        if c.device_mem_used_max_mib is not None and d.mem_used_bytes is not None \
                and d.mem_used_bytes / MIB > c.device_mem_used_max_mib:
            out.append(f"{tag} memory used {d.mem_used_bytes / MIB:.0f} MiB > "
                       f"{c.device_mem_used_max_mib:g} MiB")
        if c.device_power_max_w is not None and d.power_w is not None \
                and d.power_w > c.device_power_max_w:
            out.append(f"{tag} power {d.power_w:.1f} W > {c.device_power_max_w:g} W")
        if c.device_processes_max is not None and d.processes is not None \
                and len(d.processes) > c.device_processes_max:
            pids = ", ".join(str(p.pid) for p in d.processes[:5])
            out.append(f"{tag} held by {len(d.processes)} process(es) (pids {pids})")
    return out


def wait_idle(
    read: Callable[[], Snapshot],
    criteria: IdleCriteria,
    phase: str,
    *,
    on_snapshot: Callable[[Snapshot, list[str], int, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> IdleResult:
    """Sample until `consecutive` idle snapshots in a row, or `timeout_s`.

    The first snapshot comes one interval after the start, so the host CPU rate
    it reports covers a whole interval.
    """
    if not criteria.enabled:
        return IdleResult(phase=phase, passed=True, skipped=True, seconds=0.0, snapshots=0,
                          reason=None, criteria=criteria)
    start = clock()
    taken = run = 0
    reasons: list[str] = []
    while True:
        sleep(criteria.interval_s)
        snap = read()
        taken += 1
        reasons = busy_reasons(snap, criteria)
        run = 0 if reasons else run + 1
        elapsed = clock() - start
        if on_snapshot is not None:
            on_snapshot(snap, reasons, run, elapsed)
        if run >= criteria.consecutive:
            return IdleResult(phase=phase, passed=True, seconds=round(elapsed, 3),
                              snapshots=taken, reason=None, criteria=criteria)
        if elapsed + criteria.interval_s > criteria.timeout_s:
            return IdleResult(phase=phase, passed=False, seconds=round(elapsed, 3),
                              snapshots=taken, reason="; ".join(reasons) or
                              f"only {run} of {criteria.consecutive} consecutive idle snapshots",
                              criteria=criteria)
