"""Teacher exactness of sealed evidence recounted under each rule, from its raw events.

A record is verified by the rule it was sealed with (leg gates v1 or v2); this answers
the other question, "what does the current rule say about that evidence?", without
touching it. Every leg's rows and the teacher leg's rows are re-parsed from
events.jsonl by the engine's own parser (as `verify` does), so rows recorded before
rows v2 get the ids around any held-back ones too; the teacher for rule 2 is rebuilt
from the teacher leg's events, the sealed teacher.json serving rule 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokrecord.client.stream import RowTrace, replay_row
from tokrecord.evidence import layout, read_jsonl
from tokrecord.experiment.leg import LegConfig, RowRecord, outcomes
from tokrecord.gates import (
    EXACTNESS_RULE,
    EXACTNESS_RULE_V1,
    GateResult,
    RowOutcome,
    row_comparison,
    teacher_exact,
)
from tokrecord.gates.teacher import Teacher, TeacherRow, load_teacher
from tokrecord.metrics import row_metrics
from tokrecord.suite import Suite, parse_suite


@dataclass(frozen=True)
class LegCount:
    """One leg's teacher-exact gate under rule 1 (as sealed) and rule 2 (now), and how
    many of its rows each compared by ids; the ids compared and held back under rule 2."""

    leg: str
    rows: int
    before: GateResult
    after: GateResult
    by_ids_before: int
    by_ids_after: int
    ids_compared_after: int
    ids_total: int
    ids_held_back: int


def _config(run_dir: Path) -> LegConfig:
    raw = json.loads((run_dir / layout.CONFIG).read_text(encoding="utf-8"))
    rows = parse_suite((run_dir / layout.SUITE).read_bytes(), layout.SUITE).rows
    suite = Suite(name=raw["suite"]["name"], sha256=raw["suite"]["sha256"], rows=rows)
    return LegConfig.model_validate({**raw["leg"], "suite": suite})


def replayed(run_dir: Path) -> tuple[LegConfig, list[RowRecord]]:
    """A leg's rows re-parsed from its raw events by today's parser."""
    config = _config(run_dir)
    events = read_jsonl(run_dir / layout.EVENTS)
    stored = json.loads((run_dir / layout.ROWS).read_text(encoding="utf-8"))["rows"]
    records = []
    for row in stored:
        i = int(row["trace"]["row"])
        trace: RowTrace = replay_row([e for e in events if e.get("row") == i],
                                     config.suite.rows[i], config.endpoint, config.adapter)
        records.append(RowRecord(trace=trace, metrics=row_metrics(trace.t_send_ns, trace.chunks)))
    return config, records


def teacher_from_events(sealed: Teacher, rows: list[RowOutcome]) -> Teacher:
    """The sealed teacher with the ids its own leg's events carry (teacher v2)."""
    by_row = {o.row: o for o in rows}
    return Teacher(
        created_utc=sealed.created_utc, suite_name=sealed.suite_name,
        suite_sha256=sealed.suite_sha256, model=sealed.model,
        model_manifest=sealed.model_manifest, arm=sealed.arm, source_run=sealed.source_run,
        rows=tuple(TeacherRow(**{**r.model_dump(), "gapped_token_ids":
                                 by_row[r.row].gapped_token_ids if r.row in by_row else None})
                   for r in sealed.rows))


def recount(exp_dir: Path) -> list[LegCount]:
    """Every leg of an experiment (teacher captured in it) under both rules."""
    teacher_dir = layout.complete_attempt(exp_dir / "teacher")
    sealed = load_teacher(exp_dir / layout.TEACHER)
    if teacher_dir is None:
        raise FileNotFoundError(f"{exp_dir}: no complete teacher leg")
    config, records = replayed(teacher_dir)
    teacher = teacher_from_events(sealed, outcomes(records, config))
    counts = []
    for leg_dir in layout.leg_dirs(exp_dir):
        attempt = layout.complete_attempt(leg_dir)
        if leg_dir.name == "teacher" or attempt is None:
            continue
        config, records = replayed(attempt)
        rows = outcomes(records, config)
        held = sum(sum(1 for i in o.gapped_token_ids if i is None)
                   for o in rows if o.gapped_token_ids is not None)
        old_by = {t.row: t for t in sealed.rows}
        new_by = {t.row: t for t in teacher.rows}
        before = [row_comparison(o, old_by[o.row], EXACTNESS_RULE_V1) for o in rows
                  if o.row in old_by]
        after = [row_comparison(o, new_by[o.row], EXACTNESS_RULE) for o in rows
                 if o.row in new_by]
        counts.append(LegCount(
            leg=leg_dir.name, rows=len(rows),
            before=teacher_exact(rows, sealed, EXACTNESS_RULE_V1),
            after=teacher_exact(rows, teacher, EXACTNESS_RULE),
            by_ids_before=sum(1 for c in before if c.mode == "token_ids"),
            by_ids_after=sum(1 for c in after if c.mode == "token_ids"),
            ids_compared_after=sum(c.ids_checked for c in after),
            ids_total=sum(o.n_tokens for o in rows), ids_held_back=held))
    return counts
