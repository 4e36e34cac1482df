"""A local stand-in for the LocalMaxxing API: the submission contract, served.

Users run it to rehearse a submission end to end without touching the public
leaderboard (``python -m tokrecord.submit.standin --port 8787``, then
``tokrecord submit DIR --url http://127.0.0.1:8787 --send``); the tests use it as
the service. Standard library only, like the fake OpenAI server.

Routes (``BASE`` is ``/api/speed-tests``, or ``/api/benchmarks`` with
``--api benchmarks``, to rehearse the older name):

    GET  /api/openapi.json     OpenAPI 3.1 with the local schema of the payload
    GET  /api/agent-context    the endpoints, auth and rate limit, machine-readable
    POST BASE/dry-run          401 without a key; 400 + issues, or 200 {valid: true}
    POST BASE                  401 without a key; 400 bad payload; 429 past the rate
                               limit (body retryAfterMs, header Retry-After); 201
                               {id, status, verifiedRun, verificationIssues} with
                               X-RateLimit-Remaining / X-RateLimit-Reset
    GET  BASE/{id}             the public row: id, status, createdAt and the payload
    PATCH BASE/{id}            (--allow-edits only) change fields of a row, to
                               rehearse a public row that no longer matches

Keys: any ``bhk_`` + 40 hex is accepted, or with ``--key-sha256`` only the key
with that sha256 (so a test never has to put the key itself on a command line).
The rate limit is a sliding window per key over accepted submissions (default:
1 per 300 s, the public service's). ``verifiedRun`` here means the payload
carries both evidence hashes; the public service's own checks are its business.

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
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import IO, Any, cast

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

    @property
    def base(self) -> str:
        return APIS[self.api]


def openapi_document(config: StandinConfig) -> dict[str, Any]:
    schema = SpeedTest.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = schema.pop("$defs", {})
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


def agent_context(config: StandinConfig, url: str) -> dict[str, Any]:
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


def _utc_ms() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class StandinServer(LocalHTTPServer):
    daemon_threads = True

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.rows: dict[str, dict[str, Any]] = {}
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

    def log(self, entry: dict[str, Any]) -> None:
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

    def take_slot(self, key_id: str) -> tuple[bool, float, int, float]:
        """(allowed, retry_after_s, remaining, reset_unix) for one more submission now."""
        cfg = self.config
        now = time.time()
        with self.lock:
            window = self.accepted[key_id]
            while window and window[0] + cfg.window_s <= now:
                window.popleft()
            if len(window) >= cfg.rate_limit:
                return False, window[0] + cfg.window_s - now, 0, window[0] + cfg.window_s
            window.append(now)
            return True, 0.0, cfg.rate_limit - len(window), window[0] + cfg.window_s


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tokrecord-localmaxxing-standin/1"

    @property
    def standin(self) -> StandinServer:
        return cast(StandinServer, self.server)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("standin: " + (format % args) + "\n")

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None,
               request_body: Any = None, auth: str = "none") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
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

    def do_GET(self) -> None:
        cfg = self.standin.config
        if self.path == OPENAPI:
            self._reply(200, openapi_document(cfg))
        elif self.path == AGENT_CONTEXT:
            self._reply(200, agent_context(cfg, self.standin.url))
        elif self.path.startswith(cfg.base + "/"):
            row_id = self.path[len(cfg.base) + 1:]
            with self.standin.lock:
                row = self.standin.rows.get(row_id)
                row = dict(row) if row is not None else None
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
        if self.path.endswith("/dry-run"):
            self._reply(200, {"valid": True, "issues": [], "warnings": []}, request_body=payload,
                        auth=auth)
            return
        allowed, retry_s, remaining, reset = self.standin.take_slot(key_id)
        if not allowed:
            retry_ms = max(1, math.ceil(retry_s * 1000))
            self._reply(429, {"error": "Rate limit exceeded", "retryAfterMs": retry_ms},
                        headers={"Retry-After": str(math.ceil(retry_s)),
                                 "X-RateLimit-Remaining": "0",
                                 "X-RateLimit-Reset": str(math.ceil(reset))},
                        request_body=payload, auth=auth)
            return
        missing = [f"{name} missing: outputs not attested" if name == "outputSha256" else
                   f"{name} missing: prompts not attested"
                   for name in ("promptSha256", "outputSha256") if name not in payload]
        row_id = "st_" + uuid.uuid4().hex[:22]
        status = "APPROVED" if cfg.approve else "PENDING"
        row = {**payload, "id": row_id, "status": status, "createdAt": _utc_ms(),
               "verifiedRun": not missing}
        with self.standin.lock:
            self.standin.rows[row_id] = row
        self._reply(201, {"id": row_id, "status": status, "verifiedRun": not missing,
                          "verificationIssues": missing},
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
    p.add_argument("--allow-edits", action="store_true", help="enable PATCH of public rows")
    return p


def config_from_args(argv: Sequence[str] | None = None) -> StandinConfig:
    a = _parser().parse_args(argv)
    if a.rate_limit < 1 or a.window_s <= 0:
        _parser().error("--rate-limit must be >= 1 and --window-s > 0")
    return StandinConfig(host=a.host, port=a.port, api=a.api, rate_limit=a.rate_limit,
                         window_s=a.window_s, log=a.log, key_sha256=a.key_sha256, approve=a.approve,
                         allow_edits=a.allow_edits)


def main(argv: Sequence[str] | None = None) -> int:
    config = config_from_args(argv)
    try:
        server = StandinServer(config)
    except (OSError, FileExistsError) as exc:
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
