"""A leaderboard target: the small interface every submission destination implements.

A target turns verified ``RecordFacts`` into its own payload (a pure function),
validates a payload against its local schema, and talks HTTP to its service:
discovery (what the service says about itself), dry run, send and fetch of the
public row. The flow in ``tokrecord.submit.flow`` (queue file, ledger, sealed
addenda) is the same for every target.

The API key is a secret: ``ApiKey`` never shows its value in repr, str or
messages, it is only ever placed in an ``Authorization`` header, and every body
or header stored as evidence passes through ``ApiKey.scrub`` first.

Rate limits are honoured in one place, ``with_retries``: a 429 is waited out as the
service asks, within a count and a total time, for every kind of request.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from tokrecord.jsontypes import JSONObject
from tokrecord.submit.facts import RecordFacts, SubmitError

Sleep = Callable[[float], None]


@dataclass(frozen=True)
class ApiKey:
    """A bearer key; its value appears nowhere but in the request header."""

    value: str = field(repr=False)
    source: str  # where it came from, e.g. "$LOCALMAXXING_API_KEY" (never the value)

    def __str__(self) -> str:
        return f"<API key from {self.source}>"

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"}

    def scrub(self, text: str) -> str:
        return text.replace(self.value, "[redacted]") if self.value else text


def key_from_env(env_var: str, pattern: str, environ: Mapping[str, str] | None = None) -> ApiKey | None:
    """The key in ``env_var`` (None when unset); its format is checked, and a bad key is
    described by its length and prefix only, never echoed."""
    raw = (environ if environ is not None else os.environ).get(env_var)
    if raw is None or raw == "":
        return None
    value = raw.strip()
    if not re.fullmatch(pattern, value):
        raise SubmitError(
            f"${env_var} does not hold a well-formed key (expected {pattern!r}; it has "
            f"{len(value)} characters{' and the bhk_ prefix' if value.startswith('bhk_') else ''})")
    return ApiKey(value, f"${env_var}")


@dataclass(frozen=True)
class PayloadOptions:
    """What the user supplies where a record cannot know it (never invented)."""

    hf_id: str | None = None
    model_revision: str | None = None
    quantization: str | None = None
    engine_name: str | None = None


@dataclass(frozen=True)
class Built:
    """A payload and, per field, where it came from (kept in the receipt and printed)."""

    payload: JSONObject
    derivation: tuple[str, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exchange:
    """One HTTP request/response, as stored in evidence (the key scrubbed out)."""

    method: str
    url: str
    status: int | None  # None: no response (connection failed)
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or the text when not JSON
    utc: str
    error: str | None = None
    waited_s: float = 0.0  # slept before this request (429 retryAfterMs)

    def to_json(self) -> ExchangeJSON:
        return {"method": self.method, "url": self.url, "http_status": self.status,
                "headers": dict(self.headers), "body": self.body, "utc": self.utc,
                "error": self.error, "waited_s": self.waited_s}


class ExchangeJSON(TypedDict):
    """An HTTP exchange as evidence keeps it (the key scrubbed out of it first)."""

    method: str
    url: str
    http_status: int | None
    headers: dict[str, str]
    body: Any  # the service's answer, as it came
    utc: str
    error: str | None
    waited_s: float


class DiscoveryJSON(TypedDict):
    reachable: bool
    submit_path: str
    dry_run_path: str
    notes: list[str]
    openapi_sha256: str | None
    agent_context_sha256: str | None
    declared_fields: list[str] | None
    required_fields: list[str] | None


@dataclass(frozen=True)
class Discovery:
    """What the service said about itself before a dry run or a send."""

    reachable: bool
    submit_path: str
    dry_run_path: str
    notes: tuple[str, ...]
    openapi_sha256: str | None = None
    agent_context_sha256: str | None = None
    # Top-level request properties the service's openapi declares (None: unknown).
    declared_fields: tuple[str, ...] | None = None
    required_fields: tuple[str, ...] | None = None

    def to_json(self) -> DiscoveryJSON:
        return {"reachable": self.reachable, "submit_path": self.submit_path,
                "dry_run_path": self.dry_run_path, "notes": list(self.notes),
                "openapi_sha256": self.openapi_sha256,
                "agent_context_sha256": self.agent_context_sha256,
                "declared_fields": list(self.declared_fields) if self.declared_fields is not None else None,
                "required_fields": list(self.required_fields) if self.required_fields is not None else None}


@dataclass(frozen=True)
class Verification:
    """A service's answer to "would this run be verified": from its dry run."""

    verified: bool
    issues: tuple[str, ...]


@dataclass(frozen=True)
class PublicRow:
    """What a public row says, read by its target (field names differ between services)."""

    fields: Mapping[str, Any]  # the row's payload fields, compared with what was sent
    status: str | None
    created_at: str | None
    tok_s: float | None


@dataclass(frozen=True)
class Acceptance:
    """A target's reading of its final response: accepted or not, and the receipt facts."""

    accepted: bool
    submission_id: str | None
    status: str | None
    verified_run: bool | None
    verification_issues: list[Any]
    rate_limit: Mapping[str, str]


class Target(Protocol):
    """A leaderboard. Payload building and validation are pure; the rest is HTTP.

    ``dry_run`` and ``send`` take the exact bytes of the queue file, so what was
    validated, what was sent and what is kept as evidence cannot differ.
    """

    name: str
    base_url: str
    key_env: str
    key_pattern: str

    def build(self, facts: RecordFacts, options: PayloadOptions) -> Built: ...

    def validate(self, payload: Mapping[str, Any]) -> list[str]: ...

    def discover(self) -> Discovery: ...

    def dry_run(self, body: bytes, key: ApiKey | None, discovery: Discovery) -> Exchange: ...

    def send(self, body: bytes, key: ApiKey, discovery: Discovery, *,
             sleep: Sleep, max_retries: int, max_wait_s: float) -> list[Exchange]: ...

    def accept(self, exchange: Exchange) -> Acceptance: ...

    def verification(self, exchange: Exchange) -> Verification | None: ...

    def fetch(self, submission_id: str, discovery: Discovery) -> Exchange: ...

    def row_fields(self, row: Any) -> Mapping[str, Any]: ...

    def public_row(self, exchange: Exchange) -> PublicRow | None: ...

    def retry_after(self, exchange: Exchange) -> float | None: ...

    def explain(self, exchange: Exchange, key: ApiKey | None) -> str: ...

    def close(self) -> None: ...


def with_retries(request: Callable[[float], Exchange], retry_after: Callable[[Exchange], float | None],
                 *, sleep: Sleep, max_retries: int, max_wait_s: float) -> list[Exchange]:
    """``request(waited_s)`` once, then again after each 429 as long as the service says how
    long to wait and the wait keeps within ``max_retries`` and ``max_wait_s`` in total."""
    exchanges: list[Exchange] = []
    waited = 0.0
    total = 0.0
    for attempt in range(max_retries + 1):
        exchange = request(waited)
        exchanges.append(exchange)
        if exchange.status != 429:
            break
        delay = retry_after(exchange)
        if delay is None or attempt == max_retries or total + delay > max_wait_s:
            break
        sleep(delay)
        waited = delay
        total += delay
    return exchanges
