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
teacher.json, summary.json, events.jsonl, the /metrics scrapes) supplies the command
line, the prompts, the outputs as streamed, the token counts, the teacher outputs and
the engine's own timing report, so nothing is taken from the plan that the leg did not
actually run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from tokrecord.errors import ConfigError, TokrecordError
from tokrecord.evidence import canonical_sha256, layout, read_json, read_jsonl
from tokrecord.evidence.seal import MANIFEST_NAME, Problem
from tokrecord.experiment.leg import LegConfig, LegResult, ServerSpec, load_rows
from tokrecord.gates import TEACHER_EXACT, GateResult, GateStatus, compared_by_phrase
from tokrecord.gates.teacher import load_teacher
from tokrecord.identity import Identity, sha256_file
from tokrecord.metrics.engine import SpeculativeCounters, histogram_deltas, timing_histograms
from tokrecord.probes.telemetry import TelemetrySummary
from tokrecord.record.schema import (
    AbbaRecord,
    Accounting,
    AnyRecord,
    SingleLegRecord,
    load_record,
)
from tokrecord.record.verify import verify_dir
from tokrecord.suite import Suite, parse_suite

# An ABBA (or A/A) experiment record, v1 or v2 (v1: one block, made before v2; still
# submitted), or a single-leg record.
RecordForm = Literal["abba", "single"]
T = TypeVar("T")


class SubmitError(TokrecordError):
    """A submission cannot be prepared, sent or checked; the message says why."""


@dataclass(frozen=True)
class EngineTimings:
    """What the engine itself reported of its timing over the headline leg, verbatim:
    per row (llama.cpp's ``timings``, SGLang's ``meta_info``: re-read from the sealed raw
    events) or, for engines that report timing only on /metrics, the deltas over the
    suite of their timing histograms (the leg's two sealed scrapes)."""

    source: str
    rows: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (row id, the engine's object)
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordFacts:
    """The verified facts of one sealed record that a leaderboard payload can carry."""

    record_dir: Path
    manifest_sha256: str  # sha256 of the record's manifest.sha256: the record's identity
    record: AnyRecord  # record.json
    identity: Identity | None  # identity.json, when the experiment collected one
    form: RecordForm
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
    # How the teacher-exact rows were compared ("13/13 by ids", "0/13 by ids, 13 by
    # text, …"; gates.compared_by_phrase); None when not tested.
    teacher_exact_by: str | None = None
    output_texts: tuple[str, ...] = ()  # per row of the headline leg, as streamed
    engine_timings: EngineTimings | None = None  # None: the engine reported none
    draft_tokens: int | None = None  # speculative counters' deltas over the headline leg
    accepted_draft_tokens: int | None = None
    telemetry: TelemetrySummary | None = None  # the headline leg's
    engine_reported: Mapping[str, str] | None = None  # what the running server said of its version

    @property
    def rows(self) -> int:
        return len(self.prompts)


# ---------------------------------------------------------------- evidence hashes


sha256_of_json = canonical_sha256  # the payload's hashes: sha256 of RFC 8785 JSON


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


def _typed(path: Path, parse: Callable[[Path], T]) -> T:
    """An evidence file read as its model; SubmitError when it cannot be."""
    try:
        return parse(path)
    except TokrecordError as exc:  # its message names the file
        raise SubmitError(str(exc)) from exc
    except OSError as exc:
        raise SubmitError(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise SubmitError(f"{path}: {exc}") from exc


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


def refuse_no_claim(record: AnyRecord) -> None:
    """An A/A record is the machine's noise floor: every leg runs one arm, so it says
    nothing about a speed and must not reach a leaderboard."""
    spec = record.design_spec()
    if not spec.makes_claim:
        arms = ", ".join(record.arm_names()) or "one arm"
        raise SubmitError(
            f"this is an {spec.title} (design {spec.design.value!r}: the same arm, " + arms
            + f", in every leg): {spec.not_submittable}, so there is nothing to submit. "
            "Submit an ABBA or single-leg record; use this one as the noise of a plan's power "
            "(noise.from_records)")
    if spec.not_submittable is not None:
        best = record.sweep.analysis.best if record.sweep is not None else None
        raise SubmitError(
            f"this is a sweep (design {spec.design.value!r}): submitting a sweep's chosen arm is "
            f"not supported yet, since {spec.not_submittable}. "
            + (f"Its best arm is {best}: run an ABBA of that arm against the prior and submit "
               "that record" if best else "It singled out no best arm, so there is no claim"))


def candidate_legs(record: AbbaRecord) -> tuple[str, ...]:
    """An ABBA experiment's candidate legs in run order, every block (A1 B1 B2 A2 | B3 A3 ...)."""
    runs = record.runs_by_name()
    order = record.protocol.leg_names() or list(runs)
    return tuple(n for n in order if n in runs and runs[n].treatment == "candidate")


def _headline_leg(record: AbbaRecord, leg: str) -> str:
    """The named headline leg, checked: the candidate leg with the lowest headline."""
    runs = record.runs_by_name()
    cands = candidate_legs(record)
    if leg not in runs:
        raise SubmitError("record.json names no headline leg (metric_accounting.headline_leg)")
    if leg not in cands:
        raise SubmitError(f"record.json names leg {leg} as the headline, which is not a candidate "
                          f"leg (candidate legs: {', '.join(cands) or 'none'})")
    heads = {n: runs[n].headline_tok_s for n in cands}
    found = [v for v in heads.values() if v is not None]
    if len(found) == len(heads) and heads[leg] != min(found):
        raise SubmitError(f"record.json names leg {leg} ({heads[leg]} tok/s) as the headline; "
                          f"the headline is the lowest candidate leg ({min(found)} tok/s)")
    return leg


class Headline(NamedTuple):
    """The leg a record publishes, and its figures the payload carries."""

    form: RecordForm
    leg: str
    accounting: Accounting
    run_dir: str
    valid: bool
    ttft_ms: float | None
    spec: SpeculativeCounters
    telemetry: TelemetrySummary | None
    candidate_legs: tuple[str, ...]  # an experiment's, in run order (none: a single leg)
    blocks: int


def _headline(record: AnyRecord) -> Headline:
    if isinstance(record, SingleLegRecord):
        s = record.summary
        return Headline("single", "B1", record.metric_accounting, record.artifacts.run_dir,
                        record.valid, s.ttft_ms_median, s, record.telemetry, (), 1)
    refuse_no_claim(record)
    leg = _headline_leg(record, record.metric_accounting.headline_leg)
    run = record.runs_by_name()[leg]
    return Headline("abba", leg, record.metric_accounting, run.run_dir, run.valid,
                    run.ttft_median_ms, run, run.telemetry, candidate_legs(record),
                    record.named_design()[1] or 1)


TokenIds = tuple[tuple[int, ...], ...]


def _teacher_ids(leg_dir: Path, prompts: Sequence[str]) -> tuple[str | None, TokenIds | None]:
    gates = _typed(leg_dir / layout.GATES, _gates)
    gate = next((g for g in gates if g.name == TEACHER_EXACT), None)
    if gate is None or gate.status is not GateStatus.PASS:
        return (gate.count if gate else None), None
    # Text equality is weaker evidence than token equality: no output hash from it.
    if (list(gate.evidence.get("compared_by") or []) != ["token_ids"]
            or not (leg_dir / layout.LEG_TEACHER).is_file()):
        return gate.count, None
    ids = [r.token_ids for r in _typed(leg_dir / layout.LEG_TEACHER, load_teacher).rows]
    if len(ids) != len(prompts):
        return gate.count, None
    exact = tuple(i for i in ids if i is not None)
    return gate.count, exact if len(exact) == len(ids) else None


def _teacher_exact_by(leg_dir: Path) -> str | None:
    gate = next((g for g in _typed(leg_dir / layout.GATES, _gates)
                 if g.name == TEACHER_EXACT), None)
    if gate is None or gate.status is GateStatus.NOT_TESTED or gate.count is None:
        return None
    rows = gate.count.split("/")[-1]
    return compared_by_phrase(gate.evidence, int(rows)) if rows.isdigit() else None


def _gates(path: Path) -> list[GateResult]:
    return [GateResult.model_validate(g) for g in _read_json(path)["gates"]]


def _identity(path: Path) -> Identity:
    return Identity.model_validate(_read_json(path))


def _server(path: Path) -> tuple[ServerSpec, dict[str, Any]]:
    """The leg's server as it ran, and the extra request fields (config.json's leg)."""
    leg = _read_json(path).get("leg") or {}
    return ServerSpec.model_validate(leg.get("server")), dict(leg.get("request_extra") or {})


def _prompts(path: Path) -> list[str]:
    return [row.prompt for row in parse_suite(path.read_bytes(), layout.SUITE).rows]


def _leg_config(leg_dir: Path) -> LegConfig:
    """The leg's configuration as it ran (config.json with its suite), as verify rebuilds it."""
    raw = _read_json(leg_dir / layout.CONFIG)
    rows = parse_suite((leg_dir / layout.SUITE).read_bytes(), layout.SUITE).rows
    try:
        suite = Suite(name=raw["suite"]["name"], sha256=raw["suite"]["sha256"], rows=rows)
        return LegConfig.model_validate({**raw["leg"], "suite": suite})
    except (KeyError, TypeError) as exc:
        raise SubmitError(f"{leg_dir / layout.CONFIG}: no leg configuration to read ({exc})") from exc


def _summary(path: Path) -> LegResult:
    return LegResult.model_validate(_read_json(path))


def _row_timings(leg_dir: Path, config: LegConfig) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """Each row's end-of-request report from the engine, re-read from the raw events with
    the engine's own parser (what the live client saw); () when the engine sends none."""
    by_row: dict[int, list[dict[str, Any]]] = {}
    for event in read_jsonl(leg_dir / layout.EVENTS):
        if event.get("kind") == "chunk":
            by_row.setdefault(int(event["row"]), []).append(event)
    out: list[tuple[str, Mapping[str, Any]]] = []
    for i, row in enumerate(config.suite.rows):
        parser = config.adapter.parser(config.endpoint)
        for event in by_row.get(i, ()):
            parser.parse(json.loads(event["data"]))
        if parser.engine_timings is None:
            return ()  # every row or none: a partial report would not describe the leg
        out.append((row.id, dict(parser.engine_timings)))
    return tuple(out)


def engine_timings(leg_dir: Path) -> EngineTimings | None:
    """The engine's own timing report of a leg (see ``EngineTimings``); None: none."""
    config = _leg_config(leg_dir)
    rows = _row_timings(leg_dir, config)
    if rows:
        return EngineTimings(source=f"{config.engine_name}: the final event of each row's stream "
                             f"({config.endpoint.value} endpoint), verbatim from events.jsonl",
                             rows=rows)
    before, after = leg_dir / layout.METRICS_BEFORE, leg_dir / layout.METRICS_AFTER
    if not (before.is_file() and after.is_file()):
        return None
    deltas = histogram_deltas(timing_histograms(before.read_text(encoding="utf-8")),
                              timing_histograms(after.read_text(encoding="utf-8")))
    if not deltas:
        return None
    return EngineTimings(source=f"{config.engine_name}: its /metrics timing histograms (_sum, "
                         "_count), after minus before the suite (metrics-before.prom, "
                         "metrics-after.prom)", metrics=deltas)


def facts_from_dir(record_dir: Path) -> RecordFacts:
    """The facts of a record directory, read without verifying it (see ``load_facts``)."""
    record = _typed(record_dir / layout.RECORD, load_record)
    identity_path = record_dir / layout.IDENTITY
    identity = _typed(identity_path, _identity) if identity_path.is_file() else None
    head = _headline(record)
    leg_dir = _leg_dir(record_dir, head.run_dir, head.leg)
    server, request_extra = _typed(leg_dir / layout.CONFIG, _server)
    prompts = _typed(leg_dir / layout.SUITE, _prompts)
    traces = [r.trace for r in _typed(leg_dir, load_rows)]
    exact_count, teacher_ids = _teacher_ids(leg_dir, prompts)
    exact_by = _teacher_exact_by(leg_dir)
    summary = _typed(leg_dir / layout.SUMMARY, _summary)
    timings = _typed(leg_dir, engine_timings)
    acc = head.accounting
    return RecordFacts(
        record_dir=record_dir, manifest_sha256=manifest_sha256(record_dir), record=record,
        identity=identity, form=head.form, leg=head.leg, leg_valid=head.valid,
        headline_tok_s=acc.published_value_tok_s, convention=acc.published_convention.value,
        formula=acc.published_formula, legacy_tok_s=acc.legacy_inclusive_events_value_tok_s,
        conventional_tok_s=acc.conventional_interval_value_tok_s,
        chunk_aware_tok_s=acc.chunk_aware_value_tok_s,
        quantisation_bound_pct=acc.quantisation_bound_pct, ttft_ms=head.ttft_ms,
        draft_acceptance_rate=head.spec.draft_acceptance_rate,
        emitted_tokens_per_draft_cycle=head.spec.emitted_tokens_per_draft_cycle,
        server_argv=server.argv, server_env=server.env, request_extra=request_extra,
        prompts=tuple(prompts), prompt_tokens=tuple(t.prompt_tokens for t in traces),
        output_tokens=tuple(t.completion_tokens or len(t.token_ids or ()) for t in traces),
        teacher_exact_count=exact_count, teacher_token_ids=teacher_ids,
        teacher_exact_by=exact_by,
        candidate_legs=head.candidate_legs, blocks=head.blocks,
        output_texts=tuple(t.text for t in traces), engine_timings=timings,
        draft_tokens=head.spec.draft_tokens, accepted_draft_tokens=head.spec.accepted_draft_tokens,
        telemetry=head.telemetry, engine_reported=summary.engine_version,
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
    try:
        record: AnyRecord | None = load_record(record_dir / layout.RECORD)
    except ConfigError:
        record = None  # not a record: verifying says what is wrong with it
    if record is not None:
        refuse_no_claim(record)  # before verifying: no amount of verification makes it a claim
    problems = verify(record_dir)
    if problems:
        first = "; ".join(f"{p.file}: {p.field}: {p.message}" for p in problems[:3])
        raise SubmitError(f"{record_dir} does not verify ({len(problems)} problems, first: {first}); "
                          "a submission is built only from a record that verifies — run tokrecord verify")
    return facts_from_dir(record_dir)
