"""Cache audit (TEST04-style): the same prompt twice; a materially faster repeat fails.

audit_suite is checked on a hand-built suite. judge_audit is checked once on a
real leg against the packaged fake server (no cache: must pass) and then on
rows.json files written here, where the repeat is faster or reports cached tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from probes_support import FAST_IDLE
from tokrecord.client import CountSource, RowTrace
from tokrecord.errors import ConfigError
from tokrecord.experiment.audit import audit_suite, judge_audit
from tokrecord.experiment.leg import SCHEMA_ROWS, LegConfig, LegResult, RowRecord, ServerSpec, run_leg
from tokrecord.metrics import Chunk, row_metrics
from tokrecord.suite import Suite, SuiteRow, load_suite

MS = 1_000_000
SUITE_SHA = "5e" * 32


def suite(*rows: tuple[str, str, int]) -> Suite:
    return Suite(name="unit", sha256=SUITE_SHA,
                 rows=tuple(SuiteRow(id=i, prompt=p, max_tokens=m) for i, p, m in rows))


THREE = suite(("a", "short prompt", 100), ("b", "the longest prompt of all three", 16),
              ("c", "a medium prompt", 64))


# --------------------------------------------------------------------------- audit_suite


def test_audit_suite_defaults_to_the_longest_prompt() -> None:
    audit = audit_suite(THREE, None)
    assert audit.name == "cache-audit[b]"
    assert [r.id for r in audit.rows] == ["b#1", "b#2"]
    assert [r.prompt for r in audit.rows] == ["the longest prompt of all three"] * 2
    assert audit.rows[0].prompt_sha256 == audit.rows[1].prompt_sha256
    assert [r.max_tokens for r in audit.rows] == [16, 16]  # already under the cap


def test_audit_suite_explicit_row_caps_max_tokens_at_32() -> None:
    audit = audit_suite(THREE, 0)
    assert audit.name == "cache-audit[a]"
    assert [(r.id, r.prompt, r.max_tokens) for r in audit.rows] == [
        ("a#1", "short prompt", 32), ("a#2", "short prompt", 32)]
    assert [r.max_tokens for r in audit_suite(THREE, 2).rows] == [32, 32]


def test_audit_suite_longest_tie_takes_the_first() -> None:
    tied = suite(("x", "1234", 8), ("y", "abcdefgh", 8), ("z", "ABCDEFGH", 8))
    assert audit_suite(tied, None).rows[0].id == "y#1"


@pytest.mark.parametrize("row", [3, 99, -1])
def test_audit_suite_row_outside_the_suite(row: int) -> None:
    with pytest.raises(ConfigError, match=rf"--row {row} is outside the suite \(0\.\.2\)"):
        audit_suite(THREE, row)


# --------------------------------------------------------------------------- judge_audit: real leg


@pytest.fixture(scope="module")
def fake_audit_result(tmp_path_factory: pytest.TempPathFactory) -> LegResult:
    import sys

    argv = (sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
            "--model", "{model}", "--ttft-ms", "250", "--tok-s", "2000")
    cfg = LegConfig(
        name="audit",
        server=ServerSpec(argv=argv, model="fake-model", ready_timeout_s=30, stop_grace_s=3),
        suite=audit_suite(load_suite(), None), idle=FAST_IDLE,
    )
    return run_leg(cfg, tmp_path_factory.mktemp("audit") / "leg")


# Two TTFTs measured in real time off the paced fake server, and compared (the audit's
# speed-up). Each TTFT is at least the schedule's 250 ms, so the audit can only fail (a
# repeat "faster" by 50 %) if the first row is delayed by another 250 ms, which no busy
# neighbour does: parallel group. (At 40 ms, a loaded host read 50.8 ms against 40 +/- 10.)
def test_judge_audit_passes_on_the_cacheless_fake_server(fake_audit_result: LegResult) -> None:
    result = fake_audit_result
    assert result.status == "complete" and result.rows_planned == 2
    verdict = judge_audit(result, 50.0)
    assert verdict.passed
    # Direction checks, which load cannot flip: no TTFT comes before the schedule's 250 ms.
    assert verdict.first_ttft_ms is not None and verdict.first_ttft_ms >= 250
    assert verdict.repeat_ttft_ms is not None and verdict.repeat_ttft_ms >= 250
    assert verdict.speedup_pct == pytest.approx(
        100 * (1 - verdict.repeat_ttft_ms / verdict.first_ttft_ms), rel=1e-9)
    assert verdict.repeat_cached_tokens == 0 and verdict.prefix_cache_hits == 0
    assert verdict.threshold_pct == 50.0
    assert verdict.text.startswith("cache audit: PASS: TTFT first ")
    assert "cached tokens on repeat: 0; prefix-cache hits: 0" in verdict.text
    assert "\n" not in verdict.text  # no failure reasons appended
    rows = json.loads((Path(result.run_dir) / "rows.json").read_text())["rows"]
    assert [r["trace"]["row_id"] for r in rows] == [r.id for r in audit_suite(load_suite(), None).rows]


# --------------------------------------------------------------------------- judge_audit: written rows


def record(row: int, ttft_ms: float | None, cached: int | None = 0) -> RowRecord:
    """A 4-token row whose first token arrives ttft_ms after the send (None: no tokens)."""
    t_send = (row + 1) * 10_000 * MS
    chunks = () if ttft_ms is None else tuple(
        Chunk(t_ns=t_send + round(ttft_ms * MS) + k * MS, n=1) for k in range(4))
    trace = RowTrace(
        row=row, row_id=f"b#{row + 1}", prompt_sha256=hashlib.sha256(b"p").hexdigest(),
        t_send_ns=t_send, t_end_ns=chunks[-1].t_ns if chunks else t_send, chunks=chunks,
        events=len(chunks) + 1, token_ids=(1, 2, 3, 4) if chunks else None, prompt_token_ids=None,
        text=" t1 t2 t3 t4" if chunks else "", finish_reason="length",
        count_source=CountSource.TOKEN_IDS if chunks else CountSource.NONE, count_mismatches=0,
        prompt_tokens=12, completion_tokens=len(chunks), cached_tokens=cached,
    )
    return RowRecord(trace=trace, metrics=row_metrics(t_send, chunks))


def written(base: LegResult, tmp_path: Path, *records: RowRecord, **update: object) -> LegResult:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "rows.json").write_text(json.dumps(
        {"schema": SCHEMA_ROWS, "rows": [r.model_dump(mode="json") for r in records]}))
    return base.model_copy(update={"run_dir": str(run_dir), **update})


def test_judge_audit_fails_when_the_repeat_is_half_the_ttft(
    fake_audit_result: LegResult, tmp_path: Path
) -> None:
    result = written(fake_audit_result, tmp_path, record(0, 100.0), record(1, 50.0))
    verdict = judge_audit(result, 20.0)
    assert not verdict.passed
    assert verdict.first_ttft_ms == 100.0 and verdict.repeat_ttft_ms == 50.0
    assert verdict.speedup_pct == pytest.approx(50.0)
    assert verdict.text == (
        "cache audit: FAIL: TTFT first 100.0 ms, repeat 50.0 ms (+50.0 % faster); cached tokens "
        "on repeat: 0; prefix-cache hits: 0\n  the repeat's TTFT is 50.0 % faster (threshold 20 %)")
    # The threshold decides: 50 % is under 60 %, and 50 % at a 50 % threshold fails.
    assert judge_audit(result, 60.0).passed
    assert not judge_audit(result, 50.0).passed


def test_judge_audit_slower_repeat_passes(fake_audit_result: LegResult, tmp_path: Path) -> None:
    verdict = judge_audit(written(fake_audit_result, tmp_path, record(0, 80.0), record(1, 100.0)), 10.0)
    assert verdict.passed and verdict.speedup_pct == pytest.approx(-25.0)
    assert "(-25.0 % faster)" in verdict.text


def test_judge_audit_fails_when_the_repeat_reports_cached_tokens(
    fake_audit_result: LegResult, tmp_path: Path
) -> None:
    result = written(fake_audit_result, tmp_path, record(0, 100.0, cached=0), record(1, 100.0, cached=16))
    verdict = judge_audit(result, 20.0)
    assert not verdict.passed
    assert verdict.speedup_pct == 0.0 and verdict.repeat_cached_tokens == 16
    assert verdict.text.startswith("cache audit: FAIL: TTFT first 100.0 ms, repeat 100.0 ms")
    assert verdict.text.endswith("\n  the repeat reports 16 cached prompt tokens")


def test_judge_audit_fails_on_engine_prefix_cache_hits(
    fake_audit_result: LegResult, tmp_path: Path
) -> None:
    assert fake_audit_result.engine is not None
    engine = fake_audit_result.engine.model_copy(update={"prefix_cache_hits": 7})
    result = written(fake_audit_result, tmp_path, record(0, 100.0), record(1, 100.0), engine=engine)
    verdict = judge_audit(result, 20.0)
    assert not verdict.passed and verdict.prefix_cache_hits == 7
    assert verdict.text.endswith("\n  the engine counted 7 prefix-cache hits")


def test_judge_audit_without_engine_counters(fake_audit_result: LegResult, tmp_path: Path) -> None:
    result = written(fake_audit_result, tmp_path, record(0, 100.0), record(1, 95.0), engine=None)
    verdict = judge_audit(result, 20.0)
    assert verdict.passed and verdict.prefix_cache_hits is None
    assert verdict.speedup_pct == pytest.approx(5.0)


def test_judge_audit_without_ttft_fails(fake_audit_result: LegResult, tmp_path: Path) -> None:
    verdict = judge_audit(written(fake_audit_result, tmp_path, record(0, None), record(1, 50.0)), 20.0)
    assert not verdict.passed and verdict.speedup_pct is None and verdict.first_ttft_ms is None
    assert verdict.text == "cache audit: FAIL: no TTFT measured"


@pytest.mark.parametrize("count", [1, 3])
def test_judge_audit_needs_exactly_two_rows(
    fake_audit_result: LegResult, tmp_path: Path, count: int
) -> None:
    result = written(fake_audit_result, tmp_path, *(record(i, 100.0) for i in range(count)))
    with pytest.raises(ConfigError, match=f"needs two completed requests, got {count}"):
        judge_audit(result, 20.0)
