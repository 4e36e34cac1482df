"""The session's one sealed fake ABBA, for the record modules that only read it
(tests/sealed_support.py says which and why)."""

from __future__ import annotations

import pytest

from sealed_support import SealedAbba, build_sealed_abba


@pytest.fixture(scope="session")
def sealed_abba(tmp_path_factory: pytest.TempPathFactory) -> SealedAbba:
    return build_sealed_abba(tmp_path_factory)
