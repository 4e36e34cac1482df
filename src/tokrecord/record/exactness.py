"""The exactness documents a record hashes: every leg against every other, and every leg
against the canonical teacher, row by row.

The gates reduce these comparisons to a status and a count; the documents keep each
row's output hashes and first divergence, so a reader can see which row of which leg
differed without re-running anything. They are pure functions of the legs' row outcomes
and the teacher, so `tokrecord verify` recomputes them byte for byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NotRequired, TypedDict

from tokrecord.evidence import canonical_json, canonical_sha256, layout
from tokrecord.gates import (
    EXACTNESS_RULE,
    RowOutcome,
    compare_row,
    output_divergence,
    row_comparison,
)
from tokrecord.gates.teacher import Teacher

SCHEMA_CROSS: Final = "tokrecord.cross-leg-exactness/v1"
SCHEMA_TEACHER_V1: Final = "tokrecord.all-vs-canonical-teacher/v1"
# v2: each row says why it was compared by text and how many ids were compared anyway;
# each leg counts its rows compared by ids.
SCHEMA_TEACHER: Final = "tokrecord.all-vs-canonical-teacher/v2"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class OutputHashes(TypedDict):
    text_sha256: str
    token_ids_sha256: str | None


class TeacherRowCheck(OutputHashes):
    row: int
    row_id: str
    exact: bool
    compared_by: str | None
    first_divergence: int | None
    reason: str | None
    why_text: NotRequired[str | None]  # v2
    ids_compared: NotRequired[int]  # v2


class TeacherLegCheck(TypedDict):
    exact: str
    complete: bool
    rows: list[TeacherRowCheck]
    by_token_ids: NotRequired[str]  # v2


class TeacherDocument(TypedDict):
    """all-vs-canonical-teacher.json (SCHEMA_TEACHER, or SCHEMA_TEACHER_V1 for rule 1)."""

    schema: str
    teacher_sha256: str | None
    legs: dict[str, TeacherLegCheck]
    passed: bool | None
    reason: NotRequired[str]  # no teacher
    teacher_suite: NotRequired[str]
    teacher_rows: NotRequired[int]


def output_hashes(o: RowOutcome) -> OutputHashes:
    """The row's text (UTF-8) and token ids (canonical JSON list) as sha256."""
    return {"text_sha256": _sha(o.text.encode("utf-8")),
            "token_ids_sha256": None if o.token_ids is None
            else canonical_sha256(list(o.token_ids))}


def cross_leg_document(legs: Mapping[str, Sequence[RowOutcome]]) -> dict[str, Any]:
    """Per row, each leg's output hashes and where it first differs from the first leg
    (by token ids when both have them, else by text)."""
    names = list(legs)
    ref_name = names[0] if names else None
    rows = []
    identical = 0
    count = max((len(v) for v in legs.values()), default=0)
    for i in range(count):
        present = {n: legs[n][i] for n in names if i < len(legs[n])}
        ref = present.get(ref_name) if ref_name is not None else None
        divergence: dict[str, int | None] = {}
        for n, o in present.items():
            if ref is None or n == ref_name:
                continue
            divergence[n] = output_divergence(ref, o)[0]
        same = len(present) == len(names) and all(v is None for v in divergence.values())
        identical += same
        first = next(iter(present.values()))
        rows.append({"row": first.row, "row_id": first.row_id,
                     "prompt_sha256": first.prompt_sha256,
                     "outputs": {n: output_hashes(o) for n, o in present.items()},
                     "first_divergence_vs_" + str(ref_name): divergence,
                     "identical": same})
    return {"schema": SCHEMA_CROSS, "legs": names, "reference_leg": ref_name, "rows": rows,
            "rows_identical": f"{identical}/{count}",
            "passed": len(names) >= 2 and identical == count}


def teacher_document(legs: Mapping[str, Sequence[RowOutcome]], teacher: Teacher | None,
                     rule: int = EXACTNESS_RULE) -> TeacherDocument:
    """Per leg and row, whether it matches the teacher and, where not, why; and how it
    was compared (rule 2: why by text, and the ids compared all the same)."""
    schema = SCHEMA_TEACHER if rule >= EXACTNESS_RULE else SCHEMA_TEACHER_V1
    if teacher is None:
        return {"schema": schema, "teacher_sha256": None, "legs": {},
                "passed": None, "reason": "no teacher: exactness was not tested"}
    by_row = {r.row: r for r in teacher.rows}
    out: dict[str, TeacherLegCheck] = {}
    passed = True
    for name, outcomes in legs.items():
        rows = []
        exact = 0
        by_ids = 0
        for o in outcomes:
            t = by_row.get(o.row)
            d = compare_row(o, t, rule) if t is not None else None
            how = row_comparison(o, t, rule) if t is not None else None
            ok = t is not None and d is None
            exact += ok
            by_ids += how is not None and how.mode == "token_ids"
            hashes = output_hashes(o)
            row: TeacherRowCheck = {
                "row": o.row, "row_id": o.row_id, "exact": ok,
                "compared_by": None if how is None else how.mode,
                "first_divergence": d.index if d is not None else None,
                "reason": "row not in the teacher" if t is None
                else d.reason if d is not None else None,
                "text_sha256": hashes["text_sha256"],
                "token_ids_sha256": hashes["token_ids_sha256"]}
            if rule >= EXACTNESS_RULE:
                row["why_text"] = how.why if how is not None else None
                row["ids_compared"] = how.ids_checked if how is not None else 0
            rows.append(row)
        complete = len(outcomes) == len(teacher.rows)
        passed = passed and complete and exact == len(outcomes)
        out[name] = {"exact": f"{exact}/{len(outcomes)}", "complete": complete, "rows": rows}
        if rule >= EXACTNESS_RULE:
            out[name]["by_token_ids"] = f"{by_ids}/{len(outcomes)}"
    return {"schema": schema, "teacher_sha256": teacher.sha256,
            "teacher_suite": teacher.suite_name, "teacher_rows": len(teacher.rows),
            "legs": out, "passed": passed}


def exactness_documents(legs: Mapping[str, Sequence[RowOutcome]], teacher: Teacher | None,
                        cross: bool, rule: int = EXACTNESS_RULE) -> dict[str, bytes]:
    """File name -> bytes: the teacher document always, the cross-leg one when the
    experiment has more than one leg."""
    docs = {layout.ALL_VS_TEACHER: canonical_json(teacher_document(legs, teacher, rule))
            + b"\n"}
    if cross:
        docs[layout.CROSS_LEG_EXACTNESS] = canonical_json(cross_leg_document(legs)) + b"\n"
    return docs


def document_hashes(docs: Mapping[str, bytes]) -> dict[str, str]:
    return {name: _sha(data) for name, data in docs.items()}


# The record's names for the documents (the ABBA seed's artifacts keys).
ARTIFACT_KEYS: Final = {layout.ALL_VS_TEACHER: "all_vs_canonical_teacher",
                        layout.CROSS_LEG_EXACTNESS: "cross_leg_exactness"}


def artifact_entries(hashes: Mapping[str, str]) -> dict[str, str]:
    """`artifacts` keys: each document's file name and its sha256."""
    out = {}
    for name, sha in hashes.items():
        out[ARTIFACT_KEYS[name]] = name
        out[f"{ARTIFACT_KEYS[name]}_sha256"] = sha
    return out


def stated_hashes(artifacts: Mapping[str, Any]) -> dict[str, str]:
    """File name -> sha256 as a record's artifacts state them (empty for older records)."""
    return {name: artifacts[f"{key}_sha256"] for name, key in ARTIFACT_KEYS.items()
            if f"{key}_sha256" in artifacts}
