"""Calibration of the verdict: false FASTER, false records, coverage and power.

    make verdict           # or: .venv/bin/python -m bench.verdict [--trials 1000] [--no-e2e]

1. A grid of synthetic experiments (sim.py) through the project's own `pair_result`,
   `leg_analysis` and `record_gate`: sd_leg 0/0.5/1/2/3 %, sd_row 0.5/2/5 %, 1/2/3
   blocks, each plain, with a linear drift across legs, and with a stalled row; an A/A
   experiment (no effect) and a +3 % one in every cell. Beside the simulated power
   stands the planner's prediction (`stats.power`) for the same cell.
2. The planner's recommendation for +3 % at sd_leg 1 %, sd_row 0.5 %, and the power
   simulated at that block count with more trials.
3. End to end: one A/A and one +3 % experiment on the fake server, each start with
   its own seeded speed factor (--leg-jitter-pct), run, recorded and verified.

A benchmark that prints figures, not a test. Monte-Carlo error is printed with the
rates: a false FASTER rate counts as within target when it is at most 2.5 % plus two
standard errors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.verdict.sequential import _part
from bench.verdict.sim import CONFIDENCE, EQUIVALENCE_PCT, ROWS, Cell, Tally, run_cell
from tokrecord.experiment.stats import Noise, blocks_for_power, power

SD_LEG = (0.0, 0.5, 1.0, 2.0, 3.0)
SD_ROW = (0.5, 2.0, 5.0)
BLOCKS = (1, 2, 3)
CONDITIONS = ((0.0, False), (0.5, False), (0.0, True))  # (drift %/leg, stalled row)
EFFECT = 3.0
TARGET = Cell(1.0, 0.5, EFFECT, 1)
ALPHA_HALF = 0.025
RECORD_MAX = 0.01

console = Console(width=140)


def grid() -> list[Cell]:
    return [Cell(sl, sr, eff, k, drift, outlier)
            for drift, outlier in CONDITIONS for sl in SD_LEG for sr in SD_ROW for k in BLOCKS
            for eff in (0.0, EFFECT)]


def _run(args: tuple[Cell, int, int]) -> tuple[Cell, Tally]:
    cell, trials, seed = args
    return cell, run_cell(cell, trials, seed)


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def predicted(cell: Cell) -> float:
    return power(cell.effect_pct, Noise(sd_leg_pct=cell.sd_leg_pct, sd_row_pct=cell.sd_row_pct),
                 ROWS, cell.blocks, CONFIDENCE, EQUIVALENCE_PCT)


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def simulate(trials: int, workers: int, part: tuple[int, int] = (1, 1)) -> dict[Cell, Tally]:
    """Every cell of the grid (or every N-th pair of cells from the K-th, `part` = (K, N):
    an A/A cell and its +3 % cell, adjacent in the grid, go together, since a table row
    shows both), each on its own seed: a cell's figures are the same whichever part runs
    it."""
    k, n = part
    jobs = [(c, trials, 1000 + i) for i, c in enumerate(grid()) if (i // 2) % n == k - 1]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(_run, jobs, chunksize=4))


def print_grid(results: dict[Cell, Tally], trials: int) -> dict[str, Any]:
    worst: dict[str, Any] = {"false_faster": (0.0, None), "false_record": (0.0, None),
                             "coverage": (1.0, None), "power_gap": (0.0, None)}
    over: list[str] = []
    for drift, outlier in CONDITIONS:
        name = Cell(0, 0, 0, 1, drift, outlier).condition
        table = Table(title=f"{name}: {trials} trials per cell, {ROWS} rows per leg; "
                      f"Monte-Carlo SE per cell {pct(se(ALPHA_HALF, trials))} points at 2.5 %, "
                      f"{pct(se(0.95, trials))} at 95 %, {pct(se(0.9, trials))} at 90 %",
                      title_justify="left", box=None, padding=(0, 1))
        for col in ("sd_leg", "sd_row", "blocks", "A/A: FASTER", "record", "NO DIFF", "UNDEC",
                    "cover", "+3 %: FASTER", "predicted", "cover"):
            table.add_column(col, justify="right")
        for sl in SD_LEG:
            for sr in SD_ROW:
                for k in BLOCKS:
                    aa = results.get(Cell(sl, sr, 0.0, k, drift, outlier))
                    fx = results.get(Cell(sl, sr, EFFECT, k, drift, outlier))
                    if aa is None or fx is None:  # in another --part
                        continue
                    pf, pr = aa.rate(aa.faster), aa.rate(aa.strict_record)
                    pw = fx.rate(fx.faster)
                    pred = predicted(Cell(sl, sr, EFFECT, k))
                    flag = pf > ALPHA_HALF + 2 * se(ALPHA_HALF, trials)
                    where = f"{name}, sd_leg {sl:g}, sd_row {sr:g}, {k} block(s)"
                    if flag:
                        over.append(f"{where}: false FASTER {pct(pf)} %")
                    if pf > worst["false_faster"][0]:
                        worst["false_faster"] = (pf, where)
                    if pr > worst["false_record"][0]:
                        worst["false_record"] = (pr, where)
                    for cov in (aa.rate(aa.covered), fx.rate(fx.covered)):
                        if cov < worst["coverage"][0]:
                            worst["coverage"] = (cov, where)
                    if not drift and not outlier and abs(pred - pw) > abs(worst["power_gap"][0]):
                        worst["power_gap"] = (pred - pw, where)
                    table.add_row(
                        f"{sl:g}", f"{sr:g}", str(k), ("[red]" if flag else "") + pct(pf),
                        pct(pr), pct(aa.rate(aa.no_difference)), pct(aa.rate(aa.undecided)),
                        pct(aa.rate(aa.covered)), pct(pw), pct(pred), pct(fx.rate(fx.covered)))
        console.print(table)
        console.print()
    worst["over_target"] = over
    return worst


def target_power(trials: int) -> dict[str, Any]:
    noise = Noise(sd_leg_pct=TARGET.sd_leg_pct, sd_row_pct=TARGET.sd_row_pct)
    k = blocks_for_power(EFFECT, noise, ROWS, CONFIDENCE, EQUIVALENCE_PCT)
    assert k is not None
    tally = run_cell(Cell(TARGET.sd_leg_pct, TARGET.sd_row_pct, EFFECT, k), trials, 7)
    sim = tally.rate(tally.faster)
    return {"recommended_blocks": k, "predicted": predicted(Cell(1.0, 0.5, EFFECT, k)),
            "simulated": sim, "se": se(sim, trials), "trials": trials}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="per grid cell (default 1000)")
    parser.add_argument("--target-trials", type=int, default=4000,
                        help="for the planner's recommended design (default 4000)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-e2e", action="store_true", help="skip the fake-server experiments")
    parser.add_argument("--e2e-only", action="store_true", help="only the fake-server experiments")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--part", type=_part, default=(1, 1),
                        help="K/N: only every N-th grid cell from the K-th (default 1/1), so "
                        "that a large --trials runs in parts of under 10 minutes")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    load0 = os.getloadavg()
    if args.e2e_only:
        from bench.verdict.e2e import run_both

        with tempfile.TemporaryDirectory(prefix="tokrecord-verdict-") as tmp:
            run_both(Path(tmp), console)
        return 0
    results = simulate(args.trials, args.workers, args.part)
    worst = print_grid(results, args.trials)
    # The planner's recommended design runs once, with the first part.
    target = target_power(args.target_trials) if args.part[0] == 1 else None
    summary = Table(title="targets", title_justify="left", box=None, padding=(0, 1))
    for col in ("target", "measured", "where"):
        summary.add_column(col)
    ff, rec, cov, gap = (worst[k] for k in ("false_faster", "false_record", "coverage",
                                              "power_gap"))
    mc = 2 * se(ALPHA_HALF, args.trials)
    summary.add_row("false FASTER <= 2.5 % (+2 SE = " + pct(ALPHA_HALF + mc) + " %)",
                    f"worst {pct(ff[0])} %; {len(worst['over_target'])} cell(s) over",
                    str(ff[1]))
    summary.add_row("false strict record <= 1 %", f"worst {pct(rec[0])} %", str(rec[1]))
    summary.add_row("coverage >= 95 % (MC 2 SE = " + pct(2 * se(0.95, args.trials)) + ")",
                    f"lowest {pct(cov[0])} %", str(cov[1]))
    if target is not None:
        summary.add_row("power >= 90 % at the planner's blocks (+3 %, sd_leg 1, sd_row 0.5)",
                        f"{target['recommended_blocks']} block(s): simulated "
                        f"{pct(target['simulated'])} ± {pct(target['se'])} %, predicted "
                        f"{pct(target['predicted'])} %", f"{target['trials']} trials")
    summary.add_row("predicted power within ±5 points (plain cells)",
                    f"largest gap {100 * gap[0]:+.1f} points", str(gap[1]))
    console.print(summary)
    for line in worst["over_target"]:
        console.print(f"  over: {line}")
    e2e: list[dict[str, Any]] = []
    if not args.no_e2e:
        from bench.verdict.e2e import run_both

        with tempfile.TemporaryDirectory(prefix="tokrecord-verdict-") as tmp:
            e2e = run_both(Path(tmp), console)
    console.print(f"[dim]{time.monotonic() - t0:.0f} s, load average at the start {load0}, "
                  f"at the end {os.getloadavg()}[/]")
    if args.json:
        args.json.write_text(json.dumps({
            "cells": [{**asdict(c), **asdict(t)} for c, t in results.items()],
            "target": target, "e2e": e2e}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
