"""What a decision costs, before preregistration: expected legs and wall time of the
fixed and the sequential design, and the rows per leg and blocks that minimise it.

Cost of one leg = start (server ready + both idle gates + stop) + idle gap + rows x the
time one row takes, measured in earlier records (`--from`) or given by hand.

Noise per leg figure: sigma^2(r) = sd_leg^2 + (pi/3) sd_row^2 / r (stats.leg_sd_pct).
Blocks needed grow with sigma^2(r) and each leg costs start + r x row, so the wall time
goes with (sd_leg^2 + a/r)(c0 + c1 r), a = (pi/3) sd_row^2: Kalibera & Jones (ISMM
2013) give its minimum at r* = sqrt(a c0 / (sd_leg^2 c1)) for a two-level nested
design. With leg noise dominant and cheap starts, few rows and more legs win; with slow
starts it is the reverse. The planner searches whole rows and blocks directly (power is
not continuous in blocks), which finds the same optimum without the approximation.

The sequential design's outcome is predicted by simulating the verdict's own model:
per block a treatment contrast ~ N(effect, sigma^2) and 2 df of within-block noise,
the fit's t statistic at each look against the plan's boundaries (sequential.analyse
on the same boundaries). bench/verdict/sequential checks it against the real code.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tokrecord.errors import ConfigError
from tokrecord.evidence import layout, read_jsonl
from tokrecord.experiment import dist
from tokrecord.experiment.design import Stopping
from tokrecord.experiment.interim import abba_looks, look_blocks
from tokrecord.experiment.plan import (
    CURRENT_SEQUENTIAL_METHOD,
    Plan,
    SequentialSpec,
    Spending,
)
from tokrecord.experiment.power import read_records
from tokrecord.experiment.sequential import Design, boundaries, draw_paths, run_paths
from tokrecord.experiment.stats import Noise, abba_df, blocks_for_power, leg_sd_pct

TARGET_POWER: Final = 0.9
TRIALS: Final = 4000
# A leg figure is a Hodges-Lehmann location over rows: with fewer rows one stalled row
# moves it, so the planner never recommends fewer.
MIN_ROWS: Final = 3


class LegCost(BaseModel):
    """Seconds one leg costs: start, idle gap, and each row."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_s: float = Field(ge=0)  # server ready + idle gates before and after + stop
    gap_s: float = Field(ge=0)  # the idle gap between legs
    row_s: float = Field(ge=0)  # one row's generation, first byte to last token
    sources: tuple[str, ...] = ()

    def leg_s(self, rows: int) -> float:
        return self.start_s + self.gap_s + rows * self.row_s


class Outcome(BaseModel):
    """A design at one true effect: how it ends and what it spends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    design: Stopping  # how the ABBA design stops: fixed or sequential
    effect_pct: float
    blocks: int  # the fixed design's blocks, or the sequential's max_blocks
    p_faster: float
    p_slower: float
    p_no_difference: float
    p_undecided: float
    expected_legs: float
    expected_wall_s: float | None


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: int
    fixed_blocks: int | None  # for 90 % power at min_effect_pct; None: not within 50
    fixed_wall_s: float | None
    max_blocks: int | None  # the sequential design's, for 90 % power
    sequential_expected_legs: float | None  # at +min_effect_pct
    sequential_wall_s: float | None
    kalibera_jones_rows: float | None  # the continuous optimum for the fixed design


class CostReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: int
    min_effect_pct: float
    noise: Noise
    cost: LegCost | None
    spending: Spending
    min_blocks: int
    outcomes: tuple[Outcome, ...]
    recommendation: Recommendation | None
    warnings: tuple[str, ...]


def simulate(effect_pct: float, noise: Noise, rows: int, blocks: Sequence[int],
             critical: Sequence[float], equivalence_pct: float, trials: int = TRIALS,
             seed: int = 0) -> tuple[float, float, float, float, float]:
    """(P FASTER, P SLOWER, P NO DIFFERENCE, P UNDECIDED, expected blocks) of a design
    that looks after each of `blocks` with t critical values `critical`, stopping at the
    first decision. A fixed design is one look. The paths are the sequential module's
    (`draw_paths`, `run_paths`: ABBA blocks as units, 2 df of pure error each), the
    same that the bias-adjusted estimate and bench.verdict.sequential's prediction walk."""
    units = tuple(blocks)
    paths = draw_paths(Design(units=units, max_units=max(units), extra_df=2), trials, seed)
    sigma = leg_sd_pct(noise, rows) / 100
    found, stop, _ = run_paths(paths, critical, math.log1p(effect_pct / 100), sigma,
                               math.log1p(equivalence_pct / 100),
                               math.log1p(-equivalence_pct / 100))
    share = np.bincount(found, minlength=4) / trials
    return (float(share[0]), float(share[1]), float(share[2]), float(share[3]),
            float(np.mean(np.asarray(units)[stop])))


def fixed_design(blocks: int, confidence: float) -> tuple[list[int], list[float]]:
    return [blocks], [float(dist.t_ppf(0.5 + confidence / 2, abba_df(blocks)))]


def sequential_design(spec: SequentialSpec, confidence: float) -> tuple[list[int], list[float]]:
    return list(look_blocks(spec)), list(boundaries(abba_looks(spec), confidence,
                                                   spec.spending, spec.method_in_force))


def outcome(design: Stopping, blocks: int, looks: tuple[list[int], list[float]], effect_pct: float,
            noise: Noise, rows: int, equivalence_pct: float, cost: LegCost | None,
            trials: int = TRIALS) -> Outcome:
    f, s, nd, u, mean_blocks = simulate(effect_pct, noise, rows, looks[0], looks[1],
                                        equivalence_pct, trials)
    legs = 4 * mean_blocks
    return Outcome(design=design, effect_pct=effect_pct, blocks=blocks, p_faster=f,
                   p_slower=s, p_no_difference=nd, p_undecided=u, expected_legs=legs,
                   expected_wall_s=legs * cost.leg_s(rows) if cost else None)


def sequential_blocks_for_power(effect_pct: float, noise: Noise, rows: int, spending: Spending,
                                min_blocks: int, confidence: float, equivalence_pct: float,
                                start: int = 2, trials: int = TRIALS, most: int = 50
                                ) -> tuple[int, float] | None:
    """The smallest max_blocks whose simulated P(FASTER) reaches 90 %, with its expected
    blocks at that effect; None when 50 do not."""
    for k in range(max(start, min_blocks, 2), most + 1):
        spec = SequentialSpec(max_blocks=k, min_blocks=min(min_blocks, k), spending=spending,
                              method=CURRENT_SEQUENTIAL_METHOD)
        f, _, _, _, mean_blocks = simulate(effect_pct, noise, rows,
                                           *sequential_design(spec, confidence),
                                           equivalence_pct, trials)
        if f >= TARGET_POWER:
            return k, mean_blocks
    return None


def best_spending(effect_pct: float, noise: Noise, rows: int, min_blocks: int,
                  confidence: float, equivalence_pct: float, trials: int = TRIALS
                  ) -> tuple[Spending, tuple[int, float] | None]:
    """For a plan that names no spending: the one whose smallest sequential design with 90 %
    power spends the fewest expected blocks at the effect (Pocock-like spending stops
    earlier near the design's effect; O'Brien-Fleming-like wins where its smaller maximum
    matters), with that design (max_blocks, expected blocks). O'Brien-Fleming on a tie.
    The search starts at the fixed design's blocks for 90 %: a sequential design of at
    most as many blocks is no more powerful (the fixed test is the most powerful at its
    level), so none below it can reach 90 %."""
    start = blocks_for_power(effect_pct, noise, rows, confidence, equivalence_pct,
                             TARGET_POWER) or 2
    best: tuple[Spending, tuple[int, float] | None] | None = None
    for spending in (Spending.OBRIEN_FLEMING, Spending.POCOCK):
        found = sequential_blocks_for_power(effect_pct, noise, rows, spending, min_blocks,
                                            confidence, equivalence_pct, start=start,
                                            trials=trials)
        if best is None or (found is not None and (best[1] is None or found[1] < best[1][1])):
            best = (spending, found)
    assert best is not None
    return best


def recommend(min_effect_pct: float, noise: Noise, cost: LegCost, max_rows: int,
              spending: Spending, min_blocks: int, confidence: float,
              equivalence_pct: float, trials: int = TRIALS) -> Recommendation:
    """The rows per leg and blocks that minimise the expected wall time of a decision at
    +min_effect_pct with 90 % power (the sequential design's, at that effect)."""
    best: Recommendation | None = None
    for rows in range(min(MIN_ROWS, max_rows), max_rows + 1):
        fixed = blocks_for_power(min_effect_pct, noise, rows, confidence, equivalence_pct,
                                 TARGET_POWER)
        fixed_wall = 4 * fixed * cost.leg_s(rows) if fixed else None
        seq = sequential_blocks_for_power(min_effect_pct, noise, rows, spending, min_blocks,
                                          confidence, equivalence_pct,
                                          start=fixed or 2, trials=trials)
        seq_wall = 4 * seq[1] * cost.leg_s(rows) if seq else None
        here = Recommendation(rows=rows, fixed_blocks=fixed, fixed_wall_s=fixed_wall,
                              max_blocks=seq[0] if seq else None,
                              sequential_expected_legs=4 * seq[1] if seq else None,
                              sequential_wall_s=seq_wall,
                              kalibera_jones_rows=kalibera_jones_rows(noise, cost))
        key = seq_wall if seq_wall is not None else math.inf
        if best is None or key < (best.sequential_wall_s if best.sequential_wall_s is not None
                                  else math.inf):
            best = here
    assert best is not None
    return best


def kalibera_jones_rows(noise: Noise, cost: LegCost) -> float | None:
    """r* = sqrt(a c0 / (sd_leg^2 c1)), a = (pi/3) sd_row^2, c0 = a leg's fixed cost,
    c1 = a row's; None when either noise or the row cost is zero."""
    a = (math.pi / 3) * noise.sd_row_pct**2
    c0, c1 = cost.start_s + cost.gap_s, cost.row_s
    if noise.sd_leg_pct == 0 or c1 == 0 or a == 0:
        return None
    return math.sqrt(a * c0 / (noise.sd_leg_pct**2 * c1))


# --------------------------------------------------------------------------- leg cost


def leg_cost_from_record(record: Mapping[str, Any], source: str) -> LegCost:
    """A leg's cost as an earlier record measured it: medians over its legs."""
    legs = (record.get("operational") or {}).get("legs") if isinstance(
        record.get("operational"), Mapping) else None
    if not isinstance(legs, Mapping) or not legs:
        raise ConfigError(f"{source}: key 'operational.legs': no leg timings to take a "
                          "leg's cost from")

    def median(key: str, required: bool = True) -> float:
        values = [float(v[key]) for v in legs.values() if isinstance(v, Mapping)
                  and isinstance(v.get(key), int | float) and not isinstance(v.get(key), bool)]
        if not values:
            if required:
                raise ConfigError(f"{source}: key 'operational.legs.*.{key}': missing in "
                                  "every leg")
            return 0.0
        return float(statistics.median(values))

    start = (median("server_ready_seconds") + median("prestart_idle_seconds", False)
             + median("poststop_idle_seconds", False) + median("stop_seconds", False))
    protocol = record.get("protocol") if isinstance(record.get("protocol"), Mapping) else {}
    assert isinstance(protocol, Mapping)
    measured = protocol.get("idle_gap_seconds_measured")
    gaps = [float(v) for v in (measured.values() if isinstance(measured, Mapping) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)]
    minimum = protocol.get("idle_gap_seconds_minimum")
    gap = float(statistics.median(gaps)) if gaps else float(minimum) if isinstance(
        minimum, int | float) else 0.0
    tokens = protocol.get("top_level_output_tokens_suite_median")
    runs = record.get("runs")
    rates = [float(r["wall_full_median_tok_s"]) for r in (runs.values() if isinstance(
        runs, Mapping) else ()) if isinstance(r, Mapping)
        and isinstance(r.get("wall_full_median_tok_s"), int | float)
        and r["wall_full_median_tok_s"] > 0]
    if not isinstance(tokens, int | float) or not rates:
        raise ConfigError(f"{source}: keys 'protocol.top_level_output_tokens_suite_median' "
                          "and 'runs.*.wall_full_median_tok_s' are needed for a row's time")
    return LegCost(start_s=start, gap_s=gap, row_s=float(tokens) / statistics.median(rates),
                   sources=(source,))


def with_state_log(cost: LegCost, state: Path) -> LegCost:
    """Leg and gap wall times as the state log stamped them (leg_start to leg_end, and
    leg_end to the next leg_start): they hold every overhead a record's figures leave
    out (metric scrapes, gates, the identity check before each leg). The rows keep the
    record's time per row; the rest of a leg counts as its start."""
    try:
        events = read_jsonl(state, skip_torn=True)
    except (OSError, ValueError):
        return cost
    walls, gaps = [], []
    start: float | None = None
    end: float | None = None
    rows = None
    for e in events:
        kind, when = e.get("event"), e.get("unix")
        if not isinstance(when, int | float) or e.get("leg") == "teacher":
            continue
        if kind == "leg_start":
            if end is not None:
                gaps.append(float(when) - end)
            start = float(when)
        elif kind == "leg_end" and start is not None and e.get("status") == "complete":
            walls.append(float(when) - start)
            end, start = float(when), None
    if not walls:
        return cost
    rows = _rows_of(state.parent)
    start_s = statistics.median(walls) - (rows or 0) * cost.row_s
    return LegCost(start_s=max(start_s, 0.0),
                   gap_s=statistics.median(gaps) if gaps else cost.gap_s,
                   row_s=cost.row_s, sources=(f"{cost.sources[0]} (walls from {state.name})",))


def _rows_of(exp_dir: Path) -> int | None:
    try:
        data = json.loads((exp_dir / layout.RECORD).read_text(encoding="utf-8"))
        rows = data["protocol"]["prompt_count_per_leg"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def load_leg_cost(paths: Sequence[Path]) -> LegCost:
    """The mean leg cost of earlier records (record.json, or an experiment directory)."""
    parts = []
    for file, data in read_records(paths):
        found = leg_cost_from_record(data, str(file))
        state = file.parent / layout.STATE
        if state.is_file() and not state.is_symlink():
            found = with_state_log(found, state)
        parts.append(found)
    return LegCost(start_s=statistics.mean(p.start_s for p in parts),
                   gap_s=statistics.mean(p.gap_s for p in parts),
                   row_s=statistics.mean(p.row_s for p in parts),
                   sources=tuple(s for p in parts for s in p.sources))


def cost_report(plan: Plan, noise: Noise, rows: int, cost: LegCost | None, max_rows: int,
                min_effect_pct: float | None = None, trials: int = TRIALS) -> CostReport:
    """Fixed against sequential at 0, +min_effect and +2 x min_effect for the plan as it
    stands (its design, the other for comparison), with the cost-optimal recommendation
    when leg costs are known."""
    effect = min_effect_pct if min_effect_pct is not None else plan.min_effect_pct
    if effect is None:
        raise ConfigError("the cost of a decision needs the effect to decide: declare "
                          "min_effect_pct in the plan, or pass --min-effect")
    conf, eq = plan.verdict.confidence, plan.verdict.equivalence_pct
    spec = plan.sequential
    min_blocks = spec.min_blocks if spec else 2
    if spec is None:
        fixed_k = plan.blocks
        spending, found = best_spending(effect, noise, rows, min_blocks, conf, eq, trials)
        seq_spec = SequentialSpec(max_blocks=found[0] if found else 50,
                                  min_blocks=min_blocks, spending=spending,
                                  method=CURRENT_SEQUENTIAL_METHOD)
    else:
        spending = spec.spending
        fixed_k = blocks_for_power(effect, noise, rows, conf, eq, TARGET_POWER) or 50
        seq_spec = spec
    fixed = fixed_design(fixed_k, conf)
    seq = sequential_design(seq_spec, conf)
    outcomes = []
    for e in (0.0, effect, 2 * effect):
        outcomes.append(outcome(Stopping.FIXED, fixed_k, fixed, e, noise, rows, eq, cost, trials))
        outcomes.append(outcome(Stopping.SEQUENTIAL, seq_spec.max_blocks, seq, e, noise, rows, eq,
                                cost, trials))
    warnings = []
    mine = Stopping.SEQUENTIAL if spec else Stopping.FIXED
    at_min = {(o.design, o.effect_pct): o for o in outcomes}[mine, effect]
    if at_min.p_undecided >= 0.5:
        warnings.append(
            f"this plan will probably end UNDECIDED: at +{effect:g} % its {mine} design "
            f"decides nothing {100 * at_min.p_undecided:.0f} % of the time")
    elif at_min.p_faster < TARGET_POWER:
        warnings.append(f"underpowered: +{effect:g} % is called FASTER "
                        f"{100 * at_min.p_faster:.0f} % of the time by the {mine} design")
    recommendation = None
    if cost is not None:
        recommendation = recommend(effect, noise, cost, max_rows, spending, min_blocks, conf,
                                   eq, trials=min(trials, 2000))
    return CostReport(rows=rows, min_effect_pct=effect, noise=noise, cost=cost,
                      spending=spending, min_blocks=min_blocks, outcomes=tuple(outcomes),
                      recommendation=recommendation, warnings=tuple(warnings))


def plan_cost_inputs(source: str, records: Sequence[Path], start_s: float | None,
                     row_s: float | None, gap_s: float | None) -> LegCost:
    """Leg costs given now, else measured in the records; an error names what is missing."""
    if start_s is not None or row_s is not None:
        if start_s is None or row_s is None:
            raise ConfigError("give both --start-s and --row-s (and optionally --gap-s), "
                              "or take the costs from --from RECORD")
        return LegCost(start_s=start_s, row_s=row_s, gap_s=gap_s or 0.0, sources=("given",))
    if records:
        return load_leg_cost(records)
    raise ConfigError(
        f"{source}: cost figures need a leg's cost: no earlier record and no costs given. "
        "Pass --from RECORD (an earlier record of this machine and engine) or --start-s "
        "and --row-s")
