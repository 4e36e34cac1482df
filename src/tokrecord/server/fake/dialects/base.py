"""What a dialect decides, and what every dialect shares.

The handler owns the schedule, the socket and the JSONL log; a dialect owns the rest
of what an engine looks like from outside: its routes, how it reads a generation
request, the bytes of each event (a `Wire`), its error bodies, its /metrics names and
its log lines. Nothing here may touch the timing of a write: a wire builds an event's
bytes before the handler waits for the event's due time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, NamedTuple, Protocol

from tokrecord.jsontypes import JSONObject
from tokrecord.server.fake.requests import _Generation
from tokrecord.server.fake.tokens import _dumps

if TYPE_CHECKING:
    from tokrecord.server.fake.config import FakeServerConfig
    from tokrecord.server.fake.state import FakeServer

JSON = "application/json"
# One /metrics family: name, type, help, and its samples (labels, value).
Family = tuple[str, str, str, list[tuple[Mapping[str, str], float]]]


class Reply(NamedTuple):
    """A whole (not streamed) response."""

    status: int
    body: bytes
    content_type: str = JSON


def json_reply(status: int, obj: object) -> Reply:
    return Reply(status, _dumps(obj).encode("utf-8"))


@dataclass(frozen=True)
class Exchange:
    """What one generation response's wire needs to know about its request."""

    uid: str  # a fresh request id (32 hex digits); each wire dresses it its own way
    created: int
    model: str
    gen: _Generation
    # Prompt tokens the engine's prefix cache would have served (0: no cache or no hit).
    cached: int
    t_req_ns: int
    config: FakeServerConfig


class Wire(Protocol):
    """The bytes of one response. Events are SSE `data:` lines, not yet framed."""

    def opening(self) -> bytes:
        """Chunked frames that travel in chunk 0's write, before its token event."""
        ...

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        ...

    def closing(self, sent: int, finish: str) -> bytes:
        """Chunked frames written right after the last token chunk (not the last frame)."""
        ...

    def whole(self, ids: Sequence[int], finish: str) -> JSONObject:
        """The non-streamed response body."""
        ...


class GenerationRoute(NamedTuple):
    # (request body, served model) -> the generation, or _RequestError.
    parse: Callable[[object, str], _Generation]
    wire: Callable[[Exchange], Wire]


class Dialect:
    """One engine's outside. Subclasses override what differs from vLLM's OpenAI server."""

    name: str
    # The Server header's product (None: the handler's own, as the vLLM dialect has).
    server_version: str | None = None
    stream_headers: tuple[tuple[str, str], ...] = (
        ("Content-Type", "text/event-stream; charset=utf-8"),
        ("Cache-Control", "no-cache"),
        ("Transfer-Encoding", "chunked"),
    )
    # The engine closes the socket after each streamed response (llama.cpp does).
    close_after_stream: bool = False
    # The request-log line is written when the response is finished, not when it starts.
    log_after_response: bool = False

    # Generation routes: path -> how to read the body and which wire answers.
    routes: Mapping[str, GenerationRoute]

    def generation(self, path: str) -> GenerationRoute | None:
        return self.routes.get(path)

    def get(self, server: FakeServer, path: str) -> Reply | None:
        """A GET route's answer; None: no such route."""
        raise NotImplementedError

    def post(self, server: FakeServer, path: str) -> Reply | None:
        """A POST route other than generation; None: no such route."""
        return None

    def error(self, status: int, message: str, err_type: str, param: str | None = None) -> Reply:
        raise NotImplementedError

    def not_ready(self) -> Reply:
        return self.error(503, "server is not ready", "ServiceUnavailableError")

    def caches_prefix(self, config: FakeServerConfig, gen: _Generation) -> bool:
        """Whether this request may reuse the previous prompt's leading tokens."""
        return False

    def metrics(self, server: FakeServer) -> list[Family]:
        return fake_gauges(server)

    def request_line(self, host: str, port: int, request_line: str, path: str,
                     code: int) -> str | None:
        """The engine's log line for one request; None: the handler's default line, "":
        none at all."""
        return None

    def generation_log(self, req: int, gen: _Generation, cached: int) -> str | None:
        """A line the engine logs as generation `req` starts (llama.cpp's slot launch,
        SGLang's prefill line)."""
        return None

    def on_start(self, server: FakeServer) -> None:
        """What the engine does by itself once it listens (SGLang's warmup request)."""


def fake_gauges(server: FakeServer) -> list[Family]:
    """The fake's own gauges, beside whatever the dialect's engine exposes."""
    c = server.counters
    labels = {"model_name": server.config.model}
    return [
        ("tokrecord_fake_active_generations", "gauge", "Generations in progress now.",
         [(labels, c.active)]),
        ("tokrecord_fake_max_concurrent_generations", "gauge",
         "Most generations in progress at once since start.", [(labels, c.max_active)]),
    ]


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(families: Iterable[Family]) -> str:
    """Prometheus text format; a sample without labels has no braces (llama.cpp's form)."""
    lines: list[str] = []
    for name, kind, help_text, samples in families:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            rendered = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{rendered}}} {float(value)!r}" if labels
                         else f"{name} {float(value)!r}")
    return "\n".join(lines) + "\n"


def status_phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return ""


def log_time() -> str:
    """Local wall-clock time as SGLang's log prefix writes it."""
    return time.strftime("%Y-%m-%d %H:%M:%S")
