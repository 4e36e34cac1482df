"""A sweep's report: speed against the parameter with simultaneous intervals (the chart a
tuner reads first: which setting, by how much, and how sure), and the table beside it.

Everything here reads the sealed record's `sweep` section and its legs (a typed model);
per-arm acceptance, tokens per cycle and energy per token are medians over the arm's legs,
where the engine or the telemetry reported them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Final

from tokrecord.record.schema import ExperimentRecordV3, LegBlock
from tokrecord.report import fmt
from tokrecord.report.model import SweepRow
from tokrecord.report.svg import MUTED, Chart, nice_range

SWEEP_COLUMNS: Final = ("arm", "tok/s", "vs control (simultaneous CI)", "verdict", "exact",
                        "acceptance", "tokens/cycle", "J/token")
_EXACT: Final = "#15803d"
_INEXACT: Final = "#b91c1c"


def _median(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return float(statistics.median(found)) if found else None


def sweep_rows(record: ExperimentRecordV3) -> tuple[SweepRow, ...]:
    """One row per arm, control first, in the record's arm order."""
    if record.sweep is None:
        return ()
    a = record.sweep.analysis
    runs = record.runs
    contrasts = {c.arm: c for c in a.contrasts}
    out = []
    for s in a.arm_summaries:
        legs: list[LegBlock] = [runs[name] for name in s.legs if name in runs]
        c = contrasts.get(s.arm)
        out.append(SweepRow(
            arm=s.arm, control=s.arm == a.control, best=s.arm == a.best,
            tok_s=s.median_tok_s, ratio=None if c is None else c.ratio,
            ci_low=None if c is None else c.ci_low, ci_high=None if c is None else c.ci_high,
            verdict="control" if c is None else c.verdict.value, exact=s.exact,
            acceptance=_median([leg.draft_acceptance_rate for leg in legs]),
            tokens_per_cycle=_median([leg.emitted_tokens_per_draft_cycle for leg in legs]),
            joules_per_token=_median([leg.telemetry.joules_per_output_token
                                      if leg.telemetry is not None else None for leg in legs])))
    return tuple(out)


def sweep_statement(record: ExperimentRecordV3) -> str | None:
    if record.sweep is None:
        return None
    a, g = record.sweep.analysis, record.sweep.gate
    conf = f"{100 * a.confidence:g} %" if a.critical_value is not None else "no"
    how = f"Dunnett, {a.df} df" if record.sweep.sequential is None else \
        f"repeated, the sequential boundary on {a.df} df"
    return (f"{a.best_statement}. {len(a.arms)} arms x {a.blocks} complete block(s), "
            f"{conf} simultaneous intervals ({how}); record gate on the best arm: "
            + ("passed" if g.passed else "; ".join(g.reasons) or "not passed"))


def sweep_looks_lines(record: ExperimentRecordV3) -> list[str]:
    """A sequential sweep's looks, one line each, and where it stopped (none for a fixed
    sweep)."""
    seq = record.sweep.sequential if record.sweep is not None else None
    if seq is None:
        return []
    lines = [f"look {look.label}: {look.reason}; {look.action.value}" for look in seq.looks]
    planned = seq.max_blocks
    run = seq.looks[-1].block if seq.looks else 0
    lines.append(f"sequential sweep ({seq.spending.value} spending): "
                 + (f"stopped at {seq.stopped_at}, {planned - run} of {planned} blocks not run"
                    if seq.stopped else f"not stopped: {run} of at most {planned} blocks"))
    return lines


def sweep_cells(row: SweepRow) -> list[str]:
    interval = fmt.DASH if row.ratio is None or row.ci_low is None or row.ci_high is None \
        else (f"{fmt.pct(100 * (row.ratio - 1))} [{fmt.pct(100 * (row.ci_low - 1))}, "
              f"{fmt.pct(100 * (row.ci_high - 1))}]")
    name = row.arm + (" (control)" if row.control else "") + (" (best)" if row.best else "")
    return [name, fmt.num(row.tok_s), interval, row.verdict,
            "yes" if row.exact else "NOT exact",
            fmt.DASH if row.acceptance is None else f"{100 * row.acceptance:.1f} %",
            fmt.DASH if row.tokens_per_cycle is None else f"{row.tokens_per_cycle:.2f}",
            fmt.DASH if row.joules_per_token is None else f"{row.joules_per_token:.4f}"]


def sweep_chart(rows: Sequence[SweepRow], confidence: float) -> str | None:
    """Each arm's speed relative to control, in %, with its simultaneous interval; arms in
    the record's order (the parameter's values), inexact arms in red."""
    points = list(enumerate(rows))
    ranged = [r for _, r in points if r.ci_low is not None and r.ci_high is not None]
    if not ranged:
        return None
    lows = [100 * ((r.ci_low or 1) - 1) for r in ranged]
    highs = [100 * ((r.ci_high or 1) - 1) for r in ranged]
    lo, hi = min(0.0, *lows), max(0.0, *highs)
    pad = (hi - lo) * 0.1 or 1.0
    chart = Chart(title=f"Speed against control, {100 * confidence:g} % simultaneous intervals",
                  height=260, bottom=64)
    chart.scales((-0.5, len(rows) - 0.5), nice_range(lo - pad, hi + pad))
    chart.hline(0.0, MUTED, dash=None)
    for i, r in points:
        color = _EXACT if r.exact else _INEXACT
        if r.control:
            chart.dot(i, 0.0, MUTED, r=5, title=f"{r.arm}: control")
            continue
        if r.ratio is None or r.ci_low is None or r.ci_high is None:
            continue
        low, mid, high = (100 * (v - 1) for v in (r.ci_low, r.ratio, r.ci_high))
        chart.path([(i, low), (i, high)], color, width=2.5,
                   title=f"{r.arm}: {mid:+.2f} % [{low:+.2f}, {high:+.2f}]")
        chart.dot(i, mid, color, r=6 if r.best else 4,
                  title=f"{r.arm}: {mid:+.2f} %" + (" (best)" if r.best else ""))
    chart.axes("arm (green: token-exact, red: NOT exact; grey: control)", "vs control, %",
               xticks=[float(i) for i, _ in points], xtick_labels=[r.arm for _, r in points])
    return chart.render()

