"""The report's charts, from ReportData pieces to SVG markup (see svg.py for why SVG by hand)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from . import fmt
from .model import Bootstrap, LegView, PairView, TelemetryView, Timeline
from .svg import MUTED, Chart, nice_range

# Control legs in blues, candidates in oranges: the ABBA structure reads at a glance.
# Eight shades each, so two blocks never repeat a colour (the first four are one
# block's, as before blocks existed).
_ARM_PALETTES = {
    "control": ("#1f5fa8", "#6aa3d9", "#0b3d75", "#93c5fd", "#2563eb", "#1e3a8a", "#60a5fa",
                "#3f6e9e"),
    "candidate": ("#d35400", "#f0a04b", "#8a3700", "#fdba74", "#ea580c", "#7c2d12", "#fb923c",
                  "#b45309"),
}
_OTHER = ("#2e7d32", "#7b1fa2", "#546e7a", "#c2185b", "#00838f", "#5d4037")
# An A/A design's B positions run the control arm too: green, so they read apart.
_B_POSITIONS = ("#2e7d32", "#66bb6a", "#1b5e20", "#a5d6a7", "#43a047", "#004d40", "#81c784",
                "#558b2f")
SERIES = ("#1f5fa8", "#d35400", "#2e7d32", "#7b1fa2", "#c2185b", "#00838f", "#546e7a")
WINDOW = "#10b981"
PERCENT_TICKS = (0.0, 20.0, 40.0, 60.0, 80.0, 100.0)


def leg_groups(legs: Sequence[LegView]) -> dict[str, str]:
    """What a leg is compared as: its arm, or, when every leg of an experiment runs one
    arm in both A and B positions (an A/A design), its position."""
    arms = {leg.arm for leg in legs}
    letters = {leg.name[:1] for leg in legs}
    if len(legs) > 1 and len(arms) == 1 and letters == {"A", "B"}:
        return {leg.name: f"{leg.name[:1]} positions" for leg in legs}
    return {leg.name: leg.arm for leg in legs}


def leg_colors(legs: Sequence[LegView]) -> dict[str, str]:
    groups = leg_groups(legs)
    used: dict[str, int] = {}
    out = {}
    for leg in legs:
        group = groups[leg.name]
        palette = _B_POSITIONS if group == "B positions" else _ARM_PALETTES.get(
            "control" if group == "A positions" else group, _OTHER)
        i = used.get(group, 0)
        used[group] = i + 1
        out[leg.name] = palette[i % len(palette)]
    return out


def _range(values: Sequence[float], *, zero: bool = False, pad: float = 0.0) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    return nice_range(lo - pad * span, hi + pad * span, zero=zero)


def _log_range(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))


# --------------------------------------------------------------------------- per-row rates


def rates_chart(legs: Sequence[LegView]) -> str | None:
    colors = leg_colors(legs)
    points = [(leg, r) for leg in legs for r in leg.rows if r.rate is not None and r.rate > 0]
    if not points:
        return None
    rates = [r.rate for _, r in points if r.rate is not None]
    log = max(rates) / min(rates) > 20
    rows = sorted({r.row for _, r in points})
    chart = Chart(title="Per-row rates of every leg", height=340)
    chart.scales((rows[0] - 0.6, rows[-1] + 0.6), _log_range(rates) if log else _range(rates, zero=True),
                 ylog=log)
    step = 0.6 / max(len(legs), 1)
    for i, leg in enumerate(legs):
        off = (i - (len(legs) - 1) / 2) * step
        if leg.tok_s:
            chart.hline(leg.tok_s, colors[leg.name], dash="5 4")
        for r in leg.rows:
            if r.rate is None or r.rate <= 0:
                continue
            flags = f" [{', '.join(r.flags)}]" if r.flags else ""
            chart.dot(r.row + off, r.rate, colors[leg.name], r=4, hollow="stall" in r.flags,
                      title=f"{leg.name} row {r.row} ({r.row_id}): {fmt.num(r.rate)} tok/s{flags}")
    chart.axes("suite row (hollow: delivery stall; dashed: leg median)",
               "tok/s, tokens 1..100" + (" (log scale)" if log else ""),
               xticks=rows, xtick_labels=[str(r) for r in rows])
    chart.legend([(leg.name, colors[leg.name]) for leg in legs])
    return chart.render()


# --------------------------------------------------------------------------- timelines


def _staircase(t: Timeline, origin: float = 0.0) -> list[tuple[float, float]]:
    if not t.t_ms:
        return []
    pts = [(t.t_ms[0] - origin, 0.0)]
    pts += [(x - origin, float(c)) for x, c in zip(t.t_ms, t.tokens, strict=True)]
    return pts


def _burst_dots(chart: Chart, t: Timeline, color: str, *, only_in: tuple[float, float] | None = None,
                all_chunks: bool = False) -> None:
    for x, c, k in zip(t.t_ms, t.tokens, t.sizes, strict=True):
        if only_in is not None and not only_in[0] <= x <= only_in[1]:
            continue
        if k > 1 or all_chunks:
            first = c - k + 1
            span = f"tokens {first - 1}..{c - 1}" if k > 1 else f"token {c - 1}"
            chart.dot(x, c, color, r=min(2 + 1.2 * k, 9), opacity=0.55 if k > 1 else 0.9,
                      title=f"chunk at {x:,.3f} ms: {k} token{'s' if k > 1 else ''} ({span})")


def timeline_chart(t: Timeline, color: str) -> str:
    chart = Chart(title=f"Tokens against time, leg {t.leg}, row {t.row} ({t.row_id})", height=340)
    end = t.t_ms[-1] if t.t_ms else 1.0
    chart.scales(nice_range(0.0, end), nice_range(0.0, float(t.n_tokens or 1)))
    if t.window_ms:
        chart.xband(*t.window_ms, WINDOW, "headline window: tokens 1..100")
    if t.ttft_ms is not None:
        chart.vline(t.ttft_ms, MUTED, label=f"first token {t.ttft_ms:,.1f} ms", label_at_bottom=True)
    chart.path(_staircase(t), color, step=True, width=1.6)
    _burst_dots(chart, t, color)
    chart.axes("ms since the request was sent", "tokens received")
    chart.legend([(f"{t.leg} ({t.arm}); circles: chunks of 2+ tokens", color)])
    return chart.render()


def timeline_zoom_chart(t: Timeline, color: str) -> str | None:
    """The headline window alone, where a speculative burst is a visible step."""
    if not t.window_ms:
        return None
    a, b = t.window_ms
    pad = (b - a) * 0.03 or 1.0
    chart = Chart(title=f"Headline window of leg {t.leg}, row {t.row}", height=300)
    chart.scales((a - pad, b + pad), nice_range(0.0, 101.0))
    chart.xband(a, b, WINDOW)
    pts = [(x, float(c)) for x, c in zip(t.t_ms, t.tokens, strict=True) if a - pad <= x <= b + pad]
    before = [(x, float(c)) for x, c in zip(t.t_ms, t.tokens, strict=True) if x < a - pad]
    if before:
        pts.insert(0, (a - pad, before[-1][1]))
    chart.path(pts, color, step=True, width=1.6)
    _burst_dots(chart, t, color, only_in=(a - pad, b + pad), all_chunks=True)
    chart.axes("ms since the request was sent", "tokens received")
    chart.legend([(f"{t.leg}: one circle per chunk, size = tokens", color)])
    return chart.render()


def timeline_compare_chart(timelines: Sequence[Timeline], colors: Mapping[str, str]) -> str | None:
    if len(timelines) < 2:
        return None
    t0 = timelines[0]
    chart = Chart(title=f"Row {t0.row} ({t0.row_id}) in every leg", height=320)
    ends = [t.t_ms[-1] - t.t_ms[0] for t in timelines if t.t_ms]
    chart.scales(nice_range(0.0, max(ends or [1.0])),
                 nice_range(0.0, float(max(t.n_tokens for t in timelines) or 1)))
    for t in timelines:
        if t.t_ms:
            chart.path(_staircase(t, origin=t.t_ms[0]), colors.get(t.leg, MUTED), step=True,
                       title=f"{t.leg}: {t.n_tokens} tokens in {t.chunks} chunks")
    chart.axes("ms since the first token", "tokens received")
    chart.legend([(t.leg, colors.get(t.leg, MUTED)) for t in timelines])
    return chart.render()


# --------------------------------------------------------------------------- intervals


def intervals_chart(legs: Sequence[LegView]) -> str | None:
    with_data = [leg for leg in legs if leg.intervals is not None and any(leg.intervals.counts)]
    if not with_data:
        return None
    colors = leg_colors(legs)
    edges = with_data[0].intervals.edges_ms if with_data[0].intervals else ()
    used = [i for leg in with_data if leg.intervals for i, c in enumerate(leg.intervals.counts) if c]
    lo, hi = max(min(used) - 1, 0), min(max(used) + 2, len(edges) - 1)
    shares = []
    for leg in with_data:
        assert leg.intervals is not None
        total = leg.intervals.intervals
        shares.append([100 * c / total for c in leg.intervals.counts[lo:hi]])
    chart = Chart(title="Inter-token interval distribution", height=320)
    chart.scales((edges[lo], edges[hi]), nice_range(0.0, max(max(s) for s in shares), zero=True),
                 xlog=True)
    for leg, share in zip(with_data, shares, strict=True):
        pts = [(edges[lo + i], v) for i, v in enumerate(share)] + [(edges[hi], 0.0)]
        pts.insert(0, (edges[lo], 0.0))
        assert leg.intervals is not None
        same = fmt.share(leg.intervals.same_chunk, leg.intervals.intervals)
        chart.path(pts, colors[leg.name], step=True, width=1.6,
                   title=f"{leg.name}: {same} of intervals are zero (same chunk), not drawn")
    chart.axes("interval between consecutive tokens, ms (log scale; zero intervals not drawn)",
               "% of the leg's token intervals")
    chart.legend([(leg.name, colors[leg.name]) for leg in with_data])
    return chart.render()


# --------------------------------------------------------------------------- ABBA


def abba_chart(legs: Sequence[LegView], blocks: int | None = None) -> str | None:
    """Legs in run order with their headlines; dashed lines join the legs of an arm (of a
    position in an A/A design). With `blocks` (a v2 record), any number of legs: the
    blocks are marked, and past one block the ticks name the legs only (the legend the arms)."""
    heads = [(i, leg) for i, leg in enumerate(legs) if leg.tok_s is not None]
    if not heads:
        return None
    colors = leg_colors(legs)
    groups = leg_groups(legs)
    values = [leg.tok_s for _, leg in heads if leg.tok_s is not None]
    chart = Chart(title="Legs in run order: headline tok/s", height=280 if blocks is None else 300)
    chart.scales((-0.5, len(legs) - 0.5), _range(values, pad=0.25))
    by_group: dict[str, list[tuple[float, float]]] = {}
    for i, leg in heads:
        assert leg.tok_s is not None
        by_group.setdefault(groups[leg.name], []).append((float(i), leg.tok_s))
    for group, pts in by_group.items():
        if len(pts) > 1:
            first = next(leg.name for leg in legs if groups[leg.name] == group)
            what = ("drift between first and second leg" if len(pts) == 2
                    else f"drift across its {len(pts)} legs")
            chart.path(pts, colors[first], dash="4 4", width=1.2, title=f"{group} legs: {what}")
    if blocks is not None:
        for b in range(1, blocks + 1):
            lo, hi = 4 * (b - 1), min(4 * b, len(legs)) - 1
            if b > 1:
                chart.vline(lo - 0.5, "#9ca3af")
            # Inside the plot's bottom margin: the legend has the top edge.
            chart.text((lo + hi) / 2, chart.y.lo if chart.y else 0.0,
                       f"block {b} ({'ABBA' if b % 2 else 'BAAB'})", dy="-0.6em")
    for i, leg in heads:
        assert leg.tok_s is not None
        chart.dot(i, leg.tok_s, colors[leg.name], r=7 if len(legs) <= 8 else 5,
                  title=f"{leg.name} ({leg.arm}): {fmt.num(leg.tok_s)} tok/s, p10 {fmt.num(leg.p10)}")
        if len(legs) <= 12:  # past three blocks the labels would overlap: hover for values
            chart.text(i, leg.tok_s, fmt.num(leg.tok_s, 0 if len(legs) > 4 else 2), dy="-1.1em",
                       bold=True, color=colors[leg.name])
    wide = blocks is None or len(legs) <= 4
    chart.axes("leg, in run order", "headline tok/s (median of row rates)",
               xticks=[float(i) for i in range(len(legs))],
               xtick_labels=[f"{leg.name} ({leg.arm})" if wide else leg.name for leg in legs])
    if not wide:
        seen: dict[str, str] = {}
        for leg in legs:
            seen.setdefault(groups[leg.name], colors[leg.name])
        chart.legend(list(seen.items()))
    return chart.render()


def pairs_chart(pairs: Sequence[PairView], label: str = "candidate / control") -> str | None:
    """Each pair's headline and paired-median deltas, in block order: whether the effect
    holds in every block, or one pair carries it."""
    values = [v for p in pairs for v in (p.headline_delta_pct, p.paired_median_delta_pct)
              if v is not None]
    if not values:
        return None
    chart = Chart(title=f"Pairs in block order: {label}, %", height=280)
    lo, hi = min(min(values), 0.0), max(max(values), 0.0)
    chart.scales((-0.5, len(pairs) - 0.5), _range([lo, hi], pad=0.15))
    chart.hline(0.0, MUTED, dash=None)
    width = 0.36
    for i, p in enumerate(pairs):
        for j, (value, color, what) in enumerate(((p.headline_delta_pct, "#d35400", "headline Δ"),
                                                  (p.paired_median_delta_pct, "#1f5fa8",
                                                   "paired median Δ"))):
            if value is None:
                continue
            x = i - width + j * width
            chart.bar(x, x + width * 0.92, 0.0, value, color,
                      title=f"{p.name}: {what} {fmt.pct(value)}, row wins {p.row_wins}, "
                            f"{'pass' if p.passed else 'fail'}")
    chart.axes("pair, in block order", f"% ({label} - 1)",
               xticks=[float(i) for i in range(len(pairs))],
               xtick_labels=[p.name.replace(" vs ", "/") for p in pairs])
    chart.legend([("headline Δ", "#d35400"), ("paired median Δ", "#1f5fa8")])
    return chart.render()


def ci_chart(b: Bootstrap) -> str:
    return interval_chart(b.ratio, b.ci_low, b.ci_high, b.confidence, b.equivalence_pct)


def interval_chart(ratio: float, ci_low: float, ci_high: float, confidence: float,
                   equivalence_pct: float, label: str = "candidate / control",
                   outer: tuple[float, float, float] | None = None) -> str:
    """The ratio on a line with its interval and the equivalence band around 1; `outer`
    (low, high, confidence), when given, is the wider interval the record gate judges."""
    eq = equivalence_pct / 100
    lo = min(ci_low, 1 - eq, ratio, *(outer[:1] if outer else ()))
    hi = max(ci_high, 1 + eq, ratio, *(outer[1:2] if outer else ()))
    pad = (hi - lo) * 0.15 or 0.05
    chart = Chart(title=f"{label[:1].upper()}{label[1:]} with its confidence interval", height=150,
                  top=24, bottom=40)
    chart.scales(nice_range(lo - pad, hi + pad), (0.0, 1.0))
    chart.xband(1 - eq, 1 + eq, "#9ca3af", opacity=0.25)
    chart.vline(1.0, MUTED, dash=None)
    if outer is not None:
        o_low, o_high, o_conf = outer
        chart.path([(o_low, 0.5), (o_high, 0.5)], "#9ca3af", width=6, opacity=0.6,
                   title=f"{100 * o_conf:g} % CI [{o_low:.4f}, {o_high:.4f}]: the record gate's")
    chart.path([(ci_low, 0.5), (ci_high, 0.5)], "#111827", width=2.5,
               title=f"{100 * confidence:.0f} % CI [{ci_low:.4f}, {ci_high:.4f}]")
    for x in (ci_low, ci_high):
        chart.path([(x, 0.38), (x, 0.62)], "#111827", width=2.5)
    chart.dot(ratio, 0.5, "#111827", r=6, title=f"ratio {ratio:.4f}")
    chart.text(ratio, 0.5, f"{ratio:.4f}", dy="-1.2em", bold=True, color="#111827")
    if chart.sx(ci_high) - chart.sx(ci_low) > 90:
        chart.text(ci_low, 0.5, f"{ci_low:.4f}", dy="1.9em")
        chart.text(ci_high, 0.5, f"{ci_high:.4f}", dy="1.9em")
    else:  # a narrow interval: one label, or the two would overlap
        chart.text(ratio, 0.5, f"[{ci_low:.4f}, {ci_high:.4f}]", dy="1.9em")
    assert chart.x is not None
    numerator = label.split(" / ")[0]
    chart.text(chart.x.lo, 0.95, f"← {numerator} slower", anchor="start", dy="0.6em")
    chart.text(chart.x.hi, 0.95, f"{numerator} faster →", anchor="end", dy="0.6em")
    outer_note = (f"; wide grey bar: the record gate's {100 * outer[2]:g} % CI"
                  if outer is not None else "")
    chart.axes(f"{label} (grey band: equivalence ±{equivalence_pct:g} %{outer_note})", "",
               yticks=[], ygrid=False)
    return chart.render()


# --------------------------------------------------------------------------- speculative


# The narrowest bar a "100 %" label fits above, and the least room per tick label, in px.
LABEL_MIN_PX = 30.0
TICK_MIN_PX = 24.0


def tick_step(per_position_px: float) -> int:
    """Label every n-th position (1, 2, 5, 10, ...) so tick labels do not touch."""
    for step in (1, 2, 5, 10, 20, 50, 100):
        if step * per_position_px >= TICK_MIN_PX:
            return step
    return 100


def acceptance_chart(legs: Sequence[LegView]) -> str | None:
    spec = [leg for leg in legs if leg.speculative and leg.speculative.accepted_per_position
            and leg.speculative.draft_cycles]
    if not spec:
        return None
    colors = leg_colors(legs)
    k = max(len(leg.speculative.accepted_per_position or ()) for leg in spec if leg.speculative)
    chart = Chart(title="Draft acceptance per position", height=300)
    chart.scales((0.5, k + 0.5), (0.0, 110.0))  # room above 100 % for the labels
    width = 0.8 / len(spec)
    # Many positions (a 48-token draft) leave bars a few pixels wide: value labels would
    # overlap, so they are drawn only when each fits its bar (hover and the table keep
    # every value), and position ticks are thinned to every `step`th.
    per_position_px = (chart.x1 - chart.x0) / k
    labelled = per_position_px * width >= LABEL_MIN_PX
    step = tick_step(per_position_px)
    for j, leg in enumerate(spec):
        s = leg.speculative
        assert s is not None and s.accepted_per_position is not None and s.draft_cycles
        for pos, accepted in enumerate(s.accepted_per_position):
            share = 100 * accepted / s.draft_cycles
            x = pos + 1 - 0.4 + j * width
            chart.bar(x, x + width * 0.92, 0.0, share, colors[leg.name],
                      title=f"{leg.name}, position {pos + 1}: {accepted} of {s.draft_cycles} draft "
                            f"cycles accepted it ({share:.1f} %)")
            if labelled:
                chart.text(x + width * 0.46, share, f"{share:.0f} %", dy="-0.4em")
    ticks = [p for p in range(1, k + 1) if p == 1 or p % step == 0]
    chart.axes("draft position" + ("" if labelled else " (values on hover and in the table)"),
               "% of draft cycles accepting it", yticks=PERCENT_TICKS,
               xticks=[float(p) for p in ticks], xtick_labels=[str(p) for p in ticks])
    chart.legend([(leg.name, colors[leg.name]) for leg in spec])
    return chart.render()


def chunk_size_chart(legs: Sequence[LegView]) -> str | None:
    with_data = [leg for leg in legs if sum(leg.chunk_sizes)]
    if not with_data or max(len(leg.chunk_sizes) for leg in with_data) < 2:
        return None
    colors = leg_colors(legs)
    k = max(len(leg.chunk_sizes) for leg in with_data)
    chart = Chart(title="Tokens per streamed chunk", height=280)
    chart.scales((0.5, k + 0.5), (0.0, 110.0))
    width = 0.8 / len(with_data)
    for j, leg in enumerate(with_data):
        total = sum(leg.chunk_sizes)
        for size, count in enumerate(leg.chunk_sizes, start=1):
            share = 100 * count / total
            x = size - 0.4 + j * width
            chart.bar(x, x + width * 0.92, 0.0, share, colors[leg.name],
                      title=f"{leg.name}: {count} of {total} decode chunks carried {size} "
                            f"token{'s' if size > 1 else ''} ({share:.1f} %)")
            if count:
                chart.text(x + width * 0.46, share, f"{share:.0f}" if share >= 1 else "<1",
                           dy="-0.4em")
    chart.axes("tokens in the chunk (as the client received them); labels: %", "% of decode chunks",
               yticks=PERCENT_TICKS,
               xticks=[float(s) for s in range(1, k + 1)], xtick_labels=[str(s) for s in range(1, k + 1)])
    chart.legend([(leg.name, colors[leg.name]) for leg in with_data])
    return chart.render()


# --------------------------------------------------------------------------- telemetry


def power_chart(leg: str, t: TelemetryView) -> str | None:
    series = [s for s in t.series if s.t_s]
    if not series:
        return None
    xs = [x for s in series for x in s.t_s]
    ys = [y for s in series for y in s.power_w]
    chart = Chart(title=f"Power over time, leg {leg}", height=260)
    chart.scales(nice_range(min(xs), max(xs)), nice_range(0.0, max(ys) or 1.0, zero=True))
    if t.window_s:
        chart.xband(*t.window_s, WINDOW, "suite")
    for i, s in enumerate(series):
        chart.path(list(zip(s.t_s, s.power_w, strict=True)), SERIES[i % len(SERIES)],
                   title=f"{s.label}: {len(s.t_s)} samples")
    chart.axes("s since the leg's first request", "W")
    chart.legend([(s.label, SERIES[i % len(SERIES)]) for i, s in enumerate(series)])
    return chart.render()
