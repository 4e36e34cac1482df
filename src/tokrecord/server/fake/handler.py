"""The request handler: routes, and the paced stream of chunks it writes."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, cast

from tokrecord.server.fake.constants import DONE_EVENT, LAST_CHUNK, MALFORMED_EVENT
from tokrecord.server.fake.requests import _Generation, _parse_generation, _RequestError, error_body
from tokrecord.server.fake.tokens import (
    _dumps,
    chunk_frame,
    chunk_plan,
    due_ns,
    output_token_ids,
    sse_event,
    token_text,
    wait_until,
)

if TYPE_CHECKING:
    from tokrecord.server.fake.state import FakeServer

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tokrecord-fake/0.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: a chunk leaves when written

    @property
    def fake(self) -> FakeServer:
        return cast("FakeServer", self.server)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake: " + (format % args) + "\n")

    # -- plain responses

    def _send_bytes(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, obj: object) -> None:
        self._send_bytes(status, _dumps(obj).encode("utf-8"), "application/json")

    def _send_error_json(
        self, status: int, message: str, err_type: str, param: str | None = None
    ) -> None:
        self._send_json(status, error_body(status, message, err_type, param))

    def _not_ready(self) -> bool:
        if self.fake.ready():
            return False
        self._send_error_json(503, "server is not ready", "ServiceUnavailableError")
        return True

    # -- routing

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_bytes(200 if self.fake.ready() else 503, b"", "application/json")
        elif path == "/v1/models":
            if self._not_ready():
                return
            model = {"id": self.fake.config.model, "object": "model", "owned_by": "tokrecord"}
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == "/metrics":
            body = self.fake.metrics_text().encode("utf-8")
            self._send_bytes(200, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send_error_json(404, f"no route for GET {path}", "NotFoundError")

    def do_POST(self) -> None:
        t_req = time.perf_counter_ns()
        path = self.path.split("?", 1)[0]
        raw = self._read_body()
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._send_error_json(404, f"no route for POST {path}", "NotFoundError")
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
        if self._not_ready():
            self._log_done(req, 0, None, "not_ready")
            return
        try:
            if bad_json is not None or body is None:
                raise _RequestError(
                    400, f"request body is not valid JSON: {bad_json or 'empty body'}"
                )
            gen = _parse_generation(path == "/v1/chat/completions", body, server.config.model)
        except _RequestError as exc:
            self._send_error_json(exc.status, exc.message, exc.err_type, exc.param)
            self._log_done(req, 0, None, "rejected")
            return
        self._generate(req, t_req, gen)

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

    def _generate(self, req: int, t_req: int, gen: _Generation) -> None:
        config = self.fake.config
        counters = self.fake.counters
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
        with counters.lock:
            counters.active += 1
            counters.max_active = max(counters.max_active, counters.active)
            counters.prompt_tokens += len(gen.prompt_ids)
        sent = 0
        outcome = "complete"
        try:
            if gen.stream:
                sent = self._stream(req, t_req, gen, n, n_send, finish, cut)
            else:
                sent = self._respond_whole(t_req, gen, n_send, finish, cut)
            if cut:
                outcome = "cut"
        except ConnectionError:  # the client went away: broken pipe, reset, abort
            outcome = "disconnected"
            self.close_connection = True
        finally:
            with counters.lock:
                counters.active -= 1
                counters.success["abort" if outcome != "complete" else finish] += 1
        self._log_done(req, sent, finish if outcome == "complete" else None, outcome)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)  # unbuffered: one sendall on the socket
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(
        self, req: int, t_req: int, gen: _Generation, n: int, n_send: int, finish: str, cut: bool
    ) -> int:
        config = self.fake.config
        counters = self.fake.counters
        events = self.fake.events
        rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        builder = _ChunkBuilder(rid, created, config.model, gen)
        ids = output_token_ids(gen.prompt_key, n_send)
        t_first = t_req + round(config.ttft_ms * 1e6)

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        malformed_at = config.malformed_after_tokens
        sent = 0
        if malformed_at == 0:
            wait_until(t_first)
            self._send_malformed(req)
            malformed_at = None
        for index, positions in enumerate(chunk_plan(n_send, config.tokens_per_chunk)):
            chunk_ids = [ids[k] for k in positions]
            last = positions[-1]
            done = not cut and last == n - 1
            payload = b""
            if index == 0 and gen.chat:
                payload += chunk_frame(builder.role_event())
            payload += chunk_frame(
                builder.token_event(chunk_ids, sent + len(chunk_ids), finish if done else None)
            )
            due = due_ns(t_first, last, config.tok_s)
            # Nothing but the wait between the due time and the write: logging follows.
            wait_until(due)
            self._write(payload)
            t_written = time.perf_counter_ns()
            sent += len(chunk_ids)
            with counters.lock:
                counters.generation_tokens += len(chunk_ids)
                if index > 0 and config.tokens_per_chunk > 1:
                    counters.drafts += 1
                    counters.draft_tokens += config.tokens_per_chunk - 1
                    counters.accepted += len(chunk_ids) - 1
            events.write(
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
            if malformed_at is not None and sent >= malformed_at:
                self._send_malformed(req)
                malformed_at = None
        if cut:
            self._hang_up()
            return sent
        tail = b""
        if gen.include_usage:
            tail += chunk_frame(builder.usage_event(sent))
        self._write(tail + chunk_frame(DONE_EVENT) + LAST_CHUNK)
        return sent

    def _send_malformed(self, req: int) -> None:
        self._write(chunk_frame(MALFORMED_EVENT))
        self.fake.events.write({"kind": "malformed", "req": req, "t_ns": time.perf_counter_ns()})

    def _respond_whole(
        self, t_req: int, gen: _Generation, n_send: int, finish: str, cut: bool
    ) -> int:
        config = self.fake.config
        t_first = t_req + round(config.ttft_ms * 1e6)
        wait_until(due_ns(t_first, max(n_send - 1, 0), config.tok_s))
        if cut:
            self._hang_up()
            return 0
        ids = output_token_ids(gen.prompt_key, n_send)
        with self.fake.counters.lock:
            self.fake.counters.generation_tokens += n_send
        rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        builder = _ChunkBuilder(rid, int(time.time()), config.model, gen)
        self._send_json(200, builder.whole_response(ids, finish))
        return n_send


class _ChunkBuilder:
    """The JSON events of one response, field for field as vLLM writes them."""

    def __init__(self, rid: str, created: int, model: str, gen: _Generation) -> None:
        self.rid = rid
        self.created = created
        self.model = model
        self.gen = gen
        self.prompt_tokens = len(gen.prompt_ids)
        self.first_token_event = True

    def _usage(self, completion_tokens: int, details: bool = False) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def role_event(self) -> bytes:
        chunk = self._head()
        chunk["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        if self.gen.continuous_usage:
            chunk["usage"] = self._usage(0)
        chunk["prompt_token_ids"] = list(self.gen.prompt_ids) if self.gen.return_token_ids else None
        return sse_event(chunk)

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        chunk = self._head()
        choice: dict[str, Any]
        if self.gen.chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = token_ids
            chunk["choices"] = [choice]
            if self.gen.continuous_usage:
                chunk["usage"] = self._usage(cumulative)
        else:
            prompt_ids = None
            if self.first_token_event and self.gen.return_token_ids:
                prompt_ids = list(self.gen.prompt_ids)
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": prompt_ids,
                "token_ids": token_ids,
            }
            chunk["choices"] = [choice]
            chunk["usage"] = self._usage(cumulative) if self.gen.continuous_usage else None
        self.first_token_event = False
        return sse_event(chunk)

    def usage_event(self, completion_tokens: int) -> bytes:
        chunk = self._head()
        chunk["choices"] = []
        chunk["usage"] = self._usage(completion_tokens, details=True)
        return sse_event(chunk)

    def whole_response(self, ids: Sequence[int], finish: str) -> dict[str, Any]:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        prompt_ids = list(self.gen.prompt_ids) if self.gen.return_token_ids else None
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.gen.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        if self.gen.chat:
            body["choices"] = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": token_ids,
                }
            ]
            body["usage"] = self._usage(len(ids), details=True)
            body["prompt_token_ids"] = prompt_ids
        else:
            body["choices"] = [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_token_ids": prompt_ids,
                    "token_ids": token_ids,
                }
            ]
            body["usage"] = self._usage(len(ids), details=True)
        return body
