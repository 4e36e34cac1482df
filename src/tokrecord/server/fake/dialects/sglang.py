"""SGLang's server: the native /generate stream and its outside.

Formats from SGLang's source and rendered docs (docs/research/sglang/README.md has the
citations); the fake has never been compared with a running SGLang, there being none
here:

* `POST /generate` {"text" | "input_ids", "sampling_params": {"max_new_tokens", ...},
  "stream": true} streams `data: {"text", "output_ids", "meta_info"}` events and ends
  with `data: [DONE]`. As SGLang does by default (no `--incremental-streaming-output`),
  `text` and `output_ids` are cumulative. `meta_info` carries `id`, `finish_reason`
  (null until the last event, then {"type": "length", "length": N} or {"type": "stop",
  "matched": <id>}), `prompt_tokens`, the cumulative `completion_tokens`,
  `cached_tokens`; the first event `response_sent_to_client_ts`; the last `e2e_latency`
  and, with --tokens-per-chunk K > 1, the speculative fields (`spec_verify_ct`,
  `spec_accept_length`, ...) as if K - 1 tokens were drafted per verify step.
* The radix cache is on unless the server runs with `--disable-radix-cache`: the fake
  then counts as cached the leading prompt tokens shared with the previous request.
  `/flush_cache` empties it.
* Unless started with `--skip-server-warmup`, SGLang sends itself one 8-token
  /generate request once it listens; the fake books it in its counters and log lines.
* `/health` (and `/health_generate`) answer 200 with an empty body once ready, 503
  before; `/get_server_info` (`/server_info`) carries the server args and `version`.
* `sglang:` counters appear on /metrics only once incremented (prometheus_client's
  multiprocess mode writes no sample for a label set never touched).
* Log lines: uvicorn's access line per request and the scheduler's prefill line,
  `[2026-01-01 00:00:00] INFO:     127.0.0.1:40000 - "POST /generate HTTP/1.1" 200 OK`,
  `[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, ...`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tokrecord.jsontypes import JSONObject
from tokrecord.server.fake.constants import DONE_EVENT
from tokrecord.server.fake.dialects.base import (
    Dialect,
    Exchange,
    Family,
    GenerationRoute,
    Reply,
    fake_gauges,
    json_reply,
    log_time,
    status_phrase,
)
from tokrecord.server.fake.dialects.openai import (
    CHAT,
    COMPLETIONS,
    OpenAIWire,
    parse_chat,
    parse_completions,
)
from tokrecord.server.fake.requests import (
    _completion_prompt,
    _Generation,
    _is_int,
    _optional_bool,
    _RequestError,
)
from tokrecord.server.fake.tokens import chunk_frame, prompt_token_ids, sse_event, token_text

if TYPE_CHECKING:
    from tokrecord.server.fake.config import FakeServerConfig
    from tokrecord.server.fake.state import FakeServer

NATIVE = "/generate"
VERSION = "0.0.0+tokrecord.fake"
# SGLang's own warmup request (http_server.py `_execute_server_warmup`).
WARMUP_PROMPT = "The capital city of France is"
WARMUP_TOKENS = 8
DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams' default
FLUSHED = (b"Cache flushed.\nPlease check backend logs for more details. (When there are "
           b"running or waiting requests, the operation will not be performed.)\n")


def parse_native(body: object, model: str) -> _Generation:
    if not isinstance(body, dict):
        raise _RequestError(400, "request body must be a JSON object")
    prompt = body.get("text")
    if prompt is None:
        prompt = body.get("input_ids")
    if prompt is None:
        raise _RequestError(400, "Either text, input_ids or input_embeds should be provided.")
    ids, key = _completion_prompt(prompt)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _RequestError(400, "sampling_params must be an object", param="sampling_params")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not _is_int(max_new) or max_new < 1:
        raise _RequestError(400, f"max_new_tokens must be an integer >= 1, got {max_new!r}")
    return _Generation(
        chat=False, prompt_ids=ids, prompt_key=key, max_tokens=max_new,
        stream=_optional_bool(body, "stream"), include_usage=False, continuous_usage=False,
        return_token_ids=True,
    )


class SglangWire:
    """Events of one /generate response, cumulative as SGLang streams by default."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.text = ""
        self.ids: list[int] = []
        self.events = 0
        self.cycles = 0
        self.accepted = 0
        self.histogram = [0] * ex.config.tokens_per_chunk

    def opening(self) -> bytes:
        return b""

    def _meta(self, completion_tokens: int, finish: str | None) -> JSONObject:
        ex = self.ex
        reason: JSONObject | None = None
        if finish == "length":
            reason = {"type": "length", "length": completion_tokens}
        elif finish is not None:
            reason = {"type": "stop", "matched": self.ids[-1] if self.ids else 0}
        meta: JSONObject = {
            "id": ex.uid,
            "finish_reason": reason,
            "prompt_tokens": len(ex.gen.prompt_ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": completion_tokens,
            "cached_tokens": ex.cached,
            "cached_tokens_details": None,
            "dp_rank": None,
        }
        if finish is not None:
            # When the last token is due on the fake's schedule.
            meta["e2e_latency"] = (ex.config.ttft_ms / 1e3
                                   + max(completion_tokens - 1, 0) / ex.config.tok_s)
            if self.cycles:
                self._spec(meta, completion_tokens)
        return meta

    def _spec(self, meta: JSONObject, completion_tokens: int) -> None:
        proposed = self.cycles * (self.ex.config.tokens_per_chunk - 1)
        meta.update(
            spec_accept_rate=self.accepted / proposed if proposed else 0.0,
            spec_accept_length=completion_tokens / self.cycles,
            spec_num_correct_drafts=self.accepted,
            spec_num_proposed_drafts=proposed,
            spec_verify_ct=self.cycles,
            spec_accepted_drafts=self.accepted,
            spec_proposed_drafts=proposed,
            spec_correct_drafts_histogram=list(self.histogram),
            spec_accept_histogram=list(self.histogram),
        )

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        if self.events:  # chunk 0 is the prefill's token; each later one a verify step
            self.cycles += 1
            self.accepted += len(ids) - 1
            self.histogram[len(ids) - 1] += 1
        self.text += "".join(token_text(t) for t in ids)
        self.ids.extend(ids)
        meta = self._meta(cumulative, finish)
        if not self.events:
            meta["response_sent_to_client_ts"] = time.time()
        self.events += 1
        return sse_event({"text": self.text, "output_ids": self.ids, "meta_info": meta})

    def closing(self, sent: int, finish: str) -> bytes:
        return chunk_frame(DONE_EVENT)

    def whole(self, ids: Sequence[int], finish: str) -> JSONObject:
        self.text = "".join(token_text(t) for t in ids)
        self.ids = list(ids)
        meta = self._meta(len(ids), finish)
        meta["response_sent_to_client_ts"] = time.time()
        return {"text": self.text, "output_ids": self.ids, "meta_info": meta}


def _openai_wire(ex: Exchange) -> OpenAIWire:
    return OpenAIWire(ex, vllm=False, ids_on_request=True)


class SglangDialect(Dialect):
    name = "sglang"
    server_version = "uvicorn"
    stream_headers = (("Content-Type", "text/event-stream; charset=utf-8"),
                      ("Transfer-Encoding", "chunked"))
    def __init__(self) -> None:
        self.routes = {
            NATIVE: GenerationRoute(parse_native, SglangWire),
            COMPLETIONS: GenerationRoute(parse_completions, _openai_wire),
            CHAT: GenerationRoute(parse_chat, _openai_wire),
        }


    def get(self, server: FakeServer, path: str) -> Reply | None:
        if path in ("/health", "/health_generate"):
            return Reply(200 if server.ready() else 503, b"")
        if path == "/metrics":
            body = server.metrics_text().encode("utf-8")
            return Reply(200, body, "text/plain; version=0.0.4; charset=utf-8")
        if path == "/flush_cache":
            return self.post(server, path)
        if path not in ("/v1/models", "/get_model_info", "/model_info", "/get_server_info",
                        "/server_info"):
            return None
        if not server.ready():
            return self.not_ready()
        config = server.config
        if path == "/v1/models":
            card = {"id": config.model, "object": "model", "created": int(server.started_wall),
                    "owned_by": "sglang", "root": config.model, "parent": None,
                    "max_model_len": 4096}
            return json_reply(200, {"object": "list", "data": [card]})
        if path in ("/get_model_info", "/model_info"):
            return json_reply(200, {
                "model_path": config.model, "tokenizer_path": config.model,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default",
            })
        return json_reply(200, server_info(config, server.server_port))

    def post(self, server: FakeServer, path: str) -> Reply | None:
        if path != "/flush_cache":
            return None
        server.prefix_cache.flush()
        return Reply(200, FLUSHED, "text/plain; charset=utf-8")

    def error(self, status: int, message: str, err_type: str, param: str | None = None) -> Reply:
        if status == 404 and message.startswith("no route"):
            return json_reply(404, {"detail": "Not Found"})  # FastAPI's own 404
        return json_reply(status, {"object": "error", "message": message, "type": err_type,
                                   "param": param, "code": status})

    def caches_prefix(self, config: FakeServerConfig, gen: _Generation) -> bool:
        return not config.disable_radix_cache

    def request_line(self, host: str, port: int, request_line: str, path: str,
                     code: int) -> str | None:
        return (f'[{log_time()}] INFO:     {host}:{port} - "{request_line}" {code} '
                f"{status_phrase(code)}")

    def generation_log(self, req: int, gen: _Generation, cached: int) -> str | None:
        new = len(gen.prompt_ids) - cached
        return (f"[{log_time()}] Prefill batch, #new-seq: 1, #new-token: {new}, "
                f"#cached-token: {cached}, token usage: 0.00, #running-req: 0, #queue-req: 0")

    def on_start(self, server: FakeServer) -> None:
        lines = []
        if not server.config.skip_server_warmup:
            ids = tuple(prompt_token_ids(WARMUP_PROMPT))
            gen = _Generation(chat=False, prompt_ids=ids, prompt_key=WARMUP_PROMPT,
                              max_tokens=WARMUP_TOKENS, stream=False, include_usage=False,
                              continuous_usage=False, return_token_ids=False)
            cached = server.prefix_cache.lookup(ids, self.caches_prefix(server.config, gen))
            server.counters.book_warmup(len(ids), cached, WARMUP_TOKENS)
            port = server.server_port
            lines += [self.request_line("127.0.0.1", port, "GET /get_model_info HTTP/1.1", "", 200),
                      self.generation_log(0, gen, cached),
                      self.request_line("127.0.0.1", port, "POST /generate HTTP/1.1", NATIVE, 200)]
        lines.append(f"[{log_time()}] The server is fired up and ready to roll!")
        sys.stderr.write("".join(f"{line}\n" for line in lines if line))
        sys.stderr.flush()

    def metrics(self, server: FakeServer) -> list[Family]:
        return sglang_families(server) + fake_gauges(server)


def server_info(config: FakeServerConfig, port: int) -> JSONObject:
    """The server args SGLang's /get_server_info carries that a leg would want, then the
    scheduler's figures and `version`."""
    k = config.tokens_per_chunk
    return {
        "model_path": config.model,
        "tokenizer_path": config.model,
        "host": config.host,
        "port": port,
        "skip_server_warmup": config.skip_server_warmup,
        "stream_interval": 1,
        "incremental_streaming_output": False,
        "enable_metrics": True,
        "served_model_name": config.model,
        "enable_cache_report": False,
        "speculative_algorithm": "EAGLE" if k > 1 else None,
        "speculative_num_draft_tokens": k if k > 1 else None,
        "disable_radix_cache": config.disable_radix_cache,
        "status": "ready",
        "max_total_num_tokens": 4096,
        "internal_states": [{"last_gen_throughput": config.tok_s}],
        "version": VERSION,
    }


def sglang_families(server: FakeServer) -> list[Family]:
    model = server.config.model
    counter_labels: Mapping[str, str] = {"model_name": model}
    gauge_labels: Mapping[str, str] = {"model_name": model, "engine_type": "unified",
                                       "tp_rank": "0", "pp_rank": "0"}
    c = server.counters
    with c.lock:
        finished = c.success["stop"] + c.success["length"]
        counters = [
            ("prompt_tokens_total", "Number of prefill tokens processed.", c.prompt_tokens),
            ("generation_tokens_total", "Number of generation tokens processed.",
             c.generation_tokens),
            ("num_requests_total", "Number of requests processed.", finished),
            ("num_aborted_requests_total", "Number of requests aborted.", c.success["abort"]),
            ("spec_verify_calls_total", "Number of speculative decoding verification calls.",
             c.drafts),
        ]
        gauges: list[tuple[str, str, float]] = [
            ("num_running_reqs", "The number of running requests.", c.active),
            ("num_queue_reqs", "The number of requests in the waiting queue.", 0),
            ("token_usage", "The token usage.", 0.0),
            ("cache_hit_rate", "The prefix cache hit rate.",
             c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0),
            ("gen_throughput", "The generation throughput (token/s).",
             server.config.tok_s if c.generation_tokens else 0.0),
        ]
        if server.config.tokens_per_chunk > 1:
            gauges += [
                ("spec_accept_length", "The average acceptance length of speculative decoding.",
                 (c.accepted + c.drafts) / c.drafts if c.drafts else 0.0),
                ("spec_accept_rate", "The average acceptance rate of speculative decoding "
                 "(`accepted tokens / total draft tokens` in batch).",
                 c.accepted / c.draft_tokens if c.draft_tokens else 0.0),
            ]
        cached = c.cached_tokens
    families: list[Family] = [(f"sglang:{name}", "counter", text, [(counter_labels, value)])
                              for name, text, value in counters if value]
    if cached:
        families.append(("sglang:cached_tokens_total", "counter",
                         "Number of cached prompt tokens by source (device/host/storage).",
                         [({**counter_labels, "cache_source": "device"}, cached)]))
    families += [(f"sglang:{name}", "gauge", text, [(gauge_labels, value)])
                 for name, text, value in gauges]
    return families
