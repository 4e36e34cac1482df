"""Number and label formatting shared by every renderer (so the three agree)."""

from __future__ import annotations

from tokrecord.experiment.design import design_spec

DASH = "—"


def num(value: float | None, digits: int = 2) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def pct(value: float | None, digits: int = 3) -> str:
    """A signed percentage: +1.234 %."""
    return DASH if value is None else f"{value:+.{digits}f} %"


def share(part: int, whole: int) -> str:
    return DASH if whole <= 0 else f"{100 * part / whole:.1f} %"


def yes_no(value: bool | None) -> str:
    return DASH if value is None else ("yes" if value else "no")


def gate_label(name: str) -> str:
    """gates.json keeps snake_case names; people read words."""
    return name.replace("_", " ")


def plain(value: object) -> str:
    """A record value as text: booleans as yes/no, None as a dash."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value)


def short_sha(value: str | None, n: int = 12) -> str:
    return DASH if not value else value[:n]


def sd_pct(value: float | None, digits: int = 3) -> str:
    """An unsigned spread in percent: 1.234 %."""
    return DASH if value is None else f"{value:.{digits}f} %"


def design(kind: str, blocks: int | None) -> str:
    """'ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs': the design as preregistered, in its
    spec's words (experiment.design)."""
    return design_spec(kind).describe(blocks)
