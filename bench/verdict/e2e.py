"""One A/A and one +3 % experiment on the fake server, with a seeded speed per start.

Every leg's server draws tok_s x exp(N(0, 1 %)) from its seed and the leg's name
(`--leg-jitter-pct`, set per arm by environment), as fresh real servers do. The
experiments go through the whole workflow (preregistration with power, teacher,
legs, record, seal) and are verified.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tokrecord.experiment.plan import parse_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.verify import verify_dir

TOK_S = 2000.0
JITTER_PCT = 1.0
BLOCKS = 2
FAKE = [sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--ttft-ms", "20"]
QUIET_IDLE = {"interval_s": 0.05, "consecutive": 2, "timeout_s": 60, "host_cpu_max_pct": None,
              "device_util_max_pct": None, "device_mem_used_max_mib": None,
              "device_processes_max": None}


def _arm(tok_s: float, seed: int) -> dict[str, Any]:
    return {"env": {"TOKRECORD_FAKE_TOK_S": f"{tok_s:g}",
                    "TOKRECORD_FAKE_LEG_JITTER_PCT": f"{JITTER_PCT:g}",
                    "TOKRECORD_FAKE_LEG_JITTER_SEED": str(seed)}}


def experiment(root: Path, name: str, design: str, effect_pct: float, seed: int) -> dict[str, Any]:
    arms = ({"control": _arm(TOK_S, seed)} if design == "aa" else
            {"control": _arm(TOK_S, seed), "candidate": _arm(TOK_S * (1 + effect_pct / 100), seed)})
    plan = parse_plan({
        "name": name, "design": design, "blocks": BLOCKS, "teacher": "capture",
        "idle_gap_s": 0, "idle": QUIET_IDLE, "telemetry": {"interval_s": 0.5},
        "min_effect_pct": 3.0, "noise": {"sd_leg_pct": JITTER_PCT, "sd_row_pct": 0.5},
        "server": {"argv": FAKE, "model": "fake", "ready_timeout_s": 30},
        "arms": arms, "prior": {"value_tok_s": TOK_S},
    }, name)
    exp = root / name
    t0 = time.monotonic()
    results = run_experiment(plan, exp)
    record = finish(exp, build_record(plan, exp, results))
    problems = verify_dir(exp)
    data = __import__("json").loads(record.read_text())
    va = data["verdict_analysis"]
    factors = {}
    for leg in results:
        log = (exp / leg / "attempt-1" / "server.log").read_text(errors="replace")
        mark = "speed factor "
        if mark in log:
            factors[leg] = float(log.split(mark, 1)[1].split()[0])
    return {"name": name, "design": design, "true_effect_pct": effect_pct,
            "seconds": round(time.monotonic() - t0, 1), "verdict": data["verdict"],
            "ratio": va["ratio"], "ci": [va["ci_low"], va["ci_high"]], "df": va["df"],
            "leg_noise_sd_pct": va["leg_noise_sd_pct"], "row_noise_sd_pct": va["row_noise_sd_pct"],
            "record_verdict": va["record_verdict"], "status": data["status"],
            "reasons": data["record_gate"]["reasons"],
            "power_at_min_effect": (data["power"] or {}).get("min_effect_power"),
            "speed_factors": factors, "headlines": {n: r["headline_tok_s"]
                                                    for n, r in data["runs"].items()},
            "verified": not problems, "problems": [str(p) for p in problems[:3]]}


def run_both(root: Path, console: Console) -> list[dict[str, Any]]:
    out = []
    for name, design, effect in (("verdict-aa", "aa", 0.0), ("verdict-plus3", "abba", 3.0)):
        console.print(f"[bold]{name}[/]: {design}, {BLOCKS} blocks, fake server {TOK_S:g} tok/s"
                      f"{f' vs +{effect:g} %' if effect else ''}, leg jitter {JITTER_PCT:g} %…")
        r = experiment(root, name, design, effect, seed=11)
        out.append(r)
        ci = r["ci"]
        console.print(
            f"  verdict {r['verdict']}: ratio {r['ratio']:.4f}, 95 % CI "
            f"[{ci[0]:.4f}, {ci[1]:.4f}] on {r['df']} df; leg noise {r['leg_noise_sd_pct']:.2f} %, "
            f"row noise {r['row_noise_sd_pct']:.2f} %; record: {r['status']} "
            f"(98 % verdict {r['record_verdict']}); planned power at +3 %: "
            f"{100 * (r['power_at_min_effect'] or 0):.0f} %; verified: {r['verified']}; "
            f"{r['seconds']} s", soft_wrap=True)
        console.print("  speed factors: " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                      r["speed_factors"].items()), soft_wrap=True)
        console.print("  headlines: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                  r["headlines"].items()), soft_wrap=True)
    return out
