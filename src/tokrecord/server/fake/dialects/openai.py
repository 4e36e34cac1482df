"""OpenAI's completions and chat API: vLLM's flavour, and a plain server's.

vLLM (the default dialect, and the bytes the fidelity tests are tuned on): completions
chunks serialise every field, nulls included, as vLLM's `exclude_unset=False` does;
chat chunks only the fields vLLM sets; `token_ids` / `prompt_token_ids` with
`return_token_ids`; the final usage always carries `prompt_tokens_details`
`{"cached_tokens": 0}` (which vLLM omits when nothing was cached).

A plain OpenAI server (`--dialect openai`) sends none of vLLM's extensions: no token ids,
no `stop_reason`, no `prompt_tokens_details`, and has no engine counters on /metrics.
Continuous usage still rides along when the request asks for it, unless the server runs
with `--no-continuous-usage`: then no chunk says how many tokens it carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokrecord.jsontypes import JSONObject
from tokrecord.server.fake.constants import DONE_EVENT, FINISH_REASONS
from tokrecord.server.fake.dialects.base import (
    Dialect,
    Exchange,
    Family,
    GenerationRoute,
    Reply,
    fake_gauges,
    json_reply,
)
from tokrecord.server.fake.requests import _Generation, _parse_generation, error_body
from tokrecord.server.fake.tokens import chunk_frame, sse_event, token_text

if TYPE_CHECKING:
    from tokrecord.server.fake.state import FakeServer

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


class OpenAIWire:
    """The JSON events of one response. `vllm`: field for field as vLLM writes them;
    otherwise a plain server's, with per-chunk `token_ids` only where `ids_on_request`
    (SGLang's OpenAI endpoints add them when asked)."""

    def __init__(self, ex: Exchange, vllm: bool = True, ids_on_request: bool = False) -> None:
        self.rid = ("chatcmpl-" if ex.gen.chat else "cmpl-") + ex.uid
        self.created = ex.created
        self.model = ex.model
        self.gen = ex.gen
        self.vllm = vllm
        self.plain_ids = not vllm and ids_on_request and ex.gen.return_token_ids
        self.prompt_tokens = len(ex.gen.prompt_ids)
        self.first_token_event = True

    def _usage(self, completion_tokens: int, details: bool = False) -> JSONObject:
        usage: JSONObject = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if details and self.vllm:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _head(self) -> JSONObject:
        obj = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def opening(self) -> bytes:
        # vLLM's role-only first chat event travels in the same write as chunk 0.
        return chunk_frame(self.role_event()) if self.gen.chat else b""

    def role_event(self) -> bytes:
        chunk = self._head()
        chunk["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        if self.gen.continuous_usage:
            chunk["usage"] = self._usage(0)
        if self.vllm:
            chunk["prompt_token_ids"] = (
                list(self.gen.prompt_ids) if self.gen.return_token_ids else None
            )
        return sse_event(chunk)

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        chunk = self._head()
        choice: JSONObject
        if self.gen.chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            if self.vllm:
                if finish is not None:
                    choice["stop_reason"] = None
                choice["token_ids"] = token_ids
            elif self.plain_ids:
                choice["token_ids"] = list(ids)
            chunk["choices"] = [choice]
            if self.gen.continuous_usage:
                chunk["usage"] = self._usage(cumulative)
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            if self.vllm:
                prompt_ids = None
                if self.first_token_event and self.gen.return_token_ids:
                    prompt_ids = list(self.gen.prompt_ids)
                choice.update(stop_reason=None, prompt_token_ids=prompt_ids, token_ids=token_ids)
            elif self.plain_ids:
                choice["token_ids"] = list(ids)
                if self.first_token_event:
                    choice["prompt_token_ids"] = list(self.gen.prompt_ids)
            chunk["choices"] = [choice]
            chunk["usage"] = self._usage(cumulative) if self.gen.continuous_usage else None
        self.first_token_event = False
        return sse_event(chunk)

    def usage_event(self, completion_tokens: int) -> bytes:
        chunk = self._head()
        chunk["choices"] = []
        chunk["usage"] = self._usage(completion_tokens, details=True)
        return sse_event(chunk)

    def closing(self, sent: int, finish: str) -> bytes:
        tail = chunk_frame(self.usage_event(sent)) if self.gen.include_usage else b""
        return tail + chunk_frame(DONE_EVENT)

    def whole(self, ids: Sequence[int], finish: str) -> JSONObject:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        prompt_ids = list(self.gen.prompt_ids) if self.gen.return_token_ids else None
        body: JSONObject = {
            "id": self.rid,
            "object": "chat.completion" if self.gen.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        choice: JSONObject = {"index": 0}
        if self.gen.chat:
            choice.update(message={"role": "assistant", "content": text}, logprobs=None,
                          finish_reason=finish)
            if self.vllm:
                choice.update(stop_reason=None, token_ids=token_ids)
        else:
            choice.update(text=text, logprobs=None, finish_reason=finish)
            if self.vllm:
                choice.update(stop_reason=None, prompt_token_ids=prompt_ids, token_ids=token_ids)
        if self.plain_ids:
            choice["token_ids"] = list(ids)
        body["choices"] = [choice]
        body["usage"] = self._usage(len(ids), details=True)
        if self.gen.chat and self.vllm:
            body["prompt_token_ids"] = prompt_ids
        return body


def parse_completions(body: object, model: str) -> _Generation:
    return _parse_generation(False, body, model)


def parse_chat(body: object, model: str) -> _Generation:
    return _parse_generation(True, body, model)


def openai_routes(vllm: bool, ids_on_request: bool = False) -> dict[str, GenerationRoute]:
    def wire(ex: Exchange) -> OpenAIWire:
        return OpenAIWire(ex, vllm=vllm, ids_on_request=ids_on_request)

    return {COMPLETIONS: GenerationRoute(parse_completions, wire),
            CHAT: GenerationRoute(parse_chat, wire)}


def model_list(model: str, owned_by: str = "tokrecord") -> JSONObject:
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": owned_by}]}


class VllmDialect(Dialect):
    """vLLM's OpenAI server: /health (empty body), /v1/models, /metrics with v1 names."""

    name = "vllm"
    vllm = True

    def __init__(self) -> None:
        self.routes = openai_routes(vllm=self.vllm)

    def get(self, server: FakeServer, path: str) -> Reply | None:
        if path == "/health":
            return Reply(200 if server.ready() else 503, b"")
        if path == "/v1/models":
            if not server.ready():
                return self.not_ready()
            return json_reply(200, model_list(server.config.model))
        if path == "/metrics":
            body = server.metrics_text().encode("utf-8")
            return Reply(200, body, "text/plain; version=0.0.4; charset=utf-8")
        return None

    def error(self, status: int, message: str, err_type: str, param: str | None = None) -> Reply:
        return json_reply(status, error_body(status, message, err_type, param))

    def metrics(self, server: FakeServer) -> list[Family]:
        return vllm_families(server) + fake_gauges(server)


class PlainOpenAIDialect(VllmDialect):
    """A generic OpenAI-compatible server: vLLM's routes without its extensions."""

    name = "openai"
    vllm = False

    def metrics(self, server: FakeServer) -> list[Family]:
        return fake_gauges(server)


def vllm_families(server: FakeServer) -> list[Family]:
    model = server.config.model
    labels = {"engine": "0", "model_name": model}
    c = server.counters
    with c.lock:
        families: list[Family] = [
            ("vllm:num_requests_running", "gauge",
             "Number of requests in model execution batches.", [(labels, c.active)]),
            ("vllm:num_requests_waiting", "gauge",
             "Number of requests waiting to be processed.", [(labels, 0)]),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.",
             [(labels, c.prompt_tokens)]),
            ("vllm:prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", [(labels, 0)]),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             [(labels, c.prompt_tokens)]),
            ("vllm:generation_tokens_total", "counter",
             "Number of generation tokens processed.", [(labels, c.generation_tokens)]),
            ("vllm:request_success_total", "counter",
             "Count of successfully processed requests.",
             [({**labels, "finished_reason": r}, c.success[r]) for r in FINISH_REASONS]),
        ]
        if server.config.tokens_per_chunk > 1:
            families += [
                ("vllm:spec_decode_num_drafts_total", "counter",
                 "Number of spec decoding drafts.", [(labels, c.drafts)]),
                ("vllm:spec_decode_num_draft_tokens_total", "counter",
                 "Number of draft tokens.", [(labels, c.draft_tokens)]),
                ("vllm:spec_decode_num_accepted_tokens_total", "counter",
                 "Number of accepted tokens.", [(labels, c.accepted)]),
            ]
    return families
