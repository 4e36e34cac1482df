"""The entries of a leg's raw event log (events.jsonl), one model per `kind`.

The live client writes them as it reads the stream (dicts, on the hot path: see
`_RowDecoder`); whoever reads them back (verify's replay, recovery) gets this union,
discriminated by `kind`, and matches on the types. A resume's decoded rows
(`recovered-events.jsonl`) carry `recovered` and, on their end, `complete_on_wire`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tokrecord.errors import StreamError


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    recovered: bool | None = None  # decoded from the raw reads after a kill


class RequestEvent(_Event):
    kind: Literal["request"]
    row_id: str
    t_send_ns: int
    path: str
    body: Mapping[str, Any]


class ChunkEvent(_Event):
    kind: Literal["chunk"]
    seq: int
    t_ns: int
    n: int
    ids: list[int] | None
    text: str | None
    finish: str | None
    data: str  # the SSE payload as received: replay parses it again


class DoneEvent(_Event):
    kind: Literal["done"]
    t_ns: int


class EndEvent(_Event):
    kind: Literal["end"]
    t_ns: int
    ok: bool
    error: str | None = None
    complete_on_wire: bool | None = None


RawEvent = Annotated[RequestEvent | ChunkEvent | DoneEvent | EndEvent,
                     Field(discriminator="kind")]
_ADAPTER: TypeAdapter[RawEvent] = TypeAdapter(RawEvent)
_MANY: TypeAdapter[list[RawEvent]] = TypeAdapter(list[RawEvent])


def parse_event(obj: Mapping[str, Any], where: str) -> RawEvent:
    """One line of events.jsonl as its model; StreamError naming where and the key when it
    is not one the client writes."""
    try:
        return _ADAPTER.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"][1:2]) or "kind"
        raise StreamError(f"{where}: key '{loc}': {first['msg']}") from exc


def parse_events(objs: Sequence[Mapping[str, Any]], where: str) -> list[RawEvent]:
    """A row's lines as their models, validated in one pass (verify replays every chunk of
    every leg); StreamError naming the event and the key of the first that is not one."""
    try:
        return _MANY.validate_python(objs)
    except ValidationError as exc:
        first = exc.errors()[0]
        index, *rest = first["loc"]
        loc = ".".join(str(p) for p in rest[1:2]) or "kind"
        raise StreamError(f"{where} {int(index) + 1}: key '{loc}': {first['msg']}") from exc
