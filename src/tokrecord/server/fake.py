"""A paced fake OpenAI-compatible streaming server: a measuring reference.

Users run it to check their setup (`python -m tokrecord.server.fake --port 8000`);
the tests use it in place of a real engine. Standard library only, so it starts in
a fraction of a second and depends on nothing that could move its timing.

Schedule (all times `time.perf_counter_ns`, the client's clock on the same machine)
    t_req   = when the request's headers have been read (handler entry)
    t_first = t_req + ttft_ms
    due(k)  = t_first + round(k * 1e9 / tok_s)          token k = 0..n-1
The schedule is absolute: every write waits for its own due time (sleep to ~1 ms
before, then spin), so a late write never delays the next one.

Chunks (`--tokens-per-chunk K`) follow what a speculative-decoding engine emits:
chunk 0 holds token 0 alone (the prefill step) and is written at due(0), which is
exactly TTFT; chunk j >= 1 holds tokens 1+(j-1)K .. min(jK, n-1), one verify cycle,
and is written when its LAST token is due. K = 1 is one token per chunk. Each chunk
is one chunked-transfer frame written with one socket write; for chat, vLLM's
role-only first event travels in the same write as chunk 0, as its own frame.

Speculative-decoding counters (exposed only when K > 1): each chunk j >= 1 is one
draft cycle that proposed K-1 draft tokens and had (tokens in chunk - 1) of them
accepted. So `accepted + cycles` equals the decode tokens n-1, and a short last
chunk shows up as a (realistically) imperfect acceptance rate.

Tokens: a prompt is "tokenized" by splitting on whitespace, id = crc32(word) % 4096
(a prompt given as token ids is used as is). Output token k has id
(crc32(prompt key) + 7919 k) % 4096 and text f" t{id}"; the key is the prompt's
UTF-8 text (token-id prompts: the ids joined by single spaces; chat: the rendered
text of `chat_prompt_text`). Same prompt, same output, always.

Wire format follows vLLM's OpenAI server: completions chunks serialise every field
(nulls included, as vLLM's `exclude_unset=False` does); chat chunks only the fields
vLLM sets. Continuous usage needs `include_usage` as well, as in vLLM. One knowing
difference: the final usage object always carries `prompt_tokens_details`
`{"cached_tokens": 0}`, which vLLM omits when nothing was cached.

Log (`--log`, JSONL, created exclusively, one flushed line per event):
    {"kind":"request","req":i,"t_ns":t_req,"path":..,"body":{..}}   every generation POST
    {"kind":"chunk","req":i,"t_ns":<after the write>,"due_ns":..,"tokens":[k..],"n":..,"ids":[..]}
    {"kind":"malformed","req":i,"t_ns":..}                           injected bad event
    {"kind":"done","req":i,"t_ns":..,"tokens":sent,"finish_reason":..,"outcome":..}
outcome is complete, cut, disconnected, failed (--fail-status), not_ready or rejected
(a 4xx answer). Only token-carrying writes have chunk lines; the role event rides in
chunk 0's write, and the usage event, `[DONE]` and the last zero-length frame go out
in one write right after the last token chunk.

Not-ready (`--ready-after-s`, `--never-ready`) answers 503 on /health, /v1/models and
generation; /metrics always answers. `--malformed-after-tokens M` injects one
`data: {not json` event after the chunk that brings the count to M (before the
first chunk when M = 0) and then carries on to a normal end. `--cut-after-tokens C`
(C <= n) sends exactly C tokens, none marked finished, then closes the connection
without the terminating zero-length chunk. Both apply to streams only; a cut
non-streaming request is closed without a response.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import IO, Any, Literal, cast

from tokrecord.errors import ConfigError
from tokrecord.server.httpd import LocalHTTPServer
from tokrecord.server.process import LEG_ENV

ENV_PREFIX = "TOKRECORD_FAKE_"
DEFAULT_MODEL = "tokrecord-fake"
DEFAULT_MAX_TOKENS = 16
VOCAB_SIZE = 4096
OUTPUT_STRIDE = 7919
# Sleep until this long before a due time, then spin: time.sleep overshoots by tens
# of microseconds to a millisecond, a spin on perf_counter_ns does not.
SPIN_NS = 1_000_000
CHILD_CODE = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
MALFORMED_EVENT = b"data: {not json\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
LAST_CHUNK = b"0\r\n\r\n"
FINISH_REASONS = ("stop", "length", "abort")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class FakeServerConfig:
    """Every option of the fake server; validated when built."""

    port: int
    host: str = "127.0.0.1"
    model: str = DEFAULT_MODEL
    ttft_ms: float = 50.0
    tok_s: float = 1000.0
    tokens_per_chunk: int = 1
    max_tokens_cap: int | None = None
    eos_after: int | None = None
    log: Path | None = None
    ready_after_s: float = 0.0
    never_ready: bool = False
    exit_after_s: float | None = None
    ignore_sigterm: bool = False
    spawn_child: bool = False
    fail_status: int | None = None
    cut_after_tokens: int | None = None
    malformed_after_tokens: int | None = None
    leg_jitter_pct: float = 0.0
    leg_jitter_seed: int | None = None
    # tok_s x exp(N(0, leg_jitter_pct %)), drawn once per start (see `leg_speed_factor`).
    speed_factor: float = 1.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port must be 0..65535, got {self.port}")
        if not self.host:
            problems.append("host must not be empty")
        if not self.model:
            problems.append("model must not be empty")
        if not (math.isfinite(self.ttft_ms) and self.ttft_ms >= 0):
            problems.append(f"ttft_ms must be a finite number >= 0, got {self.ttft_ms}")
        if not (math.isfinite(self.leg_jitter_pct) and 0 <= self.leg_jitter_pct <= 50):
            problems.append(f"leg_jitter_pct must be 0..50, got {self.leg_jitter_pct}")
        if not (math.isfinite(self.tok_s) and self.tok_s > 0):
            problems.append(f"tok_s must be a finite number > 0, got {self.tok_s}")
        if self.tokens_per_chunk < 1:
            problems.append(f"tokens_per_chunk must be >= 1, got {self.tokens_per_chunk}")
        for name in ("max_tokens_cap", "eos_after"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        for name in ("cut_after_tokens", "malformed_after_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append(f"{name} must be >= 0, got {value}")
        if not (math.isfinite(self.ready_after_s) and self.ready_after_s >= 0):
            problems.append(f"ready_after_s must be a finite number >= 0, got {self.ready_after_s}")
        if self.exit_after_s is not None and not (
            math.isfinite(self.exit_after_s) and self.exit_after_s >= 0
        ):
            problems.append(f"exit_after_s must be a finite number >= 0, got {self.exit_after_s}")
        if self.fail_status is not None and not 400 <= self.fail_status <= 599:
            problems.append(
                f"fail_status must be an HTTP error status 400..599, got {self.fail_status}"
            )
        if problems:
            raise ConfigError("fake server: " + "; ".join(problems))


_Kind = Literal["str", "int", "float", "path", "bool", "opt_int", "opt_float"]


@dataclass(frozen=True)
class _Option:
    name: str
    kind: _Kind
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


_OPTIONS = (
    _Option("host", "str", "address to bind (default 127.0.0.1)"),
    _Option("port", "int", "port to bind (required; 0 picks a free one, printed on start)"),
    _Option("model", "str", f"served model id (default {DEFAULT_MODEL})"),
    _Option("ttft_ms", "float", "request arrival to the first token's chunk, ms (default 50)"),
    _Option("tok_s", "float", "token rate after the first token (default 1000)"),
    _Option(
        "tokens_per_chunk",
        "int",
        "tokens per decode chunk, emulating speculative decoding (default 1)",
    ),
    _Option(
        "max_tokens_cap", "opt_int", "the server's own limit on generated tokens (default none)"
    ),
    _Option("eos_after", "opt_int", "finish with 'stop' after this many tokens (default none)"),
    _Option(
        "log", "path", "JSONL log of what was sent, with write times (created, never overwritten)"
    ),
    _Option(
        "ready_after_s", "float", "/health answers 503 until this long after start (default 0)"
    ),
    _Option("never_ready", "bool", "/health always answers 503"),
    _Option("exit_after_s", "opt_float", "exit with code 3 after this many seconds"),
    _Option("ignore_sigterm", "bool", "ignore SIGTERM (tests process-group cleanup)"),
    _Option("spawn_child", "bool", "spawn one child process that ignores SIGTERM and sleeps"),
    _Option("fail_status", "opt_int", "answer every generation request with this HTTP status"),
    _Option("cut_after_tokens", "opt_int", "close a stream abruptly after this many tokens"),
    _Option("malformed_after_tokens", "opt_int", "send one malformed event after this many tokens"),
    _Option("leg_jitter_pct", "float",
            "each start runs at its own speed: tok_s x exp(N(0, pct/100)), as fresh real servers "
            "do (default 0)"),
    _Option("leg_jitter_seed", "opt_int",
            f"seed for that factor, mixed with the leg name the harness exports as {LEG_ENV} "
            "(default: fresh entropy per start)"),
)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_NONE = frozenset({"", "none", "null"})


def _convert(option: _Option, raw: str) -> object:
    """Turn one flag or env string into the option's value; ValueError when it cannot."""
    text = raw.strip()
    if option.kind == "str":
        return text
    if option.kind == "path":
        return None if text.lower() in _NONE else Path(text)
    if option.kind == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")
    if option.kind in ("opt_int", "opt_float") and text.lower() in _NONE:
        return None
    if option.kind in ("int", "opt_int"):
        return int(text)
    return float(text)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tokrecord.server.fake",
        description=(
            "Paced fake OpenAI-compatible streaming server (vLLM wire format). Every "
            f"option can also be set by the environment variable {ENV_PREFIX}<NAME>; "
            "a flag wins over the environment."
        ),
    )
    for option in _OPTIONS:
        help_text = f"{option.help} [env {option.env}]"
        if option.kind == "bool":
            parser.add_argument(
                option.flag,
                dest=option.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag, dest=option.name, default=None, metavar="VALUE", help=help_text
            )
    return parser


class _Resolved:
    """Flag value, else environment value, else the dataclass default; typed getters."""

    def __init__(self, namespace: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self.values: dict[str, object] = {}
        problems = []
        for option in _OPTIONS:
            flag_value: object = getattr(namespace, option.name)
            if flag_value is not None:
                if isinstance(flag_value, bool):
                    self.values[option.name] = flag_value
                    continue
                raw, source = str(flag_value), option.flag
            elif option.env in environ:
                raw, source = environ[option.env], option.env
            else:
                continue
            try:
                self.values[option.name] = _convert(option, raw)
            except ValueError as exc:
                problems.append(
                    f"{source}={raw!r} is not a valid {option.kind.removeprefix('opt_')}: {exc}"
                )
        if problems:
            raise ConfigError("fake server: " + "; ".join(problems))

    def has(self, name: str) -> bool:
        return name in self.values

    def str_(self, name: str, default: str) -> str:
        return cast(str, self.values.get(name, default))

    def int_(self, name: str, default: int) -> int:
        return cast(int, self.values.get(name, default))

    def float_(self, name: str, default: float) -> float:
        return cast(float, self.values.get(name, default))

    def bool_(self, name: str) -> bool:
        return cast(bool, self.values.get(name, False))

    def opt_int(self, name: str) -> int | None:
        return cast("int | None", self.values.get(name))

    def opt_float(self, name: str) -> float | None:
        return cast("float | None", self.values.get(name))

    def opt_path(self, name: str) -> Path | None:
        return cast("Path | None", self.values.get(name))


def config_from_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> FakeServerConfig:
    """Options from flags, then `TOKRECORD_FAKE_*` variables, then defaults.

    A bad flag syntax exits like any argparse program (code 2); a bad value, from a
    flag or the environment, raises ConfigError.
    """
    namespace = _build_parser().parse_args(list(argv) if argv is not None else None)
    env = os.environ if environ is None else environ
    values = _Resolved(namespace, env)
    if not values.has("port"):
        raise ConfigError(f"fake server: --port (or {ENV_PREFIX}PORT) is required")
    jitter, seed = values.float_("leg_jitter_pct", 0.0), values.opt_int("leg_jitter_seed")
    factor = leg_speed_factor(jitter, seed, env.get(LEG_ENV, ""))
    return FakeServerConfig(
        leg_jitter_pct=jitter, leg_jitter_seed=seed, speed_factor=factor,
        port=values.int_("port", 0),
        host=values.str_("host", "127.0.0.1"),
        model=values.str_("model", DEFAULT_MODEL),
        ttft_ms=values.float_("ttft_ms", 50.0),
        tok_s=values.float_("tok_s", 1000.0) * factor,
        tokens_per_chunk=values.int_("tokens_per_chunk", 1),
        max_tokens_cap=values.opt_int("max_tokens_cap"),
        eos_after=values.opt_int("eos_after"),
        log=values.opt_path("log"),
        ready_after_s=values.float_("ready_after_s", 0.0),
        never_ready=values.bool_("never_ready"),
        exit_after_s=values.opt_float("exit_after_s"),
        ignore_sigterm=values.bool_("ignore_sigterm"),
        spawn_child=values.bool_("spawn_child"),
        fail_status=values.opt_int("fail_status"),
        cut_after_tokens=values.opt_int("cut_after_tokens"),
        malformed_after_tokens=values.opt_int("malformed_after_tokens"),
    )


def leg_speed_factor(jitter_pct: float, seed: int | None, leg: str) -> float:
    """One start's speed factor, lognormal around 1. Seeded, it is a function of the seed
    and the leg's name, so a rerun of an experiment draws the same factors."""
    if jitter_pct <= 0:
        return 1.0
    rng = random.Random(f"{seed}:{leg}") if seed is not None else random.SystemRandom()
    return math.exp(rng.gauss(0.0, jitter_pct / 100))


# ------------------------------------------------------------ tokens and schedule


def prompt_token_ids(text: str) -> list[int]:
    """The fake tokenizer: one token per whitespace-separated word."""
    return [zlib.crc32(word.encode("utf-8")) % VOCAB_SIZE for word in text.split()]


def output_token_ids(prompt_key: str, n: int) -> list[int]:
    """The n output token ids the fake server generates for a prompt key."""
    seed = zlib.crc32(prompt_key.encode("utf-8"))
    return [(seed + OUTPUT_STRIDE * k) % VOCAB_SIZE for k in range(n)]


def token_text(token_id: int) -> str:
    return f" t{token_id}"


def chat_prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    """The fake chat template: `<|role|> content ` per message, then `<|assistant|>`."""
    return "".join(f"<|{m['role']}|> {m['content']} " for m in messages) + "<|assistant|>"


def chunk_plan(n: int, tokens_per_chunk: int) -> list[range]:
    """Token positions per chunk: token 0 alone (prefill), then groups of K."""
    if n <= 0:
        return []
    return [range(0, 1)] + [
        range(start, min(start + tokens_per_chunk, n)) for start in range(1, n, tokens_per_chunk)
    ]


def due_ns(t_first_ns: int, k: int, tok_s: float) -> int:
    return t_first_ns + round(k * 1e9 / tok_s)


def wait_until(deadline_ns: int) -> None:
    """Sleep to about SPIN_NS before the deadline, then spin; never returns early."""
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining > SPIN_NS:
        time.sleep((remaining - SPIN_NS) / 1e9)
    while time.perf_counter_ns() < deadline_ns:
        pass


def chunk_frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame: hex length CRLF payload CRLF."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def sse_event(obj: object) -> bytes:
    return b"data: " + _dumps(obj).encode("utf-8") + b"\n\n"


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------- requests


class _RequestError(Exception):
    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True)
class _Generation:
    chat: bool
    prompt_ids: tuple[int, ...]
    prompt_key: str
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_bool(body: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _RequestError(400, f"{where}{key} must be a boolean", param=key)
    return value


def _completion_prompt(prompt: object) -> tuple[tuple[int, ...], str]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tuple(prompt_token_ids(prompt)), prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        ids = tuple(cast(list[int], prompt))
        return ids, " ".join(str(t) for t in ids)
    raise _RequestError(
        400,
        "prompt must be a string or a list of token ids (one prompt per request)",
        param="prompt",
    )


def _chat_messages(messages: object) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _RequestError(400, "messages must be a non-empty list", param="messages")
    rendered: list[dict[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _RequestError(400, "each message needs a string role", param="messages")
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            text = "".join(p["text"] for p in content)
        else:
            raise _RequestError(
                400, "message content must be a string or text parts", param="messages"
            )
        rendered.append({"role": message["role"], "content": text})
    return rendered


def _parse_generation(chat: bool, body: object, model: str) -> _Generation:
    if not isinstance(body, dict):
        raise _RequestError(400, "request body must be a JSON object")
    requested_model = body.get("model")
    if requested_model is not None and requested_model != model:
        raise _RequestError(
            404, f"The model `{requested_model}` does not exist.", "NotFoundError", "model"
        )
    if body.get("n") not in (None, 1):
        raise _RequestError(400, "the fake server supports n = 1 only", param="n")
    if body.get("echo"):
        raise _RequestError(400, "the fake server does not support echo", param="echo")
    if chat:
        text = chat_prompt_text(_chat_messages(body.get("messages")))
        ids, key = tuple(prompt_token_ids(text)), text
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        if "prompt" not in body:
            raise _RequestError(400, "prompt is required", param="prompt")
        ids, key = _completion_prompt(body["prompt"])
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens) or max_tokens < 1:
        raise _RequestError(
            400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", param="max_tokens"
        )
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise _RequestError(400, "stream_options must be an object", param="stream_options")
    if options and not stream:
        # vLLM rejects this too; accepting it would hide a client that forgot `stream`.
        raise _RequestError(
            400, "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    include_usage = _optional_bool(options, "include_usage", "stream_options.")
    continuous = _optional_bool(options, "continuous_usage_stats", "stream_options.")
    return _Generation(
        chat=chat,
        prompt_ids=ids,
        prompt_key=key,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        # As in vLLM: continuous usage stats only ride along with include_usage.
        continuous_usage=include_usage and continuous,
        return_token_ids=_optional_bool(body, "return_token_ids"),
    )


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


# ---------------------------------------------------------------- server state


class _EventLog:
    """The server's own JSONL record of what it sent; one flushed line per event."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is not None:
            try:
                self._file = path.open("x", encoding="utf-8")
            except FileExistsError as exc:
                raise ConfigError(
                    f"fake server: log file {path} exists; it is never overwritten"
                ) from exc
            except OSError as exc:
                raise ConfigError(f"fake server: cannot create log file {path}: {exc}") from exc

    def write(self, record: Mapping[str, object]) -> None:
        if self._file is None:
            return
        line = _dumps(record) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _Counters:
    """Cumulative engine-style counters since start, vLLM names on /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.active = 0
        self.max_active = 0


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(
    lines: list[str],
    name: str,
    kind: str,
    help_text: str,
    samples: Iterable[tuple[Mapping[str, str], float]],
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        rendered = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{rendered}}} {float(value)!r}")


class FakeServer(LocalHTTPServer):
    """The HTTP server with its counters and log; `serve` runs one in the foreground."""

    daemon_threads = True

    def __init__(self, config: FakeServerConfig) -> None:
        self.config = config
        self.counters = _Counters()
        self.events = _EventLog(config.log)
        self.request_numbers = itertools.count()
        self.started_ns = time.perf_counter_ns()
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((config.host, config.port), _Handler)
        except BaseException:
            self.events.close()
            raise


    def server_close(self) -> None:
        super().server_close()
        self.events.close()

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.server_port}"

    def ready(self) -> bool:
        if self.config.never_ready:
            return False
        return time.perf_counter_ns() - self.started_ns >= self.config.ready_after_s * 1e9

    def metrics_text(self) -> str:
        model = self.config.model
        labels = {"engine": "0", "model_name": model}
        c = self.counters
        with c.lock:
            families: list[tuple[str, str, str, list[tuple[dict[str, str], float]]]] = [
                (
                    "vllm:num_requests_running",
                    "gauge",
                    "Number of requests in model execution batches.",
                    [(labels, c.active)],
                ),
                (
                    "vllm:num_requests_waiting",
                    "gauge",
                    "Number of requests waiting to be processed.",
                    [(labels, 0)],
                ),
                (
                    "vllm:prefix_cache_queries_total",
                    "counter",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    [(labels, c.prompt_tokens)],
                ),
                (
                    "vllm:prefix_cache_hits_total",
                    "counter",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    [(labels, 0)],
                ),
                (
                    "vllm:prompt_tokens_total",
                    "counter",
                    "Number of prefill tokens processed.",
                    [(labels, c.prompt_tokens)],
                ),
                (
                    "vllm:generation_tokens_total",
                    "counter",
                    "Number of generation tokens processed.",
                    [(labels, c.generation_tokens)],
                ),
                (
                    "vllm:request_success_total",
                    "counter",
                    "Count of successfully processed requests.",
                    [({**labels, "finished_reason": r}, c.success[r]) for r in FINISH_REASONS],
                ),
            ]
            if self.config.tokens_per_chunk > 1:
                families += [
                    (
                        "vllm:spec_decode_num_drafts_total",
                        "counter",
                        "Number of spec decoding drafts.",
                        [(labels, c.drafts)],
                    ),
                    (
                        "vllm:spec_decode_num_draft_tokens_total",
                        "counter",
                        "Number of draft tokens.",
                        [(labels, c.draft_tokens)],
                    ),
                    (
                        "vllm:spec_decode_num_accepted_tokens_total",
                        "counter",
                        "Number of accepted tokens.",
                        [(labels, c.accepted)],
                    ),
                ]
            families += [
                (
                    "tokrecord_fake_active_generations",
                    "gauge",
                    "Generations in progress now.",
                    [({"model_name": model}, c.active)],
                ),
                (
                    "tokrecord_fake_max_concurrent_generations",
                    "gauge",
                    "Most generations in progress at once since start.",
                    [({"model_name": model}, c.max_active)],
                ),
            ]
        lines: list[str] = []
        for name, kind, help_text, samples in families:
            _metric(lines, name, kind, help_text, samples)
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------- handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tokrecord-fake/0.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: a chunk leaves when written

    @property
    def fake(self) -> FakeServer:
        return cast(FakeServer, self.server)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake: " + (format % args) + "\n")

    # -- plain responses

    def _send_bytes(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, obj: object) -> None:
        self._send_bytes(status, _dumps(obj).encode("utf-8"), "application/json")

    def _send_error_json(
        self, status: int, message: str, err_type: str, param: str | None = None
    ) -> None:
        self._send_json(status, error_body(status, message, err_type, param))

    def _not_ready(self) -> bool:
        if self.fake.ready():
            return False
        self._send_error_json(503, "server is not ready", "ServiceUnavailableError")
        return True

    # -- routing

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_bytes(200 if self.fake.ready() else 503, b"", "application/json")
        elif path == "/v1/models":
            if self._not_ready():
                return
            model = {"id": self.fake.config.model, "object": "model", "owned_by": "tokrecord"}
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == "/metrics":
            body = self.fake.metrics_text().encode("utf-8")
            self._send_bytes(200, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send_error_json(404, f"no route for GET {path}", "NotFoundError")

    def do_POST(self) -> None:
        t_req = time.perf_counter_ns()
        path = self.path.split("?", 1)[0]
        raw = self._read_body()
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._send_error_json(404, f"no route for POST {path}", "NotFoundError")
            return
        server = self.fake
        req = next(server.request_numbers)
        body: object
        try:
            body = json.loads(raw) if raw else None
            bad_json = None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            body, bad_json = None, str(exc)
        server.events.write(
            {"kind": "request", "req": req, "t_ns": t_req, "path": path, "body": body}
        )
        if server.config.fail_status is not None:
            status = server.config.fail_status
            self._send_error_json(
                status,
                f"injected failure (--fail-status {status})",
                "InternalServerError" if status >= 500 else "BadRequestError",
            )
            self._log_done(req, 0, None, "failed")
            return
        if self._not_ready():
            self._log_done(req, 0, None, "not_ready")
            return
        try:
            if bad_json is not None or body is None:
                raise _RequestError(
                    400, f"request body is not valid JSON: {bad_json or 'empty body'}"
                )
            gen = _parse_generation(path == "/v1/chat/completions", body, server.config.model)
        except _RequestError as exc:
            self._send_error_json(exc.status, exc.message, exc.err_type, exc.param)
            self._log_done(req, 0, None, "rejected")
            return
        self._generate(req, t_req, gen)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(size) if size > 0 else b""

    def _log_done(self, req: int, tokens: int, finish: str | None, outcome: str) -> None:
        self.fake.events.write(
            {
                "kind": "done",
                "req": req,
                "t_ns": time.perf_counter_ns(),
                "tokens": tokens,
                "finish_reason": finish,
                "outcome": outcome,
            }
        )

    # -- generation

    def _generate(self, req: int, t_req: int, gen: _Generation) -> None:
        config = self.fake.config
        counters = self.fake.counters
        limit = (
            gen.max_tokens
            if config.max_tokens_cap is None
            else min(gen.max_tokens, config.max_tokens_cap)
        )
        if config.eos_after is not None and config.eos_after <= limit:
            n, finish = config.eos_after, "stop"
        else:
            n, finish = limit, "length"
        cut = config.cut_after_tokens is not None and config.cut_after_tokens <= n
        n_send = cast(int, config.cut_after_tokens) if cut else n
        with counters.lock:
            counters.active += 1
            counters.max_active = max(counters.max_active, counters.active)
            counters.prompt_tokens += len(gen.prompt_ids)
        sent = 0
        outcome = "complete"
        try:
            if gen.stream:
                sent = self._stream(req, t_req, gen, n, n_send, finish, cut)
            else:
                sent = self._respond_whole(t_req, gen, n_send, finish, cut)
            if cut:
                outcome = "cut"
        except ConnectionError:  # the client went away: broken pipe, reset, abort
            outcome = "disconnected"
            self.close_connection = True
        finally:
            with counters.lock:
                counters.active -= 1
                counters.success["abort" if outcome != "complete" else finish] += 1
        self._log_done(req, sent, finish if outcome == "complete" else None, outcome)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)  # unbuffered: one sendall on the socket
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(
        self, req: int, t_req: int, gen: _Generation, n: int, n_send: int, finish: str, cut: bool
    ) -> int:
        config = self.fake.config
        counters = self.fake.counters
        events = self.fake.events
        rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        builder = _ChunkBuilder(rid, created, config.model, gen)
        ids = output_token_ids(gen.prompt_key, n_send)
        t_first = t_req + round(config.ttft_ms * 1e6)

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        malformed_at = config.malformed_after_tokens
        sent = 0
        if malformed_at == 0:
            wait_until(t_first)
            self._send_malformed(req)
            malformed_at = None
        for index, positions in enumerate(chunk_plan(n_send, config.tokens_per_chunk)):
            chunk_ids = [ids[k] for k in positions]
            last = positions[-1]
            done = not cut and last == n - 1
            payload = b""
            if index == 0 and gen.chat:
                payload += chunk_frame(builder.role_event())
            payload += chunk_frame(
                builder.token_event(chunk_ids, sent + len(chunk_ids), finish if done else None)
            )
            due = due_ns(t_first, last, config.tok_s)
            # Nothing but the wait between the due time and the write: logging follows.
            wait_until(due)
            self._write(payload)
            t_written = time.perf_counter_ns()
            sent += len(chunk_ids)
            with counters.lock:
                counters.generation_tokens += len(chunk_ids)
                if index > 0 and config.tokens_per_chunk > 1:
                    counters.drafts += 1
                    counters.draft_tokens += config.tokens_per_chunk - 1
                    counters.accepted += len(chunk_ids) - 1
            events.write(
                {
                    "kind": "chunk",
                    "req": req,
                    "t_ns": t_written,
                    "due_ns": due,
                    "tokens": list(positions),
                    "n": len(chunk_ids),
                    "ids": chunk_ids,
                }
            )
            if malformed_at is not None and sent >= malformed_at:
                self._send_malformed(req)
                malformed_at = None
        if cut:
            self._hang_up()
            return sent
        tail = b""
        if gen.include_usage:
            tail += chunk_frame(builder.usage_event(sent))
        self._write(tail + chunk_frame(DONE_EVENT) + LAST_CHUNK)
        return sent

    def _send_malformed(self, req: int) -> None:
        self._write(chunk_frame(MALFORMED_EVENT))
        self.fake.events.write({"kind": "malformed", "req": req, "t_ns": time.perf_counter_ns()})

    def _respond_whole(
        self, t_req: int, gen: _Generation, n_send: int, finish: str, cut: bool
    ) -> int:
        config = self.fake.config
        t_first = t_req + round(config.ttft_ms * 1e6)
        wait_until(due_ns(t_first, max(n_send - 1, 0), config.tok_s))
        if cut:
            self._hang_up()
            return 0
        ids = output_token_ids(gen.prompt_key, n_send)
        with self.fake.counters.lock:
            self.fake.counters.generation_tokens += n_send
        rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        builder = _ChunkBuilder(rid, int(time.time()), config.model, gen)
        self._send_json(200, builder.whole_response(ids, finish))
        return n_send


class _ChunkBuilder:
    """The JSON events of one response, field for field as vLLM writes them."""

    def __init__(self, rid: str, created: int, model: str, gen: _Generation) -> None:
        self.rid = rid
        self.created = created
        self.model = model
        self.gen = gen
        self.prompt_tokens = len(gen.prompt_ids)
        self.first_token_event = True

    def _usage(self, completion_tokens: int, details: bool = False) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

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
        chunk["prompt_token_ids"] = list(self.gen.prompt_ids) if self.gen.return_token_ids else None
        return sse_event(chunk)

    def token_event(self, ids: Sequence[int], cumulative: int, finish: str | None) -> bytes:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        chunk = self._head()
        choice: dict[str, Any]
        if self.gen.chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = token_ids
            chunk["choices"] = [choice]
            if self.gen.continuous_usage:
                chunk["usage"] = self._usage(cumulative)
        else:
            prompt_ids = None
            if self.first_token_event and self.gen.return_token_ids:
                prompt_ids = list(self.gen.prompt_ids)
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": prompt_ids,
                "token_ids": token_ids,
            }
            chunk["choices"] = [choice]
            chunk["usage"] = self._usage(cumulative) if self.gen.continuous_usage else None
        self.first_token_event = False
        return sse_event(chunk)

    def usage_event(self, completion_tokens: int) -> bytes:
        chunk = self._head()
        chunk["choices"] = []
        chunk["usage"] = self._usage(completion_tokens, details=True)
        return sse_event(chunk)

    def whole_response(self, ids: Sequence[int], finish: str) -> dict[str, Any]:
        text = "".join(token_text(t) for t in ids)
        token_ids = list(ids) if self.gen.return_token_ids else None
        prompt_ids = list(self.gen.prompt_ids) if self.gen.return_token_ids else None
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.gen.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        if self.gen.chat:
            body["choices"] = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": token_ids,
                }
            ]
            body["usage"] = self._usage(len(ids), details=True)
            body["prompt_token_ids"] = prompt_ids
        else:
            body["choices"] = [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_token_ids": prompt_ids,
                    "token_ids": token_ids,
                }
            ]
            body["usage"] = self._usage(len(ids), details=True)
        return body


# ------------------------------------------------------------------------ serve


def _spawn_child() -> subprocess.Popen[bytes]:
    # Same process group on purpose: only a group-wide kill reaches it.
    return subprocess.Popen([sys.executable, "-c", CHILD_CODE])


def _exit_later(seconds: float) -> None:
    def _exit() -> None:
        sys.stderr.write(
            f"tokrecord fake server: exiting with code 3 after {seconds} s (--exit-after-s)\n"
        )
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, _exit)
    timer.daemon = True
    timer.start()


def serve(
    config: FakeServerConfig, on_listening: Callable[[FakeServer], None] | None = None
) -> None:
    """Run the server in the foreground until interrupted (or --exit-after-s).

    Signal options need the main thread. `on_listening` is called once bound; by
    default it prints the listening line that callers wait for.
    """
    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with FakeServer(config) as server:
        if config.spawn_child:
            _spawn_child()
        if config.exit_after_s is not None:
            _exit_later(config.exit_after_s)
        if on_listening is None:
            jitter = (f" (speed factor {config.speed_factor:.6f} from leg jitter "
                      f"{config.leg_jitter_pct:g} %)" if config.leg_jitter_pct else "")
            print(f"tokrecord fake server listening on {server.url}{jitter}", flush=True)
        else:
            on_listening(server)
        server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = config_from_args(argv, os.environ)
        serve(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # e.g. the port is taken
        print(f"error: fake server cannot serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
