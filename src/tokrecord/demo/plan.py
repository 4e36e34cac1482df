"""The demo's preregistered plans: on llama.cpp (the default), plain decoding against
draft-model speculative decoding of a target built to be sped up; on the embedded vLLM CPU
engine, plain against ngram speculative decoding.

It lives here, above the experiment and server stages it combines: the server
stage knows how to start the engine, not what a demo experiment is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.engines import Endpoint, EngineName
from tokrecord.experiment.plan import (
    CURRENT_SEQUENTIAL_METHOD,
    Arm,
    NoisePlan,
    Plan,
    SequentialSpec,
    ServerPlan,
    Spending,
)
from tokrecord.experiment.power import PowerReport
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.stats import Verdict, VerdictAnalysis
from tokrecord.gates import GateConfig, LogRule
from tokrecord.identity import IdentitySpec
from tokrecord.probes.idle import IdleCriteria
from tokrecord.probes.telemetry import TelemetryConfig
from tokrecord.server import embedded, xllamacpp


def arm_log_rules(arm: str) -> tuple[LogRule, ...]:
    """What the server log must show before the demo arms' treatment claims are made."""
    common = (
        LogRule(claim="prefix caching off", pattern=r"enable_prefix_caching=False", required=True),
        # An example of a claim the log does not support on this machine: it is
        # reported as not claimed, and the leg stays valid.
        LogRule(claim="Intel OpenMP preloaded", pattern=r"libiomp is not found in LD_PRELOAD",
                expect="absent"),
    )
    if arm == "ngram":
        return (
            LogRule(claim="ngram speculative decoding active",
                    pattern=r"speculative_config=SpeculativeConfig\(method='ngram'", required=True),
            LogRule(claim="async scheduling disabled by ngram",
                    pattern=r"Async scheduling not supported with ngram", expect="present"),
            *common,
        )
    return (
        LogRule(claim="no speculative decoding", pattern=r"speculative_config=None", required=True),
        *common,
    )



# The demo runs on CPU: the engine's own threads are the load that matters, and on a
# small machine one busy core is half the machine. Five quiet seconds before and
# after every leg, as a real plan would ask (with stricter thresholds).
DEMO_IDLE = IdleCriteria(interval_s=1.0, consecutive=5, timeout_s=300, host_cpu_max_pct=50)


def _demo_common(rows: int | None, idle_gap_s: float) -> dict[str, Any]:
    """What both demo plans share: the teacher from the plain arm, the idle criteria,
    half-second telemetry and the suite's declared context limits."""
    return {"suite_rows": rows, "teacher": "capture", "idle_gap_s": idle_gap_s,
            "idle": DEMO_IDLE, "telemetry": TelemetryConfig(interval_s=0.5),
            "gates": GateConfig(long_context_threshold=800, rollover_boundary=1024)}


def demo_plan(python: Path, model_dir: Path, *, rows: int | None = None,
              idle_gap_s: float = 5.0) -> Plan:
    """The embedded ABBA: control plain, candidate ngram speculative decoding."""
    return Plan(
        name="demo-ngram-vs-plain",
        server=ServerPlan(argv=tuple(embedded.vllm_argv(python)), model=str(model_dir),
                          served_model=embedded.SERVED_MODEL, env=embedded.ENGINE_ENV),
        arms={
            "control": Arm(description="plain decoding", log_rules=arm_log_rules("plain")),
            "candidate": Arm(
                description="ngram speculative decoding",
                extra_args=("--speculative-config", json.dumps(embedded.NGRAM_SPEC, sort_keys=True)),
                log_rules=arm_log_rules("ngram"),
            ),
        },
        **_demo_common(rows, idle_gap_s),
        # The engine's compiled kernels, hashed: the bytes that actually ran.
        identity=IdentitySpec(native_globs={"engine": ["vllm/**/*.so"]}),
        notes="tokrecord demo: a tiny random Llama on vLLM CPU",
    )


# llama.cpp's draft-model speculation: the draft (the plain demo model) proposes 6 tokens, the
# target verifies them in one batch. Measured with bench/stalls.py on the 2-core machine
# (target = demo model + 12 pass-through layers, one thread each; README "The demo"): 4 and 8
# drafted tokens gained less, and a second batch thread (-tb 2) stalled delivery for up to 2 s.
DRAFT_N_MAX: Final = 6


def llamacpp_draft_args(draft: Path) -> tuple[str, ...]:
    return ("--spec-draft-model", str(draft), "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(DRAFT_N_MAX), "--spec-draft-threads", "1")


# The launcher's first line says what llama.cpp's own parser made of the argv; llama.cpp
# prints one draft-acceptance line per speculative request.
_DRAFTING = r"draft acceptance = "


def llamacpp_log_rules(arm: str) -> tuple[LogRule, ...]:
    common = (
        LogRule(claim="prompt cache off", pattern=r"cache_prompt=False n_cache_reuse=0",
                required=True),
        LogRule(claim="one slot", pattern=r"n_slots = 1,", required=True),
    )
    if arm == "draft":
        return (
            LogRule(claim="draft-model speculative decoding active",
                    pattern=r"spec_types=\[[^]]*DRAFT_SIMPLE[^]]*\] draft_model='[^']+\.gguf'",
                    required=True),
            LogRule(claim="draft model loaded", pattern=r"loading draft model '", required=True),
            LogRule(claim="drafts accepted on every row", pattern=_DRAFTING, expect="present",
                    required=True),
            *common,
        )
    return (
        LogRule(claim="no speculative decoding", pattern=_DRAFTING, expect="absent",
                required=True),
        LogRule(claim="no draft model", pattern=r"draft_model=''", required=True),
        *common,
    )


class DemoTiming(BaseModel):
    """What the llama.cpp demo takes on the 2-core machine, in seconds, to size the design.

    A leg is its idle gate before the server starts, the start, the 13 rows and the idle
    gate after; the gap between legs is on top. Measured from the legs' own timestamps in
    demo runs on this machine (README "The demo"), with the machine shared."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    setup_s: float = Field(gt=0)  # make setup + engine + model build on a fresh clone
    teacher_leg_s: float = Field(gt=0)
    control_leg_s: float = Field(gt=0)
    candidate_leg_s: float = Field(gt=0)
    # Runs on a shared machine take longer than the figures above: idle gates wait for
    # other people's work, and rows stream slower beside it.
    margin: float = Field(default=1.2, ge=1)


# From a 2-block demo run on the shared machine (2026-12-01, load 0.9-2.5): legs on a quiet
# machine took 28 s (control) and 25 s (candidate) with both idle gates, but other people's
# work held the idle gates for up to 65 s, so these are that run's means per leg.
DEMO_TIMING: Final = DemoTiming(setup_s=45, teacher_leg_s=70, control_leg_s=34,
                                candidate_leg_s=43, margin=1.1)
DEMO_BUDGET_S: Final = 600.0  # issue 18: `make demo` within 10 minutes, install included
DEMO_MAX_BLOCKS: Final = 4


def demo_seconds(blocks: int, timing: DemoTiming = DEMO_TIMING, idle_gap_s: float = 5.0) -> float:
    """The expected wall time of `make demo` with ``blocks`` ABBA blocks, margin included."""
    legs = timing.teacher_leg_s + blocks * 2 * (timing.control_leg_s + timing.candidate_leg_s)
    gaps = 4 * blocks * idle_gap_s  # one before each leg after the teacher's
    return timing.setup_s + timing.margin * (legs + gaps)


def blocks_within(budget_s: float, timing: DemoTiming = DEMO_TIMING, idle_gap_s: float = 5.0,
                  most: int = DEMO_MAX_BLOCKS) -> int:
    """The most ABBA blocks whose expected time fits the budget (at least one: a demo
    with no block would show nothing; the caller says when even one does not fit)."""
    fits = [k for k in range(1, most + 1) if demo_seconds(k, timing, idle_gap_s) <= budget_s]
    return max(fits, default=1)


# The noise the power is computed from: leg to leg and row to row (sd of the log rate x 100),
# as the verdict analysis of that 2-block llama.cpp demo run measured it (df 5 and 84).
DEMO_NOISE: Final = NoisePlan(sd_leg_pct=2.3, sd_row_pct=2.4)
# The smallest speed-up the demo preregisters as worth finding.
DEMO_MIN_EFFECT_PCT: Final = 5.0


def demo_sequential(max_blocks: int) -> SequentialSpec | None:
    """`tokrecord demo --sequential`: a look after every block from the first, Pocock-like
    spending (its early boundaries are the lower ones), at most the blocks the budget
    fits. The demo's effect (+22-27 % in earlier runs) should be decided after one block,
    and it never runs more than the fixed design would; None when one block fits."""
    if max_blocks < 2:
        return None
    return SequentialSpec(max_blocks=max_blocks, min_blocks=1, spending=Spending.POCOCK,
                          method=CURRENT_SEQUENTIAL_METHOD)


def demo_plan_llamacpp(python: Path, target: Path, draft: Path, *, rows: int | None = None,
                       idle_gap_s: float = 5.0, blocks: int = 1,
                       sequential: SequentialSpec | None = None) -> Plan:
    """llama.cpp (xllamacpp), ``blocks`` ABBA blocks: control plain decoding of the target,
    candidate the same target with the draft model speculating (see demo.model: the draft
    is the target's first layers, so it is right about every token and cheaper per token)."""
    return Plan(
        name="demo-llamacpp-draft-vs-plain",
        blocks=blocks if sequential is None else 1,
        sequential=sequential,
        min_effect_pct=DEMO_MIN_EFFECT_PCT,
        noise=DEMO_NOISE,
        engine=EngineName.LLAMA_CPP,
        endpoint=Endpoint.NATIVE,
        server=ServerPlan(argv=tuple(xllamacpp.llama_server_argv(python)), model=str(target),
                          served_model=embedded.SERVED_MODEL, ready_timeout_s=120),
        arms={
            "control": Arm(description="plain decoding of the target",
                           log_rules=llamacpp_log_rules("plain")),
            "candidate": Arm(
                description=f"draft-model speculative decoding ({draft.name}, "
                            f"{DRAFT_N_MAX} drafted tokens)",
                extra_args=llamacpp_draft_args(draft), log_rules=llamacpp_log_rules("draft")),
        },
        **_demo_common(rows, idle_gap_s),
        identity=IdentitySpec(native_globs={"engine": ["xllamacpp/**/*.so"]}),
        notes="tokrecord demo: a tiny random Llama target (GGUF) and its draft, its own first "
              "layers, on llama.cpp's server, CPU, 1 thread",
    )


SWEEP_N_MAX: Final = (1, 2, 4, 6, 8)
# The sweep demo's rows by default: 6 arms x 2 blocks are 12 legs plus the teacher, on 2
# CPU cores; all 13 rows of 512 tokens made it some 20 minutes of streaming alone on the
# shared 2-core machine (4 rows: 378 s at load 10, issue 34's first session), so it
# takes the first 4 rows (--rows N for more).
SWEEP_DEMO_ROWS: Final = 4


def demo_sweep_plan_llamacpp(python: Path, target: Path, draft: Path, *, rows: int | None = None,
                             idle_gap_s: float = 5.0, blocks: int = 2) -> Plan:
    """llama.cpp (xllamacpp), a sweep (issue 34): plain decoding of the target as control,
    and draft-model speculation at each --spec-draft-n-max of SWEEP_N_MAX, every arm once
    per block in Williams order. `rows` None: SWEEP_DEMO_ROWS."""
    rows = SWEEP_DEMO_ROWS if rows is None else rows
    common = ("--spec-draft-model", str(draft), "--spec-type", "draft-simple",
              "--spec-draft-threads", "1")
    return Plan.model_validate({
        "name": "demo-llamacpp-draft-n-max-sweep", "design": "sweep", "blocks": blocks,
        "engine": EngineName.LLAMA_CPP, "endpoint": Endpoint.NATIVE,
        "server": ServerPlan(argv=tuple(xllamacpp.llama_server_argv(python)), model=str(target),
                             served_model=embedded.SERVED_MODEL, ready_timeout_s=120),
        "arms": {"control": Arm(description="plain decoding of the target",
                                log_rules=llamacpp_log_rules("plain"))},
        "sweep": {"extra_args": common, "log_rules": llamacpp_log_rules("draft"),
                  "parameters": [{"name": "n_max", "flag": "--spec-draft-n-max",
                                  "values": list(SWEEP_N_MAX)}]},
        **_demo_common(rows, idle_gap_s),
        "identity": IdentitySpec(native_globs={"engine": ["xllamacpp/**/*.so"]}),
        "notes": "tokrecord demo --sweep: the demo target and its draft on llama.cpp's "
                 "server, CPU, 1 thread; draft n-max swept against plain decoding"})


def design_lines(plan: Plan, power: PowerReport, detectable_pct: float | None,
                 budget_s: float, sized_by_budget: bool,
                 timing: DemoTiming = DEMO_TIMING) -> list[str]:
    """What the demo tells before its first leg: how many blocks and why, and the power
    they have (so a reader knows what a verdict from it can and cannot show)."""
    k = plan.max_blocks
    expected = demo_seconds(k, timing, plan.idle_gap_s)
    why = (f"as many as fit the {budget_s / 60:g} min budget" if sized_by_budget
           else "given with --blocks")
    lines = [f"design: {k} ABBA block(s) = {4 * k} legs after the teacher "
             f"({why}; expected {expected / 60:.1f} min with setup)"]
    if plan.sequential is not None:
        one = demo_seconds(plan.sequential.min_blocks, timing, plan.idle_gap_s)
        lines[0] = (f"design: sequential, at most {k} ABBA blocks = {4 * k} legs after the "
                    f"teacher ({why}), a look after each block from block "
                    f"{plan.sequential.min_blocks} ({plan.sequential.spending.value} "
                    f"spending): stops as soon as it is decided ({one / 60:.1f} min with "
                    f"setup if the first look decides, {expected / 60:.1f} min at most)")
    if expected > budget_s:
        lines.append(f"  over budget: {k} block(s) are expected to take "
                     f"{expected / 60:.1f} min, more than {budget_s / 60:g} min")
    by_effect = ", ".join(f"+{e.effect_pct:g} %: {100 * e.power:.0f} %" for e in power.entries)
    lines.append(f"power, P(FASTER) for a true speed-up of {by_effect} (noise: leg "
                 f"{power.sd_leg_pct:g} %, row {power.sd_row_pct:g} %, the plan's figures)")
    found = (f"+{detectable_pct:g} % or more" if detectable_pct is not None
             else "no effect up to +100 %")
    lines.append(f"  with {100 * power.target_power:g} % power this design finds {found}")
    if power.min_effect_power is not None and power.min_effect_power < power.target_power:
        lines.append(f"  underpowered for the preregistered +{power.min_effect_pct:g} %: "
                     f"{100 * power.min_effect_power:.0f} % power")
    return lines


def claim_lines(analysis: VerdictAnalysis, detectable_pct: float | None) -> list[str]:
    """What the demo may claim from its verdict, given the power it had: a verdict is
    stated only with its interval, and an effect smaller than the design finds reliably
    is said to be so rather than claimed."""
    if analysis.ratio is None or analysis.ci_low is None or analysis.ci_high is None:
        return [f"no claim: the verdict could not be computed ({analysis.reason})"]
    effect = 100 * (analysis.ratio - 1)
    interval = (f"{effect:+.1f} % [{100 * (analysis.ci_low - 1):+.1f} %, "
                f"{100 * (analysis.ci_high - 1):+.1f} %], interval width "
                f"{100 * (analysis.ci_high - analysis.ci_low):.1f} points")
    small = detectable_pct is None or abs(effect) < detectable_pct
    reach = (f"+{detectable_pct:g} %" if detectable_pct is not None else "any effect up to +100 %")
    if analysis.verdict in (Verdict.FASTER, Verdict.SLOWER):
        word = analysis.verdict.value
        if small:
            return [f"{word} {interval}; but the effect is smaller than the {reach} this "
                    "design finds with 90 % power, so a rerun may well not repeat it: "
                    "more blocks before claiming it"]
        return [f"claim: the candidate is {word} by {interval}"]
    if analysis.verdict is Verdict.NO_DIFFERENCE:
        return [f"claim: no difference beyond ±{analysis.equivalence_pct:g} %: {interval}"]
    why = ("the effect is smaller than that" if small else
           "the legs were noisier than the plan's noise figures")
    return [f"no claim: {interval} is too wide to decide; this design finds {reach} with "
            f"90 % power and {why} (more blocks, or a quieter machine)"]


def sequential_claim_lines(seq: SequentialAnalysis, max_blocks: int) -> list[str]:
    """What a sequential demo may claim: its stopping rule's verdict with the repeated
    interval (valid after stopping), where it stopped, and the legs it saved."""
    if seq.ci_low is None or seq.ci_high is None or seq.estimate_ratio is None:
        return [f"no claim: the stopping rule decided nothing ({seq.verdict.value})"]
    stopped = int(str(seq.stopped_at).split()[-1]) if seq.stopped_at else max_blocks
    interval = (f"{100 * (seq.estimate_ratio - 1):+.1f} % [repeated "
                f"{100 * seq.confidence:g} % CI {100 * (seq.ci_low - 1):+.1f} %, "
                f"{100 * (seq.ci_high - 1):+.1f} %]")
    saved = (f"; stopped after block {stopped} of {max_blocks}: {4 * (max_blocks - stopped)} "
             "legs not run" if stopped < max_blocks else f"; ran all {max_blocks} blocks")
    if seq.verdict in (Verdict.FASTER, Verdict.SLOWER):
        adjusted = ("" if seq.estimate_adjusted_ratio is None else
                    f"; bias-adjusted {100 * (seq.estimate_adjusted_ratio - 1):+.1f} %")
        return [f"claim: the candidate is {seq.verdict.value} by {interval}{saved}",
                "  (the estimate is biased away from no change when a run stops early; the "
                f"interval is not{adjusted})"]
    return [f"{seq.verdict.value}: {interval}{saved}"]
