"""The run/demo tables say when teacher-exact rows were compared by text (issue 29): the
per-leg gate matrix marks such a leg, and the across-legs count says how many rows."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from paths import FIXTURES
from tokrecord.cli.view import experiment_tables
from tokrecord.record.schema import ExperimentRecordV3, load_record

RECORD = Path(FIXTURES) / "report" / "v2-blocks2" / "record.json"


def _render(record: ExperimentRecordV3) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    for table in experiment_tables(record):
        console.print(table)
    return console.export_text()


def _with_compared_by(record: ExperimentRecordV3, by_leg: dict[str, str]) -> ExperimentRecordV3:
    runs = {name: leg.model_copy(update={"teacher_exact_compared_by": by_leg.get(name)})
            for name, leg in record.runs.items()}
    return record.model_copy(update={"runs": runs})


def test_rows_compared_by_text_are_marked_in_the_matrix_and_counted() -> None:
    record = load_record(RECORD)
    assert isinstance(record, ExperimentRecordV3)
    marked = _with_compared_by(record, {"A1": "0/13 by ids, 13 by text", "B1": "12/13 by ids, 1 by text"})
    text = _render(marked)
    matrix = next(line for line in text.splitlines() if line.lstrip().startswith("teacher exact"))
    assert matrix.count("*") == 2
    assert "*: some rows compared by text" in text
    quality = next(line for line in text.splitlines() if "all_legs_teacher_exact" in line)
    assert quality.rstrip().endswith("14 by text")


def test_rows_all_compared_by_ids_carry_no_mark() -> None:
    record = load_record(RECORD)
    assert isinstance(record, ExperimentRecordV3)
    text = _render(_with_compared_by(record, {name: "13/13 by ids" for name in record.runs}))
    matrix = next(line for line in text.splitlines() if line.lstrip().startswith("teacher exact"))
    assert "*" not in matrix
    assert "by text" not in text
