"""Measurement fidelity: tokrecord and its peers against the fake server's own log.

    make fidelity          # or: .venv/bin/python -m bench.fidelity [--runs 3] [--cells ...]

For each schedule (cell) of the packaged paced fake server and each run, every tool
streams the same number of requests, one at a time, from a fresh fake server that
logs what it sent and when. Each tool's reported rate and TTFT are compared with the
same figure computed from that log (truth.py says how), and its CPU time is taken
from the kernel. One table, side by side, then the definitions and the targets.

This is a benchmark that prints figures, not a test: the machine's other load moves
them, so the 1-minute load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.fidelity.tools import (
    FAKE_MODEL,
    SERVERS,
    Cell,
    Job,
    Placement,
    Report,
    Tool,
    ToolUnavailable,
    all_tools,
    bench_cache,
    placement,
    server_argv,
)
from bench.fidelity.truth import (
    Lags,
    ScheduleKeeping,
    Spread,
    diff,
    lags,
    measured_requests,
    parse_server_log,
    rel_error_pct,
    schedule_keeping,
    spread,
    truth_rate,
    truth_row,
    truth_ttft_ms,
)
from bench.fidelity.vocab import ensure_tokenizer_dir
from tokrecord.engines import ENGINES, EngineName
from tokrecord.evidence import read_jsonl
from tokrecord.server.process import ServerProcess, free_port
from tokrecord.suite import load_suite

SCHEMA = "tokrecord.bench-fidelity/v2"
OLD_SCHEMA = "tokrecord.bench-fidelity/v1"  # one server, one placement; still readable
TTFT_MS = 200.0

CELLS: dict[str, tuple[float, int, int]] = {
    # key: (tok/s, tokens per chunk, max_tokens)
    "100": (100.0, 1, 128),
    "1000": (1000.0, 1, 256),
    "5000": (5000.0, 1, 256),
    "20000": (20000.0, 1, 256),
    "1000x4": (1000.0, 4, 256),
}


@dataclass(frozen=True)
class Target:
    what: str
    cell: str
    limit: float
    figure: str  # "rate_abs", "ttft", "cpu"


TARGETS = (
    Target("headline |error| <= 0.15 % at 1000 tok/s", "1000", 0.15, "rate_abs"),
    Target("headline |error| <= 0.2 % at 5000 tok/s", "5000", 0.2, "rate_abs"),
    Target("chunk-aware |error| <= 0.1 % at 4 tokens/chunk", "1000x4", 0.1, "rate_abs"),
    Target("TTFT over truth <= 0.7 ms (every cell)", "*", 0.7, "ttft"),
    Target("client CPU per run < 2 s (every cell)", "*", 2.0, "cpu"),
)


# The configurations a run is made in: `default` is what users get (nothing pinned,
# telemetry on); `pinned` keeps the server on a CPU of its own and the tool on the rest.
CONFIGS = ("default", "pinned")
# Peers count tokens with the fake server's tokenizer, which only the fake server's
# text matches; they run on it, pinned, as they always have.
PEER_GROUP = ("fake", "pinned")


@dataclass
class RunResult:
    cell: str
    run: int
    tool: str
    ok: bool
    server: str = "fake"
    config: str = "pinned"
    error: str | None = None
    rate_reported: float | None = None
    rate_truth: float | None = None
    rate_error_pct: float | None = None
    ttft_reported_ms: float | None = None
    ttft_truth_ms: float | None = None
    ttft_error_ms: float | None = None
    tokens: int | None = None
    requests_measured: int = 0
    cpu_process_s: float | None = None
    cpu_loop_s: float | None = None
    schedule: dict[str, Any] | None = None
    lags_us: dict[str, float | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def cell_for(key: str, rows: int) -> Cell:
    tok_s, k, max_tokens = CELLS[key]
    name = f"{tok_s:g} tok/s" + (f", {k} tok/chunk" if k > 1 else "")
    return Cell(name=name, tok_s=tok_s, tokens_per_chunk=k, ttft_ms=TTFT_MS,
                max_tokens=max_tokens, rows=rows)


def prompts_for(rows: int) -> list[dict[str, str]]:
    suite = load_suite()
    if rows > len(suite.rows):
        raise SystemExit(f"--rows {rows}: the built-in suite has {len(suite.rows)} rows")
    return [{"id": r.id, "prompt": r.prompt} for r in suite.rows[:rows]]


def _median(values: Sequence[float]) -> float | None:
    import statistics

    return float(statistics.median(values)) if values else None


def _median_lags(items: Sequence[Lags]) -> dict[str, float | None]:
    def med(name: str) -> float | None:
        vals = [getattr(x, name) for x in items if getattr(x, name) is not None]
        return _median(vals)

    return {name: med(name) for name in ("request_trip_us", "first_us", "token_1_us",
                                         "token_100_us")}


def _client_lags(tool: Tool, report: Report, job: Job, sent: Sequence[Any]) -> dict[str, Any] | None:
    """Per-request lags on the shared clock, for the clients whose raw stamps we have."""
    pairs: list[tuple[int, list[tuple[int, int]]]] = []
    if tool.key == "tokrecord":
        epoch = int(report.extra["epoch_ns"])
        data = json.loads((Path(report.extra["run_dir"]) / "rows.json").read_text())
        for row in data["rows"]:
            trace = row["trace"]
            pairs.append((epoch + trace["t_send_ns"],
                          [(epoch + c["t_ns"], c["n"]) for c in trace["chunks"]]))
    elif tool.key == "floor":
        data = json.loads((job.workdir / "floor.json").read_text())
        pairs = [(r["t_send_ns"], [(t, n) for t, n in r["chunks"]]) for r in data["requests"]]
    else:
        return None
    if len(pairs) != len(sent):
        return None
    return _median_lags([lags(t, chunks, s) for (t, chunks), s in zip(pairs, sent, strict=True)])


def run_one(tool: Tool, cell_key: str, cell: Cell, run: int, out: Path,
            prompts: list[dict[str, str]], tokenizer_dir: Path, where: Placement,
            server_kind: str = "fake", config: str = "pinned") -> RunResult:
    workdir = out / server_kind / config / cell_key / f"run{run}" / tool.key
    workdir.mkdir(parents=True, exist_ok=False)
    server_log = workdir / "server-sent.jsonl"
    result = RunResult(cell=cell_key, run=run, tool=tool.key, ok=False, server=server_kind,
                       config=config)
    server: ServerProcess | None = None
    try:
        port = None
        if not tool.starts_own_server:
            port = free_port()
            server = ServerProcess(server_argv(server_kind, cell, server_log, str(port), where),
                                   port=port, log_path=workdir / "server.out", stop_grace_s=5)
            server.start()
            server.wait_ready(30, model=FAKE_MODEL, poll_s=0.1, engine=ENGINES[EngineName.VLLM])
        job = Job(cell=cell, workdir=workdir, prompts=prompts, tokenizer_dir=tokenizer_dir,
                  server_log=server_log, port=port, placement=where, server=server_kind)
        report = tool.run(job)
    except ToolUnavailable as exc:
        result.error = str(exc)
        return result
    finally:
        if server is not None:
            server.stop()
    sent = measured_requests(parse_server_log(read_jsonl(server_log)), cell.max_tokens, cell.rows)
    truth_rows = [truth_row(r) for r in sent]
    definition = tool.definition(cell)
    result.ok = len(sent) == cell.rows
    if not result.ok:
        result.error = f"the server log has {len(sent)} complete requests of {cell.rows}"
    result.rate_reported = report.rate_tok_s
    result.rate_truth = truth_rate(truth_rows, definition.rate_def, definition.aggregate)
    result.rate_error_pct = rel_error_pct(report.rate_tok_s, result.rate_truth)
    result.ttft_reported_ms = report.ttft_ms
    result.ttft_truth_ms = truth_ttft_ms(truth_rows)
    result.ttft_error_ms = diff(report.ttft_ms, result.ttft_truth_ms)
    result.tokens = report.tokens
    result.requests_measured = len(sent)
    result.cpu_process_s = report.cpu_process_s
    result.cpu_loop_s = report.cpu_loop_s
    result.schedule = asdict(schedule_keeping(sent, cell.tok_s, cell.ttft_ms))
    result.lags_us = _client_lags(tool, report, job, sent)
    result.extra = report.extra
    return result


# ----------------------------------------------------------------------- report


def _f(value: float | None, digits: int = 2, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+,.{digits}f}" if sign else f"{value:,.{digits}f}"


def _range(s: Spread, digits: int = 2) -> str:
    if s.n == 0:
        return "—"
    return f"{_f(s.low, digits, True)} … {_f(s.high, digits, True)}"


def _per_k(cpu: float | None, tokens: int | None) -> float | None:
    if cpu is None or not tokens:
        return None
    return 1000.0 * cpu / tokens * 1000.0  # ms per 1000 tokens


def summarise(results: Sequence[RunResult], cells: dict[str, Cell], tools: Sequence[Tool]
              ) -> list[dict[str, Any]]:
    rows = []
    for key, cell in cells.items():
        for tool in tools:
            mine = [r for r in results if r.cell == key and r.tool == tool.key]
            good = [r for r in mine if r.ok]
            errors = sorted({r.error for r in mine if r.error})
            rows.append({
                "cell": key, "cell_name": cell.name, "tool": tool.key, "label": tool.label,
                "runs": len(mine), "runs_ok": len(good),
                "rate_error_pct": asdict(spread(r.rate_error_pct for r in good)),
                "ttft_error_ms": asdict(spread(r.ttft_error_ms for r in good)),
                "cpu_process_s": asdict(spread(r.cpu_process_s for r in good)),
                "cpu_process_ms_per_1k": asdict(spread(_per_k(r.cpu_process_s, r.tokens)
                                                       for r in good)),
                "cpu_loop_ms_per_1k": asdict(spread(_per_k(r.cpu_loop_s, r.tokens) for r in good)),
                "errors": errors,
            })
    return rows


def results_table(summary: Sequence[dict[str, Any]], group: str = "") -> Table:
    table = Table(title=f"measurement fidelity{group}: tool figure vs the server's send log "
                        "(mean over runs, and min … max)", header_style="bold")
    for name, justify in (("schedule", "left"), ("tool", "left"), ("rate err %", "right"),
                          ("range", "right"), ("TTFT err ms", "right"), ("range", "right"),
                          ("CPU/run s", "right"), ("CPU ms/1k tok", "right"),
                          ("loop ms/1k tok", "right"), ("runs", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last_cell = None
    for row in summary:
        if last_cell is not None and row["cell"] != last_cell:
            table.add_section()
        cell_label = row["cell_name"] if row["cell"] != last_cell else ""
        last_cell = row["cell"]
        if row["runs_ok"] == 0:
            reason = "; ".join(row["errors"])[:160] or "not run"
            table.add_row(cell_label, row["label"], f"[red]not measured: {escape(reason)}[/]",
                          "", "", "", "", "", "", f"0/{row['runs']}")
            continue
        rate = Spread(**row["rate_error_pct"])
        ttft = Spread(**row["ttft_error_ms"])
        table.add_row(
            cell_label, row["label"], _f(rate.mean, 3, True), _range(rate, 3),
            _f(ttft.mean, 2, True), _range(ttft, 2),
            _f(Spread(**row["cpu_process_s"]).mean, 2),
            _f(Spread(**row["cpu_process_ms_per_1k"]).mean, 0),
            _f(Spread(**row["cpu_loop_ms_per_1k"]).mean, 0),
            f"{row['runs_ok']}/{row['runs']}",
        )
    return table


def schedule_table(results: Sequence[RunResult], cells: dict[str, Cell], group: str = "") -> Table:
    table = Table(title=f"how well the server kept each schedule{group} (its own log, all runs)",
                  header_style="bold")
    for name in ("schedule", "chunks", "late µs p50", "late µs p99", "late µs max",
                 "logged rate vs nominal %", "logged TTFT vs nominal ms"):
        table.add_column(name, justify="left" if name == "schedule" else "right")
    for key, cell in cells.items():
        keeps = [ScheduleKeeping(**r.schedule) for r in results if r.cell == key and r.schedule]
        if not keeps:
            continue
        table.add_row(
            cell.name, str(sum(k.chunks for k in keeps)),
            _f(_median([k.late_us_median for k in keeps]), 1),
            _f(max(k.late_us_p99 for k in keeps), 1), _f(max(k.late_us_max for k in keeps), 0),
            _range(spread(k.rate_vs_nominal_pct for k in keeps), 3),
            _range(spread(k.ttft_vs_nominal_ms for k in keeps), 3),
        )
    return table


def lags_table(results: Sequence[RunResult], cells: dict[str, Cell], group: str = "") -> Table:
    table = Table(title=f"where client time goes{group} (median per request, µs on the shared "
                        "monotonic clock; mean over runs)", header_style="bold")
    for name in ("schedule", "client", "request trip", "first chunk", "token 1", "token 100"):
        table.add_column(name, justify="left" if name in ("schedule", "client") else "right")
    for key, cell in cells.items():
        for tool in ("tokrecord", "floor"):
            mine = [r.lags_us for r in results if r.cell == key and r.tool == tool and r.lags_us]
            if not mine:
                continue
            table.add_row(cell.name, tool, *(
                _f(spread(m[name] for m in mine).mean, 0)
                for name in ("request_trip_us", "first_us", "token_1_us", "token_100_us")))
    return table


def definitions_table(tools: Sequence[Tool], cells: dict[str, Cell]) -> Table:
    table = Table(title="what each tool reports, and how the truth is computed for it",
                  header_style="bold", show_lines=True)
    for name in ("tool", "version", "rate figure", "truth from the log", "TTFT figure",
                 "timestamps", "notes"):
        table.add_column(name, overflow="fold")
    some_cell = next(iter(cells.values()))
    for tool in tools:
        d = tool.definition(some_cell)
        rate = d.rate_figure
        truth = f"{d.aggregate.value} of {d.rate_def.value}, on the server's write times"
        if tool.key in ("tokrecord", "floor"):
            truth = ("median of per-row 99 / (t_100 - t_1) (chunk-aware at 4 tok/chunk), "
                     "on the server's write times")
        table.add_row(tool.label, tool.version(), rate, truth,
                      d.ttft_figure + "; truth: first chunk written - request arrived",
                      d.stamps, d.notes)
    return table


@dataclass(frozen=True)
class FloorTarget:
    """tokrecord against the floor client measured in the same run of the same cell."""

    what: str
    cells: tuple[str, ...]  # "*": every cell
    limit: float
    figure: str  # "rate_abs": |error| points over the floor's; "ttft": ms over the floor's


FLOOR_TARGETS = (
    FloorTarget("rate |error| <= floor's + 0.1 points at 1000 and 5000 tok/s",
                ("1000", "5000"), 0.1, "rate_abs"),
    FloorTarget("TTFT over truth <= floor's + 0.2 ms (every cell)", ("*",), 0.2, "ttft"),
)


def _floor_excess(tok: RunResult, floor: RunResult, figure: str) -> float | None:
    if figure == "rate_abs":
        if tok.rate_error_pct is None or floor.rate_error_pct is None:
            return None
        return abs(tok.rate_error_pct) - abs(floor.rate_error_pct)
    if tok.ttft_error_ms is None or floor.ttft_error_ms is None:
        return None
    return tok.ttft_error_ms - floor.ttft_error_ms


def floor_checks(results: Sequence[RunResult], cells: dict[str, Cell]) -> list[dict[str, Any]]:
    """tokrecord's figure minus the floor's, run by run (the worst run decides)."""
    floors = {(r.cell, r.run): r for r in results if r.tool == "floor" and r.ok}
    checks = []
    for target in FLOOR_TARGETS:
        keys = list(cells) if target.cells == ("*",) else [c for c in target.cells if c in cells]
        values = [v for r in results
                  if r.tool == "tokrecord" and r.ok and r.cell in keys and (r.cell, r.run) in floors
                  and (v := _floor_excess(r, floors[(r.cell, r.run)], target.figure)) is not None]
        if not keys or not values:
            continue
        worst = max(values)
        checks.append({"target": target.what, "limit": target.limit, "worst_run": worst,
                       "mean": sum(values) / len(values), "runs": len(values),
                       "met": worst <= target.limit})
    return checks


def target_checks(results: Sequence[RunResult], cells: dict[str, Cell]) -> list[dict[str, Any]]:
    checks = []
    mine = [r for r in results if r.tool == "tokrecord" and r.ok]
    for target in TARGETS:
        keys = list(cells) if target.cell == "*" else [target.cell] if target.cell in cells else []
        if not keys:
            continue
        values: list[float] = []
        for r in (r for r in mine if r.cell in keys):
            if target.figure == "rate_abs" and r.rate_error_pct is not None:
                values.append(abs(r.rate_error_pct))
            elif target.figure == "ttft" and r.ttft_error_ms is not None:
                values.append(r.ttft_error_ms)
            elif target.figure == "cpu" and r.cpu_process_s is not None:
                values.append(r.cpu_process_s)
        worst = max(values) if values else None
        checks.append({"target": target.what, "limit": target.limit, "worst_run": worst,
                       "mean": sum(values) / len(values) if values else None,
                       "runs": len(values),
                       "met": worst is not None and worst <= target.limit})
    return checks + floor_checks(results, cells)


def targets_table(checks: Sequence[dict[str, Any]], group: str = "") -> Table:
    table = Table(title=f"tokrecord against the targets{group} (worst run decides)",
                  header_style="bold")
    for name in ("target", "mean", "worst run", "runs", ""):
        table.add_column(name, justify="left" if name == "target" else "right")
    for c in checks:
        verdict = "[green]met[/]" if c["met"] else "[red]MISSED[/]"
        table.add_row(c["target"], _f(c["mean"], 3), _f(c["worst_run"], 3), str(c["runs"]),
                      verdict)
    return table


# ------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per cell and tool (default 3)")
    parser.add_argument("--rows", type=int, default=11,
                        help="requests per run (default 11; odd, so every tool's median is "
                             "one request's value)")
    parser.add_argument("--cells", default=",".join(CELLS),
                        help=f"comma-separated schedules (default all: {','.join(CELLS)})")
    parser.add_argument("--tools", default="tokrecord,floor,vllm,aiperf,guidellm",
                        help="comma-separated tools (default all; the peers run on the fake "
                             "server, pinned, only)")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help=f"comma-separated paced servers (default all: {','.join(SERVERS)})")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="default (nothing pinned, what users get) and/or pinned (the "
                             "server on the last CPU, the tool on the others); default both")
    parser.add_argument("--no-pin", action="store_true",
                        help="the same as --configs default")
    parser.add_argument("--report", type=Path, default=None, metavar="RESULTS",
                        help="print the tables of an earlier run (its results.json, or the "
                             "directory holding it) and exit")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for every run's files and results.json "
                             "(default tokrecord-runs/fidelity-<time>)")
    args = parser.parse_args(argv)
    if args.no_pin:
        args.configs = "default"
    return args


def _listed(what: str, raw: str, known: Sequence[str], err: Console) -> list[str] | None:
    items = [x for x in raw.split(",") if x]
    unknown = [x for x in items if x not in known]
    if unknown or not items:
        err.print(f"[red]unknown {what} {unknown}; known: {list(known)}[/]")
        return None
    return items


def _runs_tool(tool: Tool, server: str, config: str) -> bool:
    return tool.key in ("tokrecord", "floor") or (server, config) == PEER_GROUP


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Wide enough for the table when the output goes to a file or a pipe.
    out_console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    if args.report is not None:
        path = args.report / "results.json" if args.report.is_dir() else args.report
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            err.print(f"[red]cannot read {path}: {exc}[/]")
            return 2
        if document.get("schema") not in (SCHEMA, OLD_SCHEMA):
            err.print(f"[red]{args.report} is not a {SCHEMA} document[/]")
            return 2
        print_report(document, [t for t in all_tools() if t.key in document["tools"]],
                     out_console, err)
        return 0
    cell_keys = _listed("cells", args.cells, list(CELLS), err)
    servers = _listed("servers", args.servers, list(SERVERS), err)
    configs = _listed("configs", args.configs, CONFIGS, err)
    if cell_keys is None or servers is None or configs is None:
        return 2
    cells = {key: cell_for(key, args.rows) for key in cell_keys}
    wanted = args.tools.split(",")
    tools = [t for t in all_tools() if t.key in wanted]
    out: Path = args.out or Path("tokrecord-runs") / (
        "fidelity-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=False)
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    tokenizer_dir = ensure_tokenizer_dir(bench_cache() / "fake-vocab-tokenizer")
    prompts = prompts_for(args.rows)
    placements = {config: placement(config == "pinned") for config in configs}

    unavailable: dict[str, str] = {}
    for tool in tools:
        if not any(_runs_tool(tool, s, c) for s in servers for c in configs):
            continue
        try:
            tool.prepare(lambda msg: err.print(escape(msg)))
        except ToolUnavailable as exc:
            unavailable[tool.key] = str(exc)
            err.print(f"[yellow]{tool.label} cannot run: {escape(str(exc))}[/]")

    results: list[RunResult] = []
    try:
        # Runs outermost, tools innermost: slow drifts of the machine's load fall on
        # every tool, server and configuration alike instead of on whichever ran last.
        for run in range(1, args.runs + 1):
            for config in configs:
                for server in servers:
                    for key, cell in cells.items():
                        for tool in tools:
                            if not _runs_tool(tool, server, config):
                                continue
                            if tool.key in unavailable:
                                results.append(RunResult(
                                    cell=key, run=run, tool=tool.key, ok=False, server=server,
                                    config=config, error=unavailable[tool.key]))
                                continue
                            t0 = time.monotonic()
                            result = run_one(tool, key, cell, run, out, prompts, tokenizer_dir,
                                             placements[config], server, config)
                            results.append(result)
                            status = (f"rate {_f(result.rate_error_pct, 3, True)} %, "
                                      f"TTFT {_f(result.ttft_error_ms, 2, True)} ms, "
                                      f"CPU {_f(result.cpu_process_s, 2)} s"
                                      if result.ok else
                                      f"[red]{escape(result.error or '')[:300]}[/]")
                            err.print(f"run {run} {server:<8} {config:<7} {cell.name:<22} "
                                      f"{tool.label:<17} {time.monotonic() - t0:5.1f} s  {status}")
    finally:
        load_end = os.getloadavg()[0]
        groups = []
        for config in configs:
            for server in servers:
                mine = [r for r in results if r.server == server and r.config == config]
                group_tools = [t for t in tools if _runs_tool(t, server, config)]
                groups.append({
                    "server": server, "config": config,
                    "placement": placements[config].describe(),
                    "summary": summarise(mine, cells, group_tools),
                    "targets": (target_checks(mine, cells)
                                if any(t.key == "tokrecord" for t in group_tools) else []),
                })
        document = {
            "schema": SCHEMA,
            "created_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_average_1min": {"start": load_start, "end": load_end},
            "cpu_count": os.cpu_count(),
            "wall_seconds": round(time.monotonic() - started, 1),
            "clock": "time.perf_counter_ns (CLOCK_MONOTONIC, shared by every process of the "
                     "machine) for the servers' logs, tokrecord and the floor client; each "
                     "peer's own clock for its figures",
            "servers": {name: SERVERS[name] for name in servers},
            "cells": {k: asdict(c) for k, c in cells.items()},
            "tools": {t.key: {"label": t.label, "version": t.version(),
                              "definition": {k: str(v) for k, v in
                                             asdict(t.definition(next(iter(cells.values()))))
                                             .items()}}
                      for t in tools},
            "groups": groups,
            "runs": [asdict(r) for r in results],
        }
        results_path = out / "results.json"
        results_path.write_text(json.dumps(document, indent=1) + "\n")

    print_report(document, tools, out_console, err)
    out_console.print(f"results: {results_path}")
    return 0


def _groups(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's (server, configuration) groups; an OLD_SCHEMA one has one."""
    if "groups" in document:
        return list(document["groups"])
    return [{"server": "fake", "config": "pinned" if "not pinned" not in document["placement"]
             else "default", "placement": document["placement"], "summary": document["summary"],
             "targets": document["targets"]}]


def print_report(document: dict[str, Any], tools: Sequence[Tool], out: Console,
                 err: Console) -> None:
    """Every table, from a results document (a fresh one or one read back)."""
    cells = {k: Cell(**c) for k, c in document["cells"].items()}
    results = [RunResult(**r) for r in document["runs"]]
    load = document["load_average_1min"]
    out.print(f"1-min load average: {load['start']:.2f} at start, {load['end']:.2f} at end "
              f"({document['cpu_count']} CPUs); {document['wall_seconds']:.0f} s; "
              f"{document['created_utc']}")
    groups = _groups(document)
    for group in groups:
        label = f" — {group['server']} server, {group['config']} ({group['placement']})"
        mine = [r for r in results if r.server == group["server"] and r.config == group["config"]]
        out.print(results_table(group["summary"], label))
        out.print(schedule_table(mine, cells, label))
        out.print(lags_table(mine, cells, label))
    if groups:
        out.print(overview_table(groups))
    out.print(definitions_table(tools, cells))
    for group in groups:
        if group["targets"]:
            out.print(targets_table(group["targets"],
                                    f" — {group['server']} server, {group['config']}"))
    if max(load["start"], load["end"]) > 0.5 * (document["cpu_count"] or 1):
        err.print(f"[yellow]the machine was busy (load {load['start']:.2f} → {load['end']:.2f}):"
                  " figures carry that noise; run again when it is idle[/]")


def overview_table(groups: Sequence[dict[str, Any]]) -> Table:
    """tokrecord and the floor in every cell, server and configuration: one line each."""
    table = Table(title="tokrecord and the floor on every server and configuration "
                        "(rate error %, TTFT error ms: mean [min … max] over runs)",
                  header_style="bold")
    for name in ("server", "config", "schedule", "tokrecord rate", "floor rate",
                 "tokrecord TTFT", "floor TTFT"):
        table.add_column(name, justify="left" if name in ("server", "config", "schedule")
                         else "right")
    for group in groups:
        by = {(row["cell"], row["tool"]): row for row in group["summary"]}
        for cell in dict.fromkeys(row["cell"] for row in group["summary"]):
            cells = []
            for figure, digits in (("rate_error_pct", 3), ("ttft_error_ms", 2)):
                for tool in ("tokrecord", "floor"):
                    row = by.get((cell, tool))
                    sp = Spread(**row[figure]) if row and row["runs_ok"] else None
                    cells.append("—" if sp is None or sp.n == 0 else
                                 f"{_f(sp.mean, digits, True)} [{_range(sp, digits)}]")
            name = next(r["cell_name"] for r in group["summary"] if r["cell"] == cell)
            table.add_row(group["server"], group["config"], name, cells[0], cells[1], cells[2],
                          cells[3])
        table.add_section()
    return table
