"""llama.cpp's server (`llama-server`): the native /completion stream and its outside.

Formats from llama.cpp's tools/server (server-task.cpp `to_json_non_oaicompat`,
`result_timings::to_json`, `to_metrics`; server-http.cpp `log_server_request` and its
loading middleware) and docs/research/llamacpp/README.md (measured on b11434):

* `POST /completion` {prompt, n_predict, stream, return_tokens, cache_prompt, ...}
  streams one `data:` event per chunk:
  `{"index":0,"content":..,"tokens":[ids],"stop":false,"id_slot":0,
  "tokens_predicted":<cumulative>,"tokens_evaluated":<prompt tokens>}` (`tokens` is
  empty unless `return_tokens`), then a final `"stop":true` event with `stop_type`
  ("limit" or "eos"), `tokens_cached` and `timings`. There is no `[DONE]`, and the
  server closes the socket after the response (`Connection: close` here).
* The prompt cache is on per request (`cache_prompt` defaults to true) unless the
  server runs with `--no-cache-prompt`. The fake reports as cached the leading prompt
  tokens shared with the previous request (never the whole prompt: one token is always
  evaluated), in `timings.cache_n` and `llamacpp:prompt_tokens_cached_total`.
* While loading, every path but the model list answers 503 "Loading model".
* Log lines (server-context.cpp's SLT_INF / server-http.cpp's SRV_INF formats): each
  generation starts with `slot launch_slot_: id  0 | task <n> | processing task`, and
  every request is logged once its response is done:
  `srv  log_server_r: request: POST /completion 127.0.0.1 200`.

Knowing differences: the final event omits `generation_settings` and `prompt`; a chunk
of K tokens is one event with K ids (llama.cpp writes one event per accepted token, in
quick succession); `/metrics` answers without `--metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tokrecord.jsontypes import JSONObject
from tokrecord.server.fake.constants import DEFAULT_MAX_TOKENS
from tokrecord.server.fake.dialects.base import (
    Dialect,
    Exchange,
    Family,
    GenerationRoute,
    Reply,
    fake_gauges,
    json_reply,
)
from tokrecord.server.fake.dialects.openai import CHAT, COMPLETIONS, OpenAIWire, parse_chat
from tokrecord.server.fake.dialects.openai import parse_completions as _parse_completions
from tokrecord.server.fake.requests import (
    _completion_prompt,
    _Generation,
    _is_int,
    _optional_bool,
    _RequestError,
)
from tokrecord.server.fake.tokens import chunk_frame, chunk_plan, sse_event, token_text

if TYPE_CHECKING:
    from tokrecord.server.fake.config import FakeServerConfig
    from tokrecord.server.fake.state import FakeServer

NATIVE = "/completion"
BUILD_INFO = "b0-fake"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}


def parse_native(body: object, model: str) -> _Generation:
    if not isinstance(body, dict):
        raise _RequestError(400, "request body must be a JSON object")
    if "prompt" not in body:
        raise _RequestError(400, '"prompt" must be provided')
    ids, key = _completion_prompt(body["prompt"])
    n_predict = body.get("n_predict", body.get("max_tokens"))
    # -1 (llama.cpp's default) is "until end of stream": the fake has no end but its own.
    if n_predict is None or n_predict == -1:
        n_predict = DEFAULT_MAX_TOKENS
    if not _is_int(n_predict) or n_predict < 1:
        raise _RequestError(400, f"n_predict must be an integer >= 1 or -1, got {n_predict!r}")
    cache = body.get("cache_prompt", True)
    if not isinstance(cache, bool):
        raise _RequestError(400, "cache_prompt must be a boolean")
    return _Generation(
        chat=False, prompt_ids=ids, prompt_key=key, max_tokens=n_predict,
        stream=_optional_bool(body, "stream"), include_usage=False, continuous_usage=False,
        return_token_ids=_optional_bool(body, "return_tokens"), cache_prompt=cache,
    )


def parse_completions(body: object, model: str) -> _Generation:
    # llama.cpp's OpenAI stream has no continuous usage stats.
    return replace(_parse_completions(body, model), continuous_usage=False,
                   cache_prompt=_cache_prompt(body))


def parse_chat_llama(body: object, model: str) -> _Generation:
    return replace(parse_chat(body, model), continuous_usage=False,
                   cache_prompt=_cache_prompt(body))


def _cache_prompt(body: object) -> bool:
    return not (isinstance(body, dict) and body.get("cache_prompt") is False)


class LlamaCppWire:
    """Events of one native /completion response."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.prompt_n = len(ex.gen.prompt_ids)
        self.with_ids = ex.gen.return_token_ids
        self.every = ex.config.hold_back_every
        self.held_text = ""

    def opening(self) -> bytes:
        return b""

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        # The last token travels in a partial like every other; the final event follows.
        text = "".join(token_text(t) for t in ids)
        if self.every and cumulative % self.every == 0 and finish is None:
            self.held_text += text
            return b""
        text, self.held_text = self.held_text + text, ""
        return sse_event({
            "index": 0,
            "content": text,
            "tokens": list(ids) if self.with_ids else [],
            "stop": False,
            "id_slot": 0,
            "tokens_predicted": cumulative,
            "tokens_evaluated": self.prompt_n,
        })

    def _final(self, content: str, ids: Sequence[int], n: int, finish: str) -> JSONObject:
        return {
            "index": 0,
            "content": content,
            "tokens": list(ids) if self.with_ids else [],
            "id_slot": 0,
            "stop": True,
            "model": self.ex.model,
            "tokens_predicted": n,
            "tokens_evaluated": self.prompt_n,
            "has_new_line": False,
            "truncated": False,
            "stop_type": "eos" if finish == "stop" else "limit",
            "stopping_word": "",
            "tokens_cached": self.prompt_n + n,
            "timings": self.timings(n),
        }

    def timings(self, n: int) -> JSONObject:
        """llama.cpp's per-request timings on the fake's schedule: the prompt takes TTFT,
        each generated token 1/tok_s."""
        config = self.ex.config
        cache_n = self.ex.cached
        prompt_n = self.prompt_n - cache_n
        prompt_ms = config.ttft_ms
        predicted_ms = n * 1000.0 / config.tok_s
        timings: JSONObject = {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
            "predicted_per_second": 1e3 * n / predicted_ms if predicted_ms else 0.0,
        }
        k = config.tokens_per_chunk
        if k > 1:
            cycles = max(len(chunk_plan(n, k)) - 1, 0)
            timings["draft_n"] = cycles * (k - 1)
            timings["draft_n_accepted"] = max(n - 1 - cycles, 0)
        return timings

    def closing(self, sent: int, finish: str) -> bytes:
        return chunk_frame(sse_event(self._final("", (), sent, finish)))

    def whole(self, ids: Sequence[int], finish: str) -> JSONObject:
        return self._final("".join(token_text(t) for t in ids), ids, len(ids), finish)


def _plain_wire(ex: Exchange) -> OpenAIWire:
    return OpenAIWire(ex, vllm=False)


class LlamaCppDialect(Dialect):
    name = "llama.cpp"
    server_version = "llama.cpp"
    stream_headers = (
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
    )
    close_after_stream = True
    log_after_response = True

    def __init__(self) -> None:
        self.routes = {
            NATIVE: GenerationRoute(parse_native, LlamaCppWire),
            COMPLETIONS: GenerationRoute(parse_completions, _plain_wire),
            CHAT: GenerationRoute(parse_chat_llama, _plain_wire),
        }


    def get(self, server: FakeServer, path: str) -> Reply | None:
        config = server.config
        if path in ("/v1/models", "/models"):
            # llama.cpp lists its model while still loading.
            model = {"id": config.model, "object": "model", "created": int(server.started_wall),
                     "owned_by": "llamacpp", "meta": None}
            return json_reply(200, {"object": "list", "data": [model]})
        if path not in ("/health", "/props", "/metrics"):
            return None
        if not server.ready():
            return self.not_ready()
        if path == "/health":
            return json_reply(200, {"status": "ok"})
        if path == "/props":
            return json_reply(200, {
                "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1}},
                "total_slots": 1,
                "model_alias": config.model,
                "model_path": config.model,
                "build_info": BUILD_INFO,
            })
        body = server.metrics_text().encode("utf-8")
        return Reply(200, body, "text/plain; version=0.0.4")

    def error(self, status: int, message: str, err_type: str, param: str | None = None) -> Reply:
        kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        if status == 404 and message.startswith("no route"):
            message = "File Not Found"
        return json_reply(status, {"error": {"code": status, "message": message, "type": kind}})

    def not_ready(self) -> Reply:
        return self.error(503, "Loading model", "unavailable_error")

    def caches_prefix(self, config: FakeServerConfig, gen: _Generation) -> bool:
        return gen.cache_prompt and not config.no_cache_prompt

    def request_line(self, host: str, port: int, request_line: str, path: str,
                     code: int) -> str | None:
        if path == "/v1/health":  # llama.cpp skips it (GitHub Copilot's probe)
            return ""
        method = request_line.split(" ", 1)[0]
        return f"srv  log_server_r: request: {method} {path} {host} {code}"

    def generation_log(self, req: int, gen: _Generation, cached: int) -> str | None:
        return f"slot launch_slot_: id  0 | task {req} | processing task"

    def metrics(self, server: FakeServer) -> list[Family]:
        return llamacpp_families(server) + fake_gauges(server)


def llamacpp_families(server: FakeServer) -> list[Family]:
    """`llamacpp:` counters and gauges as `server_task_result_metrics::to_metrics` names
    them (no labels); speculative ones only with --tokens-per-chunk > 1."""
    none: Mapping[str, str] = {}
    c = server.counters
    with c.lock:
        counters: list[tuple[str, str, float]] = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             c.prompt_tokens - c.cached_tokens),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             c.cached_tokens),
            ("prompt_seconds_total", "Total time spent processing prompts", c.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed",
             c.generation_tokens),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens",
             c.predicted_seconds),
            ("n_decode_total", "Total number of llama_decode() calls", c.decode_calls),
        ]
        if server.config.tokens_per_chunk > 1:
            counters += [
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
                 c.draft_tokens),
                ("spec_decode_num_accepted_tokens_total",
                 "Speculative: Total draft tokens accepted by the target model", c.accepted),
                ("spec_decode_num_drafts_total",
                 "Speculative: Total speculative decoding verification steps", c.drafts),
            ]
        gauges: list[tuple[str, str, float]] = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             (c.prompt_tokens - c.cached_tokens) / c.prompt_seconds if c.prompt_seconds else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             c.generation_tokens / c.predicted_seconds if c.predicted_seconds else 0.0),
            ("requests_processing", "Number of requests processing", c.active),
            ("requests_deferred", "Number of requests deferred", 0),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             1.0 if c.decode_calls else 0.0),
        ]
        per_pos = list(c.accepted_per_pos)
    families: list[Family] = [(f"llamacpp:{name}", "counter", text, [(none, value)])
                              for name, text, value in counters]
    families += [(f"llamacpp:{name}", "gauge", text, [(none, value)])
                 for name, text, value in gauges]
    if per_pos:
        families.append(("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                         "Accepted tokens per draft position",
                         [({"position": str(i)}, v) for i, v in enumerate(per_pos)]))
    return families
