"""Synthetic experiments through the project's own verdict, pairs and record gate.

Each trial builds 4k legs of row rates from a known truth and hands them to
`pair_result`, `leg_analysis` and `record_gate`, exactly as a record does:

    rate[leg, row] = base * row_speed[row] * exp(u_leg + drift * position + effect * treated
                                                 + e[leg, row])

- row_speed: each prompt has its own speed (lognormal, sd 30 %), the same in every leg;
- u_leg ~ N(0, sd_leg): every fresh server runs at its own speed;
- e ~ N(0, sd_row): row-to-row noise within a leg;
- drift: a linear trend over the legs in run order (a warming or throttling machine);
- outlier: one stalled row per trial, in a random leg, at 30 % of its rate.

The prior record is the true control level (the median row's control rate), so a
strict record in an A/A experiment is a false record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokrecord.experiment.plan import Criteria, Plan, VerdictSpec, abba_design, abba_pairs
from tokrecord.experiment.stats import (
    AnalysisLeg,
    LegFigures,
    Verdict,
    leg_analysis,
    pair_result,
    record_gate,
)

ROWS = 13
BASE_TOK_S = 100.0
ROW_SPEED_SD = 0.3
STALL_FACTOR = 0.3
# The plan's defaults: what a user gets.
CONFIDENCE = VerdictSpec().confidence
EQUIVALENCE_PCT = VerdictSpec().equivalence_pct
RECORD_CONFIDENCE = Plan.model_fields["record_confidence"].default


@dataclass(frozen=True)
class Cell:
    sd_leg_pct: float
    sd_row_pct: float
    effect_pct: float
    blocks: int
    drift_pct_per_leg: float = 0.0
    outlier: bool = False

    @property
    def condition(self) -> str:
        parts = []
        if self.drift_pct_per_leg:
            parts.append(f"drift {self.drift_pct_per_leg:g} %/leg")
        if self.outlier:
            parts.append("stalled row")
        return ", ".join(parts) or "plain"


@dataclass
class Tally:
    trials: int = 0
    faster: int = 0
    slower: int = 0
    no_difference: int = 0
    undecided: int = 0
    strict_record: int = 0
    covered: int = 0

    def rate(self, count: int) -> float:
        return count / self.trials if self.trials else math.nan


def trial(cell: Cell, rng: np.random.Generator) -> tuple[Verdict, bool, bool]:
    """(verdict, strict record passed, interval covers the true ratio) for one experiment."""
    design = abba_design(cell.blocks)
    row_speed = np.exp(rng.normal(0.0, ROW_SPEED_SD, ROWS))
    effect = math.log1p(cell.effect_pct / 100)
    stalled_leg = int(rng.integers(len(design))) if cell.outlier else -1
    stalled_row = int(rng.integers(ROWS))
    figures: dict[str, LegFigures] = {}
    for position, leg in enumerate(design):
        shift = (rng.normal(0.0, cell.sd_leg_pct / 100) + position * cell.drift_pct_per_leg / 100
                 + (effect if leg.treated else 0.0))
        rates = BASE_TOK_S * row_speed * np.exp(shift + rng.normal(0.0, cell.sd_row_pct / 100,
                                                                   ROWS))
        if position == stalled_leg:
            rates[stalled_row] *= STALL_FACTOR
        figures[leg.name] = LegFigures(
            name=leg.name, arm="candidate" if leg.treated else "control",
            headline=float(np.median(rates)), row_rates=tuple(float(r) for r in rates),
            aggregate_cycle_ms=None, acceptance_rate=None)
    pairs = [pair_result(figures[c], figures[a], Criteria()) for c, a in abba_pairs(cell.blocks)]
    analysis = leg_analysis([AnalysisLeg(figures=figures[leg.name], block=leg.block,
                                         treated=leg.treated) for leg in design],
                            CONFIDENCE, EQUIVALENCE_PCT, RECORD_CONFIDENCE)
    prior = BASE_TOK_S * float(np.median(row_speed))
    gate = record_gate([figures[leg.name] for leg in design if leg.treated],
                       [figures[leg.name] for leg in design if not leg.treated], pairs,
                       True, prior, analysis.record_verdict, True)
    truth = 1 + cell.effect_pct / 100
    covered = (analysis.ci_low is not None and analysis.ci_high is not None
               and analysis.ci_low <= truth <= analysis.ci_high)
    return analysis.verdict, gate.strict_preregistered_record_pass, covered


def run_cell(cell: Cell, trials: int, seed: int) -> Tally:
    rng = np.random.default_rng(seed)
    tally = Tally()
    for _ in range(trials):
        found, record, covered = trial(cell, rng)
        tally.trials += 1
        tally.faster += found is Verdict.FASTER
        tally.slower += found is Verdict.SLOWER
        tally.no_difference += found is Verdict.NO_DIFFERENCE
        tally.undecided += found is Verdict.UNDECIDED
        tally.strict_record += record
        tally.covered += covered
    return tally
