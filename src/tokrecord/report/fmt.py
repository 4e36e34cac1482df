"""Number and label formatting shared by every renderer (so the three agree)."""

from __future__ import annotations

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
    """'ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs': the design as preregistered."""
    k = blocks or 1
    if kind == "sweep":
        return (f"sweep, {k} block{'s' if k != 1 else ''}, every arm once per block in "
                "Williams order (balanced for position and carry-over)")
    patterns = ", ".join("ABBA" if b % 2 else "BAAB" for b in range(1, min(k, 2) + 1))
    more = ", ..." if k > 2 else ""
    name = {"abba": "ABBA", "aa": "A/A"}.get(kind, kind)
    what = " (one arm in every leg: the noise floor, no speed claim)" if kind == "aa" else ""
    return (f"{name}, {k} block{'s' if k != 1 else ''} ({patterns}{more}): {4 * k} legs, "
            f"{2 * k} pairs{what}")
