"""Real-engine fixtures: the engine venvs, the demo models, a short suite, quick idle gates.

Every test here is marked `engine` (tests/conftest.py) and runs in the serial group.
Real servers are the slow part, so each engine's experiment runs once per pytest session
as a session fixture, and every test reads from it: llama.cpp's whole ABBA (its teacher and
four legs, each on the fresh server the protocol requires; a start takes under a second),
and on vLLM CPU, whose every start costs 30-70 s of imports, a plain teacher and one ngram
leg. Start a new server only for a behaviour that needs one (the prefix-caching audit:
another server configuration).
A missing engine venv is a failure, not a skip: `make test` builds it, and a
silently skipped engine test would let CI pass without ever touching vLLM.
Set TOKRECORD_SKIP_ENGINE=1 to skip them on purpose.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_support import SHORT_MAX_TOKENS, SHORT_ROWS
from tokrecord.demo.gguf import build_demo_gguf, build_demo_target_gguf
from tokrecord.demo.model import build_demo_model
from tokrecord.server import embedded, xllamacpp
from tokrecord.suite import load_suite


@pytest.fixture(scope="session")
def engine_python() -> Path:
    if os.environ.get("TOKRECORD_SKIP_ENGINE") == "1":
        pytest.skip("TOKRECORD_SKIP_ENGINE=1")
    python = embedded.engine_python()
    if python is None:
        pytest.fail(f"engine venv missing at {embedded.engine_venv_dir()}: run `make engine`")
    return python


@pytest.fixture(scope="session")
def demo_model(engine_python: Path) -> Path:
    return build_demo_model(embedded.cache_root() / "models")


@pytest.fixture(scope="session")
def llamacpp_python() -> Path:
    if os.environ.get("TOKRECORD_SKIP_ENGINE") == "1":
        pytest.skip("TOKRECORD_SKIP_ENGINE=1")
    python = xllamacpp.engine_python()
    if python is None:
        pytest.fail(f"llama.cpp venv missing at {xllamacpp.venv_dir()}: run `make engine`")
    return python


@pytest.fixture(scope="session")
def demo_gguf(llamacpp_python: Path) -> Path:
    return build_demo_gguf(embedded.cache_root() / "models")


@pytest.fixture(scope="session")
def demo_target_gguf(llamacpp_python: Path) -> Path:
    return build_demo_target_gguf(embedded.cache_root() / "models")


@pytest.fixture(scope="session")
def short_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine tests' suite file (see SHORT_ROWS)."""
    rows = load_suite().rows[:SHORT_ROWS]
    path = tmp_path_factory.mktemp("suite") / "suite-engine-short.jsonl"
    path.write_text("".join(r.model_copy(update={"max_tokens": SHORT_MAX_TOKENS})
                            .model_dump_json() + "\n" for r in rows), encoding="utf-8")
    return path
