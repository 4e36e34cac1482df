"""`tokrecord reaccount DIR --convention C --disposition TEXT`: a sealed record's headline
in another rate convention, recomputed from its raw events and sealed as an addendum."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tokrecord import __version__
from tokrecord.errors import ConfigError, TokrecordError
from tokrecord.evidence import layout
from tokrecord.evidence.seal import (
    ADDENDUM_FILE_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Problem,
    SigningKey,
    load_or_create_key,
    write_addendum,
)
from tokrecord.experiment.leg import LegResult, load_rows
from tokrecord.identity import sha256_file
from tokrecord.metrics import Convention
from tokrecord.record.reaccount import ADDENDUM_KIND, LegRows, Reaccounting, reaccount
from tokrecord.record.schema import SingleLegRecord, load_record
from tokrecord.record.verify import verify_dir

from .app import _guard, app, out_console

# A row-level difference, as verify names it: the replay of events.jsonl failed on a row
# ("row 3"), or gave other figures than rows.json holds ("rows[3].metrics...").
_ROW_FIELD = re.compile(r"row (\d+)$|rows\[(\d+)\]")


class ReaccountError(TokrecordError):
    """A sealed record whose raw events do not recompute to what it recorded."""


def _check_sealed(directory: Path) -> None:
    if (directory / ADDENDUM_FILE_NAME).exists():
        raise ConfigError(f"{directory} is an addendum; re-account the record it belongs to")
    if not (directory / MANIFEST_NAME).exists() or not (directory / SIGNATURE_NAME).exists():
        inside = (" (a leg of an experiment is sealed with the experiment: re-account the "
                  "experiment directory)" if layout.attempt_number(directory) is not None else "")
        raise ConfigError(f"{directory} is not sealed (no {MANIFEST_NAME} and "
                          f"{SIGNATURE_NAME}){inside}; only sealed evidence is re-accounted")


def _row_problem(problems: list[Problem]) -> Problem | None:
    return next((p for p in problems
                 if Path(p.file).name in (layout.EVENTS, layout.ROWS) and _ROW_FIELD.match(p.field)),
                None)


def _check_recomputes(directory: Path) -> None:
    """Everything `tokrecord verify` checks: the seal, and every leg re-parsed from its raw
    events and recomputed. After this, each leg's rows.json holds exactly the row figures
    its events.jsonl recomputes to, so those are the figures re-accounted."""
    problems = verify_dir(directory)
    if not problems:
        return
    row = _row_problem(problems)
    if row is not None:
        m = _ROW_FIELD.match(row.field)
        index = next(g for g in m.groups() if g is not None) if m else "?"
        leg = str(Path(row.file).parent)
        where = "" if leg == "." else f"leg {leg}, "
        raise ReaccountError(f"{directory}: {where}row {index}: the raw events do not recompute "
                             f"({row.file}: {row.field}: {row.message}); nothing was sealed")
    first = problems[0]
    raise ConfigError(f"{directory} does not verify ({len(problems)} problems; first: "
                      f"{first.file}: {first.field}: {first.message}): a re-accounting must "
                      "not vouch for altered evidence; run tokrecord verify")


def _leg_rows(directory: Path, name: str, run_dir: Path, candidate: bool) -> LegRows:
    rows = load_rows(run_dir)
    return LegRows(
        name=name, run_dir=str(run_dir.relative_to(directory)) if run_dir != directory else ".",
        events_sha256=sha256_file(run_dir / layout.EVENTS),
        row_ids=tuple((r.trace.row, r.trace.row_id) for r in rows),
        rows=tuple(r.metrics for r in rows), candidate=candidate,
    )


def load_inputs(directory: Path) -> tuple[list[LegRows], Convention, dict[str, float | None], str]:
    """The legs, the convention the record publishes, its references and its schema id."""
    if (directory / layout.RECORD).exists():
        record = load_record(directory / layout.RECORD)
        published = record.metric_accounting.published_convention
        if isinstance(record, SingleLegRecord):
            figures = record.record
            run_dir = layout.locate_run_dir(directory, record.artifacts.run_dir, "B1")
            refs = {"goal": figures.goal_tok_s, "prior_approved": figures.prior_approved_tok_s,
                    "prior_best_exact": figures.prior_best_exact_tok_s}
            return [_leg_rows(directory, "B1", run_dir, True)], published, refs, record.stored_schema
        legs = [_leg_rows(directory, name, layout.locate_run_dir(directory, block.run_dir, name),
                          block.treatment == "candidate")
                for name, block in record.runs_by_name().items()]
        return legs, published, {"prior_approved": record.prior_approved_record.tok_s}, \
            record.stored_schema
    if (directory / layout.SUMMARY).exists():
        result = LegResult.model_validate_json((directory / layout.SUMMARY).read_bytes())
        return ([_leg_rows(directory, result.name, directory, True)],
                result.summary.headline_convention, {}, result.schema_id)
    raise ConfigError(f"{directory} holds neither a record ({layout.RECORD}) nor a leg "
                      f"({layout.SUMMARY})")


def reaccount_dir(directory: Path, convention: Convention, disposition: str,
                  key: SigningKey | None = None) -> tuple[Reaccounting, Path]:
    """Re-account a sealed directory and seal the result beside it as an addendum."""
    _check_sealed(directory)
    legs, published, refs, schema = load_inputs(directory)
    if convention is published:
        raise ConfigError(f"{directory} already publishes its headline in the {published.value} "
                          "convention; give another --convention")
    _check_recomputes(directory)
    result = reaccount(legs, published, convention, refs, disposition,
                       record_schema=schema, version=__version__)
    path = write_addendum(directory, ADDENDUM_KIND, result.payload(), key or load_or_create_key())
    return result, path


@app.command("reaccount")
@_guard
def reaccount_cmd(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed leg or experiment.")],
    convention: Annotated[Convention, typer.Option(
        help="The convention to re-account the headline in.")],
    disposition: Annotated[str, typer.Option(
        help="What is to be done with the record, e.g. 'qualify the score; do not resubmit'.")],
) -> None:
    """Recompute a sealed record's headline in another rate convention from its raw events,
    and seal it, with your disposition, as an addendum; the record itself never changes."""
    result, path = reaccount_dir(directory, convention, disposition)
    before, after = result.original, result.reaccounted
    for h in (before, after):
        bound = (f" (per-token quantisation bound {h.quantisation_bound_pct:.2f} %)"
                 if h.quantisation_bound_pct else "")
        value = "no rate" if h.headline_tok_s is None else f"{h.headline_tok_s:.3f} tok/s"
        leg = f"  lowest candidate {h.headline_leg}" if len(result.legs) > 1 else ""
        out_console.print(escape(f"{h.convention.value:<24} {value}{leg}  [{h.formula}]{bound}"),
                          soft_wrap=True)
        for ref, m in h.margins.items():
            if m.margin_tok_s is not None:
                out_console.print(escape(f"  vs {ref.replace('_', ' ')} {m.reference_tok_s:g}: "
                                         f"{m.margin_tok_s:+.3f} tok/s ({m.margin_pct:+.2f} %)"),
                                  soft_wrap=True)
    out_console.print(escape(f"disposition: {result.disposition}"), soft_wrap=True)
    out_console.print(escape(f"re-accounting sealed: {path}"), soft_wrap=True)
