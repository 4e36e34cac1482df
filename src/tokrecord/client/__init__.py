"""Streaming client: one request at a time, every chunk timestamped on arrival."""

from tokrecord.client.sse import SSEDecoder, SSEEvent, SSEProtocolError
from tokrecord.client.stream import RowTrace, build_body, stream_row
from tokrecord.client.wire import close_wire
from tokrecord.engines import CountSource, Endpoint

__all__ = [
    "CountSource",
    "Endpoint",
    "RowTrace",
    "SSEDecoder",
    "SSEEvent",
    "SSEProtocolError",
    "build_body",
    "close_wire",
    "stream_row",
]
