"""The engines the fake server imitates (`--dialect`), one module each."""

from __future__ import annotations

from tokrecord.server.fake.dialects.base import Dialect
from tokrecord.server.fake.dialects.llamacpp import LlamaCppDialect
from tokrecord.server.fake.dialects.openai import PlainOpenAIDialect, VllmDialect
from tokrecord.server.fake.dialects.sglang import SglangDialect

DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (VllmDialect(), LlamaCppDialect(), SglangDialect(), PlainOpenAIDialect())
}

__all__ = ["DIALECTS", "Dialect"]
