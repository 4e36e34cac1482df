"""The truth: what a paced server logged it sent, turned into the figures tools report.

Pure functions, no I/O. A paced server's `--log` records, for every token-carrying
chunk, `t_ns` = `time.perf_counter_ns()` at its socket write (the bench's own
servers, bench/fidelity/servers: just before it; the packaged fake server: right
after it returned), and `due_ns` = when the schedule wanted it; for every
generation request `t_ns` = when its handler started (headers read). `perf_counter_ns` is
CLOCK_MONOTONIC on Linux: one clock for every process of the machine, so server
times and a client's times can be compared directly.

Every truth figure applies the *same definition* as the tool whose figure it checks,
but to the server's write times instead of the tool's arrival stamps: the difference
is the tool's measurement error, not a difference of definitions. (How far a
definition sits from the nominal schedule is reported apart, as schedule keeping.)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from tokrecord.metrics import Chunk, RowMetrics, row_metrics

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class SentChunk:
    t_ns: int  # after the write returned
    due_ns: int  # the schedule's time for the chunk's last token
    first: int  # index of its first token
    n: int  # tokens it carried


@dataclass(frozen=True)
class SentRequest:
    req: int
    t_req_ns: int
    max_tokens: int | None
    chunks: tuple[SentChunk, ...]
    outcome: str | None

    @property
    def tokens(self) -> int:
        return sum(c.n for c in self.chunks)

    @property
    def complete(self) -> bool:
        return self.outcome == "complete"


def parse_server_log(records: Iterable[Mapping[str, Any]]) -> list[SentRequest]:
    """Group the log's lines by request, in request order."""
    starts: dict[int, tuple[int, int | None]] = {}
    chunks: dict[int, list[SentChunk]] = {}
    outcomes: dict[int, str] = {}
    for rec in records:
        kind = rec.get("kind")
        req = int(rec["req"])
        if kind == "request":
            body = rec.get("body")
            max_tokens = body.get("max_tokens") if isinstance(body, dict) else None
            starts[req] = (int(rec["t_ns"]), int(max_tokens) if max_tokens is not None else None)
        elif kind == "chunk":
            tokens = rec["tokens"]
            chunks.setdefault(req, []).append(
                SentChunk(t_ns=int(rec["t_ns"]), due_ns=int(rec["due_ns"]), first=int(tokens[0]),
                          n=int(rec["n"]))
            )
        elif kind == "done":
            outcomes[req] = str(rec["outcome"])
    return [
        SentRequest(req=req, t_req_ns=t_req, max_tokens=max_tokens,
                    chunks=tuple(chunks.get(req, ())), outcome=outcomes.get(req))
        for req, (t_req, max_tokens) in sorted(starts.items())
    ]


def measured_requests(requests: Sequence[SentRequest], max_tokens: int, count: int
                      ) -> list[SentRequest]:
    """The requests a tool measured: the last `count` complete ones of the planned length.

    Peers send extra requests of their own (vLLM's initial test prompt, readiness
    probes with one token); those come first or carry another max_tokens, and the
    tool does not report them either.
    """
    planned = [r for r in requests if r.complete and r.max_tokens == max_tokens]
    return planned[-count:] if count > 0 else []


def truth_row(request: SentRequest) -> RowMetrics:
    """tokrecord's row figures (DESIGN.md), computed on the server's write times."""
    return row_metrics(request.t_req_ns, [Chunk(t_ns=c.t_ns, n=c.n) for c in request.chunks])


class Aggregate(StrEnum):
    """How a tool turns per-request figures into the one it reports."""

    MEDIAN_RATE = "median of per-request rates"
    INVERSE_MEDIAN_INTERVAL = "1 / median of per-request time per token"


class RateDef(StrEnum):
    """Per-request rate definitions found in the tools."""

    CONVENTIONAL = "99 / (t_100 - t_1)"
    CHUNK_AWARE = "tokens after chunk a / (T_b - T_a), tokens 1..100"
    DECODE = "(n - 1) / (t_last - t_first)"


def request_rate(m: RowMetrics, definition: RateDef) -> float | None:
    if definition is RateDef.CONVENTIONAL:
        return m.rate_conventional
    if definition is RateDef.CHUNK_AWARE:
        return m.rate_chunk_aware
    return m.tok_s_full_after_ttft


def aggregate_rate(rates: Sequence[float], how: Aggregate) -> float | None:
    """Aggregate per-request rates as the tool does (median of rates, or the inverse of
    the median of per-token intervals: not the same thing for an even count)."""
    if not rates:
        return None
    if how is Aggregate.MEDIAN_RATE:
        return float(statistics.median(rates))
    return 1.0 / float(statistics.median([1.0 / r for r in rates]))


def truth_rate(rows: Sequence[RowMetrics], definition: RateDef, how: Aggregate) -> float | None:
    rates = [r for r in (request_rate(m, definition) for m in rows) if r is not None]
    return aggregate_rate(rates, how)


def truth_ttft_ms(rows: Sequence[RowMetrics]) -> float | None:
    """Median over requests of first-chunk write minus request arrival, in ms."""
    values = [m.ttft_ms for m in rows if m.ttft_ms is not None]
    return float(statistics.median(values)) if values else None


def rel_error_pct(measured: float | None, truth: float | None) -> float | None:
    if measured is None or truth is None or truth == 0:
        return None
    return 100.0 * (measured / truth - 1.0)


def diff(measured: float | None, truth: float | None) -> float | None:
    if measured is None or truth is None:
        return None
    return measured - truth


@dataclass(frozen=True)
class ScheduleKeeping:
    """How well the server held its schedule, from its own log."""

    chunks: int
    late_us_median: float
    late_us_p99: float
    late_us_max: float
    # The logged decode rate (n-1)/(t_last - t_first) over the requests, median, vs nominal.
    logged_rate_median: float | None
    rate_vs_nominal_pct: float | None
    ttft_logged_ms_median: float | None
    ttft_vs_nominal_ms: float | None


def schedule_keeping(requests: Sequence[SentRequest], tok_s: float, ttft_ms: float
                     ) -> ScheduleKeeping:
    late = np.array([c.t_ns - c.due_ns for r in requests for c in r.chunks], dtype=np.float64)
    rows = [truth_row(r) for r in requests]
    rates = [m.tok_s_full_after_ttft for m in rows if m.tok_s_full_after_ttft is not None]
    logged = float(statistics.median(rates)) if rates else None
    ttft = truth_ttft_ms(rows)
    return ScheduleKeeping(
        chunks=int(late.size),
        late_us_median=float(np.median(late)) / 1e3 if late.size else 0.0,
        late_us_p99=float(np.percentile(late, 99)) / 1e3 if late.size else 0.0,
        late_us_max=float(late.max()) / 1e3 if late.size else 0.0,
        logged_rate_median=logged,
        rate_vs_nominal_pct=rel_error_pct(logged, tok_s),
        ttft_logged_ms_median=ttft,
        ttft_vs_nominal_ms=diff(ttft, ttft_ms),
    )


@dataclass(frozen=True)
class Spread:
    """Mean and range of one figure over repeated runs."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def half_range(self) -> float | None:
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2


def spread(values: Iterable[float | None]) -> Spread:
    got = [v for v in values if v is not None]
    if not got:
        return Spread(None, None, None, 0)
    return Spread(float(statistics.fmean(got)), min(got), max(got), len(got))


@dataclass(frozen=True)
class Lags:
    """Where a client's time goes, per request, on the shared monotonic clock (µs).

    request_trip: client t_send -> server handler start (request write, loopback,
    the server's header parsing); first: server's write of chunk 0 -> client stamp;
    token_1, token_100: the same for the chunks holding those tokens. TTFT error =
    request_trip + first; headline error comes from token_100 - token_1 only.
    """

    request_trip_us: float
    first_us: float
    token_1_us: float | None
    token_100_us: float | None


def _stamp_of_token(chunks: Sequence[tuple[int, int]], k: int) -> int | None:
    seen = 0
    for t, n in chunks:
        seen += n
        if seen > k:
            return t
    return None


def lags(t_send_ns: int, client_chunks: Sequence[tuple[int, int]], sent: SentRequest) -> Lags:
    """Client stamps (absolute perf_counter_ns) against the server's write times."""
    server_chunks = [(c.t_ns, c.n) for c in sent.chunks]

    def lag(k: int) -> float | None:
        client = _stamp_of_token(client_chunks, k)
        server = _stamp_of_token(server_chunks, k)
        return None if client is None or server is None else (client - server) / 1e3

    first = lag(0)
    return Lags(
        request_trip_us=(sent.t_req_ns - t_send_ns) / 1e3,
        first_us=first if first is not None else float("nan"),
        token_1_us=lag(1),
        token_100_us=lag(100),
    )


def client_rows_from_stamps(t_send_ns: int, stamps: Sequence[tuple[int, int]]) -> RowMetrics:
    """Row figures for a client that recorded (arrival ns, tokens) per chunk."""
    return row_metrics(t_send_ns, [Chunk(t_ns=t, n=n) for t, n in stamps])
