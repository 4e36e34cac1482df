from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKE = [sys.executable, "-m", "tokrecord.server.fake"]


@pytest.fixture
def fake_argv() -> list[str]:
    """Server command template for the packaged fake server."""
    return [*FAKE, "--host", "{host}", "--port", "{port}", "--model", "{model}"]


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(autouse=True, scope="session")
def _signing_key_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Seals in tests sign with a throwaway key, never the user's."""
    import os

    os.environ["TOKRECORD_CONFIG_DIR"] = str(tmp_path_factory.mktemp("tokrecord-config"))
