"""The fidelity bench's pure helpers (bench/fidelity), against hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the bench lives beside src/

from bench.fidelity.truth import (
    Aggregate,
    RateDef,
    SentChunk,
    SentRequest,
    aggregate_rate,
    diff,
    lags,
    measured_requests,
    parse_server_log,
    rel_error_pct,
    schedule_keeping,
    spread,
    truth_rate,
    truth_row,
    truth_ttft_ms,
)
from bench.fidelity.vocab import ensure_tokenizer_dir

MS = 1_000_000


def request(req: int, times_ms: list[float], per_chunk: list[int] | None = None,
            t_req_ms: float = 0.0, late_ns: int = 0, max_tokens: int | None = None,
            outcome: str | None = "complete") -> SentRequest:
    per_chunk = per_chunk or [1] * len(times_ms)
    chunks, first = [], 0
    for t, n in zip(times_ms, per_chunk, strict=True):
        due = round(t * MS)
        chunks.append(SentChunk(t_ns=due + late_ns, due_ns=due, first=first, n=n))
        first += n
    return SentRequest(req=req, t_req_ns=round(t_req_ms * MS), chunks=tuple(chunks),
                       max_tokens=max_tokens if max_tokens is not None else first, outcome=outcome)


def test_parse_log_and_pick_the_measured_requests() -> None:
    log = [
        {"kind": "request", "req": 0, "t_ns": 5, "body": {"max_tokens": 1}},  # a probe
        {"kind": "chunk", "req": 0, "t_ns": 9, "due_ns": 8, "tokens": [0], "n": 1},
        {"kind": "done", "req": 0, "outcome": "complete"},
        {"kind": "request", "req": 1, "t_ns": 100, "body": {"max_tokens": 2}},
        {"kind": "chunk", "req": 1, "t_ns": 120, "due_ns": 110, "tokens": [0], "n": 1},
        {"kind": "chunk", "req": 1, "t_ns": 131, "due_ns": 130, "tokens": [1], "n": 1},
        {"kind": "done", "req": 1, "outcome": "complete"},
        {"kind": "request", "req": 2, "t_ns": 200, "body": {"max_tokens": 2}},
        {"kind": "chunk", "req": 2, "t_ns": 230, "due_ns": 229, "tokens": [0, 1], "n": 2},
        {"kind": "done", "req": 2, "outcome": "complete"},
        {"kind": "request", "req": 3, "t_ns": 300, "body": {"max_tokens": 2}},
        {"kind": "done", "req": 3, "outcome": "disconnected"},
    ]
    requests = parse_server_log(log)
    assert [r.req for r in requests] == [0, 1, 2, 3]
    assert requests[1].chunks == (SentChunk(120, 110, 0, 1), SentChunk(131, 130, 1, 1))
    assert requests[2].tokens == 2 and requests[3].complete is False
    assert [r.req for r in measured_requests(requests, max_tokens=2, count=2)] == [1, 2]
    assert [r.req for r in measured_requests(requests, max_tokens=2, count=1)] == [2]
    assert measured_requests(requests, max_tokens=2, count=0) == []


def test_truth_rows_use_the_same_definitions() -> None:
    # 102 tokens, one per ms after a 10 ms TTFT; token 100 written 1 ms late.
    times = [10.0 + k for k in range(102)]
    times[100] += 1.0
    times[101] += 1.0
    m = truth_row(request(0, times, t_req_ms=0.0))
    assert m.ttft_ms == pytest.approx(10.0)
    assert m.rate_conventional == pytest.approx(99 / 0.100)  # 99 intervals over 100 ms
    assert m.rate_chunk_aware == pytest.approx(990.0)
    assert m.tok_s_full_after_ttft == pytest.approx(101 / 0.102)


def test_chunk_aware_truth_at_four_tokens_per_chunk() -> None:
    # The fake server's plan: chunk 0 = token 0 at TTFT, chunk j = 4 tokens, written
    # when its last token is due (1 ms per token).
    times = [20.0] + [20.0 + 4 * j for j in range(1, 26)]
    m = truth_row(request(0, times, per_chunk=[1] + [4] * 25))
    # chunk a = 1 (tokens 1-4, at 24 ms), chunk b = 25 (tokens 97-100, at 120 ms):
    # 96 tokens over 96 ms.
    assert m.rate_chunk_aware == pytest.approx(1000.0)
    # per-token convention: 99 intervals over 96 ms, high by 3/96
    assert m.rate_conventional == pytest.approx(99 / 0.096)


def test_aggregates() -> None:
    rates = [1000.0, 990.0, 1010.0, 980.0]
    assert aggregate_rate(rates, Aggregate.MEDIAN_RATE) == pytest.approx(995.0)
    # the median of the per-token intervals 1/1000 and 1/990, inverted
    assert aggregate_rate(rates, Aggregate.INVERSE_MEDIAN_INTERVAL) == pytest.approx(
        2 * 1000 * 990 / 1990)
    odd = [1000.0, 990.0, 1010.0]
    assert aggregate_rate(odd, Aggregate.MEDIAN_RATE) == aggregate_rate(
        odd, Aggregate.INVERSE_MEDIAN_INTERVAL) == pytest.approx(1000.0)
    assert aggregate_rate([], Aggregate.MEDIAN_RATE) is None


def test_truth_rate_and_ttft_over_requests() -> None:
    fast = request(0, [5.0 + k * 0.5 for k in range(102)], t_req_ms=1.0)  # 2000 tok/s
    slow = request(1, [8.0 + k * 2.0 for k in range(102)], t_req_ms=1.0)  # 500 tok/s
    mid = request(2, [9.0 + k * 1.0 for k in range(102)], t_req_ms=1.0)  # 1000 tok/s
    rows = [truth_row(r) for r in (fast, slow, mid)]
    assert truth_rate(rows, RateDef.CONVENTIONAL, Aggregate.MEDIAN_RATE) == pytest.approx(1000.0)
    assert truth_rate(rows, RateDef.DECODE, Aggregate.INVERSE_MEDIAN_INTERVAL) == pytest.approx(
        1000.0)
    assert truth_ttft_ms(rows) == pytest.approx(7.0)  # TTFTs 4, 7 and 8 ms


def test_errors_and_spread() -> None:
    assert rel_error_pct(1010.0, 1000.0) == pytest.approx(1.0)
    assert rel_error_pct(None, 1000.0) is None and rel_error_pct(1.0, 0.0) is None
    assert diff(200.5, 200.0) == pytest.approx(0.5) and diff(None, 1.0) is None
    s = spread([0.1, None, -0.3, 0.2])
    assert (s.n, s.low, s.high) == (3, -0.3, 0.2)
    assert s.mean == pytest.approx(0.0) and s.half_range == pytest.approx(0.25)
    assert spread([None]).mean is None


def test_lags_on_the_shared_clock() -> None:
    sent = request(0, [10.0, 11.0, 12.0], t_req_ms=0.3, late_ns=0)
    # client: sent at 0, got chunk 0 at 10.2 ms, chunks 1 and 2 together at 12.05 ms
    client = [(round(10.2 * MS), 1), (round(12.05 * MS), 2)]
    lag = lags(0, client, sent)
    assert lag.request_trip_us == pytest.approx(300.0)
    assert lag.first_us == pytest.approx(200.0)
    assert lag.token_1_us == pytest.approx(1050.0)
    assert lag.token_100_us is None


def test_schedule_keeping() -> None:
    a = request(0, [200.0, 201.0, 202.0], late_ns=20_000)  # 20 µs late each
    b = request(1, [200.0, 202.0, 204.0], late_ns=40_000)
    keep = schedule_keeping([a, b], tok_s=1000.0, ttft_ms=200.0)
    assert keep.chunks == 6
    assert keep.late_us_median == pytest.approx(30.0) and keep.late_us_max == pytest.approx(40.0)
    # decode rates 1000 and 500: median 750, i.e. -25 % against 1000
    assert keep.logged_rate_median == pytest.approx(750.0)
    assert keep.rate_vs_nominal_pct == pytest.approx(-25.0)
    assert keep.ttft_vs_nominal_ms == pytest.approx(0.03)  # first writes 20 and 40 µs late


def test_fake_vocabulary_counts_what_the_server_sends(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from tokrecord.server.fake import output_token_ids, token_text

    directory = ensure_tokenizer_dir(tmp_path / "tok")
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    ids = output_token_ids("any prompt", 50)
    assert tok.encode("".join(token_text(i) for i in ids)).ids == ids
    assert ensure_tokenizer_dir(tmp_path / "tok") == directory  # built once, then reused
