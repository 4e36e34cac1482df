"""The interim analyses of a sequential ABBA plan: one look per block.

Each look is the fixed design's own analysis (`stats.leg_analysis`) on the legs of the
blocks run so far; `experiment.sequential` holds the stopping rule. The same function
decides, while running, whether another block is needed, and recomputes the record's
sequential section afterwards (verify calls it again), so a run and its check cannot
disagree about where it should have stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tokrecord.experiment.leg import LegResult, RowRecord
from tokrecord.experiment.plan import Plan, SequentialSpec
from tokrecord.experiment.sequential import Design, LookInput, SequentialAnalysis, analyse
from tokrecord.experiment.stats import AnalysisLeg, LegFigures, leg_analysis, t_quantile


def leg_figures(result: LegResult, rows: Sequence[RowRecord]) -> LegFigures:
    """What the verdict needs of a leg: its headline and its rows' rates."""
    conv = result.summary.headline_convention
    return LegFigures(
        name=result.name, arm=result.arm, headline=result.summary.tok_s_out,
        row_rates=tuple(r.metrics.rate(conv) for r in rows),
        aggregate_cycle_ms=result.engine.aggregate_cycle_ms if result.engine else None,
        acceptance_rate=result.engine.draft_acceptance_rate if result.engine else None,
    )


def look_blocks(spec: SequentialSpec) -> tuple[int, ...]:
    """The blocks after which a look is taken: min_blocks .. max_blocks."""
    return tuple(range(spec.min_blocks, spec.max_blocks + 1))


def look_fractions(spec: SequentialSpec) -> tuple[float, ...]:
    """Information fractions of the looks: a balanced block adds the same information."""
    return tuple(k / spec.max_blocks for k in look_blocks(spec))


def equivalence(plan: Plan) -> float:
    spec = plan.sequential
    if spec is not None and spec.equivalence_pct is not None:
        return spec.equivalence_pct
    return plan.verdict.equivalence_pct


def look_input(legs: Sequence[AnalysisLeg], block: int, spec: SequentialSpec,
               confidence: float, equivalence_pct: float) -> LookInput:
    """The look after `block` blocks: the leg-level fit on the legs of blocks 1..block."""
    taken = [leg for leg in legs if leg.block <= block]
    fraction = block / spec.max_blocks
    found = leg_analysis(taken, confidence, equivalence_pct)
    label = f"block {block}"
    if found.ratio is None or found.ci_low is None or found.ci_high is None or found.df < 1:
        return LookInput(label=label, fraction=fraction, estimate=None, se=None,
                         df=found.df, reason=found.reason)
    # The fit's standard error, recovered from its interval (t on the fit's df).
    t = t_quantile(0.5 + confidence / 2, found.df)
    se = math.log(found.ci_high / found.ci_low) / (2 * t)
    return LookInput(label=label, fraction=fraction, estimate=math.log(found.ratio), se=se,
                     df=found.df)


def sequential_analysis(plan: Plan, legs: Sequence[AnalysisLeg],
                        adjust: bool = True) -> SequentialAnalysis:
    """The looks the legs allow (only whole blocks count), walked against the plan's
    preregistered boundaries, stopping at the first that decides; with `adjust`, the
    bias-adjusted estimate at the stop too (a calibration run that reads only the
    verdict can leave it out)."""
    spec = plan.sequential
    if spec is None:
        raise ValueError("not a sequential plan")
    complete = _whole_blocks(legs)
    eq = equivalence(plan)
    inputs = [look_input(legs, b, spec, plan.verdict.confidence, eq)
              for b in look_blocks(spec) if b <= complete]
    return analyse(inputs, len(look_blocks(spec)), look_fractions(spec), spec.spending,
                   plan.verdict.confidence, plan.record_confidence, eq, abba_looks(spec),
                   adjust=adjust, method=spec.method_in_force)


def abba_looks(spec: SequentialSpec) -> Design:
    """ABBA blocks as units: each adds one treatment contrast and 2 df of pure error
    (4 legs less a block effect and the contrast), so k blocks leave 3k - 1 df."""
    return Design(units=look_blocks(spec), max_units=spec.max_blocks, extra_df=2)


def _whole_blocks(legs: Sequence[AnalysisLeg]) -> int:
    """How many leading blocks have all four legs."""
    counts: dict[int, int] = {}
    for leg in legs:
        counts[leg.block] = counts.get(leg.block, 0) + 1
    k = 0
    while counts.get(k + 1, 0) == 4:
        k += 1
    return k


def analysis_legs(plan: Plan, figures: Mapping[str, LegFigures]) -> list[AnalysisLeg]:
    """The design's legs that have figures, as the verdict sees them."""
    return [AnalysisLeg(figures=figures[leg.name], block=leg.block, treated=leg.treated)
            for leg in plan.design_legs if leg.name in figures]


def blocks_needed(plan: Plan, figures: Mapping[str, LegFigures]) -> int:
    """How many blocks the plan runs given the legs done so far: all of a fixed plan's;
    for a sequential plan, up to the block whose look stopped it, else one more than
    the whole blocks done (capped at max_blocks). A resume asks the same question, so
    it never runs a block beyond the stopping rule."""
    if plan.sequential is None:
        return plan.max_blocks
    legs = analysis_legs(plan, figures)
    found = sequential_analysis(plan, legs, adjust=False)
    if found.stopped and found.stopped_at is not None:
        return int(found.stopped_at.split()[-1])
    return min(_whole_blocks(legs) + 1, plan.max_blocks)
