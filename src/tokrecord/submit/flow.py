"""Dry run, send and check: the submission flow, the same for every target.

* ``dry_run`` (the default): verify the record, build the payload, write the queue
  file (the exact bytes a send would POST) and validate them: against the service's
  dry-run endpoint when it is reachable, always against the local schema.
* ``send``: the same, then — under the ledger lock, after refusing a record already
  submitted to that service — POST with bounded 429 retries, and seal every
  response received (status, body, rate-limit headers) as a ``submission-receipt``
  addendum beside the record. Only an accepted submission enters the ledger.
* ``check``: fetch the public row of an accepted submission and seal a
  ``submission-check`` addendum recording, field by field and with the time,
  whether it matches what was sent.

The record directory itself is never touched: addenda are separate sealed
directories (``<record>.addenda/NNN-kind``) and the queue file sits beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tokrecord.evidence import canonical_json
from tokrecord.evidence.seal import (
    ADDENDUM_FILE_NAME,
    MANIFEST_NAME,
    SigningKey,
    addenda_dir,
    load_or_create_key,
    verify_seal,
    write_addendum,
)
from tokrecord.identity import sha256_file
from tokrecord.submit.facts import RecordFacts, SubmitError, Verifier, load_facts
from tokrecord.submit.facts import verify_record as default_verify
from tokrecord.submit.ledger import Ledger, normalise_url
from tokrecord.submit.target import (
    Acceptance,
    ApiKey,
    Built,
    Discovery,
    Exchange,
    PayloadOptions,
    Sleep,
    Target,
)

RECEIPT_KIND: Final = "submission-receipt"
CHECK_KIND: Final = "submission-check"
RECEIPT_SCHEMA: Final = "tokrecord.submission-receipt/v1"
CHECK_SCHEMA: Final = "tokrecord.submission-check/v1"

Notify = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


@dataclass(frozen=True)
class Prepared:
    facts: RecordFacts
    built: Built
    body: bytes  # the queue file's bytes: exactly what is POSTed
    queue_path: Path

    @property
    def queue_sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


def default_queue_path(record_dir: Path, target: str, body: bytes) -> Path:
    """``<record>.<target>-<sha256[:12]>.queue.json`` beside the record: named by content,
    so a queue file is never overwritten and an identical rebuild finds its own file."""
    digest = hashlib.sha256(body).hexdigest()[:12]
    return record_dir.with_name(f"{record_dir.name}.{target}-{digest}.queue.json")


def write_queue(path: Path, body: bytes) -> None:
    if path.exists():
        if path.read_bytes() == body:
            return
        raise SubmitError(f"{path} exists with other content; a queue file is never overwritten — "
                          "give another --queue")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as fh:
        fh.write(body)


def prepare(record_dir: Path, target: Target, options: PayloadOptions, *, queue: Path | None = None,
            verify: Verifier = default_verify, notify: Notify = _quiet) -> Prepared:
    notify(f"verifying {record_dir} (hashes, signature, every recomputed figure)")
    facts = load_facts(record_dir, verify)
    built = target.build(facts, options)
    problems = target.validate(built.payload)
    if problems:  # build validates too; this guards a target whose two halves disagree
        raise SubmitError(f"payload breaks the {target.name} schema: {'; '.join(problems)}")
    body = canonical_json(built.payload) + b"\n"
    path = queue or default_queue_path(record_dir, target.name, body)
    write_queue(path, body)
    prepared = Prepared(facts, built, body, path)
    notify(f"queue file {path} (sha256 {prepared.queue_sha256[:16]}…)")
    return prepared


def _schema_notes(payload: Mapping[str, Any], discovery: Discovery) -> list[str]:
    """What the service's own openapi says about our top-level fields."""
    notes: list[str] = []
    if discovery.declared_fields is not None:
        unknown = sorted(set(payload) - set(discovery.declared_fields))
        if unknown:
            notes.append(f"the service's openapi does not declare {', '.join(unknown)}")
    if discovery.required_fields:
        missing = sorted(set(discovery.required_fields) - set(payload))
        if missing:
            notes.append(f"the service's openapi requires {', '.join(missing)}, which the payload lacks")
    return notes


# ------------------------------------------------------------------------- dry run


@dataclass(frozen=True)
class DryRunResult:
    prepared: Prepared
    discovery: Discovery
    local_issues: tuple[str, ...]
    remote: Exchange | None
    remote_valid: bool | None  # None: not validated remotely (see notes)
    notes: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.local_issues and self.remote_valid is not False


def dry_run(record_dir: Path, target: Target, options: PayloadOptions, *, key: ApiKey | None = None,
            queue: Path | None = None, verify: Verifier = default_verify,
            notify: Notify = _quiet) -> DryRunResult:
    prepared = prepare(record_dir, target, options, queue=queue, verify=verify, notify=notify)
    local = tuple(target.validate(prepared.built.payload))
    notify(f"asking {target.base_url} about itself (openapi.json, agent-context)")
    discovery = target.discover()
    notes = [*discovery.notes, *_schema_notes(prepared.built.payload, discovery)]
    remote: Exchange | None = None
    remote_valid: bool | None = None
    if not discovery.reachable:
        notes.append("validated against the local schema only: the service is not reachable")
    else:
        notify(f"dry run: POST {discovery.dry_run_path}")
        remote = target.dry_run(prepared.body, key, discovery)
        if remote.status in (200, 201):
            body = remote.body
            remote_valid = not (isinstance(body, dict) and body.get("valid") is False)
        elif remote.status in (400, 422):
            remote_valid = False
        elif remote.status == 401:
            notes.append(f"the dry-run endpoint needs an API key (set ${target.key_env}); validated "
                         "against the local schema only")
        else:
            notes.append(f"the dry-run endpoint answered {remote.status or remote.error}; validated "
                         "against the local schema only")
    return DryRunResult(prepared, discovery, local, remote, remote_valid, tuple(notes))


# ---------------------------------------------------------------------------- send


@dataclass(frozen=True)
class SendResult:
    prepared: Prepared
    discovery: Discovery
    exchanges: tuple[Exchange, ...]
    acceptance: Acceptance
    receipt: dict[str, Any]
    receipt_dir: Path


def _addendum_receipts(record_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    root = addenda_dir(record_dir)
    out: list[tuple[Path, dict[str, Any]]] = []
    if not root.is_dir():
        return out
    for sub in sorted(root.iterdir()):
        if not sub.name.endswith("-" + RECEIPT_KIND):
            continue
        try:
            doc = json.loads((sub / ADDENDUM_FILE_NAME).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("payload"), dict):
            out.append((sub, doc["payload"]))
    return out


def earlier_submission(record_dir: Path, record_sha256: str, target: Target,
                       ledger: Ledger) -> dict[str, Any] | None:
    """The accepted submission of this record to this service: from the ledger, else from a
    receipt addendum beside the record (the ledger of another machine leaves those)."""
    entry = ledger.submitted(record_sha256, target.name, target.base_url)
    return entry if entry is not None else _receipt_beside(record_dir, record_sha256, target)


def _receipt_beside(record_dir: Path, record_sha256: str, target: Target) -> dict[str, Any] | None:
    for path, receipt in _addendum_receipts(record_dir):
        if (receipt.get("accepted") is True and receipt.get("target") == target.name
                and receipt.get("record_manifest_sha256") == record_sha256
                and normalise_url(str(receipt.get("base_url"))) == normalise_url(target.base_url)):
            return {"submission_id": receipt.get("submission_id"), "utc": receipt.get("sent_utc"),
                    "receipt": str(path), "base_url": receipt.get("base_url")}
    return None


def _retry_after_ms(exchanges: tuple[Exchange, ...]) -> list[Any]:
    return [e.body.get("retryAfterMs") for e in exchanges
            if e.status == 429 and isinstance(e.body, dict)]


def send(record_dir: Path, target: Target, options: PayloadOptions, key: ApiKey, *,
         ledger: Ledger | None = None, queue: Path | None = None, sleep: Sleep = time.sleep,
         max_retries: int = 3, max_wait_s: float = 900.0, signing_key: SigningKey | None = None,
         verify: Verifier = default_verify, notify: Notify = _quiet) -> SendResult:
    ledger = ledger or Ledger.default()
    prepared = prepare(record_dir, target, options, queue=queue, verify=verify, notify=notify)
    facts = prepared.facts
    with ledger.locked():
        earlier = earlier_submission(record_dir, facts.manifest_sha256, target, ledger)
        if earlier is not None:
            raise SubmitError(
                f"this record (manifest sha256 {facts.manifest_sha256[:16]}…) was already submitted "
                f"to {target.base_url}: id {earlier.get('submission_id')} at {earlier.get('utc')} "
                f"(receipt {earlier.get('receipt')}); a record is submitted once — "
                "use --check to compare the public row")
        notify(f"asking {target.base_url} about itself (openapi.json, agent-context)")
        discovery = target.discover()
        if not discovery.reachable:
            raise SubmitError(f"{target.base_url} is not reachable ({'; '.join(discovery.notes)}); "
                              "nothing was sent")

        def waiting(seconds: float) -> None:
            notify(f"rate limited (429): waiting {seconds:.3f} s as retryAfterMs asks")
            sleep(seconds)

        notify(f"sending: POST {discovery.submit_path} with the key from {key.source}")
        exchanges = tuple(target.send(prepared.body, key, discovery, sleep=waiting,
                                      max_retries=max_retries, max_wait_s=max_wait_s))
        if all(e.status is None for e in exchanges):
            raise SubmitError(f"no response from {target.base_url} ({exchanges[-1].error}); the outcome "
                              "is unknown — check the leaderboard before sending again")
        last = next(e for e in reversed(exchanges) if e.status is not None)
        acceptance = target.accept(last)
        receipt: dict[str, Any] = {
            "schema": RECEIPT_SCHEMA,
            "target": target.name,
            "base_url": target.base_url,
            "endpoint": discovery.submit_path,
            "record_manifest_sha256": facts.manifest_sha256,
            "queue_file": prepared.queue_path.name,
            "queue_sha256": prepared.queue_sha256,
            "queue": prepared.built.payload,
            "derivation": list(prepared.built.derivation),
            "warnings": list(prepared.built.warnings),
            "discovery": discovery.to_json(),
            "auth": f"Bearer key from {key.source} (the key itself is never stored)",
            "exchanges": [e.to_json() for e in exchanges],
            "sent_utc": exchanges[0].utc,
            "accepted": acceptance.accepted,
            "http_status": last.status,
            "submission_id": acceptance.submission_id,
            "status": acceptance.status,
            "verified_run": acceptance.verified_run,
            "verification_issues": acceptance.verification_issues,
            "rate_limit": dict(acceptance.rate_limit),
            "retry_after_ms": _retry_after_ms(exchanges),
            "response": last.body,
        }
        # Last line of defence: nothing the service echoed may carry the key to disk.
        receipt = json.loads(key.scrub(json.dumps(receipt)))
        receipt_dir = write_addendum(record_dir, RECEIPT_KIND, receipt,
                                     signing_key or load_or_create_key())
        notify(f"receipt sealed: {receipt_dir}")
        if acceptance.accepted:
            ledger.append({
                "event": "submitted", "record_manifest_sha256": facts.manifest_sha256,
                "target": target.name, "base_url": target.base_url,
                "submission_id": acceptance.submission_id, "status": acceptance.status,
                "http_status": last.status, "utc": last.utc, "record_dir": str(record_dir.resolve()),
                "receipt": str(receipt_dir.resolve()), "queue_sha256": prepared.queue_sha256,
            })
    return SendResult(prepared, discovery, exchanges, acceptance, receipt, receipt_dir)


# --------------------------------------------------------------------------- check


def compare(sent: Any, public: Any, field: str = "") -> list[dict[str, Any]]:
    """One entry per leaf of what was sent: its value, the public row's, and whether they match
    (floats to 1e-9 relative; fields the row adds are not compared)."""
    if isinstance(sent, Mapping):
        out: list[dict[str, Any]] = []
        for key in sorted(sent):
            sub = f"{field}.{key}" if field else str(key)
            if isinstance(public, Mapping) and key in public:
                out += compare(sent[key], public[key], sub)
            else:
                out.append({"field": sub, "sent": sent[key], "public": None, "match": False,
                            "missing": True})
        return out
    if isinstance(sent, float) or isinstance(public, float):
        ok = (isinstance(sent, int | float) and isinstance(public, int | float)
              and not isinstance(sent, bool) and not isinstance(public, bool)
              and math.isclose(float(sent), float(public), rel_tol=1e-9, abs_tol=0.0))
    else:
        ok = type(sent) is type(public) and sent == public
    return [{"field": field, "sent": sent, "public": public, "match": ok}]


@dataclass(frozen=True)
class CheckResult:
    submission_id: str
    exchange: Exchange
    found: bool
    match: bool
    fields: tuple[dict[str, Any], ...]
    public_status: Any
    check: dict[str, Any]
    check_dir: Path

    @property
    def mismatches(self) -> list[dict[str, Any]]:
        return [f for f in self.fields if not f["match"]]


def _load_receipt(path: Path) -> dict[str, Any]:
    problems = verify_seal(path)
    if problems:
        first = "; ".join(f"{p.file}: {p.message}" for p in problems[:2])
        raise SubmitError(f"the receipt {path} does not verify ({first})")
    doc = json.loads((path / ADDENDUM_FILE_NAME).read_text(encoding="utf-8"))
    payload = doc.get("payload") if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or payload.get("schema") != RECEIPT_SCHEMA:
        raise SubmitError(f"{path} is not a {RECEIPT_SCHEMA} receipt")
    return payload


def check(record_dir: Path, target: Target, *, ledger: Ledger | None = None,
          signing_key: SigningKey | None = None, verify: Verifier = default_verify,
          notify: Notify = _quiet) -> CheckResult:
    ledger = ledger or Ledger.default()
    notify(f"verifying {record_dir}")
    facts = load_facts(record_dir, verify)  # an addendum never vouches for altered evidence
    earlier = earlier_submission(record_dir, facts.manifest_sha256, target, ledger)
    if earlier is not None and not Path(str(earlier.get("receipt"))).is_dir():
        # The ledger remembers where the receipt was; a moved record keeps it beside itself.
        earlier = _receipt_beside(record_dir, facts.manifest_sha256, target)
    if earlier is None:
        raise SubmitError(f"no accepted submission of this record to {target.base_url} in the ledger "
                          f"({ledger.path}) or beside the record; nothing to check")
    receipt_dir = Path(str(earlier["receipt"]))
    receipt = _load_receipt(receipt_dir)
    submission_id = str(receipt.get("submission_id"))
    sent = receipt.get("queue") or {}
    discovery = target.discover()
    if not discovery.reachable:
        raise SubmitError(f"{target.base_url} is not reachable ({'; '.join(discovery.notes)})")
    notify(f"fetching the public row {submission_id}")
    exchange = target.fetch(submission_id, discovery)
    found = exchange.status == 200
    row = target.row_fields(exchange.body) if found else {}
    fields = tuple(compare(sent, row)) if found else ()
    match = found and all(f["match"] for f in fields)
    result: dict[str, Any] = {
        "schema": CHECK_SCHEMA,
        "target": target.name,
        "base_url": target.base_url,
        "submission_id": submission_id,
        "record_manifest_sha256": facts.manifest_sha256,
        "receipt_addendum": receipt_dir.name,
        "receipt_manifest_sha256": sha256_file(receipt_dir / MANIFEST_NAME),
        "checked_utc": exchange.utc,
        "found": found,
        "match": match,
        "public_status": row.get("status") if isinstance(row, Mapping) else None,
        "fields_compared": len(fields),
        "mismatches": [f for f in fields if not f["match"]],
        "fields": list(fields),
        "exchange": exchange.to_json(),
    }
    check_dir = write_addendum(record_dir, CHECK_KIND, result, signing_key or load_or_create_key())
    ledger.append({"event": "checked", "record_manifest_sha256": facts.manifest_sha256,
                   "target": target.name, "base_url": target.base_url, "submission_id": submission_id,
                   "match": match, "found": found, "utc": exchange.utc, "check": str(check_dir.resolve())})
    return CheckResult(submission_id, exchange, found, match, fields, result["public_status"], result,
                       check_dir)
