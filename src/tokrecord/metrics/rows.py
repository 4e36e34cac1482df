"""Per-row and per-leg speed metrics, exactly as DESIGN.md defines them.

Pure functions over chunk timings. A row is the list of (arrival ns, token count)
of the chunks that carried tokens, plus the send time; every token of a chunk
shares the chunk's timestamp. Tokens are indexed k = 0..n-1.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

NS_PER_S = 1_000_000_000
HEADLINE_LAST_TOKEN = 100  # window is tokens 1..100: 100 events, 99 intervals
STALL_MIN_MS = 100.0  # a gap is a stall when above both this and
STALL_FACTOR = 20.0  # this many times the row's median gap

# What each row flag means, in one line, for wherever a flag is shown.
ROW_FLAGS: dict[str, str] = {
    "no_tokens": "no token was received",
    "short": "fewer than 101 tokens: no full headline window (tokens 1..100)",
    "no_window": "fewer than 2 tokens: no rate",
    "zero_duration": "the window's tokens arrived in one read: no rate",
    "stall": f"a gap between tokens over {STALL_MIN_MS:g} ms and {STALL_FACTOR:g}x the row's "
             "median gap (delivery paused); the row still counts",
}
OUTLIER_FACTOR = 5.0  # a row rate this far from the leg median is an outlier


class Convention(StrEnum):
    """How a token window becomes a rate."""

    CONVENTIONAL = "conventional"  # intervals / duration: 99 / (t_100 - t_1)
    LEGACY = "legacy-inclusive-events"  # events / duration: 100 / (t_100 - t_1)
    CHUNK_AWARE = "chunk-aware"  # tokens after chunk a / (T_b - T_a)


# The headline formulas as records state them, one per convention.
FORMULAS: dict[Convention, str] = {
    Convention.CONVENTIONAL: "99 / (timestamp[100] - timestamp[1])",
    Convention.LEGACY: "100 / (timestamp[100] - timestamp[1])",
    Convention.CHUNK_AWARE: "tokens in chunks a+1..b / (T_b - T_a)",
}


class Chunk(BaseModel):
    """One token-carrying chunk: when its bytes arrived and how many tokens it held."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    t_ns: int
    n: int


class RowMetrics(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    n_tokens: int
    ttft_ms: float | None
    window_first: int | None
    window_last: int | None
    short: bool
    rate_conventional: float | None
    rate_legacy: float | None
    rate_chunk_aware: float | None
    max_tokens_per_chunk_in_window: int | None
    # Per-token conventions are quantised when chunks carry K > 1 tokens: by up
    # to (K-1)/intervals of the rate. Reported beside every such figure.
    quantisation_bound_pct: float | None
    tok_s_full_after_ttft: float | None
    tok_s_wall_full: float | None
    # Delivery regularity after the first token: a stall is a gap far above the
    # row's typical gap (the client saw a burst, whatever the engine did).
    median_gap_ms: float | None = None
    max_gap_ms: float | None = None
    flags: tuple[str, ...] = ()

    def rate(self, convention: Convention) -> float | None:
        if convention is Convention.CONVENTIONAL:
            return self.rate_conventional
        if convention is Convention.LEGACY:
            return self.rate_legacy
        return self.rate_chunk_aware


def _chunk_of_token(cumulative: np.ndarray, k: int) -> int:
    """Index of the chunk that holds token k, given cumulative token counts."""
    return int(np.searchsorted(cumulative, k, side="right"))


def row_metrics(t_send_ns: int, chunks: Sequence[Chunk]) -> RowMetrics:
    """Every per-row figure of DESIGN.md for one streamed row."""
    chunks = [c for c in chunks if c.n > 0]
    if any(c.n < 0 for c in chunks):
        raise ValueError("negative token count in a chunk")
    n = sum(c.n for c in chunks)
    flags: list[str] = []
    if n == 0:
        return RowMetrics(
            n_tokens=0, ttft_ms=None, window_first=None, window_last=None, short=True,
            rate_conventional=None, rate_legacy=None, rate_chunk_aware=None,
            max_tokens_per_chunk_in_window=None, quantisation_bound_pct=None,
            tok_s_full_after_ttft=None, tok_s_wall_full=None, flags=("no_tokens",),
        )
    times = np.fromiter((c.t_ns for c in chunks), dtype=np.int64, count=len(chunks))
    if np.any(np.diff(times) < 0):
        raise ValueError("chunk timestamps go backwards")
    counts = np.fromiter((c.n for c in chunks), dtype=np.int64, count=len(chunks))
    cumulative = np.cumsum(counts)
    t_first_token = int(times[0])
    t_last_token = int(times[-1])
    ttft_ms = (t_first_token - t_send_ns) / 1e6

    short = n - 1 < HEADLINE_LAST_TOKEN
    if short:
        flags.append("short")
    win = _headline_window(times, counts, cumulative, n, flags)
    full_after = None
    if n >= 2 and t_last_token > t_first_token:
        full_after = (n - 1) * NS_PER_S / (t_last_token - t_first_token)
    wall = n * NS_PER_S / (t_last_token - t_send_ns) if t_last_token > t_send_ns else None
    median_gap, max_gap = _gaps(times, flags)
    return RowMetrics(
        n_tokens=n, ttft_ms=ttft_ms, window_first=win.first, window_last=win.last,
        short=short, rate_conventional=win.conventional, rate_legacy=win.legacy,
        rate_chunk_aware=win.chunk_aware, max_tokens_per_chunk_in_window=win.max_k,
        quantisation_bound_pct=win.bound, tok_s_full_after_ttft=full_after, tok_s_wall_full=wall,
        median_gap_ms=median_gap, max_gap_ms=max_gap, flags=tuple(flags),
    )


class _Window(NamedTuple):
    first: int | None
    last: int | None
    conventional: float | None = None
    legacy: float | None = None
    chunk_aware: float | None = None
    max_k: int | None = None
    bound: float | None = None


def _headline_window(times: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
                     cumulative: npt.NDArray[np.int64], n: int, flags: list[str]) -> _Window:
    """The headline window (tokens 1..100, or 1..n-1) and its three rates; flags a row
    with no window or no duration."""
    last = min(HEADLINE_LAST_TOKEN, n - 1)
    if last < 1:
        flags.append("no_window")
        return _Window(None, None)
    a = _chunk_of_token(cumulative, 1)
    b = _chunk_of_token(cumulative, last)
    duration = int(times[b] - times[a])
    intervals = last - 1
    max_k = int(counts[a : b + 1].max())
    if duration <= 0 or intervals == 0:
        flags.append("zero_duration")
        return _Window(1, last, max_k=max_k)
    return _Window(1, last, conventional=intervals * NS_PER_S / duration,
                   legacy=(intervals + 1) * NS_PER_S / duration,
                   chunk_aware=int(counts[a + 1 : b + 1].sum()) * NS_PER_S / duration,
                   max_k=max_k, bound=100.0 * (max_k - 1) / intervals)


def _gaps(times: npt.NDArray[np.int64], flags: list[str]) -> tuple[float | None, float | None]:
    """The median and longest gap between chunks (ms); flags a stall."""
    if len(times) < 2:
        return None, None
    gaps = np.diff(times) / 1e6
    median_gap, max_gap = float(np.median(gaps)), float(gaps.max())
    if max_gap > max(STALL_MIN_MS, STALL_FACTOR * median_gap):
        flags.append("stall")
    return median_gap, max_gap


class LegSummary(BaseModel):
    """Aggregates over the rows of one leg, in the headline convention."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    headline_convention: Convention
    rows: int
    rows_rated: int
    rows_short: int
    tok_s_out: float | None
    tok_s_out_p10: float | None
    tok_s_out_mean: float | None
    tok_s_out_stdev: float | None
    tok_s_out_conventional: float | None
    tok_s_out_legacy: float | None
    tok_s_out_chunk_aware: float | None
    quantisation_bound_pct_max: float | None
    tok_s_full_after_ttft_median: float | None
    tok_s_wall_full_median: float | None
    ttft_ms_median: float | None
    output_tokens_total: int
    warnings: tuple[str, ...] = ()


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), None when empty."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _rates(rows: Sequence[RowMetrics], convention: Convention) -> list[float]:
    return [r for r in (m.rate(convention) for m in rows) if r is not None]


def leg_warnings(rows: Sequence[RowMetrics], headline: Convention) -> tuple[str, ...]:
    """What a careful reader should know before trusting the figures, with advice."""
    out: list[str] = []
    stalled = [i for i, m in enumerate(rows) if "stall" in m.flags]
    if stalled:
        worst = max(rows[i].max_gap_ms or 0.0 for i in stalled)
        out.append(
            f"{len(stalled)} of {len(rows)} rows had delivery stalls (rows {_list(stalled)}; "
            f"longest gap {worst:,.0f} ms): the client received tokens in bursts. Check that "
            "nothing else runs on the machine and that server and client have a core each."
        )
    rates = [(i, m.rate(headline)) for i, m in enumerate(rows)]
    rated = [r for _, r in rates if r is not None]
    if len(rated) >= 3:
        med = float(statistics.median(rated))
        odd = [i for i, r in rates
               if r is not None and med > 0 and not 1 / OUTLIER_FACTOR <= r / med <= OUTLIER_FACTOR]
        if odd:
            out.append(
                f"{len(odd)} rows have a headline rate more than {OUTLIER_FACTOR:g}x away from the "
                f"median (rows {_list(odd)}): the mean and stdev are not meaningful; use the median "
                "and p10."
            )
    burst = [i for i, m in enumerate(rows) if "zero_duration" in m.flags]
    if burst:
        out.append(
            f"{len(burst)} of {len(rows)} rows have no rate (rows {_list(burst)}): their headline "
            "window arrived in one read, so it has no duration to divide by. The server "
            "delivered those tokens in one burst (on a CPU engine: the API server starved of "
            "CPU); the headline is the median of the other rows."
        )
    short = [i for i, m in enumerate(rows) if m.short]
    if short:
        out.append(
            f"{len(short)} rows produced fewer than 101 tokens (rows {_list(short)}): their rates "
            "use tokens 1..n-1."
        )
    return tuple(out)


def _list(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


def summarize(
    rows: Sequence[RowMetrics], headline: Convention = Convention.CONVENTIONAL
) -> LegSummary:
    rates = _rates(rows, headline)
    bounds = [m.quantisation_bound_pct for m in rows if m.quantisation_bound_pct is not None]
    return LegSummary(
        headline_convention=headline,
        rows=len(rows),
        rows_rated=len(rates),
        rows_short=sum(1 for m in rows if m.short),
        tok_s_out=_median(rates),
        tok_s_out_p10=percentile(rates, 10),
        tok_s_out_mean=float(statistics.fmean(rates)) if rates else None,
        tok_s_out_stdev=float(statistics.stdev(rates)) if len(rates) >= 2 else None,
        tok_s_out_conventional=_median(_rates(rows, Convention.CONVENTIONAL)),
        tok_s_out_legacy=_median(_rates(rows, Convention.LEGACY)),
        tok_s_out_chunk_aware=_median(_rates(rows, Convention.CHUNK_AWARE)),
        quantisation_bound_pct_max=max(bounds) if bounds else None,
        tok_s_full_after_ttft_median=_median(
            [m.tok_s_full_after_ttft for m in rows if m.tok_s_full_after_ttft is not None]
        ),
        tok_s_wall_full_median=_median(
            [m.tok_s_wall_full for m in rows if m.tok_s_wall_full is not None]
        ),
        ttft_ms_median=_median([m.ttft_ms for m in rows if m.ttft_ms is not None]),
        output_tokens_total=sum(m.n_tokens for m in rows),
        warnings=leg_warnings(rows, headline),
    )


def legacy_from_conventional(conventional: float, intervals: int = 99) -> float:
    """Re-account a conventional window rate in the legacy inclusive-events form."""
    return conventional * (intervals + 1) / intervals


def conventional_from_legacy(legacy: float, intervals: int = 99) -> float:
    return legacy * intervals / (intervals + 1)
