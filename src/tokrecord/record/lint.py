"""Lint a record's internal arithmetic: every derived number must follow from the others.

Works on tokrecord's records and on the hand-made seed form (the same field
names). Each check names the field it found wrong, the value found and the value
the other fields imply. Nothing here trusts the record's own pass flags: they are
recomputed from the numbers and compared.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

REL_TOL = 1e-9
_COUNT = re.compile(r"^(\d+)/(\d+)$")


class LintProblem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str
    message: str
    found: Any = None
    expected: Any = None

    def __str__(self) -> str:
        if self.expected is None and self.found is None:
            return f"{self.field}: {self.message}"
        return f"{self.field}: {self.message} (found {self.found!r}, expected {self.expected!r})"


class _Linter:
    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record = record
        self.problems: list[LintProblem] = []

    def get(self, path: str) -> Any:
        node: Any = self.record
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def close(self, path: str, expected: float | None, what: str) -> None:
        """The field at `path` must equal `expected` (when both exist)."""
        found = self.get(path)
        if found is None or expected is None:
            return
        if not isinstance(found, int | float) or not math.isclose(
            float(found), expected, rel_tol=REL_TOL, abs_tol=1e-12
        ):
            self.problems.append(LintProblem(field=path, message=what, found=found,
                                             expected=expected))

    def equal(self, path: str, expected: Any, what: str) -> None:
        found = self.get(path)
        if found is None or expected is None:
            return
        if found != expected:
            self.problems.append(LintProblem(field=path, message=what, found=found,
                                             expected=expected))

    def count(self, path: str) -> tuple[int, int] | None:
        value = self.get(path)
        if not isinstance(value, str):
            return None
        match = _COUNT.match(value)
        if match is None:
            if value != "not tested":
                self.problems.append(LintProblem(field=path, message="not a count 'k/n'",
                                                 found=value))
            return None
        k, n = int(match.group(1)), int(match.group(2))
        if k > n:
            self.problems.append(LintProblem(field=path, message="count above its total",
                                             found=value))
        return k, n

    def hexes(self, section: str) -> None:
        node = self.get(section)
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            if isinstance(value, str) and not re.fullmatch(r"[0-9a-f]{64}", value):
                self.problems.append(LintProblem(field=f"{section}.{key}",
                                                 message="not a sha256 hex digest", found=value))


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _div(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return a / b if a is not None and b else None


def _pct(a: Any, b: Any) -> float | None:
    r = _div(a, b)
    return 100.0 * (r - 1.0) if r is not None else None


def _sub(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return a - b if a is not None and b is not None else None


INTERVALS = {"conventional": (99, 99), "legacy-inclusive-events": (100, 99)}


def _lint_speculative(lint: _Linter, section: str) -> None:
    acc, draft, cycles = (lint.get(f"{section}.{k}") for k in
                          ("accepted_draft_tokens", "draft_tokens", "draft_cycles"))
    lint.close(f"{section}.draft_acceptance_rate", _div(acc, draft),
               "acceptance rate is accepted / draft tokens")
    if _num(acc) is not None and _num(cycles):
        lint.close(f"{section}.emitted_tokens_per_draft_cycle",
                   (float(acc) + float(cycles)) / float(cycles),
                   "emitted per cycle is (accepted + cycles) / cycles")


def _lint_single(lint: _Linter) -> None:
    acct = "metric_accounting"
    published = lint.get(f"{acct}.published_value_tok_s")
    convention = lint.get(f"{acct}.published_convention")
    if convention in INTERVALS and _num(published) is not None:
        numerator, intervals = INTERVALS[convention]
        conventional = float(published) * intervals / numerator
        lint.close(f"{acct}.conventional_interval_value_tok_s", conventional,
                   f"the conventional rate is the {convention} rate * {intervals}/{numerator}")
    lint.equal(f"{acct}.inter_token_intervals",
               (_num(lint.get(f"{acct}.timestamped_events")) or 0) - 1 or None,
               "intervals are events - 1")
    lint.close(f"{acct}.conventional_margin_to_goal_tok_s",
               _sub(lint.get(f"{acct}.conventional_interval_value_tok_s"),
                    lint.get(f"{acct}.conventional_goal_tok_s")),
               "margin is conventional value - goal")
    rec = "record"
    value = lint.get(f"{rec}.value_tok_s")
    lint.close(f"{rec}.value_tok_s", _num(published), "the record value is the published value")
    lint.close(f"{rec}.margin_over_goal_tok_s", _sub(value, lint.get(f"{rec}.goal_tok_s")),
               "margin is value - goal")
    lint.close(f"{rec}.delta_vs_approved_tok_s", _sub(value, lint.get(f"{rec}.prior_approved_tok_s")),
               "delta is value - prior approved")
    lint.close(f"{rec}.delta_vs_approved_pct", _pct(value, lint.get(f"{rec}.prior_approved_tok_s")),
               "delta % is 100 * (value / prior approved - 1)")
    lint.close(f"{rec}.delta_vs_prior_best_exact_tok_s",
               _sub(value, lint.get(f"{rec}.prior_best_exact_tok_s")),
               "delta is value - prior best exact")
    lint.close(f"{rec}.delta_vs_prior_best_exact_pct",
               _pct(value, lint.get(f"{rec}.prior_best_exact_tok_s")),
               "delta % is 100 * (value / prior best exact - 1)")
    lint.close("summary.tok_s_out", _num(published), "summary headline is the published value")
    _lint_speculative(lint, "summary")
    p10, median = _num(lint.get("summary.tok_s_out_p10")), _num(lint.get("summary.tok_s_out"))
    if p10 is not None and median is not None and p10 > median:
        lint.problems.append(LintProblem(field="summary.tok_s_out_p10",
                                         message="p10 above the median", found=p10,
                                         expected=f"<= {median}"))
    for key in ("teacher_exact", "cached_tokens_zero", "full512_output_then_next", "rollover"):
        lint.count(f"quality.{key}")
    lint.hexes("sha256")


def _lint_abba(lint: _Linter) -> None:
    runs = lint.get("runs") or {}
    criteria = lint.get("criteria") or {}
    pairs = lint.get("pair_results") or {}
    for name, leg in runs.items():
        if isinstance(leg, Mapping):
            _lint_speculative(lint, f"runs.{name}")
            lint.count(f"runs.{name}.teacher_exact")
    lint.equal("protocol.order",
               None if lint.get("protocol.order") is None else
               [f"{n}-{runs[n]['treatment']}" for n in ("A1", "B1", "B2", "A2") if n in runs],
               "order is A1 B1 B2 A2 with each leg's treatment")
    for key, pair in pairs.items():
        cand, ctrl = key.split("_vs_")
        c, a = runs.get(cand, {}), runs.get(ctrl, {})
        base = f"pair_results.{key}"
        head = _pct(c.get("headline_tok_s"), a.get("headline_tok_s"))
        lint.close(f"{base}.headline_delta_pct", head,
                   f"100 * ({cand} headline / {ctrl} headline - 1)")
        lint.close(f"{base}.aggregate_cycle_saving_ms",
                   _sub(a.get("aggregate_cycle_ms"), c.get("aggregate_cycle_ms")),
                   f"{ctrl} cycle ms - {cand} cycle ms")
        rate_c = _div(c.get("accepted_draft_tokens"), c.get("draft_tokens"))
        rate_a = _div(a.get("accepted_draft_tokens"), a.get("draft_tokens"))
        if rate_c is not None and rate_a is not None:
            lint.close(f"{base}.acceptance_rate_delta_percentage_points",
                       100.0 * (rate_c - rate_a), "100 * (acceptance rate difference)")
        wins = lint.count(f"{base}.candidate_row_wins")
        paired = _num(pair.get("paired_median_delta_pct"))
        if wins is not None and head is not None and paired is not None:
            expected = (head > criteria.get("headline_delta_pct_gt", 0.0)
                        and paired > criteria.get("paired_median_delta_pct_gt", 0.0)
                        and wins[0] / wins[1] > criteria.get("row_wins_fraction_gt", 0.5))
            lint.equal(f"{base}.passed", expected,
                       "pass follows from headline Δ > 0, paired median Δ > 0, wins > half")
    cands = [_num(runs[n].get("headline_tok_s")) for n in ("B1", "B2") if n in runs]
    ctrls = [_num(runs[n].get("headline_tok_s")) for n in ("A1", "A2") if n in runs]
    gate = "record_gate"
    if cands and all(v is not None for v in cands):
        lower, higher = min(v for v in cands if v is not None), max(v for v in cands if v is not None)
        lint.close(f"{gate}.candidate_lower_start_tok_s", lower, "lower of B1, B2 headlines")
        lint.close(f"{gate}.candidate_higher_start_tok_s", higher, "higher of B1, B2 headlines")
        prior = lint.get(f"{gate}.prior_record_tok_s")
        lint.close(f"{gate}.delta_vs_prior_record_tok_s", _sub(lower, prior),
                   "lower candidate - prior record")
        lint.close(f"{gate}.delta_vs_prior_record_pct", _pct(lower, prior),
                   "100 * (lower candidate / prior record - 1)")
        passed = lint.get(f"{gate}.strict_preregistered_record_pass")
        prior_n = _num(prior)
        if passed is True:
            reasons = []
            if prior_n is None or not lower > prior_n:
                reasons.append("the lower candidate does not beat the prior record")
            if not all(p.get("passed") for p in pairs.values()):
                reasons.append("a pair did not pass")
            for key in ("all_legs_cross_exact", "cleanup_passed_all_legs"):
                if lint.get(f"quality.{key}") is False:
                    reasons.append(f"quality.{key} is false")
            for reason in reasons:
                lint.problems.append(LintProblem(field=f"{gate}.strict_preregistered_record_pass",
                                                 message=f"claims a pass but {reason}",
                                                 found=True, expected=False))
    if ctrls and all(v is not None for v in ctrls):
        lint.close(f"{gate}.control_lower_start_tok_s", min(v for v in ctrls if v is not None),
                   "lower of A1, A2 headlines")
    summed = [lint.count(f"runs.{n}.teacher_exact") for n in runs]
    if summed and all(s is not None for s in summed):
        total = f"{sum(s[0] for s in summed if s)}/{sum(s[1] for s in summed if s)}"
        lint.equal("quality.all_legs_teacher_exact", total, "sum of the legs' teacher-exact counts")
    for key in ("all_legs_cached_zero", "long_then_next_exact", "rollover_exact"):
        lint.count(f"quality.{key}")
    boot = lint.get("bootstrap")
    if isinstance(boot, Mapping):
        lo, mid, hi = (_num(boot.get(k)) for k in ("ci_low", "ratio", "ci_high"))
        if None not in (lo, mid, hi) and not (lo <= mid <= hi):  # type: ignore[operator]
            lint.problems.append(LintProblem(field="bootstrap", message="ratio outside its CI",
                                             found=[lo, mid, hi]))
        from tokrecord.experiment.stats import verdict

        if lo is not None and hi is not None and _num(boot.get("equivalence_pct")) is not None:
            lint.equal("verdict", verdict(lo, hi, float(boot["equivalence_pct"])).value,
                       "verdict follows from the CI and the equivalence margin")


def lint_record(record: Mapping[str, Any]) -> list[LintProblem]:
    """All arithmetic problems of a record (empty: consistent)."""
    lint = _Linter(record)
    checks: list[Callable[[_Linter], None]] = []
    if "runs" in record or "pair_results" in record:
        checks.append(_lint_abba)
    if "metric_accounting" in record or "record" in record:
        checks.append(_lint_single)
    if not checks:
        return [LintProblem(field="(record)", message="neither an ABBA nor a single-leg record")]
    for check in checks:
        check(lint)
    return lint.problems
