"""SGLang (`python -m sglang.launch_server`, `sglang serve`).

NOT RUN AGAINST A REAL SGLANG SERVER: no SGLang build runs on this machine (no CPU
wheel). Everything here comes from SGLang's source and rendered docs
(docs/research/sglang/README.md, with citations) and is tested against
recorded-format fixtures (tests/fixtures/sglang) and the fake server's sglang dialect.

Facts this adapter relies on:

* Rows go to the native `POST /generate` {"text", "sampling_params": {"max_new_tokens",
  "temperature"}, "stream": true}: each `data:` event is {"text", "output_ids",
  "meta_info"} and the stream ends with `data: [DONE]`.
* By default `text` and `output_ids` are cumulative (each event repeats all so far, and
  a slow reader is sent only the latest of several queued outputs); with the server
  flag `--incremental-streaming-output` both are deltas (queued ones concatenated). The
  parser tells the two apart from the counts, so either works.
* `meta_info.completion_tokens` is cumulative in both modes, on every event and in
  every version; `meta_info.cached_tokens` is the prompt tokens served from the radix
  cache; the last event has `finish_reason` ({"type": "length" | "stop" | "abort", ..}),
  `e2e_latency` and, when speculating, `spec_verify_ct` and `spec_accept_length`.
* The radix cache is on by default: the server gets `--disable-radix-cache` and the
  proof is `cached_tokens == 0` on every row (and no `sglang:cached_tokens_total`).
* SGLang sends itself an 8-token /generate at startup unless `--skip-server-warmup`,
  and its `/health` runs a one-token generation (`SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`
  defaults to true): readiness polls `/v1/models`, which answers once the model is
  loaded and the HTTP server listens, never a generation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokrecord.jsontypes import JSONObject
from tokrecord.metrics.engine import MetricNames
from tokrecord.suite import SuiteRow

from .base import (
    CountSource,
    Endpoint,
    Engine,
    EngineName,
    Parsed,
    SpeculativeConfig,
    StreamParser,
    arg_value,
    error_event,
    int_arg,
    no_count_error,
)
from .openai import OpenAIParser, openai_body

SGLANG_METRICS = MetricNames(
    # Verify steps (`spec_verify_ct` summed, SGLang >= 0.5.x's tokenizer collector).
    # Draft and accepted token totals are gauges of recent batches only
    # (sglang:spec_accept_length / _rate), so they are not read as counters.
    spec_drafts="sglang:spec_verify_calls_total",
    # Cached prompt tokens; written only once a request had any (absent means none).
    prefix_hits="sglang:cached_tokens_total",
    # Every finished request's prompt tokens, cached or not: what the cache was asked.
    prefix_queries="sglang:prompt_tokens_total",
    generation=("sglang:num_requests_total", "sglang:generation_tokens_total"),
    # Both come from the tokenizer's collector; prompt tokens move on every request.
    absent_means_zero=(("sglang:cached_tokens_total", "sglang:prompt_tokens_total"),),
)

# uvicorn's access line for one generation request: `INFO: 127.0.0.1:40000 - "POST
# /generate HTTP/1.1" 200 OK`. SGLang's startup warmup shows as one such line.
SGLANG_GENERATION_LINE = re.compile(
    r'"POST /(?:generate|v1/completions|v1/chat/completions) HTTP/1\.[01]"')


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class SglangParser(StreamParser):
    """Events of the native /generate stream.

    A chunk's count is the delta of the cumulative `meta_info.completion_tokens`: the
    server's own count, present on every event whatever the streaming mode, so events
    the server coalesced still count right. `output_ids` supply the ids (cumulative by
    default, deltas with --incremental-streaming-output: the mode is read from the
    counts), each chunk's new ids checked against that delta; without
    `completion_tokens` (not seen in any version) the new ids are the count."""

    last_completion: int = 0
    # None until an event shows which: cumulative (False) or incremental (True) output.
    incremental: bool | None = None
    text_len: int = 0

    def parse(self, obj: JSONObject) -> Parsed:
        error_event(obj)
        meta = obj.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        if self.prompt_token_ids is None and isinstance(obj.get("prompt_token_ids"), list):
            self.prompt_token_ids = [int(i) for i in obj["prompt_token_ids"]]
        cumulative = _int(meta.get("completion_tokens"))
        raw = obj.get("output_ids")
        out = [int(i) for i in raw] if isinstance(raw, list) else None
        if cumulative is not None:
            n = cumulative - self.last_completion
            ids = self._new_ids(out, n, cumulative)
            self.last_completion = cumulative
            source = CountSource.TOKEN_IDS if ids is not None and len(ids) == n else CountSource.USAGE
        elif out is not None:
            ids = self._new_ids_uncounted(out)
            n, source = len(ids), CountSource.TOKEN_IDS
            self.last_completion += n
        else:
            ids, n, source = None, 0, CountSource.NONE
        text = self._new_text(obj.get("text"))
        if source is CountSource.NONE and text:
            raise no_count_error("no meta_info.completion_tokens, no output_ids",
                                 "SGLang's native /generate stream carries both")
        finish = None
        reason = meta.get("finish_reason")
        if reason is not None:
            finish = str(reason.get("type")) if isinstance(reason, dict) else str(reason)
            self.prompt_tokens = _int(meta.get("prompt_tokens"))
            self.completion_tokens = cumulative
            self.cached_tokens = _int(meta.get("cached_tokens"))
            self.engine_timings = dict(meta)
        return self._take(n, ids, source, text, finish)

    def _new_ids(self, out: list[int] | None, n: int, cumulative: int) -> list[int] | None:
        if out is None:
            return None
        if self.incremental is None and self.last_completion > 0 and n != cumulative:
            if len(out) == cumulative:
                self.incremental = False
            elif len(out) == n:
                self.incremental = True
        new = out if self.incremental else out[self.last_completion:]
        if len(new) != n:
            self.mismatches += 1
        return new

    def _new_ids_uncounted(self, out: list[int]) -> list[int]:
        seen = len(self.token_ids)
        if self.incremental is None and seen and out[:seen] == self.token_ids:
            self.incremental = False
        return out if self.incremental else out[seen:]

    def _new_text(self, text: Any) -> str:
        if not isinstance(text, str):
            return ""
        if self.incremental:
            return text
        new = text[self.text_len:]
        self.text_len = len(text)
        return new


class SglangEngine(Engine):
    name = EngineName.SGLANG
    # /health runs a generation by default; /v1/models answers once the model is loaded.
    ready_paths = ("/v1/models",)
    metrics = SGLANG_METRICS
    no_cache_args = ("--disable-radix-cache",)
    # Its own warmup generation would precede row 0; /metrics needs --enable-metrics.
    required_args = ("--skip-server-warmup", "--enable-metrics")
    packages = ("sglang",)
    repository = "https://github.com/sgl-project/sglang"
    programs = ("sglang",)
    modules = ("sglang",)
    cached_tokens_hint = ("meta_info.cached_tokens (SGLang's native /generate stream; its "
                          "OpenAI endpoints report cached tokens only with --enable-cache-report)")
    generation_line = SGLANG_GENERATION_LINE
    # The server args, the scheduler's state and "version". Older releases serve it only
    # as /get_server_info, which 2026's still answer, deprecated.
    native_path = "/generate"
    version_path = "/server_info"
    version_keys = ("version",)
    parallel_flags = ("--tp-size", "--tp")
    context_flags = ("--context-length",)
    kv_k_flags = kv_v_flags = ()
    prefix_off_flags = ("--disable-radix-cache",)
    prefix_on_flags = ()

    def speculative(self, argv: Sequence[str]) -> SpeculativeConfig | None:
        algorithm = arg_value(argv, "--speculative-algorithm")
        if algorithm is None:
            return None
        return SpeculativeConfig(
            method=algorithm, source="--speculative-algorithm",
            num_speculative_tokens=int_arg(argv, "--speculative-num-draft-tokens"),
            draft_model=arg_value(argv, "--speculative-draft-model-path"))

    def build_body(self, endpoint: Endpoint, model: str, row: SuiteRow,
                   extra: Mapping[str, Any] | None = None) -> JSONObject:
        if endpoint is Endpoint.NATIVE:
            body: JSONObject = {
                "text": row.prompt,
                "sampling_params": {"max_new_tokens": row.max_tokens, "temperature": 0},
                "stream": True,
            }
        else:
            body = openai_body(endpoint, model, row)
            # Per-chunk token ids where the release has them (older ones ignore the key).
            body["return_token_ids"] = True
        return {**body, **(extra or {})}

    def parser(self, endpoint: Endpoint) -> StreamParser:
        if endpoint is Endpoint.NATIVE:
            return SglangParser()
        return OpenAIParser(
            endpoint=endpoint,
            hint="SGLang: use endpoint = \"native\" (/generate), or stream_options."
                 "continuous_usage_stats")
