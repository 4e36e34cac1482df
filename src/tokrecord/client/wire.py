"""One streamed HTTP/1.1 exchange on a socket of our own, stamped at every `recv`.

httpx builds the request (its URL, headers and body are what the client would
send); this module writes it and reads the response itself. Through httpx the
response headers are parsed and a response object built (h11, httpcore, httpx:
~0.5 ms on this project's 2-core machine) before the first body byte can be
stamped. A server that sends its headers with the first token (as a server does
that starts its response only when it has one) then has t_0 stamped that much late,
and t_1, due 200 µs later at 5000 tok/s, waits behind the same work:
`make fidelity` measured 3.5 % high there, against 1.5 % for a plain http.client.
Here the first `recv` is stamped like every other, and the headers are parsed with
a few byte operations before the next one.

The connection is kept for the next row (a new connection per row would mean a new
server thread per row for a threaded server), and dropped whenever its state is in
doubt: an error, an interruption, `Connection: close`, or bytes after the end.
"""

from __future__ import annotations

import contextlib
import socket
import time
import weakref
from dataclasses import dataclass

import httpx

READ_SIZE = 65536
MAX_HEAD = 65536  # response headers longer than this are not a server we can talk to


@dataclass(frozen=True)
class Head:
    """A response's status line and headers (names lower-cased), and where its body
    begins in the read that completed it."""

    status: int
    headers: dict[str, str]
    body_offset: int

    @property
    def chunked(self) -> bool:
        return self.headers.get("transfer-encoding", "").strip().lower() == "chunked"

    @property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        return int(raw) if raw is not None and raw.strip().isdigit() else None

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").strip().lower() != "close"


def parse_head(data: bytes) -> Head | None:
    """The response head, once `data` (the bytes read so far) holds all of it; None
    while it does not. Raises httpx.RemoteProtocolError for what is not HTTP/1.x."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEAD:
            raise httpx.RemoteProtocolError(f"response headers longer than {MAX_HEAD} bytes")
        return None
    lines = data[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed response header: {line[:80]!r}")
        key = name.strip().lower()
        # Repeated fields combine (RFC 9110, 5.3); a stream's framing headers never repeat.
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return Head(status=int(parts[1]), headers=headers, body_offset=end + 4)


def request_bytes(request: httpx.Request) -> bytes:
    """The request exactly as httpx would frame it on HTTP/1.1: its own headers (Host,
    Content-Length and the client's defaults included) and its body."""
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n" + request.read()


class Wire:
    """A keep-alive connection to one server, for one streamed request at a time."""

    def __init__(self, host: str, port: int, connect_timeout: float | None,
                 read_timeout: float | None) -> None:
        self.host, self.port = host, port
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.sock: socket.socket | None = None
        self.reused = False  # the current socket already carried a complete exchange

    def send(self, data: bytes) -> int:
        """Connect if needed and write the request; returns `perf_counter_ns()` just
        before the write (t_send: after any connection set-up, as httpcore's trace
        hook stamps it)."""
        if self.sock is None:
            try:
                sock = socket.create_connection((self.host, self.port), self.connect_timeout)
            except OSError as exc:
                raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.read_timeout)
            self.sock, self.reused = sock, False
        t_send = time.perf_counter_ns()
        try:
            self.sock.sendall(data)
        except OSError as exc:
            self.close()
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        return t_send

    def recv(self) -> bytes:
        assert self.sock is not None
        try:
            return self.sock.recv(READ_SIZE)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    def done(self, keep: bool) -> None:
        """The exchange ended cleanly: keep the socket for the next one, or close it."""
        if keep:
            self.reused = True
        else:
            self.close()

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.reused = None, False


_WIRES: weakref.WeakKeyDictionary[httpx.Client, Wire] = weakref.WeakKeyDictionary()


def wire_for(http: httpx.Client) -> Wire | None:
    """The client's own connection for streamed rows, when the client is a plain
    http:// client with httpx's default transport (its base URL, timeouts and headers
    apply); None otherwise (a mock transport, a proxy, https), and the rows go
    through httpx."""
    transport = getattr(http, "_transport", None)
    if type(transport) is not httpx.HTTPTransport or getattr(http, "_mounts", None):
        return None
    url = http.base_url
    if url.scheme != "http" or not url.host:
        return None
    wire = _WIRES.get(http)
    if wire is None:
        timeout = http.timeout
        wire = Wire(url.host, url.port or 80, timeout.connect, timeout.read)
        _WIRES[http] = wire
        # Closed with the client's last reference; the leg closes it after its rows.
        weakref.finalize(http, wire.close)
    return wire


def close_wire(http: httpx.Client) -> None:
    """Close the client's streaming connection, if it has one (before stopping the
    server, so that no socket of ours is left to the server's shutdown)."""
    wire = _WIRES.pop(http, None)
    if wire is not None:
        wire.close()
