"""The command line run in the test's own process, for tests about what a command prints,
writes and exits with rather than about the process (signals, a second process, the
import itself): a `python -m tokrecord` costs about 2 s of CPU in imports, and some tests
run ten commands.

`cli_in_process` answers like subprocess.run(capture_output=True, text=True): the same
arguments after `tokrecord`, and `env` holding the variables the command may read (the
rest of the test process's environment is hidden from it, as a subprocess given `env=`
would not see it either).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from typer.testing import CliRunner

from tokrecord.cli import app


def cli_in_process(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    hidden: dict[str, str | None] = {name: None for name in os.environ if name not in env}
    result = CliRunner().invoke(app, args, env={**hidden, **env}, prog_name="tokrecord")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["tokrecord", *args], result.exit_code,
                                       result.stdout, result.stderr)
