"""record.migrate: every older record form in the fixtures reads as the current model
through the one migration table, and a record newer than this tokrecord is refused."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from tokrecord.errors import ConfigError
from tokrecord.record import migrate
from tokrecord.record.ids import SCHEMA_ABBA, SCHEMA_ABBA_V1, SCHEMA_SINGLE
from tokrecord.record.schema import load_record, validate_record

FIXTURES = ROOT / "tests" / "fixtures"
# (fixture, its schema id, the first key a record written today must have and it lacks:
# None where it was written with every key but those of designs it is not)
OLD_FORMS = [
    ("v1-record/abba/record.json", SCHEMA_ABBA_V1, None),
    ("report/demo/record.json", SCHEMA_ABBA_V1, "quality.idle_before_and_after_all_legs"),
    ("report/v2-aa/record.json", SCHEMA_ABBA, "quality.source_identity_passed_all_legs"),
    ("report/v2-blocks2/record.json", SCHEMA_ABBA, "quality.source_identity_passed_all_legs"),
    ("h200:exp-draft", SCHEMA_ABBA, "metric_accounting.clock"),
    ("h200:exp-graphs", SCHEMA_ABBA, "metric_accounting.clock"),
]
_STEPS = (migrate.ADDED_LATER | migrate.ADDED_WITH_ENGINES | migrate.ADDED_WITH_EVIDENCE
          | migrate.ADDED_WITH_CRASH_SAFETY | migrate.ADDED_WITH_ID_EXACTNESS
          | migrate.ADDED_WITH_NOISE | migrate.ADDED_WITH_SEQUENTIAL | migrate.ADDED_WITH_SWEEP)


def _document(name: str) -> dict[str, Any]:
    if name.startswith("h200:"):  # the sealed H200 examples: record.json only, read in place
        exp = name.removeprefix("h200:")
        with tarfile.open(ROOT / "examples" / "h200" / f"{exp}.tar.gz") as tar:
            member = tar.extractfile(f"{exp}/record.json")
            assert member is not None
            return dict(json.load(member))
    return dict(json.loads((FIXTURES / name).read_text(encoding="utf-8")))


@pytest.mark.parametrize(("name", "schema", "lacks"), OLD_FORMS)
def test_each_old_form_reads_through_the_migration_table(name: str, schema: str,
                                                         lacks: str | None) -> None:
    doc = _document(name)
    assert doc["schema"] == schema
    record = validate_record(doc, source=name, sealed_before_probes_ok=True)
    assert record.schema_id == schema
    # Every later section the fixture lacks reads as None, never as a default value.
    for key in sorted(migrate.absent_ok(schema, sealed=True) & set(type(record).model_fields)):
        if key not in doc:
            assert getattr(record, key) is None, key
    if lacks is None:
        validate_record(doc, source=name)
        return
    # A record written today must have the key; only the table lets the old one lack it.
    assert lacks.rsplit(".", 1)[-1] in _STEPS
    with pytest.raises(ConfigError, match=rf"^{name}: key '{lacks}': Field required"):
        validate_record(doc, source=name)


def test_the_table_by_form() -> None:
    # Writing: the ABBA v1 form (only ever recomputed) lacks every step after it was last
    # written; the current forms lack only the sections of designs they are not.
    assert migrate.absent_ok(SCHEMA_ABBA_V1, sealed=False) >= migrate.ADDED_WITH_ENGINES
    assert not migrate.ADDED_WITH_ENGINES & migrate.absent_ok(SCHEMA_ABBA, sealed=False)
    assert migrate.absent_ok(SCHEMA_SINGLE, sealed=False) == (
        migrate.ADDED_WITH_SEQUENTIAL | migrate.ADDED_WITH_SWEEP)
    # Reading sealed evidence: the probes' keys only for the forms written before them.
    assert migrate.absent_ok(SCHEMA_SINGLE, sealed=True) >= migrate.ADDED_LATER
    assert migrate.absent_ok(SCHEMA_ABBA_V1, sealed=True) >= migrate.ADDED_LATER
    assert not migrate.ADDED_LATER & migrate.absent_ok(SCHEMA_ABBA, sealed=True)


def test_leg_probes_told_by_its_config() -> None:
    assert migrate.leg_has_probes({"leg": {"idle": {}, "name": "A1"}})
    assert not migrate.leg_has_probes({"leg": {"name": "A1"}})
    assert not migrate.leg_has_probes({"leg": ["idle"]})  # hostile: not a mapping


@pytest.mark.parametrize("newer", ["tokrecord.experiment-record/v3",
                                   "tokrecord.single-leg-record/v2"])
def test_a_newer_record_is_refused_naming_the_file_and_key(newer: str, tmp_path: Path) -> None:
    doc = _document("report/v2-blocks2/record.json")
    doc["schema"] = newer
    path = tmp_path / "record.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'schema': '{newer}' is newer than "
                                          r"this tokrecord reads \(newest known: "):
        load_record(path)


@pytest.mark.parametrize("schema", ["tokrecord.experiment-record/v1x", "tokrecord.other/v9",
                                    7, None])
def test_other_unknown_ids_are_not_called_newer(schema: object) -> None:
    assert migrate.newer_than_known(schema, migrate.KNOWN_RECORD_SCHEMAS) is None
