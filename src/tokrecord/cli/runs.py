"""`tokrecord runs`: list the experiments under tokrecord-runs/ and remove an abandoned one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tokrecord.experiment.inventory import RunStatus, list_experiments, remove_experiment

from .app import _guard, app, out_console

_NEXT = {RunStatus.COMPLETE: "tokrecord report {path}",
         RunStatus.RUNNING: "(being run now)",
         RunStatus.RESUMABLE: "its plan's `tokrecord run` resumes it",
         RunStatus.ABANDONED: "tokrecord runs --remove {path}"}


@app.command("runs")
@_guard
def runs_cmd(
    root: Annotated[Path, typer.Option(help="Where experiments are.")] = Path("tokrecord-runs"),
    remove: Annotated[Path | None, typer.Option(
        "--remove", help="Delete this abandoned experiment (never a complete one).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="With --remove: also a resumable one.")] = False,
) -> None:
    """List experiments: complete, running, resumable, or abandoned (incomplete, with a
    later experiment of the same plan name); --remove deletes an abandoned one."""
    if remove is not None:
        entry = remove_experiment(remove, force=force)
        out_console.print(Text(f"removed {entry.path} ({entry.status.value}, "
                               f"{entry.legs_done}/{entry.legs_total} legs)"))
        return
    entries = list_experiments(root)
    if not entries:
        out_console.print(Text(f"no experiments under {root}"))
        return
    table = Table(box=None, padding=(0, 1))
    for column in ("experiment", "status", "legs", "started (UTC)", "next"):
        table.add_column(column, overflow="fold")  # a narrow terminal wraps, never cuts
    for e in entries:
        status = e.status.value + (f" (superseded by {e.superseded_by.name})"
                                   if e.superseded_by else "")
        table.add_row(str(e.path), status, f"{e.legs_done}/{e.legs_total}",
                      e.started_utc[:19], _NEXT[e.status].format(path=e.path))
    out_console.print(table)
