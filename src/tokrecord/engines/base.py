"""What every engine adapter provides, and the parts most of them share.

An adapter holds one engine's knowledge: how to start it and tell that it is
ready, the request dialect that makes the server count tokens per chunk, how to
switch every cache off and prove it, its metric names, its version, and what it
cannot report. Nothing here does I/O except `Engine.served_models`, which asks a
running server through the client the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import StreamError
from tokrecord.metrics.engine import MetricNames
from tokrecord.metrics.logfacts import LogExtractor
from tokrecord.suite import SuiteRow

DONE = "[DONE]"


class EngineName(StrEnum):
    VLLM = "vllm"
    LLAMA_CPP = "llama.cpp"
    SGLANG = "sglang"
    OPENAI = "openai"


class Endpoint(StrEnum):
    """Which API a leg streams from. `native` is the engine's own generation API
    (llama.cpp's /completion, SGLang's /generate); the other two are OpenAI's."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    NATIVE = "native"


class CountSource(StrEnum):
    """Where a chunk's token count came from; never from re-tokenized text."""

    TOKEN_IDS = "token_ids"
    USAGE = "usage"
    LOGPROBS = "logprobs"
    NONE = "none"


class Parsed(NamedTuple):
    n: int
    ids: list[int] | None
    text: str
    finish: str | None


@dataclass
class StreamParser:
    """Turns one row's decoded event payloads into counts, ids and text.

    Subclasses implement `parse`; the state below is what the row's trace keeps.
    `finished` is set by dialects whose stream ends with a final event rather than
    OpenAI's `[DONE]` line."""

    token_ids: list[int] = field(default_factory=list)
    have_ids: bool = True
    # Every token by position: its id, or None where the server never sent it (a
    # dialect that says where its gaps are, see `_take`). `positions_known` turns
    # false at the first chunk whose ids do not account for its count.
    positional_ids: list[int | None] = field(default_factory=list)
    positions_known: bool = True
    prompt_token_ids: list[int] | None = None
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    source: CountSource = CountSource.NONE
    mismatches: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finished: bool = False
    # What the engine said about the request at its end (llama.cpp's timings,
    # SGLang's meta_info): kept verbatim for the evidence, never computed on.
    engine_timings: dict[str, Any] | None = None

    def parse(self, obj: dict[str, Any]) -> Parsed:
        raise NotImplementedError

    def _take(self, n: int, ids: list[int] | None, source: CountSource, text: str,
              finish: str | None, held: int = 0) -> Parsed:
        """Book one chunk's tokens (the count source is the first chunk's). `held`: how
        many of the chunk's n tokens, just before its ids, the server counted but never
        sent an id for (llama.cpp's UTF-8 hold-back); their positions are kept as gaps."""
        if n > 0:
            if self.source is CountSource.NONE:
                self.source = source
            if ids is not None and len(ids) == n:
                self.token_ids.extend(ids)
            else:
                self.have_ids = False
            if ids is not None and held >= 0 and len(ids) + held == n:
                self.positional_ids.extend([None] * held + list(ids))
            else:
                self.positions_known = False
        if finish is not None:
            self.finish_reason = finish
        self.text.append(text)
        return Parsed(n, ids, text, finish)


def no_count_error(missing: str, hint: str) -> StreamError:
    return StreamError(
        f"the server reports no token count per chunk ({missing}); tokrecord never "
        f"re-tokenizes text — enable one of them ({hint})"
    )


def error_event(obj: Mapping[str, Any]) -> None:
    """An `{"error": ...}` event is the server's own failure report."""
    if "error" in obj and "choices" not in obj:
        err = obj["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise StreamError(f"server sent an error event: {message}")


class SpeculativeConfig(BaseModel):
    """Speculative decoding as the server's argv configures it (None: not given there)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    num_speculative_tokens: int | None = None
    draft_model: str | None = None
    draft_sample_method: str | None = None
    rejection_sample_method: str | None = None
    source: str  # the flags it was read from
    notes: tuple[str, ...] = ()


def arg_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name value`` / ``--name=value`` in argv (argparse semantics)."""
    found: str | None = None
    for i, token in enumerate(argv):
        for name in names:
            if token == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif token.startswith(name + "="):
                found = token[len(name) + 1:]
    return found


def int_arg(argv: Sequence[str], *names: str) -> int | None:
    value = arg_value(argv, *names)
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True)
class Limitation:
    """A gate the engine cannot support: it reads "not tested" with this reason."""

    gate: str
    reason: str


class Engine:
    """One engine's knowledge. Subclasses override what differs from the defaults."""

    name: EngineName
    # Paths polled, in order, until each answers 200; the last one lists the served
    # models when `models_path` is true.
    ready_paths: tuple[str, ...] = ("/health", "/v1/models")
    models_listed: bool = True
    metrics: MetricNames = MetricNames()
    # Facts every leg of this engine reads from its server log (plans add their own).
    log_facts: tuple[LogExtractor, ...] = ()
    # Server arguments that switch every cache off. The demo plans pass them; a user's
    # argv is never changed behind their back: the cached-tokens gate proves either way.
    no_cache_args: tuple[str, ...] = ()
    # Other server arguments a valid leg needs (SGLang: no warmup generation of its own
    # before row 0, counters on /metrics); without them the gates say what is missing.
    required_args: tuple[str, ...] = ()
    # One connection per row: the server closes each streamed response's socket.
    close_after_stream: bool = False
    limitations: tuple[Limitation, ...] = ()
    # What a row lacks when it reports no cached prompt tokens (the gate's reason).
    cached_tokens_hint: str = "usage.prompt_tokens_details.cached_tokens"
    # One line per generation request in the server's log (the no-warmup gate counts
    # them); None: the log does not show requests.
    generation_line: re.Pattern[str] | None = None
    # A server log line that says why a start failed, when the engine marks its errors
    # (the first one is quoted; else a generic reading of the log is used).
    error_line: re.Pattern[str] | None = None
    # The engine's own Python distributions, in order of preference: its version is the
    # first one in the engine environment's runtime lock.
    packages: tuple[str, ...] = ()
    # The engine's public upstream source repository (None: no single one).
    repository: str | None = None
    # Substrings of an argv that name this engine (for inference when a plan omits it).
    # How an argv names this engine (for inference when a plan does not): a program
    # (a token's file name) or a Python module (`-m vllm.entrypoints...`).
    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def runs(self, token: str) -> bool:
        base = token.rsplit("/", 1)[-1]
        return base in self.programs or any(token == m or token.startswith(m + ".")
                                            for m in self.modules)

    # Where a running server states its version and build (None: nowhere); asked once
    # per leg after readiness, never a generation.
    version_path: str | None = None
    version_keys: tuple[str, ...] = ("version",)

    def version_facts(self, payload: Any) -> dict[str, str]:
        """The identity facts in the version path's answer, as strings."""
        if not isinstance(payload, dict):
            return {}
        return {k: str(payload[k]) for k in self.version_keys if payload.get(k) is not None}

    # The engine's own generation API (Endpoint.NATIVE), which is then its default.
    native_path: str | None = None

    def path(self, endpoint: Endpoint) -> str:
        if endpoint is Endpoint.CHAT:
            return "/v1/chat/completions"
        if endpoint is Endpoint.COMPLETIONS:
            return "/v1/completions"
        if self.native_path is None:
            raise StreamError(f"{self.name}: has no native generation API; use completions or chat")
        return self.native_path

    def build_body(self, endpoint: Endpoint, model: str, row: SuiteRow,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def parser(self, endpoint: Endpoint) -> StreamParser:
        raise NotImplementedError

    def default_endpoint(self) -> Endpoint:
        return Endpoint.COMPLETIONS if self.native_path is None else Endpoint.NATIVE

    def speculative(self, argv: Sequence[str]) -> SpeculativeConfig | None:
        """Speculative decoding configured in the server's argv; None: not configured."""
        return None

    def limitation(self, gate: str) -> str | None:
        return next((x.reason for x in self.limitations if x.gate == gate), None)

    def served_models(self, payload: Any) -> set[str] | None:
        """The model ids in the last ready path's answer (OpenAI's /v1/models form)."""
        if not isinstance(payload, dict):
            return None
        return {str(m.get("id")) for m in payload.get("data", []) if isinstance(m, dict)}
