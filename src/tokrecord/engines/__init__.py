"""Engine adapters: each engine's knowledge in its own module.

`engine_for` gives the adapter for a name; `infer_engine` names the engine an
argv starts when a plan does not say (the leg records that it was inferred).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import (
    Capability,
    CountSource,
    Endpoint,
    Engine,
    EngineName,
    Limitation,
    Parsed,
    SpeculativeConfig,
    StreamParser,
)
from .llamacpp import LlamaCppEngine
from .openai import OpenAIEngine
from .sglang import SglangEngine
from .vllm import VllmEngine

ENGINES: dict[EngineName, Engine] = {
    e.name: e for e in (VllmEngine(), LlamaCppEngine(), SglangEngine(), OpenAIEngine())
}
# The packaged fake server says which engine it imitates with --dialect.
FAKE_MODULE = "tokrecord.server.fake"


def engine_for(name: EngineName | str) -> Engine:
    try:
        return ENGINES[EngineName(name)]
    except ValueError:
        known = ", ".join(repr(str(n)) for n in ENGINES)
        raise ValueError(f"unknown engine {name!r}; known engines: {known}") from None


def fill_endpoint(data: Any, argv: Sequence[str] | None) -> Any:
    """A plan or leg config without `endpoint` streams from its engine's default one.

    Filled in before validation, so that an omitted key and the default spelled out
    give the same object (and a vLLM plan the same hash as before engines existed)."""
    if not isinstance(data, dict) or data.get("endpoint") is not None:
        return data
    if not isinstance(argv, list | tuple) or not all(isinstance(t, str) for t in argv):
        argv = None  # a malformed argv: the model's own validation names it
    name = data.get("engine")
    if name is None and argv is None:
        return data
    try:
        engine = engine_for(name) if name is not None else ENGINES[infer_engine(argv or ())]
    except ValueError:
        return data  # the model's own validation names the bad engine
    return {**data, "endpoint": engine.default_endpoint().value}


# `tokrecord fake-server ...`: the fake server as an installed user runs it.
FAKE_COMMAND = "fake-server"


def _fake_dialect(argv: Sequence[str]) -> EngineName:
    """The fake server speaks the engine its --dialect names (default vllm)."""
    args = list(argv)
    for i, token in enumerate(args):
        value = (args[i + 1] if token == "--dialect" and i + 1 < len(args)
                 else token.split("=", 1)[1] if token.startswith("--dialect=") else None)
        if value is not None:
            return EngineName(value)
    return EngineName.VLLM


def infer_engine(argv: Sequence[str]) -> EngineName:
    """The engine an argv starts: the first token that names one (its program or its
    Python module), else a generic OpenAI server."""
    if FAKE_MODULE in argv or FAKE_COMMAND in argv:
        return _fake_dialect(argv)
    for token in argv:
        for engine in ENGINES.values():
            if engine.runs(token):
                return engine.name
    return EngineName.OPENAI


__all__ = [
    "ENGINES",
    "FAKE_MODULE",
    "Capability",
    "CountSource",
    "Endpoint",
    "Engine",
    "EngineName",
    "Limitation",
    "Parsed",
    "SpeculativeConfig",
    "StreamParser",
    "engine_for",
    "fill_endpoint",
    "infer_engine",
]
