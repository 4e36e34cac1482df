"""Engine counters from a Prometheus /metrics scrape, and their deltas over a suite.

Each engine names its counters differently; its adapter passes a `MetricNames`
(vLLM's v1 names are the default). Counters are summed over label sets (one per
model or engine index), so a multi-engine server still yields one figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict

from tokrecord.errors import StreamError

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"

COUNTERS = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, PREFIX_HITS, PREFIX_QUERIES)


@dataclass(frozen=True)
class MetricNames:
    """One engine's /metrics names for what tokrecord reads; None: not exposed."""

    spec_drafts: str | None = None
    spec_draft_tokens: str | None = None
    spec_accepted: str | None = None
    spec_accepted_per_position: str | None = None
    prefix_hits: str | None = None
    prefix_queries: str | None = None
    # Counters that are non-zero once the server has generated anything (the
    # no-warmup gate reads them before row 0).
    generation: tuple[str, ...] = ()
    # Counters an engine writes only once incremented, each with a witness from the same
    # collector: when the witness is there, the counter's absence means zero; without
    # the witness it means "not exposed".
    absent_means_zero: tuple[tuple[str, str], ...] = ()


VLLM_METRICS = MetricNames(
    spec_drafts=SPEC_DRAFTS, spec_draft_tokens=SPEC_DRAFT_TOKENS, spec_accepted=SPEC_ACCEPTED,
    spec_accepted_per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    prefix_hits=PREFIX_HITS, prefix_queries=PREFIX_QUERIES,
    generation=("vllm:request_success_total", "vllm:generation_tokens_total"),
)


def parse_counters(text: str) -> dict[str, float]:
    """Sum every counter/untyped sample by name; `_created` timestamps are skipped."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "untyped", "gauge"):
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise StreamError(f"cannot parse the server's /metrics text: {exc}") from exc
    return totals


def timing_histograms(text: str) -> dict[str, float]:
    """The engine's own timing histograms in a scrape: ``<name>_sum`` and ``<name>_count``
    of every histogram or summary measured in seconds (vLLM's ``vllm:e2e_request_latency_seconds``,
    ``vllm:time_to_first_token_seconds``, ...), summed over label sets; buckets left out."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type not in ("histogram", "summary") or not family.name.endswith("_seconds"):
                continue
            for sample in family.samples:
                if sample.name in (family.name + "_sum", family.name + "_count"):
                    totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise StreamError(f"cannot parse the server's /metrics text: {exc}") from exc
    return totals


def histogram_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before for every timing series both scrapes carry and the suite moved."""
    return {k: after[k] - before[k] for k in sorted(after) if k in before and after[k] != before[k]}


class SpeculativeCounters(BaseModel):
    """Speculative-decoding deltas over one suite under the seeds' names (records carry
    them per leg); None where the engine does not expose the counter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft_cycles: int | None
    draft_tokens: int | None
    accepted_draft_tokens: int | None
    draft_acceptance_rate: float | None
    emitted_tokens_per_draft_cycle: float | None
    aggregate_cycle_ms: float | None


class EngineCounters(SpeculativeCounters):
    """Every counter delta over one suite; None where the engine does not expose it."""

    prefix_cache_hits: int | None
    prefix_cache_queries: int | None


def _delta(before: Mapping[str, float], after: Mapping[str, float],
           name: str | None, names: MetricNames | None = None) -> int | None:
    if name is not None and name not in after and names is not None:
        witness = dict(names.absent_means_zero).get(name)
        if witness is not None and witness in after:
            return 0
    if name is None or name not in after:
        return None
    return round(after[name] - before.get(name, 0.0))


def acceptance_rate(accepted: int, draft_tokens: int) -> float | None:
    return accepted / draft_tokens if draft_tokens else None


def emitted_per_cycle(accepted: int, cycles: int) -> float | None:
    # Each verify cycle emits its accepted drafts plus one token of its own.
    return (accepted + cycles) / cycles if cycles else None


def aggregate_cycle_ms(decode_seconds_per_row: Sequence[float], cycles: int) -> float | None:
    """1000 * sum over rows of (t_{n-1} - t_0) / cycles."""
    return 1000.0 * sum(decode_seconds_per_row) / cycles if cycles else None


def engine_counters(
    before: Mapping[str, float],
    after: Mapping[str, float],
    decode_seconds_per_row: Sequence[float],
    names: MetricNames = VLLM_METRICS,
) -> EngineCounters:
    cycles = _delta(before, after, names.spec_drafts, names)
    drafts = _delta(before, after, names.spec_draft_tokens, names)
    accepted = _delta(before, after, names.spec_accepted, names)
    return EngineCounters(
        draft_cycles=cycles,
        draft_tokens=drafts,
        accepted_draft_tokens=accepted,
        draft_acceptance_rate=(
            acceptance_rate(accepted, drafts) if accepted is not None and drafts else None
        ),
        emitted_tokens_per_draft_cycle=(
            emitted_per_cycle(accepted, cycles) if accepted is not None and cycles else None
        ),
        aggregate_cycle_ms=(
            aggregate_cycle_ms(decode_seconds_per_row, cycles) if cycles else None
        ),
        prefix_cache_hits=_delta(before, after, names.prefix_hits, names),
        prefix_cache_queries=_delta(before, after, names.prefix_queries, names),
    )
