"""The record's graph section, from the engine's log facts; nothing it cannot read is guessed."""

from __future__ import annotations

from paths import FIXTURES
from tokrecord.engines import engine_for
from tokrecord.experiment.leg import LegResult
from tokrecord.metrics.logfacts import extract_log_facts
from tokrecord.record.single import graph_facts


def _leg(log: str, engine: str) -> LegResult:
    return LegResult.model_construct(log_facts=extract_log_facts(log, engine_for(engine).log_facts))


def test_tensor_parallel_captures_are_counted_per_rank() -> None:
    graph = graph_facts(_leg((FIXTURES / "vllm" / "tp2-startup.log").read_text(), "vllm"))
    assert graph.rank_captures == 3  # Worker_TP0, Worker_TP1 and one EngineCore_DP0
    # The excerpt has no config line and vLLM logs no per-rank graph or replay counts.
    assert graph.mode is None and graph.graphs_per_rank is None
    assert set(graph.not_reported) >= {"mode", "cudagraph_mode", "graphs_per_rank",
                                        "eager_breaks_per_rank", "rank_replays"}
    assert "rank_captures" not in graph.not_reported


def test_llamacpp_reports_graphs_reused_and_no_vllm_modes() -> None:
    log = ("0.00.001 I srv          init: build_info: b0-unknown\n"
           "0.00.792 I slot print_timing: id  0 | task 1 |    graphs reused =        508\n"
           "0.01.078 I slot print_timing: id  0 | task 514 |    graphs reused =       1016\n")
    graph = graph_facts(_leg(log, "llama.cpp"))
    assert graph.graphs_reused == 1016  # a running count: the last is the server's total
    assert graph.rank_captures is None and graph.mode is None


def test_not_reported_lists_exactly_the_null_fields_sorted() -> None:
    log = "0.00.792 I slot print_timing: id  0 | task 1 |    graphs reused =        508\n"
    graph = graph_facts(_leg(log, "llama.cpp"))
    # Only graphs_reused is logged; every other field is None and named, in sorted order.
    assert graph.not_reported == ["capture_sizes", "cudagraph_mode", "eager_breaks_per_rank",
                                  "graphs_per_rank", "max_capture_size", "mode",
                                  "rank_captures", "rank_replays"]
    assert graph.model_dump(mode="json")["not_reported"] == graph.not_reported
