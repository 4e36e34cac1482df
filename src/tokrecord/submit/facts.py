"""What a submission may say about a record: read only from a sealed record that verifies.

``load_facts`` is the one I/O step: it re-verifies the directory (hashes, signature,
every recomputed figure) and refuses anything that does not, then reads the few
files a payload draws on. Everything after it (payload building, for any target)
is a pure function of the returned ``RecordFacts``.

The headline leg is the one the record publishes: for an ABBA experiment the
candidate leg with the lowest headline, over every block
(``metric_accounting.headline_leg``), for a single-leg record its one leg. An A/A
record (one arm in every leg: the noise floor) makes no speed claim and is refused.
The headline leg's own evidence (config.json, suite.jsonl, rows.json, gates.json,
teacher.json) supplies the command line, the prompts, the token counts and the
teacher outputs, so nothing is taken from the plan that the leg did not actually run.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokrecord.errors import TokrecordError
from tokrecord.evidence import canonical_json, layout, read_json
from tokrecord.evidence.seal import MANIFEST_NAME, Problem
from tokrecord.identity import sha256_file
from tokrecord.record import SCHEMA_ABBA, SCHEMA_ABBA_V1, SCHEMA_SINGLE
from tokrecord.record.verify import verify_dir

EXPERIMENT_SCHEMAS = (SCHEMA_ABBA, SCHEMA_ABBA_V1)  # v1: one block, made before v2; still submitted


class SubmitError(TokrecordError):
    """A submission cannot be prepared, sent or checked; the message says why."""


@dataclass(frozen=True)
class RecordFacts:
    """The verified facts of one sealed record that a leaderboard payload can carry."""

    record_dir: Path
    manifest_sha256: str  # sha256 of the record's manifest.sha256: the record's identity
    record: Mapping[str, Any]  # record.json
    identity: Mapping[str, Any] | None  # identity.json, when the experiment collected one
    form: str  # "abba" or "single"
    leg: str  # the headline leg's name (B1; in an ABBA experiment the lowest candidate leg)
    leg_valid: bool
    headline_tok_s: float | None
    convention: str
    formula: str
    legacy_tok_s: float | None
    conventional_tok_s: float | None
    chunk_aware_tok_s: float | None
    quantisation_bound_pct: float | None
    ttft_ms: float | None
    draft_acceptance_rate: float | None
    emitted_tokens_per_draft_cycle: float | None
    server_argv: tuple[str, ...]
    server_env: Mapping[str, str]
    request_extra: Mapping[str, Any]
    prompts: tuple[str, ...]  # suite prompts in row order
    prompt_tokens: tuple[int | None, ...]  # per row, as the server reported
    output_tokens: tuple[int, ...]  # per row, tokens received
    teacher_exact_count: str | None  # "13/13", None when not tested
    teacher_token_ids: tuple[tuple[int, ...], ...] | None  # only when every row is exact by ids
    candidate_legs: tuple[str, ...] = ()  # an ABBA experiment's, in run order (every block)
    blocks: int = 1  # an ABBA experiment's (v1 records: one)

    @property
    def rows(self) -> int:
        return len(self.prompts)


# ---------------------------------------------------------------- evidence hashes


def sha256_of_json(value: Any) -> str:
    """sha256 of the RFC 8785 canonical JSON of ``value`` (no trailing newline)."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def prompt_sha256(facts: RecordFacts) -> str:
    """sha256 of the canonical JSON array of the suite's prompt strings, in row order."""
    return sha256_of_json(list(facts.prompts))


def output_sha256(facts: RecordFacts) -> str | None:
    """sha256 of the canonical JSON array of the teacher's token-id arrays, in row order;
    None unless every row of the headline leg matched the teacher token for token."""
    if facts.teacher_token_ids is None:
        return None
    return sha256_of_json([list(ids) for ids in facts.teacher_token_ids])


def median_low(values: Sequence[int | None]) -> int | None:
    """The lower median: always a value that was observed, so it stays an integer."""
    present = [v for v in values if v is not None]
    return int(statistics.median_low(present)) if present else None


# -------------------------------------------------------------------------- loading


def _read_json(path: Path) -> Any:
    return read_json(path, SubmitError)


def manifest_sha256(record_dir: Path) -> str:
    path = record_dir / MANIFEST_NAME
    try:
        return sha256_file(path)
    except OSError as exc:
        raise SubmitError(f"{record_dir} is not sealed (no {MANIFEST_NAME}): {exc.strerror}") from exc


def _leg_dir(record_dir: Path, run_dir: str, leg: str) -> Path:
    try:
        path = layout.locate_run_dir(record_dir, run_dir, leg)
    except ValueError as exc:
        raise SubmitError(f"record: {exc}") from exc
    if not (path / layout.SUMMARY).is_file():
        raise SubmitError(f"{path}: the headline leg's evidence is missing")
    return path


def refuse_no_claim(record: Mapping[str, Any]) -> None:
    """An A/A record is the machine's noise floor: every leg runs one arm, so it says
    nothing about a speed and must not reach a leaderboard."""
    protocol = record.get("protocol")
    if isinstance(protocol, Mapping) and protocol.get("design") == "aa":
        arms = ", ".join(sorted(record.get("treatment") or {})) or "one arm"
        raise SubmitError(
            "this is an A/A experiment (design 'aa': the same arm, " + arms + ", in every leg): "
            "it measures the machine's noise floor and makes no speed claim, so there is "
            "nothing to submit. Submit an ABBA or single-leg record; use this one as the "
            "noise of a plan's power (noise.from_records)")


def candidate_legs(record: Mapping[str, Any]) -> tuple[str, ...]:
    """An ABBA experiment's candidate legs in run order, every block (A1 B1 B2 A2 | B3 A3 ...)."""
    runs = record.get("runs") or {}
    order = [str(item).split("-")[0]
             for item in (record.get("protocol") or {}).get("order") or list(runs)]
    return tuple(n for n in order
                 if isinstance(runs.get(n), Mapping) and runs[n].get("treatment") == "candidate")


def _headline_leg(record: Mapping[str, Any], leg: Any) -> str:
    """The named headline leg, checked: the candidate leg with the lowest headline."""
    runs = record.get("runs") or {}
    cands = candidate_legs(record)
    if not isinstance(leg, str) or not isinstance(runs.get(leg), Mapping):
        raise SubmitError("record.json names no headline leg (metric_accounting.headline_leg)")
    if leg not in cands:
        raise SubmitError(f"record.json names leg {leg} as the headline, which is not a candidate "
                          f"leg (candidate legs: {', '.join(cands) or 'none'})")
    heads = {n: runs[n].get("headline_tok_s") for n in cands}
    if all(isinstance(v, int | float) for v in heads.values()):
        lowest = min(float(v) for v in heads.values())
        if float(heads[leg]) != lowest:
            raise SubmitError(f"record.json names leg {leg} ({heads[leg]} tok/s) as the headline; "
                              f"the headline is the lowest candidate leg ({lowest} tok/s)")
    return leg


def _headline(record: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any], str, bool, float | None,
                                                    float | None, float | None]:
    """(form, leg, accounting, run_dir, valid, ttft_ms, acceptance, emitted/cycle)."""
    schema = record.get("schema")
    accounting = record.get("metric_accounting") or {}
    if schema in EXPERIMENT_SCHEMAS:
        refuse_no_claim(record)
        leg = _headline_leg(record, accounting.get("headline_leg"))
        run = (record.get("runs") or {})[leg]
        return ("abba", leg, accounting, str(run.get("run_dir")), bool(run.get("valid")),
                run.get("ttft_median_ms"), run.get("draft_acceptance_rate"),
                run.get("emitted_tokens_per_draft_cycle"))
    if schema == SCHEMA_SINGLE:
        summary = record.get("summary") or {}
        return ("single", "B1", accounting, str((record.get("artifacts") or {}).get("run_dir")),
                bool(record.get("valid")), summary.get("ttft_ms_median"),
                summary.get("draft_acceptance_rate"), summary.get("emitted_tokens_per_draft_cycle"))
    raise SubmitError(f"record.json has schema {schema!r}; submit takes "
                      f"{SCHEMA_ABBA}, {SCHEMA_ABBA_V1} or {SCHEMA_SINGLE}")


TokenIds = tuple[tuple[int, ...], ...]


def _teacher_ids(leg_dir: Path, prompts: Sequence[str]) -> tuple[str | None, TokenIds | None]:
    gates = _read_json(leg_dir / layout.GATES)
    gate = next((g for g in gates.get("gates", []) if g.get("name") == "teacher_exact"), None)
    if gate is None or gate.get("status") != "pass":
        return (gate or {}).get("count"), None
    evidence = gate.get("evidence") or {}
    # Text equality is weaker evidence than token equality: no output hash from it.
    if (list(evidence.get("compared_by") or []) != ["token_ids"]
            or not (leg_dir / layout.LEG_TEACHER).is_file()):
        return gate.get("count"), None
    teacher = _read_json(leg_dir / layout.LEG_TEACHER)
    rows = teacher.get("rows") or []
    ids = [r.get("token_ids") for r in rows]
    if len(ids) != len(prompts) or any(not isinstance(i, list) for i in ids):
        return gate.get("count"), None
    return gate.get("count"), tuple(tuple(int(t) for t in i) for i in ids)


def facts_from_dir(record_dir: Path) -> RecordFacts:
    """The facts of a record directory, read without verifying it (see ``load_facts``)."""
    record = _read_json(record_dir / layout.RECORD)
    identity_path = record_dir / layout.IDENTITY
    identity = _read_json(identity_path) if identity_path.is_file() else None
    form, leg, acc, run_dir, valid, ttft, acceptance, emitted = _headline(record)
    leg_dir = _leg_dir(record_dir, run_dir, leg)
    config = _read_json(leg_dir / layout.CONFIG).get("leg") or {}
    server = config.get("server") or {}
    prompts: list[str] = []
    with open(leg_dir / layout.SUITE, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                prompts.append(str(json.loads(line)["prompt"]))
    rows = _read_json(leg_dir / layout.ROWS).get("rows") or []
    traces = [r.get("trace") or {} for r in rows]
    exact_count, teacher_ids = _teacher_ids(leg_dir, prompts)
    return RecordFacts(
        record_dir=record_dir,
        manifest_sha256=manifest_sha256(record_dir),
        record=record,
        identity=identity,
        form=form,
        leg=leg,
        leg_valid=valid,
        headline_tok_s=acc.get("published_value_tok_s"),
        convention=str(acc.get("published_convention")),
        formula=str(acc.get("published_formula")),
        legacy_tok_s=acc.get("legacy_inclusive_events_value_tok_s"),
        conventional_tok_s=acc.get("conventional_interval_value_tok_s"),
        chunk_aware_tok_s=acc.get("chunk_aware_value_tok_s"),
        quantisation_bound_pct=acc.get("quantisation_bound_pct"),
        ttft_ms=ttft,
        draft_acceptance_rate=acceptance,
        emitted_tokens_per_draft_cycle=emitted,
        server_argv=tuple(str(a) for a in server.get("argv") or ()),
        server_env={str(k): str(v) for k, v in (server.get("env") or {}).items()},
        request_extra=dict(config.get("request_extra") or {}),
        prompts=tuple(prompts),
        prompt_tokens=tuple(t.get("prompt_tokens") for t in traces),
        output_tokens=tuple(int(t.get("completion_tokens") or len(t.get("token_ids") or ())) for t in traces),
        teacher_exact_count=exact_count,
        teacher_token_ids=teacher_ids,
        candidate_legs=candidate_legs(record) if form == "abba" else (),
        blocks=int((record.get("protocol") or {}).get("blocks") or 1) if form == "abba" else 1,
    )


Verifier = Callable[[Path], list[Problem]]


def verify_record(directory: Path) -> list[Problem]:

    return verify_dir(directory)


def load_facts(record_dir: Path, verify: Verifier = verify_record) -> RecordFacts:
    """The facts of a sealed record, refused unless the whole directory verifies."""
    if not record_dir.is_dir():
        raise SubmitError(f"{record_dir} is not a directory")
    if not (record_dir / MANIFEST_NAME).is_file():
        raise SubmitError(f"{record_dir} is not sealed; only a sealed record can be submitted")
    if not (record_dir / layout.RECORD).is_file():
        raise SubmitError(f"{record_dir} has no record.json; submit takes an experiment "
                          "(tokrecord run), not a bare leg")
    record = _read_json(record_dir / layout.RECORD)
    if isinstance(record, Mapping):
        refuse_no_claim(record)  # before verifying: no amount of verification makes it a claim
    problems = verify(record_dir)
    if problems:
        first = "; ".join(f"{p.file}: {p.field}: {p.message}" for p in problems[:3])
        raise SubmitError(f"{record_dir} does not verify ({len(problems)} problems, first: {first}); "
                          "a submission is built only from a record that verifies — run tokrecord verify")
    return facts_from_dir(record_dir)
