"""Telemetry during a leg: a sampler in its own process, and the per-leg figures.

The sampler is a child process, not a thread: a thread in the client would take
the GIL while the token loop is stamping arrivals. It stamps samples with
`perf_counter_ns` (CLOCK_MONOTONIC, shared by every process of the machine)
relative to the leg's epoch, so samples and token events share one time axis. It
stops when its stdin closes, so it never outlives the client.

Energy over the suite window [first request sent, last byte received]: from a
cumulative energy counter when every device has one (NVML, xpu-smi, RAPL), by
linear interpolation of the counter at the window's ends; otherwise by the
trapezoid rule over sampled power. Accelerators are the power source when
present; the host's RAPL package energy otherwise; none on a machine with
neither (then energy is null, and the notes say why).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.jsontypes import JSONObject

SCHEMA_TELEMETRY: Final = "tokrecord.telemetry/v1"


class TelemetryConfig(BaseModel):
    """A plan's `[telemetry]` section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    interval_s: float = Field(default=0.5, gt=0)


class DeviceEnergy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str  # backend:index
    name: str
    energy_j: float | None
    energy_method: str | None
    power_w_mean: float | None
    util_pct_mean: float | None
    mem_used_max_bytes: int | None
    temp_c_max: float | None


class TelemetrySummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: str = Field(default=SCHEMA_TELEMETRY, alias="schema")
    interval_s: float
    samples: int
    samples_in_window: int
    window_s: float | None
    output_tokens: int
    power_source: str | None  # accelerators | host-rapl | None
    power_w_mean: float | None
    energy_j: float | None
    energy_method: str | None  # counter | trapezoid | None
    joules_per_output_token: float | None
    # The headline rate per watt drawn: tok/s at the power it cost.
    tok_s_per_watt: float | None
    host_cpu_util_pct_mean: float | None
    devices: tuple[DeviceEnergy, ...] = ()
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- pure figures


def _interp(points: Sequence[tuple[int, float]], t: int) -> float | None:
    """Linear interpolation of a monotone series at t; None outside its span."""
    if not points or t < points[0][0] or t > points[-1][0]:
        return None
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def counter_energy(points: Sequence[tuple[int, float]], t0: int, t1: int) -> float | None:
    """Energy (J) between t0 and t1 from a cumulative counter sampled at points."""
    a, b = _interp(points, t0), _interp(points, t1)
    return None if a is None or b is None else b - a


def trapezoid_energy(points: Sequence[tuple[int, float]], t0: int, t1: int) -> float | None:
    """Energy (J) between t0 and t1 from power samples (ns, W), clipped to the window.
    None when the samples do not cover the window."""
    if len(points) < 2 or points[0][0] > t0 or points[-1][0] < t1:
        return None
    total = 0.0
    for (ta, pa), (tb, pb) in itertools.pairwise(points):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi <= lo:
            continue
        p_lo = pa + (pb - pa) * (lo - ta) / (tb - ta)
        p_hi = pa + (pb - pa) * (hi - ta) / (tb - ta)
        total += (p_lo + p_hi) / 2 * (hi - lo) / 1e9
    return total


def _series(samples: Iterable[Mapping[str, Any]], pick: Any) -> list[tuple[int, float]]:
    out = []
    for s in samples:
        v = pick(s)
        if v is not None:
            out.append((int(s["t_ns"]), float(v)))
    return out


def _energy(energy_pts: list[tuple[int, float]], power_pts: list[tuple[int, float]],
            t0: int, t1: int) -> tuple[float | None, str | None]:
    e = counter_energy(energy_pts, t0, t1)
    if e is not None and e >= 0:
        return e, "counter"
    e = trapezoid_energy(power_pts, t0, t1)
    return (e, "trapezoid") if e is not None else (None, None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _device_energy(samples: Sequence[Mapping[str, Any]], in_win: Sequence[Mapping[str, Any]],
                   key: str, name: str, window_ns: tuple[int, int] | None) -> DeviceEnergy:
    def field(field_name: str) -> Any:
        def pick(s: Mapping[str, Any]) -> Any:
            for d in s.get("devices", []):
                if f"{d['backend']}:{d['index']}" == key:
                    return d.get(field_name)
            return None
        return pick

    energy, method = (None, None)
    if window_ns:
        energy, method = _energy(_series(samples, field("energy_j")),
                                 _series(samples, field("power_w")), *window_ns)
    mems = [v for _, v in _series(in_win, field("mem_used_bytes"))]
    temps = [v for _, v in _series(in_win, field("temp_c"))]
    return DeviceEnergy(
        key=key, name=name, energy_j=energy, energy_method=method,
        power_w_mean=_mean([v for _, v in _series(in_win, field("power_w"))]),
        util_pct_mean=_mean([v for _, v in _series(in_win, field("util_pct"))]),
        mem_used_max_bytes=int(max(mems)) if mems else None,
        temp_c_max=max(temps) if temps else None,
    )


def summarize_telemetry(
    samples: Sequence[Mapping[str, Any]],
    *,
    interval_s: float,
    window_ns: tuple[int, int] | None,
    output_tokens: int,
    headline_tok_s: float | None,
) -> TelemetrySummary:
    """Per-leg power and energy over the suite window, from the sampler's lines."""
    notes: list[str] = []
    keys: dict[str, str] = {}
    for s in samples:
        for d in s.get("devices", []):
            keys.setdefault(f"{d['backend']}:{d['index']}", d["name"])
    in_win = [s for s in samples if window_ns and window_ns[0] <= s["t_ns"] <= window_ns[1]]
    devices = [_device_energy(samples, in_win, key, name, window_ns)
               for key, name in keys.items()]
    window_s = (window_ns[1] - window_ns[0]) / 1e9 if window_ns else None
    source: str | None = None
    energy_j: float | None = None
    method: str | None = None
    if devices:
        if all(d.energy_j is not None for d in devices):
            source = "accelerators"
            energy_j = sum(d.energy_j for d in devices if d.energy_j is not None)
            methods = {d.energy_method for d in devices}
            method = methods.pop() if len(methods) == 1 else "mixed"
        else:
            notes.append("an accelerator reported no power or energy over the suite window")
    else:
        notes.append("no accelerator found")
    if source is None and window_ns:
        e, m = _energy(_series(samples, lambda s: s["host"].get("energy_j")),
                       _series(samples, lambda s: s["host"].get("power_w")), *window_ns)
        if e is not None:
            source, energy_j, method = "host-rapl", e, m
        else:
            notes.append("no host power source (RAPL not readable)")
    if window_ns is None:
        notes.append("no suite window: no row was streamed")
    elif len(samples) and not in_win:
        notes.append("no sample fell inside the suite window (interval longer than the suite)")
    power = energy_j / window_s if energy_j is not None and window_s else None
    return TelemetrySummary(
        interval_s=interval_s, samples=len(samples), samples_in_window=len(in_win),
        window_s=window_s, output_tokens=output_tokens, power_source=source,
        power_w_mean=power, energy_j=energy_j, energy_method=method,
        joules_per_output_token=energy_j / output_tokens
        if energy_j is not None and output_tokens else None,
        tok_s_per_watt=headline_tok_s / power if headline_tok_s and power else None,
        host_cpu_util_pct_mean=_mean([float(s["host"]["cpu_util_pct"]) for s in in_win]),
        devices=tuple(devices), notes=tuple(notes),
    )


# --------------------------------------------------------------------------- the sampler


FIRST_SAMPLE_TIMEOUT_S: Final = 30.0


class TelemetrySampler:
    """The sampler process of one leg."""

    def __init__(self, out: Path, interval_s: float, epoch_ns: int) -> None:
        self.out = out
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tokrecord.probes.sampler", "--out", str(out),
             "--interval", str(interval_s), "--epoch-ns", str(epoch_ns)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def wait_first(self, timeout_s: float = FIRST_SAMPLE_TIMEOUT_S) -> bool:
        """Until the first sample is written (or the sampler died, or the timeout): a
        server started before it would have a window with no sample at its start. Its
        start-up (a Python process, NVML) takes 0.1-0.5 s, more on a busy machine."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                if self.out.stat().st_size > 0:
                    return True
            time.sleep(0.01)
        return False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self, timeout: float = 10.0) -> str | None:
        """Close its stdin and wait; the problem, if it had one."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            return "telemetry sampler did not stop; killed"
        err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
        if self._proc.returncode != 0:
            return f"telemetry sampler exited {self._proc.returncode}: {err.strip()[-300:]}"
        return None


def read_samples(path: Path) -> tuple[list[JSONObject], JSONObject | None]:
    """The samples of a telemetry.jsonl and its sampler's header (backends, notes).

    A last line cut short by a hard kill is dropped: every earlier line was
    flushed whole."""
    if not path.exists():
        return [], None
    header_path = path.with_name(path.stem + ".probes.json")
    header = json.loads(header_path.read_text()) if header_path.exists() else None
    samples = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return samples, header

