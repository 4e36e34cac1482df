"""The demo's preregistered plans: plain vs ngram speculative decoding, on the embedded
vLLM CPU engine or on llama.cpp.

It lives here, above the experiment and server stages it combines: the server
stage knows how to start the engine, not what a demo experiment is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokrecord.engines import Endpoint, EngineName
from tokrecord.experiment.plan import Arm, Design, Plan, ServerPlan
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
        design=Design.ABBA,
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


# llama.cpp's ngram speculation: look up the last 3 tokens, draft the 4 that followed.
LLAMACPP_NGRAM_ARGS = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                       "--spec-ngram-simple-size-m", "4")
# The launcher's first line says what llama.cpp's own parser made of the argv.
_DRAFTING = r"draft acceptance = "


def llamacpp_log_rules(arm: str) -> tuple[LogRule, ...]:
    common = (
        LogRule(claim="prompt cache off", pattern=r"cache_prompt=False n_cache_reuse=0",
                required=True),
        LogRule(claim="one slot", pattern=r"n_slots = 1,", required=True),
    )
    if arm == "ngram":
        return (
            LogRule(claim="ngram speculative decoding active",
                    pattern=r"spec_types=\[[^]]*NGRAM_SIMPLE", required=True),
            LogRule(claim="drafts accepted on every row", pattern=_DRAFTING, expect="present",
                    required=True),
            *common,
        )
    return (
        LogRule(claim="no speculative decoding", pattern=_DRAFTING, expect="absent",
                required=True),
        *common,
    )


def demo_plan_llamacpp(python: Path, gguf: Path, *, rows: int | None = None,
                       idle_gap_s: float = 5.0) -> Plan:
    """The same ABBA on llama.cpp (xllamacpp): control plain, candidate ngram-simple."""
    return Plan(
        name="demo-llamacpp-ngram-vs-plain",
        design=Design.ABBA,
        engine=EngineName.LLAMA_CPP,
        endpoint=Endpoint.NATIVE,
        server=ServerPlan(argv=tuple(xllamacpp.llama_server_argv(python)), model=str(gguf),
                          served_model=embedded.SERVED_MODEL, ready_timeout_s=120),
        arms={
            "control": Arm(description="plain decoding", log_rules=llamacpp_log_rules("plain")),
            "candidate": Arm(description="ngram-simple speculative decoding (n=3, m=4)",
                             extra_args=LLAMACPP_NGRAM_ARGS, log_rules=llamacpp_log_rules("ngram")),
        },
        **_demo_common(rows, idle_gap_s),
        identity=IdentitySpec(native_globs={"engine": ["xllamacpp/**/*.so"]}),
        notes="tokrecord demo: a tiny random Llama (GGUF) on llama.cpp's server, CPU, 1 thread",
    )
