"""Issue 33: where fresh-server noise comes from on a GPU, by A/A experiments.

`scripts/gpu-noise` builds llama-server with CUDA and the 1B model + draft as
`scripts/gpu-experiment` does; this module holds the Python steps:

* ``run``: one A/A experiment (design ``aa``, every leg the same server) per
  condition and arm, in a fixed order, until a deadline; an interrupted A/A is
  resumed by the next call (``tokrecord run`` resumes the same plan). Each finished
  A/A is summarised at once into OUT, so a kill at the command's limit loses nothing.
* ``summarize``: one experiment directory as a small JSON line (the leg figures in run
  order, each leg's covariates, the leg sd with its chi-square interval).
* ``table``: the summaries as a markdown table (for the README).

The conditions change only the host side: CPU affinity and priority, address-space
randomisation, CUDA graphs, server threads, the model's page cache, host load. The
GPU's own settings (clocks, power limit) are never touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The plan writer the first H200 script uses; it sits beside this one when staged.
from gpu_experiment import _toml

SERVED_MODEL = "m"
ROWS_MAX_TOKENS = 128  # the headline window is tokens 1..100: 128 keeps its meaning
BLOCKS = 3  # 12 legs: a block-adjusted df of 8, a plain df of 11
NPROC = os.cpu_count() or 16


@dataclass(frozen=True)
class Condition:
    name: str
    description: str
    server_prefix: tuple[str, ...] = ()
    client_prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    host_cpu_max_pct: float = 25.0
    burners: int = 0
    # Server flags the baseline passes that this condition leaves out.
    drop_args: tuple[str, ...] = ()


def _cores(lo: int, hi: int) -> str:
    return f"{lo}-{min(hi, NPROC - 1)}"


def conditions() -> dict[str, Condition]:
    half = max(2, NPROC // 2)
    drop = ("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches; exec \"$0\" \"$@\"")
    cs = [
        Condition("base", "as the fixture: no hygiene"),
        Condition("aslr", "server under setarch -R (no address-space randomisation)",
                  server_prefix=("setarch", platform.machine(), "-R")),
        Condition("pin", f"server on cores {_cores(2, half + 1)} at nice -10, client on "
                         f"{_cores(half + 2, NPROC - 1)} at nice -5 (taskset, nice)",
                  server_prefix=("taskset", "-c", _cores(2, half + 1), "nice", "-n", "-10"),
                  client_prefix=("taskset", "-c", _cores(half + 2, NPROC - 1), "nice", "-n", "-5")),
        Condition("nographs", "CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1)",
                  env={"GGML_CUDA_DISABLE_GRAPHS": "1"}),
        Condition("threads4", "server threads -t 4 (default: all cores)", extra_args=("-t", "4")),
        Condition("rt", "server SCHED_FIFO priority 10 (chrt -f 10)",
                  server_prefix=("chrt", "-f", "10")),
        Condition("load", f"host load: {max(1, NPROC - 4)} busy processes beside the legs "
                          "(idle gate's host CPU threshold lifted to 100 %)",
                  host_cpu_max_pct=100.0, burners=max(1, NPROC - 4)),
        Condition("cold", "cold page cache: drop_caches before every server start",
                  server_prefix=drop),
        # The first row's TTFT predicted the leg in every A/A of the first session: does the
        # server's own start-up warmup (one empty decode before it listens, no prompt of the
        # suite, generation counters stay 0) settle whatever that first request pays for?
        Condition("warmup", "the server's own start-up warmup on (--no-warmup left out)",
                  drop_args=("--no-warmup",)),
    ]
    return {c.name: c for c in cs}


# The order the A/As run in. The plain baseline first: its teacher (captured once) serves
# every later A/A. Then every condition on the draft arm, whose leg sd (3.1 % in the
# fixture) leaves the most room to show a cut; the plain arm's conditions last, as far as
# the device budget reaches.
ORDER: tuple[str, ...] = (
    "base:plain", "base:draft", "aslr:draft", "pin:draft", "nographs:draft", "threads4:draft",
    "load:draft", "cold:draft", "rt:draft", "aslr:plain", "pin:plain", "nographs:plain",
    "threads4:plain", "load:plain", "cold:plain", "rt:plain", "warmup:draft", "warmup:plain",
)


def write_suite(out: Path, max_tokens: int = ROWS_MAX_TOKENS) -> Path:
    """The built-in suite, every row capped at max_tokens (all 13 rows kept)."""
    from tokrecord.suite import load_suite

    suite = load_suite(None)
    out.write_text("".join(json.dumps({"id": r.id, "prompt": r.prompt,
                                       "max_tokens": min(r.max_tokens, max_tokens)}) + "\n"
                           for r in suite.rows), encoding="utf-8")
    return out


def _server_argv(launch: Sequence[str], server: str) -> list[str]:
    """The baseline server command, after `launch` (a prefix such as taskset, or the
    interleaved mode's wrapper)."""
    return [*launch, server, "-m", "{model}", "-a", SERVED_MODEL, "--host", "{host}",
            "--port", "{port}", "-np", "1", "--no-cache-prompt", "--no-warmup", "--metrics",
            "--seed", "0", "-c", "2048", "-ngl", "99"]


def _arm_args(arm: str, models: Path, draft_n_max: int) -> list[str]:
    """What the draft arm adds to the server command (nothing for plain decoding)."""
    if arm != "draft":
        return []
    return ["--spec-type", "draft-simple", "-md", str((models / "draft-f16.gguf").resolve()),
            "--spec-draft-n-max", str(draft_n_max), "-ngld", "99"]


def _server_section(argv: Sequence[str], models: Path) -> str:
    return f"""[server]
argv = {_toml(list(argv))}
model = {_toml(str((models / "target-f16.gguf").resolve()))}
served_model = {_toml(SERVED_MODEL)}
ready_timeout_s = 120.0
"""


def _idle_telemetry_sections(cond: Condition) -> str:
    return f"""[idle]
interval_s = 0.5
consecutive = 2
timeout_s = 60.0
host_cpu_max_pct = {cond.host_cpu_max_pct!r}
device_util_max_pct = 5.0
device_mem_used_max_mib = 1024
device_processes_max = 0

[telemetry]
interval_s = 0.25
"""


def plan_text(*, cond: Condition, arm: str, server: str, models: Path, suite: Path,
              teacher: str, blocks: int = BLOCKS, idle_gap_s: float = 1.5,
              draft_n_max: int = 8, notes: str = "") -> str:
    argv = [a for a in _server_argv(cond.server_prefix, server) if a not in cond.drop_args]
    extra = [*cond.extra_args, *_arm_args(arm, models, draft_n_max)]
    env = f"env = {_toml(dict(cond.env))}\n" if cond.env else ""
    return f"""# Written by scripts/gpu_noise.py (issue 33): an A/A of one condition and arm.
name = {_toml(f"h200-noise-{cond.name}-{arm}")}
design = "aa"
blocks = {blocks}
teacher = {_toml(teacher)}
engine = "llama.cpp"
endpoint = "native"
headline = "chunk-aware"
idle_gap_s = {idle_gap_s!r}
suite = {_toml(str(suite.resolve()))}
notes = {_toml(f"condition {cond.name}: {cond.description}; arm {arm}. {notes}")}

{_server_section(argv, models)}
[arms.control]
description = {_toml(f"{arm} decoding, {cond.description}")}
extra_args = {_toml(extra)}
{env}
{_idle_telemetry_sections(cond)}"""


def _rated_legs(exp: Path) -> Iterator[tuple[str, Path, dict[str, Any], float]]:
    """Each complete leg with a rate, in run order: (leg, run dir, summary, tok/s). Run order
    is the log's; a leg's run dir is taken relative to the experiment, so a summary reads
    the same here and on the machine that ran it."""
    for line in _jsonl(exp / "experiment.jsonl"):
        if line.get("event") != "leg_end" or line.get("leg") == "teacher" \
                or line.get("status") != "complete":
            continue
        run_dir = exp.joinpath(*Path(str(line.get("run_dir", ""))).parts[-2:])
        s_path = run_dir / "summary.json"
        if not s_path.exists():
            continue
        summary = json.loads(s_path.read_text())
        fig = (summary.get("summary") or {}).get("tok_s_out")
        if fig:
            yield str(line["leg"]), run_dir, summary, float(fig)


# ---- interleaved: the baseline and one condition alternating leg by leg -------------

# An arm cannot carry its own argv prefix (taskset, setarch), so the server starts through
# this wrapper in both arms: it runs the server under GPUX_WRAP when the arm sets it, and
# plainly (exec, so the pid is the server's) when it does not.
WRAP_SH = '#!/bin/sh\nif [ -n "$GPUX_WRAP" ]; then exec $GPUX_WRAP "$@"; fi\nexec "$@"\n'


def interleave_plan_text(*, cond: Condition, arm: str, server: str, models: Path, suite: Path,
                         teacher: str, wrapper: Path, blocks: int, idle_gap_s: float = 1.5,
                         draft_n_max: int = 8, notes: str = "") -> str:
    """An ABBA whose control is the baseline and whose candidate is `cond`, on one arm: the
    two alternate leg by leg in the same blocks, so drift and passing episodes fall on both
    and their leg sds can be compared without the time-order confound of separate A/As.
    Only the server side of a condition applies (the client is one process for both)."""
    if cond.client_prefix and not cond.server_prefix:
        raise SystemExit(f"condition {cond.name}: client-only, cannot alternate per leg")
    if cond.burners or cond.drop_args:
        raise SystemExit(f"condition {cond.name}: host load and dropped flags cannot alternate "
                         "per leg in this script")
    argv = _server_argv([str(wrapper)], server)
    base_extra = _arm_args(arm, models, draft_n_max)
    cand_env = dict(cond.env)
    if cond.server_prefix:
        cand_env["GPUX_WRAP"] = " ".join(cond.server_prefix)
    return f"""# Written by scripts/gpu_noise.py interleave (issue 33): baseline vs one condition.
name = {_toml(f"h200-noise-interleaved-{cond.name}-{arm}")}
design = "abba"
blocks = {blocks}
teacher = {_toml(teacher)}
engine = "llama.cpp"
endpoint = "native"
headline = "chunk-aware"
idle_gap_s = {idle_gap_s!r}
suite = {_toml(str(suite.resolve()))}
notes = {_toml(f"interleaved: {arm} decoding, baseline (control) vs {cond.name} (candidate): "
               f"{cond.description}. {notes}")}

{_server_section(argv, models)}
[arms.control]
description = {_toml(f"{arm} decoding, no hygiene")}
extra_args = {_toml(base_extra)}

[arms.candidate]
description = {_toml(f"{arm} decoding, {cond.description}")}
extra_args = {_toml([*base_extra, *cond.extra_args])}
env = {_toml(cand_env)}

{_idle_telemetry_sections(cond)}"""


def interleaved_summary(exp: Path, *, condition: str, arm: str) -> dict[str, Any]:
    """Each arm's leg figures in run order and two sds per arm, with their intervals and
    the baseline / condition ratio (F interval):
    * the sd of the arm's log leg figures (df n - 1): drift is in it, but it falls on both
      arms alike since they alternate;
    * the within-block sd (each block has two legs of each arm: df one per block), free of
      drift between blocks."""
    by_arm: dict[str, list[tuple[str, float]]] = {"control": [], "candidate": []}
    for leg, _, _, fig in _rated_legs(exp):
        by_arm["control" if leg.startswith("A") else "candidate"].append((leg, fig))
    out: dict[str, Any] = {"condition": condition, "arm": arm, "experiment": exp.name,
                           "design": "interleaved", "arms": {}}
    for name, legs in by_arm.items():
        logs = [math.log(x) for _, x in legs]
        blocks: dict[str, list[float]] = {}
        for (leg, _), lg in zip(legs, logs, strict=True):
            # ABBA names each arm's legs 1, 2 in block 1, 3, 4 in block 2, ...
            blocks.setdefault(str((int(leg[1:]) + 1) // 2), []).append(lg)
        pairs = [v for v in blocks.values() if len(v) == 2]
        arm_out: dict[str, Any] = {"legs": [{"leg": leg, "tok_s": x} for leg, x in legs],
                                   "n_legs": len(legs)}
        if len(logs) >= 3:
            sd = 100 * statistics.stdev(logs)
            arm_out.update(mean_tok_s=math.exp(statistics.fmean(logs)), sd_pct=sd,
                           df=len(logs) - 1, sd_ci=list(sd_interval(sd, len(logs) - 1)))
        if len(pairs) >= 2:
            # (x1 - x2)^2 / 2 estimates the variance on one df per block.
            wsd = 100 * math.sqrt(statistics.fmean([(a - b) ** 2 / 2 for a, b in pairs]))
            arm_out.update(sd_within_pct=wsd, df_within=len(pairs),
                           sd_within_ci=list(sd_interval(wsd, len(pairs))))
        out["arms"][name] = arm_out
    c, t = out["arms"]["control"], out["arms"]["candidate"]
    if c.get("sd_pct") and t.get("sd_pct"):
        out["ratio"] = list(sd_ratio_interval(c["sd_pct"], c["df"], t["sd_pct"], t["df"]))
    if c.get("sd_within_pct") and t.get("sd_within_pct"):
        out["ratio_within"] = list(sd_ratio_interval(c["sd_within_pct"], c["df_within"],
                                                     t["sd_within_pct"], t["df_within"]))
    return out


def interleaved_table(d: Mapping[str, Any]) -> str:
    def cell(a: Mapping[str, Any], key: str, df: str, ci: str) -> str:
        if a.get(key) is None:
            return "-"
        lo, hi = a[ci]
        return f"{a[key]:.2f} ({a[df]}) [{lo:.2f}, {hi:.2f}]"

    rows = ["| arm | legs | mean tok/s | sd of leg figures % (df) [95 % CI] | "
            "within-block sd % (df) [95 % CI] |", "|---|---|---|---|---|"]
    for name, label in (("control", "baseline"), ("candidate", d["condition"])):
        a = d["arms"][name]
        rows.append(f"| {label} | {a['n_legs']} | {a.get('mean_tok_s', float('nan')):.0f} | "
                    f"{cell(a, 'sd_pct', 'df', 'sd_ci')} | "
                    f"{cell(a, 'sd_within_pct', 'df_within', 'sd_within_ci')} |")
    for key, label in (("ratio", "sd of leg figures"), ("ratio_within", "within-block sd")):
        if d.get(key):
            r, lo, hi = d[key]
            rows.append(f"\nbaseline / {d['condition']}, {label}: {r:.2f} [{lo:.2f}, {hi:.2f}]")
    return "\n".join(rows) + "\n"


def run_interleaved(*, work: Path, out: Path, server: str, models: Path, key: str,
                    notes: str, blocks: int, deadline: float | None = None,
                    host_cpu_max: float | None = None) -> int:
    cname, arm = key.split(":")
    cond = conditions()[cname]
    if host_cpu_max is not None:  # a rehearsal on a shared machine
        cond = dataclasses.replace(cond, host_cpu_max_pct=max(host_cpu_max, cond.host_cpu_max_pct))
    noise = work / "noise"
    noise.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    suite = noise / "suite-128.jsonl"
    if not suite.exists():
        write_suite(suite)
    wrapper = noise / "wrap.sh"
    wrapper.write_text(WRAP_SH)
    wrapper.chmod(0o755)
    teacher_file = noise / "teacher.json"
    teacher = str(teacher_file) if teacher_file.exists() else "capture"
    exp = noise / f"il-{cname}-{arm}"
    plan = noise / f"plan-il-{cname}-{arm}.toml"
    if not plan.exists():  # kept: the same command resumes an interrupted run
        plan.write_text(interleave_plan_text(cond=cond, arm=arm, server=server, models=models,
                                             suite=suite, teacher=teacher, wrapper=wrapper,
                                             blocks=blocks, notes=notes))
    print(f"== interleaved {key}: baseline vs {cond.description} ({time.strftime('%H:%M:%S')})",
          flush=True)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "tokrecord", "run", str(plan), "--out", str(exp)])
    try:
        rc = proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        # Out of device time: tokrecord stops its server on SIGTERM; the legs done so far
        # are summarised below (and the same command resumes the plan on this machine).
        print(f"== interleaved {key}: the deadline came, stopping the run", flush=True)
        proc.terminate()
        rc = proc.wait(timeout=60)
    print(f"== interleaved {key}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
    if not (exp / "experiment.jsonl").exists():
        return 1
    s = interleaved_summary(exp, condition=cname, arm=arm)
    s["wall_s"] = time.time() - t0
    (out / "noise-interleaved.jsonl").write_text(json.dumps(s, sort_keys=True) + "\n")
    (out / "noise-interleaved.md").write_text(interleaved_table(s))
    print(interleaved_table(s), flush=True)
    return 0


# ---- one experiment as a summary -----------------------------------------------------

def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def sd_interval(sd: float, df: int, confidence: float = 0.95) -> tuple[float, float]:
    """The chi-square interval of a standard deviation estimated on df degrees of freedom."""
    from scipy.stats import chi2

    a = (1 - confidence) / 2
    return (sd * math.sqrt(df / float(chi2.ppf(1 - a, df))),
            sd * math.sqrt(df / float(chi2.ppf(a, df))))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def leg_covariates(run_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """What was going on around one leg, from the files it kept (no tokrecord import, so
    that it runs on any checkout's evidence)."""
    samples = _jsonl(run_dir / "telemetry.jsonl")
    rows = json.loads((run_dir / "rows.json").read_text()) if (run_dir / "rows.json").exists() else []
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    dev = [d for s in samples for d in s.get("devices", [])]

    def vals(seq: Iterable[Mapping[str, Any]], key: str) -> list[float]:
        return [float(v[key]) for v in seq if v.get(key) is not None]

    clocks = vals(dev, "sm_clock_mhz")
    busy = [p for s in _jsonl(run_dir / "idle-before.jsonl")
            for p in s.get("host", {}).get("busy_processes", [])]
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    ttft = (first.get("metrics") or {}).get("ttft_ms")
    tel = summary.get("telemetry") or {}
    return {
        "gpu_util_pct": (tel.get("devices") or [{}])[0].get("util_pct_mean"),
        "gpu_power_w": tel.get("power_w_mean"),
        "gpu_temp_c_max": (tel.get("devices") or [{}])[0].get("temp_c_max"),
        "sm_clock_mhz_mean": _mean(clocks), "sm_clock_mhz_min": min(clocks) if clocks else None,
        "host_cpu_pct": tel.get("host_cpu_util_pct_mean"),
        "host_load1": _mean(vals([s.get("host", {}) for s in samples], "load1")),
        "host_cpu_freq_mhz": _mean(vals([s.get("host", {}) for s in samples], "cpu_freq_mhz")),
        "busy_processes_before": len(busy),
        "ready_s": summary.get("ready_seconds"),
        "first_ttft_ms": ttft,
    }


def _covariates(run_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """tokrecord's own covariates (over the suite window) where this checkout has them;
    else this module's older whole-leg figures (the first H200 runs' noise-aa.jsonl)."""
    try:
        from tokrecord.probes.covariates import covariates_from_run_dir
    except ImportError:
        return leg_covariates(run_dir, summary)
    cov = covariates_from_run_dir(run_dir)
    return cov.model_dump(mode="json", by_alias=True) if cov is not None else {}


def _session(d: Mapping[str, Any]) -> str:
    return str(d.get("session", "1"))


def _exp_dir(exps: Path, d: Mapping[str, Any]) -> Path:
    """An A/A's evidence: under exps/SESSION/ when the sessions' tars were untarred apart."""
    per_session = exps / _session(d) / d["experiment"]
    return per_session if per_session.is_dir() else exps / d["experiment"]


def diagnostics(exps: Path, lines: Sequence[Mapping[str, Any]],
                known: Sequence[Mapping[str, Any]] = ()) -> str:
    """tokrecord's noise diagnostic of each A/A, one JSON line each, for the README; an A/A
    whose evidence is not at hand keeps its line from `known` (an earlier run's output)."""
    kept = {(_session(k), k["condition"], k["arm"]): k for k in known}
    out = []
    for d in lines:
        key = (_session(d), d["condition"], d["arm"])
        diag = _diagnostic(_exp_dir(exps, d))
        if diag is not None:
            out.append(json.dumps({"session": key[0], "condition": d["condition"], "arm": d["arm"],
                                   "diagnostic": diag.model_dump(mode="json", by_alias=True)},
                                  sort_keys=True))
        elif key in kept:
            out.append(json.dumps({**kept[key], "session": key[0]}, sort_keys=True))
    return "".join(line + "\n" for line in out)


def summarize(exp: Path, *, condition: str = "", arm: str = "", wall_s: float | None = None
              ) -> dict[str, Any]:
    record = json.loads((exp / "record.json").read_text()) if (exp / "record.json").exists() else {}
    va = record.get("verdict_analysis") or {}
    legs = [{"leg": s["name"], "tok_s": fig, **_covariates(run_dir, s)}
            for _, run_dir, s, fig in _rated_legs(exp)]
    logs = [math.log(x["tok_s"]) for x in legs]
    out: dict[str, Any] = {"condition": condition, "arm": arm, "experiment": exp.name,
                           "legs": legs, "n_legs": len(legs), "wall_s": wall_s}
    if len(logs) >= 3:
        sd = 100 * statistics.stdev(logs)
        df = len(logs) - 1
        lo, hi = sd_interval(sd, df)
        out.update(mean_tok_s=math.exp(statistics.fmean(logs)), sd_plain_pct=sd, df_plain=df,
                   sd_plain_ci=[lo, hi])
    sd_b, df_b = va.get("leg_noise_sd_pct"), va.get("leg_noise_df")
    if sd_b is not None and df_b:
        out.update(sd_leg_pct=sd_b, df_leg=df_b, sd_leg_ci=list(sd_interval(sd_b, df_b)),
                   sd_row_pct=va.get("row_noise_sd_pct"))
    return out


# ---- the loop on the GPU machine -----------------------------------------------------

def _write_outputs(results: Path, out: Path) -> None:
    lines = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    lines.sort(key=lambda d: ORDER.index(f"{d['condition']}:{d['arm']}")
               if f"{d['condition']}:{d['arm']}" in ORDER else 99)
    (out / "noise-aa.jsonl").write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in lines))
    (out / "noise-table.md").write_text(table(lines))


def table(lines: Sequence[Mapping[str, Any]]) -> str:
    head = ("| condition | arm | legs | mean tok/s | leg sd % (df) [95 % CI] | plain sd % (df) "
            "[95 % CI] | row sd % |\n|---|---|---|---|---|---|---|\n")
    body = []
    for d in lines:
        def f(key: str, ci: str, df: str, d: Mapping[str, Any] = d) -> str:
            if d.get(key) is None:
                return "-"
            lo, hi = d[ci]
            return f"{d[key]:.2f} ({d[df]}) [{lo:.2f}, {hi:.2f}]"
        body.append(f"| {d['condition']} | {d['arm']} | {d['n_legs']} | "
                    f"{d.get('mean_tok_s', float('nan')):.0f} | {f('sd_leg_pct', 'sd_leg_ci', 'df_leg')} | "
                    f"{f('sd_plain_pct', 'sd_plain_ci', 'df_plain')} | "
                    f"{d.get('sd_row_pct') or float('nan'):.2f} |")
    return head + "\n".join(body) + "\n"


def run_all(*, work: Path, out: Path, server: str, models: Path, deadline: float,
            only: Sequence[str], notes: str, blocks: int, host_cpu_max: float | None = None
            ) -> int:
    noise = work / "noise"
    results = noise / "results"
    results.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    suite = noise / "suite-128.jsonl"
    if not suite.exists():
        write_suite(suite)
    conds = conditions()
    durations = [json.loads(p.read_text()).get("wall_s") or 0 for p in results.glob("*.json")]
    teacher_file = noise / "teacher.json"
    for key in only or ORDER:
        cname, arm = key.split(":")
        if (results / f"{cname}-{arm}.json").exists():
            continue
        # 12 legs of ~9 s and a teacher: about 130 s; the longest seen so far otherwise.
        guess = max([130.0, *[1.1 * d for d in durations if d]])
        left = deadline - time.time()
        if left < guess:
            print(f"== {key}: not started ({left:.0f} s left, an A/A takes ~{guess:.0f} s)", flush=True)
            break
        cond = conds[cname]
        if host_cpu_max is not None:  # a rehearsal on a shared machine
            cond = dataclasses.replace(cond, host_cpu_max_pct=max(host_cpu_max, cond.host_cpu_max_pct))
        exp = noise / f"aa-{cname}-{arm}"
        plan = noise / f"plan-{cname}-{arm}.toml"
        teacher = str(teacher_file) if teacher_file.exists() else "capture"
        if not plan.exists():
            plan.write_text(plan_text(cond=cond, arm=arm, server=server, models=models,
                                      suite=suite, teacher=teacher, blocks=blocks, notes=notes))
        print(f"== {key}: {cond.description} ({time.strftime('%H:%M:%S')})", flush=True)
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(cond.burners)]
        t0 = time.time()
        try:
            rc = subprocess.call([*cond.client_prefix, sys.executable, "-m", "tokrecord", "run",
                                  str(plan), "--out", str(exp)])
        finally:
            for b in burners:
                b.kill()
                b.wait()
        wall = time.time() - t0
        print(f"== {key}: exit {rc} after {wall:.0f} s", flush=True)
        if not (teacher_file.exists()) and (exp / "teacher.json").exists():
            shutil.copy(exp / "teacher.json", teacher_file)
        if not (exp / "record.json").exists():
            continue
        s = summarize(exp, condition=cname, arm=arm, wall_s=wall)
        durations.append(wall)
        (results / f"{cname}-{arm}.json").write_text(json.dumps(s, sort_keys=True))
        _write_outputs(results, out)
        print(f"   leg sd {s.get('sd_leg_pct', float('nan')):.2f} % (df {s.get('df_leg')}), "
              f"plain sd {s.get('sd_plain_pct', float('nan')):.2f} % (df {s.get('df_plain')})",
              flush=True)
    _write_outputs(results, out)
    return 0


def tar_experiments(work: Path, out: Path, limit_bytes: int = 15 * 2**20) -> None:
    """Every A/A's evidence in one tar; the raw reads and event logs go first if too big."""
    noise = work / "noise"
    exps = sorted(p for p in [*noise.glob("aa-*"), *noise.glob("il-*")] if p.is_dir())
    dest = out / "noise-exps.tar.gz"
    for skip in ((), ("raw-reads.bin", "events.jsonl"),
                 ("raw-reads.bin", "events.jsonl", "telemetry.jsonl", "server.log")):
        with tarfile.open(dest, "w:gz") as tar:
            for e in [*exps, *noise.glob("plan-*.toml"), noise / "suite-128.jsonl"]:
                if e.exists():
                    tar.add(e, arcname=e.name,
                            filter=lambda ti, skip=skip: None if Path(ti.name).name in skip else ti)
        if dest.stat().st_size <= limit_bytes:
            print(f"== {dest.name}: {dest.stat().st_size / 2**20:.1f} MiB"
                  f"{' without ' + ', '.join(skip) if skip else ''}", flush=True)
            return
    dest.unlink()
    print("== no tar: the experiments do not fit", flush=True)


def sd_ratio_interval(sd_ref: float, df_ref: int, sd: float, df: int,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """sd_ref / sd with its F interval: (ratio, low, high). A cut by 1.5x is shown when
    the low end is above 1.5."""
    from scipy.stats import f

    a = (1 - confidence) / 2
    ratio2 = (sd_ref / sd) ** 2
    return (math.sqrt(ratio2), math.sqrt(ratio2 / float(f.ppf(1 - a, df_ref, df))),
            math.sqrt(ratio2 / float(f.ppf(a, df_ref, df))))


def pooled_sd(items: Sequence[tuple[float, int]]) -> tuple[float, int]:
    """(sd, df) pairs pooled: the root of the df-weighted mean variance, and the summed df."""
    df = sum(d for _, d in items)
    return math.sqrt(sum(sd * sd * d for sd, d in items) / df), df


def bartlett_sds(items: Sequence[tuple[float, int]]) -> tuple[float, int, float]:
    """Bartlett's test that several sds (each with its df) share one variance: (statistic,
    df, p). scipy's `bartlett` wants the raw samples; the A/As give sds on a block-adjusted
    df, so the statistic is computed from them (Bartlett 1937, with its correction)."""
    from scipy.stats import chi2

    k = len(items)
    sp, n = pooled_sd(items)
    t = n * math.log(sp * sp) - sum(d * math.log(sd * sd) for sd, d in items)
    c = 1 + (sum(1 / d for _, d in items) - 1 / n) / (3 * (k - 1))
    stat = t / c
    return stat, k - 1, float(chi2.sf(stat, k - 1))


def _covariate_cells(d: Mapping[str, Any], exps: Path | None,
                     known: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> tuple[str, str]:
    diag: Any = None
    if exps is not None and _exp_dir(exps, d).is_dir():
        found = _diagnostic(_exp_dir(exps, d))
        diag = found.model_dump(mode="json", by_alias=True) if found is not None else None
    if diag is None:
        diag = known.get((_session(d), d["condition"], d["arm"]), {}).get("diagnostic")
    if not diag:
        return "-", "-"
    best = (f"{diag['best']} ({diag['best_r']:+.2f})"
            if diag.get("best") is not None and diag.get("best_r") is not None else "-")
    adj = f"{diag['adjacent_r']:+.2f}" if diag.get("adjacent_r") is not None else "-"
    return best, adj


def analyse(lines: Sequence[Mapping[str, Any]], exps: Path | None,
            known: Sequence[Mapping[str, Any]] = ()) -> str:
    """The README's table: each A/A's leg sd with its chi-square interval, its ratio to
    the baseline of the same arm with the F interval, and the covariate that tracks its legs
    best by tokrecord's own noise diagnostic (from the evidence, or from `known`: an earlier
    diagnostics file, for A/As whose evidence was not kept).

    The baseline is the same arm's baseline A/A of the same session (machine lease) when
    there is one, else all sessions' baselines of that arm pooled: the noise level itself
    moved between sessions, so a same-session reference is the fairer one."""
    bases: dict[str, list[Mapping[str, Any]]] = {}
    for d in lines:
        if d["condition"] == "base":
            bases.setdefault(d["arm"], []).append(d)
    cache = {(_session(k), k["condition"], k["arm"]): k for k in known}
    out = ["| session | condition | arm | legs | mean tok/s | leg sd % (df) [95 % CI] | "
           "baseline / this [95 % CI] | sd of leg figures % (df) [95 % CI] | row sd % | "
           "best covariate (r) | adjacent legs r |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in lines:
        ratio = "-"
        same = [b for b in bases.get(d["arm"], []) if _session(b) == _session(d)]
        refs = same or bases.get(d["arm"], [])
        if refs and d["condition"] != "base" and d.get("sd_leg_pct"):
            ref_sd, ref_df = pooled_sd([(b["sd_leg_pct"], b["df_leg"]) for b in refs])
            r, lo, hi = sd_ratio_interval(ref_sd, ref_df, d["sd_leg_pct"], d["df_leg"])
            ratio = f"{r:.2f} [{lo:.2f}, {hi:.2f}]" + ("" if same else " (pooled baseline)")
        best, adj = _covariate_cells(d, exps, cache)
        lo, hi = d["sd_leg_ci"]
        plo, phi = d["sd_plain_ci"]
        out.append(f"| {_session(d)} | {d['condition']} | {d['arm']} | {d['n_legs']} | "
                   f"{d['mean_tok_s']:.0f} | "
                   f"{d['sd_leg_pct']:.2f} ({d['df_leg']}) [{lo:.2f}, {hi:.2f}] | {ratio} | "
                   f"{d['sd_plain_pct']:.2f} ({d['df_plain']}) [{plo:.2f}, {phi:.2f}] | "
                   f"{d['sd_row_pct']:.2f} | {best} | {adj} |")
    out.append("")
    for arm in sorted({d["arm"] for d in lines}):
        items = [(d["sd_leg_pct"], d["df_leg"]) for d in lines
                 if d["arm"] == arm and d.get("sd_leg_pct")]
        if len(items) >= 2:
            stat, df, pval = bartlett_sds(items)
            sp, n = pooled_sd(items)
            lo, hi = sd_interval(sp, n)
            out.append(f"- {arm}: {len(items)} A/As, pooled leg sd {sp:.2f} % (df {n}) "
                       f"[{lo:.2f}, {hi:.2f}]; Bartlett's test of one common leg variance: "
                       f"chi2 {stat:.1f} on {df} df, p = {pval:.3g}")
        base_items = [(b["sd_leg_pct"], b["df_leg"]) for b in bases.get(arm, [])]
        if len(base_items) == 2:
            (s1, d1), (s2, d2) = base_items
            r, lo, hi = sd_ratio_interval(max(s1, s2), d1, min(s1, s2), d2)
            out.append(f"- {arm}: the two sessions' baselines, larger / smaller leg sd: "
                       f"{r:.2f} [{lo:.2f}, {hi:.2f}]")
    return "\n".join(out) + "\n"


def _diagnostic(exp: Path) -> Any:
    from tokrecord.experiment.noise import noise_diagnostic
    from tokrecord.probes.covariates import covariates_from_run_dir

    legs = []
    for line in _jsonl(exp / "experiment.jsonl"):
        if line.get("event") == "leg_end" and line.get("leg") != "teacher" \
                and line.get("status") == "complete":
            run_dir = exp.joinpath(*Path(str(line["run_dir"])).parts[-2:])
            legs.append((line["leg"], "control", line.get("headline"),
                         covariates_from_run_dir(run_dir)))
    return noise_diagnostic(legs) if legs else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_noise.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the A/As, in order, until the deadline")
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--server", required=True)
    r.add_argument("--models", type=Path, required=True)
    r.add_argument("--deadline", type=float, required=True, help="unix time")
    r.add_argument("--only", nargs="*", default=[], help="condition:arm keys (default: all, in order)")
    r.add_argument("--notes", default="")
    r.add_argument("--blocks", type=int, default=BLOCKS)
    r.add_argument("--host-cpu-max", type=float, default=None,
                   help="lift the idle gate's host CPU threshold (a rehearsal on a busy machine)")
    il = sub.add_parser("interleave", help="one ABBA: the baseline vs one condition, alternating")
    il.add_argument("--work", type=Path, required=True)
    il.add_argument("--out", type=Path, required=True)
    il.add_argument("--server", required=True)
    il.add_argument("--models", type=Path, required=True)
    il.add_argument("--key", required=True, help="condition:arm, e.g. pin:draft")
    il.add_argument("--notes", default="")
    il.add_argument("--blocks", type=int, default=8)
    il.add_argument("--deadline", type=float, default=None, help="unix time")
    il.add_argument("--host-cpu-max", type=float, default=None,
                    help="lift the idle gate's host CPU threshold (a rehearsal on a busy machine)")
    ils = sub.add_parser("interleaved-summary", help="an interleaved ABBA's directory as a table")
    ils.add_argument("exp", type=Path)
    ils.add_argument("--key", required=True)
    t = sub.add_parser("tar", help="the A/As' evidence as one tar in OUT")
    t.add_argument("--work", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("summarize", help="one A/A experiment directory as a JSON line")
    s.add_argument("exp", type=Path)
    s.add_argument("--condition", default="")
    s.add_argument("--arm", default="")
    tb = sub.add_parser("table", help="noise-aa.jsonl as a markdown table")
    tb.add_argument("jsonl", type=Path)
    an = sub.add_parser("analyse", help="the README's table from noise-aa.jsonl")
    an.add_argument("jsonl", type=Path)
    an.add_argument("--exps", type=Path, default=None,
                    help="the untarred noise-exps.tar.gz: adds each A/A's best covariate")
    an.add_argument("--diagnostics", type=Path, default=None,
                    help="with --exps: write each A/A's noise diagnostic here (JSON lines)")
    an.add_argument("--known", type=Path, default=None,
                    help="an earlier diagnostics file: the best covariate of A/As whose "
                         "evidence is not at hand")
    args = p.parse_args(argv)
    if args.cmd == "analyse":
        known = _jsonl(args.known) if args.known is not None else []
        lines = _jsonl(args.jsonl)
        if args.diagnostics is not None and args.exps is not None:
            text = diagnostics(args.exps, lines, known)
            args.diagnostics.write_text(text)
            known = [json.loads(line) for line in text.splitlines()]
        sys.stdout.write(analyse(lines, args.exps, known))
        return 0
    if args.cmd == "run":
        return run_all(work=args.work, out=args.out, server=args.server, models=args.models,
                       deadline=args.deadline, only=args.only, notes=args.notes, blocks=args.blocks,
                       host_cpu_max=args.host_cpu_max)
    if args.cmd == "interleave":
        return run_interleaved(work=args.work, out=args.out, server=args.server,
                               models=args.models, key=args.key, notes=args.notes,
                               blocks=args.blocks, deadline=args.deadline,
                               host_cpu_max=args.host_cpu_max)
    if args.cmd == "interleaved-summary":
        cname, arm = args.key.split(":")
        d = interleaved_summary(args.exp, condition=cname, arm=arm)
        print(json.dumps(d, sort_keys=True))
        sys.stdout.write(interleaved_table(d))
        return 0
    if args.cmd == "tar":
        tar_experiments(args.work, args.out)
        return 0
    if args.cmd == "summarize":
        print(json.dumps(summarize(args.exp, condition=args.condition, arm=args.arm), sort_keys=True))
        return 0
    sys.stdout.write(table(_jsonl(args.jsonl)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
