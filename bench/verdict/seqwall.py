"""The planner's expected wall time against what the fake server measures.

    .venv/bin/python -m bench.verdict.seqwall [--runs 3] [--start-delay-s 1.0]

1. A fixed experiment on the fake server (`--earlier-blocks`, leg jitter, and a start
   delay: the server sleeps before it listens, as a real engine loads) gives the
   earlier record.
2. `experiment.cost.cost_report` predicts, from that record's leg cost and noise (as
   `plan cost --from` does; `--noise given` takes the declared jitter instead), the
   expected legs and wall time of a sequential plan at its true effect.
3. The sequential plan is run `--runs` times (fresh jitter seeds), each wall time from
   the first leg's start to the last leg's end, teacher excluded, as the state log
   stamps them.

Printed: predicted expected legs and wall, the measured mean, and per run the wall
predicted for the legs it actually ran (which isolates the leg-cost model from the
stopping rule's randomness), with each run's median leg and gap beside the earlier
record's (where a cost the planner leaves out would show). A benchmark that prints
figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokrecord.evidence import read_jsonl
from tokrecord.experiment.cost import LegCost, cost_report, load_leg_cost, with_state_log
from tokrecord.experiment.plan import parse_plan
from tokrecord.experiment.power import load_noise
from tokrecord.experiment.runner import run_experiment
from tokrecord.experiment.stats import Noise
from tokrecord.record.build import build_record, finish

TOK_S = 1000.0
JITTER_PCT = 3.0
EFFECT_PCT = 10.0
ROWS = 3
QUIET_IDLE = {"interval_s": 0.05, "consecutive": 2, "timeout_s": 60, "host_cpu_max_pct": None,
              "device_util_max_pct": None, "device_mem_used_max_mib": None,
              "device_processes_max": None}


def _argv(delay_s: float) -> list[str]:
    # sh's $0..$2 carry the placeholders, so nothing is substituted inside the script.
    script = (f"sleep {delay_s:g}; exec {sys.executable} -m tokrecord.server.fake "
              '--host "$0" --port "$1" --model "$2" --ttft-ms 20')
    return ["/bin/sh", "-c", script, "{host}", "{port}", "{model}"]


def _plan(name: str, delay_s: float, seed: int, sequential: dict[str, Any] | None,
          suite: Path, blocks: int = 1) -> Any:
    def arm(tok_s: float) -> dict[str, Any]:
        return {"env": {"TOKRECORD_FAKE_TOK_S": f"{tok_s:g}",
                        "TOKRECORD_FAKE_LEG_JITTER_PCT": f"{JITTER_PCT:g}",
                        "TOKRECORD_FAKE_LEG_JITTER_SEED": str(seed)}}
    data: dict[str, Any] = {
        "name": name, "design": "abba", "teacher": "capture", "engine": "vllm",
        "idle_gap_s": 1.0, "idle": QUIET_IDLE, "suite": str(suite), "suite_rows": ROWS,
        "min_effect_pct": EFFECT_PCT, "noise": {"sd_leg_pct": JITTER_PCT, "sd_row_pct": 1.0},
        "server": {"argv": _argv(delay_s), "model": "fake", "ready_timeout_s": 60},
        "arms": {"control": arm(TOK_S), "candidate": arm(TOK_S * (1 + EFFECT_PCT / 100))}}
    if sequential:
        data["sequential"] = sequential
    elif blocks > 1:
        data["blocks"] = blocks
    return parse_plan(data, name)


def _suite(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"row-{i}", "prompt": f"Explain topic {i} in "
                                        "detail, with examples.", "max_tokens": 150}) + "\n"
                            for i in range(ROWS)))
    return path


def _wall(exp: Path) -> tuple[float, int]:
    """First leg start to last leg end (teacher excluded), and the legs run."""
    events = [e for e in read_jsonl(exp / "experiment.jsonl", skip_torn=True)
              if e.get("leg") not in (None, "teacher")]
    starts = [e["unix"] for e in events if e["event"] == "leg_start"]
    ends = [e["unix"] for e in events if e["event"] == "leg_end"]
    return max(ends) - min(starts), len(starts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict.seqwall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--start-delay-s", type=float, default=1.0)
    parser.add_argument("--max-blocks", type=int, default=4)
    parser.add_argument("--earlier-blocks", type=int, default=2,
                        help="blocks of the earlier record (default 2: noise on 5 df)")
    parser.add_argument("--noise", choices=("record", "given"), default="record",
                        help="the planner's noise: measured in the earlier record (default) "
                        "or the declared jitter")
    args = parser.parse_args(argv)
    load0 = os.getloadavg()
    seq = {"max_blocks": args.max_blocks, "min_blocks": 2, "spending": "pocock"}
    with tempfile.TemporaryDirectory(prefix="tokrecord-seqwall-") as tmp:
        root = Path(tmp)
        suite = _suite(root / "suite.jsonl")
        first = _plan("earlier", args.start_delay_s, 1, None, suite, args.earlier_blocks)
        exp = root / "earlier"
        finish(exp, build_record(first, exp, run_experiment(first, exp)))
        cost = load_leg_cost([exp])
        plan = _plan("sequential", args.start_delay_s, 2, seq, suite)
        noise = (load_noise([exp]) if args.noise == "record" else
                 Noise(sd_leg_pct=JITTER_PCT, sd_row_pct=1.0, sources=("given",)))
        print(f"noise ({args.noise}): leg {noise.sd_leg_pct:.2f} %, row {noise.sd_row_pct:.2f} %")
        report = cost_report(plan, noise, ROWS, cost, ROWS)
        predicted = next(o for o in report.outcomes
                         if o.design == "sequential" and o.effect_pct == EFFECT_PCT)
        # Wall from first start to last end: every leg but the gap before the first.
        print(f"leg cost from the earlier record: start {cost.start_s:.2f} s + gap "
              f"{cost.gap_s:.2f} s + {ROWS} rows x {cost.row_s:.3f} s = {cost.leg_s(ROWS):.2f} s "
              f"(median leg {cost.start_s + ROWS * cost.row_s:.2f} s + gap {cost.gap_s:.2f} s)")
        print(f"predicted at +{EFFECT_PCT:g} %: {predicted.expected_legs:.1f} legs, "
              f"{predicted.expected_wall_s:.1f} s (P(FASTER) {predicted.p_faster:.3f})")
        walls, legs, ratios = [], [], []
        for run in range(args.runs):
            plan = _plan(f"sequential-{run}", args.start_delay_s, 100 + run, seq, suite)
            exp = root / f"seq-{run}"
            run_experiment(plan, exp)
            wall, n = _wall(exp)
            own = n * cost.leg_s(ROWS) - cost.gap_s
            walls.append(wall)
            legs.append(n)
            ratios.append(own / wall)
            # No record for these runs: the state log's leg and gap times alone.
            mine = with_state_log(LegCost(start_s=0, gap_s=0, row_s=0, sources=("run",)),
                                  exp / "experiment.jsonl")
            print(f"run {run}: {n} legs, measured {wall:.1f} s, predicted for {n} legs "
                  f"{own:.1f} s ({100 * (own / wall - 1):+.1f} %); its median leg "
                  f"{mine.start_s:.2f} s + gap {mine.gap_s:.2f} s")
        mean_wall = statistics.mean(walls)
        expected = (predicted.expected_wall_s or 0.0) - cost.gap_s  # no gap before leg 1
        print(f"measured mean over {args.runs} runs: {statistics.mean(legs):.1f} legs, "
              f"{mean_wall:.1f} s; planner's expected wall {expected:.1f} s "
              f"({100 * (expected / mean_wall - 1):+.1f} %); "
              f"leg-cost model per run {100 * (statistics.mean(ratios) - 1):+.1f} % on average")
        print(f"load average at the start {load0}, at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
