"""Real-engine fixtures: the embedded vLLM CPU venv and the demo model.

These tests start real servers (1-2 minutes each), so legs are shared per module.
A missing engine venv is a failure, not a skip: `make test` builds it, and a
silently skipped engine test would let CI pass without ever touching vLLM.
Set TOKRECORD_SKIP_ENGINE=1 to skip them on purpose.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokrecord.demo.gguf import build_demo_gguf, build_demo_target_gguf
from tokrecord.demo.model import build_demo_model
from tokrecord.server import embedded, xllamacpp


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
