"""What a report shows, as one immutable value.

`load.load_report` builds a ReportData from a record directory (the only part of
the report that reads files); the terminal, markdown and HTML renderers are pure
functions of it. Everything here is already reduced for display: per-token data
is downsampled and histogrammed, so the value is small whatever the legs' size,
and the same directory always gives the same value (no clock, no absolute path).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.experiment.leg import LegStatus
from tokrecord.experiment.noise import NoiseDiagnostic
from tokrecord.gates import GateStatus

SCHEMA_REPORT: Final = "tokrecord.report-data/v1"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Kind(StrEnum):
    # An ABBA or A/A experiment: record.json of tokrecord.experiment-record/v1 or /v2
    # (ReportData.design tells A/A apart).
    ABBA = "abba"
    SINGLE = "single"  # a single-design experiment: tokrecord.single-leg-record/v2 (or v1)
    LEG = "leg"  # one sealed leg directory (summary.json, no record)


class Fact(_Frozen):
    """A labelled value, already formatted."""

    label: str
    value: str


class RowView(_Frozen):
    row: int
    row_id: str
    n_tokens: int
    ttft_ms: float | None
    rate: float | None  # in the leg's headline convention
    rate_conventional: float | None
    rate_legacy: float | None
    rate_chunk_aware: float | None
    chunks: int
    multi_token_chunks: int
    max_chunk_tokens: int
    max_gap_ms: float | None
    flags: tuple[str, ...] = ()


class Timeline(_Frozen):
    """One row of one leg: tokens received against time since the request was sent."""

    leg: str
    arm: str
    row: int
    row_id: str
    n_tokens: int
    chunks: int
    multi_token_chunks: int
    ttft_ms: float | None
    t_ms: tuple[float, ...]  # arrival of each kept chunk
    tokens: tuple[int, ...]  # tokens received up to and including that chunk
    sizes: tuple[int, ...]  # tokens in that chunk
    window_ms: tuple[float, float] | None  # arrivals of tokens 1 and 100 (the headline window)
    downsampled: bool = False


class Intervals(_Frozen):
    """Inter-token intervals of one leg, over every row: t_k - t_(k-1) for k >= 1.

    Tokens of one chunk share its arrival time, so a speculative burst of K tokens
    shows as K-1 zero intervals (`same_chunk`); the histogram holds the others."""

    intervals: int
    same_chunk: int
    median_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    edges_ms: tuple[float, ...]  # log-spaced, shared by every leg of a report
    counts: tuple[int, ...]  # non-zero intervals per bin (len(edges) - 1)


class Speculative(_Frozen):
    """Engine counter deltas over the suite; per position when the engine exposes it."""

    draft_cycles: int | None
    draft_tokens: int | None
    accepted_draft_tokens: int | None
    acceptance_rate: float | None
    emitted_per_cycle: float | None
    aggregate_cycle_ms: float | None
    accepted_per_position: tuple[int, ...] | None = None


class PowerSeries(_Frozen):
    label: str
    t_s: tuple[float, ...]  # seconds since the leg's first request was sent
    power_w: tuple[float, ...]


class TelemetryView(_Frozen):
    samples: int
    series: tuple[PowerSeries, ...]
    window_s: tuple[float, float] | None  # the suite window on the same axis
    facts: tuple[Fact, ...] = ()  # the leg's own telemetry summary, when it has one


class GateView(_Frozen):
    name: str
    status: GateStatus
    count: str | None
    required: bool
    reason: str
    evidence: str  # pretty JSON, cut to a readable length


class LogFact(_Frozen):
    claim: str
    holds: bool
    statement: str


class LegView(_Frozen):
    name: str
    arm: str
    attempt: int
    run_dir: str  # relative to the report's directory
    status: LegStatus
    valid: bool
    invalid_reasons: tuple[str, ...] = ()
    error: str | None = None
    convention: str
    tok_s: float | None
    p10: float | None
    mean: float | None
    stdev: float | None
    conventional: float | None
    legacy: float | None
    chunk_aware: float | None
    quantisation_bound_pct: float | None
    full_after_ttft: float | None
    wall_full: float | None
    ttft_ms: float | None
    rows_planned: int
    rows_rated: int
    rows_short: int
    output_tokens: int
    ready_s: float | None
    wall_s: float | None
    cleanup_passed: bool | None
    idle_gap_before_s: float | None = None
    speculative: Speculative | None = None
    rows: tuple[RowView, ...] = ()
    intervals: Intervals | None = None
    # Decode chunks (each row's first chunk, the prefill, left out) by tokens carried:
    # index k-1 counts chunks of k tokens.
    chunk_sizes: tuple[int, ...] = ()
    telemetry: TelemetryView | None = None
    gates: tuple[GateView, ...] = ()
    log_facts: tuple[LogFact, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def stalled_rows(self) -> int:
        return sum(1 for r in self.rows if "stall" in r.flags)


class Headline(_Frozen):
    value: float | None
    leg: str | None
    arm: str | None
    convention: str
    formula: str
    quantisation_bound_pct: float | None
    conventional: float | None
    legacy: float | None
    chunk_aware: float | None
    note: str = ""  # why this leg carries the headline
    qualification: str = ""


class Bootstrap(_Frozen):
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    samples: int
    equivalence_pct: float
    method: str


class Analysis(_Frozen):
    """The leg-level verdict of an experiment-record/v2 (`verdict_analysis`): the interval
    uses the between-leg noise, so its noise figures are shown beside it."""

    method: str
    verdict: str
    ratio: float | None  # None (with the interval): UNDECIDED, `reason` says why
    ci_low: float | None
    ci_high: float | None
    confidence: float
    equivalence_pct: float
    df: int
    blocks: int
    legs: int
    rows_used: int
    residual_sd_pct: float | None
    leg_noise_sd_pct: float | None
    leg_noise_df: int
    row_noise_sd_pct: float | None
    row_noise_df: int
    reason: str
    # The record gate asks for FASTER at its own, higher confidence (None: a v2 record
    # made before the gate had one).
    record_confidence: float | None = None
    record_ci_low: float | None = None
    record_ci_high: float | None = None
    record_verdict: str | None = None
    leg_statistics: tuple[tuple[str, float], ...] = ()  # each leg's figure (%), in run order
    # A/A: the same arm in every leg; the ratio is B positions over A positions and
    # measures the noise floor, it makes no speed claim.
    no_claim: bool = False

    @property
    def label(self) -> str:
        return "B/A positions" if self.no_claim else "candidate/control"


class PowerEntry(_Frozen):
    effect_pct: float
    power: float
    blocks_for_target: int | None  # None: not reached within the planner's limit (50)


class Power(_Frozen):
    """The preregistered power of the plan (power.json, copied into the v2 record)."""

    min_effect_pct: float | None
    min_effect_power: float | None
    blocks: int
    df: int
    rows: int
    target_power: float
    sd_leg_pct: float
    sd_row_pct: float
    noise_df: int | None
    noise_sources: tuple[str, ...]
    method: str
    entries: tuple[PowerEntry, ...] = ()

    @property
    def min_effect(self) -> PowerEntry | None:
        return next((e for e in self.entries if e.effect_pct == self.min_effect_pct), None)


class PairView(_Frozen):
    name: str
    candidate: str
    control: str
    headline_delta_pct: float | None
    paired_median_delta_pct: float | None
    row_wins: str
    cycle_saving_ms: float | None
    acceptance_delta_pp: float | None
    passed: bool
    failed_criteria: tuple[str, ...] = ()


class RecordGate(_Frozen):
    passed: bool
    status: str
    reasons: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = ()


class Verification(_Frozen):
    checked: bool
    ok: bool
    total: int = 0  # problems found
    problems: tuple[str, ...] = ()  # the first few, "file: field: message"
    note: str = ""
    signer: str = ""  # "signed by SHA256:… (how it was pinned)", from evidence.trust


class Attempt(_Frozen):
    leg: str
    attempt: int
    status: LegStatus
    valid: bool | None
    error: str | None = None


class Addendum(_Frozen):
    name: str
    kind: str
    created_utc: str
    text: str


class ComponentView(_Frozen):
    """One declared component's evidence (record.component_evidence), formatted."""

    name: str
    description: str
    launches: str  # "54 → 9 (45 removed)"
    saving: str  # the kernel time saved per cycle, a range over devices
    isolated: str
    exact: str
    gate: str
    devices: int


class SweepRow(_Frozen):
    """One arm of a sweep (report.sweep): its speed, its simultaneous interval against
    control, exactness, and what the engine and telemetry said per arm."""

    arm: str
    control: bool
    best: bool
    tok_s: float | None
    ratio: float | None  # arm / control; None for the control
    ci_low: float | None
    ci_high: float | None
    verdict: str
    exact: bool
    acceptance: float | None
    tokens_per_cycle: float | None
    joules_per_token: float | None


class ReportData(_Frozen):
    schema_id: str = Field(default=SCHEMA_REPORT, alias="schema")
    kind: Kind
    title: str
    date: str | None
    status: str
    verdict: str
    headline: Headline
    bootstrap: Bootstrap | None = None  # experiment-record/v1
    analysis: Analysis | None = None  # experiment-record/v2 and v3
    power: Power | None = None  # v2, when the plan declared min_effect_pct
    design: str | None = None  # v2: "abba" or "aa" (None: v1 or not an experiment record)
    blocks: int | None = None  # v2
    sequential: str | None = None  # v2 with a sequential plan: its stopping rule, one line
    # v2 with a sequential plan that stopped: the plain and the bias-adjusted estimate, and why
    sequential_estimate: str | None = None
    pairs: tuple[PairView, ...] = ()
    record_gate: RecordGate | None = None
    quality: tuple[Fact, ...] = ()
    experiment_gates: tuple[GateView, ...] = ()
    legs: tuple[LegView, ...]
    timelines: tuple[Timeline, ...] = ()  # the chosen row of the chosen leg first, then other legs
    timeline_choice: str = ""
    protocol: tuple[Fact, ...] = ()
    identity: tuple[Fact, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    addenda: tuple[Addendum, ...] = ()
    components: tuple[ComponentView, ...] = ()
    # Each leaderboard submission's lifecycle, one line each (tokrecord.submit.lifecycle).
    submissions: tuple[str, ...] = ()
    verification: Verification
    # issue 33: where the leg-to-leg variance may come from (experiments only).
    noise: NoiseDiagnostic | None = None
    # issue 34: a sweep's arms (control first) and what the sweep claims.
    sweep: tuple[SweepRow, ...] = ()
    sweep_statement: str | None = None
    sweep_confidence: float | None = None

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def leg(self, name: str) -> LegView | None:
        return next((leg for leg in self.legs if leg.name == name), None)
