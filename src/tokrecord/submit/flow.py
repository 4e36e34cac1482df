"""Dry run, send and check: the submission flow, the same for every target.

* ``dry_run`` (the default): verify the record, build the payload, write the queue
  file (the exact bytes a send would POST) and validate them: against the service's
  dry-run endpoint when it is reachable (which also says whether the run would be
  *verified*, and why not), always against the local schema.
* ``send``: the same, then — under the ledger lock, after refusing a record already
  submitted to that service — the service's dry run again: a run it calls unverified
  is refused unless ``allow_unverified``. Then POST with bounded 429 retries, and seal
  every response received (status, body, rate-limit headers, ``verifiedRun`` and
  ``verificationIssues``) as a ``submission-receipt`` addendum beside the record.
  Only an accepted submission enters the ledger.
* ``check``: fetch the public row of an accepted submission and seal a
  ``submission-check`` addendum recording, field by field and with the time, whether
  it matches what was sent, its status and the service's ``createdAt``. With
  ``wait``, poll (backing off, within a total time, waiting out 429s) until the row is
  APPROVED or REJECTED, sealing every observation; the submission's status is the
  latest one (``tokrecord.submit.lifecycle``).

The record directory itself is never touched: addenda are separate sealed
directories (``<record>.addenda/NNN-kind``) and the queue file sits beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict

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
from tokrecord.jsontypes import JSONObject
from tokrecord.submit.facts import RecordFacts, SubmitError, Verifier, load_facts
from tokrecord.submit.facts import verify_record as default_verify
from tokrecord.submit.ledger import Ledger, normalise_url
from tokrecord.submit.lifecycle import CHECK_KIND, FINAL, RECEIPT_KIND, Lifecycle, lifecycles
from tokrecord.submit.target import (
    Acceptance,
    ApiKey,
    Built,
    Discovery,
    DiscoveryJSON,
    Exchange,
    ExchangeJSON,
    PayloadOptions,
    Sleep,
    Target,
    Verification,
    with_retries,
)

RECEIPT_SCHEMA: Final = "tokrecord.submission-receipt/v1"
# v2: the service's createdAt, the observation's number in a --wait, the 429s waited out.
CHECK_SCHEMA: Final = "tokrecord.submission-check/v2"

Notify = Callable[[str], None]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Bounds:
    """How long to wait out rate limits (HTTP 429) on any one request."""

    max_retries: int = 3
    max_wait_s: float = 900.0


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
    verification: Verification | None = None  # None: the service did not say
    remote_error: str | None = None  # what a failed dry-run request means, for a person

    @property
    def valid(self) -> bool:
        return not self.local_issues and self.remote_valid is not False

    @property
    def unverified(self) -> bool:
        """The service's dry run says this run would not get the verified-run badge."""
        return self.verification is not None and not self.verification.verified


def _remote_dry_run(target: Target, body: bytes, key: ApiKey | None, discovery: Discovery,
                    sleep: Sleep, bounds: Bounds, notify: Notify) -> Exchange:
    def waiting(seconds: float) -> None:
        notify(f"rate limited (429): waiting {seconds:.3f} s as the service asks")
        sleep(seconds)

    notify(f"dry run: POST {discovery.dry_run_path}")
    return with_retries(lambda _w: target.dry_run(body, key, discovery), target.retry_after,
                        sleep=waiting, max_retries=bounds.max_retries,
                        max_wait_s=bounds.max_wait_s)[-1]


def dry_run(record_dir: Path, target: Target, options: PayloadOptions, *, key: ApiKey | None = None,
            queue: Path | None = None, verify: Verifier = default_verify, sleep: Sleep = time.sleep,
            bounds: Bounds = Bounds(max_wait_s=60.0), notify: Notify = _quiet) -> DryRunResult:
    prepared = prepare(record_dir, target, options, queue=queue, verify=verify, notify=notify)
    local = tuple(target.validate(prepared.built.payload))
    notify(f"asking {target.base_url} about itself (openapi.json, agent-context)")
    discovery = target.discover()
    notes = [*discovery.notes, *_schema_notes(prepared.built.payload, discovery)]
    remote: Exchange | None = None
    remote_valid: bool | None = None
    verification: Verification | None = None
    error: str | None = None
    if not discovery.reachable:
        notes.append("validated against the local schema only: the service is not reachable")
    else:
        remote = _remote_dry_run(target, prepared.body, key, discovery, sleep, bounds, notify)
        if remote.status in (200, 201):
            body = remote.body
            remote_valid = not (isinstance(body, dict) and body.get("valid") is False)
            verification = target.verification(remote)
            if verification is None:
                notes.append("the dry run says nothing of a verified run (no verification object)")
        elif remote.status in (400, 422):
            remote_valid = False
            error = target.explain(remote, key)
        elif remote.status == 401 and key is None:
            notes.append(f"the dry-run endpoint needs an API key (set ${target.key_env}); validated "
                         "against the local schema only, verification unknown")
        else:
            error = target.explain(remote, key)
            notes.append(f"{error}; validated against the local schema only")
    return DryRunResult(prepared, discovery, local, remote, remote_valid, tuple(notes), verification,
                        error)


# ---------------------------------------------------------------------------- send


class VerificationJSON(TypedDict):
    verified: bool
    issues: list[str]


class DryRunJSON(TypedDict):
    exchange: ExchangeJSON
    verification: VerificationJSON | None
    allow_unverified: bool


class Receipt(TypedDict):
    """The submission-receipt addendum's payload (RECEIPT_SCHEMA)."""

    schema: str
    target: str
    base_url: str
    endpoint: str
    record_manifest_sha256: str
    queue_file: str
    queue_sha256: str
    queue: JSONObject  # the payload as sent (the service's wire form)
    derivation: list[str]
    warnings: list[str]
    discovery: DiscoveryJSON
    auth: str
    dry_run: DryRunJSON
    exchanges: list[ExchangeJSON]
    sent_utc: str | None
    accepted: bool
    http_status: int | None
    submission_id: str | None
    status: str | None
    verified_run: bool | None
    verification_issues: list[Any]
    rate_limit: dict[str, str]
    retry_after_ms: list[Any]
    response: Any  # the service's last answer, as it came
    error: str | None


@dataclass(frozen=True)
class SendResult:
    prepared: Prepared
    discovery: Discovery
    exchanges: tuple[Exchange, ...]
    acceptance: Acceptance
    receipt: Receipt
    receipt_dir: Path
    verification: Verification | None = None  # the dry run's, just before the send


def _addendum_receipts(record_dir: Path) -> list[tuple[Path, JSONObject]]:
    root = addenda_dir(record_dir)
    out: list[tuple[Path, JSONObject]] = []
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
                       ledger: Ledger) -> JSONObject | None:
    """The accepted submission of this record to this service: from the ledger, else from a
    receipt addendum beside the record (the ledger of another machine leaves those)."""
    entry = ledger.submitted(record_sha256, target.name, target.base_url)
    return entry if entry is not None else _receipt_beside(record_dir, record_sha256, target)


def _receipt_beside(record_dir: Path, record_sha256: str, target: Target) -> JSONObject | None:
    # A ledger entry's shape, as earlier_submission returns the ledger's own line.
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


def _verification_json(v: Verification | None) -> VerificationJSON | None:
    return None if v is None else {"verified": v.verified, "issues": list(v.issues)}


def send(record_dir: Path, target: Target, options: PayloadOptions, key: ApiKey, *,
         ledger: Ledger | None = None, queue: Path | None = None, sleep: Sleep = time.sleep,
         max_retries: int = 3, max_wait_s: float = 900.0, allow_unverified: bool = False,
         signing_key: SigningKey | None = None, verify: Verifier = default_verify,
         notify: Notify = _quiet) -> SendResult:
    ledger = ledger or Ledger.default()
    bounds = Bounds(max_retries, max_wait_s)
    prepared = prepare(record_dir, target, options, queue=queue, verify=verify, notify=notify)
    facts = prepared.facts
    with ledger.locked():
        _refuse_resubmission(record_dir, facts, target, ledger)
        notify(f"asking {target.base_url} about itself (openapi.json, agent-context)")
        discovery = target.discover()
        if not discovery.reachable:
            raise SubmitError(f"{target.base_url} is not reachable ({'; '.join(discovery.notes)}); "
                              "nothing was sent")
        dry, verification = _dry_run_before_send(target, prepared.body, key, discovery, sleep,
                                                 bounds, notify, allow_unverified)

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
        receipt = _receipt(target, prepared, discovery, key, dry, verification, allow_unverified,
                           exchanges, last, acceptance)
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
    return SendResult(prepared, discovery, exchanges, acceptance, receipt, receipt_dir, verification)


def _refuse_resubmission(record_dir: Path, facts: RecordFacts, target: Target,
                         ledger: Ledger) -> None:
    earlier = earlier_submission(record_dir, facts.manifest_sha256, target, ledger)
    if earlier is not None:
        raise SubmitError(
            f"this record (manifest sha256 {facts.manifest_sha256[:16]}…) was already submitted "
            f"to {target.base_url}: id {earlier.get('submission_id')} at {earlier.get('utc')} "
            f"(receipt {earlier.get('receipt')}); a record is submitted once — "
            "use --check to compare the public row")


def _dry_run_before_send(target: Target, body: bytes, key: ApiKey, discovery: Discovery,
                         sleep: Sleep, bounds: Bounds, notify: Notify, allow_unverified: bool
                         ) -> tuple[Exchange, Verification | None]:
    """The service's dry run just before the send: a failure, an invalid payload or (unless
    allowed) an unverified run stops the send."""
    dry = _remote_dry_run(target, body, key, discovery, sleep, bounds, notify)
    verification = target.verification(dry) if dry.status in (200, 201) else None
    if dry.status in (400, 401, 403, 422, 429) or dry.status is None:
        raise SubmitError(f"the dry run before the send failed, nothing was sent: "
                          f"{target.explain(dry, key)}")
    if isinstance(dry.body, dict) and dry.body.get("valid") is False:
        raise SubmitError("the service's dry run calls the payload invalid "
                          f"({json.dumps(dry.body)[:400]}); nothing was sent")
    if verification is not None and not verification.verified:
        listed = "; ".join(verification.issues) or "no reason given"
        if not allow_unverified:
            raise SubmitError(f"the service's dry run calls this run unverified ({listed}); "
                              "nothing was sent — fix what it names, or send anyway with "
                              "--allow-unverified")
        notify(f"sending an unverified run (--allow-unverified): {listed}")
    return dry, verification


def _receipt(target: Target, prepared: Prepared, discovery: Discovery, key: ApiKey,
             dry: Exchange, verification: Verification | None, allow_unverified: bool,
             exchanges: tuple[Exchange, ...], last: Exchange, acceptance: Acceptance
             ) -> Receipt:
    """The submission-receipt addendum: every response received, with what was sent."""
    receipt: Receipt = {
        "schema": RECEIPT_SCHEMA,
        "target": target.name,
        "base_url": target.base_url,
        "endpoint": discovery.submit_path,
        "record_manifest_sha256": prepared.facts.manifest_sha256,
        "queue_file": prepared.queue_path.name,
        "queue_sha256": prepared.queue_sha256,
        "queue": prepared.built.payload,
        "derivation": list(prepared.built.derivation),
        "warnings": list(prepared.built.warnings),
        "discovery": discovery.to_json(),
        "auth": f"Bearer key from {key.source} (the key itself is never stored)",
        "dry_run": {"exchange": dry.to_json(), "verification": _verification_json(verification),
                    "allow_unverified": allow_unverified},
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
        "error": None if acceptance.accepted else target.explain(last, key),
    }
    # Last line of defence: nothing the service echoed may carry the key to disk.
    scrubbed: Receipt = json.loads(key.scrub(json.dumps(receipt)))
    return scrubbed


# --------------------------------------------------------------------------- check


class FieldComparison(TypedDict):
    field: str
    sent: Any
    public: Any
    match: bool
    missing: NotRequired[bool]  # the public row lacks the field


def compare(sent: Any, public: Any, field: str = "") -> list[FieldComparison]:
    """One entry per leaf of what was sent: its value, the public row's, and whether they match
    (floats to 1e-9 relative; fields the row adds are not compared)."""
    if isinstance(sent, Mapping):
        out: list[FieldComparison] = []
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


class CheckRecord(TypedDict):
    """The submission-check addendum's payload (CHECK_SCHEMA)."""

    schema: str
    target: str
    base_url: str
    submission_id: str
    record_manifest_sha256: str
    receipt_addendum: str
    receipt_manifest_sha256: str
    observation: int
    wait: bool
    checked_utc: str | None
    found: bool
    match: bool
    public_status: Any  # as the service said it
    public_created_at: Any
    fields_compared: int
    mismatches: list[FieldComparison]
    fields: list[FieldComparison]
    exchange: ExchangeJSON
    rate_limited: list[ExchangeJSON]
    text: str


@dataclass(frozen=True)
class CheckResult:
    submission_id: str
    exchange: Exchange
    found: bool
    match: bool
    fields: tuple[FieldComparison, ...]
    public_status: Any
    check: CheckRecord
    check_dir: Path

    @property
    def mismatches(self) -> list[FieldComparison]:
        return [f for f in self.fields if not f["match"]]


@dataclass(frozen=True)
class WaitPolicy:
    """How ``--check --wait`` polls: the first pause, growing by ``factor`` up to ``max_s``,
    all of it (429 waits included) within ``total_s``."""

    first_s: float = 10.0
    factor: float = 1.5
    max_s: float = 120.0
    total_s: float = 1800.0

    def pauses(self) -> Iterator[float]:
        pause = self.first_s
        while True:
            yield pause
            pause = min(pause * self.factor, self.max_s)


@dataclass(frozen=True)
class Checked:
    """Every observation one ``check`` made (one without ``wait``), the last one, and why
    it stopped."""

    observations: tuple[CheckResult, ...]
    lifecycle: Lifecycle | None
    stopped: str  # "once" | "final" | "not found" | "time" | "rate limited"

    @property
    def last(self) -> CheckResult:
        return self.observations[-1]


def _load_receipt(path: Path) -> JSONObject:
    problems = verify_seal(path)
    if problems:
        first = "; ".join(f"{p.file}: {p.message}" for p in problems[:2])
        raise SubmitError(f"the receipt {path} does not verify ({first})")
    doc = json.loads((path / ADDENDUM_FILE_NAME).read_text(encoding="utf-8"))
    payload = doc.get("payload") if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or payload.get("schema") != RECEIPT_SCHEMA:
        raise SubmitError(f"{path} is not a {RECEIPT_SCHEMA} receipt")
    return payload


def _observe(record_dir: Path, target: Target, facts: RecordFacts, receipt_dir: Path,
             receipt: Mapping[str, Any], discovery: Discovery, number: int, waiting: bool,
             sleep: Sleep, bounds: Bounds, key: SigningKey, ledger: Ledger,
             notify: Notify) -> CheckResult:
    """One look at the public row, sealed as a submission-check addendum."""
    submission_id = str(receipt.get("submission_id"))
    sent = receipt.get("queue") or {}

    def wait_429(seconds: float) -> None:
        notify(f"rate limited (429): waiting {seconds:.3f} s as the service asks")
        sleep(seconds)

    notify(f"fetching the public row {submission_id}")
    exchanges = with_retries(lambda _w: target.fetch(submission_id, discovery), target.retry_after,
                             sleep=wait_429, max_retries=bounds.max_retries,
                             max_wait_s=bounds.max_wait_s)
    exchange = exchanges[-1]
    row = target.public_row(exchange)
    found = row is not None
    fields = tuple(compare(sent, row.fields)) if row is not None else ()
    match = found and all(f["match"] for f in fields)
    status = row.status if row is not None else None
    mismatched = [f for f in fields if not f["match"]]
    if row is not None:
        text = (f"public row {submission_id}: {status} (created {row.created_at}); {len(fields)} fields "
                + ("all match" if match else f"{len(mismatched)} differ: "
                   + ", ".join(f["field"] for f in mismatched)))
    else:
        text = f"public row {submission_id}: not found ({target.explain(exchange, None)})"
    result: CheckRecord = {
        "schema": CHECK_SCHEMA,
        "target": target.name,
        "base_url": target.base_url,
        "submission_id": submission_id,
        "record_manifest_sha256": facts.manifest_sha256,
        "receipt_addendum": receipt_dir.name,
        "receipt_manifest_sha256": sha256_file(receipt_dir / MANIFEST_NAME),
        "observation": number,
        "wait": waiting,
        "checked_utc": exchange.utc,
        "found": found,
        "match": match,
        "public_status": status,
        "public_created_at": row.created_at if row is not None else None,
        "fields_compared": len(fields),
        "mismatches": mismatched,
        "fields": list(fields),
        "exchange": exchange.to_json(),
        "rate_limited": [e.to_json() for e in exchanges[:-1]],
        "text": text,
    }
    check_dir = write_addendum(record_dir, CHECK_KIND, result, key)
    notify(f"observation {number} sealed: {check_dir.name}: {text}")
    ledger.append({"event": "checked", "record_manifest_sha256": facts.manifest_sha256,
                   "target": target.name, "base_url": target.base_url, "submission_id": submission_id,
                   "match": match, "found": found, "status": status, "utc": exchange.utc,
                   "check": str(check_dir.resolve())})
    return CheckResult(submission_id, exchange, found, match, fields, status, result, check_dir)


def submission_lifecycle(record_dir: Path, target: Target) -> Lifecycle | None:
    """This record's latest submission to ``target``'s service, as its sealed addenda say."""
    root = addenda_dir(record_dir)
    docs: list[tuple[str, Any]] = []
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            try:
                docs.append((sub.name, json.loads((sub / ADDENDUM_FILE_NAME).read_text(encoding="utf-8"))))
            except (OSError, json.JSONDecodeError, UnicodeDecodeError):
                continue
    mine = [lc for lc in lifecycles(docs) if lc.target == target.name
            and normalise_url(lc.base_url) == normalise_url(target.base_url)]
    return mine[-1] if mine else None


def check(record_dir: Path, target: Target, *, ledger: Ledger | None = None,
          signing_key: SigningKey | None = None, verify: Verifier = default_verify,
          wait: bool = False, policy: WaitPolicy = WaitPolicy(), bounds: Bounds = Bounds(),
          sleep: Sleep = time.sleep, clock: Clock = time.monotonic,
          notify: Notify = _quiet) -> Checked:
    """Observe the public row once, or with ``wait`` until it is final (or time is up)."""
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
    discovery = target.discover()
    if not discovery.reachable:
        raise SubmitError(f"{target.base_url} is not reachable ({'; '.join(discovery.notes)})")
    key = signing_key or load_or_create_key()
    start = clock()

    def remaining() -> float:
        return max(0.0, policy.total_s - (clock() - start))

    observations: list[CheckResult] = []
    pauses = policy.pauses()
    stopped = "once"
    while True:
        per_request = Bounds(bounds.max_retries, min(bounds.max_wait_s, remaining()) if wait
                             else bounds.max_wait_s)
        result = _observe(record_dir, target, facts, receipt_dir, receipt, discovery,
                          len(observations) + 1, wait, sleep, per_request, key, ledger, notify)
        observations.append(result)
        if not wait:
            break
        if result.exchange.status == 429:
            stopped = "rate limited"
            break
        if not result.found:
            stopped = "not found"
            break
        if result.public_status in FINAL:
            stopped = "final"
            break
        pause = next(pauses)
        if pause > remaining():
            stopped = "time"
            break
        notify(f"status {result.public_status}: next look in {pause:g} s "
               f"({remaining():.0f} s of --wait-max-s left)")
        sleep(pause)
    return Checked(tuple(observations), submission_lifecycle(record_dir, target), stopped)
