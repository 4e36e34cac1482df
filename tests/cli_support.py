"""The command line run in the test's own process, for tests about what a command prints,
writes and exits with rather than about the process (signals, a second process, the
import itself): a `python -m tokrecord` costs about 1 s of CPU in imports, and some tests
run ten commands.

`cli_in_process` answers like subprocess.run(capture_output=True, text=True): the same
arguments after `tokrecord`, and `env` holding the variables the command may read (the
rest of the test process's environment is hidden from it, as a subprocess given `env=`
would not see it either). The CLI sizes its consoles once, at import, from $COLUMNS when
its output is not a terminal (cli/app.py, _pipe_width): here they take `env`'s COLUMNS for the call.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from collections.abc import Mapping

from typer.testing import CliRunner

from tokrecord.cli.app import app

# The module, not the Typer object `tokrecord.cli.app` names once the package is imported.
cli_app = importlib.import_module("tokrecord.cli.app")


def cli_in_process(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    hidden: dict[str, str | None] = {name: None for name in os.environ if name not in env}
    consoles = (cli_app.out_console, cli_app.err_console)
    widths = [c._width for c in consoles]
    columns = env.get("COLUMNS", "")
    try:
        for c in consoles:
            c._width = int(columns) if columns.isdigit() else cli_app.PIPE_WIDTH
        result = CliRunner().invoke(app, args, env={**hidden, **env}, prog_name="tokrecord")
    finally:
        for c, width in zip(consoles, widths, strict=True):
            c._width = width
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["tokrecord", *args], result.exit_code,
                                       result.stdout, result.stderr)
