"""The exactness documents, on hand-made row outcomes with known divergences."""

from __future__ import annotations

import hashlib
import json

from tokrecord.gates import RowOutcome
from tokrecord.gates.teacher import Teacher, TeacherRow
from tokrecord.record.exactness import (
    cross_leg_document,
    exactness_documents,
    teacher_document,
)


def outcome(row: int, ids: tuple[int, ...] | None, text: str = "abc") -> RowOutcome:
    return RowOutcome(row=row, row_id=f"r{row}", prompt_sha256="p" * 64, max_tokens=8,
                      token_ids=ids, text=text, finish_reason="length", n_tokens=len(ids or ()),
                      completion_tokens=None, prompt_tokens=None, cached_tokens=0,
                      t_send_ns=0, t_end_ns=1)


def test_cross_leg_document_names_the_row_and_index_that_differ() -> None:
    legs = {"A1": [outcome(0, (1, 2, 3)), outcome(1, (4, 5))],
            "B1": [outcome(0, (1, 2, 9)), outcome(1, (4, 5))],
            "B2": [outcome(0, None, text="abc"), outcome(1, (4, 5))]}
    doc = cross_leg_document(legs)
    assert doc["rows_identical"] == "1/2" and doc["passed"] is False
    first, second = doc["rows"]
    # B1 differs at token 2; B2 has no ids, so it is compared by text, which is equal.
    assert first["first_divergence_vs_A1"] == {"B1": 2, "B2": None}
    assert first["identical"] is False and second["identical"] is True
    ids = first["outputs"]["A1"]["token_ids_sha256"]
    assert ids == hashlib.sha256(b"[1,2,3]").hexdigest()
    assert first["outputs"]["B2"]["token_ids_sha256"] is None
    assert first["outputs"]["A1"]["text_sha256"] == hashlib.sha256(b"abc").hexdigest()


def test_a_leg_missing_a_row_is_not_identical() -> None:
    doc = cross_leg_document({"A1": [outcome(0, (1,)), outcome(1, (2,))],
                              "B1": [outcome(0, (1,))]})
    assert doc["rows_identical"] == "1/2" and doc["passed"] is False


def teacher(rows: dict[int, tuple[int, ...]]) -> Teacher:
    return Teacher(created_utc="2026-12-01T00:00:00Z", suite_name="s", suite_sha256="s" * 64,
                   model="m", model_manifest=None, arm={}, source_run="x",
                   rows=tuple(TeacherRow(row=r, row_id=f"r{r}", prompt_sha256="p" * 64,
                                         token_ids=ids, text="abc", finish_reason="length",
                                         n_tokens=len(ids), compare_by="token_ids")
                              for r, ids in rows.items()))


def test_teacher_document_per_leg_and_row() -> None:
    t = teacher({0: (1, 2, 3), 1: (4, 5)})
    doc = teacher_document({"A1": [outcome(0, (1, 2, 3)), outcome(1, (4, 5))],
                            "B1": [outcome(0, (1, 7, 3)), outcome(1, (4, 5))]}, t)
    assert doc["teacher_sha256"] == t.sha256 and doc["passed"] is False
    assert doc["legs"]["A1"]["exact"] == "2/2" and doc["legs"]["B1"]["exact"] == "1/2"
    bad = doc["legs"]["B1"]["rows"][0]
    assert (bad["exact"], bad["first_divergence"], bad["compared_by"]) == (False, 1, "token_ids")
    assert "index 1" in bad["reason"]


def test_without_a_teacher_the_document_says_so() -> None:
    doc = teacher_document({"B1": [outcome(0, (1,))]}, None)
    assert doc["passed"] is None and doc["legs"] == {}


def test_documents_are_canonical_json_and_single_legs_have_no_cross_document() -> None:
    legs = {"B1": [outcome(0, (1,))]}
    docs = exactness_documents(legs, None, cross=False)
    assert list(docs) == ["all-vs-canonical-teacher.json"]
    data = docs["all-vs-canonical-teacher.json"]
    assert data.endswith(b"\n") and json.loads(data)["schema"].startswith("tokrecord.")
    assert exactness_documents(legs, None, cross=True).keys() == {
        "all-vs-canonical-teacher.json", "cross-leg-exactness.json"}
