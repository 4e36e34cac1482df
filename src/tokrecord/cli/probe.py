"""`tokrecord probe`: what the machine is doing now, and whether it counts as idle."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from tokrecord.errors import ConfigError
from tokrecord.probes import Snapshot, detect
from tokrecord.probes.idle import IdleCriteria, busy_reasons

from .app import _guard, _parse_kv, _validation_message, app, out_console

GIB = 1024**3


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def snapshot_tables(snap: Snapshot) -> list[Table]:
    h = snap.host
    host = Table(title="host", show_header=True)
    for col in ("CPU util", "cores", "load 1m", "memory used", "power", "busy processes"):
        host.add_column(col, justify="right" if col != "busy processes" else "left")
    busy = ", ".join(f"{p.name}[{p.pid}] {p.cpu_pct:.0f}%" for p in h.busy_processes[:4]) or "none"
    host.add_row(f"{h.cpu_util_pct:.0f} %", str(h.cpu_count), f"{h.load1:.2f}",
                 f"{h.mem_used_bytes / GIB:.1f} / {h.mem_total_bytes / GIB:.1f} GiB",
                 _num(h.power_w, "{:.1f} W"), escape(busy))
    tables = [host]
    if snap.devices:
        dev = Table(title="accelerators", show_header=True)
        for col in ("backend", "#", "name", "util", "memory used", "power", "energy counter",
                    "SM clock", "temp", "processes"):
            dev.add_column(col, justify="left" if col in ("backend", "name", "processes")
                           else "right")
        for d in snap.devices:
            mem = "—" if d.mem_used_bytes is None else (
                f"{d.mem_used_bytes / GIB:.2f} / "
                f"{_num(None if d.mem_total_bytes is None else d.mem_total_bytes / GIB, '{:.0f}')} GiB")
            procs = "—" if d.processes is None else (
                ", ".join(f"{p.pid}" + (f" ({p.mem_used_bytes / GIB:.2f} GiB)"
                                         if p.mem_used_bytes else "") for p in d.processes)
                or "none")
            dev.add_row(d.backend, str(d.index), escape(d.name), _num(d.util_pct, "{:.0f} %"), mem,
                        _num(d.power_w, "{:.1f} W"), _num(d.energy_j, "{:,.1f} J"),
                        _num(d.sm_clock_mhz, "{:.0f} MHz"), _num(d.temp_c, "{:.0f} °C"), procs)
        tables.append(dev)
    return tables


@app.command()
@_guard
def probe(
    count: Annotated[int, typer.Option(min=1, help="Snapshots to take.")] = 1,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between snapshots.")] = 1.0,
    idle: Annotated[list[str] | None, typer.Option(
        help="Idle criterion KEY=VALUE to judge against (repeatable); the rest are defaults.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON snapshot per line.")] = False,
) -> None:
    """Snapshot the host and every accelerator found (NVML, xpu-smi, amd-smi/rocm-smi).

    Each snapshot is judged against the idle criteria a plan's \\[idle] section declares:
    interval_s, consecutive, timeout_s, host_cpu_max_pct, host_busy_processes_max,
    device_util_max_pct, device_mem_used_max_mib, device_power_max_w, device_processes_max.
    """
    try:
        criteria = IdleCriteria.model_validate(_parse_kv(idle or [], "--idle"))
    except ValidationError as exc:
        raise ConfigError(_validation_message("--idle", exc)) from exc
    probes = detect()
    try:
        if not as_json:
            found = ", ".join(probes.backends) or "none"
            out_console.print(f"accelerator probes: {found}")
            for note in probes.notes:
                out_console.print(f"[dim]note: {escape(note)}[/]")
        for i in range(count):
            # CPU rates cover the time since the previous read: wait a full interval.
            time.sleep(interval)
            snap = probes.snapshot()
            reasons = busy_reasons(snap, criteria)
            if as_json:
                out_console.print_json(json.dumps(
                    {**snap.as_json(), "busy": reasons}))
                continue
            for table in snapshot_tables(snap):
                out_console.print(table)
            verdict = "[green]idle[/]" if not reasons else "[red]busy[/]: " + escape("; ".join(reasons))
            out_console.print(f"snapshot {i + 1}/{count}: {verdict}")
    finally:
        probes.close()
