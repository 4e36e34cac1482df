"""Plans: preregistered experiments, validated and hashed before the first leg.

A plan is a TOML file. It is parsed into a frozen model (every default made
explicit), canonicalised and hashed; that hash names the experiment and is
written into every leg's evidence, so nothing about the design can change
after the fact without it showing.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tokrecord.client.limits import RowLimits
from tokrecord.engines import (
    Endpoint,
    Engine,
    EngineName,
    SpeculativeConfig,
    engine_for,
    fill_endpoint,
    infer_engine,
)
from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json
from tokrecord.experiment.design import Design as Design
from tokrecord.experiment.design import DesignLeg as DesignLeg
from tokrecord.experiment.design import DesignSpec, PlannedLeg, PlanShape, design_spec
from tokrecord.experiment.design import abba_design as abba_design
from tokrecord.experiment.design import abba_pairs as abba_pairs
from tokrecord.gates import GateConfig, LogRule
from tokrecord.identity import IdentitySpec
from tokrecord.metrics import Convention
from tokrecord.metrics.components import ComponentSpec
from tokrecord.metrics.logfacts import LogExtractor
from tokrecord.probes.idle import IdleCriteria
from tokrecord.probes.telemetry import TelemetryConfig

# Design, DesignLeg, abba_design and abba_pairs live with the design specs
# (experiment.design) and are imported above under their own names, so the plan's readers
# keep importing them from here.
SCHEMA_PLAN: Final = "tokrecord.plan/v1"
ArmName = Literal["control", "candidate"]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerPlan(_Strict):
    argv: tuple[str, ...] = Field(min_length=1)
    model: str
    served_model: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    ready_timeout_s: float = Field(default=600.0, gt=0)
    stop_grace_s: float = Field(default=15.0, ge=0)
    metrics_path: str | None = "/metrics"


class Arm(_Strict):
    """A treatment: env and extra server args on top of the base server."""

    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    log_rules: tuple[LogRule, ...] = ()
    description: str = ""


class Prior(_Strict):
    """The record to beat, and for single-leg records the goal and best exact value."""

    value_tok_s: float | None = Field(default=None, gt=0)
    id: str | None = None
    best_exact_tok_s: float | None = Field(default=None, gt=0)
    goal_tok_s: float | None = Field(default=None, gt=0)


class Criteria(_Strict):
    """Preregistered pass criteria for each ABBA pair."""

    headline_delta_pct_gt: float = 0.0
    paired_median_delta_pct_gt: float = 0.0
    row_wins_fraction_gt: float = Field(default=0.5, ge=0, lt=1)


class VerdictSpec(_Strict):
    """The verdict's confidence and thresholds (and the legacy bootstrap's settings)."""

    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    bootstrap_samples: int = Field(default=10_000, ge=100)
    seed: int = 0  # the bootstrap's, for records of tokrecord.experiment-record/v1
    # A confidence interval inside ±equivalence_pct of no change is NO DIFFERENCE.
    equivalence_pct: float = Field(default=1.0, ge=0)
    require_faster_for_record: bool = True


class Spending(StrEnum):
    """Lan-DeMets alpha-spending functions a sequential plan can name."""

    OBRIEN_FLEMING = "obrien-fleming"
    POCOCK = "pocock"


class SequentialMethod(StrEnum):
    """How a sequential plan's boundaries are set (experiment.sequential): sealed with the
    plan, so a record is recomputed by the method it ran under."""

    # t boundaries simulated under the verdict's normal model, spending exactly alpha.
    RCI_T_1 = "rci-t/1"
    # The same, spending 0.8 alpha: real legs between fresh servers are not normal, and
    # the leg-level t exceeds its nominal tail on them (bench.verdict.seqcause).
    RCI_T_2 = "rci-t/2"


# What a [sequential] section gets when it names no method (parse_plan); a plan sealed
# before methods were named has none in its plan.json and ran under rci-t/1.
CURRENT_SEQUENTIAL_METHOD: Final = SequentialMethod.RCI_T_2


class SequentialSpec(_Strict):
    """A sequential design: ABBA/BAAB blocks, an interim analysis after each from
    `min_blocks` on, stopping as soon as the preregistered boundaries decide
    (experiment.sequential), at `max_blocks` at the latest."""

    # One block leaves 2 df: its t boundary would be far too wide to stop on.
    min_blocks: int = Field(default=2, ge=1, le=50)
    max_blocks: int = Field(ge=2, le=50)
    spending: Spending = Spending.OBRIEN_FLEMING
    # The band for NO DIFFERENCE; None: the verdict's equivalence_pct.
    equivalence_pct: float | None = Field(default=None, ge=0)
    # None: a plan sealed before methods were named (rci-t/1); a plan parsed from a user's
    # file gets CURRENT_SEQUENTIAL_METHOD unless it names one.
    method: SequentialMethod | None = None

    @property
    def method_in_force(self) -> SequentialMethod:
        return self.method or SequentialMethod.RCI_T_1

    @field_validator("max_blocks")
    @classmethod
    def _min_le_max(cls, value: int, info: ValidationInfo) -> int:
        least = info.data.get("min_blocks")
        if isinstance(least, int) and value < least:
            raise ValueError(f"max_blocks ({value}) is less than min_blocks ({least})")
        return value


# Williams designs exist for every k, but each arm adds a contrast to the family and a
# leg to every block; past ten arms a block is a long, drift-prone stretch of one run
# and the arm letters (A..J) would run out of the leg-naming scheme.
MAX_SWEEP_ARMS: Final = 10
# What an arm name may be in a record (control, candidate, or a sweep's n_max=4,p_min=0.5):
# it is printed in reports of evidence from strangers, so no spaces or markup.
SWEEP_ARM_NAME: Final = r"^[A-Za-z0-9][A-Za-z0-9_.=,:+/@-]{0,119}$"
SweepValue = str | int | float | bool


class SweepParameter(_Strict):
    """One swept knob: each value becomes `flag value` in the argv, or `env=value`."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    values: tuple[SweepValue, ...]
    flag: str | None = None  # e.g. "--spec-draft-n-max"
    env: str | None = None  # e.g. "VLLM_NUM_SPEC_TOKENS"

    @field_validator("values")
    @classmethod
    def _two_distinct(cls, values: tuple[SweepValue, ...]) -> tuple[SweepValue, ...]:
        if len(values) < 2:
            raise ValueError(f"a sweep needs at least two values; this one has {len(values)}: "
                             "with one value there is nothing to compare (use an ABBA plan)")
        seen: list[SweepValue] = []
        for v in values:
            if any(v == s and type(v) is type(s) for s in seen):
                raise ValueError(f"duplicate value {v!r}: each value is one arm")
            seen.append(v)
        return values

    @model_validator(mode="after")
    def _one_target(self) -> SweepParameter:
        if (self.flag is None) == (self.env is None):
            raise ValueError(f"parameter {self.name!r}: give exactly one of `flag` (each value "
                             "goes into the argv) or `env` (each value is an env value)")
        return self


def sweep_text(value: SweepValue) -> str:
    """A value as it goes into an argv or the environment (TOML true -> "true")."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class SweepSpec(_Strict):
    """A sweep ([sweep]): one or two parameters; one arm per value (per grid cell), named
    from the values (`n_max=4`), on top of the common `extra_args`/`env`. The control is
    one of those arms (`control = "n_max=4"`) or the plan's own [arms.control]."""

    parameters: tuple[SweepParameter, ...] = Field(min_length=1, max_length=2)
    extra_args: tuple[str, ...] = ()  # common to every swept arm (e.g. the draft model)
    env: dict[str, str] = Field(default_factory=dict)
    log_rules: tuple[LogRule, ...] = ()
    control: str | None = None  # an arm name; None: [arms.control]

    @model_validator(mode="after")
    def _distinct_parameters(self) -> SweepSpec:
        names = [p.name for p in self.parameters]
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names must differ: {names}")
        return self

    def arms(self) -> dict[str, Arm]:
        """The generated arms, in grid order (the first parameter varies slowest)."""
        return dict(self.arm_list())

    def arm_list(self) -> list[tuple[str, Arm]]:
        """(name, arm) for every grid cell, names possibly repeated (4 and "4")."""
        cells: list[list[tuple[SweepParameter, SweepValue]]] = [[]]
        for p in self.parameters:
            cells = [[*c, (p, v)] for c in cells for v in p.values]
        out: list[tuple[str, Arm]] = []
        for cell in cells:
            args = list(self.extra_args)
            env = dict(self.env)
            for p, v in cell:
                if p.flag is not None:
                    args += [p.flag, sweep_text(v)]
                else:
                    env[str(p.env)] = sweep_text(v)
            name = ",".join(f"{p.name}={sweep_text(v)}" for p, v in cell)
            out.append((name, Arm(env=env, extra_args=tuple(args), log_rules=self.log_rules,
                                  description=f"sweep arm {name}")))
        return out


class NoisePlan(_Strict):
    """The noise the power is computed from: figures given, or earlier records (an A/A
    record is the machine's own noise floor). Records win over figures when both exist."""

    sd_leg_pct: float | None = Field(default=None, ge=0)
    sd_row_pct: float | None = Field(default=None, ge=0)
    from_records: tuple[str, ...] = ()  # paths, relative to the plan file

    @model_validator(mode="after")
    def _both_or_neither(self) -> NoisePlan:
        if (self.sd_leg_pct is None) != (self.sd_row_pct is None):
            raise ValueError("give both sd_leg_pct and sd_row_pct, or neither")
        return self


# A plan section added after plans were first sealed: the canonical form leaves it out
# while it holds its default, so a plan sealed before it existed keeps its hash (and its
# record keeps verifying). Marking the field is the one edit a new section needs.
_OMITTED_AT_DEFAULT: Final = "omitted from the plan hash at its default"
_T = TypeVar("_T")
Later = Annotated[_T, _OMITTED_AT_DEFAULT]


class Plan(_Strict):
    schema_id: Literal["tokrecord.plan/v1"] = Field(default=SCHEMA_PLAN, alias="schema")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    design: Design = Design.ABBA
    blocks: Later[int] = Field(default=1, ge=1, le=50)  # ABBA blocks (abba and aa designs)
    # The smallest effect worth claiming, in %: its power is written into the preregistration.
    min_effect_pct: Later[float | None] = Field(default=None, gt=0)
    noise: Later[NoisePlan | None] = None
    # A sequential design ([sequential]): blocks until the stopping rule decides.
    sequential: Later[SequentialSpec | None] = None
    # The confidence at which the record gate needs FASTER (the verdict uses
    # verdict.confidence): 0.98 two-sided keeps false records in A/A at 1 % or less.
    record_confidence: Later[float] = Field(default=0.98, gt=0.5, lt=1)
    server: ServerPlan
    arms: dict[ArmName, Arm] = Field(default_factory=dict)  # a sweep may give none
    # A sweep ([sweep], design "sweep"): k arms generated from a parameter's values.
    # After `arms` and `server`: its validator reads them.
    sweep: Later[SweepSpec | None] = None
    suite: str | None = None  # path (relative to the plan file) or None: built-in
    suite_rows: int | None = Field(default=None, ge=1)
    teacher: str | None = None  # path, "capture" (from the control arm, fresh server), or None
    # None: inferred from server.argv (each leg's config.json says it was inferred).
    engine: Later[EngineName | None] = None
    endpoint: Endpoint = Endpoint.COMPLETIONS  # omitted: the engine's own default
    headline: Convention = Convention.CONVENTIONAL
    metric: str = "median_tok_s_1_100_after_ttft"
    idle_gap_s: float = Field(default=60.0, ge=0)
    idle: Later[IdleCriteria] = Field(default_factory=IdleCriteria)
    telemetry: Later[TelemetryConfig] = Field(default_factory=TelemetryConfig)
    request_extra: dict[str, Any] = Field(default_factory=dict)
    # How long and how large a row may be ([row_limits]; client.limits).
    row_limits: Later[RowLimits] = Field(default_factory=RowLimits)
    # Facts to read from every leg's server log, on top of the engine's own ([[log_facts]]).
    log_facts: Later[tuple[LogExtractor, ...]] = ()
    # Profiler evidence for what the candidate changes ([[components]]), sealed with the
    # experiment: the traces and checks are copied in at preregistration.
    components: Later[tuple[ComponentSpec, ...]] = ()
    gates: GateConfig = Field(default_factory=GateConfig)
    identity: IdentitySpec = Field(default_factory=IdentitySpec)
    gate_kind: Literal["strict-preregistered"] = "strict-preregistered"
    prior: Prior = Field(default_factory=Prior)
    criteria: Criteria = Field(default_factory=Criteria)
    verdict: VerdictSpec = Field(default_factory=VerdictSpec)
    notes: str = ""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _engine_endpoint(cls, data: Any) -> Any:
        server = data.get("server") if isinstance(data, dict) else None
        return fill_endpoint(data, server.get("argv") if isinstance(server, dict) else None)

    @field_validator("sweep")
    @classmethod
    def _sweep_fits(cls, value: SweepSpec | None, info: ValidationInfo) -> SweepSpec | None:
        design = info.data.get("design")
        if value is None:
            return value
        if design is not Design.SWEEP:
            shown = design.value if isinstance(design, Design) else design
            raise ValueError(f"[sweep] needs design = 'sweep'; this plan's design is "
                             f"{shown!r} (an 'aa' or 'single' design has one arm)")
        given: dict[str, Arm] = info.data.get("arms") or {}
        server: ServerPlan | None = info.data.get("server")
        extra = set(given) - {"control"}
        if extra:
            raise ValueError(f"a sweep generates its arms; only [arms.control] may be given "
                             f"beside it, not {sorted(extra)}")
        generated = value.arms()
        if value.control is None and "control" not in given:
            raise ValueError(f"a sweep needs a control: sweep.control = one of "
                             f"{list(generated)}, or an [arms.control]")
        if value.control is not None:
            if "control" in given:
                raise ValueError("give sweep.control or [arms.control], not both")
            if value.control not in generated:
                raise ValueError(f"sweep.control = {value.control!r} is not an arm of the "
                                 f"sweep; its arms are {list(generated)}")
        arms = [*((("control", given["control"]),) if "control" in given else ()),
                *value.arm_list()]
        if len(arms) > MAX_SWEEP_ARMS:
            raise ValueError(f"the sweep makes {len(arms)} arms; the sweep design supports at "
                             f"most {MAX_SWEEP_ARMS} (control included)")
        for name, _ in arms:
            if not re.fullmatch(SWEEP_ARM_NAME, name):
                raise ValueError(f"arm name {name!r} (from the values) must match "
                                 f"{SWEEP_ARM_NAME}: letters, digits and _.=,:+/@- only")
        base_argv = server.argv if server is not None else ()
        base_env = server.env if server is not None else {}
        seen: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], str] = {}
        for name, arm in arms:
            key = ((*base_argv, *arm.extra_args), tuple(sorted({**base_env, **arm.env}.items())))
            if key in seen:
                raise ValueError(f"arms {seen[key]!r} and {name!r} start the same server "
                                 f"(argv {' '.join(key[0])!r}): each arm must differ")
            seen[key] = name
        return value

    @model_validator(mode="after")
    def _arms_fit_design(self) -> Plan:
        # What each design asks of the arms, blocks, [sequential], [sweep] and components
        # is its spec's to say (experiment.design).
        self.design_spec.check_plan(PlanShape(
            arms=tuple(self.arms), blocks=self.blocks,
            max_blocks=None if self.sequential is None else self.sequential.max_blocks,
            has_sweep=self.sweep is not None, components=tuple(c.name for c in self.components)))
        return self

    @property
    def all_arms(self) -> dict[str, Arm]:
        """Every arm by name; a sweep's control first, then its generated arms."""
        if self.sweep is None:
            return {str(k): v for k, v in self.arms.items()}
        generated = self.sweep.arms()
        if self.sweep.control is not None:
            control = self.sweep.control
            return {control: generated[control],
                    **{n: a for n, a in generated.items() if n != control}}
        return {"control": self.arms["control"], **generated}

    @property
    def control_arm(self) -> str:
        """The arm every other is compared against."""
        if self.sweep is not None and self.sweep.control is not None:
            return self.sweep.control
        return "control"

    @property
    def max_blocks(self) -> int:
        """The blocks the design may run: all of them, or a sequential plan's maximum."""
        return self.sequential.max_blocks if self.sequential is not None else self.blocks

    @property
    def design_spec(self) -> DesignSpec:
        """What this plan's design means (experiment.design)."""
        return design_spec(self.design)

    @property
    def planned_legs(self) -> tuple[PlannedLeg, ...]:
        """Every leg the design may run, in design order, with its arm. An A/A plan's one
        arm runs in every position; a sweep's arms run in the sweep design's Williams order."""
        return self.design_spec.legs(tuple(self.all_arms), self.control_arm, self.max_blocks)

    @property
    def design_legs(self) -> tuple[DesignLeg, ...]:
        return tuple(DesignLeg(leg.name, leg.block, leg.treated) for leg in self.planned_legs)

    @property
    def legs(self) -> tuple[tuple[str, str], ...]:
        """(leg name, arm) in design order."""
        return tuple((leg.name, leg.arm) for leg in self.planned_legs)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(candidate-position leg, control-position leg); none for a single leg or a sweep
        (whose arms are compared in one fit, experiment.sweep)."""
        return self.design_spec.pairs(self.max_blocks)

    def canonical(self) -> bytes:
        # Sections added after plans were first sealed are left out while they hold
        # their defaults, so a plan sealed before they existed keeps its hash (and its
        # record keeps verifying). The criteria a leg actually used are in its
        # config.json and idle.json either way.
        later: dict[str, Any] = {
            name: True for name, field in type(self).model_fields.items()
            if _OMITTED_AT_DEFAULT in field.metadata
            and getattr(self, name) == field.get_default(call_default_factory=True)}
        if self.sequential is not None and self.sequential.method is None:
            later["sequential"] = {"method": True}  # sealed before methods were named
        return canonical_json(self.model_dump(mode="json", by_alias=True, exclude=later))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()




def _friendly(source: str, exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        lines.append(f"{source}: key '{loc}': {msg}")
    return "\n".join(lines)


def parse_plan(data: dict[str, Any], source: str, noise_given: bool = False) -> Plan:
    """The plan, validated. `noise_given`: the noise comes from elsewhere (`plan power
    --from` or `--sd-leg/--sd-row`), so a min_effect_pct needs no [noise] here."""
    seq = data.get("sequential")
    if isinstance(seq, dict) and "method" not in seq:
        data = {**data, "sequential": {**seq, "method": CURRENT_SEQUENTIAL_METHOD.value}}
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_friendly(source, exc)) from exc
    if plan.min_effect_pct is not None and not has_noise(plan) and not noise_given:
        raise ConfigError(
            f"{source}: key 'min_effect_pct': its power cannot be computed: no noise given. "
            "Add [noise] sd_leg_pct and sd_row_pct, or noise.from_records = [earlier records] "
            "(an A/A record is best); `tokrecord plan power` shows what they give")
    return plan


def has_noise(plan: Plan) -> bool:
    n = plan.noise
    return n is not None and (n.sd_leg_pct is not None or bool(n.from_records))


def load_plan(path: Path, noise_given: bool = False) -> Plan:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read plan {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    plan = parse_plan(raw, str(path), noise_given)
    base = path.parent
    # Paths in a plan are relative to the plan file, not to wherever it is run from.
    updates: dict[str, Any] = {}
    if plan.server.model.startswith("~"):
        # No shell expands it in an argv, and a plan shared between users says "~" for each.
        updates["server"] = plan.server.model_copy(
            update={"model": str(Path(plan.server.model).expanduser())})
    if plan.suite is not None:
        updates["suite"] = str((base / plan.suite).resolve())
    if plan.teacher not in (None, "capture"):
        updates["teacher"] = str((base / str(plan.teacher)).resolve())
    if plan.noise is not None and plan.noise.from_records:
        updates["noise"] = plan.noise.model_copy(update={"from_records": tuple(
            str((base / p).resolve()) for p in plan.noise.from_records)})
    if plan.components:
        updates["components"] = tuple(_resolve_component(c, base) for c in plan.components)
    return plan.model_copy(update=updates) if updates else plan


def _resolve_component(spec: ComponentSpec, base: Path) -> ComponentSpec:
    def resolve(p: str) -> str:
        return str((base / p).resolve())
    return spec.model_copy(update={
        "control_traces": tuple(resolve(p) for p in spec.control_traces),
        "candidate_traces": tuple(resolve(p) for p in spec.candidate_traces),
        "check": resolve(spec.check)})


def plan_engine(plan: Plan) -> Engine:
    return engine_for(plan.engine or infer_engine(plan.server.argv))


def speculative_configs(plan: Plan) -> dict[str, SpeculativeConfig | None]:
    """Per arm, the speculative decoding its server argv configures (None: plain)."""
    engine = plan_engine(plan)
    return {name: engine.speculative((*plan.server.argv, *arm.extra_args))
            for name, arm in plan.all_arms.items()}


def draft_paths(plan: Plan) -> dict[str, Path]:
    """The arms' draft models that are local paths: their bytes are identified too."""
    return {arm: Path(c.draft_model) for arm, c in speculative_configs(plan).items()
            if c is not None and c.draft_model is not None and Path(c.draft_model).exists()}
