"""The raw log of a leg: every read's bytes, appended as they arrive (`raw-reads.bin`).

The token loop keeps the bytes of a row in memory and decodes them after the row
(`stream.stream_row`): decoding inside the loop would delay the next stamp. A SIGKILL
in the middle of a fast row therefore used to lose the row's events. Now each read is
also appended, with its stamp, to this file with one unbuffered `writev` on an
O_APPEND descriptor: no decoding, no buffer, no copy. After a kill, `recover` decodes
what arrived exactly as the live client would have, into `recovered-events.jsonl` (a
new file; events.jsonl is never touched), and marks every row that had not ended as
incomplete: such a row is evidence of what happened, never a counted row (its attempt
is interrupted, and only a complete attempt counts).

Format: records of a 17-byte little-endian header `kind:u8 row:u32 length:u32 t_ns:i64`
and `length` bytes. A row opens with a RAW_CHUNKED (HTTP/1.1 chunked framing, read from
the socket) or RAW_PLAIN (body bytes from httpx) record; each RAW_READ carries one read.
A last record cut short by the kill is reported (`torn_bytes`), not decoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

HEADER = struct.Struct("<BIIq")
RAW_CHUNKED, RAW_PLAIN, RAW_READ = 1, 2, 3


@dataclass
class RawRow:
    row: int
    chunked: bool
    stamps: list[int] = field(default_factory=list)
    reads: list[bytes] = field(default_factory=list)


def read_raw(path: Path) -> tuple[dict[int, RawRow], int]:
    """The rows of a raw log, and how many bytes at its end are a torn record."""
    data = path.read_bytes()
    rows: dict[int, RawRow] = {}
    at = 0
    while at + HEADER.size <= len(data):
        kind, row, length, t_ns = HEADER.unpack_from(data, at)
        end = at + HEADER.size + length
        if kind not in (RAW_CHUNKED, RAW_PLAIN, RAW_READ) or end > len(data):
            break
        if kind == RAW_READ:
            if row in rows:
                rows[row].stamps.append(t_ns)
                rows[row].reads.append(data[at + HEADER.size:end])
        else:
            # A row is streamed once per attempt; a second opening would be a new stream.
            rows[row] = RawRow(row, kind == RAW_CHUNKED)
        at = end
    return rows, len(data) - at
