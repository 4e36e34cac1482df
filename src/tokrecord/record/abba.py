"""The experiment record of an ABBA, A/A or sweep design (``tokrecord.experiment-record/v3``),
built as its model (record.schema.ExperimentRecordV3): mypy checks every section's fields
when it is built. A v1 record is recomputed by record.migrate_v1, from the parts here that
every form shares (`findings` and the section helpers).

The sections every record form shares are built, as their models, in record/__init__.py;
this module builds the ABBA form's own. The analyses' own results (pairs, verdicts, the
record gate, sweep and sequential sections) are models already; each is given as its full
dump, as the record held it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, TypeAdapter

from tokrecord.experiment.design import DesignLeg
from tokrecord.experiment.interim import leg_figures
from tokrecord.experiment.leg import LegResult, RowRecord
from tokrecord.experiment.plan import Arm, Plan
from tokrecord.experiment.power import PowerReport
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.stats import (
    AnalysisLeg,
    LegFigures,
    PairResult,
    RecordGate,
    Verdict,
    VerdictAnalysis,
    leg_analysis,
    pair_result,
    record_gate,
)
from tokrecord.experiment.sweep import SweepSection
from tokrecord.gates import (
    CACHED_TOKENS_ZERO,
    CLEANUP,
    FRESH_UNIQUE_PROMPTS,
    FULL_OUTPUT_THEN_NEXT,
    IDLE_AFTER,
    IDLE_BEFORE,
    LONG_CONTEXT_THEN_NEXT,
    ONE_SUITE_INVOCATION,
    ROLLOVER,
    SINGLE_ACTIVE_GENERATION,
    TEACHER_EXACT,
    TOKEN_COUNT_INTEGRITY,
    ZERO_RETRIES,
    GateResult,
    GateStatus,
    RowOutcome,
    compared_by_phrase,
    cross_leg_exact,
)
from tokrecord.metrics import FORMULAS
from tokrecord.probes.telemetry import TelemetrySummary
from tokrecord.record import (
    EvidenceFacts,
    _gate,
    _ok,
    accounting,
    component_reasons,
    identity_across_legs,
    log_facts,
    model_section,
    noise_section,
    operational,
    portable_entries,
    redacted_arm,
    reproducibility,
    sequential_section,
    server_log_facts,
    speculative_section,
    sweep_reasons,
    sweep_section,
    sweep_verdicts,
    unchanged_stack,
)
from tokrecord.record.exactness import artifact_entries
from tokrecord.record.ids import SCHEMA_ABBA
from tokrecord.record.schema import (
    AbbaArtifacts,
    AbbaProtocol,
    AbbaProtocolV2,
    AbbaQuality,
    Attempt,
    ComponentEvidence,
    Empty,
    EvidenceHashes,
    ExperimentRecordV3,
    GateSummary,
    Hardware,
    LegBlock,
    PriorApprovedRecord,
    PriorRecheck,
    Source,
)

_M = TypeVar("_M", bound=BaseModel)
_SOURCE: TypeAdapter[Any] = TypeAdapter(Source)
_COMPONENTS = TypeAdapter(dict[str, ComponentEvidence])
_EVIDENCE = TypeAdapter(EvidenceHashes)
_P = TypeVar("_P", bound=AbbaProtocol)


def whole(model: _M) -> _M:
    """`model` with every field given (the record's dump keeps only fields given): what
    its model_dump held when the record was a dict."""
    return type(model).model_validate(model.model_dump(mode="json"))


@dataclass(frozen=True)
class Findings:
    """What the legs say, before it is written down: the parts every ABBA record form
    shares (a form's own analysis gives the verdicts it is read by)."""

    design: tuple[DesignLeg, ...]  # the legs that ran, in design order
    pair_names: tuple[tuple[str, str], ...]
    pairs: dict[str, PairResult]
    verdict: Verdict
    seq: SequentialAnalysis | None
    swept: SweepSection | None
    gate: RecordGate
    cross: GateResult
    identity_ok: bool | None  # None: no identity checks before the legs
    headline: LegResult


def abba_record(
    plan: Plan,
    results: Mapping[str, LegResult],
    rows: Mapping[str, Sequence[RowRecord]],
    outcomes: Mapping[str, Sequence[RowOutcome]],
    attempts: Sequence[Mapping[str, Any]],
    idle_gaps: Mapping[str, float],
    facts: EvidenceFacts,
    power: Mapping[str, Any] | None = None,
    sweep_method: str | None = None,
) -> ExperimentRecordV3:
    """An ABBA, A/A or sweep experiment's record, in the current form (experiment-record/v3;
    a v1 record is recomputed by record.migrate_v1); a sweep's by `sweep_method` when an
    older sweep record is recomputed (experiment.sweep.SWEEP_METHOD_TWO_SIDED)."""
    design = legs_run(plan, results)
    figs = figures(results, rows)
    analysis = None if plan.sweep is not None else leg_analysis(
        [AnalysisLeg(figures=figs[leg.name], block=leg.block, treated=leg.treated)
         for leg in design], plan.verdict.confidence, plan.verdict.equivalence_pct,
        plan.record_confidence)
    found = findings(
        plan, results, outcomes, facts, figs,
        tuple(p for p in plan.pairs if set(p) <= set(results)),
        # A record needs FASTER at the record's own (higher) confidence.
        analysis.verdict if analysis else Verdict.UNDECIDED,
        analysis.record_verdict if analysis else None,
        found_label=f"verdict at {100 * plan.record_confidence:g} % confidence",
        more_reasons=component_reasons(facts.components), sweep_method=sweep_method)
    return _v3(plan, results, rows, attempts, idle_gaps, facts, found,
               attempt_counts(attempts, results), power, analysis)


def legs_run(plan: Plan, results: Mapping[str, LegResult]) -> tuple[DesignLeg, ...]:
    """The legs that ran, in design order: a sequential plan runs the blocks its stopping
    rule asked for (the legs given)."""
    return tuple(leg for leg in plan.design_legs if leg.name in results)


def figures(results: Mapping[str, LegResult], rows: Mapping[str, Sequence[RowRecord]]
            ) -> dict[str, LegFigures]:
    """Each leg's figures, as every analysis reads them."""
    return {name: leg_figures(results[name], rows[name]) for name in results}


def attempt_counts(attempts: Sequence[Mapping[str, Any]], results: Mapping[str, LegResult]
                   ) -> dict[str, int]:
    """How many times each leg was attempted (the state log's attempts)."""
    return {name: sum(1 for a in attempts if a.get("leg") == name) for name in results}


def findings(plan: Plan, results: Mapping[str, LegResult],
             outcomes: Mapping[str, Sequence[RowOutcome]], facts: EvidenceFacts,
             figs: Mapping[str, LegFigures], pair_names: tuple[tuple[str, str], ...],
             verdict: Verdict, for_record: Verdict | None, *, found_label: str,
             more_reasons: list[str], sweep_method: str | None) -> Findings:
    """What the legs say, given the verdict the record form's own analysis reached (and
    the one it reached for a record, None where none): the sequential and sweep sections
    overrule it, then the record gate reads it. `found_label` names that verdict in the
    gate's reasons; `more_reasons` come after the identity checks'."""
    design = legs_run(plan, results)
    pairs = {f"{c}_vs_{a}": pair_result(figs[c], figs[a], plan.criteria) for c, a in pair_names}
    seq = sequential_section(plan, design, figs)
    if seq is not None:  # the stopping rule's interval, valid after optional stopping
        verdict, for_record = seq.verdict, seq.record_verdict
    swept = sweep_section(plan, design, figs, results, sweep_method)
    if swept is not None:  # the best arm's, against control, family-wise
        verdict, for_record = sweep_verdicts(swept)
    # A sweep's record is the best arm's: its legs are the candidates the gate reads.
    gated = [leg for leg in design if leg.treated
             and (swept is None or results[leg.name].arm == swept.gate.chosen)]
    cross = cross_leg_exact({name: outcomes[name] for name in results})
    quality_ok = all(r.valid for r in results.values()) and cross.status is GateStatus.PASS
    identity_ok, identity_reasons = identity_across_legs(facts.leg_identity, list(results))
    gate = record_gate(
        [figs[leg.name] for leg in gated],
        [figs[leg.name] for leg in design if not leg.treated], list(pairs.values()), quality_ok,
        plan.prior.value_tok_s, for_record, plan.verdict.require_faster_for_record,
        claim=plan.design_spec.no_claim, found_label=found_label,
        more_reasons=identity_reasons + more_reasons + sweep_reasons(swept),
        pairs_required=swept is None,
    )
    # A sweep's headline is its best arm's (every non-control arm's when none is claimed).
    candidates = [results[leg.name] for leg in gated or [g for g in design if g.treated]]
    headline = min(candidates, key=lambda r: r.summary.tok_s_out
                   if r.summary.tok_s_out is not None else float("inf"))
    return Findings(design, pair_names, pairs, verdict, seq, swept, gate, cross, identity_ok,
                    headline)


def _v3(plan: Plan, results: Mapping[str, LegResult], rows: Mapping[str, Sequence[RowRecord]],
        attempts: Sequence[Mapping[str, Any]], idle_gaps: Mapping[str, float],
        facts: EvidenceFacts, f: Findings, tries: Mapping[str, int],
        power: Mapping[str, Any] | None, analysis: VerdictAnalysis | None
        ) -> ExperimentRecordV3:
    protocol = protocol_section(AbbaProtocolV2, plan, results, rows, idle_gaps,
                         design=plan.design.value, blocks=len({leg.block for leg in f.design}),
                         pairs=[f"{c}_vs_{a}" for c, a in f.pair_names],
                         max_blocks=plan.max_blocks)
    runs = {name: block.model_copy(update={"identity_sha256": (
        facts.leg_identity.get(name) or {}).get("identity_sha256")})
        for name, block in leg_blocks(results, facts, tries).items()}
    return ExperimentRecordV3(
        schema=SCHEMA_ABBA, experiment=plan.name, date=facts.date, status=record_status(f),
        plan_sha256=plan.sha256,
        prior_approved_record=PriorApprovedRecord(id=plan.prior.id, tok_s=plan.prior.value_tok_s),
        attempts=[Attempt.model_validate(a) for a in attempts],
        quality=quality_section(results, facts, f, tries).model_copy(
            update={"source_identity_passed_all_legs": f.identity_ok}),
        verdict=f.verdict, record_gate=whole(f.gate),
        metric_accounting=accounting(plan, f.headline),
        log_facts=log_facts(results),
        operational=operational(results, idle_gaps),
        reproducibility=reproducibility(facts.root).model_copy(update=portable_entries(facts)),
        source=_SOURCE.validate_python(facts.identity), hardware=hardware_section(facts, f),
        artifacts=AbbaArtifacts(root=facts.root, **artifact_entries(facts.documents_sha256)),
        submission=Empty(), treatment=arm_sections(plan),
        protocol=protocol.model_copy(update={"prefix_history_response_reuse": not (
            protocol.prompts_unique_per_leg and protocol.each_prompt_run_once
            and protocol.cached_tokens_all_zero)}),
        runs=runs, pair_results={k: whole(v) for k, v in f.pairs.items()},
        verdict_analysis=None if analysis is None else whole(analysis),
        power=None if power is None else PowerReport.model_validate(dict(power)),
        server_log_facts={name: server_log_facts(r) for name, r in results.items()},
        speculative=speculative_section(plan, facts),
        component_evidence=_COMPONENTS.validate_python({c["name"]: c for c in facts.components}),
        model=model_section(plan, facts),
        unchanged_record_stack=unchanged_stack(plan),
        prior_recheck=None if facts.prior_recheck is None
        else PriorRecheck.model_validate(facts.prior_recheck),
        noise_diagnostic=noise_section(plan, results),
        sequential=None if f.seq is None else whole(f.seq),
        # Every key, sweep.sequential included (null unless the sweep was sequential): v2
        # left it out, and record.migrate fills it for a v2 record.
        sweep=None if f.swept is None else SweepSection.model_validate(
            f.swept.model_dump(mode="json")),
    )


def record_status(f: Findings) -> Literal["strict_preregistered_record_pass", "no_record"]:
    return "strict_preregistered_record_pass" if f.gate.strict_preregistered_record_pass \
        else "no_record"


def arm_sections(plan: Plan) -> dict[str, Arm]:
    """The plan's arms as the record shows them (secret-looking values redacted)."""
    return {name: redacted_arm(arm) for name, arm in plan.all_arms.items()}


def hardware_section(facts: EvidenceFacts, f: Findings) -> Hardware | None:
    hw = facts.hardware[f.design[0].name]
    return None if hw is None else Hardware.model_validate(hw)


def protocol_section(cls: type[_P], plan: Plan, results: Mapping[str, LegResult],
              rows: Mapping[str, Sequence[RowRecord]], idle_gaps: Mapping[str, float],
              **more: Any) -> _P:
    legs = list(results.values())
    first = rows[next(name for name, _ in plan.legs if name in results)]
    return cls(
        order=[f"{name}-{arm}" for name, arm in plan.legs if name in results],
        fresh_service_per_leg=True, idle_gap_seconds_minimum=plan.idle_gap_s,
        # Keyed by leg: v1's keys are A1 B1 B2 A2, which validation checks.
        idle_gap_seconds_measured=cast("dict[Any, float]", dict(idle_gaps)),
        generation_warmup="none",
        prompt_count_per_leg=len(first),
        prompts_unique_per_leg=all(_ok(r, FRESH_UNIQUE_PROMPTS) for r in legs),
        each_prompt_run_once=all(_ok(r, ONE_SUITE_INVOCATION) and _ok(r, ZERO_RETRIES)
                                 for r in legs),
        cached_tokens_all_zero=all(_ok(r, CACHED_TOKENS_ZERO) for r in legs),
        single_active_generation=all(_ok(r, SINGLE_ACTIVE_GENERATION) for r in legs),
        max_tokens=max((row.trace.n_tokens for row in first), default=None),
        top_level_prompt_tokens_suite_median=_median_int([r.trace.prompt_tokens for r in first]),
        top_level_output_tokens_suite_median=_median_int([r.trace.n_tokens for r in first]),
        metric=plan.metric, headline_convention=plan.headline,
        headline_formula=FORMULAS[plan.headline], fifth_run_permitted=False, **more,
    )


def quality_section(results: Mapping[str, LegResult], facts: EvidenceFacts, f: Findings,
             tries: Mapping[str, int]) -> AbbaQuality:
    legs = list(results.values())
    all_valid = all(r.valid for r in legs)
    return AbbaQuality(
        all_legs_teacher_exact=_summed(legs, TEACHER_EXACT),
        all_legs_cross_exact=f.cross.status is GateStatus.PASS, cross_leg_exact=whole(f.cross),
        all_legs_cached_zero=_summed(legs, CACHED_TOKENS_ZERO),
        full_output_then_next_exact=_summed(legs, FULL_OUTPUT_THEN_NEXT),
        long_then_next_exact=_summed(legs, LONG_CONTEXT_THEN_NEXT),
        rollover_exact=_summed(legs, ROLLOVER),
        token_count_integrity=_summed(legs, TOKEN_COUNT_INTEGRITY),
        cleanup_passed_all_legs=all(_ok(r, CLEANUP) for r in legs),
        idle_before_and_after_all_legs=all(_ok(r, IDLE_BEFORE) and _ok(r, IDLE_AFTER)
                                           for r in legs),
        same_hardware_all_legs=len({json.dumps(h, sort_keys=True)
                                    for h in facts.hardware.values()}) == 1,
        all_legs_valid=all_valid, retries=sum(max(0, n - 1) for n in tries.values()),
        full_abba_causal_pass=all_valid and f.cross.status is GateStatus.PASS
        and f.gate.pairs_passed,
    )


def leg_blocks(results: Mapping[str, LegResult], facts: EvidenceFacts, tries: Mapping[str, int]
          ) -> dict[str, LegBlock]:
    return {name: _leg_block(r, tries[name], facts) for name, r in results.items()}


def _leg_block(result: LegResult, attempts: int, facts: EvidenceFacts) -> LegBlock:
    s, e = result.summary, result.engine
    exact = _gate(result, TEACHER_EXACT)
    return LegBlock(
        treatment=result.arm, attempts=attempts, headline_tok_s=s.tok_s_out,
        p10_tok_s=s.tok_s_out_p10, mean_tok_s=s.tok_s_out_mean, stdev_tok_s=s.tok_s_out_stdev,
        full_after_ttft_median_tok_s=s.tok_s_full_after_ttft_median,
        wall_full_median_tok_s=s.tok_s_wall_full_median, ttft_median_ms=s.ttft_ms_median,
        conventional_tok_s=s.tok_s_out_conventional,
        legacy_inclusive_events_tok_s=s.tok_s_out_legacy,
        chunk_aware_tok_s=s.tok_s_out_chunk_aware,
        quantisation_bound_pct=s.quantisation_bound_pct_max,
        # Engine counter deltas under the seeds' names (None where not exposed).
        draft_cycles=e.draft_cycles if e else None, draft_tokens=e.draft_tokens if e else None,
        accepted_draft_tokens=e.accepted_draft_tokens if e else None,
        draft_acceptance_rate=e.draft_acceptance_rate if e else None,
        emitted_tokens_per_draft_cycle=e.emitted_tokens_per_draft_cycle if e else None,
        aggregate_cycle_ms=e.aggregate_cycle_ms if e else None,
        teacher_exact=exact.count if exact and exact.status is not GateStatus.NOT_TESTED
        and exact.count is not None else "not tested",
        teacher_exact_compared_by=_compared_by(exact), valid=result.valid,
        gates={g.name: GateSummary(status=g.status, count=g.count) for g in result.gates},
        warnings=list(s.warnings),
        telemetry=None if result.telemetry is None else TelemetrySummary.model_validate(
            result.telemetry.model_dump(mode="json", by_alias=True)),
        evidence_sha256=_EVIDENCE.validate_python(facts.evidence_sha256[result.name]),
        run_dir=result.run_dir,
    )


def _median_int(values: Sequence[int | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def _summed(results: Sequence[LegResult], name: str) -> str:
    """'52/52' over legs; 'not tested' when no leg tested it; a failing leg shows in the count."""
    ok = total = 0
    tested = False
    for r in results:
        g = _gate(r, name)
        if g is None or g.status is GateStatus.NOT_TESTED or not g.count or "/" not in g.count:
            continue
        tested = True
        a, b = g.count.split("/")
        ok, total = ok + int(a), total + int(b)
    return f"{ok}/{total}" if tested else "not tested"


def _compared_by(gate: GateResult | None) -> str | None:
    """How a leg's teacher-exact rows were compared, in words (None: not tested)."""
    if gate is None or gate.status is GateStatus.NOT_TESTED or gate.count is None:
        return None
    rows = gate.count.split("/")[-1]
    return compared_by_phrase(gate.evidence, int(rows)) if rows.isdigit() else None
