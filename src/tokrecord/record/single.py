"""The single-leg record (``tokrecord.single-leg-record/v2``), built as its model
(record.schema.SingleLegRecord): mypy checks every section's fields when it is built,
instead of validation finding a misspelt key when the record is written.

The sections every record form shares are built, as their models, in record/__init__.py;
this module builds the single-leg form's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from pydantic import TypeAdapter

from tokrecord.evidence import layout
from tokrecord.evidence.redact import redact_argv, redact_env
from tokrecord.experiment.leg import LegResult
from tokrecord.experiment.plan import ArmName, Plan, speculative_configs
from tokrecord.experiment.stats import pct_delta
from tokrecord.gates import TREATMENT_ATTESTATION
from tokrecord.probes.telemetry import TelemetrySummary
from tokrecord.record import (
    EvidenceFacts,
    component_reasons,
    convention_figures,
    identity_across_legs,
    log_facts,
    model_section,
    operational,
    portable_entries,
    reproducibility,
    server_log_facts,
    speculative_section,
    unchanged_stack,
)
from tokrecord.record.exactness import artifact_entries
from tokrecord.record.ids import SCHEMA_SINGLE
from tokrecord.record.schema import (
    Attempt,
    ComponentEvidence,
    Empty,
    GateDetail,
    GraphFacts,
    Hardware,
    MetricAccounting,
    PriorRecheck,
    SingleArtifacts,
    SingleFigures,
    SingleHashes,
    SingleLegRecord,
    SingleSummary,
    SingleTreatment,
    Source,
    SpeculativeSection,
)


def single_leg_record(
    plan: Plan, result: LegResult, attempts: Sequence[Mapping[str, Any]], facts: EvidenceFacts
) -> SingleLegRecord:
    """The seeds/single-leg-record.json form: value, goal, prior approved, prior best
    (record.build writes the keys each section was given, none it was not)."""
    value = result.summary.tok_s_out
    beats = value is not None and plan.prior.value_tok_s is not None \
        and value > plan.prior.value_tok_s
    identity_ok, identity_reasons = identity_across_legs(facts.leg_identity, [result.name])
    blockers = identity_reasons + component_reasons(facts.components)
    passed = result.valid and beats and not blockers
    hw = facts.hardware[result.name]
    return SingleLegRecord(
        schema=SCHEMA_SINGLE, date=facts.date, status="record_pass" if passed else "no_record",
        plan_sha256=plan.sha256, metric=plan.metric, metric_accounting=_accounting(plan, result),
        record=_figures(plan, result), summary=_summary(result),
        quality={g.name: GateDetail(status=g.status, count=g.count, reason=g.reason)
                 for g in result.gates},
        valid=result.valid, record_blockers=blockers,
        identity_sha256=(facts.leg_identity.get(result.name) or {}).get("identity_sha256"),
        source_identity_passed=identity_ok,
        attempts=[Attempt.model_validate(a) for a in attempts],
        treatment=treatment_section(plan, result, facts),
        model=model_section(plan, facts),
        unchanged_record_stack=unchanged_stack(plan),
        prior_recheck=None if facts.prior_recheck is None
        else PriorRecheck.model_validate(facts.prior_recheck),
        component_evidence=_COMPONENTS.validate_python({c["name"]: c for c in facts.components}),
        log_facts=log_facts({"B1": result}),
        server_log_facts=server_log_facts(result),
        graph=graph_facts(result),
        speculative=_SPECULATIVE.validate_python(speculative_section(plan, facts)),
        operational=operational({"B1": result}, {}),
        reproducibility=reproducibility(facts.root).model_copy(update=portable_entries(facts)),
        sha256=_hashes(result, facts), source=_SOURCE.validate_python(facts.identity),
        hardware=None if hw is None else Hardware.model_validate(hw),
        # Every field given, as the leg wrote it (the dump keeps only the fields given).
        telemetry=None if result.telemetry is None else TelemetrySummary.model_validate(
            result.telemetry.model_dump(mode="json", by_alias=True)),
        artifacts=SingleArtifacts(root=facts.root, run_dir=result.run_dir,
                                  **artifact_entries(facts.documents_sha256)),
        submission=Empty(),
    )


_SOURCE: TypeAdapter[Any] = TypeAdapter(Source)
_COMPONENTS = TypeAdapter(dict[str, ComponentEvidence])
_SPECULATIVE = TypeAdapter(dict[ArmName, SpeculativeSection | None])


def _accounting(plan: Plan, result: LegResult) -> MetricAccounting:
    conv, goal = result.summary.tok_s_out_conventional, plan.prior.goal_tok_s
    return MetricAccounting(
        **dict(convention_figures(plan, result.summary)), conventional_goal_tok_s=goal,
        conventional_margin_to_goal_tok_s=conv - goal if conv is not None and goal else None,
    )


def _figures(plan: Plan, result: LegResult) -> SingleFigures:
    value, prior, head = result.summary.tok_s_out, plan.prior, plan.headline.value

    def delta(ref: float | None) -> tuple[float | None, float | None]:
        if value is None or ref is None:
            return None, None
        return value - ref, pct_delta(value, ref)

    d_prior, d_prior_pct = delta(prior.value_tok_s)
    d_best, d_best_pct = delta(prior.best_exact_tok_s)
    return SingleFigures(
        value_tok_s=value,
        value_qualification="" if head == "conventional" else
        f"published {head} convention; conventional 99-interval value is "
        f"{result.summary.tok_s_out_conventional} tok/s",
        goal_tok_s=prior.goal_tok_s,
        margin_over_goal_tok_s=value - prior.goal_tok_s
        if value is not None and prior.goal_tok_s else None,
        prior_approved_tok_s=prior.value_tok_s, prior_approved_id=prior.id,
        delta_vs_approved_tok_s=d_prior, delta_vs_approved_pct=d_prior_pct,
        prior_best_exact_tok_s=prior.best_exact_tok_s,
        delta_vs_prior_best_exact_tok_s=d_best, delta_vs_prior_best_exact_pct=d_best_pct,
    )


def _summary(result: LegResult) -> SingleSummary:
    s, e = result.summary, result.engine
    return SingleSummary(
        tok_s_out=s.tok_s_out, tok_s_out_p10=s.tok_s_out_p10, tok_s_out_mean=s.tok_s_out_mean,
        tok_s_out_stdev=s.tok_s_out_stdev,
        tok_s_full_after_ttft_median=s.tok_s_full_after_ttft_median,
        tok_s_wall_full_median=s.tok_s_wall_full_median, ttft_ms_median=s.ttft_ms_median,
        # Engine counter deltas under the seeds' names (None where not exposed).
        draft_cycles=e.draft_cycles if e else None,
        draft_tokens=e.draft_tokens if e else None,
        accepted_draft_tokens=e.accepted_draft_tokens if e else None,
        draft_acceptance_rate=e.draft_acceptance_rate if e else None,
        emitted_tokens_per_draft_cycle=e.emitted_tokens_per_draft_cycle if e else None,
        aggregate_cycle_ms=e.aggregate_cycle_ms if e else None,
    )


def _hashes(result: LegResult, facts: EvidenceFacts) -> SingleHashes:
    hashes: dict[str, str | None] = {
        **facts.evidence_sha256[result.name],
        "exactness": facts.documents_sha256.get(layout.ALL_VS_TEACHER),
        "identity": facts.identity.get("identity_sha256"),
        "model_release_manifest": facts.portable_sha256.get(layout.MODEL_MANIFEST),
        "runtime_lock": facts.portable_sha256.get(layout.RUNTIME_LOCK)}
    return TypeAdapter(SingleHashes).validate_python(hashes)


def treatment_section(plan: Plan, result: LegResult, facts: EvidenceFacts) -> SingleTreatment:
    """The single-leg seed's treatment: what was switched on, whether the target stayed
    the preregistered one, and every claim and fact the server log supports, each with
    the log evidence or the reason it is not claimed."""
    arm = plan.arms[result.arm]  # type: ignore[index]
    selector = " ".join([*(f"{k}={v}" for k, v in sorted(redact_env(arm.env).items())),
                         *redact_argv(arm.extra_args)]) or "(none: the base server)"
    check = facts.leg_identity.get(result.name) or {}
    changed = check.get("changed")
    gate = next((g for g in result.gates if g.name == TREATMENT_ATTESTATION), None)
    claims = {c["claim"]: True if c["holds"] else c["statement"]
              for c in (gate.evidence.get("claims", []) if gate else [])}
    spec = speculative_configs(plan).get(result.arm)
    return SingleTreatment(
        # A leg's arm is a plain str; the model checks it is one of the plan's two.
        arm=cast(ArmName, result.arm),
        selector=selector,
        description=arm.description,
        # The model's bytes are in identity: unchanged when the check before the leg found
        # the preregistered model (None when no check ran).
        target_unchanged=None if changed is None else "model" not in changed,
        claims=claims,
        log_facts={f.name: f.value for f in result.log_facts if f.found},
        log_facts_per_rank={f.name: f.per_rank for f in result.log_facts
                            if f.found and f.per_rank},
        num_speculative_tokens=spec.num_speculative_tokens if spec else None,
        draft_sample_method=spec.draft_sample_method if spec else None,
        rejection_sample_method=spec.rejection_sample_method if spec else None,
    )


def graph_facts(result: LegResult) -> GraphFacts:
    """The seeds' graph section, from the engine's log facts. What no fact reports stays
    None and is listed in not_reported, never guessed."""
    facts = {f.name: f for f in result.log_facts}

    def logged(name: str) -> Any:
        fact = facts.get(name)
        return fact.value if fact is not None and fact.found else None

    captures = facts.get("graph_captures")
    graph = GraphFacts(
        mode=logged("compilation_mode"), cudagraph_mode=logged("cudagraph_mode"),
        capture_sizes=logged("cudagraph_capture_sizes"),
        max_capture_size=logged("max_cudagraph_capture_size"),
        graphs_reused=logged("graphs_reused"),
        # A rank that captured graphs logs "Graph capturing finished" once.
        rank_captures=(sum(1 for n in captures.per_rank.values() if n)
                       if captures is not None else None),
        # No engine logs these yet.
        graphs_per_rank=None, eager_breaks_per_rank=None, rank_replays=None,
        not_reported=[])
    return graph.model_copy(update={"not_reported": sorted(
        k for k, v in graph.model_dump().items() if v is None)})
