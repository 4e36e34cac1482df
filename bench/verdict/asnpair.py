"""Looks after every PAIR of legs (AB, then BA) instead of every ABBA block: how few legs
can a sequential design with the honest t machinery expect at +5 % with H200 draft-model
noise, for 90 % power?

    .venv/bin/python -m bench.verdict.asnpair [--trials 20000] [--most 30]

Model paths (the verdict's own model, as `sequential.draw_paths` for blocks): per pair
one contrast B - A ~ N(effect, 2 sigma^2) (the block effect cancels within a pair),
and per completed block one more df of pure error (the two pairs' sums differ by noise
alone), so after J pairs the leg-level fit has J - 1 + floor(J / 2) df: 3k - 1 after k
blocks, as `stats.abba_df`. The statistic at each look is that fit's t. Boundaries are
simulated on 200 000 paths as `sequential.t_boundaries` does (each look's alpha increment
a quantile of the paths still running), for Lan-DeMets O'Brien-Fleming, Pocock and the
power family alpha t^rho, at rci-t/2's 0.8 alpha and at the full alpha; the interval is
the repeated one and a look stops on FASTER, SLOWER or NO DIFFERENCE (+-1 %) as
`sequential.run_paths` reads it. Printed: for each family, first look and alpha, the
smallest maximum (in pairs) whose P(FASTER) reaches 90 %, its expected legs and their
ratio to the fixed 7 blocks (28 legs); for the best, and for Pocock with a look per block
(the planner's default family), the power at which 60 % of the fixed design of that power
is met; and the known-variance optimum's spending (bench.verdict.asnbound) carried to t.

`--known-variance` runs the same with the true standard error (z statistics): the gap
to the t figures is what estimating the noise on few df costs.

The model has no drift: a look after the first pair of a block reads B - A in one time
order only, so a linear drift within a block biases it (by the drift between two legs,
shrinking as 1/J); whole blocks cancel it. A benchmark that prints figures, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from bench.verdict import asnbound
from bench.verdict.sequential import H200_DRAFT
from bench.verdict.sim import ROWS
from tokrecord.experiment.plan import Spending
from tokrecord.experiment.sequential import Design, Paths, run_paths, spent
from tokrecord.experiment.stats import Noise, blocks_for_power, leg_sd_pct

ALPHA_HALF = 0.025
EFFECT_PCT = 5.0
FIXED_LEGS = 28
BOUNDARY_SIMS = 200_000
Spend = Callable[[float, float], float]


def pair_paths(first: int, most: int, sims: int, seed: int, known: bool = False) -> Paths:
    """Standardised paths (a pair's contrast has sd 1) with looks after pairs first..most;
    `known`: the standard error is the true one (a z statistic: the known-variance case)."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((sims, most))
    extra = rng.standard_normal((sims, most // 2)) ** 2
    looks = list(range(first, most + 1))
    means = np.empty((sims, len(looks)))
    ses = np.empty_like(means)
    csum = np.cumsum(d, axis=1)
    csq = np.cumsum(d * d, axis=1)
    cextra = np.concatenate([np.zeros((sims, 1)), np.cumsum(extra, axis=1)], axis=1)
    for j, n in enumerate(looks):
        mean = csum[:, n - 1] / n
        df = n - 1 + n // 2
        ss = csq[:, n - 1] - n * mean * mean + cextra[:, n // 2]
        means[:, j] = mean
        ses[:, j] = 1 / math.sqrt(n) if known else np.sqrt(ss / max(df, 1) / n)
    design = Design(units=tuple(looks), max_units=most, extra_df=0)
    return Paths(design=design, means=means, ses=ses)


def t_bounds(paths: Paths, alpha: float, spend: Spend) -> list[float]:
    t = paths.means / paths.ses
    alive = np.ones(len(t), dtype=bool)
    used = 0.0
    out = []
    for j, u in enumerate(paths.design.units):
        target = spend(alpha, u / paths.design.max_units) - used
        used += target
        ranked = np.sort(t[alive, j])[::-1]
        want = round(target * len(t))
        c = float(ranked[min(want, len(ranked) - 1)]) if want >= 1 else math.inf
        alive &= ~(t[:, j] > c)
        out.append(c)
    return out


class Base:
    """Paths drawn once for looks after every pair up to `most`: a design with looks from
    pair `first` to pair `top` is a slice of them (a pair's statistics do not depend on
    the design), so every design shares the same draws."""

    def __init__(self, most: int, trials: int, known: bool) -> None:
        self.bounds = pair_paths(1, most, BOUNDARY_SIMS, 20131, known)
        self.trials = pair_paths(1, most, trials, 3, known)

    @staticmethod
    def cut(paths: Paths, looks: tuple[int, ...]) -> Paths:
        cols = [n - 1 for n in looks]
        return Paths(design=Design(units=looks, max_units=looks[-1], extra_df=0),
                     means=paths.means[:, cols], ses=paths.ses[:, cols])

    def asn(self, first: int, top: int, factor: float, spend: Spend, sigma_pair: float,
            effect: float, step: int = 1) -> tuple[float, float, float, float]:
        """P(FASTER) and E(legs) at the effect, each with its Monte-Carlo SE; looks after pairs
        first, first + step, ..., top (step 2 from an even pair: once per block)."""
        looks = tuple(range(first, top + 1, step))
        c = t_bounds(self.cut(self.bounds, looks), factor * ALPHA_HALF, spend)
        paths = self.cut(self.trials, looks)
        found, stop, _ = run_paths(paths, c, effect, sigma_pair, math.log1p(0.01),
                                   math.log1p(-0.01))
        p = float(np.mean(found == 0))
        legs = 2 * np.asarray(paths.design.units)[stop]
        return (p, math.sqrt(p * (1 - p) / len(found)), float(legs.mean()),
                float(legs.std() / math.sqrt(len(legs))))


def optimal_spending(looks: tuple[int, ...], pair_info: float, alpha: float) -> Spend | None:
    """The alpha the known-variance optimal upper-only test (asnbound) spends by each look
    after `looks` pairs, as a spending function of the information fraction (a step at
    each look; `t_bounds` reads it only there); None where even that test falls short of
    90 % power."""
    info = [pair_info * n for n in looks]
    best = asnbound.optimal(info, alpha, 201, futility=False)
    if not math.isfinite(best.expected):
        return None
    by_look = [asnbound.evaluate(info[:k + 1], [-math.inf] * (k + 1), best.upper[:k + 1],
                                 0.0, 201).reject for k in range(len(looks))]
    fractions = [n / looks[-1] for n in looks]

    def spend(alpha_: float, t: float) -> float:
        done = [a for f, a in zip(fractions, by_look, strict=True) if f <= t + 1e-12]
        return (done[-1] if done else 0.0) * alpha_ / alpha

    return spend


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict.asnpair", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20_000)
    parser.add_argument("--most", type=int, default=30, help="largest maximum, in pairs")
    parser.add_argument("--known-variance", action="store_true",
                        help="z statistics with the true standard error: what the t costs")
    args = parser.parse_args(argv)
    t0, load0 = time.monotonic(), os.getloadavg()
    noise = Noise(sd_leg_pct=H200_DRAFT[0], sd_row_pct=H200_DRAFT[1])
    sigma_pair = math.sqrt(2) * leg_sd_pct(noise, ROWS) / 100
    effect = math.log1p(EFFECT_PCT / 100)
    base = Base(args.most, args.trials, args.known_variance)

    def power_family(rho: float) -> Spend:
        return lambda alpha, t: alpha * t ** rho

    families: dict[str, Spend] = {
        "LD O'Brien-Fleming": lambda alpha, t: spent(Spending.OBRIEN_FLEMING, alpha, t),
        "LD Pocock": lambda alpha, t: spent(Spending.POCOCK, alpha, t),
        **{f"power rho={rho:g}": power_family(rho) for rho in (1.0, 0.75, 0.5)},
    }
    statistic = "known variance (z)" if args.known_variance else "t statistics"
    print(f"+{EFFECT_PCT:g} %, one leg {100 * sigma_pair / math.sqrt(2):.2f} %: looks after every "
          f"pair; {statistic}; {args.trials} model paths per design; the fixed design for "
          f"90 % power is {FIXED_LEGS} legs")
    print(f"{'spending':>20} {'alpha':>5} {'first':>5} {'max':>4} {'P(FASTER)':>13} "
          f"{'E legs':>7} {'/ fixed':>7}")
    best: tuple[float, str, int, float, Spend, int] | None = None
    for name, spend in families.items():
        for factor in (0.8, 1.0):
            for first in (2, 3, 4, 6, 8):
                for most in range(max(8, first + 1), args.most + 1, 2):
                    p, se, legs, _ = base.asn(first, most, factor, spend, sigma_pair, effect)
                    if p >= 0.9:
                        print(f"{name:>20} {factor:>5g} {first:>5} {most:>4} "
                              f"{100 * p:>6.1f}+-{100 * se:.1f}% {legs:>7.1f} "
                              f"{legs / FIXED_LEGS:>7.2f}", flush=True)
                        if factor == 0.8 and (best is None or legs < best[0]):
                            best = (legs, name, first, factor, spend, most)
                        break
    if best is not None:
        legs, name, first, factor, spend, _ = best
        print(f"\nBest at rci-t/2's alpha: {name}, first look after pair {first}: "
              f"{legs:.1f} legs ({100 * legs / FIXED_LEGS:.0f} % of {FIXED_LEGS}).")
        print("At which power is 60 % met? Each maximum's P(FASTER) and E(legs), against the "
              "fixed design (whole blocks, stats.power) of at least that power:")
        pocock: Spend = families["LD Pocock"]
        for label, first_, spend_, step in ((f"pairs, {name}, first pair {first}", first,
                                             spend, 1),
                                            ("blocks, LD Pocock (the planner's default), "
                                             "first block 2", 4, pocock, 2)):
            print(f"  {label}:")
            for most in range(8, args.most + 1, 2):
                p, se, e_legs, legs_se = base.asn(first_, most, factor, spend_, sigma_pair,
                                                  effect, step)
                fixed = blocks_for_power(EFFECT_PCT, noise, ROWS, 0.95, 1.0, p, most=80)
                ratio = f"{100 * e_legs / (4 * fixed):.0f} %" if fixed else "n/a"
                print(f"    max {most:>3} pairs: P(FASTER) {100 * p:5.1f} +- {100 * se:.1f} %, "
                      f"E legs {e_legs:5.1f} +- {legs_se:.1f}; fixed {4 * (fixed or 0)} legs: {ratio}",
                      flush=True)
    print("\nThe known-variance optimum's spending carried to t (bench.verdict.asnbound's "
          "upper-only optimal test for these looks at rci-t/2's alpha: its alpha by each look "
          "spent by simulated t boundaries), first reaching 90 % power:")
    pair_info = (effect / sigma_pair / asnbound.DELTA) ** 2  # x the fixed design's
    for label, first_, step in (("pairs, first pair 3", 3, 1), ("pairs, first pair 4", 4, 1),
                                ("blocks, first block 2", 4, 2), ("blocks, first block 1", 2, 2)):
        for most in range(max(8, first_ + 2), args.most + 1, 2):
            found = optimal_spending(tuple(range(first_, most + 1, step)), pair_info,
                                     0.8 * ALPHA_HALF)
            if found is None:
                continue
            spend_ = found
            p, se, e_legs, legs_se = base.asn(first_, most, 0.8, spend_, sigma_pair, effect,
                                              step)
            if p >= 0.9 or most + 2 > args.most:
                print(f"  {label}, max {most} pairs: P(FASTER) {100 * p:.1f} +- {100 * se:.1f} %,"
                      f" E legs {e_legs:.1f} +- {legs_se:.1f} ({100 * e_legs / FIXED_LEGS:.0f} % "
                      f"of {FIXED_LEGS})" + ("" if p >= 0.9 else ": 90 % not reached"),
                      flush=True)
                break
    print(f"{time.monotonic() - t0:.0f} s, load average at the start {load0}, at the end "
          f"{os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
