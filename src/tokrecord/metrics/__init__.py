"""Metrics: pure functions from client timestamps and engine counters to figures."""

from tokrecord.metrics.engine import EngineCounters, engine_counters, parse_counters
from tokrecord.metrics.rows import (
    Chunk,
    Convention,
    LegSummary,
    RowMetrics,
    row_metrics,
    summarize,
)

__all__ = [
    "Chunk",
    "Convention",
    "EngineCounters",
    "LegSummary",
    "RowMetrics",
    "engine_counters",
    "parse_counters",
    "row_metrics",
    "summarize",
]
