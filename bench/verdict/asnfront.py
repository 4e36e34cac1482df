"""How few legs a sequential design can expect at +5 % with H200 draft-model noise, for
90 % power, across spending functions, first looks and alpha factors.

    .venv/bin/python -m bench.verdict.asnfront [--trials 20000]

Model paths only (`sequential.draw_paths` / `run_paths`, the planner's simulation): for
each spending function (Lan-DeMets O'Brien-Fleming-like and Pocock-like as the plan
names them, and the power family alpha t^rho, which spends earlier as rho falls), each
first look (`min_blocks` 1 or 2) and each method's share of alpha (rci-t/1: 1, rci-t/2:
0.8), the smallest max_blocks whose P(FASTER) reaches 90 %, its expected legs, and
their ratio to the 7 fixed blocks (28 legs) that 90 % power needs. The t boundaries are
simulated here as `sequential.t_boundaries` does (every look's alpha increment taken
as a quantile of the paths still running), for spending functions the plan cannot name.

A benchmark that prints figures, not a test; the full analysis of the planner's default
design is in bench.verdict.sequential's `asn` section.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from bench.verdict.sequential import H200_DRAFT
from bench.verdict.sim import ROWS
from tokrecord.experiment.plan import Spending
from tokrecord.experiment.sequential import Design, draw_paths, run_paths, spent
from tokrecord.experiment.stats import Noise, blocks_for_power, leg_sd_pct

ALPHA_HALF = 0.025
EFFECT_PCT = 5.0
BOUNDARY_SIMS = 200_000


def t_bounds(design: Design, alpha: float, spend: Callable[[float, float], float]
             ) -> list[float]:
    """Upper t boundaries spending spend(alpha, t) by each look, on model paths."""
    paths = draw_paths(design, BOUNDARY_SIMS, 20131)
    t = paths.means / paths.ses
    alive = np.ones(len(t), dtype=bool)
    used = 0.0
    out = []
    for j, u in enumerate(design.units):
        target = spend(alpha, u / design.max_units) - used
        used += target
        ranked = np.sort(t[alive, j])[::-1]
        want = round(target * BOUNDARY_SIMS)
        c = float(ranked[min(want, len(ranked) - 1)]) if want >= 1 else math.inf
        alive &= ~(t[:, j] > c)
        out.append(c)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict.asnfront", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20_000)
    args = parser.parse_args(argv)
    t0, load0 = time.monotonic(), os.getloadavg()
    noise = Noise(sd_leg_pct=H200_DRAFT[0], sd_row_pct=H200_DRAFT[1])
    sigma = leg_sd_pct(noise, ROWS) / 100
    fixed = blocks_for_power(EFFECT_PCT, noise, ROWS, 0.95, 1.0, 0.9) or 0
    def power_family(rho: float) -> Callable[[float, float], float]:
        return lambda alpha, t: alpha * t ** rho

    families: dict[str, Callable[[float, float], float]] = {
        "LD O'Brien-Fleming": lambda alpha, t: spent(Spending.OBRIEN_FLEMING, alpha, t),
        "LD Pocock": lambda alpha, t: spent(Spending.POCOCK, alpha, t),
        **{f"power rho={rho:g}": power_family(rho) for rho in (1.5, 1.0, 0.75, 0.5, 0.3)},
    }
    print(f"+{EFFECT_PCT:g} %, sd_leg {H200_DRAFT[0]} %, sd_row {H200_DRAFT[1]} %, {ROWS} rows: "
          f"fixed design for 90 % power {fixed} blocks ({4 * fixed} legs); {args.trials} model "
          "paths per design; SE of P about 0.2 points")
    print(f"{'spending':>20} {'alpha':>5} {'first':>5} {'max':>4} {'P(FASTER)':>9} "
          f"{'E legs':>7} {'/ fixed':>7}")
    for name, spend in families.items():
        for factor in (1.0, 0.8):
            for first in (1, 2):
                for most in range(max(fixed, first + 1), 16):
                    design = Design(units=tuple(range(first, most + 1)), max_units=most,
                                    extra_df=2)
                    c = t_bounds(design, factor * ALPHA_HALF, spend)
                    paths = draw_paths(design, args.trials, 3)
                    found, stop, _ = run_paths(paths, c, math.log1p(EFFECT_PCT / 100), sigma,
                                               math.log1p(0.01), math.log1p(-0.01))
                    p = float(np.mean(found == 0))
                    if p >= 0.9:
                        legs = 4 * float(np.mean(np.asarray(design.units)[stop]))
                        print(f"{name:>20} {factor:>5g} {first:>5} {most:>4} {100 * p:>8.1f}% "
                              f"{legs:>7.1f} {legs / (4 * fixed):>7.2f}")
                        break
    print(f"{time.monotonic() - t0:.0f} s, load average at the start {load0}, at the end "
          f"{os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
