"""Metrics: pure functions from client timestamps and engine counters to figures."""

from tokrecord.metrics.engine import (
    EngineCounters,
    SpeculativeCounters,
    engine_counters,
    parse_counters,
)
from tokrecord.metrics.rows import (
    FORMULAS,
    Chunk,
    Convention,
    LegSummary,
    RowMetrics,
    row_metrics,
    summarize,
)

__all__ = [
    "FORMULAS",
    "Chunk",
    "Convention",
    "EngineCounters",
    "LegSummary",
    "RowMetrics",
    "SpeculativeCounters",
    "engine_counters",
    "parse_counters",
    "row_metrics",
    "summarize",
]
