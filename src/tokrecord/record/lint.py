"""Lint a record's internal arithmetic: every derived number must follow from the others.

Works on tokrecord's records and on the hand-made seed form (the same field
names). Each check names the field it found wrong, the value found and the value
the other fields imply. Nothing here trusts the record's own pass flags: they are
recomputed from the numbers and compared.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tokrecord.evidence.safe import excerpt
from tokrecord.experiment import dist
from tokrecord.experiment.plan import SequentialMethod, Spending, abba_design, abba_pairs
from tokrecord.experiment.sequential import (
    ALPHA_FACTOR,
    method_of_text,
    t_boundaries,
    z_boundaries,
)
from tokrecord.experiment.stats import ANALYSIS_METHOD, abba_df, fit_legs, verdict
from tokrecord.experiment.sweep import (
    ARM_LETTERS,
    SWEEP_METHOD,
    fit_arms,
    sweep_critical,
    sweep_design,
)
from tokrecord.experiment.sweep_sequential import sweep_look_boundary
from tokrecord.gates import CACHED_TOKENS_ZERO, ROLLOVER, TEACHER_EXACT

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
        # `found` came from the record, which may be a stranger's: a bounded, escaped excerpt.
        return (f"{self.field}: {self.message} (found {excerpt(self.found)}, "
                f"expected {excerpt(self.expected)})")


class _Linter:
    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record = record
        self.problems: list[LintProblem] = []

    def get(self, path: str) -> Any:
        node: Any = self.record
        for part in path.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]  # a list's items by index (sequential.looks.0)
                continue
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def close(self, path: str, expected: float | None, what: str,
              rel_tol: float = REL_TOL) -> None:
        """The field at `path` must equal `expected` (when both exist)."""
        found = self.get(path)
        if found is None or expected is None:
            return
        if not isinstance(found, int | float) or not math.isclose(
            float(found), expected, rel_tol=rel_tol, abs_tol=1e-12
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
    for key in (TEACHER_EXACT, CACHED_TOKENS_ZERO, "full512_output_then_next", ROLLOVER):
        lint.count(f"quality.{key}")
    lint.hexes("sha256")


_LEG = re.compile(r"^([AB])([1-9][0-9]*)$")


def _blocks(lint: _Linter) -> int:
    """A v2 record states its blocks; v1 and the hand-made seed form are one ABBA block."""
    stated = lint.get("protocol.blocks")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated >= 1:
        return stated
    return 1


def _block_of(name: str) -> int:
    """Legs 2b-1 and 2b of each letter are block b (A1 B1 B2 A2 | B3 A3 A4 B4 | ...)."""
    match = _LEG.match(name)
    return (int(match.group(2)) + 1) // 2 if match else 0


def _lint_design(lint: _Linter, runs: Mapping[str, Any], blocks: int, design: str) -> None:
    """The legs, their order, their treatments and the pairs are the design's, whatever
    the number of blocks."""

    names = [leg.name for leg in abba_design(blocks)]
    span = f"{blocks} block{'s' if blocks != 1 else ''}: {' '.join(names)}"
    for name in names:
        if name not in runs:
            lint.problems.append(LintProblem(field=f"runs.{name}",
                                             message=f"a leg of the design is missing ({span})"))
    for name in runs:
        if name not in names:
            lint.problems.append(LintProblem(field=f"runs.{name}",
                                             message=f"not a leg of the design ({span})"))
    order = " ".join(names[:4]) + (" | " + " ".join(names[4:8]) + (" | ..." if blocks > 2 else "")
                                   if blocks > 1 else "")
    lint.equal("protocol.order",
               None if lint.get("protocol.order") is None else
               [f"{n}-{runs[n].get('treatment')}" for n in names
                if isinstance(runs.get(n), Mapping)],
               f"order is {order} with each leg's treatment")
    if design == "aa":
        arms = lint.get("treatment")
        if isinstance(arms, Mapping) and len(arms) != 1:
            lint.problems.append(LintProblem(field="treatment", message="an A/A design runs one "
                                             "arm", found=sorted(arms), expected="one arm"))
        only = next(iter(arms)) if isinstance(arms, Mapping) and len(arms) == 1 else None
        for name in runs:
            lint.equal(f"runs.{name}.treatment", only,
                       "an A/A design runs its one arm in every leg, A and B positions alike")
    else:
        for name, leg in runs.items():
            match = _LEG.match(str(name))
            if match and isinstance(leg, Mapping):
                lint.equal(f"runs.{name}.treatment",
                           "candidate" if match.group(1) == "B" else "control",
                           "B legs run the candidate arm, A legs the control")
    if lint.get("protocol.pairs") is not None:
        lint.equal("protocol.pairs", [f"{c}_vs_{a}" for c, a in abba_pairs(blocks)],
                   "pairs are B1 vs A1, B2 vs A2, ... in block order")


def _lint_pairs(lint: _Linter, runs: Mapping[str, Any], blocks: int) -> None:

    criteria = lint.get("criteria") or {}
    pairs = lint.get("pair_results") or {}
    for cand, ctrl in abba_pairs(blocks):
        if pairs and f"{cand}_vs_{ctrl}" not in pairs:
            lint.problems.append(LintProblem(field=f"pair_results.{cand}_vs_{ctrl}",
                                             message="a pair of the design is missing"))
    for key, pair in pairs.items():
        base = f"pair_results.{key}"
        names = str(key).split("_vs_")
        if len(names) != 2 or not isinstance(pair, Mapping):
            lint.problems.append(LintProblem(field=base, message="not a pair 'Bn_vs_An'"))
            continue
        cand, ctrl = names
        lint.equal(f"{base}.candidate", cand, "the pair's candidate leg is in its name")
        lint.equal(f"{base}.control", ctrl, "the pair's control leg is in its name")
        c, a = runs.get(cand, {}), runs.get(ctrl, {})
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


def _lint_gate(lint: _Linter, runs: Mapping[str, Any], blocks: int, design: str) -> None:
    """The record gate over every candidate (B) and control (A) leg of every block."""

    pairs = lint.get("pair_results") or {}
    names = [leg.name for leg in abba_design(blocks) if isinstance(runs.get(leg.name), Mapping)]
    cand_names = [n for n in names if n.startswith("B")]
    ctrl_names = [n for n in names if n.startswith("A")]
    cands = [_num(runs[n].get("headline_tok_s")) for n in cand_names]
    ctrls = [_num(runs[n].get("headline_tok_s")) for n in ctrl_names]
    gate = "record_gate"
    passed = lint.get(f"{gate}.strict_preregistered_record_pass")
    reasons = []
    if cands and all(v is not None for v in cands):
        lower, higher = min(v for v in cands if v is not None), max(v for v in cands if v is not None)
        lint.close(f"{gate}.candidate_lower_start_tok_s", lower,
                   f"lower of {', '.join(cand_names)} headlines")
        lint.close(f"{gate}.candidate_higher_start_tok_s", higher,
                   f"higher of {', '.join(cand_names)} headlines")
        prior = lint.get(f"{gate}.prior_record_tok_s")
        lint.close(f"{gate}.delta_vs_prior_record_tok_s", _sub(lower, prior),
                   "lower candidate - prior record")
        lint.close(f"{gate}.delta_vs_prior_record_pct", _pct(lower, prior),
                   "100 * (lower candidate / prior record - 1)")
        prior_n = _num(prior)
        if prior_n is None or not lower > prior_n:
            reasons.append("the lower candidate does not beat the prior record")
        _lint_headline_leg(lint, runs, cand_names, lower)
    if passed is True:
        if not all(isinstance(p, Mapping) and p.get("passed") for p in pairs.values()):
            reasons.append("a pair did not pass")
        for key in ("all_legs_cross_exact", "cleanup_passed_all_legs"):
            if lint.get(f"quality.{key}") is False:
                reasons.append(f"quality.{key} is false")
        if design == "aa":
            reasons.append("an A/A design makes no speed claim")
        for reason in reasons:
            lint.problems.append(LintProblem(field=f"{gate}.strict_preregistered_record_pass",
                                             message=f"claims a pass but {reason}",
                                             found=True, expected=False))
    if ctrls and all(v is not None for v in ctrls):
        lint.close(f"{gate}.control_lower_start_tok_s", min(v for v in ctrls if v is not None),
                   f"lower of {', '.join(ctrl_names)} headlines")
    if pairs and all(isinstance(p, Mapping) for p in pairs.values()):
        lint.equal(f"{gate}.pairs_passed", all(p.get("passed") is True for p in pairs.values()),
                   "every pair passed")
    # v2's gate judges the verdict at the record's own (higher) confidence; v1's is the verdict.
    judged = lint.get("sequential.record_verdict") if isinstance(
        lint.get("sequential"), Mapping) else lint.get("verdict_analysis.record_verdict")
    lint.equal(f"{gate}.verdict", judged if judged is not None else lint.get("verdict"),
               "the gate's verdict is the analysis' at the record confidence" if judged
               is not None else "the gate's verdict is the record's")


def _lint_headline_leg(lint: _Linter, runs: Mapping[str, Any], cand_names: list[str],
                       lower: float) -> None:
    """The published headline is the candidate leg with the lowest headline."""
    leg = lint.get("metric_accounting.headline_leg")
    if not isinstance(leg, str):
        return
    lowest = [n for n in cand_names
              if math.isclose(float(runs[n]["headline_tok_s"]), lower, rel_tol=REL_TOL)]
    if leg not in lowest:
        lint.problems.append(LintProblem(
            field="metric_accounting.headline_leg",
            message="the headline leg is the candidate leg with the lowest headline",
            found=leg, expected=lowest[0] if len(lowest) == 1 else lowest))
        return
    lint.close("metric_accounting.published_value_tok_s", _num(runs[leg].get("headline_tok_s")),
               f"the published value is leg {leg}'s headline")


def _lint_bootstrap(lint: _Linter) -> None:
    boot = lint.get("bootstrap")
    if isinstance(boot, Mapping):
        lo, mid, hi = (_num(boot.get(k)) for k in ("ci_low", "ratio", "ci_high"))
        if None not in (lo, mid, hi) and not (lo <= mid <= hi):  # type: ignore[operator]
            lint.problems.append(LintProblem(field="bootstrap", message="ratio outside its CI",
                                             found=[lo, mid, hi]))

        if lo is not None and hi is not None and _num(boot.get("equivalence_pct")) is not None:
            lint.equal("verdict", verdict(lo, hi, float(boot["equivalence_pct"])).value,
                       "verdict follows from the CI and the equivalence margin")


# Figures recomputed from the recorded leg statistics, which are rounded to 1e-9 (in
# 100 x log units): agreement to 1e-6 is exact up to that rounding.
RECOMPUTED_TOL = 1e-6


def _lint_analysis(lint: _Linter, runs: Mapping[str, Any], blocks: int) -> None:
    """v2's leg-level verdict: its interval holds its ratio, its verdict follows from the
    interval and the equivalence band, and it recomputes from the legs' figures."""

    va = lint.get("verdict_analysis")
    if not isinstance(va, Mapping):
        return
    base = "verdict_analysis"
    lo, mid, hi = (_num(va.get(k)) for k in ("ci_low", "ratio", "ci_high"))
    eq = _num(va.get("equivalence_pct"))
    if not isinstance(lint.get("sequential"), Mapping):  # else the stopping rule's verdict
        lint.equal("verdict", va.get("verdict"), "the record's verdict is its analysis' verdict")
    lint.equal(f"{base}.blocks", blocks, "the analysis covers the design's blocks")
    lint.equal(f"{base}.legs", len(runs), "the analysis covers every leg")
    if lo is None or mid is None or hi is None:
        if not (lo is None and mid is None and hi is None):
            lint.problems.append(LintProblem(field=base, message="ratio and interval are given "
                                             "together or not at all", found=[lo, mid, hi]))
        lint.equal(f"{base}.verdict", "UNDECIDED", "with no interval the verdict is UNDECIDED")
        if not va.get("reason"):
            lint.problems.append(LintProblem(field=f"{base}.reason",
                                             message="an UNDECIDED verdict with no interval "
                                             "says why"))
        return
    if not lo <= mid <= hi:
        lint.problems.append(LintProblem(field=base, message="ratio outside its CI",
                                         found=[lo, mid, hi]))
    if eq is not None:
        lint.equal(f"{base}.verdict", verdict(lo, hi, eq).value,
                   "verdict follows from the CI and the equivalence margin")
    _lint_record_interval(lint, va, lo, mid, hi, eq)
    stats = va.get("leg_statistics") or {}
    if not isinstance(stats, Mapping) or not stats:
        return
    if set(stats) != set(runs):
        lint.problems.append(LintProblem(field=f"{base}.leg_statistics",
                                         message="one figure per leg of the record",
                                         found=sorted(stats), expected=sorted(runs)))
        return
    names = list(stats)
    lint.equal(f"{base}.df", len(names) - blocks - 1,
               "residual df of the leg-level fit: legs - blocks - 1")
    if va.get("method") != ANALYSIS_METHOD:
        return  # another method's figures: nothing here to recompute them with
    _recompute_analysis(lint, names, [_num(stats[n]) for n in names], va)


def _lint_record_interval(lint: _Linter, va: Mapping[str, Any], lo: float, mid: float,
                          hi: float, eq: float | None) -> None:
    """The record gate's interval, at its higher confidence: it holds the ratio, holds the
    verdict's interval when its confidence is higher, and its verdict follows from it."""

    base = "verdict_analysis"
    r_lo, r_hi = _num(va.get("record_ci_low")), _num(va.get("record_ci_high"))
    r_conf, conf = _num(va.get("record_confidence")), _num(va.get("confidence"))
    if r_lo is None or r_hi is None:
        if r_conf is not None:  # absent altogether in a v2 record made before it existed
            lint.equal(f"{base}.record_verdict", "UNDECIDED",
                       "with no record interval the record verdict is UNDECIDED")
        return
    if not r_lo <= mid <= r_hi:
        lint.problems.append(LintProblem(field=f"{base}.record_ci_low",
                                         message="ratio outside the record's CI",
                                         found=[r_lo, mid, r_hi]))
    if r_conf is not None and conf is not None and r_conf >= conf and not r_lo <= lo <= hi <= r_hi:
        lint.problems.append(LintProblem(
            field=f"{base}.record_ci_low",
            message=f"the {100 * r_conf:g} % record interval must hold the "
                    f"{100 * conf:g} % interval", found=[r_lo, r_hi], expected=[lo, hi]))
    if eq is not None:
        lint.equal(f"{base}.record_verdict", verdict(r_lo, r_hi, eq).value,
                   "the record verdict follows from the record CI and the equivalence margin")


def _recompute_analysis(lint: _Linter, names: list[str], values: list[float | None],
                        va: Mapping[str, Any]) -> None:

    conf = _num(va.get("confidence"))
    if conf is None or any(v is None for v in values):
        return
    fit = fit_legs([float(v) / 100 for v in values if v is not None],
                   [_block_of(n) for n in names], [n.startswith("B") for n in names])
    if isinstance(fit, str):
        lint.problems.append(LintProblem(field="verdict_analysis.ratio",
                                         message=f"an interval where none can be fitted: {fit}"))
        return
    tau, se, df, s2 = fit
    base = "verdict_analysis"
    what = "from the legs' figures (leg_statistics) fitted on block and treatment"
    lint.close(f"{base}.ratio", math.exp(tau), f"exp(treatment effect) {what}",
               rel_tol=RECOMPUTED_TOL)
    r_conf = _num(va.get("record_confidence"))
    for prefix, level in (("", conf), ("record_", r_conf)):
        if level is None:
            continue
        t = float(dist.t_ppf(0.5 + level / 2, df))
        lint.close(f"{base}.{prefix}ci_low", math.exp(tau - t * se),
                   f"exp(effect - t({df}) se) at {100 * level:g} % {what}", rel_tol=RECOMPUTED_TOL)
        lint.close(f"{base}.{prefix}ci_high", math.exp(tau + t * se),
                   f"exp(effect + t({df}) se) at {100 * level:g} % {what}", rel_tol=RECOMPUTED_TOL)
    lint.close(f"{base}.residual_sd_pct", 100 * math.sqrt(s2), f"residual sd {what}",
               rel_tol=RECOMPUTED_TOL)


def _lint_power(lint: _Linter, blocks: int) -> None:
    """The preregistered power: for the design's blocks, its minimum effect among its entries."""

    power = lint.get("power")
    if not isinstance(power, Mapping):
        return
    lint.equal("power.blocks", blocks, "the power is the plan's, for its blocks")
    lint.equal("power.df", abba_df(blocks), "df of the leg-level fit: 3 x blocks - 1")
    lint.equal("power.rows", lint.get("protocol.prompt_count_per_leg"),
               "the power is for the suite's rows")
    for key in ("confidence", "equivalence_pct"):
        lint.equal(f"power.{key}", lint.get(f"verdict_analysis.{key}"),
                   f"the power and the verdict share their {key.replace('_', ' ')}")
    entries = power.get("entries") or []
    for i, entry in enumerate(entries):
        value = _num(entry.get("power")) if isinstance(entry, Mapping) else None
        if value is None or not 0.0 <= value <= 1.0:
            lint.problems.append(LintProblem(field=f"power.entries.{i}.power",
                                             message="a probability in [0, 1]",
                                             found=entry.get("power") if isinstance(entry, Mapping)
                                             else entry))
    effect = _num(power.get("min_effect_pct"))
    if effect is None:
        return
    mine = [e for e in entries if isinstance(e, Mapping) and _num(e.get("effect_pct")) == effect]
    if not mine:
        lint.problems.append(LintProblem(field="power.entries",
                                         message="the minimum effect has no entry",
                                         expected=effect))
        return
    lint.close("power.min_effect_power", _num(mine[0].get("power")),
               f"the power of the +{effect:g} % entry")


def _lint_abba(lint: _Linter) -> None:
    runs = lint.get("runs") or {}
    blocks = _blocks(lint)
    design = str(lint.get("protocol.design") or "abba")
    for name, leg in runs.items():
        if isinstance(leg, Mapping):
            _lint_speculative(lint, f"runs.{name}")
            lint.count(f"runs.{name}.teacher_exact")
    if design == "sweep":
        _lint_sweep(lint, runs, blocks)
    else:
        _lint_design(lint, runs, blocks, design)
        _lint_pairs(lint, runs, blocks)
        _lint_gate(lint, runs, blocks, design)
    summed = [lint.count(f"runs.{n}.teacher_exact") for n in runs]
    if summed and all(s is not None for s in summed):
        total = f"{sum(s[0] for s in summed if s)}/{sum(s[1] for s in summed if s)}"
        lint.equal("quality.all_legs_teacher_exact", total, "sum of the legs' teacher-exact counts")
    for key in ("all_legs_cached_zero", "long_then_next_exact", "rollover_exact"):
        lint.count(f"quality.{key}")
    _lint_bootstrap(lint)
    _lint_analysis(lint, runs, blocks)
    most = lint.get("protocol.max_blocks")
    _lint_power(lint, most if isinstance(most, int) and not isinstance(most, bool) else blocks)
    _lint_sequential(lint, blocks)


def _lint_sequential(lint: _Linter, blocks: int) -> None:
    """A sequential record: each look's interval is its estimate +- boundary x se, its
    boundaries are the preregistered spending's, only the last look stopped, the run
    stopped at the blocks it ran, and the record's verdict is the stopping rule's."""
    seq = lint.get("sequential")
    if not isinstance(seq, Mapping):
        return
    looks = seq.get("looks")
    if not isinstance(looks, list) or not looks or len(looks) > 50 or \
            not all(isinstance(look, Mapping) for look in looks):
        lint.problems.append(LintProblem(field="sequential.looks",
                                         message="a sequential record lists its looks"))
        return
    lint.equal("verdict", seq.get("verdict"), "the record's verdict is the stopping rule's")
    eq, conf, rconf = (_num(seq.get(k)) for k in ("equivalence_pct", "confidence",
                                                   "record_confidence"))
    rule = _sequential_rule(lint, seq)
    if rule is None:
        return
    zs, ts = _sequential_boundaries(seq, looks, conf, *rule)
    for i, look in enumerate(looks):
        _lint_look(lint, seq, i, look, len(looks), zs, ts, eq)
    if rconf is not None and conf is not None and rconf < conf:
        lint.problems.append(LintProblem(field="sequential.record_confidence",
                                         message="the record's confidence is below the verdict's",
                                         found=rconf, expected=conf))
    where = seq.get("stopped_at")
    if seq.get("stopped") is True and isinstance(where, str):
        lint.equal("sequential.stopped_at", f"block {blocks}",
                   "the run stopped after the blocks it ran")


def _sequential_rule(lint: _Linter, seq: Mapping[str, Any]
                     ) -> tuple[Spending, SequentialMethod] | None:
    """The record's spending and method, or None (a problem said so) when unknown."""
    try:
        spending = Spending(str(seq.get("spending")))
    except ValueError:
        lint.problems.append(LintProblem(field="sequential.spending", message="unknown spending",
                                         found=seq.get("spending")))
        return None
    method = method_of_text(seq.get("method"))
    if method is None:
        lint.problems.append(LintProblem(field="sequential.method",
                                         message="not a sequential method this tool knows",
                                         found=seq.get("method")))
        return None
    return spending, method


def _sequential_boundaries(seq: Mapping[str, Any], looks: list[Any], conf: float | None,
                           spending: Spending, method: SequentialMethod
                           ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The z and t boundaries the preregistered spending gives the record's looks; empty
    where the looks' fractions or df are not the plan's."""
    fractions = [_num(look.get("fraction")) for look in looks]
    max_looks = seq.get("max_looks")
    zs: tuple[float, ...] = ()
    ts: tuple[float, ...] = ()
    if conf is not None and isinstance(max_looks, int) and 0 < max_looks <= 50 and \
            all(f is not None for f in fractions):
        fr = [float(f) for f in fractions if f is not None]
        last = fr[-1] if fr else 1.0
        # The planned fractions, blocks m..K of K: the first is m/K and there are K-m+1.
        most = round((max_looks - 1) / (1 - fr[0])) if fr[0] < 1 else max_looks
        first = most - max_looks + 1
        planned = tuple(k / most for k in range(first, most + 1)) if first >= 1 else ()
        if planned and all(math.isclose(a, b, rel_tol=1e-9)
                           for a, b in zip(fr, planned, strict=False)) and last <= 1.0:
            with contextlib.suppress(ValueError):
                zs = z_boundaries(planned, ALPHA_FACTOR[method] * (1 - conf) / 2, spending)
            df0 = looks[0].get("df")
            units = tuple(range(first, most + 1))
            # Each unit (block) adds one contrast and extra_df of pure error.
            if isinstance(df0, int) and not isinstance(df0, bool) and (df0 + 1) % first == 0 \
                    and (df0 + 1) // first >= 1 and most <= 50:
                with contextlib.suppress(ValueError):
                    ts = t_boundaries(units, most, (df0 + 1) // first - 1,
                                      ALPHA_FACTOR[method] * (1 - conf) / 2, spending)
    return zs, ts


def _lint_look(lint: _Linter, seq: Mapping[str, Any], i: int, look: Mapping[str, Any],
               n_looks: int, zs: tuple[float, ...], ts: tuple[float, ...],
               eq: float | None) -> None:
    base = f"sequential.looks.{i}"
    stop = look.get("action") == "stop"
    if stop != (i == n_looks - 1) and seq.get("stopped") is True:
        lint.problems.append(LintProblem(field=f"{base}.action",
                                         message="only the last look stops the run",
                                         found=look.get("action")))
    if zs and i < len(zs):
        lint.close(f"{base}.z_boundary", zs[i], "the preregistered spending's boundary",
                   rel_tol=1e-6)
    if ts and i < len(ts) and math.isfinite(ts[i]):
        lint.close(f"{base}.boundary", ts[i], "the preregistered spending's t boundary "
                   "(sequential.t_boundaries)", rel_tol=1e-6)
    lo, mid, hi = (_num(look.get(k)) for k in ("ci_low", "estimate_ratio", "ci_high"))
    if lo is not None and mid is not None and hi is not None:
        if not lo <= mid <= hi:
            lint.problems.append(LintProblem(field=base, message="ratio outside its interval",
                                             found=[lo, mid, hi]))
        elif eq is not None:
            lint.equal(f"{base}.verdict", verdict(lo, hi, eq).value,
                       "the look's verdict follows from its interval and the band")


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


# What a check raises on JSON of the wrong shape (a list where a number belongs, ...).
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
              ArithmeticError)


def lint_untrusted(record: Any, source: str) -> list[LintProblem]:
    """lint_record for a record read from anyone: a shape the checks do not expect is a
    problem naming the record, never a traceback."""
    if not isinstance(record, Mapping):
        return [LintProblem(field="(record)", message=f"{source} is not a JSON object")]
    try:
        return lint_record(record)
    except _MALFORMED as exc:
        return [LintProblem(field="(record)", message=f"malformed: {type(exc).__name__}: "
                            f"{excerpt(str(exc))}")]


MAX_SWEEP_BLOCKS = 50  # a plan's blocks (experiment.plan)


def _lint_sweep(lint: _Linter, runs: Mapping[str, Any], blocks: int) -> None:
    """A sweep (issue 34): its legs, order and treatments are the Williams design of its
    arms, it has no pairs, and its contrasts recompute from the legs' statistics with the
    analysis' own fit and Dunnett critical value; the best arm is token-exact."""
    a = lint.get("sweep.analysis")
    if not isinstance(a, Mapping):
        lint.problems.append(LintProblem(field="sweep.analysis",
                                         message="a sweep record has no sweep analysis"))
        return
    arms = a.get("arms")
    if not (isinstance(arms, list) and 2 <= len(arms) <= len(ARM_LETTERS)
            and all(isinstance(x, str) for x in arms)):
        lint.problems.append(LintProblem(field="sweep.analysis.arms",
                                         message="not a list of 2 to 10 arm names"))
        return
    if blocks > MAX_SWEEP_BLOCKS:  # hostile input: the design is never built this large
        lint.problems.append(LintProblem(field="protocol.blocks", found=blocks,
                                         message=f"a sweep has at most {MAX_SWEEP_BLOCKS} blocks"))
        return
    legs = sweep_design(arms, blocks)
    names = [leg.name for leg in legs]
    for name in names:
        if name not in runs:
            lint.problems.append(LintProblem(field=f"runs.{name}",
                                             message="a leg of the sweep design is missing"))
    for name in runs:
        if name not in names:
            lint.problems.append(LintProblem(field=f"runs.{name}",
                                             message="not a leg of the sweep design"))
    lint.equal("protocol.order", [f"{leg.name}-{leg.arm}" for leg in legs],
               "order is every arm once per block, in Williams order")
    for leg in legs:
        if isinstance(runs.get(leg.name), Mapping):
            lint.equal(f"runs.{leg.name}.treatment", leg.arm,
                       "a sweep leg's letter names its arm (A the control)")
    lint.equal("protocol.pairs", [], "a sweep has no pairs: its arms share one fit")
    lint.equal("sweep.analysis.control", arms[0], "the control is the first arm")
    _lint_sweep_fit(lint, a, arms)
    summaries = {s.get("arm"): s for s in a.get("arm_summaries") or [] if isinstance(s, Mapping)}
    best = a.get("best")
    if best is not None and not (summaries.get(best) or {}).get("exact"):
        lint.problems.append(LintProblem(field="sweep.analysis.best", found=best,
                                         message="the best arm must be token-exact"))
    if lint.get("status") == "strict_preregistered_record_pass" and \
            lint.get("sweep.gate.passed") is not True:
        lint.problems.append(LintProblem(field="status", found=lint.get("status"),
                                         message="a sweep record passes only when its gate does"))


def _lint_sweep_fit(lint: _Linter, a: Mapping[str, Any], arms: list[str]) -> None:
    stats = a.get("leg_statistics") or {}
    order = [n for n in a.get("order") or [] if isinstance(n, str)]
    k = len(arms)
    confidence = _num(a.get("confidence"))
    if not order or confidence is None or not 0.5 < confidence < 1 or \
            any(_num(stats.get(n)) is None or n[:1] not in ARM_LETTERS[:k] for n in order):
        return
    with contextlib.suppress(ValueError):
        values = np.array([float(stats[n]) / 100 for n in order])
        blocks = [int(n[1:]) for n in order]
        effects, s2, df = fit_arms(values, blocks, [ARM_LETTERS.index(n[0]) for n in order], k)
        if df < 1 or not math.isfinite(s2):
            return
        se = math.sqrt(2 * s2 / len(set(blocks)))
        seq = lint.get("sweep.sequential")
        if isinstance(seq, Mapping):  # a sequential sweep: the stopping look's boundary
            found_c = sweep_look_boundary(seq, k, len(set(blocks)), confidence)
            if found_c is None:
                lint.problems.append(LintProblem(field="sweep.sequential", message=(
                    "its spending, blocks and looks give no boundary for the last look")))
                return
            c = found_c
            lint.close("sweep.analysis.critical_value", c, "the stopping look's boundary "
                       "(sweep_sequential.max_t_boundaries)", rel_tol=1e-6)
        else:
            method = a.get("method")
            c = sweep_critical(k - 1, df, confidence, method if isinstance(method, str)
                               else SWEEP_METHOD)
            lint.close("sweep.analysis.critical_value", c, "Dunnett's critical value",
                       rel_tol=1e-6)
        for i, contrast in enumerate(a.get("contrasts") or []):
            if not isinstance(contrast, Mapping) or i >= k - 1:
                break
            e = float(effects[i])
            base = f"sweep.analysis.contrasts.{i}"
            lint.close(f"{base}.ratio", math.exp(e), "exp(arm effect) from the legs' figures",
                       rel_tol=1e-6)
            lint.close(f"{base}.ci_low", math.exp(e - c * se), "exp(effect - c se)", rel_tol=1e-6)
            lint.close(f"{base}.ci_high", math.exp(e + c * se), "exp(effect + c se)",
                       rel_tol=1e-6)
