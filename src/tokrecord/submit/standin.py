"""A local stand-in for the LocalMaxxing API: the submission contract, served.

Users run it to rehearse a submission end to end without touching the public
leaderboard (``python -m tokrecord.submit.standin --port 8787``, then
``tokrecord submit DIR --url http://127.0.0.1:8787 --send``); the tests use it as
the service. Standard library only, like the fake OpenAI server.

Routes (``BASE`` is ``/api/speed-tests``, or ``/api/benchmarks`` with
``--api benchmarks``, to rehearse the older name):

    GET  /api/openapi.json     OpenAPI 3.1 with the local schema of the payload
    GET  /api/agent-context    the endpoints, auth and rate limit, machine-readable
    POST BASE/dry-run          401 without a key; 400 + issues (and suggestedHfId), or
                               200 {valid: true, verification: {verified, issues}}
    POST BASE                  401 without a key; 400 bad payload; 429 past the rate
                               limit (body retryAfterMs, header Retry-After); 201
                               {id, status, verifiedRun, verificationIssues} with
                               X-RateLimit-Remaining / X-RateLimit-Reset
    GET  BASE/{id}             the public row: id, status, createdAt and the payload
                               (a submission's, or one of the --rows given at start,
                               such as a plan's prior); 429 past --poll-rate-limit
    PATCH BASE/{id}            (--allow-edits only) change fields of a row, to
                               rehearse a public row that no longer matches

Keys: any ``bhk_`` + 40 hex is accepted, or with ``--key-sha256`` only the key
with that sha256 (so a test never has to put the key itself on a command line).
The rate limit is a sliding window per key over accepted submissions (default:
1 per 300 s, the public service's).

Approval: a submitted row is PENDING; with ``--approve-after N`` (or
``--reject-after N``) it becomes APPROVED (REJECTED, with ``rejectionReason``) on
the Nth GET of it, so a rehearsal of ``--check --wait`` sees the whole lifecycle;
``--approve`` makes rows APPROVED at once.

Verification (``verification`` in the dry run, ``verifiedRun`` and
``verificationIssues`` on submit) follows the evidence the lmx CLI's reference lists
for the verified-run badge: promptSha256, promptSample, outputSha256, outputSample and
engineTimingsRaw present; batchSize and engineFlags.concurrency 1; engineFlags.temperature
given; speculative runs with specDraftTokens and specAcceptedTokens; engineVersion or
engineCommit; and, with ``--min-output-tokens``, enough output tokens. The public
service's own checks are its business: these are the documented ones.

The CDN: ``--block-user-agent TEXT`` answers any request whose User-Agent contains
TEXT with an HTML 403 from a CDN (headers ``Server: cloudflare``, ``cf-mitigated``),
as the public site's CDN does for some default client user agents. ``--unknown-hf-id
ID=SUGGESTION`` refuses a payload naming ID with a 400 carrying field errors and
``suggestedHfId``.

``--log FILE`` (JSONL, created exclusively) records every request: method, path,
status, whether a bearer key was present, and the JSON body; never the
Authorization header.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import IO, Any, cast

from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.jsontypes import JSONObject
from tokrecord.server.httpd import LocalHTTPServer
from tokrecord.submit.contract import KEY_PATTERN, SpeedTest, issues

OPENAPI = "/api/openapi.json"
AGENT_CONTEXT = "/api/agent-context"
APIS = {"speed-tests": "/api/speed-tests", "benchmarks": "/api/benchmarks"}


@dataclass(frozen=True)
class StandinConfig:
    host: str = "127.0.0.1"
    port: int = 0
    api: str = "speed-tests"
    rate_limit: int = 1
    window_s: float = 300.0
    log: Path | None = None
    key_sha256: str | None = None
    approve: bool = False
    allow_edits: bool = False
    approve_after: int | None = None  # GETs of a row until it is APPROVED
    reject_after: int | None = None  # ... or REJECTED
    reject_reason: str = "rejected by the stand-in (--reject-after)"
    rows: Path | None = None  # JSON list of public rows served from the start
    min_output_tokens: int = 0
    block_user_agents: tuple[str, ...] = ()
    unknown_hf_ids: tuple[tuple[str, str], ...] = ()  # (hfId, suggestedHfId)
    poll_rate_limit: int | None = None  # GETs of rows per window (all clients)
    poll_window_s: float = 60.0

    @property
    def base(self) -> str:
        return APIS[self.api]


def openapi_document(config: StandinConfig) -> JSONObject:
    schema = SpeedTest.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas: JSONObject = schema.pop("$defs", {})
    schemas["SpeedTest"] = schema
    body = {"required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SpeedTest"}}}}
    base = config.base
    return {
        "openapi": "3.1.0",
        "info": {"title": "LocalMaxxing stand-in (tokrecord)", "version": "local-v1"},
        "paths": {
            base: {"post": {"summary": "Submit a speed test", "security": [{"bearer": []}],
                            "requestBody": body,
                            "responses": {"201": {"description": "accepted (approval is separate)"},
                                          "400": {"description": "invalid payload"},
                                          "401": {"description": "missing or invalid key"},
                                          "429": {"description": "rate limited; retryAfterMs"}}}},
            base + "/dry-run": {"post": {"summary": "Validate without submitting",
                                         "security": [{"bearer": []}], "requestBody": body,
                                         "responses": {"200": {"description": "valid"},
                                                       "400": {"description": "invalid payload"},
                                                       "401": {"description": "missing key"}}}},
            base + "/{id}": {"get": {"summary": "A public row",
                                     "parameters": [{"name": "id", "in": "path", "required": True,
                                                     "schema": {"type": "string"}}],
                                     "responses": {"200": {"description": "the row"},
                                                   "404": {"description": "no such row"}}}},
        },
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def agent_context(config: StandinConfig, url: str) -> JSONObject:
    return {
        "_meta": {
            "description": "tokrecord's local stand-in for the LocalMaxxing submission API",
            "submitEndpoint": f"POST {url}{config.base}",
            "dryRunEndpoint": f"POST {url}{config.base}/dry-run",
            "auth": "Authorization: Bearer bhk_<40 hex chars>",
            "rateLimit": f"{config.rate_limit} submission(s) per {config.window_s:g} s per API key",
            "rateLimitHeaders": {"X-RateLimit-Remaining": "submissions left in the window",
                                 "X-RateLimit-Reset": "Unix time (s) when the window resets"},
        },
        "requiredFields": ["hfId", "hardware", "engineName", "quantization", "tokSOut"],
        "atLeastOneMetricRequired": ["tokSPrefill", "tokSTotal", "ttftMs", "peakVramGb"],
    }


def verification_issues(payload: JSONObject, config: StandinConfig) -> list[str]:
    """Why a valid payload would not be a verified run (see the module docstring)."""
    out = [f"{name} missing" for name in ("promptSha256", "promptSample", "outputSha256",
                                          "outputSample", "engineTimingsRaw") if name not in payload]
    flags = payload.get("engineFlags") or {}
    if payload.get("batchSize") != 1:
        out.append("batchSize must be 1 for a verified run")
    if flags.get("concurrency") != 1:
        out.append("engineFlags.concurrency must be 1 for a verified run")
    if "temperature" not in flags:
        out.append("engineFlags.temperature missing")
    if flags.get("specDecoding") and not {"specDraftTokens", "specAcceptedTokens"} <= set(flags):
        out.append("speculative run without engineFlags.specDraftTokens and specAcceptedTokens")
    if "engineVersion" not in payload and "engineCommit" not in payload:
        out.append("engineVersion or engineCommit missing")
    n = payload.get("outputTokens")
    if config.min_output_tokens and (not isinstance(n, int) or n < config.min_output_tokens):
        out.append(f"outputTokens {n} below {config.min_output_tokens}")
    return out


def load_rows(path: Path) -> dict[str, JSONObject]:
    """Rows to serve from the start (``--rows``): a JSON list of objects, each with an id."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(r, dict) and r.get("id") for r in data):
        raise ValueError(f"{path}: --rows takes a JSON list of objects, each with an id")
    return {str(r["id"]): dict(r) for r in data}


CDN_PAGE = (b"<!DOCTYPE html><html><head><title>Attention Required!</title></head><body>"
            b"<h1>Sorry, you have been blocked</h1></body></html>")


def _utc_ms() -> str:
    return utc_stamp(Stamp.MILLISECONDS)


class StandinServer(LocalHTTPServer):
    daemon_threads = True

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.rows: dict[str, JSONObject] = load_rows(config.rows) if config.rows else {}
        self.polls: collections.Counter[str] = collections.Counter()
        self.accepted: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.lock = threading.Lock()
        self._log: IO[bytes] | None = open(config.log, "xb") if config.log else None  # noqa: SIM115
        try:
            super().__init__((config.host, config.port), _Handler)
        except BaseException:
            self.close_log()
            raise


    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.server_port}"

    def log(self, entry: JSONObject) -> None:
        if self._log is None:
            return
        with self.lock:
            self._log.write(json.dumps(entry, sort_keys=True).encode() + b"\n")
            self._log.flush()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def server_close(self) -> None:
        super().server_close()
        self.close_log()

    def take_slot(self, key_id: str, limit: int | None = None,
                  window_s: float | None = None) -> tuple[bool, float, int, float]:
        """(allowed, retry_after_s, remaining, reset_unix) for one more request now
        (a submission by default; row GETs pass their own limit)."""
        cfg = self.config
        limit = cfg.rate_limit if limit is None else limit
        span = cfg.window_s if window_s is None else window_s
        now = time.time()
        with self.lock:
            window = self.accepted[key_id]
            while window and window[0] + span <= now:
                window.popleft()
            if len(window) >= limit:
                return False, window[0] + span - now, 0, window[0] + span
            window.append(now)
            return True, 0.0, limit - len(window), window[0] + span

    def poll(self, row_id: str) -> JSONObject | None:
        """A public row as one more GET sees it (the approval lifecycle moves on GETs)."""
        cfg = self.config
        with self.lock:
            row = self.rows.get(row_id)
            if row is None:
                return None
            self.polls[row_id] += 1
            n = self.polls[row_id]
            if row.get("status") == "PENDING":
                if cfg.reject_after is not None and n >= cfg.reject_after:
                    row.update(status="REJECTED", rejectionReason=cfg.reject_reason,
                               reviewedAt=_utc_ms())
                elif cfg.approve_after is not None and n >= cfg.approve_after:
                    row.update(status="APPROVED", reviewedAt=_utc_ms())
            return dict(row)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tokrecord-localmaxxing-standin/1"
    _as_cdn = False  # answering as the CDN (its Server header)

    @property
    def standin(self) -> StandinServer:
        return cast(StandinServer, self.server)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("standin: " + (format % args) + "\n")

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None,
               request_body: Any = None, auth: str = "none", content_type: str = "application/json",
               ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.standin.log({"utc": _utc_ms(), "method": self.command, "path": self.path,
                          "status": status, "auth": auth, "body": request_body})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _auth(self) -> tuple[str, str | None]:
        """("bearer" | "none" | "malformed" | "unknown", key id) — the key is only hashed."""
        header = self.headers.get("Authorization") or ""
        if not header:
            return "none", None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not re.fullmatch(KEY_PATTERN, token.strip()):
            return "malformed", None
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        expected = self.standin.config.key_sha256
        if expected is not None and digest != expected:
            return "unknown", None
        return "bearer", digest

    def _cdn_blocked(self) -> bool:
        """The CDN in front of the public site refuses some user agents before the API."""
        agent = self.headers.get("User-Agent") or ""
        if not any(text in agent for text in self.standin.config.block_user_agents):
            self._as_cdn = False
            return False
        self._as_cdn = True  # the Server header names the CDN, not the stand-in
        self._reply(403, CDN_PAGE, headers={"cf-mitigated": "challenge",
                                            "cf-ray": "0000000000000000-LHR"},
                    content_type="text/html; charset=UTF-8")
        return True

    def version_string(self) -> str:
        return "cloudflare" if self._as_cdn else super().version_string()

    def _rate_limited(self, key_id: str, limit: int | None = None, window_s: float | None = None,
                      request_body: Any = None, auth: str = "none") -> tuple[bool, int, float]:
        """Answer 429 when the window is full; else (False, remaining, reset)."""
        allowed, retry_s, remaining, reset = self.standin.take_slot(key_id, limit, window_s)
        if allowed:
            return False, remaining, reset
        retry_ms = max(1, math.ceil(retry_s * 1000))
        self._reply(429, {"error": "Rate limit exceeded", "retryAfterMs": retry_ms},
                    headers={"Retry-After": str(math.ceil(retry_s)), "X-RateLimit-Remaining": "0",
                             "X-RateLimit-Reset": str(math.ceil(reset))},
                    request_body=request_body, auth=auth)
        return True, 0, reset

    def do_GET(self) -> None:
        cfg = self.standin.config
        if self._cdn_blocked():
            return
        if self.path == OPENAPI:
            self._reply(200, openapi_document(cfg))
        elif self.path == AGENT_CONTEXT:
            self._reply(200, agent_context(cfg, self.standin.url))
        elif self.path.startswith(cfg.base + "/"):
            if cfg.poll_rate_limit is not None and self._rate_limited(
                    "poll", cfg.poll_rate_limit, cfg.poll_window_s)[0]:
                return
            row = self.standin.poll(self.path[len(cfg.base) + 1:])
            if row is None:
                self._reply(404, {"error": "Not found"})
            else:
                self._reply(200, row)
        else:
            self._reply(404, {"error": "Not found"})

    def do_POST(self) -> None:
        cfg = self.standin.config
        if self.path not in (cfg.base, cfg.base + "/dry-run"):
            self._body()
            self._reply(404, {"error": "Not found"})
            return
        raw = self._body()
        if self._cdn_blocked():
            return
        auth, key_id = self._auth()
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            payload = None
        if key_id is None:
            self._reply(401, {"error": "Unauthorized: a valid API key is required"},
                        request_body=payload, auth=auth)
            return
        if payload is None:
            self._reply(400, {"error": "Body is not JSON"}, auth=auth)
            return
        problems = issues(payload)
        if problems:
            self._reply(400, {"error": "Validation failed", "issues": problems},
                        request_body=payload, auth=auth)
            return
        suggestion = dict(cfg.unknown_hf_ids).get(str(payload.get("hfId")))
        if suggestion is not None:
            self._reply(400, {"error": "Unknown model",
                              "fieldErrors": {"hfId": [f"{payload.get('hfId')} is not a known "
                                                       "Hugging Face model"]},
                              "suggestedHfId": suggestion}, request_body=payload, auth=auth)
            return
        unverified = verification_issues(payload, cfg)
        if self.path.endswith("/dry-run"):
            self._reply(200, {"valid": True, "issues": [], "warnings": [],
                              "verification": {"verified": not unverified, "issues": unverified}},
                        request_body=payload, auth=auth)
            return
        limited, remaining, reset = self._rate_limited(key_id, request_body=payload, auth=auth)
        if limited:
            return
        row_id = "st_" + uuid.uuid4().hex[:22]
        status = "APPROVED" if cfg.approve else "PENDING"
        row = {**payload, "id": row_id, "status": status, "createdAt": _utc_ms(),
               "verifiedRun": not unverified}
        with self.standin.lock:
            self.standin.rows[row_id] = row
        self._reply(201, {"id": row_id, "status": status, "verifiedRun": not unverified,
                          "verificationIssues": unverified},
                    headers={"X-RateLimit-Remaining": str(remaining),
                             "X-RateLimit-Reset": str(math.ceil(reset)),
                             "Location": f"{cfg.base}/{row_id}"},
                    request_body=payload, auth=auth)

    def do_PATCH(self) -> None:
        cfg = self.standin.config
        raw = self._body()
        row_id = self.path[len(cfg.base) + 1:] if self.path.startswith(cfg.base + "/") else ""
        if not cfg.allow_edits:
            self._reply(405, {"error": "Method not allowed (start the stand-in with --allow-edits)"})
            return
        try:
            change = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            change = None
        if not isinstance(change, dict):
            self._reply(400, {"error": "Body must be a JSON object"})
            return
        with self.standin.lock:
            row = self.standin.rows.get(row_id)
            if row is not None:
                row.update(change)
                row = dict(row)
        if row is None:
            self._reply(404, {"error": "Not found"}, request_body=change)
        else:
            self._reply(200, row, request_body=change)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tokrecord.submit.standin",
                                description="Local stand-in for the LocalMaxxing submission API.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    p.add_argument("--api", choices=sorted(APIS), default="speed-tests",
                   help="endpoint name to serve (benchmarks: the older one)")
    p.add_argument("--rate-limit", type=int, default=1, help="accepted submissions per window per key")
    p.add_argument("--window-s", type=float, default=300.0, help="rate-limit window in seconds")
    p.add_argument("--log", type=Path, help="JSONL request log (created exclusively)")
    p.add_argument("--key-sha256", help="accept only the key with this sha256 (hex)")
    p.add_argument("--approve", action="store_true", help="rows start APPROVED instead of PENDING")
    p.add_argument("--approve-after", type=int, metavar="N",
                   help="a PENDING row becomes APPROVED on its Nth GET")
    p.add_argument("--reject-after", type=int, metavar="N",
                   help="a PENDING row becomes REJECTED on its Nth GET")
    p.add_argument("--reject-reason", default=StandinConfig.reject_reason)
    p.add_argument("--allow-edits", action="store_true", help="enable PATCH of public rows")
    p.add_argument("--rows", type=Path, help="JSON list of public rows to serve (e.g. a prior)")
    p.add_argument("--min-output-tokens", type=int, default=0,
                   help="verification: fewer output tokens is an issue (0: no such rule)")
    p.add_argument("--block-user-agent", action="append", default=[], metavar="TEXT",
                   help="answer user agents containing TEXT with a CDN's HTML 403")
    p.add_argument("--unknown-hf-id", action="append", default=[], metavar="ID=SUGGESTION",
                   help="refuse hfId ID with a 400 suggesting SUGGESTION")
    p.add_argument("--poll-rate-limit", type=int, metavar="N", help="row GETs per --poll-window-s")
    p.add_argument("--poll-window-s", type=float, default=60.0)
    return p


def config_from_args(argv: Sequence[str] | None = None) -> StandinConfig:
    a = _parser().parse_args(argv)
    if a.rate_limit < 1 or a.window_s <= 0:
        _parser().error("--rate-limit must be >= 1 and --window-s > 0")
    if any(n is not None and n < 1 for n in (a.approve_after, a.reject_after, a.poll_rate_limit)):
        _parser().error("--approve-after, --reject-after and --poll-rate-limit take N >= 1")
    pairs = []
    for item in a.unknown_hf_id:
        name, sep, suggestion = item.partition("=")
        if not sep or not name or not suggestion:
            _parser().error(f"--unknown-hf-id takes ID=SUGGESTION, got {item!r}")
        pairs.append((name, suggestion))
    return StandinConfig(host=a.host, port=a.port, api=a.api, rate_limit=a.rate_limit,
                         window_s=a.window_s, log=a.log, key_sha256=a.key_sha256, approve=a.approve,
                         allow_edits=a.allow_edits, approve_after=a.approve_after,
                         reject_after=a.reject_after, reject_reason=a.reject_reason, rows=a.rows,
                         min_output_tokens=a.min_output_tokens,
                         block_user_agents=tuple(a.block_user_agent), unknown_hf_ids=tuple(pairs),
                         poll_rate_limit=a.poll_rate_limit, poll_window_s=a.poll_window_s)


def main(argv: Sequence[str] | None = None) -> int:
    config = config_from_args(argv)
    try:
        server = StandinServer(config)
    except (OSError, ValueError) as exc:
        print(f"error: the stand-in cannot serve: {exc}", file=sys.stderr)
        return 1
    with server:
        print(f"tokrecord LocalMaxxing stand-in listening on {server.url}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
