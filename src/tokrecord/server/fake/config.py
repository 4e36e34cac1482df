"""The fake server's options: flags, then TOKRECORD_FAKE_* variables, then defaults."""

from __future__ import annotations

import argparse
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from tokrecord.errors import ConfigError
from tokrecord.server.fake.constants import (
    DEFAULT_MODEL,
    DIALECT_NAMES,
    ENV_PREFIX,
    LEG_ENV,
    SPIN_NS,
)


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
    # Which engine the server imitates (tokrecord.server.fake.dialects).
    dialect: str = "vllm"
    # vLLM's --speculative-config (JSON): logged at start as vLLM logs its engine config.
    speculative_config: str = ""
    # OpenAI endpoints ignore stream_options.continuous_usage_stats: no per-chunk count.
    no_continuous_usage: bool = False
    # The engines' own cache and warmup switches, so an argv completed with them starts:
    # llama.cpp's prompt cache, SGLang's radix cache and startup warmup request, vLLM's
    # prefix caching (accepted and ignored: the fake's vLLM caches nothing).
    no_cache_prompt: bool = False
    disable_radix_cache: bool = False
    skip_server_warmup: bool = False
    enable_prefix_caching: bool = False
    # SGLang's --enable-metrics and llama.cpp's --metrics: the fake always serves /metrics.
    enable_metrics: bool = False
    metrics: bool = False
    # llama.cpp: the id of every Nth token is held back, as llama.cpp holds a token that
    # leaves incomplete UTF-8 (engines/llamacpp.py): no event for it, and the next event
    # carries its text but only its own id.
    hold_back_every: int | None = None
    # How long before each due write the wait stops sleeping and spins (time.sleep
    # overshoots, a spin does not). 0 sleeps only: far less CPU, writes a little late;
    # the test suite runs its fake servers so (tests/conftest.py), bench/fidelity never.
    spin_us: float = SPIN_NS / 1000

    @property
    def spin_ns(self) -> int:
        return round(self.spin_us * 1000)

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
        if not (math.isfinite(self.spin_us) and self.spin_us >= 0):
            problems.append(f"spin_us must be a finite number >= 0, got {self.spin_us}")
        if not (math.isfinite(self.tok_s) and self.tok_s > 0):
            problems.append(f"tok_s must be a finite number > 0, got {self.tok_s}")
        if self.hold_back_every is not None and (
                self.hold_back_every < 2 or self.dialect != "llama.cpp"
                or self.tokens_per_chunk != 1):
            problems.append("hold_back_every must be >= 2, with --dialect llama.cpp and one "
                            f"token per chunk, got {self.hold_back_every}")
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
        if self.dialect not in DIALECT_NAMES:
            problems.append(f"dialect must be one of {', '.join(DIALECT_NAMES)}, got {self.dialect!r}")
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
    _Option("dialect", "str",
            f"the engine imitated: {' | '.join(DIALECT_NAMES)} (default vllm)"),
    _Option("speculative_config", "str",
            "vllm: JSON as vLLM takes it; logged at start in vLLM's engine-config line "
            "(the speed comes from --tokens-per-chunk)"),
    _Option("no_continuous_usage", "bool",
            "ignore stream_options.continuous_usage_stats: no chunk says how many tokens it has"),
    _Option("no_cache_prompt", "bool", "llama.cpp: switch the prompt cache off for every request"),
    _Option("disable_radix_cache", "bool", "sglang: switch the radix (prefix) cache off"),
    _Option("skip_server_warmup", "bool", "sglang: no warmup request of its own at start"),
    _Option("enable_prefix_caching", "bool",
            "vllm: accepted and ignored (the fake's vLLM caches nothing)"),
    _Option("enable_metrics", "bool", "sglang: accepted and ignored (/metrics always answers)"),
    _Option("metrics", "bool", "llama.cpp: accepted and ignored (/metrics always answers)"),
    _Option("hold_back_every", "opt_int",
            "llama.cpp: hold back every Nth token's id as llama.cpp holds a token that leaves "
            "incomplete UTF-8 (no event; the next event has its text, not its id)"),
    _Option("spin_us", "float",
            f"spin this long before each due write instead of sleeping (default "
            f"{SPIN_NS // 1000}; 0 sleeps only: much less CPU, writes tens of µs late)"),
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
            "Paced fake streaming server in an engine's wire format (vLLM's by default; "
            "--dialect picks llama.cpp, SGLang or a plain OpenAI server). Every "
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
                # A flag named --no-x (an engine's own spelling) would read as its own
                # negation under BooleanOptionalAction.
                action="store_true" if option.flag.startswith("--no-")
                else argparse.BooleanOptionalAction,
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
        speculative_config=values.str_("speculative_config", ""),
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
        dialect=values.str_("dialect", "vllm"),
        no_continuous_usage=values.bool_("no_continuous_usage"),
        no_cache_prompt=values.bool_("no_cache_prompt"),
        disable_radix_cache=values.bool_("disable_radix_cache"),
        skip_server_warmup=values.bool_("skip_server_warmup"),
        enable_prefix_caching=values.bool_("enable_prefix_caching"),
        enable_metrics=values.bool_("enable_metrics"),
        metrics=values.bool_("metrics"),
        hold_back_every=values.opt_int("hold_back_every"),
        spin_us=values.float_("spin_us", SPIN_NS / 1000),
    )


def leg_speed_factor(jitter_pct: float, seed: int | None, leg: str) -> float:
    """One start's speed factor, lognormal around 1. Seeded, it is a function of the seed
    and the leg's name, so a rerun of an experiment draws the same factors."""
    if jitter_pct <= 0:
        return 1.0
    rng = random.Random(f"{seed}:{leg}") if seed is not None else random.SystemRandom()
    return math.exp(rng.gauss(0.0, jitter_pct / 100))
