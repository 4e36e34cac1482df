"""One real leg on vLLM CPU plain and one with ngram speculative decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokrecord.evidence import read_jsonl
from tokrecord.experiment.leg import LegConfig, LegResult, ServerSpec, run_leg
from tokrecord.server import embedded
from tokrecord.suite import load_suite

pytestmark = pytest.mark.engine


def _leg(python: Path, model: Path, out: Path, arm: str) -> LegResult:
    spec = embedded.NGRAM_SPEC if arm == "ngram" else None
    config = LegConfig(
        name=arm, arm=arm,
        server=ServerSpec(argv=tuple(embedded.vllm_argv(python, speculative=spec)),
                          env=embedded.ENGINE_ENV, model=str(model),
                          served_model=embedded.SERVED_MODEL, ready_timeout_s=600),
        suite=load_suite(),
    )
    return run_leg(config, out)


@pytest.fixture(scope="module")
def legs(engine_python: Path, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, LegResult]:
    root = tmp_path_factory.mktemp("vllm-legs")
    return {arm: _leg(engine_python, demo_model, root / arm, arm) for arm in ("plain", "ngram")}


def _rows(result: LegResult) -> list[dict]:  # type: ignore[type-arg]
    import json

    return json.loads((Path(result.run_dir) / "rows.json").read_text())["rows"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("arm", ["plain", "ngram"])
def test_leg_is_complete_and_counts_agree(legs: dict[str, LegResult], arm: str) -> None:
    result = legs[arm]
    assert result.status == "complete", result.error
    assert result.summary.rows == 13 and result.summary.rows_rated == 13
    assert result.count_source == "token_ids"
    # server-reported completion tokens equal the tokens streamed, on every row
    assert result.rows_count_match == 13
    assert result.rows_cached_reported == 13 and result.rows_cached_zero == 13
    assert result.engine is not None and result.engine.prefix_cache_hits == 0
    assert result.cleanup_passed and result.cleanup is not None
    assert result.cleanup.surviving_workers == 0 and not result.cleanup.port_listening_after
    s = result.summary
    assert s.tok_s_out is not None and s.tok_s_out > 0
    assert s.ttft_ms_median is not None and s.ttft_ms_median > 0
    # the long (~870-token) prompt row was streamed and is not the last row
    prompts = [r["trace"]["prompt_token_ids"] for r in _rows(result)]
    longest = max(range(13), key=lambda i: len(prompts[i] or []))
    assert 850 <= len(prompts[longest]) <= 900 and longest < 12
    assert any(e["kind"] == "chunk" for e in read_jsonl(Path(result.run_dir) / "events.jsonl"))


def test_plain_has_no_speculative_counters(legs: dict[str, LegResult]) -> None:
    engine = legs["plain"].engine
    assert engine is not None and not engine.draft_cycles
    assert legs["plain"].summary.quantisation_bound_pct_max == 0.0


def test_ngram_speculative_counters_nonzero(legs: dict[str, LegResult]) -> None:
    e = legs["ngram"].engine
    assert e is not None
    assert e.draft_cycles and e.draft_cycles > 0
    assert e.draft_tokens and e.draft_tokens > 0
    assert e.accepted_draft_tokens and e.accepted_draft_tokens > 0
    assert e.draft_acceptance_rate is not None and 0 < e.draft_acceptance_rate <= 1
    assert e.emitted_tokens_per_draft_cycle is not None and e.emitted_tokens_per_draft_cycle > 1
    assert e.aggregate_cycle_ms is not None and e.aggregate_cycle_ms > 0
    # speculative chunks carry several tokens: the per-token conventions are quantised
    assert legs["ngram"].summary.quantisation_bound_pct_max is not None
    assert legs["ngram"].summary.quantisation_bound_pct_max > 0


def test_outputs_identical_across_arms(legs: dict[str, LegResult]) -> None:
    plain, ngram = _rows(legs["plain"]), _rows(legs["ngram"])
    for a, b in zip(plain, ngram, strict=True):
        assert a["trace"]["token_ids"] == b["trace"]["token_ids"], a["trace"]["row_id"]
        assert a["trace"]["text"] == b["trace"]["text"]
        assert a["trace"]["finish_reason"] == b["trace"]["finish_reason"]
