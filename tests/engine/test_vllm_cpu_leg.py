"""Real vLLM CPU: a plain leg captures the teacher, an ngram leg must match it exactly;
a prefix-caching server fails the cache audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokrecord.demo.model import model_manifest
from tokrecord.evidence import read_jsonl
from tokrecord.experiment.audit import audit_suite, judge_audit
from tokrecord.experiment.leg import LegConfig, LegResult, ServerSpec, run_leg, teacher_from_run
from tokrecord.gates import GateConfig, GateStatus
from tokrecord.gates.teacher import Teacher, load_teacher, write_teacher
from tokrecord.server import embedded
from tokrecord.suite import load_suite

pytestmark = pytest.mark.engine


def _config(python: Path, model: Path, arm: str, *, prefix_caching: bool = False) -> LegConfig:
    spec = embedded.NGRAM_SPEC if arm == "ngram" else None
    return LegConfig(
        name=arm, arm=arm,
        server=ServerSpec(
            argv=tuple(embedded.vllm_argv(python, speculative=spec, prefix_caching=prefix_caching)),
            env=embedded.ENGINE_ENV, model=str(model), served_model=embedded.SERVED_MODEL,
            ready_timeout_s=600),
        suite=load_suite(),
        gates=GateConfig(long_context_threshold=800, rollover_boundary=1024,
                         log_rules=embedded.arm_log_rules(arm)),
    )


@pytest.fixture(scope="module")
def legs(engine_python: Path, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[dict[str, LegResult], Teacher]:
    root = tmp_path_factory.mktemp("vllm-legs")
    plain_config = _config(engine_python, demo_model, "plain")
    plain = run_leg(plain_config, root / "plain")
    teacher_path = write_teacher(
        root / "teacher.json",
        teacher_from_run(root / "plain", plain_config, model_manifest(demo_model)))
    teacher = load_teacher(teacher_path)
    ngram = run_leg(_config(engine_python, demo_model, "ngram"), root / "ngram", teacher=teacher)
    return {"plain": plain, "ngram": ngram}, teacher


def _rows(result: LegResult) -> list[dict]:  # type: ignore[type-arg]
    return json.loads((Path(result.run_dir) / "rows.json").read_text())["rows"]  # type: ignore[no-any-return]


def _gate(result: LegResult, name: str):  # type: ignore[no-untyped-def]
    return next(g for g in result.gates if g.name == name)


@pytest.mark.parametrize("arm", ["plain", "ngram"])
def test_leg_is_complete_and_counts_agree(legs: tuple[dict[str, LegResult], Teacher], arm: str) -> None:
    result = legs[0][arm]
    assert result.status == "complete", result.error
    assert result.summary.rows == 13 and result.summary.rows_rated == 13
    assert result.count_source == "token_ids"
    assert result.rows_count_match == 13  # reported completion tokens == tokens streamed
    assert result.rows_cached_reported == 13 and result.rows_cached_zero == 13
    assert result.engine is not None and result.engine.prefix_cache_hits == 0
    assert result.cleanup_passed and result.cleanup is not None
    assert result.cleanup.surviving_workers == 0 and not result.cleanup.port_listening_after
    s = result.summary
    assert s.tok_s_out is not None and s.tok_s_out > 0
    assert s.ttft_ms_median is not None and s.ttft_ms_median > 0
    prompts = [r["trace"]["prompt_token_ids"] for r in _rows(result)]
    longest = max(range(13), key=lambda i: len(prompts[i] or []))
    assert 850 <= len(prompts[longest]) <= 900 and longest < 12
    assert any(e["kind"] == "chunk" for e in read_jsonl(Path(result.run_dir) / "events.jsonl"))
    for name in ("token_count_integrity", "cached_tokens_zero", "no_warmup_generation",
                 "single_active_generation", "cleanup", "treatment_attestation"):
        assert _gate(result, name).status is GateStatus.PASS, _gate(result, name)


def test_plain_has_no_speculative_counters(legs: tuple[dict[str, LegResult], Teacher]) -> None:
    plain = legs[0]["plain"]
    assert plain.engine is not None and not plain.engine.draft_cycles
    assert plain.summary.quantisation_bound_pct_max == 0.0


def test_ngram_speculative_counters_nonzero(legs: tuple[dict[str, LegResult], Teacher]) -> None:
    ngram = legs[0]["ngram"]
    e = ngram.engine
    assert e is not None
    assert e.draft_cycles and e.draft_tokens and e.accepted_draft_tokens
    assert e.draft_acceptance_rate is not None and 0 < e.draft_acceptance_rate <= 1
    assert e.emitted_tokens_per_draft_cycle is not None and e.emitted_tokens_per_draft_cycle > 1
    assert e.aggregate_cycle_ms is not None and e.aggregate_cycle_ms > 0
    bound = ngram.summary.quantisation_bound_pct_max
    assert bound is not None and bound > 0  # speculative chunks carry several tokens


def test_ngram_is_teacher_exact_and_every_gate_holds(
    legs: tuple[dict[str, LegResult], Teacher]
) -> None:
    ngram, teacher = legs[0]["ngram"], legs[1]
    assert teacher.model_manifest and "model.safetensors" in teacher.model_manifest
    exact = _gate(ngram, "teacher_exact")
    assert exact.status is GateStatus.PASS and exact.count == "13/13"
    assert exact.evidence["compared_by"] == ["token_ids"]
    assert _gate(ngram, "full_output_then_next").count == "12/12"
    long_gate = _gate(ngram, "long_context_then_next")
    assert long_gate.status is GateStatus.PASS and long_gate.count == "1/1"
    assert _gate(ngram, "rollover").status is GateStatus.PASS
    claims = {c["claim"]: c["holds"] for c in _gate(ngram, "treatment_attestation").evidence["claims"]}
    assert claims["ngram speculative decoding active"] and not claims["Intel OpenMP preloaded"]
    assert ngram.valid, ngram.invalid_reasons


def test_outputs_identical_across_arms(legs: tuple[dict[str, LegResult], Teacher]) -> None:
    plain, ngram = _rows(legs[0]["plain"]), _rows(legs[0]["ngram"])
    for a, b in zip(plain, ngram, strict=True):
        assert a["trace"]["token_ids"] == b["trace"]["token_ids"], a["trace"]["row_id"]
        assert a["trace"]["finish_reason"] == b["trace"]["finish_reason"]


def test_prefix_caching_fails_cached_tokens_gate_and_audit(
    engine_python: Path, demo_model: Path, tmp_path: Path
) -> None:
    config = _config(engine_python, demo_model, "plain", prefix_caching=True)
    audit = config.model_copy(update={"suite": audit_suite(config.suite, None)})
    result = run_leg(audit, tmp_path / "audit")
    assert result.status == "complete", result.error
    cached = _gate(result, "cached_tokens_zero")
    assert cached.status is GateStatus.FAIL, cached
    assert cached.evidence["rows_nonzero"] == [1]  # the repeat, not the first request
    verdict = judge_audit(result, threshold_pct=20.0)
    assert not verdict.passed
    assert verdict.repeat_cached_tokens and verdict.repeat_cached_tokens > 0
