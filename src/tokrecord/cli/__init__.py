"""The `tokrecord` command line: `app` (cli.app) and one module per command group, each
registering its commands when imported, in the order --help lists them."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import NoReturn

from . import commands as _commands
from . import plan as _plan
from . import probe as _probe
from . import reaccount as _reaccount
from . import report as _report
from . import runs as _runs
from . import submit as _submit
from .app import app

# Imported for their registrations (the core commands first).
COMMAND_MODULES = (_commands, _plan, _probe, _reaccount, _report, _runs, _submit)


def _sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    # SIGTERM takes the Ctrl-C path, so every finally block (server stop, cleanup
    # proof, partial results) runs.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _sigterm)
    # standalone_mode: click reports usage errors itself (exit 2); our own errors and
    # Ctrl-C become messages in _guard.
    try:
        app(args=argv, prog_name="tokrecord", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
