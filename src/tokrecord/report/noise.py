"""The report's noise panel (issue 33): each leg's figure in run order, coloured by arm,
beside the covariate that tracks it best; and the one line the terminal and markdown
reports give it. Pure: a NoiseDiagnostic in, markup or text out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from tokrecord.experiment.noise import NoiseDiagnostic, NoiseLeg, best_line

from . import fmt
from .svg import AXIS, FONT, GRID, MUTED, n, nice_ticks, tick_label

ARM_COLOURS = {"control": "#2563eb", "candidate": "#ea580c"}
OTHER = "#7c3aed"
COVARIATE = "#9ca3af"


def noise_line(d: NoiseDiagnostic | None) -> str | None:
    return None if d is None or not d.legs else best_line(d)


def _y(v: float, lo: float, hi: float, top: float, height: float) -> float:
    return top + height * (1 - (v - lo) / (hi - lo)) if hi > lo else top + height / 2


@dataclass(frozen=True)
class _Frame:
    """The plot area of the noise chart, and where leg i sits on it."""

    left: int
    top: int
    w: int
    h: int
    n_legs: int

    def x(self, i: int) -> float:
        step = self.w / max(self.n_legs - 1, 1)
        return self.left + (i * step if self.n_legs > 1 else self.w / 2)


def noise_svg(d: NoiseDiagnostic, width: int = 760, height: int = 260) -> str:
    """Leg figures (left axis, tok/s) in run order, coloured by arm; the best covariate
    (right axis, its own unit) as grey hollow marks on the same legs."""
    legs = d.legs
    left, right, top, bottom = 64, 64, 28, 40
    frame = _Frame(left, top, width - left - right, height - top - bottom, len(legs))
    w, h = frame.w, frame.h
    figs = [leg.tok_s for leg in legs]
    lo, hi = min(figs), max(figs)
    pad = (hi - lo) * 0.08 or max(hi * 0.01, 1.0)
    ticks = nice_ticks(lo - pad, hi + pad)
    lo, hi = min(ticks[0], lo - pad), max(ticks[-1], hi + pad)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="leg figures in run order" font-size="{FONT}">']
    for t in ticks:
        y = _y(t, lo, hi, top, h)
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{n(y)}" y2="{n(y)}" stroke="{GRID}"/>'
                   f'<text x="{left - 6}" y="{n(y + 4)}" text-anchor="end" fill="{MUTED}">'
                   f'{escape(tick_label(t))}</text>')
    out.append(f'<text x="{left}" y="{top - 10}" fill="{MUTED}">tok/s (headline), legs in run '
               f'order</text>')
    out += _covariate_marks(d, frame)
    path = " ".join(f"{'M' if i == 0 else 'L'}{n(frame.x(i))},{n(_y(f, lo, hi, top, h))}"
                    for i, f in enumerate(figs))
    out.append(f'<path d="{path}" fill="none" stroke="{AXIS}"/>')
    out += _leg_marks(legs, frame, lo, hi)
    out += _arm_legend(legs, left, height)
    out.append("</svg>")
    return "".join(out)


def _covariate_marks(d: NoiseDiagnostic, frame: _Frame) -> list[str]:
    """The best covariate on its own right axis: ticks, label, a dashed line and hollow
    marks (nothing when no leg has it)."""
    legs, best = d.legs, d.best or ""
    left, top, w, h = frame.left, frame.top, frame.w, frame.h
    out: list[str] = []
    cov = None
    if best:
        vals = [(i, leg.covariates.values().get(best)) for i, leg in enumerate(legs)
                if leg.covariates is not None]
        cov = [(i, v) for i, v in vals if v is not None]
    if not cov:
        return out
    clo, chi = min(v for _, v in cov), max(v for _, v in cov)
    cpad = (chi - clo) * 0.08 or max(abs(chi) * 0.01, 1.0)
    clo, chi = clo - cpad, chi + cpad
    for t in nice_ticks(clo, chi, 4):
        if clo <= t <= chi:
            y = _y(t, clo, chi, top, h)
            out.append(f'<text x="{left + w + 6}" y="{n(y + 4)}" fill="{COVARIATE}">'
                       f'{escape(tick_label(t))}</text>')
    out.append(f'<text x="{left + w}" y="{top - 10}" text-anchor="end" fill="{COVARIATE}">'
               f'{escape(best)} (right axis)</text>')
    path = " ".join(f"{'M' if k == 0 else 'L'}{n(frame.x(i))},{n(_y(v, clo, chi, top, h))}"
                    for k, (i, v) in enumerate(cov))
    out.append(f'<path d="{path}" fill="none" stroke="{COVARIATE}" stroke-dasharray="3 3"/>')
    for i, v in cov:
        out.append(f'<rect x="{n(frame.x(i) - 3.5)}" y="{n(_y(v, clo, chi, top, h) - 3.5)}" '
                   f'width="7" height="7" fill="none" stroke="{COVARIATE}">'
                   f'<title>{escape(legs[i].name)}: {escape(best)} {v:.4g}</title></rect>')
    return out


def _leg_marks(legs: Sequence[NoiseLeg], frame: _Frame, lo: float, hi: float) -> list[str]:
    out: list[str] = []
    for i, leg in enumerate(legs):
        colour = ARM_COLOURS.get(leg.arm, OTHER)
        y = _y(leg.tok_s, lo, hi, frame.top, frame.h)
        out.append(f'<circle cx="{n(frame.x(i))}" cy="{n(y)}" '
                   f'r="4.5" fill="{colour}"><title>{escape(leg.name)} ({escape(leg.arm)}): '
                   f'{leg.tok_s:,.1f} tok/s, {leg.deviation_pct:+.2f} % from its arm</title>'
                   f'</circle>')
        if len(legs) <= 40:
            out.append(f'<text x="{n(frame.x(i))}" y="{frame.top + frame.h + 16}" '
                       f'text-anchor="middle" fill="{MUTED}">{escape(leg.name)}</text>')
    return out


def _arm_legend(legs: Sequence[NoiseLeg], left: int, height: int) -> list[str]:
    out: list[str] = []
    lx = left
    for arm in dict.fromkeys(leg.arm for leg in legs):
        out.append(f'<circle cx="{lx + 5}" cy="{height - 8}" r="4.5" '
                   f'fill="{ARM_COLOURS.get(arm, OTHER)}"/>'
                   f'<text x="{lx + 14}" y="{height - 4}" fill="{MUTED}">{escape(arm)}</text>')
        lx += 24 + 8 * len(arm)
    return out


def noise_section(d: NoiseDiagnostic | None) -> str:
    """The HTML section: the chart, the one line, the covariates' table, the note."""
    head = '<section id="noise"><h2>Noise</h2>'
    if d is None or not d.legs:
        return (head + '<p class="note">No noise diagnostic: a single leg, or no leg figure.'
                '</p></section>')
    line = escape(best_line(d))
    rows = []
    for f in d.covariates:
        r = fmt.DASH if f.r is None else f"{f.r:+.2f}"
        share = fmt.DASH if f.share_explained is None else f"{100 * f.share_explained:.0f} %"
        rows.append(f"<tr><td>{escape(f.description)}</td><td>{escape(f.name)}</td>"
                    f'<td class="num">{f.legs}</td><td class="num">{f.df}</td>'
                    f'<td class="num">{r}</td>'
                    f'<td class="num">{share}</td>'
                    f"<td>{'yes' if f.treatment_can_move else 'no'}</td></tr>")
    table = ("<table><thead><tr><th>covariate</th><th>key</th><th>legs</th><th>df</th><th>r</th>"
             "<th>leg variance explained</th><th>can the treatment move it</th></tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table>")
    adj = (fmt.DASH if d.adjacent_r is None else f"{d.adjacent_r:+.2f} over {d.adjacent_pairs} pairs")
    eps = "; ".join(f"{' '.join(e.legs)} {e.direction} ({e.mean_deviation_pct:+.1f} %)"
                    for e in d.episodes) or "none"
    sd = fmt.DASH if d.residual_sd_pct is None else f"{d.residual_sd_pct:.2f} %"
    sources = sorted({leg.covariates.source for leg in d.legs if leg.covariates is not None})
    return (head + f"<p><b>{line}</b></p>" + noise_svg(d)
            + f"<p>Within-arm leg sd {sd}; adjacent legs r {escape(adj)}; episodes (two or "
            f"more adjacent legs at least one sd off the same way): {escape(eps)}. Covariates "
            f"from {escape(', '.join(sources) or 'nothing')}.</p>" + table
            + f'<p class="note">{escape(d.note)}.</p></section>')
