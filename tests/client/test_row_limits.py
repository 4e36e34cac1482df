"""A row is bounded in time and bytes (client.limits): a hostile server cannot hold the
client forever or fill its memory, and what it sent before the limit is kept."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokrecord.client import Endpoint, build_body, stream_row
from tokrecord.client.limits import RowLimitError, RowLimits
from tokrecord.client.rawlog import read_raw
from tokrecord.client.sse import SSEDecoder, SSEProtocolError
from tokrecord.engines import ENGINES, EngineName
from tokrecord.suite import SuiteRow

VLLM = ENGINES[EngineName.VLLM]  # the fake server's default dialect

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


class ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


def event(i: int) -> bytes:
    chunk = {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i], "finish_reason": None}]}
    payload = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class Hostile:
    """A loopback server that reads one request and then runs `behave` on the socket
    until the client goes away."""

    def __init__(self, behave: Callable[[socket.socket, threading.Event], None]) -> None:
        self.behave = behave
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            with contextlib.suppress(OSError):  # the client hung up: what a limit does
                self.behave(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(5)


def forever(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEAD)
    i = 0
    while not stop.is_set():
        conn.sendall(event(i))
        i += 1


def one_endless_line(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEAD + event(1))
    piece = b"x" * 65536
    conn.sendall(b"%x\r\ndata: " % (100 * 1024 * 1024 + 6))
    while not stop.is_set():
        conn.sendall(piece)


def no_headers(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, threading.Event], None]], Hostile]]:
    servers: list[Hostile] = []

    def start(behave: Callable[[socket.socket, threading.Event], None]) -> Hostile:
        servers.append(Hostile(behave))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def stream(url: str, limits: RowLimits, raw: Path, max_tokens: int = 8,
           transport: httpx.BaseTransport | None = None) -> tuple[ListSink, Exception]:
    row = SuiteRow(id="r0", prompt="p", max_tokens=max_tokens)
    sink = ListSink()
    fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with (httpx.Client(base_url=url, timeout=600, transport=transport) as http,
              pytest.raises(RowLimitError) as info):
            stream_row(http, row_index=0, row=row,
                       body=build_body(Endpoint.COMPLETIONS, "m", row, engine=VLLM),
                       endpoint=Endpoint.COMPLETIONS, sink=sink, raw_fd=fd, limits=limits, engine=VLLM)
    finally:
        os.close(fd)
    return sink, info.value


def test_a_server_that_streams_forever_meets_the_row_deadline(serve: Any, tmp_path: Path) -> None:
    server = serve(forever)
    limits = RowLimits(deadline_floor_s=0.3, deadline_per_token_s=0.05, bytes_floor=1 << 30,
                       events_floor=1 << 30)
    sink, error = stream(server.url, limits, tmp_path / "raw.bin")
    assert "past the row's deadline" in str(error) and "0.7 s = 0.3 s + 8 max_tokens" in str(error)
    chunks = [r for r in sink.records if r["kind"] == "chunk"]
    end = sink.records[-1]
    assert end["kind"] == "end" and not end["ok"] and "deadline" in end["error"]
    # Everything received is kept: the decoded events and every read in the raw log.
    rows, torn = read_raw(tmp_path / "raw.bin")
    assert torn == 0 and len(chunks) > 8
    received = b"".join(rows[0].reads)
    assert received.count(b"data: ") >= len(chunks)


def test_endless_small_events_meet_the_event_count(serve: Any, tmp_path: Path) -> None:
    server = serve(forever)
    limits = RowLimits(events_floor=10, events_per_token=1.5)  # 10 + 8 x 1.5 = 22
    sink, error = stream(server.url, limits, tmp_path / "raw.bin")
    assert "more than 22 events = 10 + 8 max_tokens x 1.5" in str(error)
    # Decoding stops at the cap; every byte that arrived is still in the raw log.
    assert [r["ids"] for r in sink.records if r["kind"] == "chunk"] == [[i] for i in range(22)]
    rows, _ = read_raw(tmp_path / "raw.bin")
    assert b"".join(rows[0].reads).count(b"data: ") > 22


def test_a_100_mb_line_meets_the_byte_limit(serve: Any, tmp_path: Path) -> None:
    server = serve(one_endless_line)
    limits = RowLimits(bytes_floor=1 << 20, bytes_per_token=1024)
    sink, error = stream(server.url, limits, tmp_path / "raw.bin")
    assert "over the row's byte limit" in str(error)
    assert f"limit {(1 << 20) + 8 * 1024} bytes" in str(error)
    assert [r["ids"] for r in sink.records if r["kind"] == "chunk"] == [[1]]
    rows, _ = read_raw(tmp_path / "raw.bin")
    kept = sum(len(r) for r in rows[0].reads)
    # Every read up to the one that crossed the limit is in the raw log, and the loop
    # stopped within one check's worth of reads of the limit.
    assert (1 << 20) < kept <= (1 << 20) + 8 * 1024 + 65 * 65536


def test_a_server_that_never_sends_headers_meets_the_deadline(serve: Any,
                                                              tmp_path: Path) -> None:
    server = serve(no_headers)
    limits = RowLimits(deadline_floor_s=0.3, deadline_per_token_s=0)
    sink, error = stream(server.url, limits, tmp_path / "raw.bin")
    assert "past the row's deadline after 0 reads" in str(error)
    assert sink.records[0]["kind"] == "request" and sink.records[-1]["kind"] == "end"


def test_the_limits_hold_through_httpx_too(tmp_path: Path) -> None:
    def endless() -> Iterator[bytes]:
        i = 0
        while True:
            yield event(i)[4:-2]  # the SSE payload of each chunk, unframed
            i += 1

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=endless())

    limits = RowLimits(bytes_floor=64 * 1024, bytes_per_token=0, events_floor=1 << 30)
    sink, error = stream("http://test", limits, tmp_path / "raw.bin",
                         transport=httpx.MockTransport(handler))
    assert "over the row's byte limit" in str(error)
    assert len([r for r in sink.records if r["kind"] == "chunk"]) > 100


def test_sse_line_and_event_caps() -> None:
    decoder = SSEDecoder(max_line=100, max_event=1000)
    assert decoder.feed(b"data: " + b"x" * 90 + b"\n") == []
    with pytest.raises(SSEProtocolError, match="line longer than 100 bytes"):
        decoder.feed(b"data: " + b"y" * 100)
    decoder = SSEDecoder(max_line=100, max_event=250)
    line = b"data: " + b"z" * 80 + b"\n"  # 86 bytes: three make an event of 258
    decoder.feed(line * 2)
    with pytest.raises(SSEProtocolError, match="event longer than 250 bytes"):
        decoder.feed(line)
    # An event under both caps, sent one byte at a time, is whole.
    decoder = SSEDecoder(max_line=100, max_event=250)
    out = [e for b in (line * 2 + b"\n") for e in decoder.feed(bytes([b]))]
    assert [len(e.data) for e in out] == [80 + 1 + 80]


@pytest.mark.serial  # real elapsed time: rows paced against a 2 s deadline
def test_a_kept_connection_does_not_carry_the_last_rows_short_wait(serve: Any) -> None:
    """Near its deadline a slow row shortens the socket's wait; the next row on the same
    connection must get the full read timeout back."""
    done = event(0) + b"%x\r\n%b\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n") + \
        b"0\r\n\r\n"

    def two_rows(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(HEAD)
        for _ in range(6):  # row 1: slow reads until close to its 2 s deadline
            stop.wait(0.3)
            conn.sendall(event(1))
        conn.sendall(done)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += conn.recv(65536)
        stop.wait(0.8)  # row 2: its first byte after 0.8 s, within the 1.5 s read timeout
        conn.sendall(HEAD + done)

    server = serve(two_rows)
    limits = RowLimits(deadline_floor_s=2.0, deadline_per_token_s=0, events_floor=1 << 20)
    row = SuiteRow(id="r0", prompt="p", max_tokens=8)
    with httpx.Client(base_url=server.url, timeout=1.5) as http:
        traces = [stream_row(http, row_index=i, row=row,
                             body=build_body(Endpoint.COMPLETIONS, "m", row, engine=VLLM),
                             endpoint=Endpoint.COMPLETIONS, sink=ListSink(), limits=limits, engine=VLLM)
                  for i in range(2)]
    assert [t.n_tokens for t in traces] == [7, 1]
