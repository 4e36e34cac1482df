"""The record schema, ``tokrecord.record/v1``: what ``abba_record`` and ``single_leg_record`` write.

Record forms, told apart by their ``schema`` key:

* ``tokrecord.experiment-record/v3`` (``ExperimentRecordV3``, the k-block form): an ABBA,
  A/A or sweep experiment;
* ``tokrecord.single-leg-record/v2`` (``SingleLegRecord``): one leg against a goal;
* ``tokrecord.experiment-record/v1`` (``ExperimentRecord``): one ABBA block, as written
  before k blocks (only ever recomputed now).

Both may carry the ``seal`` section the CLI adds before sealing. Every other key
the writer emits is required, even where the reused model (``PairResult``,
``GateResult``, ``Arm``...) has a default: a record is a complete document, not
an input with defaults to fill in. Validation is strict, as JSON is: a string is
not a number and ``1`` is not ``true``.

Readers load a record with ``load_record``: ``record.migrate`` upgrades an older form
(experiment-record/v2, single-leg-record/v1, a v1 sealed before the probes) in memory
to the current one, with None ("not recorded") where the stored form lacks a key, and the
model is then checked as strictly as a record being written. The record remembers the id
as stored (``stored_schema``) and which keys were filled (``recorded``).

``python -m tokrecord.record.schema`` prints the JSON Schema; the packaged copy
``tokrecord/data/record.schema.json`` is that output (a test keeps them equal).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import ErrorDetails

from tokrecord.errors import ConfigError
from tokrecord.evidence import read_json
from tokrecord.experiment.design import DesignSpec, design_spec
from tokrecord.experiment.noise import NoiseDiagnostic
from tokrecord.experiment.plan import SWEEP_ARM_NAME, Arm, ArmName
from tokrecord.experiment.power import PowerReport
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.stats import (
    BootstrapResult,
    PairResult,
    RecordGate,
    Verdict,
    VerdictAnalysis,
)
from tokrecord.experiment.sweep import SweepSection
from tokrecord.gates import SINGLE_ACTIVE_GENERATION, GateResult, GateStatus
from tokrecord.metrics import Convention, SpeculativeCounters
from tokrecord.probes.telemetry import TelemetrySummary
from tokrecord.record import migrate
from tokrecord.record.ids import (
    SCHEMA_ABBA,
    SCHEMA_ABBA_V1,
    SCHEMA_ABBA_V2,
    SCHEMA_SINGLE,
    SCHEMA_SINGLE_V1,
)

SCHEMA_ID: Final = "tokrecord.record/v1"
SCHEMA_URL: Final = "https://tokrecord.dev/schemas/tokrecord.record/v1.json"
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

# -- shared value types -------------------------------------------------------------------

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Date = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]
# A count summed over legs ("13/13"), or "not tested" when no leg could test it.
Count = Annotated[str, StringConstraints(pattern=r"^\d+/\d+$|^not tested$")]
# A gate's own count: a fraction ("5/5") or, for one_suite_invocation / zero_retries, a number.
GateCount = Annotated[str, StringConstraints(pattern=r"^\d+(/\d+)?$")]
NonNegativeInt = Annotated[int, Field(ge=0)]
LegName = Literal["A1", "B1", "B2", "A2"]
# v2: any number of blocks (A1 B1 B2 A2 B3 A3 A4 B4 ...).
# A..J: a sweep letters its arms (experiment.sweep); ABBA and A/A use A and B.
AnyLegName = Annotated[str, StringConstraints(pattern=r"^[A-J][1-9][0-9]*$")]
# control / candidate, or a sweep's arm named from its values (n_max=4,p_min=0.5).
RecordArmName = Annotated[str, StringConstraints(pattern=SWEEP_ARM_NAME)]
PairName = Annotated[str, StringConstraints(pattern=r"^B[1-9][0-9]*_vs_A[1-9][0-9]*$")]
EvidenceName = Literal["summary.json", "rows.json", "events.jsonl", "gates.json", "config.json",
                       "server.log", "cleanup.json", "metrics-before.prom", "metrics-after.prom",
                       "idle.json", "telemetry.jsonl", "hardware.json"]
EvidenceHashes = dict[EvidenceName, Sha256]
# A single-leg record's sha256 section: its leg's files, and the seed's other hashes
# (the exactness document, identity, the portable manifests: None where there is none).
SingleHashes = dict[EvidenceName | Literal["exactness", "identity", "model_release_manifest",
                                           "runtime_lock"], Sha256 | None]


class _NullOnlyWhereFilled:
    """Marks a boolean that is None only where record.migrate filled it: a record stored
    with null there is refused (validate_record checks it, knowing the filled paths)."""


_NULL_ONLY_WHERE_FILLED: Final = _NullOnlyWhereFilled()
# A boolean added with the probes: None only where a record sealed before them lacks it.
LaterBool = Annotated[bool | None, _NULL_ONLY_WHERE_FILLED, WithJsonSchema({"type": "boolean"})]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- sections both forms share ------------------------------------------------------------


class Attempt(_Section):
    """One leg attempt, from the experiment's state log (the teacher's included)."""

    leg: str
    attempt: int = Field(ge=1)
    status: Literal["complete", "failed", "interrupted"]
    valid: bool
    error: str | None
    run_dir: str


class GitTokrecord(_Section):
    kind: Literal["git"]
    commit: str
    dirty: bool


class PackageTokrecord(_Section):
    kind: Literal["package"]
    version: str


class SourceRepo(_Section):
    commit: str
    dirty: bool
    public_base: str | None
    bundle_sha256: Sha256 | None
    patch_sha256: Sha256 | None
    # Their copies in the sealed directory (identity/NAME.bundle, identity/NAME.patch).
    bundle: str | None = None
    patch: str | None = None


class IdentitySummary(_Section):
    """The identity facts a reader looks for first, and the hash of the full identity.json."""

    identity_sha256: Sha256
    tokrecord: Annotated[GitTokrecord | PackageTokrecord, Field(discriminator="kind")]
    sources: dict[str, SourceRepo]
    native_modules: dict[str, dict[str, Sha256]]  # env -> {relative path: sha256}
    runtime_lock_sha256: Sha256
    runtime_lock_packages: dict[str, NonNegativeInt]  # env -> number of packages
    model_manifest_sha256: Sha256 | None
    model_revision: str | None
    python: str
    platform: str


class Empty(_Section):
    """An empty object: ``source`` without an identity.json, ``submission`` always."""


def _source_kind(value: Any) -> str:
    return "Empty" if isinstance(value, Mapping) and not value else "IdentitySummary"


Source = Annotated[
    Annotated[IdentitySummary, Tag("IdentitySummary")] | Annotated[Empty, Tag("Empty")],
    Discriminator(_source_kind),
]


class Seal(_Section):
    """Added by ``tokrecord experiment`` before sealing: the key that signed the manifest."""

    public_key_fingerprint: Annotated[str, StringConstraints(pattern=r"^SHA256:[A-Za-z0-9+/]{43}$")]
    keyid: Sha256
    public_key_pem: Annotated[str, StringConstraints(pattern=r"^-----BEGIN PUBLIC KEY-----\n")]


class _Record(_Section):
    seal: Seal | None = None  # optional; when present, never null
    # Set by validate_record from record.migrate: the schema id as stored, and where the
    # upgrade to the current form filled a key the stored form lacks with None.
    _stored_schema: str = PrivateAttr(default="")
    _filled: frozenset[tuple[str | int, ...]] = PrivateAttr(default=frozenset())

    @property
    def stored_schema(self) -> str:
        """The schema id record.json stores (an older form reads as the current model)."""
        return self._stored_schema

    def recorded(self, *path: str | int) -> bool:
        """Whether the stored record has the key at this path: False where the migration
        filled it ("not recorded"), so that a reader shows what the record states."""
        return tuple(path) not in self._filled

    @field_validator("seal", mode="before")
    @classmethod
    def _seal_not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("seal is either absent or an object, never null")
        return value


# -- tokrecord.experiment-record/v1 -------------------------------------------------------


class PriorApprovedRecord(_Section):
    id: str | None
    tok_s: float | None


class Treatments(_Section):
    control: Arm
    candidate: Arm


class AbbaProtocol(_Section):
    order: list[Annotated[str, StringConstraints(pattern=r"^[AB][12]-(control|candidate)$")]]
    fresh_service_per_leg: Literal[True]
    idle_gap_seconds_minimum: float = Field(ge=0)
    idle_gap_seconds_measured: dict[LegName, float]
    generation_warmup: Literal["none"]
    prompt_count_per_leg: NonNegativeInt
    prompts_unique_per_leg: bool
    each_prompt_run_once: bool
    cached_tokens_all_zero: bool
    single_active_generation: bool
    max_tokens: NonNegativeInt | None  # the most tokens any row of A1 received
    top_level_prompt_tokens_suite_median: float | None
    top_level_output_tokens_suite_median: float | None
    metric: str
    headline_convention: Convention
    headline_formula: str
    fifth_run_permitted: Literal[False]

    def leg_names(self) -> list[str]:
        """The legs in run order ("A1-control" names leg A1)."""
        return [entry.split("-")[0] for entry in self.order]

    def idle_gap(self, leg: str) -> float | None:
        """The idle gap measured before a leg; None before the first."""
        return next((s for name, s in self.idle_gap_seconds_measured.items() if name == leg), None)

    def named_pairs(self) -> list[str]:
        """The pairs the protocol names, in block order: none in v1 (its pair_results
        keep run order)."""
        return []

    def most_blocks(self) -> int | None:
        """A sequential plan's most blocks; None where the protocol names none (v1)."""
        return None


class Accelerator(_Section):
    backend: str
    index: NonNegativeInt
    name: str
    mem_total_bytes: NonNegativeInt | None


class Hardware(_Section):
    """What the probes saw at the start of a leg (the leg's hardware.json)."""

    hw_class: Literal["DISCRETE_GPU", "UNIFIED", "CPU_ONLY"]
    gpu_name: str | None
    gpu_count: NonNegativeInt
    vram_gb: float | None
    cpu: str
    cpu_count: NonNegativeInt
    ram_gb: float
    os: str
    accelerators: list[Accelerator]


class GateSummary(_Section):
    status: GateStatus
    count: GateCount | None


class LegBlock(SpeculativeCounters):
    """One ABBA leg: its figures under the seeds' names, its gates and its evidence hashes."""

    treatment: RecordArmName
    attempts: NonNegativeInt
    headline_tok_s: float | None
    p10_tok_s: float | None
    mean_tok_s: float | None
    stdev_tok_s: float | None
    full_after_ttft_median_tok_s: float | None
    wall_full_median_tok_s: float | None
    ttft_median_ms: float | None
    conventional_tok_s: float | None
    legacy_inclusive_events_tok_s: float | None
    chunk_aware_tok_s: float | None
    quantisation_bound_pct: float | None
    teacher_exact: Count
    # How its rows were compared: "13/13 by ids", "0/13 by ids, 13 by text, …"
    # (gates.compared_by_phrase); records sealed before leg gates v2 have none.
    teacher_exact_compared_by: str | None = None
    valid: bool
    gates: dict[str, GateSummary]
    warnings: list[str]
    telemetry: TelemetrySummary | None = None
    evidence_sha256: EvidenceHashes
    run_dir: str
    identity_sha256: Sha256 | None = None  # identity just before the leg (v2)


class AbbaRuns(_Section):
    A1: LegBlock
    B1: LegBlock
    B2: LegBlock
    A2: LegBlock


class AbbaPairs(_Section):
    B1_vs_A1: PairResult
    B2_vs_A2: PairResult


class AbbaQuality(_Section):
    all_legs_teacher_exact: Count
    all_legs_cross_exact: bool
    cross_leg_exact: GateResult
    all_legs_cached_zero: Count
    full_output_then_next_exact: Count
    long_then_next_exact: Count
    rollover_exact: Count
    token_count_integrity: Count
    cleanup_passed_all_legs: bool
    idle_before_and_after_all_legs: LaterBool = None
    same_hardware_all_legs: LaterBool = None
    all_legs_valid: bool
    retries: NonNegativeInt
    full_abba_causal_pass: bool
    # None: the experiment predates identity checks before each leg.
    source_identity_passed_all_legs: bool | None = None


class AbbaArtifacts(_Section):
    root: str
    all_vs_canonical_teacher: str | None = None
    all_vs_canonical_teacher_sha256: Sha256 | None = None
    cross_leg_exactness: str | None = None
    cross_leg_exactness_sha256: Sha256 | None = None


class Accounting(_Section):
    """The headline in every convention: both per-token forms and the chunk-aware rate."""

    published_convention: Convention
    published_formula: str
    published_value_tok_s: float | None
    timestamped_events: Literal[100]
    inter_token_intervals: Literal[99]
    conventional_interval_formula: str
    conventional_interval_value_tok_s: float | None
    legacy_inclusive_events_value_tok_s: float | None
    chunk_aware_value_tok_s: float | None
    quantisation_bound_pct: float | None
    # The clock every token stamp was read from (a wall-clock jump cannot move it).
    clock: str | None = None


class HeadlineAccounting(Accounting):
    """An experiment's accounting is that of its lower candidate leg."""

    headline_leg: str
    qualification: str


class LogFact(_Section):
    claim: str
    holds: bool
    statement: str


class LegOperational(_Section):
    idle_gap_before_seconds: float | None
    prestart_idle_seconds: float | None = None
    poststop_idle_seconds: float | None = None
    prestart_idle_snapshots: NonNegativeInt | None = None
    poststop_idle_snapshots: NonNegativeInt | None = None
    idle_passed: LaterBool = None
    server_ready_seconds: float | None
    cleanup_passed: bool | None
    surviving_workers: NonNegativeInt | None
    port_listener_after_run: bool | None
    stop_seconds: float | None
    sigkill_sent: bool | None


class Operational(_Section):
    legs: dict[str, LegOperational]
    artifact_sealed_read_only: bool


class Reproducibility(_Section):
    portable_sealed_evidence: str
    identity: str
    verify: str
    artifact_exact_scope: str
    source_rebuild_scope: str
    # Copies under the experiment directory (None: no local model to list).
    portable_model_manifest: str | None = None
    portable_model_manifest_sha256: Sha256 | None = None
    runtime_lock: str | None = None
    runtime_lock_sha256: Sha256 | None = None


class _ExperimentCommon(_Record):
    """The keys both experiment-record forms have."""

    experiment: str
    date: Date
    status: Literal["strict_preregistered_record_pass", "no_record"]
    plan_sha256: Sha256
    prior_approved_record: PriorApprovedRecord
    attempts: list[Attempt]
    quality: AbbaQuality
    verdict: Verdict
    record_gate: RecordGate
    metric_accounting: HeadlineAccounting
    log_facts: dict[str, list[LogFact]]
    operational: Operational
    reproducibility: Reproducibility
    source: Source
    hardware: Hardware | None = None
    artifacts: AbbaArtifacts
    submission: Empty

    def experiment_verdict(self) -> tuple[str, Verdict]:
        """The experiment's name and verdict (a single-leg record has neither: None)."""
        return self.experiment, self.verdict


class _WithoutV2Sections:
    """What a form written before experiment-record/v2 lacks, read as None: the v1
    experiment record and the single-leg record (see _ReaderView)."""

    @property
    def verdict_analysis(self) -> None:
        return None

    @property
    def power(self) -> None:
        return None

    @property
    def sequential(self) -> None:
        return None

    @property
    def sweep(self) -> None:
        return None

    @property
    def noise_diagnostic(self) -> None:
        return None


class ExperimentRecord(_WithoutV2Sections, _ExperimentCommon):
    """``tokrecord.experiment-record/v1``: one ABBA block (A1 B1 B2 A2), the paired-bootstrap
    verdict; written before v2, still read and verified."""

    schema_id: Literal["tokrecord.experiment-record/v1"] = Field(alias="schema")
    treatment: Treatments
    protocol: AbbaProtocol
    runs: AbbaRuns
    pair_results: AbbaPairs
    bootstrap: BootstrapResult | None  # the verdict is UNDECIDED when none could be computed

    def runs_by_name(self) -> dict[str, LegBlock]:
        """The legs by name, in run order (A1 B1 B2 A2), as v2 keeps them."""
        return dict(self.runs)  # a model iterates as (field name, value)

    def pairs_by_name(self) -> dict[str, PairResult]:
        return dict(self.pair_results)

    # What readers ask of every record form (see _ReaderView). v1 ran one design, one
    # ABBA block, and named none; the sections v2 added are absent from it.
    def design_spec(self) -> DesignSpec:
        return design_spec("abba")

    def named_design(self) -> tuple[str | None, int | None]:
        return None, None

    def arm_names(self) -> list[str]:
        return sorted(dict(self.treatment))

    def leg_dirs(self) -> list[tuple[str, str | None, float | None]]:
        return _leg_dirs(self.protocol, self.runs_by_name())

    def shows_single_active(self) -> bool:
        return self.protocol.single_active_generation is True



# -- tokrecord.experiment-record/v3 (v2 read through record.migrate) ----------------------


class AbbaProtocolV2(AbbaProtocol):
    order: list[Annotated[str, StringConstraints(
        pattern=r"^[A-J][1-9][0-9]*-" + SWEEP_ARM_NAME[1:])]]
    idle_gap_seconds_measured: dict[AnyLegName, float]  # type: ignore[assignment]
    design: Literal["abba", "aa", "sweep"]
    blocks: int = Field(ge=1)
    pairs: list[PairName]
    # A sequential plan's most blocks (blocks: those its stopping rule ran).
    max_blocks: int | None = Field(default=None, ge=1)
    # True when any prompt was repeated, run twice or served from a cache.
    prefix_history_response_reuse: bool | None = None

    def named_pairs(self) -> list[str]:
        return list(self.pairs)

    def most_blocks(self) -> int | None:
        return self.max_blocks


class LogFactFound(_Section):
    value: Any
    found: NonNegativeInt
    per_rank: dict[str, Any]


class PriorRecheck(_Section):
    """The prior approved row, fetched from the public API at preregistration."""

    rechecked: bool  # false: run with --offline-prior (reason says so)
    public_api_rechecked_utc: str | None
    status: str | None
    public_tok_s: float | None
    reason: str | None


class ModelSection(_Section):
    target: str
    target_manifest_sha256: Sha256 | None
    target_revision: str | None
    draft: str | None
    draft_manifest_sha256: Sha256 | None
    draft_revision: str | None


class UnchangedStack(_Section):
    argv: list[str]
    env: dict[str, str]


class ComponentEvidence(_Section):
    """One declared component, from its sealed profiler traces and check."""

    name: str
    description: str
    cycle_annotation: str
    kernel_patterns: list[str]
    devices_or_ranks: int
    cycles: dict[Literal["control", "candidate"], list[NonNegativeInt]]
    delimited_by: list[Literal["gpu_user_annotation", "correlation"]]
    launches_per_cycle: dict[Literal["control", "candidate", "removed"], float | int | None]
    kernel_ms_per_cycle: dict[Literal["control", "candidate"], list[float | None]]
    saving_ms_per_cycle_range: list[float] | None
    isolated_saving_ms_per_cycle: float | None
    exact: bool
    exact_all_devices: bool
    what_exact_means: str | None
    gate_passed: bool
    gate_reasons: list[str]
    trace_sha256: dict[str, Sha256]
    check_sha256: Sha256


class SingleTreatment(_Section):
    """The single-leg seed's treatment section (record.single.treatment_section)."""

    arm: ArmName
    selector: str
    description: str
    target_unchanged: bool | None
    claims: dict[str, bool | str]
    log_facts: dict[str, Any]
    log_facts_per_rank: dict[str, dict[str, Any]]
    num_speculative_tokens: int | None
    draft_sample_method: str | None
    rejection_sample_method: str | None


class SpeculativeSection(_Section):
    """An arm's speculative decoding, from its server argv, and its draft's identity."""

    method: str
    num_speculative_tokens: int | None
    draft_model: str | None
    draft_manifest_sha256: Sha256 | None
    draft_revision: str | None
    draft_sample_method: str | None
    rejection_sample_method: str | None
    source: str
    notes: list[str]


class GraphFacts(_Section):
    """Graph compilation and capture, as the server logged them (per rank where it does)."""

    mode: str | None
    cudagraph_mode: str | None
    capture_sizes: list[int] | None
    max_capture_size: int | None
    graphs_reused: int | None  # llama.cpp: graphs reused over the server's life
    rank_captures: NonNegativeInt | None
    graphs_per_rank: int | None
    eager_breaks_per_rank: int | None
    rank_replays: int | None
    not_reported: list[str]


class ExperimentRecordV3(_ExperimentCommon):
    """``tokrecord.experiment-record/v3`` (and v2, upgraded by record.migrate): ABBA (or
    A/A, or a sweep) over k blocks, with the leg-level verdict (``verdict_analysis``) and
    the preregistered power."""

    schema_id: Literal["tokrecord.experiment-record/v3"] = Field(alias="schema")
    treatment: dict[RecordArmName, Arm]
    protocol: AbbaProtocolV2
    runs: dict[AnyLegName, LegBlock]
    pair_results: dict[PairName, PairResult]
    verdict_analysis: VerdictAnalysis | None
    power: PowerReport | None  # when the plan declared min_effect_pct
    server_log_facts: dict[AnyLegName, dict[str, LogFactFound]] | None = None
    speculative: dict[RecordArmName, SpeculativeSection | None] | None = None
    component_evidence: dict[str, ComponentEvidence] | None = None
    model: ModelSection | None = None
    unchanged_record_stack: UnchangedStack | None = None
    prior_recheck: PriorRecheck | None = None
    # issue 33: where the leg-to-leg variance may come from (diagnosis only); absent from
    # records sealed before it.
    noise_diagnostic: NoiseDiagnostic | None = None
    # A sequential plan's looks, boundaries and decision (the verdict is its verdict).
    sequential: SequentialAnalysis | None = None
    # A sweep's arms against control, best-arm statement, exactness per arm and its gate.
    sweep: SweepSection | None = None

    def runs_by_name(self) -> dict[str, LegBlock]:
        return self.runs

    def pairs_by_name(self) -> dict[str, PairResult]:
        return self.pair_results

    # What readers ask of every record form (see _ReaderView).
    def design_spec(self) -> DesignSpec:
        return design_spec(self.protocol.design)

    def named_design(self) -> tuple[str | None, int | None]:
        return self.protocol.design, self.protocol.blocks

    def arm_names(self) -> list[str]:
        return sorted(self.treatment)

    def leg_dirs(self) -> list[tuple[str, str | None, float | None]]:
        return _leg_dirs(self.protocol, self.runs)

    def shows_single_active(self) -> bool:
        return self.protocol.single_active_generation is True

    @property
    def bootstrap(self) -> None:
        """v2's verdict is verdict_analysis (leg-level); v1's paired bootstrap is gone."""
        return None


# -- tokrecord.single-leg-record/v2 (v1 read through record.migrate) ----------------------


class MetricAccounting(Accounting):
    conventional_goal_tok_s: float | None
    conventional_margin_to_goal_tok_s: float | None


class SingleFigures(_Section):
    """The ``record`` section: the value against the goal, the prior approved and prior best."""

    value_tok_s: float | None
    value_qualification: str
    goal_tok_s: float | None
    margin_over_goal_tok_s: float | None
    prior_approved_tok_s: float | None
    prior_approved_id: str | None
    delta_vs_approved_tok_s: float | None
    delta_vs_approved_pct: float | None
    prior_best_exact_tok_s: float | None
    delta_vs_prior_best_exact_tok_s: float | None
    delta_vs_prior_best_exact_pct: float | None


class SingleSummary(SpeculativeCounters):
    tok_s_out: float | None
    tok_s_out_p10: float | None
    tok_s_out_mean: float | None
    tok_s_out_stdev: float | None
    tok_s_full_after_ttft_median: float | None
    tok_s_wall_full_median: float | None
    ttft_ms_median: float | None


class GateDetail(GateSummary):
    reason: str


class SingleArtifacts(_Section):
    root: str
    run_dir: str
    all_vs_canonical_teacher: str | None = None
    all_vs_canonical_teacher_sha256: Sha256 | None = None


class SingleLegRecord(_WithoutV2Sections, _Record):
    """``tokrecord.single-leg-record/v2`` (and v1, upgraded by record.migrate): one leg of
    the candidate arm against the plan's goal."""

    schema_id: Literal["tokrecord.single-leg-record/v2"] = Field(alias="schema")
    date: Date
    status: Literal["record_pass", "no_record"]
    plan_sha256: Sha256
    metric: str
    metric_accounting: MetricAccounting
    record: SingleFigures
    summary: SingleSummary
    quality: dict[str, GateDetail]
    valid: bool
    record_blockers: list[str] | None = None
    identity_sha256: Sha256 | None = None
    source_identity_passed: bool | None = None
    attempts: list[Attempt]
    treatment: SingleTreatment | None = None
    model: ModelSection | None = None
    unchanged_record_stack: UnchangedStack | None = None
    prior_recheck: PriorRecheck | None = None
    component_evidence: dict[str, ComponentEvidence] | None = None
    log_facts: dict[str, list[LogFact]]
    server_log_facts: dict[str, LogFactFound] | None = None
    graph: GraphFacts | None = None
    speculative: dict[ArmName, SpeculativeSection | None] | None = None
    operational: Operational
    reproducibility: Reproducibility
    sha256: SingleHashes
    source: Source
    hardware: Hardware | None = None
    telemetry: TelemetrySummary | None = None
    artifacts: SingleArtifacts
    submission: Empty

    # What readers ask of every record form (see _ReaderView): one leg of the candidate
    # arm, no verdict and no record gate of the experiment kind.
    def design_spec(self) -> DesignSpec:
        return design_spec("single")

    def named_design(self) -> tuple[str | None, int | None]:
        return None, None

    def arm_names(self) -> list[str]:
        return ["candidate"]

    def leg_dirs(self) -> list[tuple[str, str | None, float | None]]:
        return [("B1", self.artifacts.run_dir, None)]

    def shows_single_active(self) -> bool:
        gate = self.quality.get(SINGLE_ACTIVE_GENERATION)
        return gate is not None and gate.status is GateStatus.PASS

    def experiment_verdict(self) -> None:
        return None

    @property
    def bootstrap(self) -> None:
        return None

    @property
    def record_gate(self) -> None:
        return None


def _leg_dirs(protocol: AbbaProtocol, runs: Mapping[str, LegBlock]
              ) -> list[tuple[str, str | None, float | None]]:
    return [(name, runs[name].run_dir if name in runs else None, protocol.idle_gap(name))
            for name in protocol.leg_names() or list(runs)]


# _ReaderView: every record form answers the same questions, so report/ and submit/ ask
# the record instead of its form. design_spec() says what its design means
# (experiment.design); named_design() is the (design, blocks) a v2 record names (None for
# forms that name none: their reports stay as they were); leg_dirs() gives (leg, run_dir
# the record names, idle gap before it) in run order; a section a form does not have
# (v2's verdict_analysis, power, sequential, sweep and noise_diagnostic in v1; v1's
# bootstrap in v2; the experiment sections in a single-leg record) reads as None.
AbbaRecord = ExperimentRecord | ExperimentRecordV3
AnyRecord = ExperimentRecord | ExperimentRecordV3 | SingleLegRecord
Record = Annotated[AnyRecord, Field(discriminator="schema_id")]
RECORD_ADAPTER: TypeAdapter[AnyRecord] = TypeAdapter(Record)
_RECORD_MODELS: Final = (ExperimentRecord, ExperimentRecordV3, SingleLegRecord)
_OPTIONAL_KEYS: Final = frozenset({"seal"})  # of the record models only


# -- validation ---------------------------------------------------------------------------


def validate_record(obj: Mapping[str, Any], *, source: str = "record",
                    older_form_ok: bool = False) -> AnyRecord:
    """The record as a model; ConfigError naming the first bad key path when it is not one.
    Every key is required (the seal excepted). A record to be written must be in a current
    form (record.ids); with older_form_ok (a reader's view of sealed evidence), an older
    form is first upgraded in memory by record.migrate, which fills the keys it lacks with
    None, and is then held to the same rule. A schema id newer than this tokrecord knows,
    or of no form it knows, is refused (migrate)."""
    try:
        json.dumps(dict(obj), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: not a JSON document: {exc}") from exc
    if older_form_ok:
        upgraded = migrate.load_current(obj, source)
    else:
        upgraded = migrate.Upgraded(obj=dict(obj), filled=frozenset(),
                                    stored_schema=migrate.check_written_form(obj, source))
    try:
        record = RECORD_ADAPTER.validate_json(json.dumps(upgraded.obj), strict=True)
    except ValidationError as exc:
        raise ConfigError(_describe(source, upgraded.obj, exc.errors())) from exc
    missing = _first_unset(record, ())
    if missing is not None:
        raise ConfigError(f"{source}: key '{_dotted(missing)}': Field required")
    null = _first_null_not_filled(record, (), upgraded.filled)
    if null is not None:
        raise ConfigError(f"{source}: key '{_dotted(null)}': Value error, either absent (a "
                          "record sealed before the probes) or a boolean, never null")
    if isinstance(record, ExperimentRecordV3):
        _check_design(record, source)
    record._stored_schema = upgraded.stored_schema
    record._filled = upgraded.filled
    return record


def load_record(path: Path) -> AnyRecord:
    """A sealed record.json as its model, for a reader (see validate_record): ConfigError
    naming the path when it is missing, not JSON, or not a record."""
    obj = read_json(path, ConfigError)
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{path}: not a record")
    return validate_record(obj, source=str(path), older_form_ok=True)


def _check_design(record: ExperimentRecordV3, source: str) -> None:
    """v2 names its legs and pairs by the design: each one the protocol names must be there,
    and no other."""
    legs = record.protocol.leg_names()
    for section, names in (("runs", legs), ("pair_results", record.protocol.pairs)):
        found = getattr(record, section)
        for name in names:
            if name not in found:
                raise ConfigError(f"{source}: key '{section}.{name}': Field required")
        for name in found:
            if name not in names:
                raise ConfigError(f"{source}: key '{section}.{name}': not in the design "
                                  f"(protocol names {', '.join(names)})")


def _describe(source: str, obj: Mapping[str, Any], errors: Sequence[ErrorDetails]) -> str:
    first = errors[0]
    path = _data_path(obj, first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key (typo?)"
    elif first["type"] in ("union_tag_not_found", "union_tag_invalid") and not path:
        path = ("schema",)
        found = "missing" if first["type"] == "union_tag_not_found" else f"{obj.get('schema')!r}"
        msg = f"{found}; must be {SCHEMA_ABBA!r}, {SCHEMA_ABBA_V1!r} or {SCHEMA_SINGLE!r}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{source}: key '{_dotted(path) or '(top level)'}': {msg}{more}"


def _data_path(obj: Any, loc: Sequence[int | str]) -> tuple[int | str, ...]:
    """The error's location as keys of the document: union tags (the record's schema,
    a source's form, tokrecord's kind) are not keys, so they are dropped."""
    path: list[int | str] = []
    node: Any = obj
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if part == "[key]":  # a dict key's own error: the key is already in the path
            continue
        is_key = (isinstance(node, Mapping) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if is_key:
            node = node[part]
        elif not last:
            continue  # a union tag
        path.append(part)
    return tuple(path)


def _first_unset(value: Any, path: tuple[int | str, ...]) -> tuple[int | str, ...] | None:
    """The first key a model filled from a default: the writer always emits it, so a record
    without it is not one tokrecord wrote (an older form lacking it was filled with None
    by record.migrate before validation)."""
    if isinstance(value, BaseModel):
        optional = _OPTIONAL_KEYS if isinstance(value, _RECORD_MODELS) else frozenset()
        for name, field in type(value).model_fields.items():
            key = field.alias or name
            if name not in value.model_fields_set:
                if name in optional:
                    continue
                return (*path, key)
            found = _first_unset(getattr(value, name), (*path, key))
            if found is not None:
                return found
    else:
        for sub, item in _children(value, path):
            found = _first_unset(item, sub)
            if found is not None:
                return found
    return None


def _first_null_not_filled(value: Any, path: tuple[int | str, ...],
                           filled: frozenset[tuple[str | int, ...]]
                           ) -> tuple[int | str, ...] | None:
    """The first boolean marked null-only-where-filled (LaterBool) that the stored record
    has as null: absent is "not recorded", null is no value tokrecord writes."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            key = field.alias or name
            item = getattr(value, name)
            if (item is None and _NULL_ONLY_WHERE_FILLED in field.metadata
                    and (*path, key) not in filled):
                return (*path, key)
            found = _first_null_not_filled(item, (*path, key), filled)
            if found is not None:
                return found
    else:
        for sub, item in _children(value, path):
            found = _first_null_not_filled(item, sub, filled)
            if found is not None:
                return found
    return None


def _children(value: Any, path: tuple[int | str, ...]
              ) -> list[tuple[tuple[int | str, ...], Any]]:
    if isinstance(value, Mapping):
        return [((*path, key), item) for key, item in value.items()]
    if isinstance(value, list | tuple):
        return [((*path, index), item) for index, item in enumerate(value)]
    return []


def _dotted(path: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in path)


# -- the JSON Schema ----------------------------------------------------------------------


def record_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of both record forms, every emitted key required."""
    generated = RECORD_ADAPTER.json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = generated.pop("$defs")
    records = {model.__name__ for model in _RECORD_MODELS}
    for name, definition in defs.items():
        props: dict[str, Any] | None = definition.get("properties")
        if props is None:
            continue
        for key, prop in props.items():
            prop.pop("default", None)  # required below: a default would never apply
            if key == "seal" and name in records:
                props[key] = {"$ref": "#/$defs/Seal",
                              "description": "present once the record is sealed by the CLI"}
        if not props:  # Empty: no keys at all
            definition.pop("properties")
            continue
        optional = _OPTIONAL_KEYS if name in records else frozenset()
        definition["required"] = [key for key in props if key not in optional]
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": SCHEMA_URL,
        "title": SCHEMA_ID,
        "description": "A tokrecord record: an experiment record "
        f"({SCHEMA_ABBA}, or {SCHEMA_ABBA_V1} as written before k blocks) or a single-leg "
        f"record ({SCHEMA_SINGLE}), told apart by 'schema'. Older forms "
        f"({SCHEMA_ABBA_V2}, {SCHEMA_SINGLE_V1}) are read by tokrecord after an upgrade in "
        "memory, never written.",
        **generated,
        "$defs": defs,
    }


def record_json_schema_text() -> str:
    """The packaged file's exact text."""
    return json.dumps(record_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    sys.stdout.write(record_json_schema_text())


if __name__ == "__main__":
    main()
