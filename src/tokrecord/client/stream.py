"""Stream one row and keep every chunk.

The hot loop only stamps `perf_counter_ns()` the moment a read returns bytes and
keeps them; SSE and JSON decoding, and appending each event (with its stamp) to the
run's events.jsonl, follow the stream's end (or run between reads while the stream is
slow, see LIVE_DECODE_GAP_NS), so they cannot delay a later stamp: at 20,000 tok/s a
chunk arrives every 50 µs, less than decoding one costs in Python. What a payload
means is the engine's dialect (`tokrecord.engines`): token counts per chunk always come
from the server, never from re-tokenized text.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict

from tokrecord.client.chunked import ChunkedDecoder
from tokrecord.client.events import ChunkEvent, DoneEvent, EndEvent, RequestEvent, parse_events
from tokrecord.client.limits import DEFAULT_LIMITS, RowLimitError, RowLimits
from tokrecord.client.rawlog import HEADER, RAW_CHUNKED, RAW_PLAIN, RAW_READ, RawRow
from tokrecord.client.sse import SSEDecoder
from tokrecord.client.wire import Head, Wire, parse_head, request_bytes, wire_for
from tokrecord.engines import CountSource, Endpoint, Engine, StreamParser
from tokrecord.errors import StreamError
from tokrecord.jsontypes import JSONObject
from tokrecord.metrics import Chunk
from tokrecord.suite import SuiteRow

DONE = "[DONE]"
ERROR_BODY_CHARS = 600


class EventSink(Protocol):
    """Where raw events go the moment they are seen (events.jsonl in a run dir)."""

    def write(self, record: Mapping[str, Any]) -> None: ...


class RowTrace(BaseModel):
    """Everything the client saw of one row, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    row_id: str
    prompt_sha256: str
    t_send_ns: int
    t_end_ns: int
    chunks: tuple[Chunk, ...]  # token-carrying chunks only
    events: int  # every SSE event, including role-only and usage-only ones
    token_ids: tuple[int, ...] | None
    prompt_token_ids: tuple[int, ...] | None
    text: str
    finish_reason: str | None
    count_source: CountSource
    count_mismatches: int  # chunks where token_ids and usage disagreed
    prompt_tokens: int | None
    completion_tokens: int | None  # server-reported, final usage
    cached_tokens: int | None
    # Set only where `token_ids` is None because the server held some ids back at
    # known positions: every token's id by position, None at each held-back one
    # (leg rows v2; absent from older rows.json).
    gapped_token_ids: tuple[int | None, ...] | None = None

    @property
    def n_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


def build_body(
    endpoint: Endpoint,
    model: str,
    row: SuiteRow,
    extra: Mapping[str, Any] | None = None,
    *,
    engine: Engine,
) -> JSONObject:
    """The request for one row in the engine's dialect."""
    return engine.build_body(endpoint, model, row, extra)


def _transport_message(
    exc: httpx.HTTPError, where: str, base_url: httpx.URL, received: int, events: int
) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{where}: cannot connect to {base_url}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where}: timed out after {received} tokens ({type(exc).__name__})"
    detail = str(exc) or type(exc).__name__
    return f"{where}: stream cut after {received} tokens ({events} events): {detail}"


# Decoding while a stream is slow: when the previous gap between two reads was at
# least this long, decoding the (one or two) reads kept since cannot delay the next
# stamp, so slow engines get live progress and their events are flushed as they come.
LIVE_DECODE_GAP_NS = 2_000_000
_SEND_STARTED = "send_request_headers.started"
# The token loop sums the bytes of a row once every this many reads (at most READ_SIZE
# each), so that the byte limit costs the loop one comparison per read.
BYTES_CHECK_READS = 64


class _Budget:
    """A row's deadline and byte limit (client.limits), checked from the token loop."""

    __slots__ = ("cap", "counted", "deadline_ns", "limits", "max_tokens", "total", "where")

    def __init__(self, limits: RowLimits, max_tokens: int, t_start: int, where: str) -> None:
        self.limits, self.max_tokens, self.where = limits, max_tokens, where
        self.deadline_ns = t_start + int(limits.deadline_s(max_tokens) * 1e9)
        self.cap = limits.row_bytes(max_tokens)
        self.counted = 0  # reads summed into `total` so far
        self.total = 0

    def remaining_s(self, now: int) -> float:
        return max((self.deadline_ns - now) / 1e9, 0.001)

    def check(self, t: int, reads: Sequence[bytes]) -> int:
        """Raise RowLimitError past the deadline or the byte limit; else the read count at
        which to look again."""
        if t > self.deadline_ns:
            self.expired(len(reads))
        self.total += sum(len(r) for r in reads[self.counted:])
        self.counted = len(reads)
        if self.total > self.cap:
            raise RowLimitError(
                f"{self.where}: over the row's byte limit: {self.total} bytes received in "
                f"{len(reads)} reads, limit {self.limits.explain_bytes(self.max_tokens)}")
        return len(reads) + BYTES_CHECK_READS

    def expired(self, n_reads: int) -> None:
        raise RowLimitError(
            f"{self.where}: past the row's deadline after {n_reads} reads: "
            f"{self.limits.explain_deadline(self.max_tokens)}")


class _RowDecoder:
    """Everything after the stamp: SSE framing, JSON, token counts, the sink.

    Works on the reads the token loop stored, in order; each event takes the stamp
    of the read that completed it (the bytes' arrival), whenever it is decoded.
    """

    def __init__(self, row_index: int, where: str, parser: StreamParser, sink: EventSink,
                 on_tokens: Callable[[int, int], None] | None,
                 limits: RowLimits = DEFAULT_LIMITS, max_tokens: int | None = None) -> None:
        self.chunked: ChunkedDecoder | None = None  # set when reads carry HTTP framing
        self.row_index = row_index
        self.where = where
        self.sink = sink
        self.on_tokens = on_tokens
        self.parser = parser
        self.decoder = SSEDecoder(limits.max_line_bytes, limits.max_event_bytes)
        self.limits, self.max_tokens = limits, max_tokens
        self.max_events = limits.max_events(max_tokens) if max_tokens is not None else None
        self.chunks: list[Chunk] = []
        self.events = 0
        self.received = 0
        self.done = False
        self.decoded = 0  # reads decoded so far

    def decode(self, stamps: Sequence[int], reads: Sequence[bytes]) -> None:
        for i in range(self.decoded, len(reads)):
            self.decoded = i + 1
            t = stamps[i]
            pieces = self.chunked.feed(reads[i]) if self.chunked is not None else (reads[i],)
            for piece in pieces:
                for event in self.decoder.feed(piece):
                    self._event(t, event.data)

    def close(self) -> None:
        if self.chunked is not None:
            self.chunked.close()
        self.decoder.close()

    def _event(self, t: int, data: str) -> None:
        if self.max_events is not None and self.events >= self.max_events:
            raise RowLimitError(
                f"{self.where}: more than {self.max_events} events = "
                f"{self.limits.events_floor} + {self.max_tokens} max_tokens x "
                f"{self.limits.events_per_token:g} (row_limits.events_floor, events_per_token)")
        self.events += 1
        if data == DONE:
            self.done = True
            self.sink.write({"kind": "done", "row": self.row_index, "t_ns": t})
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            raise StreamError(
                f"{self.where}: malformed SSE event after {self.received} tokens: "
                f"{data[:120]!r} is not JSON ({exc.msg})"
            ) from exc
        n, ids, text, finish = self.parser.parse(obj)
        # A dialect without `[DONE]` (llama.cpp's native stream) ends on a final event.
        self.done = self.parser.finished
        self.sink.write(
            {"kind": "chunk", "row": self.row_index, "seq": self.events - 1, "t_ns": t, "n": n,
             "ids": ids, "text": text, "finish": finish, "data": data}
        )
        if n:
            self.chunks.append(Chunk(t_ns=t, n=n))
            self.received += n
            if self.on_tokens is not None:
                self.on_tokens(self.received, t)


def stream_row(
    http: httpx.Client,
    *,
    row_index: int,
    row: SuiteRow,
    body: Mapping[str, Any],
    endpoint: Endpoint,
    sink: EventSink,
    on_tokens: Callable[[int, int], None] | None = None,
    epoch_ns: int = 0,
    engine: Engine,
    raw_fd: int | None = None,
    limits: RowLimits = DEFAULT_LIMITS,
) -> RowTrace:
    """POST one streaming request and record it. Raises StreamError on any failure,
    after writing an `end` event that says what went wrong.

    The token loop only stamps and stores (the module's docstring says why). The
    request is built by httpx and, for a plain http:// client, written and read on a
    socket of the client's own (`client.wire`: the first body bytes are stamped at
    their `recv` even when they come with the response headers); otherwise it goes
    through httpx. `t_send` is stamped just before the request is written (after any
    connection set-up).

    Times are `perf_counter_ns() - epoch_ns`: the leg's clock, so recorded integers
    stay small (RFC 8785 / I-JSON) whatever the host's uptime.

    `raw_fd` (an O_APPEND descriptor, see `tokrecord.client.rawlog`): each read's body
    bytes and stamp are also appended there, one unbuffered write per read, as they
    arrive, so that a SIGKILL in the middle of a row, before any decoding, loses
    nothing that had arrived; a resume decodes them (experiment.recovery).

    `limits` bound the row (client.limits): past its deadline or its byte limit, or
    with a line or an event over their caps, the row fails with RowLimitError; what
    had arrived is decoded into the sink and is in the raw log."""
    where = f"row {row_index} ({row.id})"
    path = engine.path(endpoint)
    state = _RowDecoder(row_index, where, engine.parser(endpoint), sink, on_tokens, limits,
                        row.max_tokens)
    log = _RowLog(sink, row_index, row, path, body, epoch_ns, state)
    request = _row_request(http, engine, path, body, log.trace)
    wire = wire_for(http)
    raw = (raw_fd, row_index) if raw_fd is not None else None
    log.t_fallback = time.perf_counter_ns()
    budget = _Budget(limits, row.max_tokens, log.t_fallback, where)
    try:
        t_end = (_stream_wire(wire, request, log, where, path, raw, budget,
                              engine.close_after_stream) if wire is not None
                 else _stream_httpx(http, request, state, log.stamps, log.reads, epoch_ns,
                                    log.flush, where, path, raw, budget))
    except (StreamError, httpx.HTTPError) as exc:
        error = log.failed(exc, where, http.base_url)
        if error is exc:
            raise
        raise error from exc
    except BaseException as exc:  # Ctrl-C, SIGTERM: keep what arrived, then go
        log.interrupted(exc)
        raise
    return log.finish(t_end, where)


def _row_request(http: httpx.Client, engine: Engine, path: str, body: Mapping[str, Any],
                 trace: Callable[[str, Mapping[str, Any]], None]) -> httpx.Request:
    # The body is read raw (never decompressed), so no compression is offered. A
    # server that closes every streamed response's socket is told so, so that no row
    # ever waits on a connection the server has already dropped.
    headers = {"Accept-Encoding": "identity"}
    if engine.close_after_stream:
        headers["Connection"] = "close"
    return http.build_request("POST", path, json=dict(body), headers=headers,
                              extensions={"trace": trace})


class _RowLog:
    """One row's reads as the token loop stores them, and its request and end events:
    the request event goes to the sink once, before the first chunk event, whenever
    that is (a failure before any byte still writes it)."""

    def __init__(self, sink: EventSink, row_index: int, row: SuiteRow, path: str,
                 body: Mapping[str, Any], epoch_ns: int, state: _RowDecoder) -> None:
        self.sink, self.row_index, self.row, self.path = sink, row_index, row, path
        self.body, self.epoch_ns, self.state = body, epoch_ns, state
        self.sent: list[int] = []  # when httpx began writing the request (its trace)
        self.t_fallback = 0  # t_send where no trace came (set just before sending)
        self.stamps: list[int] = []
        self.reads: list[bytes] = []
        self.request_written = False

    def trace(self, event_name: str, info: Mapping[str, Any]) -> None:
        if event_name.endswith(_SEND_STARTED) and not self.sent:
            self.sent.append(time.perf_counter_ns())

    def write_request(self) -> int:
        t_send = (self.sent[0] if self.sent else self.t_fallback) - self.epoch_ns
        if not self.request_written:
            self.request_written = True
            self.sink.write({"kind": "request", "row": self.row_index, "row_id": self.row.id,
                             "t_send_ns": t_send, "path": self.path, "body": dict(self.body)})
        return t_send

    def flush(self) -> None:
        """Decode what arrived so far (the request's own event first)."""
        self.write_request()
        self.state.decode(self.stamps, self.reads)

    def failed(self, exc: StreamError | httpx.HTTPError, where: str,
               base_url: httpx.URL) -> StreamError:
        t_fail = time.perf_counter_ns() - self.epoch_ns
        self.write_request()
        error = _failure(exc, self.state, self.stamps, self.reads, where, base_url)
        self.sink.write({"kind": "end", "row": self.row_index, "t_ns": t_fail, "ok": False,
                         "error": str(error)})
        return error

    def interrupted(self, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            self.flush()
            self.sink.write({"kind": "end", "row": self.row_index,
                             "t_ns": time.perf_counter_ns() - self.epoch_ns, "ok": False,
                             "error": f"interrupted ({type(exc).__name__})"})

    def finish(self, t_end: int, where: str) -> RowTrace:
        t_send = self.write_request()
        state = self.state
        if not state.done:
            msg = (f"{where}: stream ended without [DONE] after {state.received} tokens "
                   f"({state.events} events)")
            self.sink.write({"kind": "end", "row": self.row_index, "t_ns": t_end, "ok": False,
                             "error": msg})
            raise StreamError(msg)
        self.sink.write({"kind": "end", "row": self.row_index, "t_ns": t_end, "ok": True})
        return _trace(self.row_index, self.row, t_send, t_end, state.chunks, state.events,
                      state.parser)


def _stream_wire(wire: Wire, request: httpx.Request, log: _RowLog, where: str, path: str,
                 raw: tuple[int, int] | None, budget: _Budget, close_after_stream: bool) -> int:
    """The row on the client's own socket (_read_wire); returns t_end. The connection is
    kept for the next row only when the response's framing and the engine allow it."""
    try:
        head = _read_wire(wire, request_bytes(request), log.state, log.stamps, log.reads,
                          log.epoch_ns, log.flush, log.sent, where, path, raw, budget)
        t_end = time.perf_counter_ns() - log.epoch_ns
        log.flush()
        log.state.close()
    except BaseException:
        wire.close()  # its state is in doubt: the next row connects afresh
        raise
    framed = head.chunked or head.content_length is not None
    wire.done(head.keep_alive and framed and not close_after_stream)
    return t_end


def _read_wire(wire: Wire, out: bytes, state: _RowDecoder, stamps: list[int], reads: list[bytes],
               epoch_ns: int, flush: Callable[[], None], sent: list[int], where: str,
               path: str, raw: tuple[int, int] | None = None,
               budget: _Budget | None = None) -> Head:
    """The token loop on the client's own socket: write the request, then stamp and
    store every read of the body; decode only at a possible end or after a slow gap
    (LIVE_DECODE_GAP_NS). Returns the response head once the body is complete.

    A kept connection the server has closed meanwhile (the write fails, or the socket
    ends before any byte of a response) is replaced once and the request sent again:
    the server cannot have started on a request it never answered.

    With `raw` (descriptor, row), each body read is also appended to the raw log after
    its stamp: one `struct.pack` and one unbuffered `writev`, no decoding.

    The row's `budget` costs the loop one comparison per read: the deadline (also the
    socket's timeout, renewed only after a slow gap) and, every BYTES_CHECK_READS
    reads, the byte limit."""
    if budget is None:
        budget = _Budget(DEFAULT_LIMITS, 1 << 20, time.perf_counter_ns(), where)
    head, data, t, waits = _read_head(wire, out, sent, budget, state, raw, where, path)
    return _read_body(wire, head, data, t, waits, state, stamps, reads, epoch_ns, flush, raw,
                      budget)


def _read_head(wire: Wire, out: bytes, sent: list[int], budget: _Budget, state: _RowDecoder,
               raw: tuple[int, int] | None, where: str, path: str
               ) -> tuple[Head, bytes, int, _SocketWait]:
    """Send the request and read until the response head is complete (resending once on
    a kept connection that turns out closed). Returns the head, the body bytes that came
    with it and their stamp."""
    waits = _SocketWait(wire, out, sent, budget)
    retry = waits.send_first(wire.reused)
    pending = b""
    while True:
        try:
            data = wire.recv()
        except httpx.ReadError:
            if not (retry and not pending):
                raise
            data = b""
        except httpx.ReadTimeout:
            if time.perf_counter_ns() >= budget.deadline_ns - 10_000_000:
                budget.expired(0)
            raise
        t = time.perf_counter_ns()
        if not data:
            if retry and not pending:
                retry = False
                wire.close()
                waits.send()
                continue
            raise httpx.RemoteProtocolError("server disconnected without sending a response")
        retry = False
        pending += data
        head = parse_head(pending)
        if head is not None:
            return head, _body_start(wire, head, pending, state, raw, where, path), t, waits
        if t > budget.deadline_ns:
            budget.expired(0)


def _read_body(wire: Wire, head: Head, data: bytes, t: int, waits: _SocketWait,
               state: _RowDecoder, stamps: list[int], reads: list[bytes], epoch_ns: int,
               flush: Callable[[], None], raw: tuple[int, int] | None, budget: _Budget) -> Head:
    """The token loop proper: from the bytes that came with the head (`data`, stamped
    `t`), stamp and store every read until the body's framing says it is complete."""
    deadline, check_at = budget.deadline_ns, BYTES_CHECK_READS
    # Locals, so that the loop does no attribute lookups for the raw log.
    raw_fd, raw_row = raw if raw is not None else (-1, 0)
    writev, pack = os.writev, HEADER.pack
    tail = b""
    remaining = None if head.chunked else head.content_length  # body bytes still due
    previous = 0
    while True:
        if data:  # empty only for a head sent alone (before the first token)
            stamps.append(t - epoch_ns)
            reads.append(data)
            if raw is not None:
                writev(raw_fd, (pack(RAW_READ, raw_row, len(data), t - epoch_ns), data))
            if t > deadline or len(reads) >= check_at:
                check_at = budget.check(t, reads)
            slow = previous and t - previous >= LIVE_DECODE_GAP_NS
            previous = t
            if slow and wire.sock is not None:
                waits.shorten(t)
            if state.chunked is not None:
                tail = (tail + data)[-4:]
                # Every chunked body ends in CRLF CRLF (last chunk, trailers): only then is
                # the framing decoded to see whether this was the end.
                if tail == b"\r\n\r\n" or slow:
                    flush()
                    if state.chunked.done:
                        return head
            elif remaining is not None and (remaining := remaining - len(data)) <= 0:
                return head
            elif slow:
                flush()
        try:
            data = wire.recv()
        except httpx.ReadTimeout:
            if time.perf_counter_ns() >= deadline - 10_000_000:
                budget.expired(len(reads))
            raise
        t = time.perf_counter_ns()
        if not data:
            return _connection_ended(head)


class _SocketWait:
    """Writes the request and keeps the socket's timeout within the row's deadline."""

    __slots__ = ("budget", "now_s", "out", "read_timeout", "sent", "wire")

    def __init__(self, wire: Wire, out: bytes, sent: list[int], budget: _Budget) -> None:
        self.wire, self.out, self.sent, self.budget = wire, out, sent, budget
        self.read_timeout = wire.read_timeout
        self.now_s = 0.0  # the socket's timeout now

    def send(self) -> None:
        self.sent[:] = [self.wire.send(self.out)]
        # No wait on the socket may outlast the row's deadline.
        left_s = self.budget.remaining_s(time.perf_counter_ns())
        if self.wire.sock is not None:  # always: a kept socket holds the last row's wait
            self.now_s = left_s if self.read_timeout is None else min(self.read_timeout, left_s)
            self.wire.sock.settimeout(self.now_s)

    def send_first(self, retry: bool) -> bool:
        """Send; a kept connection whose write fails is replaced once. Returns whether a
        resend is still allowed."""
        try:
            self.send()
        except httpx.WriteError:
            if not retry:
                raise
            retry = False
            self.send()
        return retry

    def shorten(self, t: int) -> None:
        # Between slow reads there is time to shorten the socket's wait, by a second or
        # more at a time (at most one syscall a second): a silent server then holds the
        # row at most a second past its deadline.
        left_s = self.budget.remaining_s(t)
        if left_s < self.now_s - 1.0 and self.wire.sock is not None:
            self.now_s = left_s
            self.wire.sock.settimeout(left_s)


def _connection_ended(head: Head) -> Head:
    if not head.chunked and head.content_length is None:
        return head  # a body delimited by the end of the connection
    raise httpx.RemoteProtocolError(
        "peer closed connection without sending complete message body "
        "(incomplete chunked read)")


def _body_start(wire: Wire, head: Head, pending: bytes, state: _RowDecoder,
                raw: tuple[int, int] | None, where: str, path: str) -> bytes:
    """Once the head is complete: refuse a non-200 answer, set up the body's framing and
    mark it in the raw log. Returns the body bytes that came with the head."""
    if head.status != 200:
        raise _http_error(wire, head, pending, where, path)
    state.chunked = ChunkedDecoder() if head.chunked else None
    if raw is not None:
        os.write(raw[0], HEADER.pack(RAW_CHUNKED if head.chunked else RAW_PLAIN, raw[1], 0, 0))
    return pending[head.body_offset:]


def _http_error(wire: Wire, head: Head, pending: bytes, where: str, path: str) -> StreamError:
    """The error for a non-200 answer, with the start of its body (read as far as its
    framing says, or until the connection ends); the connection is not kept."""
    body = pending[head.body_offset:]
    with contextlib.suppress(httpx.HTTPError):
        while len(body) < 4 * ERROR_BODY_CHARS:
            if head.content_length is not None and len(body) >= head.content_length:
                break
            if head.chunked and body.endswith(b"0\r\n\r\n"):
                break
            data = wire.recv()
            if not data:
                break
            body += data
    wire.close()
    if head.chunked:
        decoder = ChunkedDecoder()
        with contextlib.suppress(StreamError):
            body = b"".join(decoder.feed(body))
    detail = body.decode("utf-8", errors="replace")[:ERROR_BODY_CHARS].strip()
    return StreamError(f"{where}: HTTP {head.status} from {path}: {detail or '(empty body)'}")


def _stream_httpx(http: httpx.Client, request: httpx.Request, state: _RowDecoder,
                  stamps: list[int], reads: list[bytes], epoch_ns: int,
                  flush: Callable[[], None], where: str, path: str,
                  raw: tuple[int, int] | None = None, budget: _Budget | None = None) -> int:
    """The row through httpx, for a client whose transport is not a plain socket (a
    mock transport, a proxy, https); returns t_end."""
    response = http.send(request, stream=True)
    try:
        if response.status_code != 200:
            response.read()
            detail = response.text[:ERROR_BODY_CHARS].strip()
            raise StreamError(
                f"{where}: HTTP {response.status_code} from {path}: {detail or '(empty body)'}")
        raw_fd, raw_row = raw if raw is not None else (-1, 0)
        writev, pack = os.writev, HEADER.pack
        if raw is not None:
            os.write(raw_fd, pack(RAW_PLAIN, raw_row, 0, 0))
        previous = 0
        if budget is None:
            budget = _Budget(DEFAULT_LIMITS, 1 << 20, time.perf_counter_ns(), where)
        deadline, check_at = budget.deadline_ns, BYTES_CHECK_READS
        for data in response.iter_raw():
            t = time.perf_counter_ns()
            stamps.append(t - epoch_ns)
            reads.append(data)
            if raw is not None:
                writev(raw_fd, (pack(RAW_READ, raw_row, len(data), t - epoch_ns), data))
            if t > deadline or len(reads) >= check_at:
                check_at = budget.check(t, reads)
            if previous and t - previous >= LIVE_DECODE_GAP_NS:
                flush()
            previous = t
        t_end = time.perf_counter_ns() - epoch_ns
        flush()
        state.close()
        return t_end
    finally:
        response.close()


def _failure(exc: StreamError | httpx.HTTPError, state: _RowDecoder, stamps: list[int],
             reads: list[bytes], where: str, base_url: httpx.URL) -> StreamError:
    """The error to report. Everything received before a transport failure is kept; a
    malformed event among it is the earlier failure and is the one reported."""
    if isinstance(exc, RowLimitError):
        # Keep the events that did arrive; the limit is what is reported, even where the
        # cut left a malformed event behind.
        with contextlib.suppress(StreamError, ValueError):
            state.decode(stamps, reads)
        return RowLimitError(f"{exc} ({state.received} tokens, {state.events} events kept)")
    if isinstance(exc, StreamError):
        return exc
    try:
        state.decode(stamps, reads)
    except StreamError as first:
        return first
    return StreamError(_transport_message(exc, where, base_url, state.received, state.events))


def _trace(row_index: int, row: SuiteRow, t_send: int, t_end: int, chunks: list[Chunk],
           events: int, parser: StreamParser) -> RowTrace:
    return RowTrace(
        row=row_index,
        row_id=row.id,
        prompt_sha256=row.prompt_sha256,
        t_send_ns=t_send,
        t_end_ns=t_end,
        chunks=tuple(chunks),
        events=events,
        token_ids=tuple(parser.token_ids) if parser.have_ids and chunks else None,
        prompt_token_ids=tuple(parser.prompt_token_ids) if parser.prompt_token_ids else None,
        text="".join(parser.text),
        finish_reason=parser.finish_reason,
        count_source=parser.source,
        count_mismatches=parser.mismatches,
        prompt_tokens=parser.prompt_tokens,
        completion_tokens=parser.completion_tokens,
        cached_tokens=parser.cached_tokens,
        gapped_token_ids=tuple(parser.positional_ids)
        if chunks and not parser.have_ids and parser.positions_known else None,
    )


def replay_row(
    records: Sequence[Mapping[str, Any]], row: SuiteRow, endpoint: Endpoint, engine: Engine,
) -> RowTrace:
    """Rebuild a row's trace from its raw events.jsonl records, re-parsing every
    payload exactly as the live client did; the recorded per-chunk token counts must
    agree with what the payloads say."""
    typed = parse_events(records, "events.jsonl: the row's event")
    request = next((r for r in typed if isinstance(r, RequestEvent)), None)
    end = next((r for r in typed if isinstance(r, EndEvent)), None)
    if request is None or end is None or not end.ok:
        raise StreamError("events.jsonl: the row has no request or no successful end")
    row_index = request.row
    parser = engine.parser(endpoint)
    chunks: list[Chunk] = []
    events = 0
    for record in typed:
        if isinstance(record, DoneEvent):
            events += 1
        elif isinstance(record, ChunkEvent):
            events += 1
            n, _ids, _text, _finish = parser.parse(json.loads(record.data))
            if n != record.n:
                raise StreamError(
                    f"events.jsonl: row {row_index} event {record.seq}: recorded n={record.n}"
                    f" but its payload carries {n} tokens"
                )
            if n:
                chunks.append(Chunk(t_ns=record.t_ns, n=n))
    return _trace(row_index, row, request.t_send_ns, end.t_ns, chunks, events, parser)


class _ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


def decode_raw_row(raw: RawRow, endpoint: Endpoint, engine: Engine
                   ) -> tuple[list[dict[str, Any]], bool, int, str | None]:
    """One row's events from its raw reads (rawlog), decoded exactly as the live client
    decodes them: the records, whether the stream was complete (its end arrived), the
    tokens received and, for a stream that is not, why."""
    sink = _ListSink()
    parser = engine.parser(endpoint)
    state = _RowDecoder(raw.row, f"row {raw.row}", parser, sink, None)
    if raw.chunked:
        state.chunked = ChunkedDecoder()
    try:
        state.decode(raw.stamps, raw.reads)
        if state.done:
            state.close()
    except (StreamError, ValueError) as exc:  # malformed framing or event: cut there
        return sink.records, False, state.received, str(exc)
    if not state.done:
        return sink.records, False, state.received, (
            f"cut after {state.received} tokens ({state.events} events)")
    return sink.records, True, state.received, None
