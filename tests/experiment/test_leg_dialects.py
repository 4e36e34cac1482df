"""A leg end to end in each engine's dialect, against the fake server speaking it: the
adapter the leg infers, the count source it used, the cache proof, and what an engine
cannot report reading "not tested" with the engine's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes_support import FAST_IDLE, FAST_TELEMETRY
from send_log_support import LOAD_PROOF_REL, median_rate, sent_rows
from tokrecord.engines import Endpoint, EngineName
from tokrecord.errors import StreamError
from tokrecord.evidence import read_json
from tokrecord.evidence.seal import load_or_create_key, seal
from tokrecord.experiment.leg import LegConfig, LegResult, ServerSpec, run_leg
from tokrecord.gates import GateStatus
from tokrecord.record.verify import verify_dir
from tokrecord.suite import Suite, SuiteRow, load_suite


def _suite(rows: int = 5, max_tokens: int = 120) -> Suite:
    base = load_suite()
    return Suite(name="small", sha256=base.sha256,
                 rows=tuple(SuiteRow(id=r.id, prompt=r.prompt, max_tokens=max_tokens)
                            for r in base.rows[:rows]))


def _config(fake_argv: list[str], dialect: str, *extra: str) -> LegConfig:
    return LegConfig(
        name="t",
        server=ServerSpec(argv=(*fake_argv, "--dialect", dialect, "--tok-s", "1000", *extra),
                          model="fake-model", ready_timeout_s=30, stop_grace_s=3),
        suite=_suite(), idle=FAST_IDLE, telemetry=FAST_TELEMETRY,
    )


def _gate(result: LegResult, name: str):  # type: ignore[no-untyped-def]
    return next(g for g in result.gates if g.name == name)


# The rate is checked against the server's own send log, within a tolerance load cannot
# break (tests/send_log_support.py): parallel group. Precision is bench/fidelity's.
@pytest.mark.parametrize(("dialect", "endpoint", "source"), [
    ("llama.cpp", "native", "token_ids"),
    ("sglang", "native", "token_ids"),
    ("openai", "completions", "usage"),
])
def test_each_dialect_streams_counts_and_verifies(
    fake_argv: list[str], run_root: Path, tmp_path: Path, dialect: str, endpoint: str,
    source: str
) -> None:
    out = run_root / dialect
    log = tmp_path / "sent.jsonl"
    result = run_leg(_config(fake_argv, dialect, "--log", str(log)), out)
    assert result.status == "complete", result.error
    assert result.engine_name == dialect
    assert result.count_source == source
    assert result.summary.rows == 5 and result.summary.output_tokens_total == 600
    # The dialect's counts and stamps are the right ones: the client's rate tracks what the
    # server logged it sent, whatever the load (its precision is bench/fidelity's).
    assert result.summary.tok_s_out == pytest.approx(median_rate(sent_rows(log)),
                                                     rel=LOAD_PROOF_REL)
    config = read_json(out / "config.json", ValueError)
    assert config["engine"] == {"name": dialect, "inferred": True}
    assert config["leg"]["endpoint"] == endpoint  # the engine's own default
    assert _gate(result, "token_count_integrity").status is GateStatus.PASS
    seal(out, load_or_create_key())
    assert verify_dir(out) == []  # every row recomputes from the raw events, in its dialect


def test_llamacpp_cache_proof_from_timings(fake_argv: list[str], run_root: Path) -> None:
    result = run_leg(_config(fake_argv, "llama.cpp"), run_root / "leg")
    cached = _gate(result, "cached_tokens_zero")
    assert cached.status is GateStatus.PASS, cached
    assert cached.evidence["rows_reported"] == 5


def test_openai_without_a_cache_counter_is_not_tested_with_the_engine_s_reason(
    fake_argv: list[str], run_root: Path
) -> None:
    result = run_leg(_config(fake_argv, "openai"), run_root / "leg")
    cached = _gate(result, "cached_tokens_zero")
    assert cached.status is GateStatus.NOT_TESTED
    assert cached.reason == "a generic OpenAI server documents no prefix-cache counter"


def test_openai_without_per_chunk_counts_is_refused_not_retokenized(
    fake_argv: list[str], run_root: Path
) -> None:
    with pytest.raises(StreamError, match=r"no token count per chunk.*never re-tokenizes"):
        run_leg(_config(fake_argv, "openai", "--no-continuous-usage"), run_root / "leg")
    error = read_json(run_root / "leg" / "error.json", ValueError)
    assert error["status"] == "failed" and error["rows_completed"] == 0


def test_an_explicit_engine_wins_over_inference(fake_argv: list[str], run_root: Path) -> None:
    cfg = _config(fake_argv, "llama.cpp").model_copy(
        update={"engine": EngineName.LLAMA_CPP, "endpoint": Endpoint.NATIVE})
    result = run_leg(cfg, run_root / "leg")
    config = read_json(run_root / "leg" / "config.json", ValueError)
    assert config["engine"] == {"name": "llama.cpp", "inferred": False}
    assert result.status == "complete"
