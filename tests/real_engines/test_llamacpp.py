"""Real llama.cpp (xllamacpp's CPU wheel), once per session: the llama.cpp demo's
preregistered ABBA in one block (teacher from the plain arm, then A1 plain, B1 and B2
draft-model speculation, A2 plain), on the demo target with the demo model as its draft, on
the short suite (tests/real_engines/conftest.py). A llama.cpp server is ready in well under a
second, so the five legs take well under a minute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_support import ENGINE_IDLE, SHORT_MAX_TOKENS, SHORT_ROWS
from tokrecord.demo.plan import DRAFT_N_MAX, demo_plan_llamacpp
from tokrecord.evidence import read_jsonl
from tokrecord.experiment.leg import LegResult
from tokrecord.experiment.runner import run_experiment
from tokrecord.gates import GateStatus
from tokrecord.gates.teacher import load_teacher
from tokrecord.record.build import build_record, finish
from tokrecord.record.lint import lint_record
from tokrecord.record.verify import verify_dir

pytestmark = pytest.mark.engine
LEGS = ("A1", "B1", "B2", "A2")


@pytest.fixture(scope="session")
def abba(llamacpp_python: Path, demo_target_gguf: Path, demo_gguf: Path, short_suite: Path,
         tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[dict[str, LegResult], dict[str, Any], Path]:
    exp_dir = tmp_path_factory.mktemp("llamacpp-abba") / "demo"
    plan = demo_plan_llamacpp(llamacpp_python, demo_target_gguf, demo_gguf, idle_gap_s=0.5,
                              blocks=1).model_copy(update={"idle": ENGINE_IDLE,
                                                           "suite": str(short_suite)})
    results = run_experiment(plan, exp_dir)
    record = build_record(plan, exp_dir, results)
    finish(exp_dir, record)
    return results, record, exp_dir


def _gate(result: LegResult, name: str) -> Any:
    return next(g for g in result.gates if g.name == name)


@pytest.mark.parametrize("leg", LEGS)
def test_each_leg_is_complete_exact_uncached_and_rated(
    abba: tuple[dict[str, LegResult], dict[str, Any], Path], leg: str
) -> None:
    result = abba[0][leg]
    assert result.status == "complete" and result.valid, result.invalid_reasons
    assert result.engine_name == "llama.cpp"
    assert result.engine_version is not None and "build_info" in result.engine_version
    # llama.cpp streams steadily: with the machine to itself every row is rated (the
    # demo: 13/13 in every leg). Other work on a 2-core machine can still starve the
    # server of a core for a moment, so the test allows a few rows delivered in a burst.
    assert result.summary.rows == SHORT_ROWS
    assert result.summary.rows_rated >= SHORT_ROWS - 3, result.summary.warnings
    for name in ("teacher_exact", "cached_tokens_zero", "token_count_integrity",
                 "no_warmup_generation", "cleanup", "treatment_attestation"):
        assert _gate(result, name).status is GateStatus.PASS, _gate(result, name)
    # The server's own log shows one generation task per row, and no other.
    assert _gate(result, "no_warmup_generation").evidence[
        "generation_requests_in_server_log"] == SHORT_ROWS
    run = Path(result.run_dir)
    config = json.loads((run / "config.json").read_text())
    assert config["engine"] == {"name": "llama.cpp", "inferred": False}
    requests = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "request"]
    assert {r["path"] for r in requests} == {"/completion"}
    assert all(r["body"]["cache_prompt"] is False for r in requests)
    rows = json.loads((run / "rows.json").read_text())["rows"]
    assert all(r["trace"]["cached_tokens"] == 0 for r in rows)  # timings.cache_n


def test_speculative_legs_draft_and_plain_legs_do_not(
    abba: tuple[dict[str, LegResult], dict[str, Any], Path]
) -> None:
    results = abba[0]
    for leg in ("A1", "A2"):
        e = results[leg].engine
        assert e is not None and e.draft_cycles == 0 and e.prefix_cache_hits == 0
    for leg in ("B1", "B2"):
        e = results[leg].engine
        assert e is not None and e.draft_cycles and e.draft_tokens and e.accepted_draft_tokens
        assert e.draft_acceptance_rate is not None and 0 < e.draft_acceptance_rate <= 1
        assert e.prefix_cache_hits == 0  # llamacpp:prompt_tokens_cached_total did not move
        # The draft is the target's own first layers: it is right about every token.
        assert e.draft_acceptance_rate == 1.0
        claims = {c["claim"]: c["holds"]
                  for c in _gate(results[leg], "treatment_attestation").evidence["claims"]}
        assert claims == {"draft-model speculative decoding active": True,
                          "draft model loaded": True, "drafts accepted on every row": True,
                          "prompt cache off": True, "one slot": True}
    for leg in ("A1", "A2"):
        claims = {c["claim"]: c["holds"]
                  for c in _gate(results[leg], "treatment_attestation").evidence["claims"]}
        assert claims == {"no speculative decoding": True, "no draft model": True,
                          "prompt cache off": True, "one slot": True}


def test_record_verdict_verifies_and_lints(
    abba: tuple[dict[str, LegResult], dict[str, Any], Path], demo_gguf: Path
) -> None:
    _, record, exp_dir = abba
    assert record["quality"]["all_legs_teacher_exact"] == f"{4 * SHORT_ROWS}/{4 * SHORT_ROWS}"
    assert record["quality"]["all_legs_cached_zero"] == f"{4 * SHORT_ROWS}/{4 * SHORT_ROWS}"
    va = record["verdict_analysis"]
    assert va["verdict"] == record["verdict"] and va["df"] == 2
    assert va["ratio"] is not None and va["ci_low"] <= va["ratio"] <= va["ci_high"]
    assert verify_dir(exp_dir) == []
    assert lint_record(json.loads((exp_dir / "record.json").read_text())) == []
    assert any(p.startswith("xllamacpp/") for p in record["source"]["native_modules"]["engine"])
    facts = record["server_log_facts"]
    for leg in LEGS:
        assert facts[leg]["build_info"]["value"] == "b0-unknown"
        assert facts[leg]["n_threads"]["value"] == 1 and facts[leg]["n_slots"]["value"] == 1
        assert facts[leg]["graphs_reused"]["value"] > 0
    # The arms' speculative decoding, as the argv configures it, and the draft's bytes.
    assert record["speculative"]["control"] is None
    spec = record["speculative"]["candidate"]
    assert (spec["method"], spec["num_speculative_tokens"], spec["source"]) == (
        "draft-simple", DRAFT_N_MAX, "--spec-type")
    assert spec["draft_model"] == str(demo_gguf)
    assert spec["draft_manifest_sha256"] is not None
    # One draft-acceptance line per request on the speculative legs, none on the plain ones.
    assert [facts[leg]["draft_acceptance_lines"]["value"] for leg in LEGS] == [
        0, SHORT_ROWS, SHORT_ROWS, 0]


def test_record_pairs_teacher_and_record_gate(
    abba: tuple[dict[str, LegResult], dict[str, Any], Path]
) -> None:
    """The ABBA record's pairs, verdict and record gate on a real engine (moved here from
    the vLLM CPU ABBA, which now runs one leg: test_vllm_cpu.py)."""
    _, record, exp_dir = abba
    assert record["quality"]["all_legs_cross_exact"] is True
    assert record["quality"]["retries"] == 0
    assert set(record["pair_results"]) == {"B1_vs_A1", "B2_vs_A2"}
    runs = record["runs"]
    b1, a1 = runs["B1"]["headline_tok_s"], runs["A1"]["headline_tok_s"]
    assert record["pair_results"]["B1_vs_A1"]["headline_delta_pct"] == pytest.approx(
        100 * (b1 / a1 - 1))
    assert record["verdict"] in ("FASTER", "SLOWER", "NO DIFFERENCE", "UNDECIDED")
    va = record["verdict_analysis"]
    assert va["legs"] == 4 and va["leg_noise_df"] == 2 and va["leg_noise_sd_pct"] is not None
    # the demo declares no prior record, so no record can be claimed
    assert not record["record_gate"]["strict_preregistered_record_pass"]
    assert "no prior record declared in the plan" in record["record_gate"]["reasons"]
    teacher = load_teacher(exp_dir / "teacher.json")
    assert teacher.arm["name"] == "control" and len(teacher.rows) == SHORT_ROWS
    for leg in LEGS:
        config = json.loads((Path(runs[leg]["run_dir"]) / "config.json").read_text())
        assert config["leg"]["plan_sha256"] == record["plan_sha256"]


def test_every_leg_carries_idle_gates_and_host_telemetry(
    abba: tuple[dict[str, LegResult], dict[str, Any], Path]
) -> None:
    _, record, _ = abba
    assert record["quality"]["idle_before_and_after_all_legs"] is True
    assert record["quality"]["same_hardware_all_legs"] is True
    assert record["hardware"]["hw_class"] in ("CPU_ONLY", "DISCRETE_GPU")
    consecutive = ENGINE_IDLE.consecutive
    for leg in LEGS:
        op = record["operational"]["legs"][leg]
        assert op["prestart_idle_snapshots"] >= consecutive, op
        assert op["poststop_idle_snapshots"] >= consecutive, op
        assert op["prestart_idle_seconds"] >= consecutive * ENGINE_IDLE.interval_s * 0.9
        tel = record["runs"][leg]["telemetry"]
        assert tel["samples_in_window"] >= 1, tel
        assert tel["output_tokens"] == SHORT_ROWS * SHORT_MAX_TOKENS
        gates = record["runs"][leg]["gates"]
        assert gates["idle_before"]["status"] == gates["idle_after"]["status"] == "pass"
