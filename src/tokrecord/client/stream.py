"""Stream one row over an OpenAI-compatible API and keep every chunk.

The hot loop stamps `perf_counter_ns()` the moment a read returns bytes (before
any SSE or JSON parsing), then decodes, appends the event to the run's
events.jsonl and flushes it. Token counts per chunk come from the server: the
chunk's `token_ids`, else the cumulative `usage.completion_tokens` (continuous
usage stats), else the count of logprob entries. Re-tokenizing text is never done.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict

from tokrecord.client.sse import SSEDecoder
from tokrecord.errors import StreamError
from tokrecord.metrics import Chunk
from tokrecord.suite import SuiteRow

DONE = "[DONE]"
ERROR_BODY_CHARS = 600


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Endpoint.COMPLETIONS else "/v1/chat/completions"


class CountSource(StrEnum):
    TOKEN_IDS = "token_ids"
    USAGE = "usage"
    LOGPROBS = "logprobs"
    NONE = "none"


class EventSink(Protocol):
    """Where raw events go the moment they are seen (events.jsonl in a run dir)."""

    def write(self, record: Mapping[str, Any]) -> None: ...


class RowTrace(BaseModel):
    """Everything the client saw of one row, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    row_id: str
    prompt_sha256: str
    t_send_ns: int
    t_end_ns: int
    chunks: tuple[Chunk, ...]  # token-carrying chunks only
    events: int  # every SSE event, including role-only and usage-only ones
    token_ids: tuple[int, ...] | None
    prompt_token_ids: tuple[int, ...] | None
    text: str
    finish_reason: str | None
    count_source: CountSource
    count_mismatches: int  # chunks where token_ids and usage disagreed
    prompt_tokens: int | None
    completion_tokens: int | None  # server-reported, final usage
    cached_tokens: int | None

    @property
    def n_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


def build_body(
    endpoint: Endpoint,
    model: str,
    row: SuiteRow,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if endpoint is Endpoint.COMPLETIONS:
        body["prompt"] = row.prompt
    else:
        body["messages"] = [{"role": "user", "content": row.prompt}]
    body.update(
        max_tokens=row.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        # vLLM: per-chunk token ids, so counts and exactness come from the server.
        return_token_ids=True,
    )
    body.update(extra or {})
    return body


class _ChunkParser:
    """Turns decoded event payloads into token counts, ids and text."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.last_completion_tokens = 0
        self.token_ids: list[int] = []
        self.have_ids = True
        self.prompt_token_ids: list[int] | None = None
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.source = CountSource.NONE
        self.mismatches = 0
        self.final_usage: dict[str, Any] | None = None

    def parse(self, obj: dict[str, Any]) -> tuple[int, list[int] | None, str, str | None]:
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"server sent an error event: {message}")
        usage = obj.get("usage")
        # vLLM puts prompt ids in the first choice (completions) or at the top (chat).
        top_prompt_ids = obj.get("prompt_token_ids")
        if top_prompt_ids is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = [int(i) for i in top_prompt_ids]
        choices = obj.get("choices") or []
        ids: list[int] | None = None
        text = ""
        finish = None
        logprob_count: int | None = None
        if choices:
            choice = choices[0]
            if self.endpoint is Endpoint.CHAT:
                text = (choice.get("delta") or {}).get("content") or ""
            else:
                text = choice.get("text") or ""
            raw_ids = choice.get("token_ids")
            if raw_ids is not None:
                ids = [int(i) for i in raw_ids]
            if choice.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
                self.prompt_token_ids = [int(i) for i in choice["prompt_token_ids"]]
            finish = choice.get("finish_reason")
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                entries = logprobs.get("content") or logprobs.get("tokens")
                if isinstance(entries, list):
                    logprob_count = len(entries)
        usage_delta: int | None = None
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            cumulative = int(usage["completion_tokens"])
            usage_delta = cumulative - self.last_completion_tokens
            self.last_completion_tokens = cumulative
            if not choices:
                self.final_usage = usage
        if not choices:
            return 0, None, "", None
        if ids is not None:
            n, source = len(ids), CountSource.TOKEN_IDS
            if usage_delta is not None and usage_delta != n:
                self.mismatches += 1
        elif usage_delta is not None:
            n, source = usage_delta, CountSource.USAGE
        elif logprob_count is not None:
            n, source = logprob_count, CountSource.LOGPROBS
        else:
            n, source = 0, CountSource.NONE
            if text:
                raise StreamError(
                    "the server reports no token count per chunk (no token_ids, no continuous "
                    "usage stats, no logprobs); tokrecord never re-tokenizes text — enable one "
                    "of them (vLLM: return_token_ids / continuous_usage_stats)"
                )
        if n > 0:
            if self.source is CountSource.NONE:
                self.source = source
            if ids is not None:
                self.token_ids.extend(ids)
            else:
                self.have_ids = False
        if finish is not None:
            self.finish_reason = finish
        self.text.append(text)
        return n, ids, text, finish


def _transport_message(
    exc: httpx.HTTPError, where: str, base_url: httpx.URL, received: int, events: int
) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{where}: cannot connect to {base_url}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where}: timed out after {received} tokens ({type(exc).__name__})"
    detail = str(exc) or type(exc).__name__
    return f"{where}: stream cut after {received} tokens ({events} events): {detail}"


def stream_row(
    http: httpx.Client,
    *,
    row_index: int,
    row: SuiteRow,
    body: Mapping[str, Any],
    endpoint: Endpoint,
    sink: EventSink,
    on_tokens: Callable[[int, int], None] | None = None,
    epoch_ns: int = 0,
) -> RowTrace:
    """POST one streaming request and record it. Raises StreamError on any failure,
    after writing an `end` event that says what went wrong.

    Times are `perf_counter_ns() - epoch_ns`: the leg's clock, so recorded integers
    stay small (RFC 8785 / I-JSON) whatever the host's uptime."""
    parser = _ChunkParser(endpoint)
    decoder = SSEDecoder()
    chunks: list[Chunk] = []
    events = 0
    received = 0
    done = False
    request = http.build_request("POST", endpoint.path, json=dict(body))
    where = f"row {row_index} ({row.id})"
    t_send = time.perf_counter_ns() - epoch_ns
    sink.write(
        {"kind": "request", "row": row_index, "row_id": row.id, "t_send_ns": t_send,
         "path": endpoint.path, "body": dict(body)}
    )
    try:
        response = http.send(request, stream=True)
        try:
            if response.status_code != 200:
                response.read()
                detail = response.text[:ERROR_BODY_CHARS].strip()
                raise StreamError(
                    f"{where}: HTTP {response.status_code} from {endpoint.path}: {detail or '(empty body)'}"
                )
            for raw in response.iter_raw():
                t = time.perf_counter_ns() - epoch_ns
                for event in decoder.feed(raw):
                    events += 1
                    if event.data == DONE:
                        done = True
                        sink.write({"kind": "done", "row": row_index, "t_ns": t})
                        continue
                    try:
                        obj = json.loads(event.data)
                    except json.JSONDecodeError as exc:
                        raise StreamError(
                            f"{where}: malformed SSE event after {received} tokens: "
                            f"{event.data[:120]!r} is not JSON ({exc.msg})"
                        ) from exc
                    n, ids, text, finish = parser.parse(obj)
                    sink.write(
                        {"kind": "chunk", "row": row_index, "seq": events - 1, "t_ns": t, "n": n,
                         "ids": ids, "text": text, "finish": finish, "data": event.data}
                    )
                    if n:
                        chunks.append(Chunk(t_ns=t, n=n))
                        received += n
                        if on_tokens is not None:
                            on_tokens(received, t)
            decoder.close()
        finally:
            response.close()
    except (StreamError, httpx.HTTPError) as exc:
        error = exc if isinstance(exc, StreamError) else StreamError(
            _transport_message(exc, where, http.base_url, received, events)
        )
        sink.write({"kind": "end", "row": row_index, "t_ns": time.perf_counter_ns() - epoch_ns,
                    "ok": False, "error": str(error)})
        if error is exc:
            raise
        raise error from exc
    t_end = time.perf_counter_ns() - epoch_ns
    if not done:
        msg = f"{where}: stream ended without [DONE] after {received} tokens ({events} events)"
        sink.write({"kind": "end", "row": row_index, "t_ns": t_end, "ok": False, "error": msg})
        raise StreamError(msg)
    sink.write({"kind": "end", "row": row_index, "t_ns": t_end, "ok": True})
    return _trace(row_index, row, t_send, t_end, chunks, events, parser)


def _trace(row_index: int, row: SuiteRow, t_send: int, t_end: int, chunks: list[Chunk],
           events: int, parser: _ChunkParser) -> RowTrace:
    usage = parser.final_usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return RowTrace(
        row=row_index,
        row_id=row.id,
        prompt_sha256=row.prompt_sha256,
        t_send_ns=t_send,
        t_end_ns=t_end,
        chunks=tuple(chunks),
        events=events,
        token_ids=tuple(parser.token_ids) if parser.have_ids and chunks else None,
        prompt_token_ids=tuple(parser.prompt_token_ids) if parser.prompt_token_ids else None,
        text="".join(parser.text),
        finish_reason=parser.finish_reason,
        count_source=parser.source,
        count_mismatches=parser.mismatches,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
    )


def replay_row(
    records: Sequence[Mapping[str, Any]], row: SuiteRow, endpoint: Endpoint
) -> RowTrace:
    """Rebuild a row's trace from its raw events.jsonl records, re-parsing every
    payload exactly as the live client did; the recorded per-chunk token counts must
    agree with what the payloads say."""
    request = next((r for r in records if r["kind"] == "request"), None)
    end = next((r for r in records if r["kind"] == "end"), None)
    if request is None or end is None or not end.get("ok"):
        raise StreamError("events.jsonl: the row has no request or no successful end")
    row_index = int(request["row"])
    parser = _ChunkParser(endpoint)
    chunks: list[Chunk] = []
    events = 0
    for record in records:
        if record["kind"] == "done":
            events += 1
        elif record["kind"] == "chunk":
            events += 1
            n, _ids, _text, _finish = parser.parse(json.loads(record["data"]))
            if n != record["n"]:
                raise StreamError(
                    f"events.jsonl: row {row_index} event {record['seq']}: recorded n={record['n']}"
                    f" but its payload carries {n} tokens"
                )
            if n:
                chunks.append(Chunk(t_ns=int(record["t_ns"]), n=n))
    return _trace(row_index, row, int(request["t_send_ns"]), int(end["t_ns"]), chunks, events,
                  parser)
