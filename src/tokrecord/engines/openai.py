"""A generic OpenAI-compatible server: the dialect every engine here starts from.

Token counts per chunk come from the server: the chunk's `token_ids` (an
extension vLLM has), else the cumulative `usage.completion_tokens` (continuous
usage stats), else the count of logprob entries. A server that gives none of
them cannot be rated: its text is never re-tokenized.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokrecord.jsontypes import JSONObject
from tokrecord.suite import SuiteRow

from .base import (
    Capability,
    CountSource,
    Endpoint,
    Engine,
    EngineName,
    Limitation,
    Parsed,
    StreamParser,
    error_event,
    no_count_error,
)


def openai_body(endpoint: Endpoint, model: str, row: SuiteRow) -> JSONObject:
    body: JSONObject = {"model": model}
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": row.prompt}]
    else:
        body["prompt"] = row.prompt
    body.update(
        max_tokens=row.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    return body


@dataclass
class OpenAIParser(StreamParser):
    """OpenAI's streamed chunks, with the extensions vLLM and SGLang add."""

    endpoint: Endpoint = Endpoint.COMPLETIONS
    hint: str = "enable continuous usage stats or logprobs"
    last_completion_tokens: int = 0

    def parse(self, obj: JSONObject) -> Parsed:
        error_event(obj)
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
                self._final_usage(usage)
        if not choices:
            return Parsed(0, None, "", None)
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
                raise no_count_error("no token_ids, no continuous usage stats, no logprobs",
                                     self.hint)
        return self._take(n, ids, source, text, finish)

    def _final_usage(self, usage: Mapping[str, Any]) -> None:
        self.prompt_tokens = usage.get("prompt_tokens")
        self.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        self.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None


class OpenAIEngine(Engine):
    """Any OpenAI-compatible server: no token ids, maybe no continuous usage, no
    known counters. What it cannot prove reads "not tested"."""

    name = EngineName.OPENAI
    limitations = (
        Limitation(Capability.PREFIX_CACHE_COUNTER,
                   "a generic OpenAI server documents no prefix-cache counter"),
    )

    def build_body(self, endpoint: Endpoint, model: str, row: SuiteRow,
                   extra: Mapping[str, Any] | None = None) -> JSONObject:
        return {**openai_body(endpoint, model, row), **(extra or {})}

    def parser(self, endpoint: Endpoint) -> StreamParser:
        return OpenAIParser(endpoint=endpoint)
