"""The terminal summary (rich) and the markdown summary, from a ReportData.

Both are deterministic for a given ReportData (the golden tests compare them
byte for byte): no clock, no absolute path, no colour in the plain-text form.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tokrecord.evidence.safe import terminal_safe
from tokrecord.experiment.design import named_spec
from tokrecord.gates import TEACHER_EXACT, GateStatus
from tokrecord.metrics.rows import ROW_FLAGS
from tokrecord.report.sweep import SWEEP_COLUMNS, sweep_cells

from . import fmt
from .explain import control_figure, control_text
from .model import (
    Analysis,
    ComponentView,
    GateView,
    Kind,
    LegView,
    Power,
    ReportData,
    SweepRow,
)
from .noise import noise_line

_VERDICT_STYLE = {"FASTER": "bold green", "SLOWER": "bold red", "UNDECIDED": "bold yellow",
                  "NO DIFFERENCE": "bold", "VALID": "bold green", "NOT VALID": "bold red",
                  "RECORD": "bold green"}
PROBLEM_CHARS = 160
_KIND = {Kind.ABBA: "ABBA experiment", Kind.SINGLE: "single-leg experiment", Kind.LEG: "one leg"}


# --------------------------------------------------------------------------- shared sentences


def headline_text(d: ReportData) -> str:
    h = d.headline
    bound = f", quantisation ±{h.quantisation_bound_pct:.2f} %" if h.quantisation_bound_pct else ""
    leg = f"leg {h.leg} ({h.arm}), " if h.leg else ""
    return f"{fmt.num(h.value)} tok/s  {leg}{h.convention} {h.formula}{bound}{sweep_headline_note(d)}"


def sweep_headline_note(d: ReportData) -> str:
    """A sweep's record takes its headline from the best arm's legs; with no arm claimed
    best it is the lowest leg of any swept arm, which says nothing about the best setting."""
    if not d.sweep or any(r.best for r in d.sweep):
        return ""
    return "; no arm is claimed best, so this is the lowest leg of any swept arm (see the sweep table)"


def kind_text(d: ReportData) -> str:
    """'ABBA experiment' (v1, unchanged), 'ABBA experiment, 2 blocks', 'A/A experiment, 1 block'."""
    spec = named_spec(d.design)
    if spec is None:
        return _KIND[d.kind]
    k = d.blocks or 1
    return f"{spec.title}, {k} block{'s' if k != 1 else ''}"


def interval_text(a: Analysis) -> str:
    """The v2 ratio and its interval, or why there is none."""
    if a.ratio is None or a.ci_low is None or a.ci_high is None:
        return f"no interval: {a.reason}"
    claim = "; A/A: no speed claim" if a.no_claim else ""
    return (f"{a.label} {a.ratio:.4f} ({fmt.pct(100 * (a.ratio - 1))}), "
            f"{100 * a.confidence:.0f} % CI [{a.ci_low:.4f}, {a.ci_high:.4f}], leg-level t, "
            f"df {a.df}{claim}")


def record_interval_text(a: Analysis) -> str | None:
    """The interval the record gate judges, at its own higher confidence (none for an A/A
    design, which claims nothing)."""
    if a.no_claim or a.record_confidence is None or a.record_ci_low is None \
            or a.record_ci_high is None:
        return None
    return (f"{a.record_verdict} at {100 * a.record_confidence:g} %: CI "
            f"[{a.record_ci_low:.4f}, {a.record_ci_high:.4f}] (the record gate needs FASTER "
            "at this confidence)")


def noise_text(a: Analysis) -> str:
    """The noise the v2 interval rests on: between legs (what a claim must beat) and rows."""
    return (f"between legs sd {fmt.sd_pct(a.leg_noise_sd_pct)} (df {a.leg_noise_df}), "
            f"rows sd {fmt.sd_pct(a.row_noise_sd_pct)} (df {a.row_noise_df}); "
            f"{a.legs} legs in {a.blocks} block{'s' if a.blocks != 1 else ''}, "
            f"{a.rows_used} rows rated in every leg")


def power_text(p: Power) -> str:
    """The preregistered power at the planned blocks, and the blocks 90 % would need."""
    blocks = f"{p.blocks} block{'s' if p.blocks != 1 else ''}"
    entry = p.min_effect
    if entry is None:
        return f"at {blocks}: " + ", ".join(f"+{e.effect_pct:g} % {100 * e.power:.1f} %"
                                            for e in p.entries)
    target = f"{100 * p.target_power:.0f} %"
    need = (f"{target} needs {entry.blocks_for_target} block"
            f"{'s' if entry.blocks_for_target != 1 else ''}" if entry.blocks_for_target
            else f"{target} is not reached within 50 blocks")
    return (f"+{entry.effect_pct:g} % effect: power {100 * entry.power:.1f} % at {blocks}; "
            f"{need} (noise sd: legs {p.sd_leg_pct:.2f} %, rows {p.sd_row_pct:.2f} %)")


def verdict_text(d: ReportData) -> str:
    b = d.bootstrap
    if b is None:
        if d.analysis is not None:
            return f"{d.verdict}  {interval_text(d.analysis)}"
        return d.verdict
    return (f"{d.verdict}  candidate/control {b.ratio:.4f} ({fmt.pct(100 * (b.ratio - 1))}), "
            f"{100 * b.confidence:.0f} % CI [{b.ci_low:.4f}, {b.ci_high:.4f}]")


def v2_lines(d: ReportData) -> list[tuple[str, str]]:
    """What a v2 record adds below its verdict: the noise, the design, the power (none
    for v1, whose report stays as it was)."""
    spec = named_spec(d.design)
    if spec is None:
        return []
    out = []
    if d.analysis is not None and d.analysis.ratio is not None:
        record = record_interval_text(d.analysis)
        if record is not None:
            out.append(("for record", record))
        out.append(("noise", noise_text(d.analysis)))
        noise = noise_line(d.noise)
        if noise is not None:
            out.append(("tracks", noise.removeprefix("legs track ")))
    out.append(("design", spec.describe(d.blocks)))
    if d.sequential is not None:
        out.append(("sequential", d.sequential))
    if d.sequential_estimate is not None:
        out.append(("estimate at the stop", d.sequential_estimate))
    out.append(("power", power_text(d.power) if d.power is not None
                else "none preregistered (the plan declared no min_effect_pct)"))
    return out


def pairs_what(d: ReportData) -> str:
    """An A/A design pairs legs of one arm: by position, not by treatment."""
    spec = named_spec(d.design)
    return "candidate vs control" if spec is None else spec.pairs_what


def record_text(d: ReportData) -> str | None:
    g = d.record_gate
    if g is None:
        return None
    if g.passed:
        return f"PASS ({g.status})"
    return "no record" + (": " + "; ".join(g.reasons) if g.reasons else f" ({g.status})")


def gates_text(d: ReportData) -> str:
    """Every leg's gates in one line: what did not pass, or that everything did."""
    cells = [(leg.name, g) for leg in d.legs for g in leg.gates]
    if not cells:
        return "no gates recorded"
    names = {g.name for _, g in cells}
    passed = sum(1 for _, g in cells if g.status is GateStatus.PASS)
    head = (f"{len(names)} gates x {len(d.legs)} leg{'s' if len(d.legs) > 1 else ''}: "
            f"{passed}/{len(cells)} pass")
    issues = []
    for name in sorted(names, key=lambda n: [g.name for _, g in cells].index(n)):
        bad = [(leg, g) for leg, g in cells if g.name == name and g.status is not GateStatus.PASS]
        if bad:
            where = ", ".join(f"{leg} {g.status}" + (f" {g.count}" if g.count else "") for leg, g in bad)
            issues.append(f"{fmt.gate_label(name)}: {where}")
    valid = [leg.name for leg in d.legs if leg.valid]
    every = "the leg is valid" if len(d.legs) == 1 else "every leg valid"
    state = (every if len(valid) == len(d.legs)
             else f"NOT VALID: {', '.join(leg.name for leg in d.legs if not leg.valid)}")
    extra = [f"{fmt.gate_label(g.name)} {g.status}" + (f" {g.count}" if g.count else "")
             for g in d.experiment_gates]
    return "; ".join([state, head, *issues, *extra])


def evidence_text(d: ReportData) -> str:
    v = d.verification
    if not v.checked:
        return v.note
    signer = f"; {v.signer}" if v.signer else ""
    if v.ok:
        return ("verified: every file matches the signed manifest; every figure recomputes"
                + signer)
    first = v.problems[0] if v.problems else ""
    if len(first) > PROBLEM_CHARS:
        first = first[:PROBLEM_CHARS - 1] + "…"
    return f"NOT verified ({v.total} problems; tokrecord verify lists them): {first}{signer}"


_BY_IDS = re.compile(r"(\d+)/(\d+) by ids(?:, (\d+) by text)?")


def exact_cell(gate: GateView | None) -> str:
    """The teacher-exact count as what it claims: "13/13" only when every row was
    compared by token ids; "13/13, 1 by text" (or "13/13 by text") when not."""
    if gate is None:
        return fmt.DASH
    if gate.status is not GateStatus.PASS:
        return str(gate.status)
    count = gate.count or str(gate.status)
    found = _BY_IDS.search(gate.reason)
    if found:  # leg gates v2
        return count if found.group(3) is None else f"{count}, {found.group(3)} by text"
    if gate.reason.endswith(" text"):  # v1: "every row matches the teacher text"
        return f"{count} by text"
    if gate.reason.endswith("text/token_ids"):
        return f"{count}, some by text"
    return count


def _leg_cells(leg: LegView) -> list[str]:
    s = leg.speculative
    exact = next((g for g in leg.gates if g.name == TEACHER_EXACT), None)
    exact_text = exact_cell(exact)
    passed = sum(1 for g in leg.gates if g.status is GateStatus.PASS)
    return [leg.name, leg.arm, fmt.num(leg.tok_s), fmt.num(leg.p10), fmt.num(leg.ttft_ms, 1),
            fmt.num(s.acceptance_rate, 3) if s else fmt.DASH,
            fmt.num(s.emitted_per_cycle, 2) if s else fmt.DASH, exact_text,
            f"{passed}/{len(leg.gates)}", str(leg.stalled_rows), "yes" if leg.valid else "NO"]


STALLS_EXPLAINED = f"rows with {ROW_FLAGS['stall']}"
LEG_COLUMNS = ("leg", "arm", "tok/s", "p10", "TTFT ms", "accept", "tok/cycle", "exact", "gates",
               "stalls", "valid")
# What a narrow terminal keeps (no column is ever cut short: a cut number misleads).
COMPACT_COLUMNS = ("leg", "arm", "tok/s", "TTFT ms", "accept", "exact", "valid")
COMPACT_BELOW = 92
_NUMERIC = {"tok/s", "p10", "TTFT ms", "accept", "tok/cycle", "exact", "gates", "stalls"}


# --------------------------------------------------------------------------- terminal


def terminal_renderables(d: ReportData, width: int = 100) -> list[RenderableType]:
    title = Text.assemble(("tokrecord report: ", "bold"), (d.title, "bold"),
                          f" — {kind_text(d)}" + (f", {d.date}" if d.date else "")
                          + f", status {d.status}")
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column()
    facts.add_row("headline", escape(headline_text(d)))
    control = control_figure(d)
    if control is not None:
        facts.add_row("control", escape(control_text(control)))
    facts.add_row("verdict", Text(verdict_text(d), style=_VERDICT_STYLE.get(d.verdict, "bold")))
    for label, line in v2_lines(d):
        facts.add_row(label, escape(line))
    record = record_text(d)
    if record is not None:
        facts.add_row("record", Text(record, style="green" if d.record_gate and d.record_gate.passed
                                     else "red"))
    facts.add_row("gates", escape(gates_text(d)))
    v = d.verification
    for line in d.submissions:
        facts.add_row("submission", escape(line))
    facts.add_row("evidence", Text(evidence_text(d),
                                   style="green" if v.ok else ("red" if v.checked else "yellow")))
    legs = Table(box=None, padding=(0, 1), title="legs", title_justify="left", title_style="bold")
    columns = LEG_COLUMNS if width >= COMPACT_BELOW else COMPACT_COLUMNS
    for col in columns:
        legs.add_column(col, justify="right" if col in _NUMERIC else "left", no_wrap=True)
    for leg in d.legs:
        cells = dict(zip(LEG_COLUMNS, _leg_cells(leg), strict=True))
        cells["valid"] = "[green]yes[/]" if leg.valid else "[bold red]NO[/]"
        legs.add_row(*(cells[col] for col in columns))
    if "stalls" in columns:
        legs.caption = f"stalls: {STALLS_EXPLAINED}"
        legs.caption_justify = "left"
    out: list[RenderableType] = [title, facts, legs]
    if d.pairs:
        pairs = Table(box=None, padding=(0, 1), title=f"pairs ({pairs_what(d)})",
                      title_justify="left", title_style="bold")
        for col in ("pair", "headline Δ", "paired median Δ", "row wins", "pass"):
            pairs.add_column(col, justify="left" if col in ("pair", "pass") else "right",
                             no_wrap=col != "pass")
        for p in d.pairs:
            verdict = "[green]pass[/]" if p.passed else "[red]fail[/]"
            pairs.add_row(p.name, fmt.pct(p.headline_delta_pct), fmt.pct(p.paired_median_delta_pct),
                          p.row_wins, verdict)
        out.append(pairs)
    if d.sweep:
        out.append(sweep_table(d.sweep, d.sweep_statement))
    if d.components:
        comps = Table(box=None, padding=(0, 1), title="component evidence (profiler traces)",
                      title_justify="left", title_style="bold")
        for col in COMPONENT_COLUMNS:
            comps.add_column(col, no_wrap=col in ("component", "launches per cycle"))
        for c in d.components:
            comps.add_row(*(escape(x) for x in component_cells(c)))
        out.append(comps)
    return out


def sweep_table(rows: Sequence[SweepRow], statement: str | None) -> Table:
    """A sweep's arms: speed, simultaneous interval against control, exactness, and the
    engine's and telemetry's per-arm figures; the statement of what is claimed below."""
    table = Table(box=None, padding=(0, 1), title="sweep: each arm against control",
                  title_justify="left", title_style="bold")
    for col in SWEEP_COLUMNS:
        table.add_column(col, justify="right" if col in ("tok/s", "acceptance", "tokens/cycle",
                                                         "J/token") else "left")
    for r in rows:
        cells = [escape(terminal_safe(c)) for c in sweep_cells(r)]
        if not r.exact:
            cells[4] = "[bold red]NOT exact[/]"
        table.add_row(*cells)
    if statement:
        table.caption = escape(terminal_safe(statement))
        table.caption_justify = "left"
    return table


COMPONENT_COLUMNS = ("component", "launches per cycle", "kernel time saved per cycle",
                     "isolated saving", "exact", "gate")


def component_cells(c: ComponentView) -> list[str]:
    return [c.name, c.launches, c.saving + (f" over {c.devices} devices" if c.devices > 1
                                            else ""), c.isolated, c.exact, c.gate]


def print_report(console: Console, d: ReportData) -> None:
    console.print(Group(*terminal_renderables(d, console.width)))


def render_terminal(d: ReportData, width: int = 100) -> str:
    """The terminal summary as plain text at a fixed width (no colour): the golden form."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      highlight=False, emoji=False, legacy_windows=False)
    print_report(console, d)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


# --------------------------------------------------------------------------- markdown


def _md(text: object) -> str:
    """Safe inside a markdown table cell, and as plain text anywhere in a line: values
    come from evidence that may be a stranger's, so no raw HTML (`<script>`, `<img
    onerror>`), no link or image syntax, no code span and no control character survive."""
    out = terminal_safe(str(text)).replace("\\", "\\\\").replace("\n", " ")
    for char, escaped in _MD_ESCAPES:
        out = out.replace(char, escaped)
    return out


def _code(text: object) -> str:
    """A value as a code span: markdown reads nothing inside one (no HTML, no links), so
    only a backtick, which would close it, and line breaks are taken out."""
    return "`" + terminal_safe(str(text)).replace("`", "'").replace("\n", " ") + "`"


# `&` first, so the entities below are not escaped again.
# A link or an image needs `](`: breaking that pair is enough (a lone bracket is text,
# and a CI reads "[1.02, 1.11]").
_MD_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("](", "]\\("),
               ("`", "\\`"))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    lines = ["| " + " | ".join(_md(h) for h in header) + " |",
             "| " + " | ".join("---:" if i in right else "---" for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def _md_interval(a: Analysis) -> str:
    if a.ratio is None or a.ci_low is None or a.ci_high is None:
        return f"no interval: {a.reason}"
    claim = "; A/A: the same arm in every leg, no speed claim" if a.no_claim else ""
    return (f"{a.label} {a.ratio:.4f} ({fmt.pct(100 * (a.ratio - 1))}), "
            f"{100 * a.confidence:.0f} % CI [{a.ci_low:.4f}, {a.ci_high:.4f}] (leg-level t "
            f"interval, df {a.df}, equivalence ±{a.equivalence_pct:g} %){claim}")


def render_markdown(d: ReportData) -> str:
    """A summary for a pull request or a forum post (GitHub-flavoured markdown)."""
    out = [f"## tokrecord report: {_md(d.title)}", ""]
    sub = [_md(kind_text(d))] + ([_md(d.date)] if d.date else []) + [f"status {_code(d.status)}"]
    out += [" · ".join(sub), ""]
    h = d.headline
    bound = f", ±{h.quantisation_bound_pct:.2f} % per-token quantisation" if h.quantisation_bound_pct else ""
    out.append(f"- **Headline: {fmt.num(h.value)} tok/s**"
               + (f" (leg {_md(h.leg)}, {_md(h.arm)})" if h.leg else "")
               + f" — {_md(h.convention)} {_code(h.formula)}{bound}")
    control = control_figure(d)
    if control is not None:
        out.append(f"- **Control: {fmt.num(control.value)} tok/s** (leg {_md(control.leg)}, the lower "
                   "control leg)" + (f"; the headline is {fmt.pct(control.delta_pct)} on it"
                                     if control.delta_pct is not None else ""))
    out.append(f"- **Verdict: {d.verdict}**" + (
        f" — candidate/control {d.bootstrap.ratio:.4f} ({fmt.pct(100 * (d.bootstrap.ratio - 1))}), "
        f"{100 * d.bootstrap.confidence:.0f} % CI [{d.bootstrap.ci_low:.4f}, {d.bootstrap.ci_high:.4f}] "
        f"(paired bootstrap, {d.bootstrap.samples} samples, equivalence "
        f"±{d.bootstrap.equivalence_pct:g} %)" if d.bootstrap else
        f" — {_md(_md_interval(d.analysis))}" if d.analysis else ""))
    out += [f"- **{_md(label.capitalize())}:** {_md(line)}" for label, line in v2_lines(d)]
    record = record_text(d)
    if record is not None:
        out.append(f"- **Record gate:** {_md(record)}")
    out.append(f"- **Gates:** {_md(gates_text(d))}")
    out += [f"- **Submission:** {_md(line)}" for line in d.submissions]
    out.append(f"- **Evidence:** {_md(evidence_text(d))}")
    out += ["", "### Legs", ""]
    out += _md_table(LEG_COLUMNS, [_leg_cells(leg) for leg in d.legs],
                     {i for i, c in enumerate(LEG_COLUMNS) if c in _NUMERIC})
    if d.pairs:
        out += ["", f"### Pairs ({_md(pairs_what(d))})", ""]
        out += _md_table(
            ("pair", "headline Δ", "paired median Δ", "row wins", "pass", "failed criteria"),
            [(p.name, fmt.pct(p.headline_delta_pct), fmt.pct(p.paired_median_delta_pct), p.row_wins,
              "pass" if p.passed else "fail", "; ".join(p.failed_criteria)) for p in d.pairs],
            {1, 2, 3})
    if d.sweep:
        out += ["", "### Sweep: each arm against control", ""]
        if d.sweep_statement:
            out += [_md(d.sweep_statement), ""]
        out += _md_table(SWEEP_COLUMNS, [sweep_cells(r) for r in d.sweep], {1, 5, 6, 7})
    if d.components:
        out += ["", "### Component evidence (profiler traces)", ""]
        out += _md_table(COMPONENT_COLUMNS, [[_md(x) for x in component_cells(c)]
                                             for c in d.components], set())
    names: list[str] = []
    for leg in d.legs:
        names += [g.name for g in leg.gates if g.name not in names]
    if names:
        cells = sum(len(leg.gates) for leg in d.legs)
        passed = sum(1 for leg in d.legs for g in leg.gates if g.status is GateStatus.PASS)
        out += ["", f"<details><summary>Quality gates: {passed}/{cells} pass</summary>", ""]
        rows = []
        for name in names:
            row = [fmt.gate_label(name)]
            for leg in d.legs:
                g = next((x for x in leg.gates if x.name == name), None)
                row.append(fmt.DASH if g is None else g.status + (f" {g.count}" if g.count else ""))
            rows.append(row)
        out += _md_table(("gate", *[leg.name for leg in d.legs]), rows, set())
        out += ["", "</details>"]
    warnings = [(leg.name, w) for leg in d.legs for w in leg.warnings]
    if warnings:
        out += ["", f"<details><summary>Warnings ({len(warnings)})</summary>", ""]
        out += [f"- {_md(leg)}: {_md(w)}" for leg, w in warnings]
        out += ["", "</details>"]
    ident = {f.label: f.value for f in d.identity}
    bits = [f"{label} {_code(ident[label])}" for label in ("tokrecord", "plan sha256", "signing key")
            if label in ident]
    if bits:
        out += ["", "<sub>" + " · ".join(bits) + "</sub>"]
    return "\n".join(out) + "\n"
