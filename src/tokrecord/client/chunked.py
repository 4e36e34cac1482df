"""Incremental HTTP/1.1 chunked transfer decoder: bytes in, payload pieces out, no I/O.

The streaming client reads a response body straight from the socket (see
`client.stream`) and decodes the framing after the stamps are taken. Each feed
returns the payload bytes that call completed, so a piece can carry the arrival
stamp of the read it came in. Strict, as the SSE decoder is: a malformed frame is
a protocol error, never skipped (RFC 9112, section 7.1).
"""

from __future__ import annotations

from tokrecord.errors import StreamError

_HEX = frozenset(b"0123456789abcdefABCDEF")
MAX_LINE = 4096  # a chunk-size line or trailer field longer than this is not HTTP


class ChunkedProtocolError(StreamError):
    """The body is not valid chunked transfer coding."""


class ChunkedDecoder:
    """Feed raw body bytes in arrival order; get back payload pieces."""

    __slots__ = ("_buffer", "_remaining", "_state", "done")

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self) -> None:
        self._buffer = b""
        self._state = self._SIZE
        self._remaining = 0
        self.done = False  # the last chunk and the trailer section have been read

    def feed(self, data: bytes) -> list[bytes]:
        if self.done:
            if data:
                raise ChunkedProtocolError(f"bytes after the last chunk: {data[:40]!r}")
            return []
        buf = self._buffer + data if self._buffer else data
        pieces: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end:
            if self._state == self._DATA:
                take = min(self._remaining, end - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = self._DATA_END
            elif self._state == self._DATA_END:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ChunkedProtocolError(
                        f"chunk data not followed by CRLF: {buf[pos:pos + 20]!r}")
                pos += 2
                self._state = self._SIZE
            else:  # a size line, or a trailer line
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if end - pos > MAX_LINE:
                        raise ChunkedProtocolError("chunk-size or trailer line too long")
                    break
                line = buf[pos:nl]
                pos = nl + 2
                if self._state == self._TRAILER:
                    if not line:
                        self.done = True
                        if pos < end:
                            raise ChunkedProtocolError(
                                f"bytes after the last chunk: {buf[pos:pos + 40]!r}")
                        break
                    continue  # a trailer field: nothing a stream of events needs
                size_text = line.split(b";", 1)[0].rstrip(b" \t")
                if not size_text or not set(size_text) <= _HEX:
                    raise ChunkedProtocolError(f"invalid chunk-size line: {line[:40]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self._state, self._remaining = self._DATA, size
        self._buffer = buf[pos:]
        return pieces

    def close(self) -> None:
        """End of input: anything short of the last chunk is an error."""
        if not self.done:
            raise ChunkedProtocolError(
                "incomplete chunked read: the body ended before its last chunk")
