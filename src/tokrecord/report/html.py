"""The self-contained HTML report: one file, opens offline, no script.

The Content-Security-Policy forbids every fetch (no scripts, fonts, styles or
images from anywhere; inline styles and data: images only), so a page that
would reach the network fails loudly in a browser's console instead of quietly
phoning home. Charts are inline SVG (charts.py); numbers are in tables beside
them, so nothing is only in a picture.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from tokrecord import __version__
from tokrecord.experiment.design import DesignSpec, named_spec
from tokrecord.gates import TEACHER_EXACT, GateStatus

from . import charts, fmt
from .explain import TEACHER_LEG, control_figure, gate_explained
from .model import Analysis, Fact, Kind, LegView, Power, ReportData
from .noise import noise_section
from .sweep import SWEEP_COLUMNS, sweep_cells, sweep_chart
from .text import (
    COMPONENT_COLUMNS,
    component_cells,
    exact_cell,
    interval_text,
    kind_text,
    noise_text,
    pairs_what,
    power_text,
    record_interval_text,
    sweep_headline_note,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
SECTIONS = (
    ("summary", "Summary"),
    ("legs", "Legs"),
    ("rates", "Per-row rates"),
    ("timeline", "Token timeline"),
    ("intervals", "Intervals"),
    ("abba", "ABBA"),
    ("speculative", "Speculative"),
    ("components", "Components"),
    ("telemetry", "Telemetry"),
    ("noise", "Noise"),
    ("gates", "Gates"),
    ("identity", "Identity"),
)

CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#fff;--soft:#f9fafb;
--pass:#15803d;--fail:#b91c1c;--warn:#b45309}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif}
main{max-width:960px;margin:0 auto;padding:20px 24px 48px}
nav{position:sticky;top:0;background:rgba(255,255,255,.96);border-bottom:1px solid var(--line);
padding:6px 24px;font-size:13px;z-index:1}
nav a{color:var(--muted);text-decoration:none;margin-right:14px}
h1{font-size:24px;margin:8px 0 2px}h2{font-size:18px;margin:32px 0 8px;padding-top:8px;
border-top:1px solid var(--line)}h3{font-size:15px;margin:18px 0 6px}
.sub{color:var(--muted);margin:0 0 14px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:10px;margin:12px 0}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 12px;background:var(--soft)}
.card .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:24px;font-weight:650;margin:2px 0}
.card .n{font-size:12px;color:var(--muted)}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top}
td:first-child{white-space:nowrap}
th{font-weight:600;background:var(--soft)}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:var(--pass);font-weight:600}.fail{color:var(--fail);font-weight:600}
.nt{color:var(--warn);font-weight:600}
.verdict-FASTER{color:var(--pass)}.verdict-SLOWER{color:var(--fail)}
.verdict-UNDECIDED{color:var(--warn)}.verdict-NO.DIFFERENCE{color:var(--muted)}
.note{color:var(--muted);font-size:13px}
.gate-why{display:block;white-space:normal}
.warn{border-left:3px solid var(--warn);background:#fffbeb;padding:6px 10px;margin:6px 0;font-size:13px}
svg.chart{display:block;width:100%;height:auto;margin:6px 0 12px;font-family:inherit}
details{margin:4px 0}summary{cursor:pointer}
pre{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:8px;
font-size:12px;overflow:auto;max-height:360px;white-space:pre-wrap;word-break:break-word}
code{font-size:12px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0;font-size:13px}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0;word-break:break-word}
footer{margin-top:36px;color:var(--muted);font-size:12px}
"""


def _e(text: object) -> str:
    return escape(str(text))


def _status(status: str) -> str:
    cls = {"pass": "pass", "fail": "fail", "not tested": "nt"}.get(status, "")
    return f'<span class="{cls}">{_e(status)}</span>'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = (),
           raw: bool = False) -> str:
    """A table; cells are escaped unless raw (then the caller escaped them)."""
    head = "".join(f'<th class="r">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(header))
    body = []
    for row in rows:
        cells = "".join(
            ('<td class="r">' if i in numeric else "<td>") + (c if raw else _e(c)) + "</td>"
            for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _facts(facts: Sequence[Fact]) -> str:
    if not facts:
        return ""
    items = "".join(f"<dt>{_e(f.label)}</dt><dd>{_e(f.value)}</dd>" for f in facts)
    return f'<dl class="facts">{items}</dl>'


def _quality_facts(facts: Sequence[Fact]) -> str:
    """Like _facts, with each check's one-line meaning (the keys are record field names)."""
    items = "".join(f"<dt>{_e(f.label)}</dt><dd>{_e(f.value)}{_explained(f.label)}</dd>"
                    for f in facts)
    return f'<dl class="facts">{items}</dl>'


def _card(key: str, value: str, note: str = "", cls: str = "") -> str:
    klass = f' class="v {cls}"' if cls else ' class="v"'
    return (f'<div class="card"><div class="k">{_e(key)}</div><div{klass}>{_e(value)}</div>'
            f'<div class="n">{_e(note)}</div></div>')


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


# --------------------------------------------------------------------------- sections


def _summary(d: ReportData) -> str:
    h = d.headline
    sub = " · ".join(x for x in (kind_text(d), d.date or "", f"status {d.status}") if x)
    bound = (f", per-token forms ±{h.quantisation_bound_pct:.2f} % (chunks)"
             if h.quantisation_bound_pct else "")
    cards = [_card("headline", f"{fmt.num(h.value)} tok/s",
                   f"leg {h.leg or fmt.DASH} ({h.arm or fmt.DASH}), {h.convention}{bound}"
                   f"{sweep_headline_note(d)}")]
    control = control_figure(d)
    if control is not None:
        cards.append(_card("control", f"{fmt.num(control.value)} tok/s",
                           f"leg {control.leg}, the lower control leg"
                           + (f"; headline {fmt.pct(control.delta_pct)}"
                              if control.delta_pct is not None else "")))
    verdict_note = ""
    if d.bootstrap:
        b = d.bootstrap
        verdict_note = (f"candidate/control {b.ratio:.4f}, {100 * b.confidence:.0f} % CI "
                        f"[{b.ci_low:.4f}, {b.ci_high:.4f}]")
    elif d.analysis:
        verdict_note = interval_text(d.analysis)
    cards.append(_card("verdict", d.verdict, verdict_note,
                       "verdict-" + d.verdict.replace(" ", ".")))
    if d.power and d.power.min_effect:
        e, pw = d.power.min_effect, d.power
        need = (f"{100 * pw.target_power:.0f} % needs {e.blocks_for_target} blocks"
                if e.blocks_for_target else f"{100 * pw.target_power:.0f} % not within 50 blocks")
        cards.append(_card("power", f"{100 * e.power:.0f} %",
                           f"for +{e.effect_pct:g} % at {pw.blocks} block"
                           f"{'s' if pw.blocks != 1 else ''}; {need}",
                           "pass" if e.power >= pw.target_power else "nt"))
    if d.record_gate:
        g = d.record_gate
        cards.append(_card("record gate", "PASS" if g.passed else "no record",
                           "; ".join(g.reasons) or g.status, "pass" if g.passed else "fail"))
    v = d.verification
    if v.checked:
        cards.append(_card("evidence", "verified" if v.ok else "NOT verified",
                           "manifest, signature, every figure recomputed" if v.ok
                           else f"{v.total} problems (see Identity)", "pass" if v.ok else "fail"))
    else:
        cards.append(_card("evidence", "not checked", v.note))
    parts = [f"<h1>tokrecord report: {_e(d.title)}</h1>", f'<p class="sub">{_e(sub)}</p>',
             f'<div class="cards">{"".join(cards)}</div>']
    lines = [f"Headline {fmt.num(h.value)} tok/s = {h.formula}"
             + (f"; {h.note}" if h.note else "") + "."]
    if h.conventional is not None:
        lines.append(f"Conventional {fmt.num(h.conventional)}, legacy inclusive-events "
                     f"{fmt.num(h.legacy)}, chunk-aware {fmt.num(h.chunk_aware)} tok/s.")
    if h.qualification:
        lines.append(h.qualification)
    parts.append(_note(" ".join(lines)))
    return f'<section id="summary">{"".join(parts)}</section>'


def _legs(d: ReportData) -> str:
    rows = []
    for leg in d.legs:
        s = leg.speculative
        rows.append([
            _e(leg.name), _e(leg.arm), fmt.num(leg.tok_s), fmt.num(leg.p10), fmt.num(leg.ttft_ms, 1),
            fmt.num(leg.full_after_ttft), fmt.num(s.acceptance_rate, 3) if s else fmt.DASH,
            fmt.num(s.emitted_per_cycle, 2) if s else fmt.DASH,
            _e(exact_cell(next((g for g in leg.gates if g.name == TEACHER_EXACT), None))),
            _e(_gates_passed(leg)),
            str(leg.stalled_rows), '<span class="pass">yes</span>' if leg.valid
            else '<span class="fail">NO</span>'])
    parts = ['<h2>Legs</h2>',
             _table(["leg", "arm", "tok/s", "p10", "TTFT ms", "full after TTFT", "acceptance",
                     "tok/cycle", "teacher exact", "gates", "stalled rows", "valid"], rows,
                    numeric=(2, 3, 4, 5, 6, 7, 10), raw=True)]
    if d.pairs:
        parts.append(f"<h3>Pairs ({_e(pairs_what(d))})</h3>")
        parts.append(_table(
            ["pair", "headline Δ", "paired median Δ", "row wins", "cycle saving ms", "pass"],
            [[_e(p.name), fmt.pct(p.headline_delta_pct), fmt.pct(p.paired_median_delta_pct),
              _e(p.row_wins), fmt.num(p.cycle_saving_ms, 3),
              _status("pass" if p.passed else "fail")
              + (f'<div class="note">{_e("; ".join(p.failed_criteria))}</div>'
                 if p.failed_criteria else "")] for p in d.pairs],
            numeric=(1, 2, 4), raw=True))
    detail = []
    for leg in d.legs:
        detail.append([leg.name, leg.run_dir, f"{fmt.num(leg.conventional)} / {fmt.num(leg.legacy)} / "
                       f"{fmt.num(leg.chunk_aware)}", fmt.num(leg.quantisation_bound_pct),
                       f"{fmt.num(leg.mean)} ± {fmt.num(leg.stdev)}", fmt.num(leg.wall_full),
                       f"{leg.rows_rated}/{leg.rows_planned}", f"{leg.output_tokens:,}",
                       fmt.num(leg.ready_s, 1), fmt.num(leg.wall_s, 1),
                       fmt.num(leg.idle_gap_before_s, 1)])
    parts.append("<details><summary>All leg figures</summary>" + _table(
        ["leg", "run dir", "conventional / legacy / chunk-aware", "quant. ±%", "mean ± stdev",
         "wall full", "rows rated", "output tokens", "ready s", "wall s", "idle gap s"], detail,
        numeric=(3, 5, 7, 8, 9, 10)) + "</details>")
    for leg in d.legs:
        if leg.error:
            parts.append(f'<div class="warn"><b>{_e(leg.name)}</b> error: {_e(leg.error)}</div>')
    warnings = [(leg.name, w) for leg in d.legs for w in leg.warnings]
    if warnings:
        items = "".join(f'<div class="warn"><b>{_e(name)}</b>: {_e(w)}</div>' for name, w in warnings)
        parts.append(f"<details><summary>Warnings ({len(warnings)}): what to know before trusting "
                     f"the figures</summary>{items}</details>")
    return f'<section id="legs">{"".join(parts)}</section>'


def _gates_passed(leg: LegView) -> str:
    passed = sum(1 for g in leg.gates if g.status is GateStatus.PASS)
    return f"{passed}/{len(leg.gates)}"


def _rates(d: ReportData) -> str:
    parts = ["<h2>Per-row rates</h2>",
             _note("Each row's rate over tokens 1..100 in the headline convention, every leg side "
                   "by side. The leg's headline is the median of these.")]
    svg = charts.rates_chart(d.legs)
    parts.append(svg or _note("No rows recorded."))
    row_ids: dict[int, str] = {}
    for leg in d.legs:
        for r in leg.rows:
            row_ids.setdefault(r.row, r.row_id)
    if row_ids:
        by_leg = {leg.name: {r.row: r for r in leg.rows} for leg in d.legs}
        rows = []
        for i, rid in sorted(row_ids.items()):
            cells = [str(i), _e(rid)]
            for leg in d.legs:
                cell = by_leg[leg.name].get(i)
                if cell is None:
                    cells.append(fmt.DASH)
                else:
                    flag = f' <span class="nt">{_e(",".join(cell.flags))}</span>' if cell.flags else ""
                    cells.append(f"{fmt.num(cell.rate)}{flag}")
            rows.append(cells)
        parts.append(_table(["row", "id", *[leg.name for leg in d.legs]], rows,
                            numeric=tuple(range(2, 2 + len(d.legs))), raw=True))
    return f'<section id="rates">{"".join(parts)}</section>'


def _timeline(d: ReportData) -> str:
    parts = ["<h2>Per-token timeline</h2>"]
    if not d.timelines:
        parts.append(_note("No rows recorded."))
        return f'<section id="timeline">{"".join(parts)}</section>'
    colors = charts.leg_colors(d.legs)
    t = d.timelines[0]
    parts.append(_note(
        f"{d.timeline_choice}. {t.n_tokens} tokens in {t.chunks} chunks, {t.multi_token_chunks} of "
        f"them carrying two or more tokens (a speculative burst is a vertical step). Choose another "
        f"with tokrecord report DIR --leg NAME --row N."
        + (" Downsampled for display." if t.downsampled else "")))
    parts.append(charts.timeline_chart(t, colors.get(t.leg, "#111827")))
    zoom = charts.timeline_zoom_chart(t, colors.get(t.leg, "#111827"))
    if zoom:
        parts.append("<h3>The headline window, close up</h3>" + zoom)
    compare = charts.timeline_compare_chart(d.timelines, colors)
    if compare:
        parts.append(f"<h3>Row {t.row} in every leg</h3>" + compare)
    return f'<section id="timeline">{"".join(parts)}</section>'


def _intervals(d: ReportData) -> str:
    parts = ["<h2>Inter-token intervals</h2>",
             _note("Time between consecutive tokens over every row of a leg. Tokens that arrive in "
                   "one chunk share its time: their zero intervals are counted in the table, not "
                   "drawn.")]
    svg = charts.intervals_chart(d.legs)
    parts.append(svg or _note("No intervals recorded."))
    rows = []
    for leg in d.legs:
        i = leg.intervals
        if i is None:
            continue
        rows.append([leg.name, f"{i.intervals:,}", fmt.share(i.same_chunk, i.intervals),
                     fmt.num(i.median_ms, 3), fmt.num(i.p90_ms, 3), fmt.num(i.p99_ms, 3),
                     fmt.num(i.max_ms, 1)])
    if rows:
        parts.append(_table(["leg", "intervals", "zero (same chunk)", "median ms", "p90 ms",
                             "p99 ms", "max ms"], rows, numeric=(1, 2, 3, 4, 5, 6)))
    return f'<section id="intervals">{"".join(parts)}</section>'


def _abba(d: ReportData) -> str:
    parts = ["<h2>ABBA legs and the confidence interval</h2>"]
    if d.kind is not Kind.ABBA:
        parts.append(_note("Not an ABBA experiment: one leg, no comparison."))
        svg = charts.abba_chart(d.legs)
        if svg:
            parts.append(svg)
        return f'<section id="abba">{"".join(parts)}</section>'
    if d.sweep:
        return _sweep(d)
    spec = named_spec(d.design)
    if spec is not None:
        return _abba_v2(d, spec)
    parts.append(_note("Legs in the order they ran, each on a fresh server; dashed lines join the "
                       "two legs of an arm (drift over the experiment shows as their slope)."))
    svg = charts.abba_chart(d.legs)
    if svg:
        parts.append(svg)
    if d.bootstrap:
        b = d.bootstrap
        parts.append(charts.ci_chart(b))
        parts.append(_note(
            f"Verdict {d.verdict}: candidate/control {b.ratio:.4f} ({fmt.pct(100 * (b.ratio - 1))}), "
            f"{100 * b.confidence:.0f} % CI [{b.ci_low:.4f}, {b.ci_high:.4f}], {b.samples} bootstrap "
            f"samples, equivalence ±{b.equivalence_pct:g} %. Method: {b.method}."))
    return f'<section id="abba">{"".join(parts)}</section>'


def _sweep(d: ReportData) -> str:
    """A sweep: each arm's speed against control with simultaneous intervals (the chart a
    tuner reads first), and the table beside it."""
    parts = ["<h2>Sweep: speed against the parameter</h2>",
             _note(f"{fmt.design('sweep', d.blocks)}. " + (d.sweep_statement or ""))]
    svg = sweep_chart(d.sweep, d.sweep_confidence or 0.95)
    if svg:
        parts.append(svg)
    parts.append(_table(SWEEP_COLUMNS, [sweep_cells(r) for r in d.sweep],
                        numeric=(1, 5, 6, 7)))
    return f'<section id="abba">{"".join(parts)}</section>'


def _abba_v2(d: ReportData, spec: DesignSpec) -> str:
    """The ABBA section of a v2 record: k blocks, the leg-level verdict, its noise and power."""
    k = d.blocks or 1
    aa = not spec.compares_arms
    parts = ["<h2>ABBA legs and the confidence interval</h2>" if not aa
             else "<h2>A/A legs and the noise floor</h2>"]
    parts.append(_note(
        f"{spec.describe(k)}. Legs in the order they ran, each on a fresh "
        "server; blocks alternate ABBA and BAAB, so a linear drift within a block cancels. "
        "Dashed lines join the legs of " + ("a position (one arm runs everywhere)." if aa
                                            else "an arm (drift shows as their slope).")))
    svg = charts.abba_chart(d.legs, k)
    if svg:
        parts.append(svg)
    pairs = charts.pairs_chart(d.pairs, "B / A" if aa else "candidate / control")
    if pairs:
        parts.append(pairs)
    a = d.analysis
    if a is None:
        parts.append(_note(f"Verdict {d.verdict}: the record holds no leg-level analysis."))
    else:
        if a.ratio is not None and a.ci_low is not None and a.ci_high is not None:
            outer = ((a.record_ci_low, a.record_ci_high, a.record_confidence)
                     if a.record_ci_low is not None and a.record_ci_high is not None
                     and a.record_confidence is not None and not aa else None)
            parts.append(charts.interval_chart(a.ratio, a.ci_low, a.ci_high, a.confidence,
                                               a.equivalence_pct,
                                               "B / A positions" if aa else "candidate / control",
                                               outer))
        record = record_interval_text(a)
        parts.append(_note(f"Verdict {d.verdict}: {interval_text(a)}; equivalence "
                           f"±{a.equivalence_pct:g} %. {a.reason}."
                           + (f" For the record: {record}." if record else "")
                           + f" Method: {a.method}."))
        parts.append("<h3>The noise the interval rests on</h3>" + _facts(_noise_facts(a)))
        parts.append(_leg_figures(d, a))
    parts.append(_sequential(d))
    parts.append(_power(d.power))
    return f'<section id="abba">{"".join(parts)}</section>'


def _sequential(d: ReportData) -> str:
    """A sequential record's stopping rule and its estimate at the stop, plain and
    bias-adjusted (nothing for a fixed design)."""
    facts = [Fact(label=label, value=value) for label, value in
             (("stopping rule", d.sequential), ("estimate at the stop", d.sequential_estimate))
             if value is not None]
    return "<h3>Sequential design</h3>" + _facts(facts) if facts else ""


def _noise_facts(a: Analysis) -> list[Fact]:
    return [
        Fact(label="between legs (sd)", value=f"{fmt.sd_pct(a.leg_noise_sd_pct)}, "
                                              f"df {a.leg_noise_df}"),
        Fact(label="row to row within a leg (sd)", value=f"{fmt.sd_pct(a.row_noise_sd_pct)}, "
                                                         f"df {a.row_noise_df}"),
        Fact(label="a leg's figure (sd, both together)", value=fmt.sd_pct(a.residual_sd_pct)),
        Fact(label="t interval", value=f"df {a.df}, {100 * a.confidence:.0f} % confidence"),
        Fact(label="legs, blocks, rows", value=f"{a.legs} legs in {a.blocks} blocks, "
                                               f"{a.rows_used} rows rated in every leg"),
        Fact(label="summary", value=noise_text(a)),
    ]


def _leg_figures(d: ReportData, a: Analysis) -> str:
    if not a.leg_statistics:
        return ""
    by_name = {leg.name: leg for leg in d.legs}
    rows = []
    for name, value in a.leg_statistics:
        leg = by_name.get(name)
        number = int(name[1:]) if name[1:].isdigit() else 0
        rows.append([name, str((number + 1) // 2), name[:1], leg.arm if leg else fmt.DASH,
                     fmt.num(leg.tok_s) if leg else fmt.DASH, fmt.pct(value)])
    return ("<h3>Each leg's figure</h3>"
            + _note("The verdict's unit is the leg: each leg's Hodges-Lehmann location of its "
                    "log row rates relative to each row's mean over legs (x 100, about a "
                    "percentage), fitted on block and treatment.")
            + _table(["leg", "block", "position", "arm", "headline tok/s", "leg figure"], rows,
                     numeric=(1, 4, 5)))


def _power(p: Power | None) -> str:
    if p is None:
        return ("<h3>Power</h3>" + _note("No power was preregistered: the plan declared no "
                                         "min_effect_pct."))
    rows = [[f"+{e.effect_pct:g} %" + (" (min effect)" if e.effect_pct == p.min_effect_pct else ""),
             f"{100 * e.power:.1f} %",
             str(e.blocks_for_target) if e.blocks_for_target else "more than 50"]
            for e in p.entries]
    sources = "; ".join(p.noise_sources) or fmt.DASH
    return ("<h3>Power, as preregistered</h3>" + _note(power_text(p) + ".")
            + _table(["true effect", f"P(FASTER) at {p.blocks} blocks",
                      f"blocks for {100 * p.target_power:.0f} %"], rows, numeric=(1, 2))
            + _note(f"Noise: legs sd {p.sd_leg_pct:.3f} %, rows sd {p.sd_row_pct:.3f} % over "
                    f"{p.rows} rows (from {sources}); df {p.df}. Method: {p.method}."))


def _speculative(d: ReportData) -> str:
    parts = ["<h2>Speculative decoding</h2>"]
    rows = []
    for leg in d.legs:
        s = leg.speculative
        if s is None:
            rows.append([leg.name, "not exposed", fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH])
            continue
        per = (", ".join(str(a) for a in s.accepted_per_position)
               if s.accepted_per_position else "not exposed")
        rows.append([leg.name, f"{s.draft_cycles}", f"{s.draft_tokens}", f"{s.accepted_draft_tokens}",
                     fmt.num(s.acceptance_rate, 4), fmt.num(s.emitted_per_cycle, 3), per])
    if any(leg.speculative for leg in d.legs):
        parts.append(_note("Engine counter deltas over the suite (/metrics before and after). "
                           "Per position: how often the draft token at that position was accepted, "
                           "of all draft cycles."))
        parts.append(_table(["leg", "draft cycles", "draft tokens", "accepted", "acceptance",
                             "tokens per cycle", "accepted per position"], rows,
                            numeric=(1, 2, 3, 4, 5)))
        svg = charts.acceptance_chart(d.legs)
        parts.append(svg or _note("The engine does not expose acceptance per position."))
    else:
        parts.append(_note("No leg's engine exposed speculative-decoding counters."))
    sizes = charts.chunk_size_chart(d.legs)
    if sizes:
        parts.append("<h3>Tokens per chunk, as the client received them</h3>" + sizes)
    return f'<section id="speculative">{"".join(parts)}</section>'


def _components(d: ReportData) -> str:
    parts = ["<h2>Component evidence</h2>"]
    if not d.components:
        parts.append(_note("The plan declares no components ([[components]]: profiler traces "
                           "of what the candidate changes)."))
    else:
        parts.append(_note("From the profiler traces the plan declared, sealed with the "
                           "experiment: the component's kernel launches per decode cycle, "
                           "the kernel time it saves per cycle (a range over devices or "
                           "ranks), and the component check the user ran."))
        parts.append(_table(list(COMPONENT_COLUMNS), [component_cells(c)
                                                      for c in d.components]))
    return f'<section id="components">{"".join(parts)}</section>'


def _telemetry(d: ReportData) -> str:
    parts = ["<h2>Telemetry</h2>"]
    legs = [leg for leg in d.legs if leg.telemetry is not None]
    if not legs:
        parts.append(_note("No telemetry was recorded for these legs (no telemetry.jsonl)."))
        return f'<section id="telemetry">{"".join(parts)}</section>'
    drawn = 0
    for leg in legs:
        assert leg.telemetry is not None
        svg = charts.power_chart(leg.name, leg.telemetry)
        if svg:
            drawn += 1
            parts.append(svg)
    if not drawn:
        parts.append(_note("The samples hold no power reading (see the notes): nothing to draw."))
    labels: list[str] = []
    for leg in legs:
        assert leg.telemetry is not None
        labels += [f.label for f in leg.telemetry.facts if f.label != "note" and f.label not in labels]
    rows = []
    for leg in legs:
        assert leg.telemetry is not None
        facts = {f.label: f.value for f in leg.telemetry.facts}
        notes = "; ".join(f.value for f in leg.telemetry.facts if f.label == "note")
        rows.append([leg.name, str(leg.telemetry.samples),
                     *[facts.get(label, fmt.DASH) for label in labels if label != "samples"], notes])
    header = ["leg", "samples", *[label for label in labels if label != "samples"], "notes"]
    parts.append(_table(header, rows, numeric=(1,)))
    return f'<section id="telemetry">{"".join(parts)}</section>'


def _noise(d: ReportData) -> str:
    return noise_section(d.noise)


def _attempt_valid(leg: str, valid: bool | None) -> str:
    # The teacher leg is the reference outputs; "valid: no" would read as a failure.
    return "teacher (the reference)" if leg == TEACHER_LEG else fmt.yes_no(valid)


def _gate_name(name: str) -> str:
    line = gate_explained(name)
    label = _e(fmt.gate_label(name))
    return f'{label}<span class="note gate-why">{_e(line)}</span>' if line else label


def _explained(name: str) -> str:
    line = gate_explained(name)
    return f' <span class="note">— {_e(line)}</span>' if line else ""


def _gates(d: ReportData) -> str:
    parts = ["<h2>Quality gates</h2>"]
    names: list[str] = []
    for leg in d.legs:
        for g in leg.gates:
            if g.name not in names:
                names.append(g.name)
    matrix = []
    for name in names:
        cells = [_gate_name(name)]
        for leg in d.legs:
            cell = next((x for x in leg.gates if x.name == name), None)
            cells.append(_status(cell.status) + (f" {_e(cell.count)}" if cell.count else "")
                         if cell else fmt.DASH)
        matrix.append(cells)
    parts.append(_table(["gate", *[leg.name for leg in d.legs]], matrix, raw=True))
    parts.append(_note("Each gate with its reason and evidence, per leg (gates.json):"))
    for name in names:
        inner = []
        statuses = []
        for leg in d.legs:
            found = next((x for x in leg.gates if x.name == name), None)
            if found is None:
                continue
            statuses.append(found.status)
            req = "required" if found.required else "optional"
            inner.append(f"<p><b>{_e(leg.name)}</b>: {_status(found.status)} {_e(found.count or '')} "
                         f"({req}) — {_e(found.reason)}</p>"
                         + (f"<pre>{_e(found.evidence)}</pre>" if found.evidence else ""))
        summary = ", ".join(sorted({s for s in statuses}))
        parts.append(f'<details id="gate-{_e(name)}"><summary>{_e(fmt.gate_label(name))}: '
                     f"{_e(summary)}{_explained(name)}</summary>{''.join(inner)}</details>")
    for g in d.experiment_gates:
        parts.append(f"<h3>{_e(fmt.gate_label(g.name))} (across legs)</h3>{_explained(g.name)}"
                     f"<p>{_status(g.status)} {_e(g.count or '')} — {_e(g.reason)}</p>"
                     + (f"<pre>{_e(g.evidence)}</pre>" if g.evidence else ""))
    if d.quality:
        parts.append("<h3>Quality across legs</h3>" + _quality_facts(d.quality))
    claims: list[str] = []
    for leg in d.legs:
        claims += [f.claim for f in leg.log_facts if f.claim not in claims]
    if claims:
        rows = []
        for claim in claims:
            cells = [_e(claim)]
            for leg in d.legs:
                f = next((x for x in leg.log_facts if x.claim == claim), None)
                cells.append(fmt.DASH if f is None else
                             '<span class="pass">claimed</span>' if f.holds
                             else f'<span class="nt" title="{_e(f.statement)}">not claimed</span>')
            rows.append(cells)
        unsupported = sorted({f.statement for leg in d.legs for f in leg.log_facts if not f.holds})
        parts.append("<h3>Treatment claims from the server logs</h3>"
                     + _table(["claim", *[leg.name for leg in d.legs]], rows, raw=True)
                     + "".join(_note(s) for s in unsupported))
    if d.record_gate:
        rg = d.record_gate
        verdict = '<span class="pass">PASS</span>' if rg.passed else '<span class="fail">no record</span>'
        reasons = "".join(f"<li>{_e(r)}</li>" for r in rg.reasons)
        parts.append(f"<h3>Record gate: {verdict}</h3>" + _facts(rg.facts)
                     + (f"<ul>{reasons}</ul>" if reasons else ""))
    return f'<section id="gates">{"".join(parts)}</section>'


def _identity(d: ReportData) -> str:
    parts = ["<h2>Identity and verification</h2>"]
    v = d.verification
    if not v.checked:
        parts.append(f'<p><b>Verification</b>: {_e(v.note)}</p>')
    elif v.ok:
        parts.append('<p><b>Verification</b>: <span class="pass">verified</span> — every file '
                     "matches the signed manifest, and every row, aggregate, gate and pair "
                     "recomputes from the raw events (tokrecord verify).</p>")
    else:
        items = "".join(f"<li><code>{_e(p)}</code></li>" for p in v.problems)
        more = f"<li>… and {v.total - len(v.problems)} more</li>" if v.total > len(v.problems) else ""
        parts.append(f'<p><b>Verification</b>: <span class="fail">NOT verified</span> — {v.total} '
                     f"problems (tokrecord verify):</p><ul>{items}{more}</ul>")
    if v.signer:
        parts.append(f"<p><b>Signer</b>: {_e(v.signer)}</p>")
    parts.append(_facts(d.identity))
    if d.protocol:
        parts.append("<h3>Protocol</h3>" + _facts(d.protocol))
    if d.attempts:
        parts.append("<h3>Attempts</h3>" + _table(
            ["leg", "attempt", "status", "valid", "error"],
            [[a.leg, str(a.attempt), a.status, _attempt_valid(a.leg, a.valid), a.error or ""]
             for a in d.attempts]))
    if d.submissions:
        parts.append("<h3>Submissions</h3>" + "".join(f"<p>{_e(line)}</p>" for line in d.submissions))
    if d.addenda:
        parts.append("<h3>Addenda</h3>" + _table(
            ["addendum", "kind", "created (UTC)", "text"],
            [[a.name, a.kind, a.created_utc, a.text] for a in d.addenda]))
    return f'<section id="identity">{"".join(parts)}</section>'


def render_html(d: ReportData) -> str:
    nav = "".join(f'<a href="#{sid}">{_e(label)}</a>' for sid, label in SECTIONS)
    body = "".join(section(d) for section in (_summary, _legs, _rates, _timeline, _intervals,
                                              _abba, _speculative, _components, _telemetry,
                                              _noise, _gates, _identity))
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>tokrecord report: {_e(d.title)}</title><style>{CSS}</style></head>"
        f"<body><nav>{nav}</nav><main>{body}"
        f"<footer>tokrecord {_e(__version__)} report ({_e(d.schema_id)}). A single file: no "
        "scripts, no fonts, no requests; charts are inline SVG, hover them for values.</footer>"
        "</main></body></html>\n"
    )
