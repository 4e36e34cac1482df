"""Teacher-exact rule 2: a row whose server held some ids back at known positions
(llama.cpp's UTF-8 hold-back) is compared by text and by every id both sides were
given, and says so; rule 1 (leg gates v1) stays as older evidence was sealed with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from test_gates import make_teacher, outcome, trow

from paths import FIXTURES
from tokrecord.gates import GateStatus, compare_row, row_comparison, teacher_exact
from tokrecord.gates.teacher import SCHEMA_TEACHER, load_teacher, write_teacher
from tokrecord.record.exactness import SCHEMA_TEACHER_V1, teacher_document

TEXT = " t1 t2 t3 t4 t5"


def gapped(ids: tuple[int | None, ...], text: str = TEXT, row: int = 0):  # type: ignore[no-untyped-def]
    return outcome(row, None, text=text, n_tokens=len(ids)).model_copy(
        update={"gapped_token_ids": ids})


def test_gaps_in_leg_and_teacher_leave_the_ids_both_have() -> None:
    teacher = trow(0, None, text=TEXT).model_copy(update={"gapped_token_ids": (1, None, 3, 4, 5)})
    row = gapped((1, 2, 3, None, 5))
    how = row_comparison(row, teacher)
    # Positions 0, 2 and 4 carry an id on both sides.
    assert how == ("text", "1 id held back at token 3; the teacher's 1 id held back at token 1", 3)
    assert compare_row(row, teacher) is None


def test_a_wrong_given_id_fails_even_when_the_text_matches() -> None:
    teacher = trow(0, (1, 2, 3, 4, 5), text=TEXT)
    d = compare_row(gapped((1, 2, 9, None, 5)), teacher)
    assert d is not None and d.mode == "token_ids" and d.index == 2
    assert d.expected == [1, 2, 3, 4, 5] and d.got == [1, 2, 9, None, 5]


def test_a_held_back_token_with_other_text_fails_by_text() -> None:
    teacher = trow(0, (1, 2, 3, 4, 5), text=TEXT)
    d = compare_row(gapped((1, 2, 3, None, 5), text=" t1 t2 t3 tX t5"), teacher)
    assert d is not None and d.mode == "text" and d.index == 11


def test_a_different_token_count_fails_at_the_shorter_end() -> None:
    teacher = trow(0, (1, 2, 3, 4, 5), text=TEXT)
    d = compare_row(gapped((1, 2, 3, None)), teacher)
    assert d is not None and d.mode == "token_ids" and d.index == 4


def test_gate_counts_rows_by_ids_and_names_each_text_row() -> None:
    teacher = make_teacher([trow(0, (1, 2, 3, 4, 5), text=TEXT), trow(1, (6, 7))])
    g = teacher_exact([gapped((1, 2, None, 4, 5)), outcome(1, (6, 7))], teacher)
    assert g.status is GateStatus.PASS and g.count == "2/2"
    assert g.evidence["rows_by_token_ids"] == 1
    assert g.evidence["rows_by_text"] == [
        {"row": 0, "row_id": "r0", "why": "1 id held back at token 2", "ids_checked": 4}]
    assert g.reason == ("every row matches the teacher: 1/2 by ids, 1 by text, their other 4 ids "
                        "compared by position (row 0: 1 id held back at token 2)")
    # Rule 1 saw no ids in that row at all, and said "the server returned no token ids".
    old = teacher_exact([gapped((1, 2, None, 4, 5)), outcome(1, (6, 7))], teacher, rule=1)
    assert "rows_by_text" not in old.evidence
    assert old.evidence["fallback"] == "some rows compared by text: the server returned no token ids"


def test_v1_teacher_keeps_the_hash_of_its_file_and_v2_keeps_the_gaps(tmp_path: Path) -> None:
    path = FIXTURES / "v1-record" / "abba" / "teacher.json"
    v1 = load_teacher(path)
    assert v1.schema_id == "tokrecord.teacher/v1"
    assert v1.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    v2 = make_teacher([trow(0, None, text=TEXT).model_copy(
        update={"gapped_token_ids": (1, None, 3, 4, 5)})])
    written = write_teacher(tmp_path / "t.json", v2)
    raw = json.loads(written.read_text())
    assert raw["schema"] == SCHEMA_TEACHER and raw["rows"][0]["gapped_token_ids"] == [1, None, 3, 4, 5]
    assert load_teacher(written) == v2


def test_teacher_document_follows_the_rule() -> None:
    teacher = make_teacher([trow(0, (1, 2, 3, 4, 5), text=TEXT)])
    legs = {"A1": [gapped((1, 2, None, 4, 5))]}
    new = teacher_document(legs, teacher)
    assert new["legs"]["A1"]["by_token_ids"] == "0/1"
    (row,) = new["legs"]["A1"]["rows"]
    assert row["compared_by"] == "text" and row["ids_compared"] == 4
    assert row["why_text"] == "1 id held back at token 2"
    old = teacher_document(legs, teacher, rule=1)
    assert old["schema"] == SCHEMA_TEACHER_V1 and "by_token_ids" not in old["legs"]["A1"]
    assert "why_text" not in old["legs"]["A1"]["rows"][0]
