"""Metric definitions (DESIGN.md) against hand-computed values and the seed records."""

from __future__ import annotations

import json
import math

import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.metrics import Chunk, Convention, engine_counters, parse_counters, row_metrics
from tokrecord.metrics.engine import acceptance_rate, emitted_per_cycle
from tokrecord.metrics.rows import conventional_from_legacy, legacy_from_conventional, summarize

MS = 1_000_000
SEEDS = FIXTURES_DIR / "seeds"


def one_per_chunk(n: int, first_ms: float, gap_ms: float) -> list[Chunk]:
    return [Chunk(t_ns=round((first_ms + k * gap_ms) * MS), n=1) for k in range(n)]


def test_one_token_per_chunk_rates() -> None:
    # t_k = 50 ms + 10 ms * k; window tokens 1..100 spans 990 ms.
    m = row_metrics(0, one_per_chunk(201, 50, 10))
    assert m.n_tokens == 201
    assert m.ttft_ms == pytest.approx(50.0)
    assert (m.window_first, m.window_last) == (1, 100)
    assert not m.short and m.flags == ()
    assert m.rate_conventional == pytest.approx(99 / 0.99)  # 100.0
    assert m.rate_legacy == pytest.approx(100 / 0.99)  # 101.0101...
    assert m.rate_chunk_aware == pytest.approx(100.0)
    assert m.quantisation_bound_pct == 0.0
    assert m.tok_s_full_after_ttft == pytest.approx(200 / 2.0)
    assert m.tok_s_wall_full == pytest.approx(201 / 2.05)


def test_multi_token_chunks_quantise_per_token_conventions() -> None:
    # 50 chunks of 4 tokens, one every 40 ms from 50 ms: a true 100 tok/s.
    chunks = [Chunk(t_ns=(50 + 40 * j) * MS, n=4) for j in range(50)]
    m = row_metrics(0, chunks)
    # token 1 is in chunk 0 (50 ms), token 100 in chunk 25 (1050 ms)
    assert m.rate_conventional == pytest.approx(99.0)
    assert m.rate_legacy == pytest.approx(100.0)
    # chunks 1..25 carry 100 tokens over 1000 ms
    assert m.rate_chunk_aware == pytest.approx(100.0)
    assert m.max_tokens_per_chunk_in_window == 4
    assert m.quantisation_bound_pct == pytest.approx(100 * 3 / 99)
    assert m.tok_s_full_after_ttft == pytest.approx(199 / 1.96)


def test_short_row_uses_tokens_1_to_n_minus_1() -> None:
    m = row_metrics(0, one_per_chunk(51, 20, 10))
    assert m.short and "short" in m.flags
    assert (m.window_first, m.window_last) == (1, 50)
    assert m.rate_conventional == pytest.approx(49 / 0.49)
    assert m.rate_legacy == pytest.approx(50 / 0.49)


def test_zero_duration_window_has_no_rate() -> None:
    m = row_metrics(0, [Chunk(t_ns=5 * MS, n=10)])
    assert m.rate_conventional is None and m.rate_legacy is None and m.rate_chunk_aware is None
    assert "zero_duration" in m.flags
    assert m.tok_s_full_after_ttft is None
    assert m.tok_s_wall_full == pytest.approx(10 / 0.005)


def test_a_row_delivered_in_one_burst_is_unrated_and_warned() -> None:
    """A whole row in one read (a CPU engine's API server starved): one arrival time for
    512 tokens, so no rate; the leg's headline is the median of the other rows."""
    burst = row_metrics(0, [Chunk(t_ns=1500 * MS, n=1)] * 512)
    steady = [row_metrics(0, [Chunk(t_ns=(10 + 5 * k) * MS, n=1) for k in range(150)])
              for _ in range(2)]
    s = summarize([burst, *steady])
    assert s.rows_rated == 2 and s.tok_s_out == pytest.approx(99 / 0.495)
    (warning,) = [w for w in s.warnings if "have no rate" in w]
    assert warning.startswith("1 of 3 rows have no rate (rows 0)")


def test_single_token_and_empty_rows() -> None:
    one = row_metrics(0, [Chunk(t_ns=MS, n=1)])
    assert "no_window" in one.flags and one.rate_conventional is None
    none = row_metrics(0, [])
    assert none.n_tokens == 0 and "no_tokens" in none.flags and none.ttft_ms is None


def test_zero_token_chunks_are_ignored_for_timing() -> None:
    # A role-only chat chunk arrives first and carries no token: TTFT is the first token.
    chunks = [Chunk(t_ns=10 * MS, n=0), *one_per_chunk(3, 30, 10)]
    assert row_metrics(0, chunks).ttft_ms == pytest.approx(30.0)


def test_backwards_timestamps_are_rejected() -> None:
    with pytest.raises(ValueError):
        row_metrics(0, [Chunk(t_ns=2 * MS, n=1), Chunk(t_ns=MS, n=1)])


def _rows_with_rates(rates: list[float]) -> list:  # type: ignore[type-arg]
    return [row_metrics(0, one_per_chunk(101, 10, 1000 / r)) for r in rates]


def test_summary_statistics_hand_computed() -> None:
    s = summarize(_rows_with_rates([10, 20, 30, 40]))
    assert s.tok_s_out == pytest.approx(25.0)
    assert s.tok_s_out_p10 == pytest.approx(13.0)  # linear: 10 + 0.3 * (20 - 10)
    assert s.tok_s_out_mean == pytest.approx(25.0)
    assert s.tok_s_out_stdev == pytest.approx(math.sqrt(500 / 3))  # sample stdev
    assert s.tok_s_out_legacy == pytest.approx(25.0 * 100 / 99)
    assert s.rows == 4 and s.rows_rated == 4 and s.rows_short == 0
    legacy = summarize(_rows_with_rates([10, 20, 30, 40]), Convention.LEGACY)
    assert legacy.tok_s_out == pytest.approx(25.0 * 100 / 99)


def test_summary_of_one_row_has_no_stdev() -> None:
    s = summarize(_rows_with_rates([50]))
    assert s.tok_s_out == pytest.approx(50.0) and s.tok_s_out_stdev is None


def test_seed_single_leg_accounting() -> None:
    seed = json.loads((SEEDS / "single-leg-record.json").read_text())
    acc = seed["metric_accounting"]
    summary = seed["summary"]
    assert conventional_from_legacy(acc["published_value_tok_s"]) == pytest.approx(
        acc["conventional_interval_value_tok_s"], rel=1e-14
    )
    assert legacy_from_conventional(101.94172124017027) == pytest.approx(102.97143559613157, rel=1e-14)
    assert acceptance_rate(summary["accepted_draft_tokens"], summary["draft_tokens"]) == (
        summary["draft_acceptance_rate"]
    )
    assert acceptance_rate(4747, 17699) == 0.26820724334708174
    assert emitted_per_cycle(4747, 1609) == 3.950279676817899
    assert emitted_per_cycle(summary["accepted_draft_tokens"], summary["draft_cycles"]) == (
        summary["emitted_tokens_per_draft_cycle"]
    )


PROM_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 300.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 50.0
"""


def _after(drafts: int, draft_tokens: int, accepted: int) -> str:
    return (
        PROM_BEFORE.replace("} 100.0", f"}} {100 + drafts}.0")
        .replace("} 1000.0", f"}} {1000 + draft_tokens}.0")
        .replace("} 300.0", f"}} {300 + accepted}.0")
        .replace("} 50.0", "} 950.0")
    )


def test_engine_counter_deltas_reproduce_the_seed() -> None:
    before = parse_counters(PROM_BEFORE)
    after = parse_counters(_after(1609, 17699, 4747))
    # two rows decoding for 1.5 s and 0.5 s: 2000 ms over 1609 cycles
    e = engine_counters(before, after, [1.5, 0.5])
    assert (e.draft_cycles, e.draft_tokens, e.accepted_draft_tokens) == (1609, 17699, 4747)
    assert e.draft_acceptance_rate == 0.26820724334708174
    assert e.emitted_tokens_per_draft_cycle == 3.950279676817899
    assert e.aggregate_cycle_ms == pytest.approx(2000 / 1609)
    assert (e.prefix_cache_hits, e.prefix_cache_queries) == (0, 900)


def test_engine_counters_absent_when_not_exposed() -> None:
    e = engine_counters({}, parse_counters("# nothing here\n"), [1.0])
    assert e.draft_cycles is None and e.draft_acceptance_rate is None
    assert e.aggregate_cycle_ms is None and e.prefix_cache_hits is None


def test_counters_summed_over_label_sets() -> None:
    text = (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 5\n'
        'vllm:prefix_cache_queries_total{engine="1"} 7\n'
    )
    assert parse_counters(text)["vllm:prefix_cache_queries_total"] == 12.0


def test_stall_flag_and_leg_warnings() -> None:
    # 150 tokens 10 ms apart, except one 500 ms hole after token 50
    chunks = [Chunk(t_ns=(10 * k + (500 if k > 50 else 0)) * MS, n=1) for k in range(150)]
    m = row_metrics(0, chunks)
    assert "stall" in m.flags
    assert m.max_gap_ms == pytest.approx(510) and m.median_gap_ms == pytest.approx(10)
    steady = row_metrics(0, one_per_chunk(150, 10, 10))
    assert "stall" not in steady.flags
    # a row delivered in one burst reads absurdly fast: an outlier warning, with advice
    burst = row_metrics(0, one_per_chunk(150, 1000, 0.01))
    s = summarize([m, steady, steady, burst])
    assert any("delivery stalls (rows 0;" in w for w in s.warnings)
    assert any("more than 5x away from the median (rows 3)" in w for w in s.warnings)
    assert summarize([steady, steady, steady]).warnings == ()
