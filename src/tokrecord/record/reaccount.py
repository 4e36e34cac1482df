"""Re-accounting a sealed record's headline in another rate convention.

DESIGN.md defines three conventions over the same headline window (conventional,
legacy inclusive-events, chunk-aware). A record publishes one; re-accounting states
what the same rows give in another, with the margins the record compares against
(goal, prior approved, prior best exact), and the disposition its owner gives.

Pure: the caller passes each leg's row metrics, recomputed from the raw events the
way `tokrecord verify` does, and the record's references; this module returns the
figures in both conventions and the addendum payload. `tokrecord reaccount` reads
the directory and seals the payload as an addendum; the record itself never changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.experiment.stats import pct_delta
from tokrecord.metrics import FORMULAS, Convention, RowMetrics, summarize

SCHEMA_REACCOUNT = "tokrecord.reaccount/v1"
ADDENDUM_KIND = "re-accounting"

# What a record compares its headline with, in the order shown.
REFERENCES = ("goal", "prior_approved", "prior_best_exact")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LegRows(_Frozen):
    """One leg's rows as recomputed from its raw events, and which events they came from."""

    name: str
    run_dir: str  # relative to the re-accounted directory
    events_sha256: str
    row_ids: tuple[tuple[int, str], ...]  # (row index in the suite, row id), one per row
    rows: tuple[RowMetrics, ...]
    candidate: bool = True  # the headline is the lowest candidate leg's, as in the record


class Margin(_Frozen):
    reference_tok_s: float
    margin_tok_s: float | None
    margin_pct: float | None


class Headline(_Frozen):
    """The record's headline in one convention: the lowest candidate leg's median row rate."""

    convention: Convention
    formula: str
    headline_tok_s: float | None
    headline_leg: str
    p10_tok_s: float | None
    mean_tok_s: float | None
    stdev_tok_s: float | None
    rows_rated: int
    # Per-token conventions are quantised by multi-token chunks (DESIGN.md): the bound goes
    # with every such figure; the chunk-aware rate has none.
    quantisation_bound_pct: float | None
    margins: dict[str, Margin]


class RowRates(_Frozen):
    row: int
    id: str
    original_tok_s: float | None
    reaccounted_tok_s: float | None
    flags: tuple[str, ...]


class LegRates(_Frozen):
    run_dir: str
    events_sha256: str
    candidate: bool
    original_tok_s: float | None
    reaccounted_tok_s: float | None
    rows: tuple[RowRates, ...]


class Reaccounting(_Frozen):
    """The addendum payload of `tokrecord reaccount`."""

    schema_id: str = SCHEMA_REACCOUNT
    text: str  # one line for readers that show an addendum's text (the report)
    disposition: str
    tokrecord_version: str
    record_schema: str
    original: Headline
    reaccounted: Headline
    legs: dict[str, LegRates]
    events_sha256: dict[str, str]

    def payload(self) -> dict[str, object]:
        out = self.model_dump(mode="json")
        out["schema"] = out.pop("schema_id")
        return out


def headline(legs: Sequence[LegRows], convention: Convention,
             references: Mapping[str, float | None]) -> Headline:
    """The headline in `convention`, chosen as the record chooses it: the candidate leg
    with the lowest median (a leg without a rate counts as infinitely fast)."""
    candidates = [leg for leg in legs if leg.candidate]
    if not candidates:
        raise ConfigError("no candidate leg to take a headline from")
    sums = {leg.name: summarize(leg.rows, convention) for leg in candidates}
    def rate(n: str) -> float:
        value = sums[n].tok_s_out
        return math.inf if value is None else value

    name = min(sums, key=rate)
    s = sums[name]
    value = s.tok_s_out
    margins = {
        ref: Margin(reference_tok_s=tok_s,
                    margin_tok_s=None if value is None else value - tok_s,
                    margin_pct=None if value is None else pct_delta(value, tok_s))
        for ref in REFERENCES if (tok_s := references.get(ref)) is not None
    }
    return Headline(
        convention=convention, formula=FORMULAS[convention], headline_tok_s=value,
        headline_leg=name, p10_tok_s=s.tok_s_out_p10, mean_tok_s=s.tok_s_out_mean,
        stdev_tok_s=s.tok_s_out_stdev, rows_rated=s.rows_rated,
        quantisation_bound_pct=None if convention is Convention.CHUNK_AWARE
        else s.quantisation_bound_pct_max,
        margins=margins,
    )


def _leg_rates(leg: LegRows, original: Convention, new: Convention) -> LegRates:
    return LegRates(
        run_dir=leg.run_dir, events_sha256=leg.events_sha256, candidate=leg.candidate,
        original_tok_s=summarize(leg.rows, original).tok_s_out,
        reaccounted_tok_s=summarize(leg.rows, new).tok_s_out,
        rows=tuple(RowRates(row=i, id=row_id, original_tok_s=m.rate(original),
                            reaccounted_tok_s=m.rate(new), flags=m.flags)
                   for (i, row_id), m in zip(leg.row_ids, leg.rows, strict=True)),
    )


def _tok_s(value: float | None) -> str:
    return "no rate" if value is None else f"{value:.3f} tok/s"


def summary_line(original: Headline, new: Headline, disposition: str) -> str:
    """`legacy-inclusive-events 102.971 tok/s -> conventional 101.942 tok/s (goal 102:
    margin +0.971 -> -0.058); disposition: ...`"""
    margins = []
    for ref, before in original.margins.items():
        after = new.margins[ref]
        if before.margin_tok_s is not None and after.margin_tok_s is not None:
            margins.append(f"{ref.replace('_', ' ')} {before.reference_tok_s:g}: margin "
                           f"{before.margin_tok_s:+.3f} -> {after.margin_tok_s:+.3f}")
    shown = f" ({'; '.join(margins)})" if margins else ""
    return (f"re-accounted {original.convention.value} {_tok_s(original.headline_tok_s)} -> "
            f"{new.convention.value} {_tok_s(new.headline_tok_s)}{shown}; disposition: "
            f"{disposition}")


def reaccount(
    legs: Sequence[LegRows],
    original: Convention,
    new: Convention,
    references: Mapping[str, float | None],
    disposition: str,
    *,
    record_schema: str,
    version: str,
) -> Reaccounting:
    """The record's headline, per-leg medians, per-row rates and margins in the convention it
    published and in `new`."""
    if new is original:
        raise ConfigError(f"the record already publishes its headline in the {new.value} "
                          "convention; re-accounting needs another --convention")
    if not disposition.strip():
        raise ConfigError("--disposition must say what is to be done with the record")
    before = headline(legs, original, references)
    after = headline(legs, new, references)
    return Reaccounting(
        text=summary_line(before, after, disposition.strip()),
        disposition=disposition.strip(), tokrecord_version=version, record_schema=record_schema,
        original=before, reaccounted=after,
        legs={leg.name: _leg_rates(leg, original, new) for leg in legs},
        events_sha256={leg.name: leg.events_sha256 for leg in legs},
    )
