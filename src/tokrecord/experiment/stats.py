"""Pairs, the paired bootstrap, the verdict and the record gate: pure functions.

Definitions follow DESIGN.md: a pair is a candidate leg against the control leg
it is paired with (B1 vs A1, B2 vs A2).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict

from tokrecord.experiment.plan import Criteria, VerdictSpec


class LegFigures(BaseModel):
    """What the experiment layer needs of a leg (built from its LegResult and rows)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    arm: str
    headline: float | None
    row_rates: tuple[float | None, ...]  # headline convention, by row index
    aggregate_cycle_ms: float | None
    acceptance_rate: float | None


class PairResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate: str
    control: str
    headline_delta_pct: float | None
    candidate_row_wins: str
    paired_median_delta_pct: float | None
    aggregate_cycle_saving_ms: float | None
    acceptance_rate_delta_percentage_points: float | None
    passed: bool
    failed_criteria: tuple[str, ...] = ()


def pct_delta(candidate: float, control: float) -> float:
    return 100.0 * (candidate / control - 1.0)


def pair_result(candidate: LegFigures, control: LegFigures, criteria: Criteria) -> PairResult:
    rows = [
        (c, a) for c, a in zip(candidate.row_rates, control.row_rates, strict=False)
        if c is not None and a is not None and a > 0
    ]
    wins = sum(1 for c, a in rows if c > a)
    per_row = [pct_delta(c, a) for c, a in rows]
    head = (pct_delta(candidate.headline, control.headline)
            if candidate.headline is not None and control.headline else None)
    paired = float(statistics.median(per_row)) if per_row else None
    saving = (control.aggregate_cycle_ms - candidate.aggregate_cycle_ms
              if control.aggregate_cycle_ms is not None and candidate.aggregate_cycle_ms is not None
              else None)
    acc = (100.0 * (candidate.acceptance_rate - control.acceptance_rate)
           if candidate.acceptance_rate is not None and control.acceptance_rate is not None
           else None)
    failed = []
    if head is None or not head > criteria.headline_delta_pct_gt:
        failed.append(f"headline delta {_f(head)} % not > {criteria.headline_delta_pct_gt:g} %")
    if paired is None or not paired > criteria.paired_median_delta_pct_gt:
        failed.append(f"paired median delta {_f(paired)} % not > "
                      f"{criteria.paired_median_delta_pct_gt:g} %")
    total = len(candidate.row_rates)
    if not (total and wins / total > criteria.row_wins_fraction_gt):
        failed.append(f"row wins {wins}/{total} not > {criteria.row_wins_fraction_gt:g}")
    return PairResult(
        candidate=candidate.name, control=control.name, headline_delta_pct=head,
        candidate_row_wins=f"{wins}/{total}", paired_median_delta_pct=paired,
        aggregate_cycle_saving_ms=saving, acceptance_rate_delta_percentage_points=acc,
        passed=not failed, failed_criteria=tuple(failed),
    )


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


class Verdict(StrEnum):
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    NO_DIFFERENCE = "NO DIFFERENCE"
    UNDECIDED = "UNDECIDED"


class BootstrapResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    samples: int
    seed: int
    equivalence_pct: float
    verdict: Verdict
    method: str = (
        "paired bootstrap of candidate/control: in each pair the same resampled row indices "
        "are applied to both legs (rows resampled within legs, legs kept as blocks); "
        "statistic = mean of candidate leg medians / mean of control leg medians"
    )


def paired_bootstrap(
    pairs: Sequence[tuple[LegFigures, LegFigures]], spec: VerdictSpec
) -> BootstrapResult | None:
    """CI for the candidate/control ratio; None when some pair has no comparable rows."""
    arrays = []
    for cand, ctrl in pairs:
        keep = [i for i, (c, a) in enumerate(zip(cand.row_rates, ctrl.row_rates, strict=False))
                if c is not None and a is not None]
        if not keep:
            return None
        arrays.append((np.array([cand.row_rates[i] for i in keep], dtype=np.float64),
                       np.array([ctrl.row_rates[i] for i in keep], dtype=np.float64)))
    rng = np.random.default_rng(spec.seed)
    cand_medians = np.empty((spec.bootstrap_samples, len(arrays)))
    ctrl_medians = np.empty_like(cand_medians)
    for p, (c, a) in enumerate(arrays):
        idx = rng.integers(0, len(c), size=(spec.bootstrap_samples, len(c)))
        cand_medians[:, p] = np.median(c[idx], axis=1)
        ctrl_medians[:, p] = np.median(a[idx], axis=1)
    ratios = cand_medians.mean(axis=1) / ctrl_medians.mean(axis=1)
    point = float(np.mean([np.median(c) for c, _ in arrays]) /
                  np.mean([np.median(a) for _, a in arrays]))
    alpha = 1.0 - spec.confidence
    low, high = (float(v) for v in np.quantile(ratios, [alpha / 2, 1 - alpha / 2]))
    return BootstrapResult(
        ratio=point, ci_low=low, ci_high=high, confidence=spec.confidence,
        samples=spec.bootstrap_samples, seed=spec.seed, equivalence_pct=spec.equivalence_pct,
        verdict=verdict(low, high, spec.equivalence_pct),
    )


def verdict(ci_low: float, ci_high: float, equivalence_pct: float) -> Verdict:
    """NO DIFFERENCE when the whole interval lies within ±equivalence of no change (even if
    it excludes 1: such an effect is too small to claim); else FASTER / SLOWER when it
    excludes 1; else UNDECIDED."""
    margin = equivalence_pct / 100.0
    if 1 - margin <= ci_low and ci_high <= 1 + margin:
        return Verdict.NO_DIFFERENCE
    if ci_low > 1:
        return Verdict.FASTER
    if ci_high < 1:
        return Verdict.SLOWER
    return Verdict.UNDECIDED


class RecordGate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_lower_start_tok_s: float | None
    candidate_higher_start_tok_s: float | None
    control_lower_start_tok_s: float | None
    prior_record_tok_s: float | None
    delta_vs_prior_record_tok_s: float | None
    delta_vs_prior_record_pct: float | None
    quality_passed_all_legs: bool
    pairs_passed: bool
    verdict: Verdict | None
    strict_preregistered_record_pass: bool
    reasons: tuple[str, ...] = ()


def record_gate(
    candidates: Sequence[LegFigures],
    controls: Sequence[LegFigures],
    pairs: Sequence[PairResult],
    quality_passed: bool,
    prior: float | None,
    bootstrap: BootstrapResult | None,
    require_faster: bool,
) -> RecordGate:
    """Strict preregistered gate: every quality gate in every leg, both pairs pass, and the
    lower candidate headline beats the prior record (and, when declared, verdict FASTER)."""
    cand = [c.headline for c in candidates if c.headline is not None]
    ctrl = [c.headline for c in controls if c.headline is not None]
    lower = min(cand) if len(cand) == len(candidates) and cand else None
    higher = max(cand) if cand else None
    reasons = []
    if not quality_passed:
        reasons.append("a quality gate did not pass in every leg")
    pairs_ok = bool(pairs) and all(p.passed for p in pairs)
    if not pairs_ok:
        reasons.append("not every pair passed its preregistered criteria")
    delta = pct = None
    if prior is None:
        reasons.append("no prior record declared in the plan")
    elif lower is None:
        reasons.append("a candidate leg has no headline")
    else:
        delta, pct = lower - prior, pct_delta(lower, prior)
        if not lower > prior:
            reasons.append(f"lower candidate headline {lower:.3f} does not beat the prior "
                           f"record {prior:.3f}")
    found = bootstrap.verdict if bootstrap else None
    if require_faster and found is not Verdict.FASTER:
        reasons.append(f"verdict is {found.value if found else 'not computed'}, not FASTER")
    return RecordGate(
        candidate_lower_start_tok_s=lower, candidate_higher_start_tok_s=higher,
        control_lower_start_tok_s=min(ctrl) if ctrl else None, prior_record_tok_s=prior,
        delta_vs_prior_record_tok_s=delta, delta_vs_prior_record_pct=pct,
        quality_passed_all_legs=quality_passed, pairs_passed=pairs_ok, verdict=found,
        strict_preregistered_record_pass=not reasons, reasons=tuple(reasons),
    )
