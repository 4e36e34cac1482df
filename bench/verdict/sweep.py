"""Calibration of the sweep design (issue 34): family-wise false FASTER with every arm
equal, coverage of the simultaneous intervals, the best arm picked at the planner's
blocks, and the planner's power against simulation; the same for a sequential sweep
(`experiment.sweep_sequential`).

    .venv/bin/python -m bench.verdict.sweep [--trials 4000] [--seed 1] [--workers 2]
        [--only null coverage best seq-null seq-coverage seq-best] [--part K/N]

Every trial goes through the project's own analysis (`experiment.sweep.sweep_analysis`,
or `sweep_sequential.sequential_sweep` for the sequential sections): legs of ROWS rows
are simulated as in sim.py (a row's own speed, a fresh server's speed per leg, row
noise), one leg per arm per block in the design's Williams order. Each cell has its own
seed (from --seed and the cell), so a cell's figure does not depend on --part or
--workers.

Targets (issue 34):
1. family-wise false FASTER, all arms equal, k = 3, 5, 8 and leg sd 1-3 %: <= 2.5 %;
2. coverage of the simultaneous intervals: >= 95 %;
3. the best arm picked when it is +3 % over the rest, at the planner's blocks: >= 90 %;
4. the planner's predicted power (`sweep_power`) within +-5 points of the simulation.
Every rate is printed with its Monte-Carlo standard error (se) and the verdict on it:
"met" when the rate is on the right side of the bar by more than 2 se, "MISSED" when on
the wrong side by more than 2 se, and "within MC" otherwise (not resolved at this trial
count). The normal-theory value of target 1 is exactly 2.5 % in every cell
(`family_false_faster`, printed beside it), so a cell can only be resolved against its
bar up to the real statistic's departure from that model.
The sequential sections use min_blocks 2, max_blocks SEQ_MAX (O'Brien-Fleming by
default) for targets 1 (an interval above 1 at any look) and 2 (at the look that
stopped), and max_blocks = the fixed design's planner blocks for the best arm, whose
rate is reported with the blocks used on average but not judged against target 3 (a
fixed design's bar: the stopping rule spends some power to save blocks).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from numpy.random import Generator

from bench.verdict.sim import BASE_TOK_S, ROW_SPEED_SD, ROWS
from tokrecord.experiment.plan import SequentialSpec, Spending
from tokrecord.experiment.stats import LegFigures, Verdict
from tokrecord.experiment.sweep import (
    SweepAnalysis,
    SweepLegInput,
    SweepSequential,
    family_false_faster,
    sweep_analysis,
    sweep_blocks_for_power,
    sweep_design,
    sweep_df,
    sweep_leg_sd_pct,
    sweep_power,
)
from tokrecord.experiment.sweep_sequential import sequential_sweep

CONFIDENCE = 0.95
SD_ROW_PCT = 3.42  # H200 plain decoding's row sd (fixtures/h200-aa)
KS = (3, 5, 8)
SD_LEGS = (1.0, 2.0, 3.0)
NULL_BLOCKS = 4
SEQ_MAX = 6
SECTIONS = ("null", "coverage", "best", "seq-null", "seq-coverage", "seq-best")


def simulate_legs(rng: Generator, effects: Sequence[float], blocks: int, sd_leg_pct: float,
                  sd_row_pct: float = SD_ROW_PCT) -> list[SweepLegInput]:
    """One sweep's legs: arm i's true log effect effects[i] (arm 0 the control)."""
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
    return legs


def simulate(rng: Generator, effects: Sequence[float], blocks: int, sd_leg_pct: float,
             sd_row_pct: float = SD_ROW_PCT) -> SweepAnalysis:
    arms = [f"a{i}" for i in range(len(effects))]
    return sweep_analysis(simulate_legs(rng, effects, blocks, sd_leg_pct, sd_row_pct), arms,
                          "a0", CONFIDENCE, 1.0)


def _sequential(rng: Generator, effects: Sequence[float], spec: SequentialSpec,
                sd_leg_pct: float) -> tuple[SweepSequential, SweepAnalysis]:
    """A sequential sweep's run: its looks and the analysis at the last."""
    arms = [f"a{i}" for i in range(len(effects))]
    legs = simulate_legs(rng, effects, spec.max_blocks, sd_leg_pct)
    return sequential_sweep(legs, arms, "a0", spec, CONFIDENCE, 0.98, 1.0)


def _covers(a: SweepAnalysis, effects: Sequence[float]) -> bool:
    return bool(a.contrasts) and all(
        c.ci_low <= math.exp(effects[int(c.arm[1:])]) <= c.ci_high for c in a.contrasts)


def run_cell(section: str, k: int, sd: float, trials: int, seed: int,
             spending: str) -> dict[str, Any]:
    rng = np.random.default_rng([seed, zlib.crc32(section.encode()), k, int(sd * 100)])
    out: dict[str, Any] = {"section": section, "k": k, "sd": sd, "trials": trials}
    start = time.perf_counter()
    spec = SequentialSpec(min_blocks=2, max_blocks=SEQ_MAX, spending=Spending(spending))
    if section in ("null", "seq-null"):
        faster = claims = 0
        blocks_used = 0
        for _ in range(trials):
            if section == "null":
                a = simulate(rng, [0.0] * k, NULL_BLOCKS, sd)
                faster += any(c.verdict is Verdict.FASTER for c in a.contrasts)
                claims += a.best is not None
            else:
                seq, a = _sequential(rng, [0.0] * k, spec, sd)
                # an interval above 1 at any look, stopping or not (each look records it)
                faster += any(look.faster for look in seq.looks)
                claims += a.best is not None
                blocks_used += seq.looks[-1].block if seq.looks else 0
        out |= {"hits": faster, "claims": claims, "blocks_used": blocks_used,
                "model": family_false_faster(k, sweep_df(k, NULL_BLOCKS), CONFIDENCE)}
    elif section in ("coverage", "seq-coverage"):
        covered = 0
        for _ in range(trials):
            effects = [0.0, *rng.uniform(-0.05, 0.05, k - 1)]
            if section == "coverage":
                a = simulate(rng, effects, NULL_BLOCKS, sd)
            else:
                _, a = _sequential(rng, effects, spec, sd)
            covered += _covers(a, effects)
        out |= {"hits": covered}
    else:
        sigma = sweep_leg_sd_pct(sd, SD_ROW_PCT, ROWS)
        blocks = sweep_blocks_for_power(3.0, sigma, k, CONFIDENCE)
        out["blocks"] = blocks
        if blocks is None:
            return out
        right = wrong = blocks_used = 0
        seq_spec = SequentialSpec(min_blocks=2, max_blocks=max(blocks, 2),
                                  spending=Spending(spending))
        for _ in range(trials):
            effects = [0.0] * k
            effects[k - 1] = math.log1p(0.03)
            if section == "best":
                a = simulate(rng, effects, blocks, sd)
            else:
                seq, a = _sequential(rng, effects, seq_spec, sd)
                blocks_used += seq.looks[-1].block if seq.looks else 0
            right += a.best == f"a{k - 1}"
            wrong += a.best is not None and a.best != f"a{k - 1}"
        out |= {"hits": right, "wrong": wrong, "blocks_used": blocks_used,
                "predicted": sweep_power(3.0, sigma, k, blocks, CONFIDENCE)}
    out["seconds"] = time.perf_counter() - start
    return out


def rate(hits: int, n: int) -> tuple[float, float]:
    p = hits / n
    return p, math.sqrt(max(p * (1 - p), 1 / n) / n)


def judge(p: float, se: float, bar: float, below: bool) -> str:
    """met / MISSED when the rate is more than 2 se on one side of the bar."""
    margin = (bar - p) if below else (p - bar)
    return "met" if margin > 2 * se else "MISSED" if margin < -2 * se else "within MC"


def report(r: dict[str, Any]) -> str:
    section, k, sd, n = r["section"], r["k"], r["sd"], r["trials"]
    head = f"  {section:<12} k={k} sd_leg={sd:.0f} %"
    if "hits" not in r:
        return f"{head}: over 50 blocks; skipped"
    p, se = rate(r["hits"], n)
    if section in ("null", "seq-null"):
        extra = (f"; best claimed {100 * r['claims'] / n:.2f} %"
                 + (f"; mean blocks {r['blocks_used'] / n:.2f} of {SEQ_MAX}"
                    if section == "seq-null" else f"; model {100 * r['model']:.3f} %"))
        return (f"{head}: false FASTER {100 * p:5.2f} % se {100 * se:4.2f} "
                f"[<= 2.5 %: {judge(p, se, 0.025, True)}]{extra}")
    if section in ("coverage", "seq-coverage"):
        return (f"{head}: coverage {100 * p:5.2f} % se {100 * se:4.2f} "
                f"[>= 95 %: {judge(p, se, 0.95, False)}]")
    # Target 3 is the fixed design's at the planner's blocks; a sequential sweep with those
    # as its most blocks trades some of that power for fewer blocks: reported, not judged.
    bar = f"[>= 90 %: {judge(p, se, 0.90, False)}]" if section == "best" else \
        "[fixed design's bar; not judged]"
    line = (f"{head}: {r['blocks']} blocks, best picked {100 * p:5.2f} % se {100 * se:4.2f} "
            f"{bar}; wrong arm {100 * r['wrong'] / n:.2f} %")
    if section == "best":
        gap = r["predicted"] - p
        ok = "met" if abs(gap) + 2 * se < 0.05 else "MISSED" if abs(gap) - 2 * se > 0.05 \
            else "within MC"
        line += f"; predicted {100 * r['predicted']:5.1f} % ({100 * gap:+.1f} points: {ok})"
    else:
        line += f"; mean blocks {r['blocks_used'] / n:.2f} of {r['blocks']}"
    return line


def _part(value: str) -> tuple[int, int]:
    k, _, n = value.partition("/")
    part = (int(k), int(n or 1))
    if not 1 <= part[0] <= part[1]:
        raise argparse.ArgumentTypeError(f"--part K/N with 1 <= K <= N, not {value!r}")
    return part


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--best-trials", type=int, default=None,
                    help="trials for the best-arm sections (default: --trials)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="*", choices=SECTIONS, default=None)
    ap.add_argument("--k", type=int, nargs="*", default=list(KS), help="arm counts")
    ap.add_argument("--sd-leg", type=float, nargs="*", default=list(SD_LEGS),
                    help="leg sds, in %%")
    ap.add_argument("--spending", choices=[s.value for s in Spending],
                    default=Spending.OBRIEN_FLEMING.value)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--part", type=_part, default=(1, 1))
    args = ap.parse_args(argv)
    sections = args.only or list(SECTIONS)
    cells = [(s, k, sd) for s in sections for k in args.k for sd in args.sd_leg]
    k_part, n_part = args.part
    cells = [c for i, c in enumerate(cells) if i % n_part == k_part - 1]
    start = time.perf_counter()
    print(f"row sd {SD_ROW_PCT} %, {ROWS} rows; fixed: {NULL_BLOCKS} blocks (targets 1-2); "
          f"sequential: looks 2..{SEQ_MAX}, {args.spending}; trials {args.trials} per cell"
          f" (best: {args.best_trials or args.trials})", flush=True)
    missed = False
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_cell, s, k, sd,
                               (args.best_trials or args.trials) if s.endswith("best")
                               else args.trials, args.seed, args.spending)
                   for s, k, sd in cells]
        for f in futures:
            line = report(f.result())
            missed |= "MISSED" in line
            print(line, flush=True)
    print(f"{'SOME TARGET MISSED' if missed else 'no cell missed by more than 2 se'} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
