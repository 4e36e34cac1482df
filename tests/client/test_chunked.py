"""The chunked transfer decoder: every split point of a real body, and every bad frame."""

from __future__ import annotations

import pytest

from tokrecord.client.chunked import ChunkedDecoder, ChunkedProtocolError

EVENTS = [b'data: {"choices":[{"text":" t1","token_ids":[1]}]}\n\n',
          b'data: {"choices":[{"text":" t22","token_ids":[22]}]}\n\n',
          b"data: [DONE]\n\n"]


def frame(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


BODY = b"".join(frame(e) for e in EVENTS) + b"0\r\n\r\n"
PAYLOAD = b"".join(EVENTS)


def decode_all(parts: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    dec = ChunkedDecoder()
    out = b"".join(piece for part in parts for piece in dec.feed(part))
    return out, dec


def test_whole_body() -> None:
    out, dec = decode_all([BODY])
    assert out == PAYLOAD and dec.done
    dec.close()


@pytest.mark.parametrize("cut", range(1, len(BODY)))
def test_every_split_point(cut: int) -> None:
    out, dec = decode_all([BODY[:cut], BODY[cut:]])
    assert out == PAYLOAD and dec.done


def test_byte_by_byte_and_pieces_follow_reads() -> None:
    dec = ChunkedDecoder()
    pieces = [dec.feed(BODY[i:i + 1]) for i in range(len(BODY))]
    assert b"".join(p for ps in pieces for p in ps) == PAYLOAD
    # a payload byte comes out of the very feed that brought it
    first_payload_byte = BODY.index(b"data")
    assert pieces[first_payload_byte] == [b"d"]
    assert all(ps == [] for ps in pieces[:first_payload_byte])
    assert dec.done


def test_not_done_until_the_final_crlf() -> None:
    dec = ChunkedDecoder()
    dec.feed(BODY[:-2])
    assert not dec.done
    with pytest.raises(ChunkedProtocolError, match="incomplete chunked read"):
        dec.close()
    assert dec.feed(b"\r\n") == [] and dec.done


def test_extensions_uppercase_hex_and_trailers() -> None:
    payload = b"x" * 26
    body = b"1A;name=value\r\n" + payload + b"\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n"
    out, dec = decode_all([body])
    assert out == payload and dec.done


@pytest.mark.parametrize(("body", "match"), [
    (b"zz\r\nabc\r\n", "invalid chunk-size line"),
    (b"0x3\r\nabc\r\n", "invalid chunk-size line"),
    (b"+3\r\nabc\r\n", "invalid chunk-size line"),
    (b"\r\nabc\r\n", "invalid chunk-size line"),
    (b"3\r\nabcXY", "not followed by CRLF"),
    (b"0\r\n\r\nextra", "bytes after the last chunk"),
    (b"f" * 5000, "too long"),
])
def test_malformed(body: bytes, match: str) -> None:
    with pytest.raises(ChunkedProtocolError, match=match):
        ChunkedDecoder().feed(body)


def test_bytes_fed_after_the_end() -> None:
    dec = ChunkedDecoder()
    dec.feed(BODY)
    assert dec.feed(b"") == []
    with pytest.raises(ChunkedProtocolError, match="after the last chunk"):
        dec.feed(b"1\r\na\r\n")
