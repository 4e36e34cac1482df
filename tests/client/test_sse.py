"""SSE decoder: bytes in, events out, at every split point of real streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.client.sse import SSEDecoder, SSEEvent, SSEProtocolError

FIXTURES = FIXTURES_DIR
RECORDED = sorted(FIXTURES.glob("vllm-cpu-stream-*.sse"))


def decode_all(parts: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for part in parts:
        events.extend(decoder.feed(part))
    decoder.close()
    return events


def test_recorded_fixtures_exist() -> None:
    # The split test below is only meaningful on real engine bytes.
    assert RECORDED, "no recorded vLLM stream under tests/fixtures"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_real_vllm_stream_at_every_split_point(path: Path) -> None:
    data = path.read_bytes()
    whole = decode_all([data])
    assert whole[-1].data == "[DONE]"
    assert len(whole) > 5
    for cut in range(1, len(data)):
        assert decode_all([data[:cut], data[cut:]]) == whole, f"split at byte {cut}"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_real_vllm_stream_byte_by_byte(path: Path) -> None:
    data = path.read_bytes()
    assert decode_all([data[i : i + 1] for i in range(len(data))]) == decode_all([data])


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_line_endings(newline: bytes) -> None:
    stream = newline.join([b"data: one", b"", b"event: x", b"data: two", b"data: 2", b"", b""])
    for cut in range(1, len(stream)):
        events = decode_all([stream[:cut], stream[cut:]])
        assert events == [SSEEvent("one"), SSEEvent("two\n2", event="x")], cut


def test_crlf_split_between_feeds_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [SSEEvent("a")]
    assert decoder.feed(b"\ndata: b\n\n") == [SSEEvent("b")]


def test_comments_and_no_space_after_colon() -> None:
    assert decode_all([b": keepalive\n\ndata:x\n\n"]) == [SSEEvent("x")]


def test_utf8_code_point_split_across_feeds() -> None:
    data = "data: {\"text\": \"héllo→\"}\n\n".encode()
    for cut in range(1, len(data)):
        assert decode_all([data[:cut], data[cut:]]) == [SSEEvent('{"text": "héllo→"}')]


def test_unknown_field_is_a_protocol_error() -> None:
    with pytest.raises(SSEProtocolError, match="malformed"):
        decode_all([b"dta: oops\n\n"])


def test_stream_ending_inside_an_event_is_an_error() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: partial")
    with pytest.raises(SSEProtocolError, match="ended inside an event"):
        decoder.close()


def test_invalid_utf8_is_an_error() -> None:
    with pytest.raises(SSEProtocolError, match="UTF-8"):
        decode_all([b"data: \xff\xfe\n\n"])
