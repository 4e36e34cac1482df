"""Quality gates (tokrecord.gates) and the teacher file, against hand-computed verdicts.

Every gate is a pure function; each test builds the few RowOutcomes it needs with
the factories below and checks status, count string and the key words of the
reason or evidence, the way the seed records report them ("13/13", "not tested"
with a reason).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json
from tokrecord.gates import (
    CONTEXT_TOKENS,
    GateResult,
    GateStatus,
    LogRule,
    RowOutcome,
    cached_tokens_zero,
    cleanup_gate,
    compare_row,
    cross_leg_exact,
    exactness,
    first_divergence,
    first_valid_score,
    full_output_then_next,
    leg_valid,
    long_context_then_next,
    request_log_gates,
    rollover,
    teacher_exact,
    token_count_integrity,
    treatment_attestation,
)
from tokrecord.gates.teacher import SCHEMA_TEACHER, Teacher, TeacherRow, load_teacher, write_teacher

PASS, FAIL, NOT_TESTED = GateStatus.PASS, GateStatus.FAIL, GateStatus.NOT_TESTED


# --------------------------------------------------------------------------- factories


def sha(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def text_of(ids: Sequence[int]) -> str:
    return "".join(f" t{i}" for i in ids)


_UNSET: Any = object()


def outcome(
    row: int,
    ids: Sequence[int] | None = (1, 2, 3),
    *,
    text: str | None = None,
    prompt: str | None = None,
    max_tokens: int = 8,
    finish: str | None = "stop",
    n_tokens: int | None = None,
    completion_tokens: int | None = _UNSET,
    prompt_tokens: int | None = 10,
    cached: int | None = 0,
    t_send_ns: int | None = None,
    t_end_ns: int | None = None,
) -> RowOutcome:
    """One row's outcome; defaults describe a clean, sequential, short row."""
    n = n_tokens if n_tokens is not None else (len(ids) if ids is not None else 3)
    return RowOutcome(
        row=row,
        row_id=f"r{row}",
        prompt_sha256=sha(prompt if prompt is not None else f"prompt {row}"),
        max_tokens=max_tokens,
        token_ids=tuple(ids) if ids is not None else None,
        text=text if text is not None else text_of(ids or ()),
        finish_reason=finish,
        n_tokens=n,
        completion_tokens=n if completion_tokens is _UNSET else completion_tokens,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        t_send_ns=t_send_ns if t_send_ns is not None else row * 1_000_000,
        t_end_ns=t_end_ns if t_end_ns is not None else row * 1_000_000 + 500_000,
    )


def trow(
    row: int,
    ids: Sequence[int] | None = (1, 2, 3),
    *,
    text: str | None = None,
    prompt: str | None = None,
) -> TeacherRow:
    return TeacherRow(
        row=row,
        row_id=f"r{row}",
        prompt_sha256=sha(prompt if prompt is not None else f"prompt {row}"),
        token_ids=tuple(ids) if ids is not None else None,
        text=text if text is not None else text_of(ids or ()),
        finish_reason="stop",
        n_tokens=len(ids) if ids is not None else 3,
        compare_by="token_ids" if ids is not None else "text",
    )


def make_teacher(rows: Sequence[TeacherRow]) -> Teacher:
    return Teacher(
        created_utc="2026-01-02T03:04:05Z",
        suite_name="unit",
        suite_sha256="ab" * 32,
        model="fake-model",
        model_manifest={"config.json": "cd" * 32},
        arm={"name": "reference", "argv": ["serve"], "env": {}},
        source_run="/runs/ref",
        rows=tuple(rows),
    )


def gate(gates: Sequence[GateResult], name: str) -> GateResult:
    (found,) = [g for g in gates if g.name == name]
    return found


# --------------------------------------------------------------------------- first_divergence


@pytest.mark.parametrize(
    ("expected", "got", "index"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [7, 2, 3], 0),
        ([1, 2, 3, 4, 5], [1, 2, 3], 3),  # the leg stopped early
        ([1, 2], [1, 2, 3, 4], 2),  # the leg ran on
        ([], [5], 0),
        ("abcd", "abXd", 2),
        ("abc", "abcde", 3),
    ],
)
def test_first_divergence(expected: Sequence[Any], got: Sequence[Any], index: int | None) -> None:
    assert first_divergence(expected, got) == index


# --------------------------------------------------------------------------- teacher_exact


def test_teacher_exact_passes_on_identical_token_ids() -> None:
    teacher = make_teacher([trow(0, (5, 6, 7)), trow(1, (8, 9)), trow(2, (1,))])
    rows = [outcome(0, (5, 6, 7)), outcome(1, (8, 9)), outcome(2, (1,))]
    g = teacher_exact(rows, teacher)
    assert g.status is PASS and g.count == "3/3" and g.required
    assert g.reason == "every row matches the teacher: 3/3 by ids"
    assert g.evidence["compared_by"] == ["token_ids"]
    assert g.evidence["teacher_sha256"] == teacher.sha256
    assert g.evidence["divergences"] == []
    assert "fallback" not in g.evidence
    assert not g.blocks_validity


def test_teacher_exact_reports_first_divergent_token_and_its_context() -> None:
    ref = list(range(100, 112))  # 12 tokens
    mine = list(ref)
    mine[6] = 999
    teacher = make_teacher([trow(0), trow(1, ref), trow(2)])
    rows = [outcome(0), outcome(1, mine), outcome(2)]
    g = teacher_exact(rows, teacher)
    assert g.status is FAIL and g.count == "2/3"
    assert g.reason == "row 1 (r1): first divergent token at index 6 (teacher has 12, this leg 12)"
    (d,) = g.evidence["divergences"]
    assert d["row"] == 1 and d["row_id"] == "r1" and d["mode"] == "token_ids" and d["index"] == 6
    # CONTEXT_TOKENS (4) on each side: indices 2..10 inclusive.
    assert CONTEXT_TOKENS == 4
    assert d["expected"] == [102, 103, 104, 105, 106, 107, 108, 109, 110]
    assert d["got"] == [102, 103, 104, 105, 999, 107, 108, 109, 110]
    assert g.blocks_validity


def test_teacher_exact_context_window_is_clipped_at_the_start() -> None:
    ref = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    mine = [10, 77, 12, 13, 14, 15, 16, 17, 18, 19]
    d = compare_row(outcome(0, mine), trow(0, ref))
    assert d is not None and d.index == 1
    assert d.expected == [10, 11, 12, 13, 14, 15]  # indices 0..5
    assert d.got == [10, 77, 12, 13, 14, 15]


def test_teacher_exact_length_difference() -> None:
    teacher = make_teacher([trow(0, (1, 2, 3, 4, 5))])
    g = teacher_exact([outcome(0, (1, 2, 3))], teacher)
    assert g.status is FAIL and g.count == "0/1"
    assert g.reason == "row 0 (r0): first divergent token at index 3 (teacher has 5, this leg 3)"
    (d,) = g.evidence["divergences"]
    assert d["index"] == 3
    assert d["expected"] == [1, 2, 3, 4, 5] and d["got"] == [1, 2, 3]


def test_teacher_exact_prompt_hash_mismatch() -> None:
    teacher = make_teacher([trow(0, prompt="the teacher's prompt"), trow(1)])
    rows = [outcome(0, prompt="a different prompt"), outcome(1)]
    g = teacher_exact(rows, teacher)
    assert g.status is FAIL and g.count == "1/2"
    assert g.reason == "row 0 (r0): prompt differs from the teacher's"
    (d,) = g.evidence["divergences"]
    assert d["index"] is None and d["expected"] == [] and d["got"] == []


def test_teacher_exact_falls_back_to_text_when_the_leg_has_no_token_ids() -> None:
    teacher = make_teacher([trow(0, (1, 2)), trow(1, (3, 4))])
    rows = [outcome(0, None, text=" t1 t2", n_tokens=2), outcome(1, None, text=" t3 t4", n_tokens=2)]
    g = teacher_exact(rows, teacher)
    assert g.status is PASS and g.count == "2/2"
    assert g.reason == ("every row matches the teacher: 0/2 by ids, 2 by text "
                        "(row 0: the server sent no token ids; 1 more)")
    assert g.evidence["compared_by"] == ["text"]
    assert [r["why"] for r in g.evidence["rows_by_text"]] == ["the server sent no token ids"] * 2
    # Rule 1 (leg gates v1), as older evidence was sealed with: its own words.
    old = teacher_exact(rows, teacher, rule=1)
    assert old.reason == "every row matches the teacher text"
    assert old.evidence["fallback"] == "some rows compared by text: the server returned no token ids"


def test_teacher_exact_text_fallback_reports_first_divergent_character() -> None:
    # Teacher without ids, leg with ids: still compared by text.
    teacher = make_teacher([trow(0, None, text="hello world"), trow(1, (3, 4))])
    rows = [outcome(0, (1, 2), text="hello w0rld", n_tokens=2), outcome(1, (3, 4))]
    g = teacher_exact(rows, teacher)
    assert g.status is FAIL and g.count == "1/2"
    assert g.reason == "row 0 (r0): first divergent character at index 7 (teacher has 11, this leg 11)"
    assert g.evidence["compared_by"] == ["text", "token_ids"]
    assert g.evidence["rows_by_token_ids"] == 1
    assert g.evidence["rows_by_text"] == [{"row": 0, "row_id": "r0", "ids_checked": 0,
                                           "why": "the teacher has no token ids for it"}]
    (d,) = g.evidence["divergences"]
    # Characters 3..11 (index 7 +- 4), kept as a list of single characters.
    assert d["mode"] == "text" and d["expected"] == list("lo world") and d["got"] == list("lo w0rld")


def test_teacher_exact_token_ids_win_over_text() -> None:
    # Same ids, different text (e.g. a detokenizer change): token ids are the evidence.
    teacher = make_teacher([trow(0, (1, 2), text="ab")])
    g = teacher_exact([outcome(0, (1, 2), text="AB")], teacher)
    assert g.status is PASS and g.evidence["compared_by"] == ["token_ids"]


def test_teacher_exact_row_not_in_teacher_and_row_count() -> None:
    teacher = make_teacher([trow(0), trow(1)])
    rows = [outcome(0), outcome(1), outcome(2)]
    g = teacher_exact(rows, teacher)
    assert g.status is FAIL and g.count == "2/3"
    assert g.reason == "row 2 (r2): row not in the teacher"
    reasons = [d["reason"] for d in g.evidence["divergences"]]
    assert reasons == ["row not in the teacher"]


def test_teacher_exact_leg_shorter_than_teacher_fails() -> None:
    teacher = make_teacher([trow(0), trow(1), trow(2)])
    g = teacher_exact([outcome(0), outcome(1)], teacher)
    # Both rows the leg has are exact, but a leg that stopped early is not teacher-exact.
    assert g.status is FAIL and g.count == "2/2"
    assert g.reason == "the leg has 2 rows, the teacher 3"
    assert g.evidence["rows_missing_from_leg"] == 1


def test_teacher_exact_without_teacher_is_not_tested_and_blocks() -> None:
    g = teacher_exact([outcome(0)], None)
    assert g.status is NOT_TESTED and g.count is None and g.required
    assert "no teacher given" in g.reason and "--teacher FILE" in g.reason
    assert g.blocks_validity


def test_exactness_per_row() -> None:
    teacher = make_teacher([trow(0, (1, 2)), trow(1, (3, 4)), trow(2, (5, 6))])
    rows = [outcome(0, (1, 2)), outcome(1, (3, 9)), outcome(2, (5, 6)), outcome(3, (7,))]
    assert exactness(rows, teacher) == {0: True, 1: False, 2: True, 3: False}
    assert exactness(rows, None) == {}


# --------------------------------------------------------------------------- cross_leg_exact


def test_cross_leg_exact_single_leg_not_tested() -> None:
    g = cross_leg_exact({"a": [outcome(0)]})
    assert g.status is NOT_TESTED and not g.required and g.reason == "fewer than two legs"
    assert not g.blocks_validity


def test_cross_leg_exact_pass() -> None:
    legs = {"a": [outcome(0), outcome(1), outcome(2)], "b": [outcome(0), outcome(1), outcome(2)]}
    g = cross_leg_exact(legs)
    assert g.status is PASS and g.count == "6/6"
    assert g.reason == "all 2 legs produced identical outputs"
    assert g.evidence == {"legs": ["a", "b"], "mismatches": []}


def test_cross_leg_exact_fail_names_leg_row_and_index() -> None:
    legs = {
        "a": [outcome(0, (1, 2, 3)), outcome(1, (4, 5, 6)), outcome(2)],
        "b": [outcome(0, (1, 2, 3)), outcome(1, (4, 5, 0)), outcome(2)],
        "c": [outcome(0, (1, 2, 3)), outcome(1, (4, 5, 6)), outcome(2)],
    }
    g = cross_leg_exact(legs)
    assert g.status is FAIL and g.count == "8/9"
    assert g.reason == "1 rows differ between legs"
    assert g.evidence["mismatches"] == [
        {"leg": "b", "row": 1, "index": 2, "compared_by": "token_ids"}]


def test_cross_leg_exact_text_only_legs_and_row_count_mismatch() -> None:
    legs = {
        "a": [outcome(0, None, text="same"), outcome(1, None, text="abcdef")],
        "b": [outcome(0, None, text="same")],
    }
    g = cross_leg_exact(legs)
    assert g.status is FAIL
    assert g.evidence["mismatches"] == [{"leg": "b", "row": None, "index": None}]
    legs["b"] = [outcome(0, None, text="same"), outcome(1, None, text="abcXef")]
    g = cross_leg_exact(legs)
    assert g.status is FAIL and g.count == "3/4"
    assert g.evidence["mismatches"] == [{"leg": "b", "row": 1, "index": 3, "compared_by": "text"}]


# --------------------------------------------------------------------------- cached_tokens_zero


def test_cached_tokens_zero_pass() -> None:
    rows = [outcome(0), outcome(1), outcome(2)]
    g = cached_tokens_zero(rows, prefix_hits=0, prefix_queries=120)
    assert g.status is PASS and g.count == "3/3"
    assert g.reason == "usage reports 0 cached tokens on every row and 0 engine prefix-cache hits"
    assert g.evidence == {"rows_reported": 3, "rows_nonzero": [], "prefix_cache_hits_delta": 0,
                          "prefix_cache_queries_delta": 120}


def test_cached_tokens_zero_notes_prefix_caching_off() -> None:
    g = cached_tokens_zero([outcome(0)], prefix_hits=0, prefix_queries=0)
    assert g.status is PASS and g.count == "1/1"
    assert g.reason.endswith("prefix-cache hits (prefix caching off: no lookups)")
    g = cached_tokens_zero([outcome(0)], prefix_hits=0, prefix_queries=None)
    assert g.status is PASS and "prefix caching off" not in g.reason


def test_cached_tokens_zero_fails_on_usage_cached_tokens() -> None:
    rows = [outcome(0), outcome(1, cached=16), outcome(2)]
    g = cached_tokens_zero(rows, prefix_hits=0, prefix_queries=30)
    assert g.status is FAIL and g.count == "2/3"
    assert g.reason == "rows [1] report cached prompt tokens"
    assert g.evidence["rows_nonzero"] == [1]


def test_cached_tokens_zero_fails_on_engine_hits() -> None:
    rows = [outcome(0), outcome(1)]
    g = cached_tokens_zero(rows, prefix_hits=48, prefix_queries=60)
    assert g.status is FAIL and g.count == "2/2"
    assert g.reason == "the engine counted 48 prefix-cache hits"
    g = cached_tokens_zero([outcome(0, cached=4), outcome(1)], prefix_hits=48, prefix_queries=60)
    assert g.reason == "rows [0] report cached prompt tokens; the engine counted 48 prefix-cache hits"


def test_cached_tokens_zero_engine_hits_fail_even_without_usage_details() -> None:
    g = cached_tokens_zero([outcome(0, cached=None)], prefix_hits=3, prefix_queries=10)
    assert g.status is FAIL and g.count == "0/1"


def test_cached_tokens_zero_missing_usage_details_is_not_tested_and_blocks() -> None:
    rows = [outcome(0), outcome(1, cached=None), outcome(2)]
    g = cached_tokens_zero(rows, prefix_hits=0, prefix_queries=30)
    assert g.status is NOT_TESTED and g.count == "2/3" and g.required
    assert g.reason.startswith("1 rows carry no usage.prompt_tokens_details.cached_tokens")
    assert "--enable-prompt-tokens-details" in g.reason
    assert g.blocks_validity


def test_cached_tokens_zero_without_hit_counter_is_not_tested() -> None:
    g = cached_tokens_zero([outcome(0), outcome(1)], prefix_hits=None, prefix_queries=None)
    assert g.status is NOT_TESTED and g.count == "2/2"
    assert g.reason == "the server exposes no prefix-cache hit counter on /metrics"
    assert g.blocks_validity


# --------------------------------------------------------------------------- full_output_then_next


def full(row: int, **kw: Any) -> RowOutcome:
    """A row that used its whole max_tokens budget."""
    return outcome(row, (1, 2, 3, 4), max_tokens=4, finish="length", **kw)


def test_full_output_then_next_pass() -> None:
    rows = [full(0), outcome(1), outcome(2)]
    g = full_output_then_next(rows, {0: True, 1: True, 2: True})
    assert g.status is PASS and g.count == "1/1" and not g.required
    assert g.reason == "rows 0 then 1 prove a full output then next"
    assert g.evidence == {"pairs": [(0, 1)]}


def test_full_output_then_next_fail() -> None:
    rows = [full(0), outcome(1), full(2), outcome(3)]
    g = full_output_then_next(rows, {0: True, 1: True, 2: True, 3: False})
    assert g.status is FAIL and g.count == "1/2"
    assert g.reason == "a row after a full output diverged"
    assert g.evidence["pairs"] == [(0, 1), (2, 3)]
    assert g.blocks_validity  # optional, but a fail always blocks


def test_full_output_then_next_not_tested() -> None:
    # Only the last row is full; row 0 stopped short; row 1 hit 'length' short of max_tokens.
    rows = [outcome(0), outcome(1, (1, 2), max_tokens=4, finish="length"), full(2)]
    g = full_output_then_next(rows, {0: True, 1: True, 2: True})
    assert g.status is NOT_TESTED and g.reason == "no row reached max_tokens with a row after it"
    g = full_output_then_next([full(0), outcome(1)], {})
    assert g.status is NOT_TESTED and g.reason == "no teacher: exactness of the next row unknown"
    assert not g.blocks_validity


# --------------------------------------------------------------------------- long_context_then_next


def sized(*prompt_tokens: int | None) -> list[RowOutcome]:
    return [outcome(i, prompt_tokens=p) for i, p in enumerate(prompt_tokens)]


ALL_EXACT = {i: True for i in range(10)}


def test_long_context_below_threshold_not_tested() -> None:
    g = long_context_then_next(sized(100, 300, 200), ALL_EXACT, threshold=800)
    assert g.status is NOT_TESTED and not g.required
    assert g.reason == "the longest prompt has 300 tokens, below the declared threshold 800"
    assert g.evidence == {"threshold": 800, "longest_row": 1, "longest_prompt_tokens": 300}


def test_long_context_longest_is_last_row_not_tested() -> None:
    g = long_context_then_next(sized(100, 200, 863), ALL_EXACT, threshold=800)
    assert g.status is NOT_TESTED and g.count is None
    assert g.reason == ("the 863-token prompt is row 2, the last row, so this run does not test "
                        "long-context-then-next")
    assert g.evidence["longest_row"] == 2


def test_long_context_pass() -> None:
    g = long_context_then_next(sized(100, 900, 200), ALL_EXACT, threshold=800)
    assert g.status is PASS and g.count == "1/1"
    assert g.reason == "the 900-token prompt (row 1) is followed by an exact row"
    assert g.evidence["pairs"] == [(1, 2)]


def test_long_context_threshold_is_inclusive() -> None:
    g = long_context_then_next(sized(800, 10), ALL_EXACT, threshold=800)
    assert g.status is PASS and g.evidence["pairs"] == [(0, 1)]


def test_long_context_fail_when_next_row_diverges() -> None:
    g = long_context_then_next(sized(100, 900, 200), {0: True, 1: True, 2: False}, threshold=800)
    assert g.status is FAIL and g.count == "0/1"
    assert g.reason == "the 900-token prompt (row 1) is followed by a divergent row"


def test_long_context_without_teacher_or_counts() -> None:
    g = long_context_then_next(sized(100, 900, 200), {}, threshold=800)
    assert g.status is NOT_TESTED and g.reason == "no teacher: exactness of the next row unknown"
    g = long_context_then_next(sized(None, None), ALL_EXACT, threshold=800)
    assert g.status is NOT_TESTED and g.reason == "the server reported no prompt token counts"


def test_long_context_reason_names_the_row_actually_followed() -> None:
    # Row 0 (900 tokens) is followed by row 1; row 2 (1000 tokens) is last.
    g = long_context_then_next(sized(900, 100, 1000), ALL_EXACT, threshold=800)
    assert g.status is PASS and g.evidence["pairs"] == [(0, 1)]
    assert "(row 2) is followed" not in g.reason
    assert "the 900-token prompt (row 0) is followed by an exact row" in g.reason


# --------------------------------------------------------------------------- rollover


def test_rollover_no_boundary_not_tested() -> None:
    g = rollover([outcome(0)], ALL_EXACT, None)
    assert g.status is NOT_TESTED and not g.required
    assert g.reason.startswith("no boundary declared")


def test_rollover_no_crossing_row_not_tested() -> None:
    rows = [outcome(0, prompt_tokens=100), outcome(1, prompt_tokens=None)]
    g = rollover(rows, ALL_EXACT, 4096)
    assert g.status is NOT_TESTED
    assert g.reason == "no row's prompt + output crosses 4096 tokens"
    assert g.evidence == {"boundary": 4096, "rows": []}


def crossing_rows() -> list[RowOutcome]:
    eight = tuple(range(8))
    return [
        # crossing: prompt < boundary < prompt + n - 1 (the last token's context)
        outcome(0, eight, prompt_tokens=100),  # 100 < 105 < 107: crosses
        outcome(1, eight, prompt_tokens=105),  # starts at the boundary: does not cross
        outcome(2, eight, prompt_tokens=98),  # 98 < 105 == 105: reaches it, does not exceed
        outcome(3, eight, prompt_tokens=97),  # 97 < 105 < 104? no: 104 < 105
        outcome(4, eight, prompt_tokens=99),  # 99 < 105 < 106: crosses
    ]


def test_rollover_pass() -> None:
    g = rollover(crossing_rows(), ALL_EXACT, 105)
    assert g.status is PASS and g.count == "2/2"
    assert g.reason == "rows crossing 105 tokens: [0, 4]"
    assert g.evidence == {"boundary": 105, "rows": [0, 4]}


def test_rollover_fail() -> None:
    g = rollover(crossing_rows(), {0: True, 1: True, 2: True, 3: True, 4: False}, 105)
    assert g.status is FAIL and g.count == "1/2"


def test_rollover_without_teacher() -> None:
    g = rollover(crossing_rows(), {}, 105)
    assert g.status is NOT_TESTED and g.reason == "no teacher: exactness unknown"


# --------------------------------------------------------------------------- token_count_integrity


def test_token_count_integrity_pass() -> None:
    rows = [outcome(0, (1, 2, 3), max_tokens=8, finish="stop"),
            outcome(1, (1, 2, 3, 4), max_tokens=4, finish="length")]
    g = token_count_integrity(rows)
    assert g.status is PASS and g.count == "2/2"
    assert g.reason == ("reported completion tokens equal tokens received; finish reasons "
                        "consistent")
    assert g.evidence == {"problems": []}


def test_token_count_integrity_not_tested_without_usage() -> None:
    g = token_count_integrity([outcome(0), outcome(1, (1, 2, 3), completion_tokens=None)])
    assert g.status is NOT_TESTED and g.required
    assert g.evidence == {"rows_unreported": [1]}
    assert "include_usage" in g.reason


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (outcome(1, (1, 2, 3), completion_tokens=4), "server reported 4 completion tokens, 3 received"),
        (outcome(1, (1, 2, 3), max_tokens=8, finish="length"), "finish_reason length after 3 of 8 tokens"),
        (outcome(1, (1, 2, 3, 4), max_tokens=4, finish="stop"), "finish_reason 'stop' at max_tokens"),
        (outcome(1, (1, 2, 3), max_tokens=8, finish=None), "no finish_reason"),
        (outcome(1, (1, 2, 3, 4), max_tokens=4, finish=None), "finish_reason None at max_tokens"),
    ],
)
def test_token_count_integrity_fail(row: RowOutcome, problem: str) -> None:
    g = token_count_integrity([outcome(0), row, outcome(2)])
    assert g.status is FAIL and g.count == "2/3"
    assert g.reason == problem
    assert g.evidence == {"problems": [{"row": 1, "problem": problem}]}


def test_token_count_integrity_reason_is_the_first_problem() -> None:
    rows = [outcome(0, (1, 2), completion_tokens=3), outcome(1), outcome(2, finish=None)]
    g = token_count_integrity(rows)
    assert g.count == "1/3" and g.reason == "server reported 3 completion tokens, 2 received"
    assert [p["row"] for p in g.evidence["problems"]] == [0, 2]


# --------------------------------------------------------------------------- request_log_gates

POST = '127.0.0.1 - - [01/Jan/2026 00:00:00] "POST /v1/completions HTTP/1.1" 200 -\n'
NOISE = ('"GET /health HTTP/1.1" 200\n"GET /v1/models HTTP/1.1" 200\n"GET /metrics HTTP/1.1" 200\n'
         '"POST /tokenize HTTP/1.1" 200\n')
ZERO_COUNTERS = {"vllm:request_success_total": 0.0, "vllm:generation_tokens_total": 0.0,
                 "vllm:prompt_tokens_total": 42.0}


def log_gates(
    rows: Sequence[RowOutcome] | None = None,
    requested: Sequence[int] = (0, 1, 2),
    *,
    before: dict[str, float] | None = ZERO_COUNTERS,
    server_log: str = NOISE + POST * 3,
) -> list[GateResult]:
    rows = rows if rows is not None else [outcome(0), outcome(1), outcome(2)]
    return request_log_gates(rows, [{"kind": "request", "row": r} for r in requested], 3, before,
                             server_log)


def test_request_log_gates_all_pass() -> None:
    gates = log_gates()
    assert [g.name for g in gates] == ["fresh_unique_prompts", "single_active_generation",
                                       "no_warmup_generation", "one_suite_invocation", "zero_retries"]
    assert all(g.status is PASS for g in gates)
    assert gate(gates, "fresh_unique_prompts").count == "3/3"
    warm = gate(gates, "no_warmup_generation")
    assert warm.reason == ("the first request the server received was row 0 (its generation "
                           "counters were 0 before it)")
    assert warm.evidence == {
        "first_request_row": 0,
        "server_counters_before_suite": {"vllm:request_success_total": 0.0,
                                         "vllm:generation_tokens_total": 0.0},
        "generation_requests_in_server_log": 3,  # GET and /tokenize lines do not count
    }
    one = gate(gates, "one_suite_invocation")
    assert one.count == "1" and one.evidence == {"rows_requested": [0, 1, 2], "rows_planned": 3}
    assert gate(gates, "zero_retries").count == "0"


def test_no_warmup_without_metrics_says_nothing_about_counters() -> None:
    warm = gate(log_gates(before=None), "no_warmup_generation")
    assert warm.status is PASS and warm.reason == "the first request the server received was row 0"
    assert "server_counters_before_suite" not in warm.evidence


def test_no_warmup_first_request_not_row_zero() -> None:
    gates = log_gates(rows=[outcome(1), outcome(2)], requested=(1, 2), server_log=POST * 2)
    warm = gate(gates, "no_warmup_generation")
    assert warm.status is FAIL and warm.reason == "the first request was row 1, not row 0"
    assert warm.evidence["first_request_row"] == 1
    assert gate(gates, "one_suite_invocation").status is FAIL


def test_no_warmup_server_counters_before_suite() -> None:
    before = {"vllm:request_success_total": 1.0, "vllm:generation_tokens_total": 16.0}
    warm = gate(log_gates(before=before), "no_warmup_generation")
    assert warm.status is FAIL
    assert warm.reason == ("the server had generated before row 0: {'vllm:request_success_total': "
                           "1.0, 'vllm:generation_tokens_total': 16.0}")


def test_no_warmup_server_log_has_more_generation_requests() -> None:
    chat = '"POST /v1/chat/completions HTTP/1.1" 200\n'
    warm = gate(log_gates(server_log=chat + POST * 3), "no_warmup_generation")
    assert warm.status is FAIL
    assert warm.reason == "the server log shows 4 generation requests, the harness sent 3"
    assert warm.evidence["generation_requests_in_server_log"] == 4


def test_no_warmup_problems_are_joined() -> None:
    warm = gate(log_gates(requested=(2, 0, 1), before={"vllm:request_success_total": 2.0},
                          server_log=POST * 5), "no_warmup_generation")
    assert warm.reason.count("; ") == 2
    assert warm.reason.startswith("the first request was row 2, not row 0; the server had generated")


def test_single_active_generation_overlap() -> None:
    rows = [outcome(0, t_send_ns=0, t_end_ns=1000),
            outcome(1, t_send_ns=999, t_end_ns=2000),  # sent before row 0 ended
            outcome(2, t_send_ns=2000, t_end_ns=3000)]  # sent exactly as row 1 ended: fine
    single = gate(log_gates(rows), "single_active_generation")
    assert single.status is FAIL
    assert single.reason == "requests overlapped: [(0, 1)]"
    assert single.evidence == {"overlaps": [(0, 1)]}


def test_repeated_row_fails_retries_and_suite_invocation() -> None:
    gates = log_gates(requested=(0, 1, 1, 2), server_log=POST * 4)
    retries = gate(gates, "zero_retries")
    assert retries.status is FAIL and retries.count == "1"
    assert retries.reason == "1 rows were requested again"
    one = gate(gates, "one_suite_invocation")
    assert one.status is FAIL and one.count == "0"
    assert one.reason == "rows requested out of order or repeated: [0, 1, 1, 2]"
    assert gate(gates, "no_warmup_generation").status is PASS  # 4 logged, 4 sent


def test_duplicate_prompt_fails_fresh_unique_prompts() -> None:
    rows = [outcome(0, prompt="same"), outcome(1), outcome(2, prompt="same")]
    fresh = gate(log_gates(rows), "fresh_unique_prompts")
    assert fresh.status is FAIL and fresh.count == "2/3"
    assert fresh.reason == "1 repeated prompts"
    assert fresh.evidence["prompt_sha256"] == [sha("same"), sha("prompt 1"), sha("same")]


# --------------------------------------------------------------------------- small gates


def test_first_valid_score() -> None:
    g = first_valid_score(1)
    assert g.name == "first_valid_score_is_reported_score"
    assert g.status is PASS and g.evidence == {"attempts": 1}
    g = first_valid_score(3)  # two earlier attempts that the evidence does not show
    assert g.status is FAIL and g.evidence == {"attempts": 3, "earlier": []}
    assert g.reason == "attempt 3, but 0 earlier attempts are in the evidence"


def test_first_valid_score_fails_when_an_earlier_attempt_completed() -> None:
    """Issue 30: the gate always passed; a leg rerun after a complete attempt (a score
    thrown away for a better one) must fail it."""
    g = first_valid_score(2, ["complete"])
    assert g.status is FAIL and g.blocks_validity
    assert g.reason == "attempt 1 of this leg completed before this one: its score was replaced"
    g = first_valid_score(3, ["interrupted", None])  # a clean stop, then a hard kill
    assert g.status is PASS and g.evidence == {"attempts": 3, "earlier": ["interrupted", None]}
    assert g.reason == "attempt 3 is the first to complete: the 2 before it were interrupted"
    assert first_valid_score(2, ["interrupted", "complete"]).status is FAIL  # too many


def test_cleanup_gate() -> None:
    g = cleanup_gate(True, 0, False)
    assert g.status is PASS and g.reason == "0 surviving processes, port closed"
    assert g.evidence == {"surviving_workers": 0, "port_listening_after": False}
    g = cleanup_gate(False, 2, True)
    assert g.status is FAIL and g.reason == "2 surviving processes, port open"
    g = cleanup_gate(None, None, None)
    assert g.status is NOT_TESTED and g.reason == "the server was never started"
    assert g.required and g.blocks_validity


# --------------------------------------------------------------------------- LogRule / attestation

LOG = """INFO fp8 draft projection prepared (rank 0)
INFO fp8 draft projection prepared (rank 1)
INFO width12 router context stack enabled
WARNING something harmless
"""


@pytest.mark.parametrize(
    ("rule", "holds", "found"),
    [
        (LogRule(claim="c", pattern=r"fp8 draft projection"), True, 2),
        (LogRule(claim="c", pattern=r"lm_head prepared"), False, 0),
        (LogRule(claim="c", pattern=r"^INFO", expect="present"), True, 3),  # MULTILINE: line starts
        (LogRule(claim="c", pattern=r"^WARNING something", expect="present"), True, 1),
        (LogRule(claim="c", pattern=r"ERROR", expect="absent"), True, 0),
        (LogRule(claim="c", pattern=r"WARNING", expect="absent"), False, 1),
        (LogRule(claim="c", pattern=r"fp8 draft projection", expect="count", count=2), True, 2),
        (LogRule(claim="c", pattern=r"fp8 draft projection", expect="count", count=31), False, 2),
        (LogRule(claim="c", pattern=r"rank \d\)$", expect="count", count=2), True, 2),  # $ per line
    ],
)
def test_log_rule_check(rule: LogRule, holds: bool, found: int) -> None:
    assert rule.check(LOG) == (holds, found)


def test_treatment_attestation_no_rules_not_tested() -> None:
    g = treatment_attestation((), LOG)
    assert g.status is NOT_TESTED and not g.required and not g.blocks_validity
    assert g.reason == "the arm declares no log rules"


def test_treatment_attestation_all_claims_hold() -> None:
    rules = (LogRule(claim="fp8 draft", pattern="fp8 draft projection", expect="count", count=2),
             LogRule(claim="no errors", pattern="ERROR", expect="absent", required=True))
    g = treatment_attestation(rules, LOG)
    assert g.status is PASS and g.count == "2/2" and not g.required
    assert g.reason == "2 of 2 claims supported by the server log"
    assert [c["statement"] for c in g.evidence["claims"]] == ["fp8 draft: claimed", "no errors: claimed"]
    assert g.evidence["claims"][0] == {"claim": "fp8 draft", "holds": True, "found": 2,
                                       "expected": "count 2", "statement": "fp8 draft: claimed"}


def test_treatment_attestation_optional_rule_not_holding_is_not_claimed() -> None:
    rules = (LogRule(claim="width12 stack", pattern="width12 router context"),
             LogRule(claim="draft lm_head attribution", pattern="lm_head prepared"))
    g = treatment_attestation(rules, LOG)
    assert g.status is PASS and g.count == "1/2"  # an optional claim not made does not fail
    assert g.reason == ("1 of 2 claims supported by the server log; not claimed: draft lm_head "
                        "attribution (log evidence present does not hold)")
    lm = g.evidence["claims"][1]
    assert lm["holds"] is False and lm["found"] == 0 and lm["expected"] == "present"
    assert lm["statement"] == ("draft lm_head attribution: not claimed because the expected log "
                               "evidence (present, found 0) does not hold")


def test_treatment_attestation_required_rule_not_holding_fails() -> None:
    rules = (LogRule(claim="width12 stack", pattern="width12 router context"),
             LogRule(claim="fp8 on every rank", pattern="fp8 draft projection", expect="count",
                     count=4, required=True))
    g = treatment_attestation(rules, LOG)
    assert g.status is FAIL and g.count == "1/2" and g.blocks_validity
    assert g.reason == "required claims not supported by the log: ['fp8 on every rank']"
    assert g.evidence["claims"][1]["statement"] == (
        "fp8 on every rank: not claimed because the expected log evidence (count 4, found 2) "
        "does not hold")


# --------------------------------------------------------------------------- validity


def result(status: GateStatus, required: bool, name: str = "g") -> GateResult:
    return GateResult(name=name, status=status, required=required)


@pytest.mark.parametrize(
    ("status", "required", "blocks"),
    [
        (PASS, True, False),
        (PASS, False, False),
        (NOT_TESTED, True, True),
        (NOT_TESTED, False, False),
        (FAIL, True, True),
        (FAIL, False, True),
    ],
)
def test_blocks_validity(status: GateStatus, required: bool, blocks: bool) -> None:
    assert result(status, required).blocks_validity is blocks


def test_leg_valid() -> None:
    ok = [result(PASS, True, "a"), result(NOT_TESTED, False, "b"), result(PASS, False, "c")]
    assert leg_valid(ok) == (True, [])
    bad = [result(PASS, True, "a"), result(FAIL, False, "b"), result(NOT_TESTED, False, "c"),
           result(NOT_TESTED, True, "d")]
    assert leg_valid(bad) == (False, ["b: fail", "d: not tested"])
    assert leg_valid([]) == (True, [])


# --------------------------------------------------------------------------- teacher file


def sample_teacher() -> Teacher:
    return make_teacher([trow(0, (5, 6, 7)), trow(1, None, text="ünïcode text")])


def test_write_teacher_writes_canonical_bytes_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "teacher.json"
    teacher = sample_teacher()
    assert write_teacher(path, teacher) == path
    data = path.read_bytes()
    assert data == canonical_json(teacher.to_json()) + b"\n"
    assert json.loads(data)["schema"] == SCHEMA_TEACHER
    other = make_teacher([trow(0, (1,))])
    with pytest.raises(FileExistsError):
        write_teacher(path, other)
    assert path.read_bytes() == data  # the first teacher is untouched


def test_load_teacher_round_trips_and_hash_is_the_file_hash(tmp_path: Path) -> None:
    teacher = sample_teacher()
    path = write_teacher(tmp_path / "teacher.json", teacher)
    loaded = load_teacher(path)
    assert loaded == teacher
    assert loaded.rows[0].token_ids == (5, 6, 7) and loaded.rows[1].token_ids is None
    file_hash = hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.sha256 == teacher.sha256 == file_hash
    # One token more changes the hash.
    changed = make_teacher([trow(0, (5, 6, 7, 8)), trow(1, None, text="ünïcode text")])
    assert changed.sha256 != file_hash


def test_teacher_hash_is_of_the_canonical_form(tmp_path: Path) -> None:
    teacher = sample_teacher()
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(teacher.to_json(), indent=2), encoding="utf-8")
    loaded = load_teacher(path)
    assert loaded.sha256 == teacher.sha256
    assert loaded.sha256 != hashlib.sha256(path.read_bytes()).hexdigest()


def test_load_teacher_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema": "tokrecord.teacher/v1",\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="teacher is not valid JSON") as exc:
        load_teacher(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d.update(schema="tokrecord.teacher/v3"), "schema"),
        (lambda d: d.pop("rows"), "rows"),
        (lambda d: d.pop("suite_sha256"), "suite_sha256"),
        (lambda d: d["rows"][0].update(token_ids="not ids"), "rows.0.token_ids"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_load_teacher_wrong_schema_or_missing_key(tmp_path: Path, edit: Any, key: str) -> None:
    raw = sample_teacher().to_json()
    edit(raw)
    path = tmp_path / "teacher.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match="not a tokrecord teacher") as exc:
        load_teacher(path)
    message = str(exc.value)
    assert str(path) in message and f"key '{key}'" in message


def test_load_teacher_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(ConfigError, match="cannot read teacher") as exc:
        load_teacher(path)
    assert str(path) in str(exc.value)


def test_load_teacher_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=str(path)):
        load_teacher(path)


def test_log_rule_count_needs_count_and_valid_regex() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'count' is required"):
        LogRule(claim="c", pattern="x", expect="count")
    with pytest.raises(ValidationError, match="'count' is required"):
        LogRule(claim="c", pattern="x", expect="present", count=3)
    with pytest.raises(ValidationError):
        LogRule(claim="c", pattern="(unclosed")
