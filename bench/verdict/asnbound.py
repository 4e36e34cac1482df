"""The fewest legs ANY group-sequential design can expect at the alternative, with the
variance KNOWN: the bound that issue 32's "<= 60 % of the fixed design" target meets.

    .venv/bin/python -m bench.verdict.asnbound [--grid 601] [--max-looks 14]

A one-sided test of theta = 0 against theta = delta at one-sided alpha (0.025 as the
fixed design spends; 0.02 as rci-t/2's sequential boundaries spend) and power 90 %, with
K looks. The score S_k ~ N(theta I_k, I_k) at information I_k, in units where the fixed
design at alpha 0.025 needs information 1 (delta = z_.025 + z_.1).

The optimum (Eales & Jennison 1992; Jennison & Turnbull 2000, ch. 7.2): the test that
minimises E(N | delta) subject to P_0(reject) = alpha and P_delta(accept) = beta solves
the unconstrained problem E_delta(N) + l0 P_0(reject) + l1 P_delta(accept) for the right
multipliers. Written under the delta measure, P_0(reject) = E_delta[1(reject) / L_N],
L_k(s) = exp(delta s - delta^2 I_k / 2), so backward induction on a grid of S_k gives the
optimal continue / reject / accept regions; its boundaries are then evaluated exactly by
forward numerical integration (the recursive normal-density grid of J&T ch. 19, Simpson
weights), and l0, l1 are solved so that the errors are exact. Two classes:
- `two-sided stops`: a look may reject (FASTER) or accept (stop for futility);
- `upper only`: a look may only reject, the last look accepts: the class our stopping
  rule is in at +5 % (NO DIFFERENCE needs the interval inside +-1 %, which at +5 % almost
  never happens, and rci-t/2's boundaries are set without a futility boundary).
Tables:
1. K equally spaced looks, the maximum information free (optimised), as % of the fixed
   design: the textbook bound, for K = 1..max and the limit. The limit is the SPRT,
   whose E_delta(N) on Brownian motion is Wald's formula, exact with no overshoot (Wald &
   Wolfowitz 1948: no test with the same errors has a smaller E(N) at 0 or at delta).
2. Our grid: looks once per ABBA block (and once per pair of legs, AB then BA: half a
   block's information), at H200 draft-model noise (sd_leg 3.141 %, sd_row 5.501 %, 13
   rows) and +5 %: a block carries 1/5.43 of the fixed design's information, so the
   known-variance fixed design needs 5.43 blocks and the t-based one rounds up to 7
   (28 legs). E(N) in legs and as % of both.

The numerics are checked against Jennison & Turnbull's Tables 2.1-2.4 (two-sided alpha
0.05, power 0.9, K = 5): Pocock C = 2.413, R = 1.207; O'Brien-Fleming C = 2.040, R = 1.026.

A benchmark that prints figures, not a test. Known variance makes every figure a lower
bound for the t statistics our looks use (few df at the first blocks).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as sps

from bench.verdict.sequential import H200_DRAFT
from bench.verdict.sim import ROWS
from tokrecord.experiment.stats import Noise, leg_sd_pct

BETA = 0.1
ALPHA_FIXED = 0.025
DELTA = float(sps.norm.isf(ALPHA_FIXED) + sps.norm.isf(BETA))  # fixed information = 1
EFFECT_PCT = 5.0
FIXED_BLOCKS = 7  # the t-based fixed design at this noise (stats.blocks_for_power)
TAIL = 8.0  # grid edges, in sd of the score beyond both hypotheses' means
_ROOT_2PI = math.sqrt(2 * math.pi)


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.exp(-0.5 * x * x) / _ROOT_2PI)


@dataclass(frozen=True)
class Errors:
    reject: float  # P(reject H0) at theta
    accept: float
    expected_info: float  # E(I_N) at theta


def _simpson(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2] = 4
    w[2:-1:2] = 2
    return w / 3


def evaluate(info: Sequence[float], lower: Sequence[float], upper: Sequence[float],
             theta: float, grid: int) -> Errors:
    """Crossing probabilities and E(I_N) of a test on the score scale: at look k reject
    when S_k >= upper[k], accept when S_k <= lower[k] (-inf: never), continue between;
    the last look has lower == upper. Forward recursion of the sub-density of S_k on the
    paths still running (J&T ch. 19), Simpson on each continuation interval."""
    reject = accept = expected = 0.0
    prev_i = 0.0
    pts = dens = wts = np.empty(0)
    for k, i in enumerate(info):
        d = i - prev_i
        sd = math.sqrt(d)
        lo, hi = lower[k], upper[k]
        if pts.size == 0:
            up = float(sps.norm.sf((hi - theta * i) / sd))
            down = float(sps.norm.cdf((lo - theta * i) / sd)) if math.isfinite(lo) else 0.0
        else:
            mass = wts * dens
            means = pts + theta * d
            up = float(mass @ sps.norm.sf((hi - means) / sd))
            down = float(mass @ sps.norm.cdf((lo - means) / sd)) if math.isfinite(lo) else 0.0
        reject += up
        accept += down
        expected += i * (up + down)
        if k == len(info) - 1:
            break
        # An infinite boundary (a look that never stops on that side) is cut where the
        # density is below 1e-15 under both hypotheses.
        a = max(lo, min(0.0, theta) * i - TAIL * math.sqrt(i))
        top = min(hi, max(0.0, theta) * i + TAIL * math.sqrt(i))
        if top <= a:
            break
        new = np.linspace(a, top, grid)
        h = (top - a) / (grid - 1)
        if pts.size == 0:
            new_dens = sps.norm.pdf((new - theta * i) / sd) / sd
        else:
            kernel = _pdf((new[:, None] - pts[None, :] - theta * d) / sd) / sd
            new_dens = kernel @ (wts * dens)
        pts, dens, wts = new, new_dens, _simpson(grid) * h
        prev_i = i
    return Errors(reject, accept, expected)


class Optimal:
    """The Bayes test for E_delta(N) + l0 P_0(reject) + l1 P_delta(accept) at given looks,
    by backward induction; `test` returns its boundaries for multipliers (l0, l1)."""

    def __init__(self, info: Sequence[float], grid: int, futility: bool) -> None:
        self.info = tuple(float(i) for i in info)
        self.futility = futility
        self.grid = grid
        self.pts = [np.linspace(-TAIL * math.sqrt(i), DELTA * i + TAIL * math.sqrt(i), grid)
                    for i in self.info]
        # E_delta[f(S_{k+1}) | S_k = s] as a matrix on the grids (Simpson weights folded in).
        self.kernels = []
        for k in range(len(self.info) - 1):
            d = self.info[k + 1] - self.info[k]
            sd = math.sqrt(d)
            a, b = self.pts[k], self.pts[k + 1]
            h = b[1] - b[0]
            ker = _pdf((b[None, :] - a[:, None] - DELTA * d) / sd) / sd
            self.kernels.append(ker * (_simpson(grid) * h)[None, :])

    def test(self, l0: float, l1: float) -> tuple[list[float], list[float]]:
        n = len(self.info)
        lower = [0.0] * n
        upper = [0.0] * n
        value = np.empty(0)
        for k in range(n - 1, -1, -1):
            s, i = self.pts[k], self.info[k]
            reject_cost = l0 * np.exp(-(DELTA * s - DELTA**2 * i / 2))
            accept_cost = np.full_like(s, l1)
            # Where rejecting and accepting cost the same: the fixed-sample cut.
            cut = (math.log(l0 / l1) + DELTA**2 * i / 2) / DELTA
            if k == n - 1:
                value = np.minimum(reject_cost, accept_cost)
                lower[k] = upper[k] = cut
                continue
            go_on = (self.info[k + 1] - i) + self.kernels[k] @ value
            up_gap = go_on - reject_cost  # > 0 where rejecting now beats going on
            upper[k] = _first_crossing(s, up_gap, rising=True, default=cut)
            if self.futility:
                down_gap = go_on - accept_cost  # > 0 where accepting beats going on
                lower[k] = _last_crossing(s, down_gap, default=cut)
                stop = np.minimum(reject_cost, accept_cost)
            else:
                lower[k] = -math.inf
                stop = reject_cost
            if lower[k] >= upper[k]:
                lower[k] = upper[k] = cut if self.futility else upper[k]
            value = np.minimum(go_on, stop)
        return lower, upper


def _first_crossing(s: np.ndarray, gap: np.ndarray, rising: bool, default: float) -> float:
    """The smallest s above which gap > 0 (linear interpolation between grid points)."""
    del rising
    pos = gap > 0
    if not pos.any():
        return math.inf
    if pos.all():
        return float(s[0]) if default >= s[0] else default
    # The last sign change from <= 0 to > 0.
    idx = np.nonzero(~pos[:-1] & pos[1:])[0]
    if idx.size == 0:
        return float(s[0])
    j = int(idx[-1])
    return float(s[j] - gap[j] * (s[j + 1] - s[j]) / (gap[j + 1] - gap[j]))


def _last_crossing(s: np.ndarray, gap: np.ndarray, default: float) -> float:
    """The largest s below which gap > 0."""
    pos = gap > 0
    if not pos.any():
        return -math.inf
    if pos.all():
        return default
    idx = np.nonzero(pos[:-1] & ~pos[1:])[0]
    if idx.size == 0:
        return float(s[-1])
    j = int(idx[0])
    return float(s[j] - gap[j] * (s[j + 1] - s[j]) / (gap[j + 1] - gap[j]))


@dataclass(frozen=True)
class Best:
    expected: float  # E(I_N | delta), fixed design (alpha 0.025) = 1
    alpha: float
    power: float
    lower: tuple[float, ...]
    upper: tuple[float, ...]


def optimal(info: Sequence[float], alpha: float, grid: int, futility: bool) -> Best:
    """The test with the smallest E(N | delta) at these looks with P_0(reject) = alpha and
    power 1 - BETA (the multipliers found by nested root finding on their logs)."""
    opt = Optimal(info, grid, futility)

    def errors(log_l0: float, log_l1: float) -> tuple[Errors, Errors, list[float], list[float]]:
        lower, upper = opt.test(math.exp(log_l0), math.exp(log_l1))
        null = evaluate(info, lower, upper, 0.0, grid)
        alt = evaluate(info, lower, upper, DELTA, grid)
        return null, alt, lower, upper

    def log_l0_for(log_l1: float) -> float:
        def f(x: float) -> float:
            return math.log(max(errors(x, log_l1)[0].reject, 1e-300) / alpha)
        return float(optimize.brentq(f, log_l1 - 5, log_l1 + 15, xtol=1e-7))

    def beta_gap(log_l1: float) -> float:
        miss = 1 - errors(log_l0_for(log_l1), log_l1)[1].reject
        return math.log(max(miss, 1e-300)) - math.log(BETA)

    # Along the multipliers' frontier (alpha held) beta falls and E(N | delta) rises as l1
    # grows, so the smallest l1 that meets the power is the optimum; an upper-only test
    # often meets it with l1 negligible (its power comes from early rejections).
    lo_l1, hi_l1 = -10.0, 14.0
    if beta_gap(lo_l1) <= 0:
        log_l1 = lo_l1
    elif beta_gap(hi_l1) > 0:
        return Best(math.inf, alpha, 0.0, (), ())
    else:
        log_l1 = float(optimize.brentq(beta_gap, lo_l1, hi_l1, xtol=1e-6))
    log_l0 = log_l0_for(log_l1)
    null, alt, lower, upper = errors(log_l0, log_l1)
    return Best(alt.expected_info, null.reject, alt.reject, tuple(lower), tuple(upper))


def optimal_free_max(k: int, alpha: float, grid: int, futility: bool) -> tuple[float, Best]:
    """K equally spaced looks, the maximum information R (x fixed) chosen to minimise
    E(N | delta)."""
    if k == 1:
        r = (float(sps.norm.isf(alpha)) + float(sps.norm.isf(BETA)))**2 / DELTA**2
        return r, optimal([r], alpha, grid, futility)

    def cost(r: float) -> float:
        found = optimal([r * (j + 1) / k for j in range(k)], alpha, grid, futility).expected
        return found if math.isfinite(found) else 10 + r

    found = optimize.minimize_scalar(cost, bounds=(1.0, 2.5), method="bounded",
                                     options={"xatol": 3e-3})
    r = float(found.x)
    return r, optimal([r * (j + 1) / k for j in range(k)], alpha, grid, futility)


def sprt_limit(alpha: float) -> float:
    """E_delta(N) of the SPRT on Brownian motion (Wald's formula, exact: no overshoot),
    as a fraction of the fixed design's information at ALPHA_FIXED."""
    a = math.log((1 - BETA) / alpha)
    b = math.log(BETA / (1 - alpha))
    return ((1 - BETA) * a + BETA * b) / (DELTA**2 / 2)


def check_published(grid: int) -> list[str]:
    """Pocock's and O'Brien-Fleming's constants and max-information ratios, K = 5,
    two-sided alpha 0.05, power 0.9 (Jennison & Turnbull 2000, Tables 2.1-2.4)."""
    k = 5
    z2 = float(sps.norm.isf(0.025) + sps.norm.isf(0.1))
    out = []
    rows = (("Pocock", tuple(1.0 for _ in range(k)), 2.413, 1.207),
            ("O'Brien-Fleming", tuple(math.sqrt(k / j) for j in range(1, k + 1)), 2.040, 1.026))
    for name, shape, want_c, want_r in rows:
        def two_sided(c: float, theta: float, r: float,
                      shape: tuple[float, ...] = shape) -> float:
            info = [r * z2**2 / DELTA**2 * j / k for j in range(1, k + 1)]
            bound = [c * f * math.sqrt(i) for f, i in zip(shape, info, strict=True)]
            up = evaluate(info, [-math.inf] * k, bound, theta, grid).reject
            down = evaluate(info, [-math.inf] * k, bound, -theta, grid).reject
            return up + down

        c = float(optimize.brentq(lambda x, f=two_sided: f(x, 0.0, 1.0) - 0.05, 1.5, 4.0,
                                  xtol=1e-8))
        r = float(optimize.brentq(lambda x, f=two_sided, c=c: f(c, DELTA, x) - 0.9, 0.8, 1.6,
                                  xtol=1e-8))
        out.append(f"{name:>16}: C = {c:.4f} (J&T {want_c}), R = {r:.4f} (J&T {want_r})")
    return out


def mc_check(info: Sequence[float], best: Best, paths: int, seed: int = 1
             ) -> tuple[float, float, float]:
    """The optimal test's boundaries run on simulated score paths: P_0(reject),
    P_delta(reject) and E(I_N | delta), to set beside the numerical integration's."""
    rng = np.random.default_rng(seed)
    steps = np.diff(np.asarray([0.0, *info]))
    out = []
    for theta in (0.0, DELTA):
        score = np.cumsum(rng.standard_normal((paths, len(info))) * np.sqrt(steps)
                          + theta * steps, axis=1)
        done = np.zeros(paths, dtype=bool)
        reject = np.zeros(paths, dtype=bool)
        used = np.full(paths, info[-1])
        for k in range(len(info)):
            up = (score[:, k] >= best.upper[k]) & ~done
            down = (score[:, k] <= best.lower[k]) & ~done
            reject |= up
            used[up | down] = info[k]
            done |= up | down
        out.append((float(reject.mean()), float(used.mean())))
    return out[0][0], out[1][0], out[1][1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict.asnbound", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, default=201,
                        help="points per look (odd; 201 and 401 agree to 3e-6 in E(N))")
    parser.add_argument("--max-looks", type=int, default=14)
    args = parser.parse_args(argv)
    grid = args.grid | 1
    t0, load0 = time.monotonic(), os.getloadavg()
    print("Check against published values (two-sided alpha 0.05, power 0.9, K = 5):")
    for line in check_published(grid):
        print("  " + line)
    print(f"  SPRT limit at one-sided alpha 0.025, beta 0.1: {100 * sprt_limit(0.025):.2f} % "
          "of the fixed design (Wald's formula)")
    # The optimal test itself, on simulated paths (SE about 0.0002 on alpha, 0.0005 on the
    # power, 0.0004 on E(N)).
    info = [0.18413 * (j + 1) for j in range(7)]
    for fut in (True, False):
        best = optimal(info, 0.02, grid, fut)
        a, p, e = mc_check(info, best, 400_000)
        print(f"  optimal test, 7 looks of 0.184, alpha 0.02, {'both stops' if fut else 'upper only'}"
              f": integration alpha {best.alpha:.4f} power {best.power:.4f} E(N) "
              f"{best.expected:.4f}; 400000 simulated paths {a:.4f} {p:.4f} {e:.4f}")

    print("\n1. Minimum E(N | delta) with known variance, K equally spaced looks, maximum "
          "free; % of the fixed design at one-sided alpha 0.025, power 0.9")
    print(f"{'K':>4} | {'a=0.025 both stops':>18} {'R':>5} | {'a=0.025 upper only':>18} "
          f"{'R':>5} | {'a=0.02 both':>11} | {'a=0.02 upper only':>17}")
    for k in (*range(1, args.max_looks + 1),):
        free = [optimal_free_max(k, alpha, grid, fut)
                for alpha, fut in itertools.product((0.025, 0.02), (True, False))]
        print(f"{k:>4} | {100 * free[0][1].expected:>17.1f}% {free[0][0]:>5.3f} | "
              f"{100 * free[1][1].expected:>17.1f}% {free[1][0]:>5.3f} | "
              f"{100 * free[2][1].expected:>10.1f}% | {100 * free[3][1].expected:>16.1f}%",
              flush=True)
    print(f"   inf | {100 * sprt_limit(0.025):>17.1f}%   (SPRT) | "
          f"{'':>18} {'':>5} | {100 * sprt_limit(0.02):>10.1f}% |")

    noise = Noise(sd_leg_pct=H200_DRAFT[0], sd_row_pct=H200_DRAFT[1])
    sigma = leg_sd_pct(noise, ROWS) / 100
    block_info = (math.log1p(EFFECT_PCT / 100) / sigma / DELTA) ** 2  # x fixed
    fixed_blocks = 1 / block_info
    print(f"\n2. Our grid: +{EFFECT_PCT:g} %, H200 draft noise (one leg {100 * sigma:.2f} %): a "
          f"block carries {block_info:.4f} of the fixed information; the known-variance "
          f"fixed design needs {fixed_blocks:.2f} blocks ({4 * fixed_blocks:.1f} legs), the "
          f"t-based one {FIXED_BLOCKS} ({4 * FIXED_BLOCKS} legs). Looks at every unit from the "
          "first; E(legs | +5 %) of the optimal test, and % of 28 legs / of the continuous "
          "fixed design")
    print(f"{'unit':>5} {'max':>4} {'looks':>5} | {'a=0.025 both':>18} | "
          f"{'a=0.025 upper only':>18} | {'a=0.02 both':>18} | {'a=0.02 upper only':>18}")
    for unit, legs in (("block", 4), ("pair", 2)):
        per = block_info * legs / 4
        lowest = [(math.inf, 0)] * 4
        for most_legs in range(8, 4 * args.max_looks + 1, 4):
            looks = most_legs // legs
            info = [per * (j + 1) for j in range(looks)]
            cells: list[str] = []
            for n, (alpha, fut) in enumerate(itertools.product((0.025, 0.02), (True, False))):
                e_legs = optimal(info, alpha, grid, fut).expected / block_info * 4
                lowest[n] = min(lowest[n], (e_legs, most_legs))
                cells.append("90 % power out of reach" if not math.isfinite(e_legs) else
                             f"{e_legs:>6.2f} {100 * e_legs / (4 * FIXED_BLOCKS):>4.0f}%"
                             f" {100 * e_legs / (4 * fixed_blocks):>4.0f}%")
            print(f"{unit:>5} {most_legs:>4} {looks:>5} | " + " | ".join(cells), flush=True)
        print(f"{unit:>5} lowest   | " + " | ".join(
            f"{e:>6.2f} {100 * e / (4 * FIXED_BLOCKS):>4.0f}% (max {m})" for e, m in lowest))
    print(f"\n{time.monotonic() - t0:.0f} s, load average at the start {load0}, at the end "
          f"{os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
