"""The streaming client reads chunked bodies straight from the socket, keeps the
connection for the next row, and falls back to httpx when it cannot."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import pytest

import tokrecord.client.stream as stream
from tokrecord.client import Endpoint, build_body, stream_row
from tokrecord.errors import StreamError
from tokrecord.server.fake import FakeServer, FakeServerConfig, output_token_ids
from tokrecord.suite import SuiteRow


class ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(FakeServerConfig(port=0, ttft_ms=5, tok_s=5000, model="m"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every _direct_body result, None included."""
    calls: list[Any] = []
    original = stream._direct_body

    def spy(response: httpx.Response) -> Any:
        result = original(response)
        if result is not None:  # the socket's address while it is open
            result.local = result.sock.getsockname()
        calls.append(result)
        return result

    monkeypatch.setattr(stream, "_direct_body", spy)
    return calls


def row(i: int, max_tokens: int = 40) -> SuiteRow:
    return SuiteRow(id=f"r{i}", prompt=f"prompt number {i}", max_tokens=max_tokens)


def test_direct_read_keeps_the_connection(fake: FakeServer, direct_calls: list[Any]) -> None:
    sink = ListSink()
    with httpx.Client(base_url=fake.url, timeout=10) as http:
        traces = [
            stream_row(http, row_index=i, row=row(i), body=build_body(Endpoint.COMPLETIONS, "m", row(i)),
                       endpoint=Endpoint.COMPLETIONS, sink=sink)
            for i in range(3)
        ]
    assert all(d is not None for d in direct_calls) and len(direct_calls) == 3
    # one connection for the three rows: the same local port every time
    assert len({d.local for d in direct_calls}) == 1
    for i, trace in enumerate(traces):
        assert trace.token_ids == tuple(output_token_ids(f"prompt number {i}", 40))
        assert trace.n_tokens == 40 and trace.completion_tokens == 40
        assert trace.t_send_ns < trace.chunks[0].t_ns <= trace.chunks[-1].t_ns <= trace.t_end_ns
    kinds = [r["kind"] for r in sink.records if r["row"] == 0]
    assert kinds[0] == "request" and kinds[-2:] == ["done", "end"]
    assert kinds.count("chunk") == 41  # 40 token events and the usage event


class RawServer:
    """Answers every request on a connection with the same raw bytes."""

    def __init__(self, reply: Callable[[int], list[bytes]]) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.requests += 1
                for part in self.reply(self.requests):
                    if part == b"STALL":
                        threading.Event().wait(5)
                        return
                    if part == b"CLOSE":
                        return
                    conn.sendall(part)

    def close(self) -> None:
        self.sock.close()


def sse(ids: list[int], total: int) -> bytes:
    chunk = {"choices": [{"index": 0, "text": "".join(f" t{i}" for i in ids), "token_ids": ids,
                          "finish_reason": None}],
             "usage": {"prompt_tokens": 3, "completion_tokens": total, "total_tokens": 3 + total}}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
EVENTS = [sse([5], 1), sse([6, 7], 3), b"data: [DONE]\n\n"]


def run(url: str, n: int = 1, timeout: float = 5.0) -> list[Any]:
    with httpx.Client(base_url=url, timeout=timeout) as http:
        return [stream_row(http, row_index=i, row=row(i, 3), body=build_body(
            Endpoint.COMPLETIONS, "m", row(i, 3)), endpoint=Endpoint.COMPLETIONS, sink=ListSink())
            for i in range(n)]


def test_body_read_with_the_headers_is_kept(direct_calls: list[Any]) -> None:
    # Headers and the whole body in one write: h11 reads body bytes with the headers.
    server = RawServer(lambda _: [HEAD + chunked(*EVENTS)])
    try:
        traces = run(server.url, n=2)
    finally:
        server.close()
    assert [d is not None and d.ahead != b"" for d in direct_calls] == [True, True]
    assert [t.token_ids for t in traces] == [(5, 6, 7), (5, 6, 7)]
    assert [c.n for c in traces[0].chunks] == [1, 2]
    assert server.connections == 1 and server.requests == 2


def test_body_split_anywhere_across_writes(direct_calls: list[Any]) -> None:
    body = chunked(*EVENTS)
    cuts = [7, 31, len(body) - 3]
    parts = [HEAD, body[:cuts[0]], body[cuts[0]:cuts[1]], body[cuts[1]:cuts[2]], body[cuts[2]:]]
    server = RawServer(lambda _: parts)
    try:
        (trace,) = run(server.url)
    finally:
        server.close()
    assert trace.token_ids == (5, 6, 7) and direct_calls[0] is not None


def test_content_length_body_falls_back_to_httpx(direct_calls: list[Any]) -> None:
    payload = b"".join(EVENTS)
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload))
    server = RawServer(lambda _: [head, payload])
    try:
        (trace,) = run(server.url)
    finally:
        server.close()
    assert direct_calls == [None]
    assert trace.token_ids == (5, 6, 7)


def test_stall_is_a_read_timeout(direct_calls: list[Any]) -> None:
    server = RawServer(lambda _: [HEAD + b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0]), b"STALL"])
    try:
        with pytest.raises(StreamError, match=r"timed out after 1 tokens \(ReadTimeout\)"):
            run(server.url, timeout=0.3)
    finally:
        server.close()
    assert direct_calls[0] is not None


def test_cut_body_keeps_what_arrived(direct_calls: list[Any]) -> None:
    first = b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0])
    server = RawServer(lambda _: [HEAD + first, b"CLOSE"])
    sink = ListSink()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as http, \
                pytest.raises(StreamError, match="stream cut after 1 tokens"):
            stream_row(http, row_index=0, row=row(0, 3),
                       body=build_body(Endpoint.COMPLETIONS, "m", row(0, 3)),
                       endpoint=Endpoint.COMPLETIONS, sink=sink)
    finally:
        server.close()
    assert [r["kind"] for r in sink.records] == ["request", "chunk", "end"]
    assert sink.records[-1]["ok"] is False
