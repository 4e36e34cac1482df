"""Cache audit, in the spirit of MLPerf's TEST04: the same prompt twice on one server.

If the engine reuses anything from the first request (a prefix cache, a response
cache), the repeat's time to first token drops. A repeat materially faster than
the first is evidence that a measured run could have been helped, so it fails.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import LegResult, load_rows
from tokrecord.suite import Suite, SuiteRow


class AuditVerdict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    passed: bool
    first_ttft_ms: float | None
    repeat_ttft_ms: float | None
    speedup_pct: float | None
    threshold_pct: float
    repeat_cached_tokens: int | None
    prefix_cache_hits: int | None
    text: str


def audit_suite(suite: Suite, row: int | None) -> Suite:
    """Two copies of one row (by default the longest prompt, where caching shows most)."""
    if row is None:
        index = max(range(len(suite.rows)), key=lambda i: len(suite.rows[i].prompt))
    elif 0 <= row < len(suite.rows):
        index = row
    else:
        raise ConfigError(f"--row {row} is outside the suite (0..{len(suite.rows) - 1})")
    base = suite.rows[index]
    copies = tuple(
        SuiteRow(id=f"{base.id}#{k}", prompt=base.prompt, max_tokens=min(base.max_tokens, 32))
        for k in (1, 2)
    )
    # A suite of its own: an audit run must never pass for a run of the full suite.
    digest = hashlib.sha256(f"{suite.sha256}:cache-audit:{index}".encode()).hexdigest()
    return Suite(name=f"cache-audit[{base.id}]", sha256=digest, rows=copies)


def judge_audit(result: LegResult, threshold_pct: float) -> AuditVerdict:
    records = load_rows(Path(result.run_dir))
    if len(records) != 2:
        raise ConfigError(f"cache audit needs two completed requests, got {len(records)}")
    first, repeat = (r.metrics.ttft_ms for r in records)
    speedup = 100.0 * (1 - repeat / first) if first and repeat is not None else None
    cached = records[1].trace.cached_tokens
    hits = result.engine.prefix_cache_hits if result.engine else None
    passed = speedup is not None and speedup < threshold_pct and not cached and not hits
    reasons = []
    if speedup is not None and speedup >= threshold_pct:
        reasons.append(f"the repeat's TTFT is {speedup:.1f} % faster (threshold {threshold_pct:g} %)")
    if cached:
        reasons.append(f"the repeat reports {cached} cached prompt tokens")
    if hits:
        reasons.append(f"the engine counted {hits} prefix-cache hits")
    head = "cache audit: PASS" if passed else "cache audit: FAIL"
    text = (
        f"{head}: TTFT first {first:.1f} ms, repeat {repeat:.1f} ms "
        f"({speedup:+.1f} % faster); cached tokens on repeat: {cached}; prefix-cache hits: {hits}"
        if first is not None and repeat is not None and speedup is not None
        else f"{head}: no TTFT measured"
    )
    if reasons:
        text += "\n  " + "\n  ".join(reasons)
    return AuditVerdict(passed=passed, first_ttft_ms=first, repeat_ttft_ms=repeat,
                        speedup_pct=speedup, threshold_pct=threshold_pct,
                        repeat_cached_tokens=cached, prefix_cache_hits=hits, text=text)
