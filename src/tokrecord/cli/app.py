"""The `tokrecord` application every command module registers on, its consoles and the
guard that turns a failure a user can act on into one message and an exit code.

A leaf of the cli package: it imports no command module, so each command module
imports it and nothing imports back.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, ParamSpec

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from tokrecord.errors import ConfigError, TokrecordError
from tokrecord.evidence import WRITE_ERRNOS, evidence_error

app = typer.Typer(
    name="tokrecord",
    help="Speed records for local LLM inference that hold up: exact outputs, no cache, "
    "ABBA, sealed evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _pipe_width(stream: Any) -> int | None:
    """None (the terminal's own width) on a terminal; else $COLUMNS when it is set, else
    wide. rich assumes 80 columns when output goes to a file or a pipe, and cuts table
    cells to fit: a headline read `194.…`. Tables do not expand, so a wide width only
    stops the cutting."""
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


PIPE_WIDTH = 200
out_console = Console(width=_pipe_width(sys.stdout))
err_console = Console(stderr=True, width=_pipe_width(sys.stderr))

P = ParamSpec("P")


def _guard(func: Callable[P, None]) -> Callable[P, None]:
    """One clear message and a non-zero exit for every failure a user can act on."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            func(*args, **kwargs)
        except TokrecordError as exc:
            err_console.print(Text.assemble(("tokrecord: error: ", "bold red"), str(exc)))
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:
            # A full disk or a read-only directory is the machine's state, not a bug:
            # one message, its own exit code. Any other OSError keeps its traceback.
            if exc.errno not in WRITE_ERRNOS:
                raise
            error = evidence_error(exc)
            err_console.print(Text.assemble(("tokrecord: error: ", "bold red"), str(error)))
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            err_console.print(
                "[bold red]tokrecord: interrupted[/]; the server was stopped and the run "
                "directory keeps everything received so far"
            )
            raise typer.Exit(130) from None

    return wrapper


def _parse_kv(pairs: list[str], option: str) -> dict[str, str]:
    """KEY=VALUE pairs; pydantic converts the values to the declared types."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _validation_message(source: str, exc: ValidationError) -> str:
    return "\n".join(
        f"{source}: key '{'.'.join(str(p) for p in e['loc'])}': {e['msg']}" for e in exc.errors()
    )
