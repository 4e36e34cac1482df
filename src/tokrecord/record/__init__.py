"""Records: the results of an experiment, in the form of the seed records.

`abba_record` and `single_leg_record` are pure: they take the plan, the legs'
results and rows, what the experiment log says (attempts, idle gaps) and the
facts read from the evidence (`EvidenceFacts`: each leg's hardware and file
hashes, the identity summary, the date), and return the record as its model
(record.schema). Reading those facts, and dumping the model to the JSON document, is
`record.build`'s job. The hashes of each leg's evidence files are included so the record
points at exactly what it was computed from.

The sections both forms share are built here, each as its record.schema model, so mypy
checks their fields where they are built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from tokrecord.evidence import layout
from tokrecord.evidence.redact import redact_argv, redact_env
from tokrecord.experiment.interim import sequential_analysis
from tokrecord.experiment.leg import CLOCK_SOURCE, LegResult
from tokrecord.experiment.noise import NoiseDiagnostic, legs_in_order, noise_diagnostic
from tokrecord.experiment.plan import (
    Arm,
    DesignLeg,
    Plan,
    speculative_configs,
)
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.stats import (
    AnalysisLeg,
    LegFigures,
    Verdict,
)
from tokrecord.experiment.sweep import (
    SWEEP_METHOD,
    SweepLegInput,
    SweepSection,
    sweep_analysis,
    sweep_record_gate,
)
from tokrecord.experiment.sweep_sequential import sequential_sweep
from tokrecord.gates import (
    TEACHER_EXACT,
    TREATMENT_ATTESTATION,
    GateResult,
    GateStatus,
)
from tokrecord.jsontypes import JSONObject
from tokrecord.metrics import FORMULAS, Convention
from tokrecord.metrics.rows import LegSummary
from tokrecord.record.schema import (
    Accounting,
    HeadlineAccounting,
    LegOperational,
    LogFact,
    LogFactFound,
    ModelSection,
    Operational,
    Reproducibility,
    SpeculativeSection,
    UnchangedStack,
)


class EvidenceFacts(BaseModel):
    """What a record states about its evidence, read by record.build."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    date: str  # YYYY-MM-DD, UTC
    root: str  # the experiment directory as given
    identity: dict[str, Any]  # identity_summary(); {} without identity.json
    hardware: dict[str, JSONObject | None]  # per leg: its hardware.json, as read
    evidence_sha256: dict[str, dict[str, str]]  # per leg: file name -> sha256
    # Per arm, identity.json's draft model identity (path, manifest sha256, revision).
    drafts: dict[str, JSONObject] = {}
    # Per leg, identity collected again just before it (the state log's leg_identity).
    leg_identity: dict[str, JSONObject] = {}
    # The exactness documents written with the record: file name -> sha256.
    documents_sha256: dict[str, str] = {}
    # The portable manifests written at preregistration: path -> sha256.
    portable_sha256: dict[str, str] = {}
    # The plan's components, computed from their sealed copies (experiment.components).
    components: list[dict[str, Any]] = []
    # The prior's recheck on the public API at preregistration (prior-check.json).
    prior_recheck: dict[str, Any] | None = None


def _gate(result: LegResult, name: str) -> GateResult | None:
    return next((g for g in result.gates if g.name == name), None)


def sweep_section(plan: Plan, design: Sequence[DesignLeg], figs: Mapping[str, LegFigures],
                  results: Mapping[str, LegResult], method: str | None = None
                  ) -> SweepSection | None:
    """A sweep's analysis (experiment.sweep) and its strict gate; None for other designs.
    An arm is exact when its legs' teacher-exact gates passed against the one teacher."""
    if plan.sweep is None:
        return None
    legs = [SweepLegInput(figures=figs[leg.name], block=leg.block,
                          exact=_ok(results[leg.name], TEACHER_EXACT)) for leg in design]
    looks = None
    if plan.sequential is not None:  # the analysis at the look where the rule stopped
        looks, analysis = sequential_sweep(
            legs, tuple(plan.all_arms), plan.control_arm, plan.sequential,
            plan.verdict.confidence, plan.record_confidence, plan.verdict.equivalence_pct)
    else:
        analysis = sweep_analysis(legs, tuple(plan.all_arms), plan.control_arm,
                                  plan.verdict.confidence, plan.verdict.equivalence_pct,
                                  plan.record_confidence, method=method or SWEEP_METHOD)
    passed = {leg.name: results[leg.name].valid for leg in design}
    return SweepSection(analysis=analysis, sequential=looks,
                        gate=sweep_record_gate(analysis, passed, plan.prior.value_tok_s))


def sweep_verdicts(section: SweepSection) -> tuple[Verdict, Verdict | None]:
    """The verdict of the claimed best arm against control (UNDECIDED with no claim), at
    the verdict's and the record's confidence, both simultaneous over the arms."""
    a = section.analysis
    found = next((c for c in a.contrasts if c.arm == a.best), None)
    if found is None:
        return Verdict.UNDECIDED, None
    return found.verdict, Verdict.FASTER if found.record_ci_low > 1 else Verdict.UNDECIDED


def sweep_reasons(section: SweepSection | None) -> list[str]:
    return [] if section is None else list(section.gate.reasons)


def noise_section(plan: Plan, results: Mapping[str, LegResult]) -> NoiseDiagnostic | None:
    """The noise diagnostic (experiment.noise) over the legs in run order; None where a
    leg carries no covariates (evidence from before issue 33: the report recomputes it)."""
    order = [name for name, _ in plan.legs if name in results]
    if not order or any(results[n].covariates is None for n in order):
        return None
    diag = noise_diagnostic(legs_in_order(
        order, {n: results[n].arm for n in order},
        {n: results[n].summary.tok_s_out for n in order},
        {n: results[n].covariates for n in order}))
    # Every field given (the record's dump keeps only the fields given), as the record held it.
    return NoiseDiagnostic.model_validate(diag.model_dump(mode="json", by_alias=True))


def sequential_section(plan: Plan, design: Sequence[DesignLeg],
                       figs: Mapping[str, LegFigures]) -> SequentialAnalysis | None:
    """A sequential plan's looks and decision, from the legs run (None for a fixed plan)."""
    if plan.sequential is None or plan.sweep is not None:  # a sweep's looks: its section
        return None
    return sequential_analysis(plan, [AnalysisLeg(figures=figs[leg.name], block=leg.block,
                                                  treated=leg.treated) for leg in design])


def model_section(plan: Plan, facts: EvidenceFacts) -> ModelSection:
    """The target model as served and identified, and the draft the candidate names."""
    specs = speculative_configs(plan)
    arm = "candidate" if specs.get("candidate") else next(
        (a for a, c in specs.items() if c is not None), None)
    draft = (facts.drafts.get(arm) or {}) if arm else {}
    spec = specs.get(arm) if arm else None
    return ModelSection(target=plan.server.model,
                        target_manifest_sha256=facts.identity.get("model_manifest_sha256"),
                        target_revision=facts.identity.get("model_revision"),
                        draft=spec.draft_model if spec else None,
                        draft_manifest_sha256=draft.get("manifest_sha256"),
                        draft_revision=draft.get("revision"))


def redacted_arm(arm: Arm) -> Arm:
    """An arm as the record shows it: secret-looking env and flag values redacted (every
    field given, as the record held it)."""
    out = arm.model_dump(mode="json")
    out["env"] = redact_env(out.get("env") or {})
    out["extra_args"] = redact_argv(out.get("extra_args") or [])
    return Arm.model_validate(out)


def unchanged_stack(plan: Plan) -> UnchangedStack:
    """What every arm shares: the base server's argv and environment (the arms add theirs)."""
    return UnchangedStack(argv=redact_argv(plan.server.argv), env=redact_env(plan.server.env))


def component_reasons(components: Sequence[Mapping[str, Any]]) -> list[str]:
    """Record-gate reasons: a declared component whose own gate failed (its check is not
    exact, or its traces do not show it) is no evidence for the candidate."""
    return [f"component {c['name']}: " + "; ".join(c.get("gate_reasons") or ["gate failed"])
            for c in components if not c.get("gate_passed")]


def portable_entries(facts: EvidenceFacts) -> dict[str, str | None]:
    """Where the portable model manifest and runtime lock are, with their sha256."""
    out: dict[str, str | None] = {}
    for key, path in (("portable_model_manifest", layout.MODEL_MANIFEST),
                      ("runtime_lock", layout.RUNTIME_LOCK)):
        sha = facts.portable_sha256.get(path)
        out[key] = path if sha else None
        out[f"{key}_sha256"] = sha
    return out


def identity_across_legs(checks: Mapping[str, Mapping[str, Any]], legs: Sequence[str]
                         ) -> tuple[bool | None, list[str]]:
    """Whether every leg ran on the preregistered identity (None: the state log predates
    the check), and a record-gate reason naming what changed before each leg that did not."""
    if not any(name in checks for name in legs):
        return None, []
    reasons = []
    for name in legs:
        check = checks.get(name)
        if check is None:
            reasons.append(f"leg {name}: identity was not checked before it")
        elif not check.get("matches_preregistered"):
            changed = ", ".join(check.get("changed") or []) or "?"
            reasons.append(f"leg {name}: the identity changed since preregistration ({changed})")
    return not reasons, reasons


def speculative_section(plan: Plan, facts: EvidenceFacts) -> dict[str, SpeculativeSection | None]:
    """Per arm, its speculative decoding as the server argv configures it, and the draft
    model's bytes (identity.json) when it is a local path; None for a plain arm."""
    out: dict[str, SpeculativeSection | None] = {}
    for arm, config in speculative_configs(plan).items():
        if config is None:
            out[arm] = None
            continue
        draft = facts.drafts.get(arm) or {}
        out[arm] = SpeculativeSection(
            method=config.method, num_speculative_tokens=config.num_speculative_tokens,
            draft_model=config.draft_model, draft_sample_method=config.draft_sample_method,
            rejection_sample_method=config.rejection_sample_method, source=config.source,
            notes=list(config.notes), draft_manifest_sha256=draft.get("manifest_sha256"),
            draft_revision=draft.get("revision"))
    return out


def server_log_facts(result: LegResult) -> dict[str, LogFactFound]:
    """The leg's log facts by name: value, lines found, and the value per rank."""
    return {f.name: LogFactFound(value=f.value, found=f.found, per_rank=f.per_rank)
            for f in result.log_facts}


def log_facts(results: Mapping[str, LegResult]) -> dict[str, list[LogFact]]:
    """Per leg, what the server log supports: a claim is made only when its rule holds."""
    out: dict[str, list[LogFact]] = {}
    for name, result in results.items():
        gate = _gate(result, TREATMENT_ATTESTATION)
        claims = gate.evidence.get("claims", []) if gate else []
        out[name] = [LogFact(claim=c["claim"], holds=c["holds"], statement=c["statement"])
                     for c in claims]
    return out


def operational(results: Mapping[str, LegResult], idle_gaps: Mapping[str, float]
                ) -> Operational:
    legs = {}
    for name, r in results.items():
        c = r.cleanup
        legs[name] = LegOperational(
            idle_gap_before_seconds=idle_gaps.get(name),
            # The seeds' names: how long each idle gate took, and how many snapshots.
            prestart_idle_seconds=r.idle_before.seconds if r.idle_before else None,
            poststop_idle_seconds=r.idle_after.seconds if r.idle_after else None,
            prestart_idle_snapshots=r.idle_before.snapshots if r.idle_before else None,
            poststop_idle_snapshots=r.idle_after.snapshots if r.idle_after else None,
            idle_passed=bool(r.idle_before and r.idle_before.passed
                             and r.idle_after and r.idle_after.passed),
            server_ready_seconds=r.ready_seconds,
            cleanup_passed=r.cleanup_passed,
            surviving_workers=c.surviving_workers if c else None,
            port_listener_after_run=c.port_listening_after if c else None,
            stop_seconds=c.stop_seconds if c else None,
            sigkill_sent=c.sigkill_sent if c else None,
        )
    # finish() seals the directory right after the record is written.
    return Operational(legs=legs, artifact_sealed_read_only=True)


def reproducibility(root: str) -> Reproducibility:
    """How the evidence is checked and reproduced (the current forms add where the
    portable manifests are: `portable_entries`; a v1 record has no such keys)."""
    return Reproducibility(
        portable_sealed_evidence=root,
        identity=layout.IDENTITY,
        verify=f"tokrecord verify {root}",
        artifact_exact_scope="the originating host with byte-identical environments "
        "(runtime locks and native module hashes in identity.json)",
        source_rebuild_scope="a new environment must pass every semantic, teardown and "
        "performance gate again; a re-run is a new experiment",
    )


def convention_figures(plan: Plan, summary: LegSummary) -> Accounting:
    """What every record's accounting says of its headline leg: both per-token conventions
    and the chunk-aware rate, and the clock they were read from (each form's accounting
    model adds its own fields to these: `accounting`, record.single)."""
    return Accounting(
        published_convention=plan.headline,
        published_formula=FORMULAS[plan.headline],
        published_value_tok_s=summary.tok_s_out,
        timestamped_events=100,
        inter_token_intervals=99,
        conventional_interval_formula=FORMULAS[Convention.CONVENTIONAL],
        conventional_interval_value_tok_s=summary.tok_s_out_conventional,
        legacy_inclusive_events_value_tok_s=summary.tok_s_out_legacy,
        chunk_aware_value_tok_s=summary.tok_s_out_chunk_aware,
        quantisation_bound_pct=summary.quantisation_bound_pct_max,
        clock=CLOCK_SOURCE,
    )


def accounting(plan: Plan, headline: LegResult) -> HeadlineAccounting:
    """The experiment's accounting: its headline leg's, with a qualification whenever the
    published convention is not the conventional one."""
    s = headline.summary
    head = plan.headline.value
    return HeadlineAccounting(
        headline_leg=headline.name,
        **dict(convention_figures(plan, s)),
        qualification="" if head == "conventional" else (
            f"published in the {head} convention; the conventional 99-interval value is "
            f"{s.tok_s_out_conventional} tok/s"),
    )


def _ok(result: LegResult, gate: str) -> bool:
    g = _gate(result, gate)
    return g is not None and g.status is GateStatus.PASS
