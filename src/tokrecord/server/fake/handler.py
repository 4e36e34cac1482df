"""The request handler: routes, and the paced stream of chunks it writes.

The schedule, the socket writes and the JSONL log are the same for every dialect;
what the bytes say, which routes exist and how errors and log lines look is the
dialect's (tokrecord.server.fake.dialects).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
import uuid
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, cast

from tokrecord.server.fake.constants import LAST_CHUNK, MALFORMED_EVENT
from tokrecord.server.fake.dialects.base import Exchange, Reply, Wire
from tokrecord.server.fake.requests import _Generation, _RequestError
from tokrecord.server.fake.tokens import (
    _dumps,
    chunk_frame,
    chunk_plan,
    due_ns,
    output_token_ids,
    wait_until,
)

if TYPE_CHECKING:
    from tokrecord.server.fake.dialects.base import Dialect, GenerationRoute
    from tokrecord.server.fake.state import FakeServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tokrecord-fake/0.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: a chunk leaves when written
    _deferred_log: str | None = None

    @property
    def fake(self) -> FakeServer:
        return cast("FakeServer", self.server)

    @property
    def dialect(self) -> Dialect:
        return self.fake.dialect

    def version_string(self) -> str:
        return self.dialect.server_version or super().version_string()

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake: " + (format % args) + "\n")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = self.path.split("?", 1)[0]
        host, port = self.client_address[:2]
        status = int(code) if isinstance(code, int) else 0
        line = self.dialect.request_line(str(host), int(port), self.requestline, path, status)
        if line is None:
            super().log_request(code, size)
        elif line and self.dialect.log_after_response:
            self._deferred_log = line
        elif line:
            sys.stderr.write(line + "\n")

    def _flush_log(self) -> None:
        if self._deferred_log is not None:
            sys.stderr.write(self._deferred_log + "\n")
            self._deferred_log = None

    # -- plain responses

    def _send_bytes(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_reply(self, reply: Reply) -> None:
        self._send_bytes(reply.status, reply.body, reply.content_type)

    def _send_json(self, status: int, obj: object) -> None:
        self._send_bytes(status, _dumps(obj).encode("utf-8"), "application/json")

    def _send_error_json(
        self, status: int, message: str, err_type: str, param: str | None = None
    ) -> None:
        self._send_reply(self.dialect.error(status, message, err_type, param))

    # -- routing

    def do_GET(self) -> None:
        try:
            path = self.path.split("?", 1)[0]
            reply = self.dialect.get(self.fake, path)
            if reply is None:
                self._send_error_json(404, f"no route for GET {path}", "NotFoundError")
            else:
                self._send_reply(reply)
        finally:
            self._flush_log()

    def do_POST(self) -> None:
        try:
            self._post()
        finally:
            self._flush_log()

    def _post(self) -> None:
        t_req = time.perf_counter_ns()
        path = self.path.split("?", 1)[0]
        raw = self._read_body()
        route = self.dialect.generation(path)
        if route is None:
            other = self.dialect.post(self.fake, path)
            if other is None:
                self._send_error_json(404, f"no route for POST {path}", "NotFoundError")
            else:
                self._send_reply(other)
            return
        server = self.fake
        req = next(server.request_numbers)
        body: object
        try:
            body = json.loads(raw) if raw else None
            bad_json = None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            body, bad_json = None, str(exc)
        server.events.write(
            {"kind": "request", "req": req, "t_ns": t_req, "path": path, "body": body}
        )
        if server.config.fail_status is not None:
            status = server.config.fail_status
            self._send_error_json(
                status,
                f"injected failure (--fail-status {status})",
                "InternalServerError" if status >= 500 else "BadRequestError",
            )
            self._log_done(req, 0, None, "failed")
            return
        if not server.ready():
            self._send_reply(self.dialect.not_ready())
            self._log_done(req, 0, None, "not_ready")
            return
        try:
            if bad_json is not None or body is None:
                raise _RequestError(
                    400, f"request body is not valid JSON: {bad_json or 'empty body'}"
                )
            gen = route.parse(body, server.config.model)
        except _RequestError as exc:
            self._send_error_json(exc.status, exc.message, exc.err_type, exc.param)
            self._log_done(req, 0, None, "rejected")
            return
        if server.config.no_continuous_usage and gen.continuous_usage:
            gen = replace(gen, continuous_usage=False)
        self._generate(req, t_req, gen, route)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(size) if size > 0 else b""

    def _log_done(self, req: int, tokens: int, finish: str | None, outcome: str) -> None:
        self.fake.events.write(
            {
                "kind": "done",
                "req": req,
                "t_ns": time.perf_counter_ns(),
                "tokens": tokens,
                "finish_reason": finish,
                "outcome": outcome,
            }
        )

    # -- generation

    def _generate(self, req: int, t_req: int, gen: _Generation, route: GenerationRoute) -> None:
        server = self.fake
        config = server.config
        counters = server.counters
        limit = (
            gen.max_tokens
            if config.max_tokens_cap is None
            else min(gen.max_tokens, config.max_tokens_cap)
        )
        if config.eos_after is not None and config.eos_after <= limit:
            n, finish = config.eos_after, "stop"
        else:
            n, finish = limit, "length"
        cut = config.cut_after_tokens is not None and config.cut_after_tokens <= n
        n_send = cast(int, config.cut_after_tokens) if cut else n
        cached = server.prefix_cache.lookup(gen.prompt_ids, self.dialect.caches_prefix(config, gen))
        with counters.lock:
            counters.active += 1
            counters.max_active = max(counters.max_active, counters.active)
            counters.prompt_tokens += len(gen.prompt_ids)
            counters.cached_tokens += cached
        wire = route.wire(
            Exchange(uuid.uuid4().hex, int(time.time()), config.model, gen, cached, t_req, config)
        )
        sent = 0
        outcome = "complete"
        try:
            if gen.stream:
                sent = self._stream(req, t_req, gen, wire, n, n_send, finish, cut, cached)
            else:
                self._log_generation(req, gen, cached)
                sent = self._respond_whole(t_req, gen, wire, n_send, finish, cut)
            if cut:
                outcome = "cut"
        except ConnectionError:  # the client went away: broken pipe, reset, abort
            outcome = "disconnected"
            self.close_connection = True
        finally:
            with counters.lock:
                counters.active -= 1
                counters.success["abort" if outcome != "complete" else finish] += 1
            counters.book_request(config, sent)
        self._log_done(req, sent, finish if outcome == "complete" else None, outcome)

    def _log_generation(self, req: int, gen: _Generation, cached: int) -> None:
        line = self.dialect.generation_log(req, gen, cached)
        if line is not None:
            sys.stderr.write(line + "\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)  # unbuffered: one sendall on the socket
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(
        self, req: int, t_req: int, gen: _Generation, wire: Wire, n: int, n_send: int,
        finish: str, cut: bool, cached: int,
    ) -> int:
        config = self.fake.config
        ids = output_token_ids(gen.prompt_key, n_send)
        t_first = t_req + round(config.ttft_ms * 1e6)
        self._open_stream(req, gen, cached)
        malformed_at = config.malformed_after_tokens
        sent = 0
        if malformed_at == 0:
            wait_until(t_first, config.spin_ns)
            self._send_malformed(req)
            malformed_at = None
        for index, positions in enumerate(chunk_plan(n_send, config.tokens_per_chunk)):
            chunk_ids = [ids[k] for k in positions]
            last = positions[-1]
            done = not cut and last == n - 1
            payload = wire.opening() if index == 0 else b""
            event = wire.token_event(chunk_ids, sent + len(chunk_ids), finish if done else None)
            # An empty event is a token the dialect holds back: an empty frame would end
            # the body.
            payload += chunk_frame(event) if event else b""
            due = due_ns(t_first, last, config.tok_s)
            # Nothing but the wait between the due time and the write: logging follows.
            wait_until(due, config.spin_ns)
            if payload:
                self._write(payload)
            t_written = time.perf_counter_ns()
            sent += len(chunk_ids)
            self._book_chunk(req, index, positions, chunk_ids, t_written, due)
            if malformed_at is not None and sent >= malformed_at:
                self._send_malformed(req)
                malformed_at = None
        return self._close_stream(wire, sent, finish, cut)

    def _open_stream(self, req: int, gen: _Generation, cached: int) -> None:
        self.send_response(200)
        for name, value in self.dialect.stream_headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        self._log_generation(req, gen, cached)

    def _book_chunk(self, req: int, index: int, positions: range, chunk_ids: list[int],
                    t_written: int, due: int) -> None:
        """A written chunk's counters and its line in the event log."""
        config = self.fake.config
        counters = self.fake.counters
        with counters.lock:
            counters.generation_tokens += len(chunk_ids)
            if index > 0 and config.tokens_per_chunk > 1:
                counters.drafts += 1
                counters.draft_tokens += config.tokens_per_chunk - 1
                counters.accepted += len(chunk_ids) - 1
        self.fake.events.write(
            {
                "kind": "chunk",
                "req": req,
                "t_ns": t_written,
                "due_ns": due,
                "tokens": list(positions),
                "n": len(chunk_ids),
                "ids": chunk_ids,
            }
        )

    def _close_stream(self, wire: Wire, sent: int, finish: str, cut: bool) -> int:
        if cut:
            self._hang_up()
            return sent
        self._write(wire.closing(sent, finish) + LAST_CHUNK)
        if self.dialect.close_after_stream:
            self.close_connection = True
        return sent

    def _send_malformed(self, req: int) -> None:
        self._write(chunk_frame(MALFORMED_EVENT))
        self.fake.events.write({"kind": "malformed", "req": req, "t_ns": time.perf_counter_ns()})

    def _respond_whole(
        self, t_req: int, gen: _Generation, wire: Wire, n_send: int, finish: str, cut: bool
    ) -> int:
        config = self.fake.config
        t_first = t_req + round(config.ttft_ms * 1e6)
        wait_until(due_ns(t_first, max(n_send - 1, 0), config.tok_s), config.spin_ns)
        if cut:
            self._hang_up()
            return 0
        ids = output_token_ids(gen.prompt_key, n_send)
        with self.fake.counters.lock:
            self.fake.counters.generation_tokens += n_send
        self._send_json(200, wire.whole(ids, finish))
        return n_send
