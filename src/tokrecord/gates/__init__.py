"""Quality gates: pure functions from what a leg recorded to named verdicts.

A speed figure counts only when the outputs are unchanged and nothing cached or
warmed helped. Each gate returns pass / fail / not tested, a count ("13/13"),
a one-line reason and the evidence behind it. "Not tested" is not "failed": it
says the run could not exercise the gate and why (e.g. the long prompt is the
last row). A leg is valid when no gate failed and every required gate passed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, Final, Literal, NamedTuple, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokrecord.engines.base import Capability
from tokrecord.engines.vllm import VLLM_CACHED_HINT, VLLM_GENERATION_LINE, VLLM_METRICS
from tokrecord.gates.teacher import Teacher, TeacherRow
from tokrecord.probes.idle import IdleResult

CONTEXT_TOKENS = 4  # tokens shown on each side of a divergence

# Every gate's name: the one place they are spelled (GATES below is the registry).
TEACHER_EXACT: Final = "teacher_exact"
CROSS_LEG_EXACT: Final = "cross_leg_exact"
CACHED_TOKENS_ZERO: Final = "cached_tokens_zero"
FULL_OUTPUT_THEN_NEXT: Final = "full_output_then_next"
LONG_CONTEXT_THEN_NEXT: Final = "long_context_then_next"
ROLLOVER: Final = "rollover"
TOKEN_COUNT_INTEGRITY: Final = "token_count_integrity"
FRESH_UNIQUE_PROMPTS: Final = "fresh_unique_prompts"
SINGLE_ACTIVE_GENERATION: Final = "single_active_generation"
NO_WARMUP_GENERATION: Final = "no_warmup_generation"
ONE_SUITE_INVOCATION: Final = "one_suite_invocation"
ZERO_RETRIES: Final = "zero_retries"
FIRST_VALID_SCORE: Final = "first_valid_score_is_reported_score"
CLEANUP: Final = "cleanup"
TREATMENT_ATTESTATION: Final = "treatment_attestation"
IDLE_BEFORE: Final = "idle_before"
IDLE_AFTER: Final = "idle_after"
CLOCKS_STABLE: Final = "clocks_stable"


class GateStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_TESTED = "not tested"


class GateResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    status: GateStatus
    count: str | None = None
    required: bool = True
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)

    @property
    def blocks_validity(self) -> bool:
        return self.status is GateStatus.FAIL or (
            self.required and self.status is not GateStatus.PASS
        )


class LogRule(BaseModel):
    """A fact about the server log that must hold before a treatment claim is made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    claim: str
    pattern: str
    expect: Literal["present", "absent", "count"] = "present"
    count: int | None = None
    required: bool = False  # a required rule that does not hold fails the gate

    @model_validator(mode="after")
    def _count_given_for_count_rules(self) -> LogRule:
        if (self.expect == "count") != (self.count is not None):
            raise ValueError("'count' is required with expect = \"count\" and only then")
        try:  # a bad regex is a config error now, not a silent non-match later
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {self.pattern!r}: {exc}") from exc
        return self

    def check(self, log_text: str) -> tuple[bool, int]:
        found = len(re.findall(self.pattern, log_text, flags=re.MULTILINE))
        if self.expect == "present":
            return found > 0, found
        if self.expect == "absent":
            return found == 0, found
        return found == self.count, found


class GateConfig(BaseModel):
    """Declared before the run: thresholds and boundaries the sequence gates use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    long_context_threshold: int = Field(default=800, gt=0)
    rollover_boundary: int | None = Field(default=None, gt=0)
    log_rules: tuple[LogRule, ...] = ()


class RowOutcome(BaseModel):
    """The per-row facts the gates need (built from a RowTrace)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    row_id: str
    prompt_sha256: str
    max_tokens: int
    token_ids: tuple[int, ...] | None
    text: str
    finish_reason: str | None
    n_tokens: int
    completion_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    t_send_ns: int
    t_end_ns: int
    # Ids by position with None where the server held one back (token_ids is then None).
    gapped_token_ids: tuple[int | None, ...] | None = None


# How the teacher-exact gate compares a row (leg gates v1 / v2; see compare_row).
EXACTNESS_RULE_V1: Final = 1
EXACTNESS_RULE: Final = 2
HELD_BACK_SHOWN = 5  # held-back positions named in a row's reason


class Divergence(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    row_id: str
    mode: Literal["token_ids", "text"]
    index: int | None  # first differing token (or character) index
    expected: list[Any]
    got: list[Any]
    reason: str


def _fraction(ok: int, total: int) -> str:
    return f"{ok}/{total}"


def first_divergence(expected: Sequence[Any], got: Sequence[Any]) -> int | None:
    """Index of the first difference, None when equal (a length difference counts)."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


class RowComparison(NamedTuple):
    """How one row is compared with its teacher row: by token ids only where both lists
    are complete; else by text, with why and how many ids were still compared."""

    mode: Literal["token_ids", "text"]
    why: str | None  # None when compared by ids
    ids_checked: int  # positions compared by id (all of them when mode is token_ids)


def _positional(ids: tuple[int, ...] | None, gapped: tuple[int | None, ...] | None
                ) -> tuple[int | None, ...] | None:
    return ids if ids is not None else gapped


def _held_back(who: str, gapped: tuple[int | None, ...]) -> str:
    at = [i for i, t in enumerate(gapped) if t is None]
    shown = ", ".join(str(i) for i in at[:HELD_BACK_SHOWN]) + (", …" if len(at) > HELD_BACK_SHOWN
                                                              else "")
    return (f"{who}{len(at)} id{'s' if len(at) > 1 else ''} held back at token"
            f"{'s' if len(at) > 1 else ''} {shown}")


def row_comparison(outcome: RowOutcome, teacher: TeacherRow,
                   rule: int = EXACTNESS_RULE) -> RowComparison:
    """Rule 1 (leg gates v1): ids when both rows have every id, else text. Rule 2 adds
    a row whose ids have gaps at known positions (llama.cpp's UTF-8 hold-back): it is
    compared by text, and every id both sides were given is compared by position too;
    the reason names the gaps."""
    if outcome.token_ids is not None and teacher.token_ids is not None:
        return RowComparison("token_ids", None, len(teacher.token_ids))
    if rule < EXACTNESS_RULE:
        return RowComparison("text", None, 0)
    mine = _positional(outcome.token_ids, outcome.gapped_token_ids)
    ref = _positional(teacher.token_ids, teacher.gapped_token_ids)
    why = []
    if mine is None:
        why.append("the server sent no token ids")
    elif outcome.gapped_token_ids is not None:
        why.append(_held_back("", outcome.gapped_token_ids))
    if ref is None:
        why.append("the teacher has no token ids for it")
    elif teacher.gapped_token_ids is not None:
        why.append("at the same tokens in the teacher"
                   if teacher.gapped_token_ids == outcome.gapped_token_ids
                   else _held_back("the teacher's ", teacher.gapped_token_ids))
    checked = 0 if mine is None or ref is None else sum(
        1 for a, b in zip(ref, mine, strict=False) if a is not None and b is not None)
    return RowComparison("text", " ".join(why) if len(why) == 2 and why[1].startswith("at ")
                         else "; ".join(why), checked)


def compare_row(outcome: RowOutcome, teacher: TeacherRow,
                rule: int = EXACTNESS_RULE) -> Divergence | None:
    if outcome.prompt_sha256 != teacher.prompt_sha256:
        return Divergence(row=outcome.row, row_id=outcome.row_id, mode="token_ids", index=None,
                          expected=[], got=[], reason="prompt differs from the teacher's")
    how = row_comparison(outcome, teacher, rule)
    exp: Sequence[Any]
    got: Sequence[Any]
    if how.mode == "token_ids":
        exp, got = teacher.token_ids or (), outcome.token_ids or ()
        return _divergence(outcome, "token_ids", exp, got, first_divergence(exp, got))
    ref = _positional(teacher.token_ids, teacher.gapped_token_ids)
    mine = _positional(outcome.token_ids, outcome.gapped_token_ids)
    if rule >= EXACTNESS_RULE and ref is not None and mine is not None:
        # The ids both were given must agree where they sit, and so must the counts.
        index = next((i for i, (a, b) in enumerate(zip(ref, mine, strict=False))
                      if a is not None and b is not None and a != b), None)
        if index is None and len(ref) != len(mine):
            index = min(len(ref), len(mine))
        if index is not None:
            return _divergence(outcome, "token_ids", ref, mine, index)
    return _divergence(outcome, "text", teacher.text, outcome.text,
                       first_divergence(teacher.text, outcome.text))


def _divergence(outcome: RowOutcome, mode: Literal["token_ids", "text"], exp: Sequence[Any],
                got: Sequence[Any], index: int | None) -> Divergence | None:
    if index is None:
        return None
    lo, hi = max(0, index - CONTEXT_TOKENS), index + CONTEXT_TOKENS + 1
    unit = "token" if mode == "token_ids" else "character"
    return Divergence(
        row=outcome.row, row_id=outcome.row_id, mode=mode, index=index,
        expected=list(exp[lo:hi]), got=list(got[lo:hi]),
        reason=f"first divergent {unit} at index {index} "
        f"(teacher has {len(exp)}, this leg {len(got)})",
    )


def exactness(outcomes: Sequence[RowOutcome], teacher: Teacher | None,
              rule: int = EXACTNESS_RULE) -> dict[int, bool]:
    """Per row: is it teacher-exact? Empty without a teacher."""
    if teacher is None:
        return {}
    by_index = {r.row: r for r in teacher.rows}
    return {
        o.row: o.row in by_index and compare_row(o, by_index[o.row], rule) is None
        for o in outcomes
    }


# Each gate's evidence, as its check builds it (GateResult.evidence holds any gate's).
class _RowByText(TypedDict):
    row: int
    row_id: str
    why: str | None
    ids_checked: int


class _TeacherExactEvidence(TypedDict):
    compared_by: list[str]
    teacher_sha256: str
    divergences: list[Mapping[str, object]]  # Divergence's JSON form
    fallback: NotRequired[str]  # rule 1
    rows_by_token_ids: NotRequired[int]  # rule 2
    rows_by_text: NotRequired[list[_RowByText]]  # rule 2
    rows_missing_from_leg: NotRequired[int]


class _LongContextEvidence(TypedDict):
    threshold: int
    longest_row: int
    longest_prompt_tokens: int | None
    pairs: NotRequired[list[tuple[int, int]]]


class _CountProblem(TypedDict):
    row: int
    problem: str


class _NoWarmupEvidence(TypedDict):
    first_request_row: int | None
    server_counters_before_suite: NotRequired[dict[str, float]]
    generation_requests_in_server_log: NotRequired[int | None]


class _AttemptsEvidence(TypedDict):
    attempts: int
    earlier: list[str | None]


class _DeviceClocks(TypedDict):
    samples: int
    sm_clock_mhz_min: float
    sm_clock_mhz_max: float
    drop_pct: float
    throttle_reasons: list[str] | None


class _ClocksEvidence(TypedDict):
    drop_max_pct: float
    devices: dict[str, _DeviceClocks]


def teacher_exact(outcomes: Sequence[RowOutcome], teacher: Teacher | None,
                  rule: int = EXACTNESS_RULE) -> GateResult:
    name = TEACHER_EXACT
    if teacher is None:
        return GateResult(name=name, status=GateStatus.NOT_TESTED,
                          reason="no teacher given (tokrecord teacher, then --teacher FILE)")
    by_index = {r.row: r for r in teacher.rows}
    divergences: list[Divergence] = []
    modes = set()
    by_text: list[_RowByText] = []
    for o in outcomes:
        t = by_index.get(o.row)
        if t is None:
            divergences.append(Divergence(row=o.row, row_id=o.row_id, mode="token_ids", index=None,
                                          expected=[], got=[], reason="row not in the teacher"))
            continue
        how = row_comparison(o, t, rule)
        modes.add(how.mode)
        if how.mode == "text" and rule >= EXACTNESS_RULE:
            by_text.append({"row": o.row, "row_id": o.row_id, "why": how.why,
                            "ids_checked": how.ids_checked})
        d = compare_row(o, t, rule)
        if d is not None:
            divergences.append(d)
    exact = len(outcomes) - len(divergences)
    missing = len(teacher.rows) - len(outcomes)
    evidence: _TeacherExactEvidence = {
        "compared_by": sorted(modes), "teacher_sha256": teacher.sha256,
        "divergences": [d.model_dump() for d in divergences]}
    if rule < EXACTNESS_RULE:
        if "text" in modes:
            evidence["fallback"] = "some rows compared by text: the server returned no token ids"
    else:
        compared = len(outcomes) - sum(1 for o in outcomes if o.row not in by_index)
        evidence["rows_by_token_ids"] = compared - len(by_text)
        evidence["rows_by_text"] = by_text
    if missing:
        evidence["rows_missing_from_leg"] = missing
    if divergences or missing:
        reason = (f"row {divergences[0].row} ({divergences[0].row_id}): {divergences[0].reason}"
                  if divergences else f"the leg has {len(outcomes)} rows, the teacher "
                  f"{len(teacher.rows)}")
        return GateResult(name=name, status=GateStatus.FAIL, count=_fraction(exact, len(outcomes)),
                          reason=reason, evidence=dict(evidence))
    if rule < EXACTNESS_RULE:
        said = "every row matches the teacher " + "/".join(sorted(modes))
    else:
        said = "every row matches the teacher: " + compared_by_phrase(evidence, len(outcomes))
    return GateResult(name=name, status=GateStatus.PASS, count=_fraction(exact, len(outcomes)),
                      reason=said, evidence=dict(evidence))


def compared_by_phrase(evidence: Mapping[str, Any], rows: int) -> str:
    """How a teacher-exact gate's rows were compared, in words: "13/13 by ids", or
    "12/13 by ids, 1 by text (row 7: 1 id held back at token 212)". A gate written by
    rule 1 (leg gates v1) only says which modes occurred."""
    by_text = evidence.get("rows_by_text")
    if not isinstance(by_text, list):
        modes = list(evidence.get("compared_by") or [])
        if modes == ["token_ids"]:
            return f"{rows}/{rows} by ids"
        if modes == ["text"]:
            return f"{rows}/{rows} by text"
        return "some rows by ids, some by text" if modes else "no row compared"
    by_ids = evidence.get("rows_by_token_ids")
    phrase = f"{by_ids}/{rows} by ids"
    if by_text:
        first = by_text[0]
        ids = sum(int(r.get("ids_checked") or 0) for r in by_text)
        given = f", their other {ids} ids compared by position" if ids else ""
        more = f"; {len(by_text) - 1} more" if len(by_text) > 1 else ""
        phrase += (f", {len(by_text)} by text{given} (row {first.get('row')}: "
                   f"{first.get('why')}{more})")
    return phrase


def output_divergence(a: RowOutcome, b: RowOutcome
                      ) -> tuple[int | None, Literal["token_ids", "text"]]:
    """Where b's output first differs from a's, and how they were compared: by token ids
    when both rows have them, by text only as the fallback."""
    if a.token_ids is not None and b.token_ids is not None:
        return first_divergence(a.token_ids, b.token_ids), "token_ids"
    return first_divergence(a.text, b.text), "text"


def cross_leg_exact(legs: Mapping[str, Sequence[RowOutcome]]) -> GateResult:
    name = CROSS_LEG_EXACT
    if len(legs) < 2:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="fewer than two legs")
    names = list(legs)
    ref = legs[names[0]]
    mismatches = []
    for other in names[1:]:
        for a, b in zip(ref, legs[other], strict=False):
            index, compared_by = output_divergence(a, b)
            if index is not None:
                mismatches.append({"leg": other, "row": a.row, "index": index,
                                   "compared_by": compared_by})
        if len(ref) != len(legs[other]):
            mismatches.append({"leg": other, "row": None, "index": None})
    total = sum(len(v) for v in legs.values())
    status = GateStatus.FAIL if mismatches else GateStatus.PASS
    return GateResult(name=name, status=status, count=_fraction(total - len(mismatches), total),
                      reason=f"{len(mismatches)} rows differ between legs" if mismatches
                      else f"all {len(legs)} legs produced identical outputs",
                      evidence={"legs": names, "mismatches": mismatches})


def cached_tokens_zero(
    outcomes: Sequence[RowOutcome], prefix_hits: int | None, prefix_queries: int | None,
    hint: str = VLLM_CACHED_HINT,
) -> GateResult:
    name = CACHED_TOKENS_ZERO
    reported = [o for o in outcomes if o.cached_tokens is not None]
    nonzero = [o.row for o in reported if o.cached_tokens]
    evidence = {"rows_reported": len(reported), "rows_nonzero": nonzero,
                "prefix_cache_hits_delta": prefix_hits, "prefix_cache_queries_delta": prefix_queries}
    count = _fraction(len(reported) - len(nonzero), len(outcomes))
    if nonzero or (prefix_hits or 0) > 0:
        parts = []
        if nonzero:
            parts.append(f"rows {nonzero} report cached prompt tokens")
        if prefix_hits:
            parts.append(f"the engine counted {prefix_hits} prefix-cache hits")
        return GateResult(name=name, status=GateStatus.FAIL, count=count, reason="; ".join(parts),
                          evidence=evidence)
    if len(reported) < len(outcomes):
        return GateResult(
            name=name, status=GateStatus.NOT_TESTED, count=count, evidence=evidence,
            reason=f"{len(outcomes) - len(reported)} rows carry no {hint}")
    if prefix_hits is None:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, count=count, evidence=evidence,
                          reason="the server exposes no prefix-cache hit counter on /metrics")
    note = " (prefix caching off: no lookups)" if prefix_queries == 0 else ""
    return GateResult(name=name, status=GateStatus.PASS, count=count, evidence=evidence,
                      reason=f"usage reports 0 cached tokens on every row and 0 engine "
                      f"prefix-cache hits{note}")


def _full(o: RowOutcome) -> bool:
    return o.finish_reason == "length" and o.n_tokens == o.max_tokens


def full_output_then_next(outcomes: Sequence[RowOutcome], exact: Mapping[int, bool]) -> GateResult:
    name = FULL_OUTPUT_THEN_NEXT
    pairs = [(o.row, outcomes[i + 1].row) for i, o in enumerate(outcomes[:-1]) if _full(o)]
    if not exact:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="no teacher: exactness of the next row unknown")
    if not pairs:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="no row reached max_tokens with a row after it")
    ok = [p for p in pairs if exact.get(p[1])]
    status = GateStatus.PASS if len(ok) == len(pairs) else GateStatus.FAIL
    return GateResult(name=name, status=status, count=_fraction(len(ok), len(pairs)), required=False,
                      reason=f"rows {pairs[0][0]} then {pairs[0][1]} prove a full output then "
                      "next" if status is GateStatus.PASS else "a row after a full output diverged",
                      evidence={"pairs": pairs})


def long_context_then_next(
    outcomes: Sequence[RowOutcome], exact: Mapping[int, bool], threshold: int
) -> GateResult:
    name = LONG_CONTEXT_THEN_NEXT
    sized = [o for o in outcomes if o.prompt_tokens is not None]
    if not sized:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="the server reported no prompt token counts")
    longest = max(sized, key=lambda o: o.prompt_tokens or 0)
    evidence: _LongContextEvidence = {"threshold": threshold, "longest_row": longest.row,
                                      "longest_prompt_tokens": longest.prompt_tokens}
    long_rows = [o for o in sized if (o.prompt_tokens or 0) >= threshold]
    if not long_rows:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          evidence=dict(evidence),
                          reason=f"the longest prompt has {longest.prompt_tokens} tokens, below the "
                          f"declared threshold {threshold}")
    last = outcomes[-1].row
    followed = [o for o in long_rows if o.row != last]
    if not followed:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          evidence=dict(evidence),
                          reason=f"the {longest.prompt_tokens}-token prompt is row {longest.row}, the "
                          "last row, so this run does not test long-context-then-next")
    if not exact:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          evidence=dict(evidence),
                          reason="no teacher: exactness of the next row unknown")
    pairs = [(o.row, o.row + 1) for o in followed]
    ok = [p for p in pairs if exact.get(p[1])]
    evidence["pairs"] = pairs
    longest = max(followed, key=lambda o: o.prompt_tokens or 0)
    status = GateStatus.PASS if len(ok) == len(pairs) else GateStatus.FAIL
    return GateResult(name=name, status=status, count=_fraction(len(ok), len(pairs)), required=False,
                      evidence=dict(evidence),
                      reason=f"the {longest.prompt_tokens}-token prompt (row {longest.row}) is "
                      f"followed by {'an exact' if status is GateStatus.PASS else 'a divergent'} row")


def rollover(
    outcomes: Sequence[RowOutcome], exact: Mapping[int, bool], boundary: int | None
) -> GateResult:
    name = ROLLOVER
    if boundary is None:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="no boundary declared (sliding window, block size)")
    # A row crosses when the context that produced its last token (prompt + n - 1)
    # exceeds the boundary while its prompt alone does not.
    crossing = [o.row for o in outcomes if o.prompt_tokens is not None
                and o.prompt_tokens < boundary < o.prompt_tokens + o.n_tokens - 1]
    evidence = {"boundary": boundary, "rows": crossing}
    if not crossing:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False, evidence=evidence,
                          reason=f"no row's prompt + output crosses {boundary} tokens")
    if not exact:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False, evidence=evidence,
                          reason="no teacher: exactness unknown")
    ok = [r for r in crossing if exact.get(r)]
    status = GateStatus.PASS if len(ok) == len(crossing) else GateStatus.FAIL
    return GateResult(name=name, status=status, count=_fraction(len(ok), len(crossing)),
                      required=False, evidence=evidence,
                      reason=f"rows crossing {boundary} tokens: {crossing}")


def token_count_integrity(outcomes: Sequence[RowOutcome]) -> GateResult:
    name = TOKEN_COUNT_INTEGRITY
    unreported = [o.row for o in outcomes if o.completion_tokens is None]
    if unreported:
        return GateResult(name=name, status=GateStatus.NOT_TESTED,
                          reason=f"rows {unreported} carry no server-reported completion_tokens "
                          "(ask for stream_options.include_usage)",
                          evidence={"rows_unreported": unreported})
    bad: list[_CountProblem] = []
    for o in outcomes:
        if o.completion_tokens != o.n_tokens:
            bad.append({"row": o.row, "problem": f"server reported {o.completion_tokens} "
                        f"completion tokens, {o.n_tokens} received"})
        elif o.finish_reason == "length" and o.n_tokens != o.max_tokens:
            bad.append({"row": o.row, "problem": f"finish_reason length after {o.n_tokens} "
                        f"of {o.max_tokens} tokens"})
        elif o.finish_reason != "length" and o.n_tokens >= o.max_tokens:
            bad.append({"row": o.row, "problem": f"finish_reason {o.finish_reason!r} at max_tokens"})
        elif o.finish_reason is None:
            bad.append({"row": o.row, "problem": "no finish_reason"})
    status = GateStatus.FAIL if bad else GateStatus.PASS
    return GateResult(name=name, status=status,
                      count=_fraction(len(outcomes) - len(bad), len(outcomes)),
                      reason=str(bad[0]["problem"]) if bad else
                      "reported completion tokens equal tokens received; finish reasons consistent",
                      evidence={"problems": bad})




def request_log_gates(
    outcomes: Sequence[RowOutcome],
    requests: Sequence[Mapping[str, Any]],
    planned_rows: int,
    metrics_before: Mapping[str, float] | None,
    server_log: str,
    generation_counters: Sequence[str] = VLLM_METRICS.generation,
    generation_line: re.Pattern[str] | None = VLLM_GENERATION_LINE,
) -> list[GateResult]:
    """Gates proved from the harness's own request log (and the server's, where it helps).
    The engine names the counters that move on any generation and its log's line for
    one generation request."""
    rows_requested = [int(r["row"]) for r in requests]
    return [_fresh_unique_prompts(outcomes), _single_active(outcomes),
            _no_warmup(rows_requested, len(requests), metrics_before, server_log,
                       generation_counters, generation_line),
            _one_suite_invocation(rows_requested, planned_rows),
            _zero_retries(rows_requested)]


def _fresh_unique_prompts(outcomes: Sequence[RowOutcome]) -> GateResult:
    hashes = [o.prompt_sha256 for o in outcomes]
    dupes = len(hashes) - len(set(hashes))
    return GateResult(
        name=FRESH_UNIQUE_PROMPTS, status=GateStatus.FAIL if dupes else GateStatus.PASS,
        count=_fraction(len(set(hashes)), len(hashes)),
        reason=f"{dupes} repeated prompts" if dupes else
        "every prompt unique, each sent once to a server started for this leg",
        evidence={"prompt_sha256": hashes})


def _single_active(outcomes: Sequence[RowOutcome]) -> GateResult:
    overlaps = [
        (a.row, b.row) for a, b in itertools.pairwise(outcomes) if b.t_send_ns < a.t_end_ns
    ]
    return GateResult(
        name=SINGLE_ACTIVE_GENERATION, status=GateStatus.FAIL if overlaps else GateStatus.PASS,
        reason=f"requests overlapped: {overlaps}" if overlaps else
        "each request was sent after the previous stream ended",
        evidence={"overlaps": overlaps})


def _no_warmup(rows_requested: Sequence[int], n_requests: int,
               metrics_before: Mapping[str, float] | None, server_log: str,
               generation_counters: Sequence[str], generation_line: re.Pattern[str] | None
               ) -> GateResult:
    """Row 0 came first, the engine's generation counters were 0 before it, and its log
    shows no more generation requests than the harness sent."""
    evidence: _NoWarmupEvidence = {
        "first_request_row": rows_requested[0] if rows_requested else None}
    problems = []
    if rows_requested and rows_requested[0] != 0:
        problems.append(f"the first request was row {rows_requested[0]}, not row 0")
    if metrics_before is not None:
        served = {k: v for k, v in metrics_before.items() if k in generation_counters}
        evidence["server_counters_before_suite"] = served
        if any(v > 0 for v in served.values()):
            problems.append(f"the server had generated before row 0: {served}")
    logged = len(generation_line.findall(server_log)) if generation_line is not None else None
    evidence["generation_requests_in_server_log"] = logged
    if logged is not None and logged > n_requests:
        problems.append(f"the server log shows {logged} generation requests, the harness sent "
                        f"{n_requests}")
    return GateResult(
        name=NO_WARMUP_GENERATION, status=GateStatus.FAIL if problems else GateStatus.PASS,
        reason="; ".join(problems) or "the first request the server received was row 0"
        + (" (its generation counters were 0 before it)" if "server_counters_before_suite"
           in evidence else ""),
        evidence=dict(evidence))


def _one_suite_invocation(rows_requested: list[int], planned_rows: int) -> GateResult:
    in_order = rows_requested == list(range(len(rows_requested)))
    return GateResult(
        name=ONE_SUITE_INVOCATION, status=GateStatus.PASS if in_order else GateStatus.FAIL,
        count=str(1 if in_order else 0),
        reason="rows requested once each, in suite order" if in_order else
        f"rows requested out of order or repeated: {rows_requested}",
        evidence={"rows_requested": rows_requested, "rows_planned": planned_rows})


def _zero_retries(rows_requested: Sequence[int]) -> GateResult:
    retries = len(rows_requested) - len(set(rows_requested))
    return GateResult(
        name=ZERO_RETRIES, status=GateStatus.FAIL if retries else GateStatus.PASS,
        count=str(retries), reason=f"{retries} rows were requested again" if retries
        else "no row was requested twice", evidence={})


def first_valid_score(attempt: int, earlier: Sequence[str | None] = ()) -> GateResult:
    """The reported attempt is the leg's first to score: attempt N passes only when the
    N-1 attempts before it are all there and none of them completed (a complete one had
    a score that this one would replace). `earlier`: each earlier attempt's recorded
    status, None where it has no summary (killed)."""
    if attempt == 1 and not earlier:
        return GateResult(name=FIRST_VALID_SCORE, status=GateStatus.PASS,
                          reason="this leg's first and only run is the reported one",
                          evidence={"attempts": 1})
    evidence: _AttemptsEvidence = {"attempts": attempt, "earlier": list(earlier)}
    scored = [i + 1 for i, status in enumerate(earlier) if status == "complete"]
    if len(earlier) != attempt - 1:
        reason = f"attempt {attempt}, but {len(earlier)} earlier attempts are in the evidence"
    elif scored:
        reason = (f"attempt {scored[0]} of this leg completed before this one: its score "
                  "was replaced")
    else:
        return GateResult(name=FIRST_VALID_SCORE, status=GateStatus.PASS, evidence=dict(evidence),
                          reason=f"attempt {attempt} is the first to complete: the "
                          f"{attempt - 1} before it were interrupted")
    return GateResult(name=FIRST_VALID_SCORE, status=GateStatus.FAIL, reason=reason,
                      evidence=dict(evidence))


def cleanup_gate(passed: bool | None, surviving: int | None, port_open: bool | None) -> GateResult:
    if passed is None:
        return GateResult(name=CLEANUP, status=GateStatus.NOT_TESTED,
                          reason="the server was never started")
    return GateResult(
        name=CLEANUP, status=GateStatus.PASS if passed else GateStatus.FAIL,
        reason=f"{surviving} surviving processes, port {'open' if port_open else 'closed'}",
        evidence={"surviving_workers": surviving, "port_listening_after": port_open})


def idle_gate(name: str, result: IdleResult | None) -> GateResult:
    """The machine was idle (declared criteria, N consecutive snapshots) before the
    server started, or after it stopped."""
    if result is None:
        return GateResult(name=name, status=GateStatus.NOT_TESTED,
                          reason="the leg ended before this idle gate ran")
    if result.skipped:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="idle gate switched off in the declared criteria")
    c = result.criteria
    evidence = {"seconds": result.seconds, "snapshots": result.snapshots,
                "consecutive_required": c.consecutive, "interval_s": c.interval_s,
                "file": f"idle-{result.phase}.jsonl"}
    if result.passed:
        return GateResult(name=name, status=GateStatus.PASS, count=f"{c.consecutive}/{c.consecutive}",
                          reason=f"{c.consecutive} consecutive idle snapshots after "
                          f"{result.seconds:.1f} s", evidence=evidence)
    return GateResult(name=name, status=GateStatus.FAIL,
                      reason=f"not idle within {c.timeout_s:g} s: {result.reason}",
                      evidence=evidence)


def treatment_attestation(rules: Sequence[LogRule], server_log: str) -> GateResult:
    name = TREATMENT_ATTESTATION
    if not rules:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          reason="the arm declares no log rules")
    claims = []
    failed_required = []
    for rule in rules:
        holds, found = rule.check(server_log)
        expected = f"count {rule.count}" if rule.expect == "count" else rule.expect
        claims.append({
            "claim": rule.claim, "holds": holds, "found": found, "expected": expected,
            "statement": (f"{rule.claim}: claimed" if holds else
                          f"{rule.claim}: not claimed because the expected log evidence "
                          f"({expected}, found {found}) does not hold"),
        })
        if rule.required and not holds:
            failed_required.append(rule.claim)
    made = sum(1 for c in claims if c["holds"])
    status = GateStatus.FAIL if failed_required else GateStatus.PASS
    return GateResult(
        name=name, status=status, count=_fraction(made, len(claims)), required=False,
        reason=f"required claims not supported by the log: {failed_required}" if failed_required
        else f"{made} of {len(claims)} claims supported by the server log"
        + "".join(f"; not claimed: {c['claim']} (log evidence {c['expected']} does not hold)"
                  for c in claims if not c["holds"]),
        evidence={"claims": claims})


def leg_valid(gates: Sequence[GateResult]) -> tuple[bool, list[str]]:
    reasons = [f"{g.name}: {g.status.value}" for g in gates if g.blocks_validity]
    return not reasons, reasons


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class LegEvidence:
    """Everything a leg's gates read, gathered once by the writer and again by verify."""

    outcomes: tuple[RowOutcome, ...]
    teacher: Teacher | None
    config: GateConfig
    planned_rows: int
    requests: tuple[Mapping[str, Any], ...]
    metrics_before: Mapping[str, float] | None
    server_log: str
    prefix_cache_hits: int | None = None
    prefix_cache_queries: int | None = None
    cached_tokens_hint: str = VLLM_CACHED_HINT
    generation_counters: Sequence[str] = VLLM_METRICS.generation
    generation_line: re.Pattern[str] | None = VLLM_GENERATION_LINE
    cleanup_passed: bool | None = None
    surviving_workers: int | None = None
    port_listening_after: bool | None = None
    # None: the evidence predates idle gates (an older record), so there are none.
    idle: Mapping[str, IdleResult | None] | None = None
    attempt: int = 1
    earlier_attempts: tuple[str | None, ...] = ()
    # The telemetry sampler's lines (probes.telemetry.read_samples), on the rows' clock.
    telemetry: tuple[Mapping[str, Any], ...] = ()
    rule: int = EXACTNESS_RULE  # the teacher-exact rule the gates were written with
    version: int = field(default=0)  # gates-file version; 0: the current one

    @cached_property
    def exact(self) -> dict[int, bool]:
        return exactness(self.outcomes, self.teacher, self.rule)

    @cached_property
    def request_log(self) -> dict[str, GateResult]:
        return {g.name: g for g in request_log_gates(
            self.outcomes, self.requests, self.planned_rows, self.metrics_before,
            self.server_log, self.generation_counters, self.generation_line)}


@dataclass(frozen=True)
class GateSpec:
    """One gate: its name, how it is shown, whether a leg needs it to pass, and how it
    is checked. `check` returns None where the gate does not apply to this evidence;
    `since` is the gates-file version that brought it (older files are recomputed
    without it). A gate over several legs has no leg check (scope "experiment")."""

    name: str
    label: str  # short, for a terminal table
    explained: str  # one line, wherever the gate is shown
    required: bool
    check: Callable[[LegEvidence], GateResult | None] | None
    since: int = 1
    revised: int = 0  # the version whose files it is checked differently from (0: never)
    scope: Literal["leg", "experiment"] = "leg"
    needs: Capability | None = None  # an engine lacking it explains the gate's "not tested"


def _first_valid(ev: LegEvidence) -> GateResult:
    if 0 < ev.version < 3:  # sealed before the check looked at the earlier attempts
        return first_valid_score(1)
    return first_valid_score(ev.attempt, ev.earlier_attempts)


def _idle(phase: str, name: str) -> Callable[[LegEvidence], GateResult | None]:
    def check(ev: LegEvidence) -> GateResult | None:
        return None if ev.idle is None else idle_gate(name, ev.idle.get(phase))
    return check


# The most an accelerator's SM clock may fall below its own highest reading while rows
# stream: 2 %, above one boost step (15 MHz of an H200's 1980, 0.8 %) so that a sample
# taken mid-step does not fail, and below the between-leg noise that the verdict
# already carries (leg sd 1.1-3.1 % on an H200, DESIGN.md), so a drop that passes
# cannot move a headline by more than the noise does.
CLOCK_DROP_MAX_PCT: Final = 2.0


def clocks_stable(outcomes: Sequence[RowOutcome], samples: Sequence[Mapping[str, Any]]
                  ) -> GateResult:
    """Each accelerator's telemetry while rows stream (first request sent to last byte):
    no throttle reason, and no SM clock more than CLOCK_DROP_MAX_PCT below its highest
    reading. Not tested where no sample in that window has a clock (CPU only, telemetry
    off, a probe that reads none)."""
    name = CLOCKS_STABLE
    window = (min((o.t_send_ns for o in outcomes), default=0),
              max((o.t_end_ns for o in outcomes), default=-1))
    devices: dict[str, list[Mapping[str, Any]]] = {}
    for sample in samples:
        if window[0] <= sample.get("t_ns", -1) <= window[1]:
            for d in sample.get("devices") or ():
                devices.setdefault(f"{d.get('backend')}:{d.get('index')}", []).append(d)
    per_device: dict[str, _DeviceClocks] = {}
    problems: list[str] = []
    failed: set[str] = set()
    for key, readings in devices.items():
        clocks = [float(d["sm_clock_mhz"]) for d in readings
                  if isinstance(d.get("sm_clock_mhz"), int | float) and d["sm_clock_mhz"] > 0]
        if not clocks:
            continue
        told = [d["throttle_reasons"] for d in readings if isinstance(d.get("throttle_reasons"),
                                                                    list | tuple)]
        reasons = sorted({str(r) for found in told for r in found})
        drop = round(100 * (1 - min(clocks) / max(clocks)), 3)
        per_device[key] = {"samples": len(clocks), "sm_clock_mhz_min": min(clocks),
                           "sm_clock_mhz_max": max(clocks), "drop_pct": drop,
                           "throttle_reasons": reasons if told else None}
        if reasons or drop > CLOCK_DROP_MAX_PCT:
            failed.add(key)
        if reasons:
            problems.append(f"{key} reported {', '.join(reasons)} "
                            f"in {sum(1 for t in told if t)} of {len(told)} samples")
        if drop > CLOCK_DROP_MAX_PCT:
            problems.append(f"{key}'s SM clock fell {drop:g} % ({max(clocks):g} to "
                            f"{min(clocks):g} MHz), more than {CLOCK_DROP_MAX_PCT:g} %")
    evidence: _ClocksEvidence = {"drop_max_pct": CLOCK_DROP_MAX_PCT, "devices": per_device}
    if not per_device:
        return GateResult(name=name, status=GateStatus.NOT_TESTED, required=False,
                          evidence=dict(evidence), reason="no accelerator clock was sampled while "
                          "rows streamed (CPU only, telemetry off, or a probe without clocks)")
    count = _fraction(len(per_device) - len(failed), len(per_device))
    if problems:
        return GateResult(name=name, status=GateStatus.FAIL, count=count, required=False,
                          evidence=dict(evidence), reason="; ".join(problems))
    unknown = [k for k, v in per_device.items() if v["throttle_reasons"] is None]
    note = (f"; {', '.join(unknown)} report{'s' if len(unknown) == 1 else ''} no throttle "
            "reasons, so only the clock was checked") if unknown else ""
    return GateResult(name=name, status=GateStatus.PASS, count=count, required=False,
                      evidence=dict(evidence),
                      reason=f"no throttle reason and SM clocks within {CLOCK_DROP_MAX_PCT:g} "
                      f"% of their highest while rows streamed{note}")


GATES: Final[tuple[GateSpec, ...]] = (
    GateSpec(TEACHER_EXACT, "teacher exact",
             "every row's token ids equal the teacher's (the reference outputs)", True,
             lambda ev: teacher_exact(ev.outcomes, ev.teacher, ev.rule)),
    GateSpec(CACHED_TOKENS_ZERO, "cached tokens 0",
             "no prompt token came from a cache: 0 cached tokens per row, "
             "and the engine's prefix-cache hit counter did not move", True,
             lambda ev: cached_tokens_zero(ev.outcomes, ev.prefix_cache_hits,
                                           ev.prefix_cache_queries, hint=ev.cached_tokens_hint),
             needs=Capability.PREFIX_CACHE_COUNTER),
    GateSpec(FULL_OUTPUT_THEN_NEXT, "full then next",
             "the row after one that used its whole token budget is still exact", False,
             lambda ev: full_output_then_next(ev.outcomes, ev.exact)),
    GateSpec(LONG_CONTEXT_THEN_NEXT, "long then next",
             "the row after the longest prompt is still exact", False,
             lambda ev: long_context_then_next(ev.outcomes, ev.exact,
                                               ev.config.long_context_threshold)),
    GateSpec(ROLLOVER, "rollover", "a row that crosses the declared context boundary is exact",
             False, lambda ev: rollover(ev.outcomes, ev.exact, ev.config.rollover_boundary)),
    GateSpec(TOKEN_COUNT_INTEGRITY, "token counts",
             "the server's token counts equal the tokens received; finish "
             "reasons agree with max_tokens", True,
             lambda ev: token_count_integrity(ev.outcomes)),
    GateSpec(FRESH_UNIQUE_PROMPTS, "fresh prompts",
             "every prompt is unique and sent once to a freshly started server", True,
             lambda ev: ev.request_log[FRESH_UNIQUE_PROMPTS]),
    GateSpec(SINGLE_ACTIVE_GENERATION, "single active",
             "one request at a time: each sent after the previous ended", True,
             lambda ev: ev.request_log[SINGLE_ACTIVE_GENERATION]),
    GateSpec(NO_WARMUP_GENERATION, "no warmup", "the server generated nothing before row 0",
             True, lambda ev: ev.request_log[NO_WARMUP_GENERATION]),
    GateSpec(ONE_SUITE_INVOCATION, "one invocation", "the suite ran once, in order", True,
             lambda ev: ev.request_log[ONE_SUITE_INVOCATION]),
    GateSpec(ZERO_RETRIES, "zero retries", "no row was requested twice", True,
             lambda ev: ev.request_log[ZERO_RETRIES]),
    GateSpec(FIRST_VALID_SCORE, "first score",
             "the leg's first run is the one reported", True, _first_valid,
             revised=3),
    GateSpec(CLEANUP, "cleanup", "no process of the server survived it and its port closed",
             True, lambda ev: cleanup_gate(ev.cleanup_passed, ev.surviving_workers,
                                           ev.port_listening_after)),
    GateSpec(TREATMENT_ATTESTATION, "attestation",
             "the arm's log rules hold: the server's log shows the treatment", False,
             lambda ev: treatment_attestation(ev.config.log_rules, ev.server_log)),
    GateSpec(CROSS_LEG_EXACT, "cross-leg exact", "every leg's outputs equal every other leg's",
             False, None, scope="experiment"),
    GateSpec(IDLE_BEFORE, "idle before", "the machine was idle before the server started", True,
             _idle("before", IDLE_BEFORE)),
    GateSpec(IDLE_AFTER, "idle after", "the machine returned to idle after the server stopped",
             True, _idle("after", IDLE_AFTER)),
    GateSpec(CLOCKS_STABLE, "clocks stable",
             "no accelerator throttled or dropped its SM clock while rows streamed", False,
             lambda ev: clocks_stable(ev.outcomes, ev.telemetry), since=3),
)
GATES_BY_NAME: Final = {g.name: g for g in GATES}
# The version a leg's gates file is written with: that of the newest gate or revision.
GATES_VERSION: Final = max(max(g.since, g.revised) for g in GATES)
SCHEMA_GATES_PREFIX: Final = "tokrecord.leg-gates/v"


def gates_version(schema: object) -> int:
    """The version of a gates file from its schema id; 2 for anything else (a leg whose
    gates.json is missing is recomputed by its rows file, which predates version 3)."""
    text = str(schema)
    if text.startswith(SCHEMA_GATES_PREFIX) and text[len(SCHEMA_GATES_PREFIX):].isdigit():
        return int(text[len(SCHEMA_GATES_PREFIX):])
    return 2


def evaluate(ev: LegEvidence) -> list[GateResult]:
    """Every leg gate the evidence's version knows, in registry order."""
    version = ev.version or GATES_VERSION
    found = (spec.check(ev) for spec in GATES
             if spec.check is not None and spec.since <= version)
    return [g for g in found if g is not None]
