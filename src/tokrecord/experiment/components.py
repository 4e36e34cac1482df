"""Component evidence on disk: the plan's traces and checks, copied into the experiment.

At preregistration every declared trace and check is read, checked (it parses, its cycles
are found, the patterns find the component in the control) and copied byte for byte
under `components/NAME/`, so that a typo fails before the first leg and the evidence is
sealed with the experiment. The record is computed from those copies, never from the
user's originals, so `tokrecord verify` recomputes it from the sealed directory alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tokrecord.errors import ConfigError
from tokrecord.evidence import layout, read_json
from tokrecord.identity import sha256_file
from tokrecord.metrics.components import (
    ARMS,
    ComponentArm,
    ComponentSpec,
    TraceError,
    TraceReading,
    component_evidence,
    read_check,
    read_trace,
)


def trace_name(arm: ComponentArm, index: int) -> str:
    return f"{arm}-{index + 1}.trace.json"


def _load(path: Path, what: str) -> Any:
    try:
        return read_json(path, ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from exc


def _reading(path: Path, spec: ComponentSpec, arm: ComponentArm) -> TraceReading:
    trace = _load(path, f"component {spec.name!r}: {arm} trace")
    try:
        reading = read_trace(trace, spec)
    except TraceError as exc:
        raise ConfigError(f"component {spec.name!r}: {arm} trace {path}: {exc}") from exc
    if not reading.cycles:
        raise ConfigError(f"component {spec.name!r}: {arm} trace {path}: no decode cycle "
                          f"matches {spec.cycle!r}")
    return reading


def check_components(specs: tuple[ComponentSpec, ...]) -> None:
    """ConfigError naming the file and the problem, before anything is written: each trace
    parses and has cycles, the patterns find the component in the control, the check has
    its exact flag."""
    for spec in specs:
        readings = {arm: [_reading(Path(p), spec, arm) for p in spec.traces(arm)]
                    for arm in ARMS}
        if not any(c.launches for r in readings["control"] for c in r.cycles):
            raise ConfigError(f"component {spec.name!r}: no kernel in the control traces "
                              f"matches {list(spec.kernels)}")
        try:
            read_check(_load(Path(spec.check), f"component {spec.name!r}: check"))
        except TraceError as exc:
            raise ConfigError(f"component {spec.name!r}: check {spec.check}: {exc}") from exc


def copy_components(specs: tuple[ComponentSpec, ...], exp_dir: Path) -> list[str]:
    """Copy each (checked) component's files into the experiment; the copies' paths."""
    copied = []
    for spec in specs:
        dest = exp_dir / layout.COMPONENTS_DIR / spec.name
        dest.mkdir(parents=True, exist_ok=True)
        for arm in ARMS:
            for i, src in enumerate(spec.traces(arm)):
                shutil.copyfile(src, dest / trace_name(arm, i))
                copied.append(str((dest / trace_name(arm, i)).relative_to(exp_dir)))
        shutil.copyfile(spec.check, dest / layout.COMPONENT_CHECK)
        copied.append(str((dest / layout.COMPONENT_CHECK).relative_to(exp_dir)))
    return copied


def sealed_component_evidence(specs: tuple[ComponentSpec, ...], exp_dir: Path
                              ) -> list[dict[str, Any]]:
    """The record's component_evidence, from the copies under components/ (a component
    whose copies are missing is reported with its gate failed, not skipped)."""
    out = []
    for spec in specs:
        base = exp_dir / layout.COMPONENTS_DIR / spec.name
        check_path = base / layout.COMPONENT_CHECK
        if not check_path.exists():
            out.append({"name": spec.name, "gate_passed": False,
                        "gate_reasons": [f"{check_path.relative_to(exp_dir)} is missing"]})
            continue
        readings = {arm: [read_trace(_load(base / trace_name(arm, i), "trace"), spec)
                          for i in range(len(spec.traces(arm)))] for arm in ARMS}
        hashes = {f"{layout.COMPONENTS_DIR}/{spec.name}/{trace_name(arm, i)}":
                  sha256_file(base / trace_name(arm, i))
                  for arm in ARMS for i in range(len(spec.traces(arm)))}
        out.append(component_evidence(spec, readings, _load(check_path, "check"), hashes,
                                      sha256_file(check_path)))
    return out
