"""record.migrate: every older record form in the fixtures reads as the current model
through one upgrade function per older schema id, each filling exactly the paths its form
lacks; a record newer than this tokrecord, or of no form it knows, is refused."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import SCHEMA_ROWS, SCHEMA_ROWS_V1
from tokrecord.record import migrate
from tokrecord.record.ids import (
    SCHEMA_ABBA,
    SCHEMA_ABBA_V1,
    SCHEMA_ABBA_V2,
    SCHEMA_SINGLE,
    SCHEMA_SINGLE_V1,
)
from tokrecord.record.schema import load_record, validate_record

FIXTURES = ROOT / "tests" / "fixtures"
# (fixture, its schema id as stored, the id it reads as, how many key paths its upgrade fills)
OLD_FORMS = [
    ("v1-record/abba/record.json", SCHEMA_ABBA_V1, SCHEMA_ABBA_V1, 18),
    ("report/demo/record.json", SCHEMA_ABBA_V1, SCHEMA_ABBA_V1, 45),  # before the probes
    ("report/v2-aa/record.json", SCHEMA_ABBA_V2, SCHEMA_ABBA, 29),
    ("report/v2-blocks2/record.json", SCHEMA_ABBA_V2, SCHEMA_ABBA, 37),
    ("h200:exp-draft", SCHEMA_ABBA_V2, SCHEMA_ABBA, 22),
    ("h200:exp-graphs", SCHEMA_ABBA_V2, SCHEMA_ABBA, 22),
    ("h200:exp-graphs-seq", SCHEMA_ABBA_V2, SCHEMA_ABBA, 0),  # written with every key
    ("h200:exp-sweep", SCHEMA_ABBA_V2, SCHEMA_ABBA, 1),  # sweep.sequential
]


def _document(name: str) -> dict[str, Any]:
    if name.startswith("h200:"):  # the sealed H200 examples: record.json only, read in place
        exp = name.removeprefix("h200:")
        with tarfile.open(ROOT / "examples" / "h200" / f"{exp}.tar.gz") as tar:
            member = tar.extractfile(f"{exp}/record.json")
            assert member is not None
            return dict(json.load(member))
    return dict(json.loads((FIXTURES / name).read_text(encoding="utf-8")))


@pytest.mark.parametrize(("name", "stored", "reads_as", "filled"), OLD_FORMS)
def test_each_old_form_reads_as_the_current_model(name: str, stored: str, reads_as: str,
                                                  filled: int) -> None:
    doc = _document(name)
    assert doc["schema"] == stored
    before = json.dumps(doc, sort_keys=True)
    upgraded = migrate.load_current(doc, name)
    assert json.dumps(doc, sort_keys=True) == before  # the stored document is not changed
    assert upgraded.stored_schema == stored and upgraded.obj["schema"] == reads_as
    assert len(upgraded.filled) == filled
    for path in upgraded.filled:  # each filled path was absent, and reads as None
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        assert path[-1] not in parent
    record = validate_record(doc, source=name, older_form_ok=True)
    assert record.schema_id == reads_as and record.stored_schema == stored
    assert all(not record.recorded(*path) for path in upgraded.filled)
    if stored != SCHEMA_ABBA:  # an older form is never written
        with pytest.raises(ConfigError, match=rf"^{name}: key 'schema': '{stored}' is an "
                                              "older form"):
            validate_record(doc, source=name)


def _leg(**more: Any) -> dict[str, Any]:
    return {"idle_gap_before_seconds": None, **more}


def test_abba_v1_fills_exactly_the_keys_it_lacks() -> None:
    # A v1 record sealed before the probes, cut to the sections the upgrade reads.
    old = {"schema": SCHEMA_ABBA_V1, "quality": {"retries": 0},
           "runs": {"A1": {"valid": True}, "B1": {"valid": True, "identity_sha256": None}},
           "operational": {"legs": {"A1": _leg(idle_passed=True)}},
           "metric_accounting": {"clock": "x"}, "artifacts": {"root": "."},
           "reproducibility": {}, "source": {}, "bootstrap": None}
    up = migrate.load_current(old, "old.json")
    assert up.obj["schema"] == SCHEMA_ABBA_V1 and up.stored_schema == SCHEMA_ABBA_V1
    assert up.filled == {
        ("hardware",), ("quality", "idle_before_and_after_all_legs"),
        ("quality", "same_hardware_all_legs"), ("quality", "source_identity_passed_all_legs"),
        ("runs", "A1", "telemetry"), ("runs", "B1", "telemetry"),
        ("runs", "A1", "identity_sha256"),
        ("runs", "A1", "teacher_exact_compared_by"), ("runs", "B1", "teacher_exact_compared_by"),
        *[("operational", "legs", "A1", k) for k in (
            "prestart_idle_seconds", "poststop_idle_seconds", "prestart_idle_snapshots",
            "poststop_idle_snapshots")],
        *[("reproducibility", k) for k in (
            "portable_model_manifest", "portable_model_manifest_sha256", "runtime_lock",
            "runtime_lock_sha256")],
        *[("artifacts", k) for k in (
            "all_vs_canonical_teacher", "all_vs_canonical_teacher_sha256",
            "cross_leg_exactness", "cross_leg_exactness_sha256")]}
    assert all(_at(up.obj, p) is None for p in up.filled)
    assert up.obj["runs"]["A1"]["valid"] is True and up.obj["metric_accounting"]["clock"] == "x"
    assert "source" in up.obj and "sources" not in up.obj["source"]  # an empty source stays


def test_abba_v2_fills_exactly_the_keys_it_lacks() -> None:
    old = {"schema": SCHEMA_ABBA_V2, "runs": {"A1": {"teacher_exact_compared_by": "1/1 by ids"}},
           "protocol": {"max_blocks": None}, "metric_accounting": {}, "quality": {},
           "artifacts": {}, "reproducibility": {"runtime_lock": None,
                                                "runtime_lock_sha256": None,
                                                "portable_model_manifest": None,
                                                "portable_model_manifest_sha256": None},
           "source": {"sources": {"vllm": {"commit": "c"}}},
           "sequential": {"verdict": "x"}, "sweep": None, "hardware": None}
    up = migrate.load_current(old, "v2.json")
    assert up.obj["schema"] == SCHEMA_ABBA and up.stored_schema == SCHEMA_ABBA_V2
    assert up.filled == {
        ("metric_accounting", "clock"), ("quality", "source_identity_passed_all_legs"),
        ("runs", "A1", "identity_sha256"), ("protocol", "prefix_history_response_reuse"),
        ("source", "sources", "vllm", "bundle"), ("source", "sources", "vllm", "patch"),
        *[("artifacts", k) for k in (
            "all_vs_canonical_teacher", "all_vs_canonical_teacher_sha256",
            "cross_leg_exactness", "cross_leg_exactness_sha256")],
        ("server_log_facts",), ("speculative",), ("component_evidence",), ("model",),
        ("unchanged_record_stack",), ("prior_recheck",), ("noise_diagnostic",),
        ("sequential", "estimate_adjusted_ratio"), ("sequential", "estimate_adjustment")}
    # v2 came after the probes: a v2 record without hardware is not filled, but refused.
    assert ("hardware",) not in up.filled and "sweep" in up.obj and up.obj["sweep"] is None


def test_single_v1_fills_exactly_the_keys_it_lacks() -> None:
    old = {"schema": SCHEMA_SINGLE_V1, "operational": {"legs": {"B1": _leg()}},
           "sha256": {"rows.json": "0" * 64, "identity": None, "runtime_lock": None},
           "metric_accounting": {"clock": None}, "reproducibility": {}, "artifacts": {},
           "source": {}, "hardware": None, "telemetry": None}
    up = migrate.load_current(old, "single.json")
    assert up.obj["schema"] == SCHEMA_SINGLE and up.stored_schema == SCHEMA_SINGLE_V1
    assert up.filled == {
        *[("operational", "legs", "B1", k) for k in (
            "prestart_idle_seconds", "poststop_idle_seconds", "prestart_idle_snapshots",
            "poststop_idle_snapshots", "idle_passed")],
        *[("reproducibility", k) for k in (
            "portable_model_manifest", "portable_model_manifest_sha256", "runtime_lock",
            "runtime_lock_sha256")],
        ("artifacts", "all_vs_canonical_teacher"), ("artifacts", "all_vs_canonical_teacher_sha256"),
        ("server_log_facts",), ("graph",), ("speculative",), ("identity_sha256",),
        ("source_identity_passed",), ("record_blockers",), ("treatment",), ("model",),
        ("component_evidence",), ("unchanged_record_stack",), ("prior_recheck",),
        ("sha256", "exactness"), ("sha256", "model_release_manifest")}


def test_a_current_form_is_read_as_it_is() -> None:
    doc = {"schema": SCHEMA_SINGLE, "anything": 1}
    up = migrate.load_current(doc, "new.json")
    assert up.obj == doc and up.filled == frozenset() and up.stored_schema == SCHEMA_SINGLE


def test_rows_v1_fill_gapped_ids_on_every_row() -> None:
    old = {"schema": SCHEMA_ROWS_V1, "rows": [{"trace": {"row": 0}},
                                              {"trace": {"row": 1, "gapped_token_ids": None}}]}
    up = migrate.load_current_rows(old)
    assert up is not None and up.obj["schema"] == SCHEMA_ROWS
    assert up.filled == {("rows", 0, "trace", "gapped_token_ids")}
    assert migrate.dotted(("rows", 0, "trace", "gapped_token_ids")) == "rows[0].trace.gapped_token_ids"
    assert "gapped_token_ids" not in old["rows"][0]["trace"]  # type: ignore[index]
    current = {"schema": SCHEMA_ROWS, "rows": []}
    assert migrate.load_current_rows(current) == migrate.Upgraded(current, frozenset(), SCHEMA_ROWS)
    assert migrate.load_current_rows(["not", "an", "object"]) is None


def test_a_hostile_shape_is_left_for_the_validator() -> None:
    # A section of the wrong type is not descended into: the schema names it afterwards.
    up = migrate.load_current({"schema": SCHEMA_ABBA_V2, "runs": ["A1"], "quality": 3}, "h")
    assert ("quality", "source_identity_passed_all_legs") not in up.filled
    assert up.obj["runs"] == ["A1"]


def _at(obj: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def test_older_summary_forms_told_by_their_marker() -> None:
    assert migrate.summary_has_covariates({"covariates": None})
    assert not migrate.summary_has_covariates({"summary": {}})
    assert migrate.summary_has_log_facts({"log_facts": []})
    assert not migrate.summary_has_log_facts({"summary": {}})


def test_leg_probes_told_by_its_config() -> None:
    assert migrate.leg_has_probes({"leg": {"idle": {}, "name": "A1"}})
    assert not migrate.leg_has_probes({"leg": {"name": "A1"}})
    assert not migrate.leg_has_probes({"leg": ["idle"]})  # hostile: not a mapping


@pytest.mark.parametrize("newer", ["tokrecord.experiment-record/v4",
                                   "tokrecord.single-leg-record/v3"])
def test_a_newer_record_is_refused_naming_the_file_and_key(newer: str, tmp_path: Path) -> None:
    doc = _document("report/v2-blocks2/record.json")
    doc["schema"] = newer
    path = tmp_path / "record.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'schema': '{newer}' is newer than "
                                          r"this tokrecord reads \(newest known: "):
        load_record(path)


@pytest.mark.parametrize("schema", ["tokrecord.experiment-record/v0", "tokrecord.other/v1",
                                    "seed-record-v1", 7, None])
def test_an_unknown_older_form_is_refused(schema: object, tmp_path: Path) -> None:
    doc = _document("report/v2-blocks2/record.json")
    doc["schema"] = schema
    path = tmp_path / "record.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'schema': .*; not a record form "
                                          r"this tokrecord reads"):
        load_record(path)


@pytest.mark.parametrize("schema", ["tokrecord.experiment-record/v1x", "tokrecord.other/v9",
                                    7, None])
def test_other_unknown_ids_are_not_called_newer(schema: object) -> None:
    assert migrate.newer_than_known(schema, migrate.KNOWN_RECORD_SCHEMAS) is None


def test_a_null_where_the_form_has_a_value_is_refused() -> None:
    # Absent is "not recorded" (filled); a stored null is no value tokrecord writes.
    doc = _document("v1-record/abba/record.json")
    doc["operational"]["legs"]["A1"]["idle_passed"] = None
    with pytest.raises(ConfigError, match=r"key 'operational\.legs\.A1\.idle_passed': Value "
                                          "error, either absent"):
        validate_record(doc, source="v1", older_form_ok=True)
