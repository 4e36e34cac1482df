"""The exact column says what the count claims: by ids, or how many rows by text."""

from __future__ import annotations

import pytest

from tokrecord.gates import GateStatus
from tokrecord.report.model import GateView
from tokrecord.report.text import exact_cell


def view(reason: str, status: GateStatus = GateStatus.PASS, count: str = "13/13") -> GateView:
    return GateView(name="teacher_exact", status=status, count=count, required=True,
                    reason=reason, evidence="{}")


@pytest.mark.parametrize(("reason", "cell"), [
    ("every row matches the teacher: 13/13 by ids", "13/13"),
    ("every row matches the teacher: 12/13 by ids, 1 by text, their other 511 ids compared "
     "by position (row 7: 1 id held back at token 212)", "13/13, 1 by text"),
    ("every row matches the teacher: 0/13 by ids, 13 by text (row 0: the server sent no "
     "token ids; 12 more)", "13/13, 13 by text"),
    # Leg gates v1 (sealed before): their own words.
    ("every row matches the teacher token_ids", "13/13"),
    ("every row matches the teacher text", "13/13 by text"),
    ("every row matches the teacher text/token_ids", "13/13, some by text"),
])
def test_exact_cell(reason: str, cell: str) -> None:
    assert exact_cell(view(reason)) == cell


def test_a_failed_gate_reads_failed() -> None:
    assert exact_cell(view("row 0 (r0): first divergent token at index 3", GateStatus.FAIL,
                           "12/13")) == "fail"
    assert exact_cell(None) == "—"
