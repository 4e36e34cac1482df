"""Incremental Server-Sent Events decoder: bytes in, events out, no I/O.

Built to the WHATWG event-stream rules (lines end in CRLF, LF or CR; a blank line
dispatches; `:` starts a comment) but strict where leniency would hide a broken
server: a field name we do not know is a protocol error, not something to skip,
because a benchmark must not silently lose tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokrecord.errors import StreamError

_KNOWN_FIELDS = frozenset({"data", "event", "id", "retry"})


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEProtocolError(StreamError):
    """The byte stream is not a valid event stream."""


class SSEDecoder:
    """Feed raw bytes as they arrive; get back the events they complete.

    Splitting bytes at line ends is safe for UTF-8 (CR and LF never occur inside a
    multi-byte sequence), so text is decoded per line and a split code point is
    simply carried in the buffer.
    """

    __slots__ = ("_buffer", "_data", "_data_bytes", "_event", "_id", "_pending_cr", "max_event",
                 "max_line")

    def __init__(self, max_line: int = 4 << 20, max_event: int = 4 << 20) -> None:
        # A server that never ends a line or an event would otherwise grow these forever.
        self.max_line, self.max_event = max_line, max_event
        self._buffer = bytearray()
        self._data: list[str] = []
        self._data_bytes = 0
        self._event: str | None = None
        self._id: str | None = None
        # A CR that ended the previous feed may be the first half of a CRLF.
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if self._pending_cr:
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buffer
        buf += chunk
        events: list[SSEEvent] = []
        start = 0
        n = len(buf)
        while start < n:
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, lf if lf >= 0 else n)
            if cr >= 0:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt] == 0x0A:
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            event = self._line(bytes(buf[start:end]))
            if event is not None:
                events.append(event)
            start = nxt
        del buf[:start]
        if len(buf) > self.max_line:
            raise SSEProtocolError(
                f"event stream line longer than {self.max_line} bytes "
                f"(row_limits.max_line_bytes): {bytes(buf[:80])!r}...")
        return events

    def close(self) -> None:
        """End of stream: an unterminated line or an undispatched event is an error."""
        if self._buffer or self._data:
            raise SSEProtocolError(
                "event stream ended inside an event "
                f"(undelivered bytes: {bytes(self._buffer[:80])!r}, data lines: {len(self._data)})"
            )

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            if not self._data and self._event is None:
                return None
            event = SSEEvent("\n".join(self._data), self._event, self._id)
            self._data = []
            self._data_bytes = 0
            self._event = None
            return event
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEProtocolError(f"event stream line is not UTF-8: {raw[:80]!r}") from exc
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name not in _KNOWN_FIELDS:
            raise SSEProtocolError(f"malformed event stream line: {line[:120]!r}")
        if name == "data":
            self._data_bytes += len(raw)
            if self._data_bytes > self.max_event:
                raise SSEProtocolError(
                    f"event longer than {self.max_event} bytes (row_limits.max_event_bytes), "
                    f"in {len(self._data) + 1} data lines")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None
