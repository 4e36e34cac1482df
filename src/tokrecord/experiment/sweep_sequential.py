"""A sequential sweep ([sequential] with design 'sweep'): one look per block, stopping as
soon as the best-arm claim or every arm's simultaneous interval decides.

The rule. After block b (from min_blocks on) the sweep's own analysis
(`sweep.sweep_analysis`) is run on blocks 1..b with one critical value c_b in place of
Dunnett's: every arm's interval against control is estimate +- c_b se, and an exact arm
X is claimed fastest when X - Y > c_b se for every other exact arm Y (Hsu's MCB with the
same margin). The look stops when an arm is claimed fastest, or when every arm's
interval decides (FASTER, SLOWER or NO DIFFERENCE, read as the fixed design reads it);
the last look stops whatever it finds.

Why this keeps the family-wise error. c_b is the boundary of the largest of the k-1
equicorrelated t statistics "arm - control" (one shared variance estimate on
(k-1)(b-1) df), set by Lan-DeMets spending (`sequential.spent`): with every arm equal,
P(max_i t_i > c_b at some look b) is the alpha/2 spent by the last look, simulated
under the fit's own model with a fixed seed (as `sequential.t_boundaries` does for one
contrast). Hence:
- false FASTER: any arm's repeated interval above 1 at any look means some t_i > c_b at
  that look, so the family-wise false FASTER over all looks is at most alpha/2;
- coverage: the intervals of every arm cover at every look at once unless the
  standardised errors cross +c_b or -c_b somewhere; each side has probability at most
  alpha/2, so simultaneous coverage over arms and looks is at least 1 - alpha, whatever
  made the run stop;
- best arm: the differences "Y - true best" have the same law as "arm - control"
  (equal replication, correlation 0.5), so with probability at least 1 - alpha/2 none
  of them ever exceeds c_b se, and then no arm but the true best can be claimed at any
  look (the MCB argument, over looks). Fewer exact arms than k only makes it safer.
With one planned look c is the one-sided Dunnett value at 1 - alpha/2 (Dunnett 1955).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

import numpy as np

from tokrecord.experiment import dist
from tokrecord.experiment.leg import LegResult
from tokrecord.experiment.plan import Plan, SequentialSpec, Spending
from tokrecord.experiment.sequential import Action, spent
from tokrecord.experiment.stats import MIN_LEG_DF, LegFigures, Verdict
from tokrecord.experiment.sweep import (
    SweepAnalysis,
    SweepLegInput,
    SweepLook,
    SweepSequential,
    sweep_analysis,
    sweep_df,
)
from tokrecord.gates import TEACHER_EXACT, GateStatus

SIMS: Final = 200_000  # the spent alpha's Monte-Carlo error: about 0.0004 at 0.025
SEED: Final = 34_2024
# Below this many expected crossings the simulated quantile is noise: the look takes a
# conservative single-look bound at the increment spent (_single_look).
_MIN_CROSSINGS: Final = 50

SWEEP_SEQUENTIAL_METHOD: Final = (
    "group-sequential sweep, Lan-DeMets alpha spending; after each block the sweep's fit "
    "on the blocks so far, with one boundary c_b for the largest of the k-1 arm-vs-control "
    "t statistics (simulated under the fit's model with every arm equal, 200000 paths, "
    "seed 342024) in place of Dunnett's value: repeated simultaneous intervals "
    "estimate +- c_b se, and the best arm by Hsu's MCB with margin c_b se; a look stops "
    "when an arm is claimed fastest or every arm's interval decides, the last whatever "
    "it finds")


def look_blocks(spec: SequentialSpec) -> tuple[int, ...]:
    return tuple(range(spec.min_blocks, spec.max_blocks + 1))


@lru_cache(maxsize=64)
def max_t_boundaries(k: int, blocks: tuple[int, ...], max_blocks: int, alpha: float,
                     spending: Spending, sims: int = SIMS, seed: int = SEED) -> tuple[float, ...]:
    """Upper boundaries c_j for max_i t_i (k-1 arms against control, one fit per look on
    the blocks so far) such that P(some look i <= j crosses | every arm equal) is the
    alpha spent by blocks_j / max_blocks. inf where the look has no df or spends nothing.
    Paths only stop on crossing, so other reasons to stop make the rule conservative."""
    if k < 2 or not blocks or any(b <= a for a, b in itertools.pairwise(blocks)) \
            or blocks[0] < 1 or blocks[-1] > max_blocks:
        raise ValueError(f"looks must increase within 1..{max_blocks} with k >= 2: {blocks}")
    rng = np.random.default_rng(seed)
    arm_sums = np.zeros((sims, k))
    squares = np.zeros(sims)
    block_sq = np.zeros(sims)  # sum over blocks of (block total)^2
    alive = np.ones(sims, dtype=bool)
    seen = 0
    used = 0.0
    out: list[float] = []
    for b in blocks:
        while seen < b:
            e = rng.standard_normal((sims, k))
            arm_sums += e
            squares += (e * e).sum(axis=1)
            block_sq += e.sum(axis=1) ** 2
            seen += 1
        target = spent(spending, alpha, b / max_blocks) - used
        used += max(target, 0.0)
        df = sweep_df(k, b)
        if df < 1 or target <= 0:
            out.append(math.inf)
            continue
        means = arm_sums / b
        grand = means.mean(axis=1)
        ss = squares - block_sq / k - b * (means * means).sum(axis=1) + b * k * grand * grand
        se = np.sqrt(2 * np.maximum(ss, 0) / df / b)
        stat = (means[:, 1:] - means[:, :1]).max(axis=1) / se
        if target * sims < _MIN_CROSSINGS:
            c = _single_look(k - 1, df, target)
        else:
            ranked = np.sort(stat[alive])[::-1]
            c = float(ranked[min(round(target * sims), len(ranked) - 1)])
        alive &= ~(stat > c)
        out.append(c)
    return tuple(out)


def _single_look(p: int, df: int, target: float) -> float:
    """An early look spending less than _MIN_CROSSINGS paths can resolve: the Bonferroni
    bound over the p one-sided t statistics at this look alone, which spends at most
    `target` (conservative: it ignores their correlation and the paths already stopped),
    and costs one t quantile where Dunnett's would be a root search per look."""
    if target <= 1e-15:
        return math.inf
    return float(dist.t_isf(target / p, df))


def boundaries(spec: SequentialSpec, k: int, confidence: float) -> tuple[float, ...]:
    return max_t_boundaries(k, look_blocks(spec), spec.max_blocks, (1 - confidence) / 2,
                            spec.spending)


def _at(legs: Sequence[SweepLegInput], block: int) -> list[SweepLegInput]:
    return [leg for leg in legs if leg.block <= block]


def whole_blocks(legs: Sequence[SweepLegInput], k: int) -> int:
    """How many leading blocks have every arm's leg."""
    counts: dict[int, int] = {}
    for leg in legs:
        counts[leg.block] = counts.get(leg.block, 0) + 1
    b = 0
    while counts.get(b + 1, 0) == k:
        b += 1
    return b


def sequential_sweep(legs: Sequence[SweepLegInput], arms: Sequence[str], control: str,
                     spec: SequentialSpec, confidence: float, record_confidence: float,
                     equivalence_pct: float) -> tuple[SweepSequential, SweepAnalysis]:
    """Walk the looks the legs allow (whole blocks only) against the preregistered
    boundaries, stopping at the first that decides; returns the looks and the analysis
    at the last look taken (all the legs, with the fixed design's Dunnett value, when no
    look could be taken yet)."""
    k = len(arms)
    complete = whole_blocks(legs, k)
    cs = boundaries(spec, k, confidence)
    cs_rec = boundaries(spec, k, record_confidence)
    alpha = (1 - confidence) / 2
    looks: list[SweepLook] = []
    last: SweepAnalysis | None = None
    stopped = False
    for j, b in enumerate(look_blocks(spec)):
        if b > complete:
            break
        final = b == spec.max_blocks
        c, c_rec = cs[j], cs_rec[j]
        usable = math.isfinite(c) and math.isfinite(c_rec) and sweep_df(k, b) >= MIN_LEG_DF
        found = sweep_analysis(_at(legs, b), arms, control, confidence, equivalence_pct,
                               record_confidence, critical=(c, c_rec) if usable else None)
        decided = tuple(x.arm for x in found.contrasts if x.verdict is not Verdict.UNDECIDED)
        settled = usable and found.contrasts and (
            found.best is not None or len(decided) == len(found.contrasts))
        action = Action.STOP if final or settled else Action.CONTINUE
        best = next((x for x in found.contrasts if x.arm == found.best), None)
        stat = _max_t(found)
        why = (f"max t({found.df}) = {'n/a' if stat is None else f'{stat:.3f}'} against "
               f"{'n/a' if not usable else f'{c:.3f}'}: "
               + ("not yet estimable (" + found.reason + ")" if not usable
                  else f"{found.best} claimed fastest" if found.best is not None
                  else "every arm's interval decided" if settled
                  else "the last look, no arm singled out" if final else "continue"))
        looks.append(SweepLook(
            label=f"block {b}", block=b, df=found.df, statistic=stat,
            boundary=c if usable else None, record_boundary=c_rec if usable else None,
            alpha_spent=2 * spent(spec.spending, alpha, b / spec.max_blocks),
            best=found.best if usable else None, decided=decided if usable else (),
            faster=tuple(x.arm for x in found.contrasts if x.verdict is Verdict.FASTER)
            if usable else (),
            verdict=best.verdict if best is not None and usable else Verdict.UNDECIDED,
            action=action, reason=why))
        last = found
        if action is Action.STOP:
            stopped = True
            break
    if last is None:
        # No look yet: no claim and no interval (the analysis of no complete block).
        last = sweep_analysis(_at(legs, 0), arms, control, confidence, equivalence_pct,
                              record_confidence)
    seq = SweepSequential(method=SWEEP_SEQUENTIAL_METHOD, spending=spec.spending,
                          min_blocks=spec.min_blocks, max_blocks=spec.max_blocks,
                          looks=tuple(looks), stopped=stopped,
                          stopped_at=looks[-1].label if stopped else None)
    return seq, last


def _max_t(found: SweepAnalysis) -> float | None:
    """max_i log(ratio_i) / se, with se recovered from the recorded interval."""
    if not found.contrasts or found.critical_value is None or not math.isfinite(
            found.critical_value) or found.critical_value <= 0:
        return None
    ts = []
    for x in found.contrasts:
        width = math.log(x.ci_high / x.ci_low) / 2
        if width <= 0:
            return None
        ts.append(math.log(x.ratio) / (width / found.critical_value))
    return max(ts)


def blocks_needed(legs: Sequence[SweepLegInput], arms: Sequence[str], control: str,
                  spec: SequentialSpec, confidence: float, record_confidence: float,
                  equivalence_pct: float) -> int:
    """How many blocks the sweep runs given the legs so far: up to the look that stopped
    it, else one more than the whole blocks done (at most max_blocks). The runner and a
    resume ask this before each block, and verify again, so none runs past the rule."""
    seq, _ = sequential_sweep(legs, arms, control, spec, confidence, record_confidence,
                              equivalence_pct)
    if seq.stopped and seq.looks:
        return seq.looks[-1].block
    return min(whole_blocks(legs, len(arms)) + 1, spec.max_blocks)


def leg_exact(result: LegResult) -> bool:
    """The leg's teacher-exact gate passed: every row token-exact against the one teacher."""
    return any(g.name == TEACHER_EXACT and g.status is GateStatus.PASS for g in result.gates)


def sweep_legs(plan: Plan, figures: Mapping[str, LegFigures],
               exact: Mapping[str, bool]) -> list[SweepLegInput]:
    """The design's legs that have figures, as the sweep's analysis sees them."""
    return [SweepLegInput(figures=figures[leg.name], block=leg.block,
                          exact=exact.get(leg.name, False))
            for leg in plan.design_legs if leg.name in figures]


def plan_sequential_sweep(plan: Plan, figures: Mapping[str, LegFigures],
                          exact: Mapping[str, bool]) -> tuple[SweepSequential, SweepAnalysis]:
    """`sequential_sweep` on a sequential sweep plan's legs run so far."""
    if plan.sequential is None or plan.sweep is None:
        raise ValueError("not a sequential sweep plan")
    return sequential_sweep(sweep_legs(plan, figures, exact), tuple(plan.all_arms),
                            plan.control_arm, plan.sequential, plan.verdict.confidence,
                            plan.record_confidence, plan.verdict.equivalence_pct)


def plan_blocks_needed(plan: Plan, figures: Mapping[str, LegFigures],
                       exact: Mapping[str, bool]) -> int:
    """`blocks_needed` for a sequential sweep plan (max_blocks for a fixed one)."""
    if plan.sequential is None or plan.sweep is None:
        return plan.max_blocks
    return blocks_needed(sweep_legs(plan, figures, exact), tuple(plan.all_arms),
                         plan.control_arm, plan.sequential, plan.verdict.confidence,
                         plan.record_confidence, plan.verdict.equivalence_pct)


def sweep_look_boundary(seq: Mapping[str, Any], k: int, blocks: int,
                        confidence: float) -> float | None:
    """The boundary of the look after `blocks` blocks, recomputed from a recorded
    sequential section (lint reads hostile records: every field is checked, and the
    design is bounded as a plan bounds it). None when the section cannot give one."""
    least, most, how = seq.get("min_blocks"), seq.get("max_blocks"), seq.get("spending")
    if not (isinstance(least, int) and isinstance(most, int) and not isinstance(least, bool)
            and not isinstance(most, bool) and 1 <= least <= blocks <= most <= 50
            and 2 <= k <= 10 and how in {s.value for s in Spending}):
        return None
    spec = SequentialSpec(min_blocks=least, max_blocks=most, spending=Spending(how))
    c = boundaries(spec, k, confidence)[blocks - least]
    return c if math.isfinite(c) else None
