"""`tokrecord verify DIR`: trust nothing that was written, recompute everything.

1. The seal: every file re-hashed against manifest.sha256, the manifest against the
   signed in-toto statement, the Ed25519 signature over it.
2. Every leg: the raw events re-parsed exactly as the live client parsed them, then
   every row figure, leg aggregate, engine counter delta and gate recomputed and
   compared with rows.json, summary.json and gates.json.
3. An experiment: its record recomputed from the legs and compared with record.json.
Each difference names the file and the field.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokrecord.client.stream import replay_row
from tokrecord.errors import TokrecordError
from tokrecord.evidence import TornLineError, layout, safe, scan_jsonl
from tokrecord.evidence.seal import (
    ADDENDA_SUFFIX,
    ADDENDUM_FILE_NAME,
    MANIFEST_NAME,
    Problem,
    default_config_dir,
    local_fingerprint,
    signer_fingerprint,
    verify_seal,
)
from tokrecord.evidence.trust import TRUST_FILE_NAME, Signer, load_trusted, pin
from tokrecord.experiment.interim import blocks_needed, leg_figures
from tokrecord.experiment.leg import (
    LegConfig,
    LegDerived,
    LegInputs,
    LegResult,
    RowRecord,
    derive_leg,
    earlier_attempts,
    gates_rule,
    idle_snapshots,
    load_rows,
)
from tokrecord.experiment.plan import Plan
from tokrecord.experiment.stats import LegFigures
from tokrecord.experiment.sweep import SWEEP_METHOD_TWO_SIDED
from tokrecord.experiment.sweep_sequential import leg_exact, plan_blocks_needed
from tokrecord.gates import gates_version
from tokrecord.gates.teacher import load_teacher
from tokrecord.identity import sha256_file
from tokrecord.metrics import parse_counters, row_metrics
from tokrecord.probes.idle import IdleResult
from tokrecord.probes.telemetry import TelemetrySummary, read_samples
from tokrecord.record.build import build_record
from tokrecord.record.migrate import (
    dotted,
    leg_has_probes,
    load_current,
    load_current_rows,
    summary_has_covariates,
    summary_has_log_facts,
)
from tokrecord.server.process import CleanupReport
from tokrecord.suite import Suite, parse_suite

# Fields that say where or when, not what was measured: a copied directory keeps its
# meaning, so these are not compared.
_VOLATILE = frozenset({"run_dir", "root", "date", "seal", "portable_sealed_evidence", "verify"})


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def diff(found: Any, expected: Any, field: str = "",
         not_recorded: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(field, message) for every leaf where the recorded and recomputed values differ.
    `not_recorded`: the fields record.migrate filled with None because the stored form
    lacks them (evidence sealed before the key existed): not differences."""
    out: list[tuple[str, str]] = []
    if found == expected:  # the common case, at C speed: a leaf below can then differ in none
        return out
    if isinstance(found, Mapping) and isinstance(expected, Mapping):
        for key in sorted(set(found) | set(expected)):
            if key in _VOLATILE:
                continue
            sub = f"{field}.{key}" if field else str(key)
            if sub in not_recorded:
                continue
            if key not in found:
                out.append((sub, "missing from the file"))
            elif key not in expected:
                out.append((sub, "not produced by recomputation"))
            else:
                out.extend(diff(found[key], expected[key], sub, not_recorded))
        return out
    if isinstance(found, list) and isinstance(expected, list):
        if len(found) != len(expected):
            return [(field, f"recorded {len(found)} items, recomputed {len(expected)}")]
        for i, (a, b) in enumerate(zip(found, expected, strict=True)):
            out.extend(diff(a, b, f"{field}[{i}]", not_recorded))
        return out
    # Values came from evidence: shown only as bounded, escaped excerpts.
    if isinstance(found, float) and isinstance(expected, float):
        if not math.isclose(found, expected, rel_tol=1e-12, abs_tol=0.0):
            out.append((field, f"recorded {safe.excerpt(found)}, "
                               f"recomputed {safe.excerpt(expected)}"))
        return out
    if found != expected:
        out.append((field, f"recorded {safe.excerpt(found)}, recomputed {safe.excerpt(expected)}"))
    return out


def _load_json(path: Path, base: Path, problems: list[Problem]) -> Any:
    try:
        return safe.read_json(path)
    except safe.UnsafeEvidence as exc:
        problems.append(Problem(file=_rel(path, base), field="(file)",
                                message=f"cannot read as JSON: {exc.reason}"))
        return None


IDLE_SNAPSHOTS_CAP = 16 * 1024 * 1024
# Caps for the files verify_leg hands to parsers that open them by name.
_LEG_CAPS = {layout.EVENTS: safe.JSONL_CAP, layout.SUITE: safe.JSONL_CAP,
             layout.TELEMETRY: safe.JSONL_CAP, layout.SERVER_LOG: safe.TEXT_CAP,
             layout.METRICS_BEFORE: safe.TEXT_CAP, layout.METRICS_AFTER: safe.TEXT_CAP,
             layout.LEG_TEACHER: safe.JSON_CAP,
             # The sampler's header, read by probes.telemetry.read_samples (found by
             # bench/hostile: a 1 GB one took 2.2 GB of memory).
             layout.TELEMETRY_PROBES: safe.JSON_CAP,
             # The idle gate's snapshots, read for the leg's covariates (bench/hostile: a
             # re-sealed 1 GB sparse one took 1.4 GB). One line a poll: even a 600 s gate
             # polled every 20 ms writes under 16 MiB.
             layout.IDLE_BEFORE: IDLE_SNAPSHOTS_CAP, layout.IDLE_AFTER: IDLE_SNAPSHOTS_CAP}


def _check_leg_files(run_dir: Path) -> None:
    for name, cap in _LEG_CAPS.items():
        if os.path.lexists(run_dir / name):
            safe.check_regular(run_dir / name, cap)


def _leg_config(run_dir: Path, base: Path, problems: list[Problem]
                ) -> tuple[LegConfig | None, bool]:
    """The leg's configuration, and whether it was written with the probes, idle gates
    and telemetry (record.migrate.leg_has_probes)."""
    raw = _load_json(run_dir / layout.CONFIG, base, problems)
    if raw is None:
        return None, True
    probes = leg_has_probes(raw)
    try:
        rows = parse_suite((run_dir / layout.SUITE).read_bytes(), layout.SUITE).rows
        suite = Suite(name=raw["suite"]["name"], sha256=raw["suite"]["sha256"], rows=rows)
        return LegConfig.model_validate({**raw["leg"], "suite": suite}), probes
    except (OSError, KeyError, TokrecordError, ValueError) as exc:
        problems.append(Problem(file=_rel(run_dir / layout.CONFIG, base), field="(file)",
                                message=f"cannot rebuild the leg configuration: {exc}"))
        return None, probes


def verify_leg(run_dir: Path, base: Path, torn_seen: dict[Path, list[int]] | None = None
               ) -> tuple[list[Problem], LegResult | None]:
    """Recompute one leg from its raw evidence; compare with what it recorded.
    `torn_seen` collects the torn lines of the raw events it read (an experiment's
    verify names the unexplained ones without parsing the file again).

    The evidence may be a stranger's, re-sealed with their key: whatever its content
    makes a parser raise is a problem naming the leg, never a traceback."""
    try:
        _check_leg_files(run_dir)
        return _verify_leg(run_dir, base, torn_seen)
    except safe.UnsafeEvidence as exc:
        return [Problem(file=_rel(Path(exc.file), base), field="(file)", message=exc.reason)], None
    except _MALFORMED as exc:
        return [Problem(file=_rel(run_dir, base), field="(leg)",
                        message=f"cannot be recomputed: malformed evidence "
                        f"({type(exc).__name__}: {safe.excerpt(str(exc))})")], None


# What a parser raises on well-formed JSON of the wrong shape, or on nesting past the stack.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
              UnicodeDecodeError, OSError, TokrecordError)


def _verify_leg(run_dir: Path, base: Path, torn_seen: dict[Path, list[int]] | None
                ) -> tuple[list[Problem], LegResult | None]:
    problems: list[Problem] = []
    config, probes = _leg_config(run_dir, base, problems)
    summary_raw = _load_json(run_dir / layout.SUMMARY, base, problems)
    rows_raw = _load_json(run_dir / layout.ROWS, base, problems)
    gates_raw = _load_json(run_dir / layout.GATES, base, problems)
    if config is None or summary_raw is None or rows_raw is None:
        return problems, None
    replayed = _replay_rows(run_dir, base, config, rows_raw, problems, torn_seen)
    if replayed is None:
        return problems, None
    records, events = replayed
    derived, idle = _derive_again(run_dir, base, config, records, events, probes, summary_raw,
                                  (gates_raw or rows_raw).get("schema"), problems)
    summary_file = _rel(run_dir / layout.SUMMARY, base)
    telemetry = _compare_summary(summary_raw, derived, idle, config, summary_file, problems)
    gates = derived.gates
    if gates_raw is not None:
        for field, message in diff(gates_raw.get("gates"),
                                   [g.model_dump(mode="json") for g in gates], "gates"):
            problems.append(Problem(file=_rel(run_dir / layout.GATES, base), field=field,
                                    message=message))
    try:
        result = LegResult.model_validate(summary_raw)
    except ValueError as exc:
        problems.append(Problem(file=summary_file, field="(file)", message=str(exc)))
        return problems, None
    expected_valid = all(not g.blocks_validity for g in gates) and result.status == "complete"
    if result.valid != expected_valid:
        problems.append(Problem(file=summary_file, field="valid",
                                message=f"recorded {result.valid}, gates imply {expected_valid}"))
    # The record is recomputed from these figures, not from the files' own claims.
    return problems, result.model_copy(update={
        "run_dir": str(run_dir), "summary": derived.summary, "engine": derived.engine,
        "gates": gates, "telemetry": telemetry, "valid": expected_valid,
        "covariates": derived.covariates})


def _replay_rows(run_dir: Path, base: Path, config: LegConfig, rows_raw: Any,
                 problems: list[Problem], torn_seen: dict[Path, list[int]] | None = None
                 ) -> tuple[list[RowRecord], Sequence[Mapping[str, Any]]] | None:
    """Each recorded row re-parsed from the raw events exactly as the live client parsed
    it, compared with rows.json; with the events. None when they cannot be replayed."""
    path = run_dir / layout.EVENTS
    try:
        events, torn = scan_jsonl(path)
        if torn_seen is not None:
            torn_seen[path] = torn
        if torn:
            raise TornLineError(path, torn[0])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TornLineError) as exc:
        problems.append(Problem(file=_rel(path, base), field="(file)",
                                message=f"cannot parse the raw events: {exc}"))
        return None
    by_row: dict[Any, list[Mapping[str, Any]]] = {}
    for event in events:
        # Grouped once, by equality as a lookup: a row number that is no key (a list in a
        # stranger's file) equals no row.
        with contextlib.suppress(TypeError):
            by_row.setdefault(event.get("row"), []).append(event)
    records: list[RowRecord] = []
    for stored in rows_raw.get("rows", []):
        i = int(stored["trace"]["row"])
        try:
            trace = replay_row(by_row.get(i, []), config.suite.rows[i],
                               config.endpoint, config.adapter)
            records.append(RowRecord(trace=trace,
                                     metrics=row_metrics(trace.t_send_ns, trace.chunks)))
        except (TokrecordError, KeyError, ValueError, IndexError) as exc:
            problems.append(Problem(file=_rel(run_dir / layout.EVENTS, base),
                                    field=f"row {i}", message=str(exc)))
            return None
    rows_file = _rel(run_dir / layout.ROWS, base)
    # An older rows form, read as the current one (record.migrate): a key it lacks is no
    # difference.
    current = load_current_rows(rows_raw)
    rows_doc = current.obj if current is not None else rows_raw
    not_recorded = frozenset(map(dotted, current.filled)) if current is not None else frozenset()
    for field, message in diff(rows_doc.get("rows"), [r.model_dump(mode="json") for r in records],
                               "rows", not_recorded):
        problems.append(Problem(file=rows_file, field=field, message=message))
    return records, events


def _idle_results(run_dir: Path, base: Path, problems: list[Problem]
                  ) -> dict[str, IdleResult | None]:
    idle_raw = _load_json(run_dir / layout.IDLE, base, problems) \
        if (run_dir / layout.IDLE).exists() else {}
    return {phase: IdleResult.model_validate(v) if v else None
            for phase, v in (idle_raw or {}).items()}


def _derive_again(run_dir: Path, base: Path, config: LegConfig, records: list[RowRecord],
                  events: Sequence[Mapping[str, Any]], probes: bool, summary_raw: Any,
                  schema: object, problems: list[Problem]
                  ) -> tuple[LegDerived, dict[str, IdleResult | None]]:
    """derive_leg over the sealed files: what the writer derived, derived again (and the
    idle gates' results it read)."""

    def counters(name: str) -> dict[str, float] | None:
        path = run_dir / name
        return parse_counters(path.read_text(encoding="utf-8")) if path.exists() else None

    cleanup_raw = _load_json(run_dir / layout.CLEANUP, base, problems) \
        if (run_dir / layout.CLEANUP).exists() else None
    cleanup = (CleanupReport.model_validate({k: v for k, v in cleanup_raw.items() if k != "passed"})
               if cleanup_raw else None)
    teacher_path = run_dir / layout.LEG_TEACHER
    log = run_dir / layout.SERVER_LOG
    idle = _idle_results(run_dir, base, problems)
    return derive_leg(LegInputs(
        records=records, config=config, metrics_before=counters(layout.METRICS_BEFORE),
        metrics_after=counters(layout.METRICS_AFTER), events=events,
        server_log=safe.read_text(log, strict=False) if log.exists() else "",
        telemetry=read_samples(run_dir / layout.TELEMETRY)[0], cleanup=cleanup,
        teacher=load_teacher(teacher_path) if teacher_path.exists() else None, idle=idle,
        # a summary written before issue 33 has no covariates to compare
        idle_before_snapshots=idle_snapshots(run_dir / layout.IDLE_BEFORE)
        if summary_has_covariates(summary_raw) else None,
        ready_seconds=summary_raw.get("ready_seconds"),
        earlier_attempts=earlier_attempts(run_dir), probes=probes,
        # Gates are recomputed by the rule and version they were sealed with.
        rule=gates_rule(schema), version=gates_version(schema))), idle


def _compare_summary(summary_raw: Any, derived: LegDerived, idle: dict[str, IdleResult | None],
                     config: LegConfig, summary_file: str, problems: list[Problem]
                     ) -> TelemetrySummary | None:
    """summary.json against what was derived again; the telemetry summary to count (its
    notes are the recorded ones)."""
    summary, engine = derived.summary, derived.engine
    for field, message in diff(summary_raw.get("summary"), summary.model_dump(mode="json"),
                               "summary"):
        problems.append(Problem(file=summary_file, field=field, message=message))
    for field, message in diff(summary_raw.get("engine"),
                               engine.model_dump(mode="json") if engine else None, "engine"):
        problems.append(Problem(file=summary_file, field=field, message=message))
    for phase in ("before", "after"):
        recorded = summary_raw.get(f"idle_{phase}")
        got = idle.get(phase)
        found = got.model_dump(mode="json") if got is not None else None
        for field, message in diff(recorded, found, f"idle_{phase}"):
            problems.append(Problem(file=summary_file, field=field, message=message))
    telemetry = derived.telemetry
    recorded_tel = summary_raw.get("telemetry")
    if telemetry is not None and recorded_tel is not None:
        # A sampler problem is appended to the notes when it happens; it is not in the samples.
        telemetry = telemetry.model_copy(update={"notes": tuple(recorded_tel.get("notes", ()))})
    for field, message in diff(recorded_tel,
                               telemetry.model_dump(mode="json", by_alias=True)
                               if telemetry else None, "telemetry"):
        problems.append(Problem(file=summary_file, field=field, message=message))
    covariates = derived.covariates
    if covariates is not None:
        for field, message in diff(summary_raw["covariates"],
                                   covariates.model_dump(mode="json", by_alias=True), "covariates"):
            problems.append(Problem(file=summary_file, field=field, message=message))
    if summary_has_log_facts(summary_raw):
        recorded_names = {f.get("name") for f in summary_raw["log_facts"]}
        # An engine default added after the leg ran is not in its evidence and is not a
        # difference; every fact the plan itself declared must be there.
        own = {e.name for e in config.log_facts}
        facts = [f for f in derived.log_facts if f.name in recorded_names or f.name in own]
        for field, message in diff(summary_raw["log_facts"],
                                   [f.model_dump(mode="json") for f in facts], "log_facts"):
            problems.append(Problem(file=summary_file, field=field, message=message))
    return telemetry


def _leg_dirs(exp_dir: Path) -> dict[str, Path]:
    """The attempt of each leg that counts (layout.complete_attempt), or one whose summary
    cannot be read, so that verify_leg names it."""
    found: dict[str, Path] = {}
    for leg_dir in layout.leg_dirs(exp_dir):
        counted = [p for p in layout.attempts(leg_dir)
                   if layout.summary_status(p) in ("complete", "unreadable")]
        if counted:
            found[leg_dir.name] = counted[-1]
    return found


def verify_dir(directory: Path, expected_fingerprint: str | None = None) -> list[Problem]:
    """Every problem found in a sealed leg or experiment directory (empty: verified).

    Nothing is recomputed from a directory whose seal fails: its files may be links to
    the verifier's own secrets, devices or FIFOs, and a recomputed value would echo them."""
    problems: list[Problem] = []
    if expected_fingerprint is None and os.path.lexists(directory / layout.RECORD):
        # Without a fingerprint from the user, at least the key must be the one the
        # record names (a re-seal by another key shows).
        try:
            seal_info = safe.read_json_object(directory / layout.RECORD).get("seal") or {}
            named = seal_info.get("public_key_fingerprint") if isinstance(seal_info, dict) else None
            expected_fingerprint = named if isinstance(named, str) else None
        except safe.UnsafeEvidence:
            pass
    if os.path.lexists(directory / MANIFEST_NAME):
        problems.extend(verify_seal(directory, expected_fingerprint))
    else:
        problems.append(Problem(file=MANIFEST_NAME, field="(file)",
                                message="not sealed: no manifest.sha256"))
    if any(not _content_edit(p) for p in problems):
        problems.append(Problem(file=".", field="(recompute)",
                                message="skipped: nothing is recomputed from evidence whose "
                                "seal does not hold"))
        return problems
    try:
        problems.extend(_recompute(directory))
    except safe.UnsafeEvidence as exc:
        problems.append(Problem(file=_rel(Path(exc.file), directory), field="(file)",
                                message=exc.reason))
    except _MALFORMED as exc:
        problems.append(Problem(file=".", field="(recompute)",
                                message=f"cannot be recomputed: malformed evidence "
                                f"({type(exc).__name__}: {safe.excerpt(str(exc))})"))
    return problems


def _content_edit(problem: Problem) -> bool:
    """A listed regular file whose bytes changed, and nothing else wrong with the seal:
    recomputing still names the edited field, and reads nothing from outside the
    directory (links, devices, FIFOs and unlisted files fail the seal otherwise)."""
    return problem.field == "sha256" and problem.message.startswith("sha256 is ")


def _recompute(directory: Path) -> list[Problem]:
    problems: list[Problem] = []
    if (directory / ADDENDUM_FILE_NAME).exists():
        problems.extend(_verify_addendum(directory))
    elif (directory / layout.PLAN).exists():
        problems.extend(_verify_experiment(directory))
    elif (directory / layout.SUMMARY).exists():
        problems.extend(verify_leg(directory, directory)[0])
    else:
        problems.append(Problem(file=".", field="(dir)",
                                message="neither a leg (summary.json), an experiment (plan.json) "
                                "nor an addendum (addendum.json)"))
    return problems


def _verify_addendum(directory: Path) -> list[Problem]:
    """An addendum is bound to its parent by the parent's manifest hash: the parent
    must still be there, unchanged (its own `verify` checks the rest)."""
    problems: list[Problem] = []
    doc = _load_json(directory / ADDENDUM_FILE_NAME, directory, problems)
    if doc is None:
        return problems
    if directory.parent.name.endswith(ADDENDA_SUFFIX):
        parent = directory.parent.with_name(directory.parent.name[: -len(ADDENDA_SUFFIX)])
        manifest = parent / MANIFEST_NAME
        if not manifest.exists():
            problems.append(Problem(file=str(manifest), field="(file)",
                                    message="the record this addendum belongs to is not beside it"))
        elif sha256_file(manifest) != doc.get("parent_manifest_sha256"):
            problems.append(Problem(file=ADDENDUM_FILE_NAME, field="parent_manifest_sha256",
                                    message=f"does not match {manifest} (the record changed, or "
                                    "this addendum belongs to another)"))
    return problems


def _check_jsonl_files(exp_dir: Path) -> None:
    """Every JSONL file of an experiment that has a state log is a regular file within
    the cap (UnsafeEvidence otherwise), before anything is read from any of them."""
    state = exp_dir / layout.STATE
    if state.exists():
        for path in [state, *exp_dir.rglob("*.jsonl")]:
            safe.check_regular(path, safe.JSONL_CAP)


def _torn_problems(exp_dir: Path, seen: Mapping[Path, list[int]]) -> list[Problem]:
    """A torn JSONL line (a write cut by a kill or a full disk) must be named in the state
    log (`torn_jsonl`, written when the experiment resumed): a cut is evidence too, but
    never an unexplained one. `seen`: the torn lines of the files already parsed."""
    state = exp_dir / layout.STATE
    if not state.exists():
        return []
    named = {(e.get("file"), e.get("line")) for e in scan_jsonl(state)[0]
             if e.get("event") == "torn_jsonl"}
    problems = []
    for path in sorted(exp_dir.rglob("*.jsonl")):
        rel = path.relative_to(exp_dir).as_posix()
        torn = seen[path] if path in seen else scan_jsonl(path)[1]
        for line in torn:
            if (rel, line) not in named:
                problems.append(Problem(file=rel, field=f"line {line}",
                                        message="torn (not a whole JSON line) and not named in "
                                        "experiment.jsonl"))
    return problems


def sequential_legs(plan: Plan, exp_dir: Path, results: dict[str, LegResult],
                    problems: list[Problem]) -> set[str]:
    """The legs a sequential plan should have run: the blocks up to the look where its
    stopping rule stopped, recomputed from the legs found. A leg beyond that is named."""
    figs: dict[str, LegFigures] = {}
    for name, result in results.items():
        try:
            figs[name] = leg_figures(result, load_rows(Path(result.run_dir)))
        except (OSError, ValueError, KeyError) as exc:
            problems.append(Problem(file=_rel(Path(result.run_dir) / layout.ROWS, exp_dir),
                                    field="rows", message=f"unreadable: {exc}"))
    needed = plan_blocks_needed(plan, figs, {n: leg_exact(r) for n, r in results.items()}) \
        if plan.sweep is not None else blocks_needed(plan, figs)
    expected = {leg.name for leg in plan.design_legs if leg.block <= needed}
    for extra in sorted(set(results) - expected):
        problems.append(Problem(file=extra, field="(leg)", message=(
            f"a leg beyond the sequential stopping rule, which asked for {needed} block(s)")))
    return expected


def _verify_experiment(exp_dir: Path) -> list[Problem]:
    problems: list[Problem] = []
    plan_raw = _load_json(exp_dir / layout.PLAN, exp_dir, problems)
    if plan_raw is None:
        return problems
    plan = Plan.model_validate(plan_raw)
    registered_text = safe.read_text(exp_dir / layout.PLAN_HASH) \
        if (exp_dir / layout.PLAN_HASH).exists() else ""
    registered = registered_text.split()[0] if registered_text.split() else None
    if registered != plan.sha256:
        problems.append(Problem(file=layout.PLAN_HASH, field="sha256",
                                message=f"preregistered {safe.excerpt(registered)}, plan.json "
                                f"hashes to {plan.sha256}"))
    _check_jsonl_files(exp_dir)
    # The torn-line problems come here, before the legs', once the legs' raw events (most
    # of the bytes) have been parsed by their replay and not a second time.
    torn_at = len(problems)
    torn_seen: dict[Path, list[int]] = {}
    results: dict[str, LegResult] = {}
    for name, run_dir in _leg_dirs(exp_dir).items():
        leg_problems, result = verify_leg(run_dir, exp_dir, torn_seen)
        problems.extend(leg_problems)
        if result is not None and name != "teacher":
            if result.plan_sha256 != plan.sha256:
                problems.append(Problem(file=_rel(run_dir / layout.SUMMARY, exp_dir),
                                        field="plan_sha256",
                                        message="leg does not carry the preregistered plan hash"))
            results[name] = result
    problems[torn_at:torn_at] = _torn_problems(exp_dir, torn_seen)
    record_path = exp_dir / "record.json"
    if not record_path.exists():
        problems.append(Problem(file=layout.RECORD, field="(file)", message="missing"))
        return problems
    recorded = _load_json(record_path, exp_dir, problems)
    expected = {n for n, _ in plan.legs}
    if plan.sequential is not None:
        expected = sequential_legs(plan, exp_dir, results, problems)
    if recorded is None or set(results) != expected:
        if recorded is not None:
            problems.append(Problem(file=layout.RECORD, field="runs",
                                    message=f"complete legs found: {sorted(results)}"))
        return problems
    # Design order, as when run.
    ordered = {name: results[name] for name, _ in plan.legs if name in expected}
    # The record read as the current form of its kind (record.migrate); the keys its stored
    # form lacks are not differences.
    current = load_current(recorded, layout.RECORD)
    # Recomputed in that form: a v1 record by the v1 verdict.
    recomputed = build_record(plan, exp_dir, ordered, schema=current.obj["schema"],
                              sweep_method=_recorded_sweep_method(recorded))
    recomputed = json.loads(json.dumps(recomputed))  # the same JSON types as the file
    for field, message in diff(current.obj, recomputed,
                               not_recorded=frozenset(map(dotted, current.filled))):
        problems.append(Problem(file=layout.RECORD, field=field, message=message))
    return problems


@dataclass(frozen=True)
class Verified:
    """What `verify` found, and who signed: every command that reads received evidence
    (verify, report, submit) asks this, so all pin a key the same way."""

    problems: list[Problem]
    signer: Signer

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_trusted(directory: Path, expected_fingerprint: str | None = None,
                   config_dir: Path | None = None) -> Verified:
    """verify_dir, plus the signer's fingerprint and how it is pinned (evidence.trust): by
    `expected_fingerprint`, the trust file, the local key, or not at all. A leg, an
    experiment and an addendum are held to the same rules."""
    problems = verify_dir(directory, expected_fingerprint)
    return Verified(problems=problems, signer=signer_of(directory, expected_fingerprint,
                                                        config_dir))


def signer_of(directory: Path, expected_fingerprint: str | None = None,
              config_dir: Path | None = None) -> Signer:
    """The key `directory`'s seal names and how it is pinned; whether the seal holds is
    verify_dir's question."""
    where = config_dir if config_dir is not None else default_config_dir()
    trust_file = where / TRUST_FILE_NAME
    return pin(signer_fingerprint(directory), expected=expected_fingerprint,
               trusted=load_trusted(trust_file), trust_file=trust_file,
               local=local_fingerprint(where))


def _recorded_sweep_method(recorded: Mapping[str, Any]) -> str | None:
    """The older sweep method a record names, so that it recomputes by that method; None
    (the current method) for anything else, whose differences the diff then shows."""
    sweep = recorded.get("sweep")
    analysis = sweep.get("analysis") if isinstance(sweep, Mapping) else None
    method = analysis.get("method") if isinstance(analysis, Mapping) else None
    return SWEEP_METHOD_TWO_SIDED if method == SWEEP_METHOD_TWO_SIDED else None
