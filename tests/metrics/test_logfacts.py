"""Log facts: declared extractions from a server log, per rank, with what was found."""

from __future__ import annotations

import pytest

from paths import FIXTURES
from tokrecord.engines import engine_for
from tokrecord.metrics.logfacts import (
    LogExtractor,
    Reduction,
    extract_log_facts,
    merge_extractors,
)

TP2 = (FIXTURES / "vllm" / "tp2-startup.log").read_text()


def _by_name(text: str, *extractors: LogExtractor) -> dict[str, object]:
    return {f.name: f for f in extract_log_facts(text, extractors)}


def test_count_per_rank_keeps_what_was_found() -> None:
    fact = extract_log_facts(TP2, [LogExtractor(name="captures",
                                                pattern="Graph capturing finished in")])[0]
    assert fact.value == 3 and fact.found == 3
    assert fact.per_rank == {"EngineCore_DP0": 1, "Worker_TP0": 1, "Worker_TP1": 1}


def test_reductions_over_typed_values() -> None:
    text = "a x=3\nb x=7\n(Worker_TP1 pid=9) c x=5\n"
    facts = {f.name: f for f in extract_log_facts(text, [
        LogExtractor(name=f"x_{how.value}", pattern=r"x=(\d+)", reduce=how, value="int")
        for how in Reduction])}
    assert {n: f.value for n, f in facts.items()} == {
        "x_count": 3, "x_sum": 15, "x_max": 7, "x_min": 3, "x_list": [3, 7, 5],
        "x_first": 3, "x_last": 5}
    assert facts["x_sum"].per_rank == {"-": 10, "Worker_TP1": 5}


def test_a_fact_not_in_the_log_is_none_with_zero_found() -> None:
    fact = extract_log_facts("nothing here\n", [LogExtractor(
        name="mode", pattern=r"mode=(\w+)", reduce=Reduction.FIRST)])[0]
    assert (fact.value, fact.found, fact.per_rank) == (None, 0, {})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pattern": "(", "reduce": "count"}, "invalid regular expression"),
    ({"pattern": "no group", "reduce": "first"}, "needs a capture group"),
    ({"pattern": "(x)", "reduce": "sum"}, "needs value int or float"),
])
def test_bad_extractors_are_config_errors(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LogExtractor(name="f", **kwargs)  # type: ignore[arg-type]


def test_a_plan_fact_replaces_the_engine_default_of_that_name() -> None:
    default = engine_for("vllm").log_facts
    own = LogExtractor(name="graph_captures", pattern="Capturing CUDA graph")
    merged = merge_extractors(default, [own])
    assert [e.name for e in merged].count("graph_captures") == 1 and merged[-1] is own


def test_vllm_cpu_line_reads_what_it_reports() -> None:
    # From the embedded engine's own start-up line (vLLM 0.32.0 CPU): not NONE, as a GPU
    # record might say, but what this engine printed.
    line = ("(EngineCore pid=17854) INFO 12-01 13:19:10 [core.py:133] Initializing a V1 LLM "
            "engine (v0.32.0) with config: model='m', speculative_config=None, "
            "compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, "
            "'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_capture_sizes': [], "
            "'max_cudagraph_capture_size': None}\n")
    facts = {f.name: f.value for f in extract_log_facts(line, engine_for("vllm").log_facts)}
    assert facts["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert facts["cudagraph_mode"] == "NONE"
    assert facts["cudagraph_capture_sizes"] == []
    assert facts["max_cudagraph_capture_size"] is None and facts["graph_captures"] == 0
