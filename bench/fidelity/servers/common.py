"""What the bench's own paced servers share: the wire format, the schedule, the log.

Only the bytes and the bookkeeping live here; how a server reads requests, waits
and writes is its own (see the package docstring). The log is kept in memory while
a request streams and written when it ends, so that no file write sits between two
sends.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

MODEL = "tokrecord-fake"
VOCAB = 4096
OK_JSON = b"application/json"


@dataclass(frozen=True)
class Schedule:
    ttft_ms: float
    tok_s: float
    tokens_per_chunk: int

    def due_ns(self, t_req_ns: int, last_token: int) -> int:
        """When the chunk whose last token has index `last_token` (0-based) is due."""
        return t_req_ns + round(self.ttft_ms * 1e6) + round(last_token * 1e9 / self.tok_s)


def prompt_ids(prompt: str) -> list[int]:
    return [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest()) % VOCAB
            for w in prompt.split()] or [0]


def output_ids(prompt: str, n: int) -> list[int]:
    seed = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=4).digest())
    return [(seed + 7919 * i) % VOCAB for i in range(n)]


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Generation:
    """One streamed completion in vLLM's wire format, chunk by chunk."""

    prompt: str
    max_tokens: int
    schedule: Schedule
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.prompt_ids = prompt_ids(self.prompt)
        self.ids = output_ids(self.prompt, self.max_tokens)

    def _usage(self, completion: int) -> dict[str, Any]:
        p = len(self.prompt_ids)
        return {"prompt_tokens": p, "total_tokens": p + completion,
                "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": 0}}

    def plan(self) -> list[range]:
        """Token positions per chunk: token 0 alone (the prefill's token), then groups
        of K, as a speculative engine streams them and as the fake server's schedule
        has it: the same cell is the same schedule on every server."""
        k = self.schedule.tokens_per_chunk
        return [range(0, 1)] + [range(i, min(i + k, self.max_tokens))
                                for i in range(1, self.max_tokens, k)]

    def event(self, positions: range) -> bytes:
        last = positions[-1] == self.max_tokens - 1
        choice: dict[str, Any] = {
            "index": 0, "text": "".join(f" w{self.ids[i]}" for i in positions), "logprobs": None,
            "finish_reason": "length" if last else None, "stop_reason": None,
            "token_ids": [self.ids[i] for i in positions]}
        if positions[0] == 0:
            choice["prompt_token_ids"] = self.prompt_ids
        body = {"id": "cmpl-bench", "object": "text_completion", "created": self.created,
                "model": MODEL, "choices": [choice], "usage": self._usage(positions[-1] + 1)}
        return chunk(sse(body))

    def closing(self) -> bytes:
        usage = {"id": "cmpl-bench", "object": "text_completion", "created": self.created,
                 "model": MODEL, "choices": [], "usage": self._usage(self.max_tokens)}
        return chunk(sse(usage)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


STREAM_HEADERS = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                  b"transfer-encoding: chunked\r\n\r\n")


def whole(status: int, body: bytes, content_type: bytes = OK_JSON) -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 400: b"Bad Request"}.get(status, b"Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason, content_type, len(body), body))


METRICS = (b"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 0\n"
           b"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total 0\n")


def get_reply(path: str) -> bytes:
    """The answers to the ready, model, version and metrics paths."""
    if path == "/health":
        return whole(200, b"")
    if path == "/v1/models":
        return whole(200, json.dumps({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "bench"}]}).encode())
    if path == "/version":
        return whole(200, b'{"version":"bench-paced"}')
    if path == "/metrics":
        return whole(200, METRICS, b"text/plain; version=0.0.4")
    return whole(404, b'{"error":"not found"}')


class SendLog:
    """The server's send log (`truth.py`'s format), one line per event.

    `t_ns` of a chunk is `perf_counter_ns()` just before its send: these servers log
    the moment they hand bytes to the kernel, not after (the packaged fake server
    logs after its write returns)."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("x", buffering=1)
        self.next_req = 0

    def request(self) -> int:
        self.next_req += 1
        return self.next_req - 1

    def flush(self, lines: list[dict[str, Any]]) -> None:
        self.file.write("".join(json.dumps(x) + "\n" for x in lines))


def parse_request(raw: bytes) -> tuple[str, str, dict[str, str]]:
    head = raw.decode("latin-1").split("\r\n")
    method, path, _ = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def generation(body: bytes, schedule: Schedule) -> Generation:
    obj = json.loads(body)
    return Generation(prompt=str(obj.get("prompt", "")), max_tokens=int(obj.get("max_tokens", 16)),
                      schedule=schedule)


def chunk_line(req: int, t_ns: int, due: int, positions: range) -> dict[str, Any]:
    return {"kind": "chunk", "req": req, "t_ns": t_ns, "due_ns": due,
            "tokens": list(positions), "n": len(positions)}


def request_line(req: int, t_ns: int, max_tokens: int) -> dict[str, Any]:
    return {"kind": "request", "req": req, "t_ns": t_ns, "body": {"max_tokens": max_tokens}}


def done_line(req: int, outcome: str) -> dict[str, Any]:
    return {"kind": "done", "req": req, "t_ns": time.perf_counter_ns(), "outcome": outcome}


def add_arguments(parser: Any) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--tok-s", type=float, default=1000.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--log", type=Path, required=True)
