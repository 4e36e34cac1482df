"""Stream one row and keep every chunk.

The hot loop only stamps `perf_counter_ns()` the moment a read returns bytes and
keeps them; SSE and JSON decoding, and appending each event (with its stamp) to the
run's events.jsonl, follow the stream (see `stream_row`). What a payload means is
the engine's dialect (`tokrecord.engines`): token counts per chunk always come from
the server, never from re-tokenized text.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict

from tokrecord.client.chunked import ChunkedDecoder
from tokrecord.client.rawlog import HEADER, RAW_CHUNKED, RAW_PLAIN, RAW_READ, RawRow
from tokrecord.client.sse import SSEDecoder
from tokrecord.engines import ENGINES, CountSource, Endpoint, Engine, EngineName, StreamParser
from tokrecord.errors import StreamError
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

    @property
    def n_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


def build_body(
    endpoint: Endpoint,
    model: str,
    row: SuiteRow,
    extra: Mapping[str, Any] | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """The request for one row in the engine's dialect (vLLM's when none is given)."""
    return (engine or ENGINES[EngineName.VLLM]).build_body(endpoint, model, row, extra)


def _transport_message(
    exc: httpx.HTTPError, where: str, base_url: httpx.URL, received: int, events: int
) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{where}: cannot connect to {base_url}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where}: timed out after {received} tokens ({type(exc).__name__})"
    detail = str(exc) or type(exc).__name__
    return f"{where}: stream cut after {received} tokens ({events} events): {detail}"


READ_SIZE = 65536
# From an httpx response's stream to its connection's h11 state (httpx 0.28, httpcore 1.0).
_H11_PATH = ("_stream", "_httpcore_stream", "_stream", "_connection", "_h11_state")


def _read_timeout(response: httpx.Response) -> float | None:
    timeout = response.request.extensions.get("timeout", {})
    read = timeout.get("read") if isinstance(timeout, dict) else None
    return float(read) if read is not None else None


class _Direct:
    """A response body read straight from its connection's socket."""

    def __init__(self, sock: socket.socket, ahead: bytes, h11_state: Any) -> None:
        self.sock = sock
        self.ahead = ahead  # body bytes h11 read with the headers (still in its buffer)
        self.h11_state = h11_state

    def hand_back(self, body: Sequence[bytes]) -> None:
        """Give h11 the body bytes it did not read, so that httpcore sees a complete
        response and keeps the connection for the next row. A new connection per row
        would mean a new server thread per row, which on a 2-core machine delays the
        first chunks of the next row by milliseconds. Any failure here only costs the
        reuse: httpcore then closes the connection."""
        state = self.h11_state
        data = b"".join(body)
        try:
            if data:  # to h11, receive_data(b"") means the peer closed the connection
                state.receive_data(data)
            # Data events until EndOfMessage (or anything else: a sentinel such as
            # NEED_DATA is a class, hence the __name__ lookup first).
            while getattr(event := state.next_event(), "__name__", type(event).__name__) == "Data":
                pass
        except Exception:  # any h11 complaint: no reuse, nothing worse (see above)
            return


def _direct_body(response: httpx.Response) -> _Direct | None:
    """The connection's socket, when the body can be read straight from it: HTTP/1.1
    with chunked framing, through the httpx/httpcore/h11 objects of the pinned versions.

    httpx's path from `recv` to `iter_raw` (httpcore, h11, four generators) costs
    ~20 µs per read warm and ~150 µs on the first read after an idle TTFT, which
    lands on t_0 and, at high rates, on t_1: reading the socket directly stamps as
    soon as `recv` returns. None, and the ordinary httpx path, whenever any of this
    cannot be established.
    """
    if response.http_version != "HTTP/1.1":
        return None
    if response.headers.get("transfer-encoding", "").strip().lower() != "chunked":
        return None
    network = response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if not isinstance(sock, socket.socket):
        return None
    # httpx -> httpcore -> h11 objects of the pinned versions; any change: fall back.
    node: Any = response.stream
    try:
        for name in _H11_PATH:
            node = getattr(node, name)
        ahead, closed = node.trailing_data
    except (AttributeError, TypeError, ValueError):
        return None
    if closed or not isinstance(ahead, bytes | bytearray):
        return None
    return _Direct(sock, bytes(ahead), node)


# Decoding while a stream is slow: when the previous gap between two reads was at
# least this long, decoding the (one or two) reads kept since cannot delay the next
# stamp, so slow engines get live progress and their events are flushed as they come.
LIVE_DECODE_GAP_NS = 2_000_000
_SEND_STARTED = "send_request_headers.started"


class _RowDecoder:
    """Everything after the stamp: SSE framing, JSON, token counts, the sink.

    Works on the reads the token loop stored, in order; each event takes the stamp
    of the read that completed it (the bytes' arrival), whenever it is decoded.
    """

    def __init__(self, row_index: int, where: str, parser: StreamParser, sink: EventSink,
                 on_tokens: Callable[[int, int], None] | None) -> None:
        self.chunked: ChunkedDecoder | None = None  # set when reads carry HTTP framing
        self.row_index = row_index
        self.where = where
        self.sink = sink
        self.on_tokens = on_tokens
        self.parser = parser
        self.decoder = SSEDecoder()
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
    engine: Engine | None = None,
    raw_fd: int | None = None,
) -> RowTrace:
    """POST one streaming request and record it. Raises StreamError on any failure,
    after writing an `end` event that says what went wrong.

    The token loop only stamps and stores: `perf_counter_ns()` the moment a read
    returns, and the bytes. Decoding, parsing and writing events.jsonl follow the
    stream's end (or run between reads while the stream is slow, see
    LIVE_DECODE_GAP_NS), so they cannot delay a later stamp: at 20,000 tok/s a chunk
    arrives every 50 µs, less than decoding one costs in Python. `t_send` is stamped
    by httpcore's trace hook as the request headers start to be written (after any
    connection set-up), falling back to just before `send` for a transport without
    the hook.

    Times are `perf_counter_ns() - epoch_ns`: the leg's clock, so recorded integers
    stay small (RFC 8785 / I-JSON) whatever the host's uptime.

    `raw_fd` (an O_APPEND descriptor, see `tokrecord.client.rawlog`): each read's bytes
    and stamp are also appended there, one unbuffered write per read, as they arrive,
    so that a SIGKILL in the middle of a row, before any decoding, loses nothing that
    had arrived; a resume decodes them (experiment.recovery)."""
    where = f"row {row_index} ({row.id})"
    sent: list[int] = []

    def trace(event_name: str, info: Mapping[str, Any]) -> None:
        if event_name.endswith(_SEND_STARTED) and not sent:
            sent.append(time.perf_counter_ns())

    dialect = engine or ENGINES[EngineName.VLLM]
    path = dialect.path(endpoint)
    # A server that closes every streamed response's socket is told so, so that no
    # row ever waits on a connection the server has already dropped.
    headers = {"Connection": "close"} if dialect.close_after_stream else None
    request = http.build_request("POST", path, json=dict(body), headers=headers,
                                 extensions={"trace": trace})
    state = _RowDecoder(row_index, where, dialect.parser(endpoint), sink, on_tokens)
    stamps: list[int] = []
    reads: list[bytes] = []
    request_written = False

    def write_request() -> int:
        nonlocal request_written
        t_send = (sent[0] if sent else t_fallback) - epoch_ns
        if not request_written:
            request_written = True
            sink.write({"kind": "request", "row": row_index, "row_id": row.id,
                        "t_send_ns": t_send, "path": path, "body": dict(body)})
        return t_send

    t_fallback = time.perf_counter_ns()
    try:
        response = http.send(request, stream=True)
        # Written once the request is out (its headers answered): nothing to time then.
        write_request()
        try:
            if response.status_code != 200:
                response.read()
                detail = response.text[:ERROR_BODY_CHARS].strip()
                raise StreamError(
                    f"{where}: HTTP {response.status_code} from {path}: {detail or '(empty body)'}"
                )
            direct = _direct_body(response)
            raw = (raw_fd, row_index) if raw_fd is not None else None
            if direct is not None:
                _read_direct(direct, _read_timeout(response), state, stamps, reads, epoch_ns, raw)
            else:
                _read_httpx(response, state, stamps, reads, epoch_ns, raw)
            t_end = time.perf_counter_ns() - epoch_ns
            state.decode(stamps, reads)
            state.close()
            if direct is not None and not dialect.close_after_stream:
                direct.hand_back(reads[1:] if direct.ahead else reads)
        finally:
            response.close()
    except (StreamError, httpx.HTTPError) as exc:
        t_fail = time.perf_counter_ns() - epoch_ns
        write_request()
        error = _failure(exc, state, stamps, reads, where, http.base_url)
        sink.write({"kind": "end", "row": row_index, "t_ns": t_fail, "ok": False,
                    "error": str(error)})
        if error is exc:
            raise
        raise error from exc
    except BaseException as exc:  # Ctrl-C, SIGTERM: keep what arrived, then go
        with contextlib.suppress(Exception):
            write_request()
            state.decode(stamps, reads)
            sink.write({"kind": "end", "row": row_index, "t_ns": time.perf_counter_ns() - epoch_ns,
                        "ok": False, "error": f"interrupted ({type(exc).__name__})"})
        raise
    t_send = write_request()
    if not state.done:
        msg = (f"{where}: stream ended without [DONE] after {state.received} tokens "
               f"({state.events} events)")
        sink.write({"kind": "end", "row": row_index, "t_ns": t_end, "ok": False, "error": msg})
        raise StreamError(msg)
    sink.write({"kind": "end", "row": row_index, "t_ns": t_end, "ok": True})
    return _trace(row_index, row, t_send, t_end, state.chunks, state.events, state.parser)


def _read_direct(direct: _Direct, timeout: float | None, state: _RowDecoder, stamps: list[int],
                 reads: list[bytes], epoch_ns: int, raw: tuple[int, int] | None = None) -> None:
    """The token loop on the raw socket: stamp, store (and append to the raw log), and
    decode only at a possible end or after a slow gap (LIVE_DECODE_GAP_NS)."""
    sock, ahead = direct.sock, direct.ahead
    chunked = state.chunked = ChunkedDecoder()
    # The raw log: one os.writev per read (header and bytes, no copy, no buffer), after
    # the stamp; None without a log. Locals, so the loop does no attribute lookups.
    raw_fd, raw_row = raw if raw is not None else (-1, 0)
    writev, pack = os.writev, HEADER.pack
    if raw is not None:
        os.write(raw_fd, pack(RAW_CHUNKED, raw_row, 0, 0))
    if ahead:  # body bytes httpx read with the headers
        stamps.append(time.perf_counter_ns() - epoch_ns)
        reads.append(ahead)
        if raw is not None:
            writev(raw_fd, (pack(RAW_READ, raw_row, len(ahead), stamps[-1]), ahead))
    tail = ahead[-4:]
    if tail == b"\r\n\r\n":  # perhaps the whole body came with the headers
        state.decode(stamps, reads)
    sock.settimeout(timeout)
    previous = 0
    while not chunked.done:
        try:
            data = sock.recv(READ_SIZE)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc
        t = time.perf_counter_ns()
        if not data:
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body "
                "(incomplete chunked read)")
        stamps.append(t - epoch_ns)
        reads.append(data)
        if raw is not None:
            writev(raw_fd, (pack(RAW_READ, raw_row, len(data), t - epoch_ns), data))
        tail = (tail + data)[-4:]
        # Every body ends in CRLF CRLF (last chunk, trailers): only then is the framing
        # decoded to see whether this was the end.
        end_maybe = tail == b"\r\n\r\n"
        if end_maybe or (previous and t - previous >= LIVE_DECODE_GAP_NS):
            state.decode(stamps, reads)
        previous = t


def _read_httpx(response: httpx.Response, state: _RowDecoder, stamps: list[int],
                reads: list[bytes], epoch_ns: int, raw: tuple[int, int] | None = None) -> None:
    """The token loop through httpx, for a transport without a raw socket."""
    raw_fd, raw_row = raw if raw is not None else (-1, 0)
    writev, pack = os.writev, HEADER.pack
    if raw is not None:
        os.write(raw_fd, pack(RAW_PLAIN, raw_row, 0, 0))
    previous = 0
    for data in response.iter_raw():
        t = time.perf_counter_ns()
        stamps.append(t - epoch_ns)
        reads.append(data)
        if raw is not None:
            writev(raw_fd, (pack(RAW_READ, raw_row, len(data), t - epoch_ns), data))
        if previous and t - previous >= LIVE_DECODE_GAP_NS:
            state.decode(stamps, reads)
        previous = t


def _failure(exc: StreamError | httpx.HTTPError, state: _RowDecoder, stamps: list[int],
             reads: list[bytes], where: str, base_url: httpx.URL) -> StreamError:
    """The error to report. Everything received before a transport failure is kept; a
    malformed event among it is the earlier failure and is the one reported."""
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
    )


def replay_row(
    records: Sequence[Mapping[str, Any]], row: SuiteRow, endpoint: Endpoint,
    engine: Engine | None = None,
) -> RowTrace:
    """Rebuild a row's trace from its raw events.jsonl records, re-parsing every
    payload exactly as the live client did; the recorded per-chunk token counts must
    agree with what the payloads say."""
    request = next((r for r in records if r["kind"] == "request"), None)
    end = next((r for r in records if r["kind"] == "end"), None)
    if request is None or end is None or not end.get("ok"):
        raise StreamError("events.jsonl: the row has no request or no successful end")
    row_index = int(request["row"])
    parser = (engine or ENGINES[EngineName.VLLM]).parser(endpoint)
    chunks: list[Chunk] = []
    events = 0
    for record in records:
        if record["kind"] == "done":
            events += 1
        elif record["kind"] == "chunk":
            events += 1
            n, _ids, _text, _finish = parser.parse(json.loads(record["data"]))
            if n != record["n"]:
                raise StreamError(
                    f"events.jsonl: row {row_index} event {record['seq']}: recorded n={record['n']}"
                    f" but its payload carries {n} tokens"
                )
            if n:
                chunks.append(Chunk(t_ns=int(record["t_ns"]), n=n))
    return _trace(row_index, row, int(request["t_send_ns"]), int(end["t_ns"]), chunks, events,
                  parser)


class _ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


def decode_raw_row(raw: RawRow, endpoint: Endpoint, engine: Engine | None = None
                   ) -> tuple[list[dict[str, Any]], bool, int, str | None]:
    """One row's events from its raw reads (rawlog), decoded exactly as the live client
    decodes them: the records, whether the stream was complete (its end arrived), the
    tokens received and, for a stream that is not, why."""
    sink = _ListSink()
    parser = (engine or ENGINES[EngineName.VLLM]).parser(endpoint)
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
