"""Why the sequential rule's false FASTER and coverage miss: separate the causes.

    .venv/bin/python -m bench.verdict.seqcause [--trials 4000] [--workers 2]

Each trial builds 4 x max_blocks legs from one source and computes the interim look
(`interim.look_input`: the project's own leg-level fit) after every block from 2 on,
with no stopping, so each look's t statistic is kept. From them, offline:

- per look, P(t > t quantile 0.975 on the look's df): whether the statistic is t on
  that df at all (the fixed design's question, look by look);
- P(t crosses the plan's upper boundary at some look): what the stopping rule spends
  (2.5 % is the target), for each sequential method's boundaries;
- P(|t| crosses at some look): one minus the repeated intervals' simultaneous coverage.

Sources, all with no effect:
- `normal`: synthetic normal legs (sim.py's model, no drift, no stall) at a noise;
- `h200 with`: the real H200 A/A legs drawn with replacement (bench.verdict.sequential);
- `h200 without`: the same drawn without replacement (only up to 24 legs: 6 blocks);
- `h200 jitter`: with replacement, each drawn leg shifted by N(0, 0.5 %), so that no two
  legs are the same (a drawn duplicate is a tie no real server gives);
- `h200 shape`: normal legs whose figures have the real pool's leg sd (its row noise
  kept): the real data's shape taken out, its noise level kept.

A benchmark that prints figures with their Monte-Carlo standard errors, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats as sps

from bench.verdict.sequential import DEFAULT_AA, H200_DRAFT, load_aa, seq_plan
from bench.verdict.sim import BASE_TOK_S, ROW_SPEED_SD, ROWS
from tokrecord.experiment.interim import abba_looks, equivalence, look_blocks, look_input
from tokrecord.experiment.plan import SequentialMethod, Spending, abba_design
from tokrecord.experiment.sequential import boundaries
from tokrecord.experiment.stats import AnalysisLeg, LegFigures

JITTER_PCT = 0.5


def _legs(rates: np.ndarray, max_blocks: int) -> list[AnalysisLeg]:
    design = abba_design(max_blocks)
    return [AnalysisLeg(figures=LegFigures(name=leg.name, arm="x", headline=float(np.median(r)),
                                           row_rates=tuple(float(x) for x in r),
                                           aggregate_cycle_ms=None, acceptance_rate=None),
                        block=leg.block, treated=leg.treated)
            for leg, r in zip(design, rates, strict=True)]


def statistics(args: tuple[str, int, int, int, str]) -> np.ndarray:
    """t at each look (2..max_blocks) of `trials` experiments from `source`."""
    source, max_blocks, trials, seed, tar = args
    plan = seq_plan(max_blocks, Spending.OBRIEN_FLEMING)
    spec = plan.sequential
    assert spec is not None
    rng = np.random.default_rng(seed)
    n = 4 * max_blocks
    pool = load_aa(Path(tar)) if source.startswith("h200") else None
    if pool is not None and source == "h200 shape":
        z = np.log(pool)
        fig = z - z.mean(axis=0)
        leg_sd = float(np.std(fig.mean(axis=1), ddof=1))
        row_resid = fig - fig.mean(axis=1, keepdims=True)
    out = np.full((trials, len(look_blocks(spec))), np.nan)
    for i in range(trials):
        if pool is None:
            row_speed = np.exp(rng.normal(0.0, ROW_SPEED_SD, ROWS))
            rates = BASE_TOK_S * row_speed * np.exp(
                rng.normal(0.0, H200_DRAFT[0] / 100, n)[:, None]
                + rng.normal(0.0, H200_DRAFT[1] / 100, (n, ROWS)))
        elif source == "h200 without":
            rates = pool[rng.choice(len(pool), size=n, replace=False)]
        elif source == "h200 shape":
            # Leg effects normal at the pool's leg sd; rows: a real leg's residuals.
            rows = row_resid[rng.choice(len(pool), size=n)]
            rates = np.exp(np.log(pool).mean(axis=0) + rng.normal(0.0, leg_sd, n)[:, None]
                           + rows)
        else:
            rates = pool[rng.choice(len(pool), size=n, replace=True)]
            if source == "h200 jitter":
                rates = rates * np.exp(rng.normal(0.0, JITTER_PCT / 100, n))[:, None]
        legs = _legs(rates, max_blocks)
        for j, b in enumerate(look_blocks(spec)):
            found = look_input(legs, b, spec, plan.verdict.confidence, equivalence(plan))
            if found.estimate is not None and found.se:
                out[i, j] = found.estimate / found.se
    return out


def _se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict.seqcause", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--max-blocks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--aa", type=Path, default=DEFAULT_AA)
    parser.add_argument("--sources", default="normal,h200 with,h200 without,h200 jitter,"
                        "h200 shape")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    t0, load0 = time.monotonic(), os.getloadavg()
    tar = str(args.aa / "aa-draft.tar.gz")
    jobs = [(s, k, args.trials, 700 + 10 * k + i, tar)
            for i, s in enumerate(args.sources.split(",")) for k in args.max_blocks
            if not (s == "h200 without" and 4 * k > 24)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        found = list(pool.map(statistics, jobs))
    for (source, k, n, _seed, _tar), t in zip(jobs, found, strict=True):
        plan = seq_plan(k, Spending.OBRIEN_FLEMING)
        spec = plan.sequential
        assert spec is not None
        blocks = look_blocks(spec)
        dfs = [3 * b - 1 for b in blocks]
        marg = [float(np.mean(t[:, j] > sps.t.ppf(0.975, df))) for j, df in enumerate(dfs)]
        print(f"{source}, max_blocks {k}, {n} trials (legs from draft unless normal: "
              f"sd_leg {H200_DRAFT[0]} %, sd_row {H200_DRAFT[1]} %)")
        print("  per look P(t > t.975(df)) %: " + ", ".join(
            f"b{b} {100 * m:.2f}±{100 * _se(m, n):.2f}" for b, m in zip(blocks, marg,
                                                                       strict=True)))
        for spending in Spending:
            for method in SequentialMethod:
                c = np.array(boundaries(abba_looks(spec), 0.95, spending, method))
                up = float(np.mean((t > c).any(axis=1)))
                two = float(np.mean((np.abs(t) > c).any(axis=1)))
                print(f"  {spending.value:>14} {method.value:>8}: upper crossing {100 * up:.2f}"
                      f" ± {100 * _se(up, n):.2f} %, two-sided {100 * two:.2f} ± "
                      f"{100 * _se(two, n):.2f} %  (boundaries "
                      + " ".join(f"{x:.3f}" for x in c) + ")")
    print(f"{time.monotonic() - t0:.0f} s, load average at the start {load0}, at the end "
          f"{os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
