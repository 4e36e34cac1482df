"""Reading a record directory into a ReportData: the report's only I/O.

Accepted: a sealed experiment directory (record.json with its legs' attempt
directories), or a single leg directory (summary.json, no record). The record is
loaded as its model by its schema id (record.schema.load_record), each leg summary
as a LegResult and identity.json as an Identity. Nothing is
ever written here, and nothing in the directory is trusted to be current: the
verification status comes from running `tokrecord verify`'s own checks.

Per-token timings come from each leg's rows.json: the chunk arrivals the client
parsed from the raw events (events.jsonl) as they arrived, which `verify`
re-derives from those raw events. Reading them is ten times cheaper than
re-parsing every event, and the report shows the same numbers the record used.

What is read is turned into the report's view models by derive.py, which reads
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from tokrecord.errors import ConfigError
from tokrecord.evidence import layout, safe
from tokrecord.evidence.seal import ADDENDUM_FILE_NAME, MANIFEST_NAME, SIGNATURE_NAME, addenda_dir
from tokrecord.experiment.leg import LegResult, RowRecord
from tokrecord.experiment.noise import NoiseDiagnostic, legs_in_order, noise_diagnostic
from tokrecord.identity import Identity
from tokrecord.probes.covariates import covariates_from_run_dir
from tokrecord.record.schema import AnyRecord, validate_record
from tokrecord.record.verify import Verified, verify_trusted

from .derive import (
    NOT_VERIFIED,
    addenda,
    choose_timeline,
    experiment_legs,
    experiment_report,
    identity_experiment,
    identity_leg,
    leg_report,
    leg_view,
    seal_facts,
    submissions,
    verification_view,
)
from .model import Addendum, Fact, LegView, ReportData, Verification


class ReportObserver(Protocol):
    """Progress while a report is built (verification can take a while)."""

    def report_step(self, message: str) -> None: ...
    def report_leg(self, name: str, index: int, total: int) -> None: ...


class NullReportObserver:
    def report_step(self, message: str) -> None: ...
    def report_leg(self, name: str, index: int, total: int) -> None: ...


# --------------------------------------------------------------------------- files


# The directory may be a stranger's: every file is read through evidence.safe (no links,
# regular files only, capped, bounded JSON).


def _read_json(path: Path) -> Any:
    try:
        return safe.read_json(path)
    except safe.UnsafeEvidence as exc:
        raise ConfigError(str(exc)) from exc


def _maybe_json(path: Path) -> Any:
    """The JSON in path, or None when it is absent or unreadable (a report degrades)."""
    try:
        return safe.read_json(path)
    except safe.UnsafeEvidence:
        return None


def _maybe_identity(path: Path) -> Identity | None:
    """identity.json as its model; None when it is absent, unreadable or not an identity."""
    doc = _maybe_json(path)
    try:
        return None if doc is None else Identity.model_validate(doc)
    except ValidationError:
        return None


def _maybe_text(path: Path) -> str | None:
    try:
        return safe.read_text(path)
    except safe.UnsafeEvidence:
        return None


def _rel(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix() or "."
    except ValueError:
        return path.name


def _read_telemetry(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        text = safe.read_text(path, safe.JSONL_CAP, strict=False)
    except safe.UnsafeEvidence:
        return []
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = safe.parse_json(line.encode("utf-8", "replace"), str(path))
        except safe.UnsafeEvidence:
            break  # a last line cut short by a hard kill
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _load_record(path: Path) -> AnyRecord:
    obj = _read_json(path)
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: not a record")
    return validate_record(obj, source=str(path), older_form_ok=True)


# --------------------------------------------------------------------------- one leg


def load_leg(run_dir: Path, base: Path, *, name: str | None = None,
             idle_gap_before_s: float | None = None) -> tuple[LegView, list[RowRecord]]:
    """One leg's view and its rows (kept for the timeline choice)."""
    try:
        result = LegResult.model_validate(_read_json(run_dir / layout.SUMMARY))
    except ValueError as exc:
        raise ConfigError(f"{run_dir / layout.SUMMARY}: not a leg summary: {exc}") from exc
    warnings: list[str] = []
    rows: list[RowRecord] = []
    if (run_dir / layout.ROWS).exists():
        try:
            raw_rows = safe.read_json_object(run_dir / layout.ROWS)
            rows = [RowRecord.model_validate(r) for r in raw_rows["rows"]]
        except safe.UnsafeEvidence as exc:
            warnings.append(f"rows.json could not be read ({exc.reason}); no per-row figures")
        except (KeyError, TypeError, ValueError):
            warnings.append("rows.json is not a list of rows; no per-row figures")
    else:
        warnings.append("no rows.json: no per-row figures")
    view = leg_view(
        result, rows, name=name, run_dir=_rel(run_dir, base), load_warnings=warnings,
        telemetry_lines=_read_telemetry(run_dir / layout.TELEMETRY),
        metrics_before=_maybe_text(run_dir / layout.METRICS_BEFORE),
        metrics_after=_maybe_text(run_dir / layout.METRICS_AFTER),
        idle_gap_before_s=idle_gap_before_s,
    )
    return view, rows


# --------------------------------------------------------------------------- experiments


def _leg_dir(exp_dir: Path, name: str, run_dir: str | None) -> Path:
    """The attempt the record was computed from: the `<leg>/attempt-N` its run_dir names
    (the directory may have moved since), else the leg's complete attempt."""
    if run_dir:
        with contextlib.suppress(ValueError):
            named = layout.locate_run_dir(exp_dir, run_dir, name)
            if (named / layout.SUMMARY).exists():
                return named
    found = layout.complete_attempt(exp_dir / name)
    if found is None:
        raise ConfigError(f"{exp_dir}: no complete attempt of leg {name} (looked for {run_dir})")
    return found


# --------------------------------------------------------------------------- identity


def _seal_facts(directory: Path) -> list[Fact]:
    return seal_facts(_maybe_text(directory / MANIFEST_NAME), _maybe_json(directory / SIGNATURE_NAME))


def _identity_experiment(directory: Path, record: AnyRecord) -> tuple[Fact, ...]:
    return identity_experiment(_maybe_identity(directory / layout.IDENTITY), record,
                               _seal_facts(directory))


def _identity_leg(directory: Path) -> tuple[Fact, ...]:
    return identity_leg(_maybe_json(directory / layout.CONFIG) or {}, _seal_facts(directory))


def _addenda_checked(directory: Path) -> list[tuple[str, Any, Verified]]:
    """Each addendum with what `verify` finds in it: its seal, and its parent's hash."""
    root = addenda_dir(directory)
    if root.is_symlink() or not root.is_dir():
        return []
    return [(sub.name, _maybe_json(sub / ADDENDUM_FILE_NAME), verify_trusted(sub))
            for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())]


def _addenda_docs(directory: Path) -> list[tuple[str, Any]]:
    """The addenda that verify: only these are facts (a submission's status, say)."""
    return [(name, doc) for name, doc, checked in _addenda_checked(directory) if checked.ok]


def _addenda(directory: Path) -> tuple[Addendum, ...]:
    """Verified addenda as they are; one that fails is shown as unverified, its content
    not at all (anyone can write an addendum.json saying APPROVED)."""
    out: list[Addendum] = []
    for name, doc, checked in _addenda_checked(directory):
        if checked.ok:
            shown = addenda([(name, doc)])
            if not checked.signer.pinned:
                shown = tuple(a.model_copy(update={"kind": f"{a.kind} "
                                                   f"({checked.signer.describe()})"})
                              for a in shown)
            out.extend(shown)
        else:
            first = checked.problems[0]
            out.append(Addendum(name=name, kind="NOT verified", created_utc="",
                                text=f"content not shown: {first.file}: {first.field}: "
                                f"{first.message}"[:300]))
    return tuple(out)


# --------------------------------------------------------------------------- verification


def verification(directory: Path) -> Verification:
    checked = verify_trusted(directory)
    return verification_view(checked.problems).model_copy(
        update={"signer": checked.signer.describe()})


# --------------------------------------------------------------------------- the report


def load_report(
    directory: Path,
    *,
    leg: str | None = None,
    row: str | None = None,
    verify: bool = True,
    observer: ReportObserver | None = None,
) -> ReportData:
    """Everything the report shows, from a sealed experiment or leg directory."""
    obs: ReportObserver = observer or NullReportObserver()
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory")
    if (directory / layout.RECORD).exists():
        build: Callable[..., ReportData] = _experiment_report
    elif (directory / layout.SUMMARY).exists():
        build = _leg_report
    elif (directory / layout.PLAN).exists():
        raise ConfigError(f"{directory}: the experiment has no record.json yet (not complete); "
                          "report one of its legs, e.g. tokrecord report DIR/A1/attempt-1")
    else:
        raise ConfigError(f"{directory}: neither an experiment (record.json) nor a leg (summary.json)")
    # Verified first, as `tokrecord verify` would, with the same key pinning.
    if verify:
        obs.report_step("verifying: re-hashing every file and recomputing from the raw events")
        checked = verification(directory)
    else:
        checked = NOT_VERIFIED
    data = build(directory, leg=leg, row=row, observer=obs)
    return data.model_copy(update={"verification": checked,
                                   "submissions": submissions(_addenda_docs(directory))})


def _experiment_report(directory: Path, *, leg: str | None, row: str | None,
                       observer: ReportObserver) -> ReportData:
    record = _load_record(directory / layout.RECORD)
    plan = experiment_legs(record)
    views: dict[str, LegView] = {}
    rows: dict[str, list[RowRecord]] = {}
    for i, (name, run_dir, gap) in enumerate(plan, start=1):
        observer.report_leg(name, i, len(plan))
        view, leg_rows = load_leg(_leg_dir(directory, name, run_dir), directory,
                                  name=name, idle_gap_before_s=gap)
        views[name], rows[name] = view, leg_rows
    legs = tuple(views.values())
    observer.report_step("per-token timeline, intervals and charts")
    timelines, choice = choose_timeline(legs, rows, leg, row)
    report = experiment_report(
        record, legs, title=directory.name, timelines=timelines, timeline_choice=choice,
        identity=_identity_experiment(directory, record), addenda=_addenda(directory),
    )
    observer.report_step("noise diagnostic")
    return report.model_copy(update={"noise": _noise(directory, record, plan, legs)})


def _noise(directory: Path, record: AnyRecord, plan: list[tuple[str, str | None, float | None]],
           legs: tuple[LegView, ...]) -> NoiseDiagnostic | None:
    """The record's noise diagnostic; recomputed from the legs' kept telemetry for a
    record sealed before it had one."""
    if not record.design_spec().several_legs:
        return None
    recorded = record.noise_diagnostic
    if recorded is not None:
        return recorded
    covs = {name: covariates_from_run_dir(_leg_dir(directory, name, run_dir))
            for name, run_dir, _ in plan}
    order = [leg.name for leg in legs]
    return noise_diagnostic(legs_in_order(order, {leg.name: leg.arm for leg in legs},
                                          {leg.name: leg.tok_s for leg in legs}, covs))


def _leg_report(directory: Path, *, leg: str | None, row: str | None,
                observer: ReportObserver) -> ReportData:
    observer.report_leg(directory.name, 1, 1)
    view, rows = load_leg(directory, directory)
    observer.report_step("per-token timeline, intervals and charts")
    timelines, choice = choose_timeline((view,), {view.name: rows}, leg, row)
    return leg_report(view, timelines=timelines, timeline_choice=choice,
                      identity=_identity_leg(directory), addenda=_addenda(directory))
