"""``tokrecord submit DIR``: dry run (default), ``--send`` and ``--check [--wait]`` of a leaderboard
submission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from tokrecord.evidence.safe import terminal_safe
from tokrecord.evidence.trust import Signer
from tokrecord.jsontypes import JSONObject
from tokrecord.record.verify import signer_of
from tokrecord.submit import (
    ApiKey,
    PayloadOptions,
    SubmitError,
    Target,
    key_from_env,
    make_target,
)
from tokrecord.submit.cautions import record_cautions
from tokrecord.submit.flow import (
    Bounds,
    Checked,
    CheckResult,
    DryRunResult,
    SendResult,
    WaitPolicy,
    check,
    dry_run,
    send,
)
from tokrecord.submit.lifecycle import Lifecycle

from .app import _guard, app, err_console, out_console


def _notify(message: str) -> None:
    err_console.print(Text(message, style="dim"))


# A value longer than this is cut in the terminal (samples run to thousands of
# characters); the queue file holds every byte that would be sent.
CELL_CHARS = 160


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    if len(text) <= CELL_CHARS:
        return text
    return f"{text[:CELL_CHARS]}… ({len(text):,} characters; all of it in the queue file)"


def _payload_table(payload: JSONObject) -> Table:
    table = Table(title="payload (long values cut; the queue file has them whole)",
                  show_header=True, header_style="bold")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in payload.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                table.add_row(f"{key}.{sub}", _cell(inner))
        elif key != "notes":
            table.add_row(key, _cell(value))
    return table


def _print_status_first(result: DryRunResult) -> None:
    """What decides whether to send, before the payload: the record, the service's
    verification, and the cautions."""
    facts = result.prepared.facts
    out_console.print(Text(f"record: {facts.record_dir}: verified locally (every file matches "
                           f"its seal); status {facts.record.status}; headline leg {facts.leg}"))
    v = result.verification
    if v is not None:
        n = len(v.issues)
        out_console.print(Text(f"verification: {'verified' if v.verified else 'NOT verified'}"
                               + (f" ({n} issue{'s' if n != 1 else ''})" if n else "")))
        for issue in v.issues:
            out_console.print(Text(f"  verification issue: {issue}"))
    else:
        out_console.print(Text("verification: the service did not say (see the notes below)"))
    _print_warnings(record_cautions(facts.record))


def _print_warnings(warnings: tuple[str, ...] | list[str]) -> None:
    for warning in warnings:
        err_console.print(Text.assemble(("warning: ", "bold yellow"), warning))


def _print_dry_run(result: DryRunResult) -> None:
    built = result.prepared.built
    _print_status_first(result)
    out_console.print(_payload_table(built.payload))
    out_console.print(Text(f"notes: {built.payload.get('notes', '')}"))
    _print_warnings(built.warnings)
    for note in result.notes:
        err_console.print(Text(f"note: {note}"))
    local = "valid" if not result.local_issues else "INVALID: " + "; ".join(result.local_issues)
    out_console.print(Text(f"local schema: {local}"))
    if result.remote is not None and result.remote_valid is not None:
        verdict = "valid" if result.remote_valid else f"INVALID: {result.remote_error}"
        out_console.print(Text(f"dry-run endpoint {result.discovery.dry_run_path}: "
                               f"HTTP {result.remote.status}, {verdict}"))
    out_console.print(Text(f"queue: {result.prepared.queue_path} (sha256 {result.prepared.queue_sha256})"))


def _print_send(result: SendResult) -> None:
    r = result.receipt
    for exchange in result.exchanges:
        waited = f" after waiting {exchange.waited_s:.3f} s" if exchange.waited_s else ""
        out_console.print(Text(f"POST {exchange.url}{waited}: HTTP {exchange.status}"))
    summary = {"accepted": r["accepted"], "http_status": r["http_status"],
               "submission_id": r["submission_id"], "status": r["status"],
               "verified_run": r["verified_run"], "verification_issues": r["verification_issues"],
               "rate_limit": r["rate_limit"], "queue_sha256": r["queue_sha256"]}
    out_console.print_json(json.dumps(summary))
    out_console.print(Text(f"receipt (sealed addendum): {result.receipt_dir}"))


def _print_check(result: CheckResult) -> None:
    c = result.check
    if not result.found:
        out_console.print(Text(f"public row {result.submission_id}: not found "
                               f"(HTTP {result.exchange.status})"))
    else:
        out_console.print(Text(f"public row {result.submission_id} (status {result.public_status}, "
                               f"created {c.get('public_created_at')}): "
                               f"{c['fields_compared']} fields compared, "
                               f"{'all match' if result.match else f'{len(result.mismatches)} differ'}"))
        for m in result.mismatches:
            out_console.print(Text(f"  {m['field']}: sent {m['sent']!r}, public {m['public']!r}"))
    out_console.print(Text(f"check (sealed addendum, {c['checked_utc']}): {result.check_dir}"))


def _print_lifecycle(lifecycle: Lifecycle | None) -> None:
    if lifecycle is None:
        return
    out_console.print(Text(f"submission status: {lifecycle.text()}"))
    for o in lifecycle.observations:
        extra = "" if o.match in (None, True) else "  (public row differs from what was sent)"
        out_console.print(Text(f"  {o.addendum}  {o.utc}  {o.status or ('not found' if not o.found else '?')}"
                               + (f"  createdAt {o.created_at}" if o.created_at else "") + extra))


def _finish_check(checked: Checked, wait: bool) -> None:
    # Each earlier observation is one line of the lifecycle (sealed, as the last one is).
    _print_check(checked.last)
    _print_lifecycle(checked.lifecycle)
    last = checked.last
    if not last.match or last.public_status == "REJECTED":
        raise typer.Exit(3)  # a finding scripts must see, like a failed gate
    if wait and checked.stopped in ("time", "rate limited"):
        err_console.print(Text(f"still {last.public_status} when --wait stopped ({checked.stopped}); "
                               "run --check --wait again later"))
        raise typer.Exit(4)


@app.command("submit")
@_guard
def submit_cmd(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed experiment (tokrecord run).")],
    send_it: Annotated[bool, typer.Option("--send", help="Really submit (needs the API key in the "
                                                        "environment). Default: dry run.")] = False,
    check_it: Annotated[bool, typer.Option(
        "--check", help="Fetch the public row of the earlier submission and record whether it matches.",
    )] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="With --check: poll until the row is APPROVED or REJECTED, sealing every "
        "observation.")] = False,
    wait_max_s: Annotated[float, typer.Option(min=0, help="Most seconds --wait polls, 429 waits "
                                                          "included.")] = 1800.0,
    poll_s: Annotated[float, typer.Option(min=0, help="First pause between polls (grows 1.5x, "
                                                      "to 120 s at most).")] = 10.0,
    allow_unverified: Annotated[bool, typer.Option(
        "--allow-unverified", help="Send even when the service's dry run calls the run "
        "unverified.")] = False,
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
    fingerprint: Annotated[str | None, typer.Option(
        help="Expected signing key fingerprint (SHA256:...), for evidence another key sealed.",
    )] = None,
) -> None:
    """Submit a sealed record to a leaderboard: dry run by default; --send; --check [--wait] later."""
    if send_it and check_it:
        raise SubmitError("--send and --check are separate steps; give one")
    if wait and not check_it:
        raise SubmitError("--wait goes with --check (tokrecord submit DIR --check --wait)")
    tgt = make_target(target, url)
    try:
        if check_it:
            _finish_check(check(directory, tgt, wait=wait, notify=_notify,
                                policy=WaitPolicy(first_s=poll_s, max_s=max(poll_s, 120.0),
                                                  total_s=wait_max_s),
                                bounds=Bounds(max_retries, max_wait_s)), wait)
            return
        options = PayloadOptions(hf_id=hf_id, model_revision=model_revision,
                                 quantization=quantization, engine_name=engine_name)
        key = key_from_env(tgt.key_env, tgt.key_pattern)
        signer = signer_of(directory, fingerprint)
        err_console.print(Text(f"{terminal_safe(str(directory))}: {signer.describe()}"))
        if send_it:
            _submit_send(directory, tgt, options, key, signer, fingerprint, queue=queue,
                         bounds=Bounds(max_retries, max_wait_s),
                         allow_unverified=allow_unverified)
        else:
            _submit_dry_run(directory, tgt, options, key, queue)
    finally:
        tgt.close()


def _submit_send(directory: Path, tgt: Target, options: PayloadOptions, key: ApiKey | None,
                 signer: Signer, fingerprint: str | None, *, queue: Path | None, bounds: Bounds,
                 allow_unverified: bool) -> None:
    # A leaderboard entry speaks for whoever sealed it: never for an unknown key.
    if not signer.pinned or fingerprint not in (None, signer.fingerprint):
        raise SubmitError(f"{directory}: {signer.describe()}: --send sends only evidence "
                          "sealed by the local key, by a key in trusted_keys, or by the "
                          "key given with --fingerprint")
    if key is None:
        raise SubmitError(f"--send needs an API key in ${tgt.key_env} (bhk_ + 40 hex); "
                          "it is read from the environment only and never stored")
    sent = send(directory, tgt, options, key, queue=queue, max_retries=bounds.max_retries,
                max_wait_s=bounds.max_wait_s, allow_unverified=allow_unverified,
                notify=_notify)
    _print_warnings(record_cautions(sent.prepared.facts.record))
    _print_warnings(sent.prepared.built.warnings)
    _print_send(sent)
    if not sent.acceptance.accepted:
        raise SubmitError(f"{tgt.base_url} did not accept the submission: "
                          f"{sent.receipt['error']}; the response is sealed in "
                          f"{sent.receipt_dir}")


def _submit_dry_run(directory: Path, tgt: Target, options: PayloadOptions, key: ApiKey | None,
                    queue: Path | None) -> None:
    if key is not None:
        # Said plainly: the service's dry-run endpoint takes the key (401 without one).
        err_console.print(Text(f"dry run: the payload and your API key (${tgt.key_env}) go "
                               f"to {tgt.base_url} for validation; nothing is submitted"))
    result_dry = dry_run(directory, tgt, options, key=key, queue=queue, notify=_notify)
    _print_dry_run(result_dry)
    if not result_dry.valid:
        raise SubmitError("the payload does not validate; nothing would be sent")
    if result_dry.unverified:
        out_console.print(Text("dry run only: nothing was submitted; the service would not "
                               "verify this run (issues above): --send refuses it unless "
                               "--allow-unverified"))
        return
    out_console.print(Text(f"dry run only: nothing was submitted; send with --send and "
                           f"${tgt.key_env}"))
