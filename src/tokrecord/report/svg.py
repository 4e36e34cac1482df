"""Small hand-written SVG charts for the HTML report.

Why not matplotlib: it would be the harness's largest dependency (with pillow,
fonttools, kiwisolver, contourpy…) for a handful of line, dot and bar charts, and
its SVG output embeds glyph outlines, generated ids and a creation date unless
tamed, so the report would be larger and not byte-stable for a given record.
These charts are plain <path>, <circle>, <rect> and <text> elements in the page's
own font: a few kilobytes each, identical for identical data, readable as text,
and nothing to install. Hover titles (<title>) give exact values without script.

Everything here is pure: numbers in, markup out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

FONT = 12
MUTED = "#6b7280"
GRID = "#e5e7eb"
AXIS = "#9ca3af"


def n(value: float) -> str:
    """A coordinate: one decimal, no trailing zero (small files, stable text)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def tick_label(value: float) -> str:
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    if a >= 100 and not float(value).is_integer():
        # A narrow range far from zero (an A/A experiment's legs: 1,999.7..2,000.5):
        # as many decimals as the tick needs, or every tick would read the same.
        digits = next((d for d in (1, 2, 3) if abs(value - round(value, d)) < 1e-9), 3)
        return f"{value:,.{digits}f}"
    if a >= 100 or a == 0 or float(value).is_integer():
        return f"{value:,.0f}"
    if a >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """1-2-5 ticks covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks, k = [], 0
    while True:
        v = start + k * step
        if v > hi + step * 1e-9:
            break
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 12))
        k += 1
    return ticks


def nice_range(lo: float, hi: float, count: int = 5, zero: bool = False) -> tuple[float, float]:
    """An axis range that starts and ends on ticks."""
    if zero:
        lo = min(lo, 0.0)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    ticks = nice_ticks(lo, hi, count)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else (hi - lo)
    return (min(ticks[0], math.floor(lo / step) * step), max(ticks[-1], math.ceil(hi / step) * step))


def log_ticks(lo: float, hi: float) -> list[float]:
    """Decades; with 2 and 5 between them when the range spans few decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1, 2, 5) if b - a <= 3 else (1,)
    out = [m * 10.0**e for e in range(a, b + 1) for m in mults]
    return [v for v in out if lo * 0.999 <= v <= hi * 1.001]


@dataclass(frozen=True)
class Scale:
    lo: float
    hi: float
    a: float  # pixel of lo
    b: float  # pixel of hi
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo) if self.hi != self.lo else 0.5
        return self.a + f * (self.b - self.a)

    def ticks(self, count: int = 5) -> list[float]:
        return log_ticks(self.lo, self.hi) if self.log else nice_ticks(self.lo, self.hi, count)


@dataclass
class Chart:
    """One plot area with axes; elements are appended as markup strings."""

    title: str
    width: int = 900
    height: int = 320
    left: int = 64
    right: int = 16
    top: int = 28
    bottom: int = 44
    body: list[str] = field(default_factory=list)
    overlay: list[str] = field(default_factory=list)
    x: Scale | None = None
    y: Scale | None = None

    @property
    def x0(self) -> float:
        return float(self.left)

    @property
    def x1(self) -> float:
        return float(self.width - self.right)

    @property
    def y0(self) -> float:  # bottom of the plot area (pixels grow downwards)
        return float(self.height - self.bottom)

    @property
    def y1(self) -> float:
        return float(self.top)

    def scales(self, x: tuple[float, float], y: tuple[float, float], *, xlog: bool = False,
               ylog: bool = False) -> None:
        self.x = Scale(x[0], x[1], self.x0, self.x1, xlog)
        self.y = Scale(y[0], y[1], self.y0, self.y1, ylog)

    def sx(self, v: float) -> float:
        assert self.x is not None
        return self.x(v)

    def sy(self, v: float) -> float:
        assert self.y is not None
        return self.y(v)

    # ------------------------------------------------------------------ axes

    def axes(self, xlabel: str, ylabel: str, *, xticks: Sequence[float] | None = None,
             xtick_labels: Sequence[str] | None = None, yticks: Sequence[float] | None = None,
             ygrid: bool = True) -> None:
        assert self.x is not None and self.y is not None
        parts = []
        ys = list(yticks) if yticks is not None else self.y.ticks()
        for v in ys:
            py = n(self.sy(v))
            if ygrid:
                parts.append(f'<line x1="{n(self.x0)}" x2="{n(self.x1)}" y1="{py}" y2="{py}" '
                             f'stroke="{GRID}"/>')
            parts.append(f'<text x="{n(self.x0 - 6)}" y="{py}" dy="0.32em" text-anchor="end" '
                         f'fill="{MUTED}">{escape(tick_label(v))}</text>')
        xs = list(xticks) if xticks is not None else self.x.ticks(8)
        labels = list(xtick_labels) if xtick_labels is not None else [tick_label(v) for v in xs]
        for v, label in zip(xs, labels, strict=True):
            px = n(self.sx(v))
            parts.append(f'<line x1="{px}" x2="{px}" y1="{n(self.y0)}" y2="{n(self.y0 + 4)}" '
                         f'stroke="{AXIS}"/>')
            parts.append(f'<text x="{px}" y="{n(self.y0 + 16)}" text-anchor="middle" '
                         f'fill="{MUTED}">{escape(label)}</text>')
        parts.append(f'<line x1="{n(self.x0)}" x2="{n(self.x1)}" y1="{n(self.y0)}" y2="{n(self.y0)}" '
                     f'stroke="{AXIS}"/>')
        parts.append(f'<line x1="{n(self.x0)}" x2="{n(self.x0)}" y1="{n(self.y1)}" y2="{n(self.y0)}" '
                     f'stroke="{AXIS}"/>')
        parts.append(f'<text x="{n((self.x0 + self.x1) / 2)}" y="{n(self.height - 8)}" '
                     f'text-anchor="middle" fill="{MUTED}">{escape(xlabel)}</text>')
        parts.append(f'<text transform="translate(14 {n((self.y0 + self.y1) / 2)}) rotate(-90)" '
                     f'text-anchor="middle" fill="{MUTED}">{escape(ylabel)}</text>')
        self.body[:0] = parts  # under the data

    # ------------------------------------------------------------------ marks

    def path(self, points: Sequence[tuple[float, float]], color: str, *, width: float = 1.5,
             dash: str | None = None, step: bool = False, title: str | None = None,
             opacity: float | None = None) -> None:
        if not points:
            return
        d = [f"M{n(self.sx(points[0][0]))} {n(self.sy(points[0][1]))}"]
        for x, y in points[1:]:
            px, py = n(self.sx(x)), n(self.sy(y))
            d.append(f"H{px}V{py}" if step else f"L{px} {py}")
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-opacity="{opacity}"' if opacity is not None else ""
        inner = f"<title>{escape(title)}</title>" if title else ""
        self.body.append(f'<path d="{"".join(d)}" fill="none" stroke="{color}" '
                         f'stroke-width="{width}"{extra} stroke-linejoin="round">{inner}</path>')

    def dot(self, x: float, y: float, color: str, *, r: float = 3.5, title: str | None = None,
            hollow: bool = False, opacity: float | None = None) -> None:
        fill = "#fff" if hollow else color
        extra = f' fill-opacity="{opacity}"' if opacity is not None else ""
        inner = f"<title>{escape(title)}</title>" if title else ""
        self.body.append(f'<circle cx="{n(self.sx(x))}" cy="{n(self.sy(y))}" r="{n(r)}" '
                         f'fill="{fill}" stroke="{color}"{extra}>{inner}</circle>')

    def bar(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float, color: str, *,
            title: str | None = None, opacity: float | None = None) -> None:
        px0, px1 = sorted((self.sx(x_lo), self.sx(x_hi)))
        py0, py1 = sorted((self.sy(y_lo), self.sy(y_hi)))
        extra = f' fill-opacity="{opacity}"' if opacity is not None else ""
        inner = f"<title>{escape(title)}</title>" if title else ""
        self.body.append(f'<rect x="{n(px0)}" y="{n(py0)}" width="{n(max(px1 - px0, 0.5))}" '
                         f'height="{n(max(py1 - py0, 0.5))}" fill="{color}"{extra}>{inner}</rect>')

    def xband(self, x_lo: float, x_hi: float, color: str, label: str = "",
              opacity: float = 0.12) -> None:
        px0, px1 = sorted((self.sx(x_lo), self.sx(x_hi)))
        self.body.insert(0, f'<rect x="{n(px0)}" y="{n(self.y1)}" width="{n(max(px1 - px0, 0.5))}" '
                            f'height="{n(self.y0 - self.y1)}" fill="{color}" fill-opacity="{opacity}"/>')
        if label:
            self.overlay.append(f'<text x="{n(px0 + 4)}" y="{n(self.y1 + 12)}" fill="{MUTED}">'
                                f'{escape(label)}</text>')

    def yband(self, y_lo: float, y_hi: float, color: str, label: str = "",
              opacity: float = 0.15) -> None:
        py0, py1 = sorted((self.sy(y_lo), self.sy(y_hi)))
        self.body.insert(0, f'<rect x="{n(self.x0)}" y="{n(py0)}" width="{n(self.x1 - self.x0)}" '
                            f'height="{n(max(py1 - py0, 0.5))}" fill="{color}" '
                            f'fill-opacity="{opacity}"/>')
        if label:
            self.overlay.append(f'<text x="{n(self.x1 - 4)}" y="{n(py0 - 4)}" text-anchor="end" '
                                f'fill="{MUTED}">{escape(label)}</text>')

    def hline(self, y: float, color: str, *, dash: str | None = "4 3", label: str = "",
              width: float = 1.0) -> None:
        py = n(self.sy(y))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.body.append(f'<line x1="{n(self.x0)}" x2="{n(self.x1)}" y1="{py}" y2="{py}" '
                         f'stroke="{color}" stroke-width="{width}"{extra}/>')
        if label:
            self.overlay.append(f'<text x="{n(self.x1 - 4)}" y="{py}" dy="-0.4em" text-anchor="end" '
                                f'fill="{color}">{escape(label)}</text>')

    def vline(self, x: float, color: str, *, dash: str | None = "4 3", label: str = "",
              label_at_bottom: bool = False) -> None:
        px = n(self.sx(x))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.body.append(f'<line x1="{px}" x2="{px}" y1="{n(self.y1)}" y2="{n(self.y0)}" '
                         f'stroke="{color}"{extra}/>')
        if label:
            y = self.y0 - 6 if label_at_bottom else self.y1 + 12
            self.overlay.append(f'<text x="{px}" dx="4" y="{n(y)}" fill="{color}">'
                                f'{escape(label)}</text>')

    def text(self, x: float, y: float, label: str, *, color: str = MUTED, anchor: str = "middle",
             dy: str = "0", bold: bool = False) -> None:
        weight = ' font-weight="600"' if bold else ""
        self.overlay.append(f'<text x="{n(self.sx(x))}" y="{n(self.sy(y))}" dy="{dy}" '
                            f'text-anchor="{anchor}" fill="{color}"{weight}>{escape(label)}</text>')

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """Labels with colour swatches along the top edge, right-aligned."""
        x = self.x1
        parts = []
        for label, color in reversed(items):
            w = 7 * len(label) + 22
            x -= w
            parts.append(f'<rect x="{n(x)}" y="{n(self.top - 18)}" width="10" height="10" '
                         f'fill="{color}"/><text x="{n(x + 14)}" y="{n(self.top - 9)}">'
                         f'{escape(label)}</text>')
        self.overlay.extend(parts)

    def render(self, css_class: str = "chart") -> str:
        return (f'<svg class="{css_class}" role="img" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}" font-size="{FONT}" '
                f'xmlns="http://www.w3.org/2000/svg"><title>{escape(self.title)}</title>'
                + "".join(self.body) + "".join(self.overlay) + "</svg>")
