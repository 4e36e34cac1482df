"""What every engine adapter provides, and the parts most of them share.

An adapter holds one engine's knowledge: how to start it and tell that it is
ready, the request dialect that makes the server count tokens per chunk, how to
switch every cache off and prove it, its metric names, its version, what its argv
sets (`Engine.launch_facts`), and what it cannot report. Nothing here does I/O: the
server's answers (its models list, its version) are handed in by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import StreamError
from tokrecord.jsontypes import JSONObject
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
    engine_timings: JSONObject | None = None

    def parse(self, obj: JSONObject) -> Parsed:
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


class LaunchFacts(BaseModel):
    """What a server's argv (and env) set explicitly, as its engine reads them. None: not
    set there; an engine default is never assumed, since defaults change between
    versions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    quantization: str | None = None
    quantization_source: str  # the flag it came from, or why there is none
    prefix_caching: bool | None = None
    tensor_parallel: int | None = None
    context_length: int | None = None
    kv_cache_dtype: str | None = None
    speculative: SpeculativeConfig | None = None


# --dtype values that mean unquantized weights, as the leaderboards name them.
DTYPES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
          "bfloat16": "bf16"}


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


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def int_arg(argv: Sequence[str], *names: str) -> int | None:
    value = arg_value(argv, *names)
    return int(value) if value is not None and value.isdigit() else None


class Capability(StrEnum):
    """What a gate needs from an engine. The gate registry names the capability each
    gate needs, so an engine declares what it lacks without naming gates."""

    PREFIX_CACHE_COUNTER = "prefix_cache_counter"


@dataclass(frozen=True)
class Limitation:
    """A capability the engine lacks: a gate that needs it reads "not tested" with this
    reason."""

    lacks: Capability
    reason: str


class Engine:
    """One engine's knowledge. Subclasses override what differs from the defaults."""

    name: EngineName
    # Paths polled, in order, until each answers 200; the last one lists the served
    # models when `models_listed` is true.
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
                   extra: Mapping[str, Any] | None = None) -> JSONObject:
        """One row's request in this engine's dialect, asking for a token count on every
        chunk; `extra` (the plan's request_extra) is merged over it."""
        raise NotImplementedError

    def parser(self, endpoint: Endpoint) -> StreamParser:
        """A fresh parser for one row's stream from this endpoint."""
        raise NotImplementedError

    def default_endpoint(self) -> Endpoint:
        return Endpoint.COMPLETIONS if self.native_path is None else Endpoint.NATIVE

    def speculative(self, argv: Sequence[str]) -> SpeculativeConfig | None:
        """Speculative decoding configured in the server's argv; None: not configured."""
        return None

    # The flags that set each launch fact. The defaults are the union over the engines
    # tokrecord knows, for a server it cannot name; an adapter keeps its own.
    quantization_flags: tuple[str, ...] = ("--quantization", "-q")
    dtype_flags: tuple[str, ...] = ("--dtype",)
    parallel_flags: tuple[str, ...] = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
    context_flags: tuple[str, ...] = ("--max-model-len", "--context-length", "--ctx-size", "-c")
    kv_dtype_flags: tuple[str, ...] = ("--kv-cache-dtype",)
    kv_k_flags: tuple[str, ...] = ("--cache-type-k", "-ctk")
    kv_v_flags: tuple[str, ...] = ("--cache-type-v", "-ctv")
    prefix_off_flags: tuple[str, ...] = ("--no-enable-prefix-caching", "--disable-radix-cache")
    prefix_on_flags: tuple[str, ...] = ("--enable-prefix-caching",)

    def launch_facts(self, argv: Sequence[str], env: Mapping[str, str]) -> LaunchFacts:
        """Quantisation, prefix caching, parallelism, context length, KV dtype and
        speculative settings as this engine reads its argv. `env` is for an engine that
        takes them from its environment; none of the four does yet."""
        del env
        quant, source = self._quantization(argv)
        tp = arg_value(argv, *self.parallel_flags) if self.parallel_flags else None
        context = arg_value(argv, *self.context_flags) if self.context_flags else None
        prefix = (False if any(f in argv for f in self.prefix_off_flags) else
                  True if any(f in argv for f in self.prefix_on_flags) else None)
        return LaunchFacts(
            quantization=quant, quantization_source=source, prefix_caching=prefix,
            tensor_parallel=_int_or_none(tp),
            context_length=_int_or_none(context), kv_cache_dtype=self._kv_dtype(argv),
            speculative=self.speculative(argv))

    def _quantization(self, argv: Sequence[str]) -> tuple[str | None, str]:
        # An explicit --quantization wins over --dtype.
        method = arg_value(argv, *self.quantization_flags) if self.quantization_flags else None
        if method:
            return method, f"--quantization {method}"
        dtype = arg_value(argv, *self.dtype_flags) if self.dtype_flags else None
        if dtype and dtype.lower() in DTYPES:
            return DTYPES[dtype.lower()], f"--dtype {dtype} (unquantized weights)"
        return None, (f"--dtype {dtype}" if dtype else
                      "no --quantization or --dtype in the server argv")

    def _kv_dtype(self, argv: Sequence[str]) -> str | None:
        value = arg_value(argv, *self.kv_dtype_flags) if self.kv_dtype_flags else None
        if value:
            return value
        k = arg_value(argv, *self.kv_k_flags) if self.kv_k_flags else None
        v = arg_value(argv, *self.kv_v_flags) if self.kv_v_flags else None
        if k and v and k != v:
            return f"k:{k},v:{v}"
        return k or v

    def limitation(self, needs: Capability | None) -> str | None:
        return next((x.reason for x in self.limitations if x.lacks is needs), None)

    def served_models(self, payload: Any) -> set[str] | None:
        """The model ids in the last ready path's answer (OpenAI's /v1/models form), as
        the caller fetched it; None when the answer is not that form."""
        if not isinstance(payload, dict):
            return None
        return {str(m.get("id")) for m in payload.get("data", []) if isinstance(m, dict)}
