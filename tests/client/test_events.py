"""client.events: the lines of a leg's events.jsonl as a union discriminated by `kind`:
every line of a sealed H200 leg reads, the replay refuses what is not an event by key."""

from __future__ import annotations

import tarfile
from typing import Any

import pytest

from paths import ROOT
from tokrecord.client.events import (
    ChunkEvent,
    DoneEvent,
    EndEvent,
    RequestEvent,
    parse_event,
    parse_events,
)
from tokrecord.errors import StreamError
from tokrecord.evidence import read_jsonl


@pytest.fixture(scope="module")
def leg_events(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("h200")
    name = "exp-graphs/A1/attempt-1/events.jsonl"
    with tarfile.open(ROOT / "examples" / "h200" / "exp-graphs.tar.gz") as tar:
        tar.extractall(out, members=[tar.getmember(name)], filter="data")
    return read_jsonl(out / name)


def test_a_sealed_legs_events_read_as_their_kinds(leg_events: list[dict[str, Any]]) -> None:
    typed = parse_events(leg_events, "events.jsonl: event")
    kinds = {type(e) for e in typed}
    assert kinds == {RequestEvent, ChunkEvent, EndEvent}  # llama.cpp's stream: no [DONE]
    chunks = [e for e in typed if isinstance(e, ChunkEvent)]
    assert sum(c.n for c in chunks) > 0 and all(c.data for c in chunks)
    requests = [e for e in typed if isinstance(e, RequestEvent)]
    ends = [e for e in typed if isinstance(e, EndEvent)]
    assert len(requests) == len(ends) and all(e.ok for e in ends)


def test_recovered_events_carry_their_marks() -> None:
    end = parse_event({"kind": "end", "row": 3, "t_ns": 9, "ok": False, "error": "cut",
                       "recovered": True, "complete_on_wire": False}, "recovered-events.jsonl")
    assert isinstance(end, EndEvent) and end.recovered and end.complete_on_wire is False
    assert isinstance(parse_event({"kind": "done", "row": 0, "t_ns": 1}, "x"), DoneEvent)


@pytest.mark.parametrize(("line", "key"), [
    ({"kind": "chunkk", "row": 0, "t_ns": 1}, "kind"),
    ({"row": 0, "t_ns": 1}, "kind"),
    ({"kind": "chunk", "row": 0, "seq": 0, "t_ns": 1, "n": 1, "ids": None, "text": None,
      "finish": None}, "data"),
    ({"kind": "end", "row": 0, "t_ns": "soon", "ok": True}, "t_ns"),
    ({"kind": "done", "row": 0, "t_ns": 1, "extra": 1}, "extra"),
])
def test_what_is_not_an_event_is_refused_naming_the_key(line: dict[str, Any], key: str) -> None:
    with pytest.raises(StreamError, match=rf"^events.jsonl: event 2: key '{key}'"):
        parse_events([{"kind": "done", "row": 0, "t_ns": 0}, line], "events.jsonl: event")
