"""Golden files for report output: compared exactly; TOKRECORD_UPDATE_GOLDEN=1 rewrites
one and then fails once, so no update goes unseen."""

from __future__ import annotations

import os

import pytest

from paths import FIXTURES

GOLDEN = FIXTURES / "report" / "golden"
UPDATE = os.environ.get("TOKRECORD_UPDATE_GOLDEN") == "1"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            pytest.fail(f"golden {name} rewritten (TOKRECORD_UPDATE_GOLDEN=1); run again without it")
        return
    assert path.exists(), f"no golden {path}; create it with TOKRECORD_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from its golden (TOKRECORD_UPDATE_GOLDEN=1 rewrites it)"
