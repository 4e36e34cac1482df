"""Component evidence: what one fused or removed operation saves, read from profiler traces.

A plan declares a component (`[[components]]`): the kernel-name patterns that make it up,
how a decode cycle is delimited in the trace, one trace per device or rank for each arm,
and the component check the user ran (a JSON file whose `exact` says whether the fused
form gives the same outputs). From these, per component:

- launches per cycle, control and candidate, and how many were removed;
- the component's kernel time per cycle on each device, and the saving as a range over
  devices (a saving is only claimed where every device shows one);
- the check's exact flag, and a gate that passes only when the check says exact on every
  device and the patterns actually found the component's kernels in the control.

Traces are PyTorch profiler (Kineto) Chrome-trace JSON. A cycle is a range annotation
(`torch.profiler.record_function`). Kineto writes each one twice: on the CPU thread
(`user_annotation`) and projected onto the GPU stream (`gpu_user_annotation`). The GPU
projection is used when present, since kernels run asynchronously after their launch; a
trace without it is read through the launch calls' correlation ids instead.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ComponentArm = Literal["control", "candidate"]
ARMS: Final[tuple[ComponentArm, ...]] = ("control", "candidate")
_LAUNCH_CATS: Final = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})


class ComponentSpec(BaseModel):
    """A `[[components]]` entry of a plan. Paths are relative to the plan file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    # A regular expression matched in full against range annotation names.
    cycle: str = "decode_cycle"
    # Regular expressions searched in kernel names: a kernel matching any is the component's.
    kernels: tuple[str, ...] = Field(min_length=1)
    control_traces: tuple[str, ...] = Field(min_length=1)  # one per device or rank
    candidate_traces: tuple[str, ...] = Field(min_length=1)
    check: str  # JSON with a boolean "exact" (and optionally "devices": [{"exact": ...}])
    description: str = ""

    @field_validator("cycle")
    @classmethod
    def _cycle_regex(cls, value: str) -> str:
        _compile(value)
        return value

    @field_validator("kernels")
    @classmethod
    def _kernel_regexes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            _compile(pattern)
        return value

    @model_validator(mode="after")
    def _one_trace_per_device_each(self) -> ComponentSpec:
        if len(self.control_traces) != len(self.candidate_traces):
            raise ValueError(
                f"give one trace per device or rank for each arm, in the same order: "
                f"{len(self.control_traces)} control, {len(self.candidate_traces)} candidate")
        return self

    def traces(self, arm: ComponentArm) -> tuple[str, ...]:
        return self.control_traces if arm == "control" else self.candidate_traces


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc


class Cycle(BaseModel):
    """One decode cycle of one trace: the component's launches and kernel time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    launches: int
    kernel_us: float
    all_launches: int  # every kernel of the cycle, the component's and the rest


class TraceReading(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cycles: tuple[Cycle, ...]
    delimited_by: Literal["gpu_user_annotation", "correlation"]
    devices: tuple[int, ...]

    @property
    def launches_per_cycle(self) -> float | None:
        return _median([c.launches for c in self.cycles])

    @property
    def kernel_ms_per_cycle(self) -> float | None:
        m = _median([c.kernel_us for c in self.cycles])
        return None if m is None else m / 1000.0


class TraceError(ValueError):
    """A trace that cannot give component evidence (the message says why)."""


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _spans(events: Sequence[Mapping[str, Any]], cat: str, cycle: re.Pattern[str]
           ) -> list[Mapping[str, Any]]:
    return sorted((e for e in events if e.get("cat") == cat and e.get("ph") == "X"
                   and cycle.fullmatch(str(e.get("name", "")))), key=lambda e: float(e["ts"]))


def _inside(e: Mapping[str, Any], span: Mapping[str, Any]) -> bool:
    start = float(span["ts"])
    return start <= float(e["ts"]) < start + float(span.get("dur", 0.0))


def read_trace(trace: Mapping[str, Any], spec: ComponentSpec) -> TraceReading:
    """Per decode cycle, the component's kernels in one Kineto trace."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError("not a Chrome trace: no traceEvents list")
    cycle = re.compile(spec.cycle)
    patterns = [re.compile(p) for p in spec.kernels]
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    if not kernels:
        raise TraceError("the trace holds no GPU kernels (was CUDA activity profiled?)")

    def mine(k: Mapping[str, Any]) -> bool:
        return any(p.search(str(k.get("name", ""))) for p in patterns)

    groups: list[list[Mapping[str, Any]]] = []
    gpu = _spans(events, "gpu_user_annotation", cycle)
    if gpu:
        how: Literal["gpu_user_annotation", "correlation"] = "gpu_user_annotation"
        for span in gpu:
            groups.append([k for k in kernels if k.get("pid") == span.get("pid")
                           and _inside(k, span)])
    else:
        cpu = _spans(events, "user_annotation", cycle)
        if not cpu:
            raise TraceError(f"no range annotation matches the cycle pattern {spec.cycle!r}")
        how = "correlation"
        by_corr = {(k.get("args") or {}).get("correlation"): k for k in kernels}
        launches = [e for e in events if e.get("cat") in _LAUNCH_CATS]
        for span in cpu:
            corr = {(e.get("args") or {}).get("correlation") for e in launches
                    if e.get("pid") == span.get("pid") and _inside(e, span)}
            groups.append([by_corr[c] for c in corr if c in by_corr])
    cycles = tuple(Cycle(launches=sum(1 for k in g if mine(k)),
                         kernel_us=sum(float(k.get("dur", 0.0)) for k in g if mine(k)),
                         all_launches=len(g)) for g in groups)
    devices = sorted({int(d) for k in kernels
                      if isinstance(d := (k.get("args") or {}).get("device"), int)})
    return TraceReading(cycles=cycles, delimited_by=how, devices=tuple(devices))


def read_check(check: Mapping[str, Any]) -> tuple[bool, bool | None]:
    """(exact, exact on every device) from the user's component check. Per-device results
    ("devices": [{"exact": ...}]) are optional; without them the one flag stands for all."""
    exact = check.get("exact")
    if not isinstance(exact, bool):
        raise TraceError('the component check must hold a boolean "exact"')
    devices = check.get("devices")
    if devices is None:
        return exact, None
    if not isinstance(devices, list) or not all(isinstance(d, dict)
                                                and isinstance(d.get("exact"), bool)
                                                for d in devices):
        raise TraceError('"devices" must be a list of objects, each with a boolean "exact"')
    return exact, bool(devices) and all(d["exact"] for d in devices)


def _whole(x: float | None) -> float | int | None:
    return int(x) if x is not None and float(x).is_integer() else x


def component_evidence(spec: ComponentSpec,
                       readings: Mapping[ComponentArm, Sequence[TraceReading]],
                       check: Mapping[str, Any], trace_sha256: Mapping[str, str],
                       check_sha256: str) -> dict[str, Any]:
    """The record's summary of one component (the ABBA seed's component_evidence form)."""
    exact, exact_devices = read_check(check)
    per_arm = {arm: [r.launches_per_cycle for r in readings[arm]] for arm in ARMS}
    launches = {arm: _whole(_median([v for v in vals if v is not None]))
                for arm, vals in per_arm.items()}
    removed = (launches["control"] - launches["candidate"]
               if launches["control"] is not None and launches["candidate"] is not None
               else None)
    ms = {arm: [r.kernel_ms_per_cycle for r in readings[arm]] for arm in ARMS}
    savings = [a - b for a, b in zip(ms["control"], ms["candidate"], strict=True)
               if a is not None and b is not None]
    reasons = []
    if not exact:
        reasons.append("the component check does not say exact")
    if exact_devices is False:
        reasons.append("the component check is not exact on every device")
    for arm in ARMS:
        for i, r in enumerate(readings[arm]):
            if not r.cycles:
                reasons.append(f"{arm} trace {i + 1}: no decode cycle found")
    if not any(c.launches for r in readings["control"] for c in r.cycles):
        reasons.append("the kernel patterns match no kernel in the control traces")
    isolated = check.get("isolated_ms_per_cycle")
    isolated_saving = (float(isolated["control"]) - float(isolated["candidate"])
                       if isinstance(isolated, dict)
                       and {"control", "candidate"} <= isolated.keys() else None)
    return {
        "name": spec.name,
        "description": spec.description,
        "cycle_annotation": spec.cycle,
        "kernel_patterns": list(spec.kernels),
        "devices_or_ranks": len(spec.control_traces),
        "cycles": {arm: [len(r.cycles) for r in readings[arm]] for arm in ARMS},
        "delimited_by": sorted({r.delimited_by for rs in readings.values() for r in rs}),
        "launches_per_cycle": {**launches, "removed": removed},
        "kernel_ms_per_cycle": ms,
        "saving_ms_per_cycle_range": [min(savings), max(savings)] if savings else None,
        "isolated_saving_ms_per_cycle": isolated_saving,
        "exact": exact,
        "exact_all_devices": exact if exact_devices is None else exact_devices,
        "what_exact_means": check.get("what_exact_means"),
        "gate_passed": not reasons,
        "gate_reasons": reasons,
        "trace_sha256": dict(trace_sha256),
        "check_sha256": check_sha256,
    }
