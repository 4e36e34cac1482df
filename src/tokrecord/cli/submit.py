"""``tokrecord submit DIR``: dry run (default), ``--send`` and ``--check`` of a leaderboard submission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from tokrecord.submit import PayloadOptions, SubmitError, key_from_env, make_target
from tokrecord.submit.flow import CheckResult, DryRunResult, SendResult, check, dry_run, send

from . import _guard, app, err_console, out_console


def _notify(message: str) -> None:
    err_console.print(Text(message, style="dim"))


def _payload_table(payload: dict[str, Any]) -> Table:
    table = Table(title="payload", show_header=True, header_style="bold")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in payload.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                table.add_row(f"{key}.{sub}", str(inner))
        elif key != "notes":
            table.add_row(key, str(value))
    return table


def _print_warnings(warnings: tuple[str, ...] | list[str]) -> None:
    for warning in warnings:
        err_console.print(Text.assemble(("warning: ", "bold yellow"), warning))


def _print_dry_run(result: DryRunResult) -> None:
    built = result.prepared.built
    out_console.print(_payload_table(built.payload))
    out_console.print(Text(f"notes: {built.payload.get('notes', '')}"))
    _print_warnings(built.warnings)
    for note in result.notes:
        err_console.print(Text(f"note: {note}"))
    local = "valid" if not result.local_issues else "INVALID: " + "; ".join(result.local_issues)
    out_console.print(Text(f"local schema: {local}"))
    if result.remote is not None and result.remote_valid is not None:
        verdict = "valid" if result.remote_valid else f"INVALID: {json.dumps(result.remote.body)}"
        out_console.print(Text(f"dry-run endpoint {result.discovery.dry_run_path}: "
                               f"HTTP {result.remote.status}, {verdict}"))
    out_console.print(Text(f"queue: {result.prepared.queue_path} (sha256 {result.prepared.queue_sha256})"))


def _print_send(result: SendResult) -> None:
    r = result.receipt
    for exchange in result.exchanges:
        waited = f" after waiting {exchange.waited_s:.3f} s" if exchange.waited_s else ""
        out_console.print(Text(f"POST {exchange.url}{waited}: HTTP {exchange.status}"))
    summary = {k: r[k] for k in ("accepted", "http_status", "submission_id", "status", "verified_run",
                                 "verification_issues", "rate_limit", "queue_sha256")}
    out_console.print_json(json.dumps(summary))
    out_console.print(Text(f"receipt (sealed addendum): {result.receipt_dir}"))


def _print_check(result: CheckResult) -> None:
    c = result.check
    if not result.found:
        out_console.print(Text(f"public row {result.submission_id}: not found "
                               f"(HTTP {result.exchange.status})"))
    else:
        out_console.print(Text(f"public row {result.submission_id} (status {result.public_status}): "
                               f"{c['fields_compared']} fields compared, "
                               f"{'all match' if result.match else f'{len(result.mismatches)} differ'}"))
        for m in result.mismatches:
            out_console.print(Text(f"  {m['field']}: sent {m['sent']!r}, public {m['public']!r}"))
    out_console.print(Text(f"check (sealed addendum, {c['checked_utc']}): {result.check_dir}"))


@app.command("submit")
@_guard
def submit_cmd(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed experiment (tokrecord run).")],
    send_it: Annotated[bool, typer.Option("--send", help="Really submit (needs the API key in the "
                                                        "environment). Default: dry run.")] = False,
    check_it: Annotated[bool, typer.Option(
        "--check", help="Fetch the public row of the earlier submission and record whether it matches.",
    )] = False,
    target: Annotated[str, typer.Option(help="Leaderboard.")] = "localmaxxing",
    url: Annotated[str | None, typer.Option(help="Service base URL (default: $LOCALMAXXING_URL, "
                                                 "else https://localmaxxing.com).")] = None,
    hf_id: Annotated[str | None, typer.Option(help="Upstream Hugging Face repo (ORG/NAME), when the "
                                                   "record's model is not a hub snapshot.")] = None,
    model_revision: Annotated[str | None, typer.Option(help="Its revision (commit), when known.")] = None,
    quantization: Annotated[str | None, typer.Option(help="Weights format, when the server argv "
                                                          "does not say (e.g. fp16, AWQ).")] = None,
    engine_name: Annotated[str | None, typer.Option(help="Engine, when the argv does not say.")] = None,
    queue: Annotated[Path | None, typer.Option(help="Queue file to write (default: beside DIR, "
                                                    "named by content).")] = None,
    max_retries: Annotated[int, typer.Option(min=0, help="Retries after HTTP 429.")] = 3,
    max_wait_s: Annotated[float, typer.Option(min=0, help="Most seconds to wait on 429s.")] = 900.0,
) -> None:
    """Submit a sealed record to a leaderboard: dry run by default; --send; --check later."""
    if send_it and check_it:
        raise SubmitError("--send and --check are separate steps; give one")
    tgt = make_target(target, url)
    try:
        if check_it:
            result = check(directory, tgt, notify=_notify)
            _print_check(result)
            if not result.match:
                raise typer.Exit(3)  # a finding scripts must see, like a failed gate
            return
        options = PayloadOptions(hf_id=hf_id, model_revision=model_revision,
                                 quantization=quantization, engine_name=engine_name)
        key = key_from_env(tgt.key_env, tgt.key_pattern)
        if send_it:
            if key is None:
                raise SubmitError(f"--send needs an API key in ${tgt.key_env} (bhk_ + 40 hex); "
                                  "it is read from the environment only and never stored")
            sent = send(directory, tgt, options, key, queue=queue, max_retries=max_retries,
                        max_wait_s=max_wait_s, notify=_notify)
            _print_warnings(sent.prepared.built.warnings)
            _print_send(sent)
            if not sent.acceptance.accepted:
                raise SubmitError(f"{tgt.base_url} did not accept the submission (HTTP "
                                  f"{sent.receipt['http_status']}: {json.dumps(sent.receipt['response'])}); "
                                  f"the response is sealed in {sent.receipt_dir}")
            return
        result_dry = dry_run(directory, tgt, options, key=key, queue=queue, notify=_notify)
        _print_dry_run(result_dry)
        if not result_dry.valid:
            raise SubmitError("the payload does not validate; nothing would be sent")
        out_console.print(Text(f"dry run only: nothing was sent; send with --send and ${tgt.key_env}"))
    finally:
        tgt.close()
