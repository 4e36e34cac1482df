"""Calibration of the sweep design (issue 34): family-wise false FASTER with every arm
equal, coverage of the simultaneous intervals, the best arm picked at the planner's
blocks, and the planner's power against simulation.

    .venv/bin/python -m bench.verdict.sweep [--trials 2000] [--seed 1]

Every trial goes through the project's own analysis (`experiment.sweep.sweep_analysis`):
legs of ROWS rows are simulated as in sim.py (a row's own speed, a fresh server's
speed per leg, row noise), one leg per arm per block in the design's Williams order.

Targets (issue 34):
1. family-wise false FASTER, all arms equal, k = 3, 5, 8 and leg sd 1-3 %: <= 2.5 %;
2. coverage of the simultaneous (Dunnett) intervals: >= 95 %;
3. the best arm picked when it is +3 % over the rest, at the planner's blocks: >= 90 %;
4. the planner's predicted power (`sweep_power`) within +-5 points of the simulation.
A rate counts as within target when its Monte-Carlo interval (2 standard errors)
reaches the threshold; every rate is printed with its standard error.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

import numpy as np
from numpy.random import Generator

from bench.verdict.sim import BASE_TOK_S, ROW_SPEED_SD, ROWS
from tokrecord.experiment.stats import LegFigures, Verdict
from tokrecord.experiment.sweep import (
    SweepAnalysis,
    SweepLegInput,
    sweep_analysis,
    sweep_blocks_for_power,
    sweep_design,
    sweep_leg_sd_pct,
    sweep_power,
)

CONFIDENCE = 0.95
SD_ROW_PCT = 3.42  # H200 plain decoding's row sd (fixtures/h200-aa)
KS = (3, 5, 8)
SD_LEGS = (1.0, 2.0, 3.0)
NULL_BLOCKS = 4


def simulate(rng: Generator, effects: Sequence[float], blocks: int, sd_leg_pct: float,
             sd_row_pct: float = SD_ROW_PCT) -> SweepAnalysis:
    """One sweep: arm i's true log effect effects[i] (arm 0 the control)."""
    arms = [f"a{i}" for i in range(len(effects))]
    row_speed = rng.normal(0, ROW_SPEED_SD, ROWS)
    legs = []
    for leg in sweep_design(arms, blocks):
        i = arms.index(leg.arm)
        z = (math.log(BASE_TOK_S) + row_speed + effects[i] + rng.normal(0, sd_leg_pct / 100)
             + rng.normal(0, sd_row_pct / 100, ROWS))
        rates = tuple(float(r) for r in np.exp(z))
        legs.append(SweepLegInput(
            figures=LegFigures(name=leg.name, arm=leg.arm, headline=float(np.median(rates)),
                               row_rates=rates, aggregate_cycle_ms=None, acceptance_rate=None),
            block=leg.block, exact=True))
    return sweep_analysis(legs, arms, "a0", CONFIDENCE, 1.0)


def rate(hits: int, n: int) -> tuple[float, float]:
    p = hits / n
    return p, math.sqrt(max(p * (1 - p), 1 / n) / n)


def show(label: str, hits: int, n: int, target: str, ok: bool) -> bool:
    p, se = rate(hits, n)
    print(f"  {label:<44} {100 * p:6.2f} % +- {100 * se:4.2f}  target {target:<8} "
          f"{'ok' if ok else 'MISSED'}")
    return ok


def null_family(rng: Generator, trials: int,
                grid: Sequence[tuple[int, float]]) -> bool:
    print(f"1. all arms equal, {NULL_BLOCKS} blocks, row sd {SD_ROW_PCT} %, {ROWS} rows: "
          "family-wise false FASTER (any arm vs control), and a best-arm claim")
    good = True
    for k, sd in grid:
        faster = claims = 0
        for _ in range(trials):
            a = simulate(rng, [0.0] * k, NULL_BLOCKS, sd)
            faster += any(c.verdict is Verdict.FASTER for c in a.contrasts)
            claims += a.best is not None
        p, se = rate(faster, trials)
        good &= show(f"k={k} sd_leg={sd:.0f} %: false FASTER", faster, trials, "<= 2.5 %",
                     p - 2 * se <= 0.025)
        print(f"  {'':<6}best-arm claims (no arm is better): {100 * claims / trials:.2f} %")
    return good


def coverage(rng: Generator, trials: int,
             grid: Sequence[tuple[int, float]]) -> bool:
    print("2. coverage of the simultaneous intervals (true effects drawn per trial, "
          "+-5 %, 4 blocks)")
    good = True
    for k, sd in grid:
        covered = 0
        for _ in range(trials):
            effects = [0.0, *rng.uniform(-0.05, 0.05, k - 1)]
            a = simulate(rng, effects, NULL_BLOCKS, sd)
            covered += all(c.ci_low <= math.exp(effects[int(c.arm[1:])]) <= c.ci_high
                           for c in a.contrasts)
        p, se = rate(covered, trials)
        good &= show(f"k={k} sd_leg={sd:.0f} %: all intervals cover", covered, trials,
                     ">= 95 %", p + 2 * se >= 0.95)
    return good


def best_arm(rng: Generator, trials: int,
             grid: Sequence[tuple[int, float]]) -> bool:
    print("3. one arm +3 % over the rest: best picked at the planner's blocks (power 0.9), "
          "and 4. predicted power against simulation")
    good = True
    for k, sd in grid:
        sigma = sweep_leg_sd_pct(sd, SD_ROW_PCT, ROWS)
        blocks = sweep_blocks_for_power(3.0, sigma, k, CONFIDENCE)
        if blocks is None:
            print(f"  k={k} sd_leg={sd:.0f} %: over 50 blocks; skipped")
            continue
        right = wrong = 0
        for _ in range(trials):
            effects = [0.0] * k
            effects[k - 1] = math.log1p(0.03)
            a = simulate(rng, effects, blocks, sd)
            right += a.best == f"a{k - 1}"
            wrong += a.best is not None and a.best != f"a{k - 1}"
        p, se = rate(right, trials)
        good &= show(f"k={k} sd_leg={sd:.0f} %: {blocks} blocks, best picked", right,
                     trials, ">= 90 %", p + 2 * se >= 0.90)
        predicted = sweep_power(3.0, sigma, k, blocks, CONFIDENCE)
        ok = abs(predicted - p) <= 0.05 + 2 * se
        good &= ok
        print(f"  {'':<6}predicted power {100 * predicted:5.1f} %, simulated "
              f"{100 * p:5.1f} % +- {100 * se:.1f}: {'ok' if ok else 'MISSED'} (+-5 points); "
              f"wrong arm claimed {100 * wrong / trials:.2f} %")
    return good


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=("null", "coverage", "best"), default=None)
    ap.add_argument("--k", type=int, nargs="*", default=list(KS), help="arm counts")
    ap.add_argument("--sd-leg", type=float, nargs="*", default=list(SD_LEGS),
                    help="leg sds, in %%")
    args = ap.parse_args(argv)
    grid = [(k, sd) for k in args.k for sd in args.sd_leg]
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    results = []
    if args.only in (None, "null"):
        results.append(null_family(rng, args.trials, grid))
    if args.only in (None, "coverage"):
        results.append(coverage(rng, args.trials, grid))
    if args.only in (None, "best"):
        results.append(best_arm(rng, args.trials, grid))
    print(f"{'every target met' if all(results) else 'SOME TARGET MISSED'} "
          f"({args.trials} trials per cell, {time.perf_counter() - start:.0f} s)")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
