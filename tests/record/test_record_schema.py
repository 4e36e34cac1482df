"""The record schema: the packaged JSON Schema is the generated one, records from real
experiments (fake server) validate, and a broken copy fails naming the key."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import pytest

from probes_support import FAST_PLAN_SECTIONS
from sealed_support import SealedAbba
from tokrecord.errors import ConfigError
from tokrecord.evidence import layout
from tokrecord.evidence.seal import load_or_create_key
from tokrecord.experiment.plan import parse_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.ids import SCHEMA_ABBA, SCHEMA_ABBA_V1, SCHEMA_SINGLE
from tokrecord.record.schema import (
    SCHEMA_ID,
    SCHEMA_URL,
    EvidenceName,
    ExperimentRecordV3,
    SingleLegRecord,
    record_json_schema,
    record_json_schema_text,
    validate_record,
)

FAKE = [sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--ttft-ms", "5"]


def _plan(design: str) -> dict[str, Any]:
    arms: dict[str, Any] = {"candidate": {"env": {"TOKRECORD_FAKE_TOK_S": "3300"}}}
    if design == "abba":
        arms["control"] = {"env": {"TOKRECORD_FAKE_TOK_S": "3000"}}
    return {
        "name": f"schema-{design}", "design": design, "suite_rows": 2, "teacher": "capture",
        "idle_gap_s": 0, **FAST_PLAN_SECTIONS,
        "server": {"argv": FAKE, "model": "fake", "ready_timeout_s": 30},
        "arms": arms,
        "prior": {"value_tok_s": 3000.0, "id": "prior-1", "goal_tok_s": 3100.0,
                  "best_exact_tok_s": 3050.0},
        "verdict": {"bootstrap_samples": 500},
    }


def _experiment(tmp: Path, design: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record as built in memory, the record.json written by finish, sealed by the CLI's way)."""
    plan = parse_plan(_plan(design), "test")
    exp = tmp / "exp"
    results = run_experiment(plan, exp)
    record = build_record(plan, exp, results)
    built = copy.deepcopy(record)
    key = load_or_create_key()
    record["seal"] = {"public_key_fingerprint": key.fingerprint, "keyid": key.keyid,
                      "public_key_pem": key.public_key_pem}
    finish(exp, record, key)
    return built, json.loads((exp / "record.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def abba(sealed_abba: SealedAbba) -> tuple[dict[str, Any], dict[str, Any]]:
    """The session's sealed fake ABBA (tests/sealed_support.py: _plan("abba")'s plan under
    another name). Its record.json names no key, so the CLI's `seal` section is added as
    _experiment adds it before finish (the single record checks that finish writes it)."""
    written = json.loads((sealed_abba.exp / "record.json").read_text(encoding="utf-8"))
    assert "seal" not in written
    key = load_or_create_key()
    written["seal"] = {"public_key_fingerprint": key.fingerprint, "keyid": key.keyid,
                       "public_key_pem": key.public_key_pem}
    return copy.deepcopy(sealed_abba.built), written


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    return _experiment(tmp_path_factory.mktemp("single"), "single")


# -- the schema file -----------------------------------------------------------------------


def test_packaged_schema_is_the_generated_one() -> None:
    packaged = resources.files("tokrecord.data").joinpath("record.schema.json").read_text("utf-8")
    assert packaged == record_json_schema_text(), (
        "src/tokrecord/data/record.schema.json is stale: regenerate it with "
        "`python -m tokrecord.record.schema > src/tokrecord/data/record.schema.json`")


def test_module_prints_the_schema() -> None:
    out = subprocess.run([sys.executable, "-m", "tokrecord.record.schema"], check=True,
                         capture_output=True, text=True).stdout
    assert out == record_json_schema_text()


def test_schema_header_and_required_keys() -> None:
    schema = record_json_schema()
    assert schema["$id"] == SCHEMA_URL
    assert schema["title"] == SCHEMA_ID == "tokrecord.record/v1"
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    defs = schema["$defs"]
    assert {d["$ref"] for d in schema["oneOf"]} == {"#/$defs/ExperimentRecord",
                                                    "#/$defs/ExperimentRecordV3",
                                                    "#/$defs/SingleLegRecord"}
    assert defs["ExperimentRecordV3"]["properties"]["schema"]["const"] == SCHEMA_ABBA
    assert defs["ExperimentRecord"]["properties"]["schema"]["const"] == SCHEMA_ABBA_V1
    assert defs["SingleLegRecord"]["properties"]["schema"]["const"] == SCHEMA_SINGLE
    for name, definition in defs.items():
        if "properties" not in definition:
            continue
        assert definition["additionalProperties"] is False, name
        optional = ({"seal"} if name in ("ExperimentRecord", "ExperimentRecordV3", "SingleLegRecord")
                    else set())
        assert set(definition["required"]) == set(definition["properties"]) - optional, name
        assert not any("default" in p for p in definition["properties"].values()), name
    # the seal is optional, but never null
    assert defs["ExperimentRecord"]["properties"]["seal"]["$ref"] == "#/$defs/Seal"


# -- real records validate -----------------------------------------------------------------


def test_abba_record_validates(abba: tuple[dict[str, Any], dict[str, Any]]) -> None:
    built, written = abba
    assert "seal" not in built
    for record in (built, written):
        model = validate_record(record)
        assert isinstance(model, ExperimentRecordV3)
    model = validate_record(written)
    assert isinstance(model, ExperimentRecordV3)
    assert model.seal is not None
    assert model.model_dump(mode="json", by_alias=True, exclude_none=False).keys() == written.keys()


def test_single_record_validates(single: tuple[dict[str, Any], dict[str, Any]]) -> None:
    built, written = single
    for record in (built, written):
        assert isinstance(validate_record(record), SingleLegRecord)
    assert validate_record(written).seal is not None


def test_a_validated_record_dumps_back_to_itself(
    abba: tuple[dict[str, Any], dict[str, Any]], single: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    for built, _ in (abba, single):
        dumped = validate_record(built).model_dump(mode="json", by_alias=True, exclude_unset=True)
        assert json.loads(json.dumps(dumped)) == json.loads(json.dumps(built))


# -- broken copies fail, naming the key ----------------------------------------------------


def _broken(record: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy with `path` (dotted) set to `value`; `_DELETE` removes the key."""
    out = copy.deepcopy(record)
    *parents, last = path.split(".")
    node: Any = out
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return out


_DELETE = object()

ABBA_BREAKS = [
    ("unknown top-level key", "surprise", 1, "surprise"),
    ("unknown nested key", "runs.B2.extra_figure", 1.0, "runs.B2.extra_figure"),
    ("unknown key in a reused model", "record_gate.note", "x", "record_gate.note"),
    ("missing section", "quality", _DELETE, "quality"),
    ("missing nested key", "protocol.metric", _DELETE, "protocol.metric"),
    ("missing leg", "runs.A2", _DELETE, "runs.A2"),
    ("missing pair", "pair_results.B2_vs_A2", _DELETE, "pair_results.B2_vs_A2"),
    ("bad leg name", "runs.K1", {}, "runs.K1"),  # A..J name sweep arms
    ("bad design", "protocol.design", "abab", "protocol.design"),
    ("missing verdict analysis", "verdict_analysis", _DELETE, "verdict_analysis"),
    ("bad analysis df", "verdict_analysis.df", "2", "verdict_analysis.df"),
    ("missing key the model defaults", "pair_results.B1_vs_A1.failed_criteria", _DELETE,
     "pair_results.B1_vs_A1.failed_criteria"),
    ("missing key the model defaults, deeper", "treatment.control.description", _DELETE,
     "treatment.control.description"),
    ("number as string", "runs.B1.headline_tok_s", "3300", "runs.B1.headline_tok_s"),
    ("int as string", "quality.retries", "0", "quality.retries"),
    ("bool as int", "quality.all_legs_valid", 1, "quality.all_legs_valid"),
    ("bad count", "quality.all_legs_teacher_exact", "2 of 2", "quality.all_legs_teacher_exact"),
    ("bad enum", "verdict", "faster", "verdict"),
    ("bad gate status", "runs.A1.gates.cleanup.status", "ok", "runs.A1.gates.cleanup.status"),
    ("bad attempt", "attempts.0.attempt", "1", "attempts.0.attempt"),
    ("bad hash", "plan_sha256", "abc", "plan_sha256"),
    ("bad evidence name", "runs.A1.evidence_sha256.notes", "0" * 64,
     "runs.A1.evidence_sha256.notes"),
    ("bad identity", "source.identity_sha256", 7, "source.identity_sha256"),
    ("bad tokrecord identity", "source.tokrecord.dirty", "no", "source.tokrecord.dirty"),
    ("null seal", "seal", None, "seal"),
    ("unknown seal key", "seal.signature", "x", "seal.signature"),
    ("submission not empty", "submission.id", "x", "submission.id"),
    ("constant protocol fact", "protocol.fifth_run_permitted", True, "protocol.fifth_run_permitted"),
]


@pytest.mark.parametrize(("path", "value", "named"), [b[1:] for b in ABBA_BREAKS],
                         ids=[b[0] for b in ABBA_BREAKS])
def test_broken_abba_record_fails_naming_the_key(
    abba: tuple[dict[str, Any], dict[str, Any]], path: str, value: Any, named: str
) -> None:
    _, written = abba
    with pytest.raises(ConfigError, match=rf"key '{named}'"):
        validate_record(_broken(written, path, value))


SINGLE_BREAKS = [
    ("unknown top-level key", "surprise", 1, "surprise"),
    ("ABBA key in a single-leg record", "runs", {}, "runs"),
    ("missing section", "metric_accounting", _DELETE, "metric_accounting"),
    ("missing nested key", "record.goal_tok_s", _DELETE, "record.goal_tok_s"),
    ("number as string", "summary.tok_s_out", "fast", "summary.tok_s_out"),
    ("bad gate count", "quality.teacher_exact.count", "all", "quality.teacher_exact.count"),
    ("wrong operational type", "operational.surviving_workers", "0",
     "operational.surviving_workers"),
    ("constant accounting fact", "metric_accounting.inter_token_intervals", 100,
     "metric_accounting.inter_token_intervals"),
]


@pytest.mark.parametrize(("path", "value", "named"), [b[1:] for b in SINGLE_BREAKS],
                         ids=[b[0] for b in SINGLE_BREAKS])
def test_broken_single_record_fails_naming_the_key(
    single: tuple[dict[str, Any], dict[str, Any]], path: str, value: Any, named: str
) -> None:
    _, written = single
    with pytest.raises(ConfigError, match=rf"key '{named}'"):
        validate_record(_broken(written, path, value))


def test_a_leg_the_design_lacks_is_named(abba: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, written = abba
    extra = copy.deepcopy(written)
    extra["runs"]["A3"] = copy.deepcopy(extra["runs"]["A1"])
    with pytest.raises(ConfigError, match=r"key 'runs.A3': not in the design \(protocol names "
                       r"A1, B1, B2, A2\)"):
        validate_record(extra)


def test_schema_key_decides_the_form(abba: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, written = abba
    with pytest.raises(ConfigError, match=r"key 'schema'"):
        validate_record(_broken(written, "schema", "tokrecord.experiment-record/v9"))
    with pytest.raises(ConfigError, match=r"key 'schema'"):
        validate_record(_broken(written, "schema", _DELETE))
    # an ABBA record labelled single-leg fails on the first key a single-leg record lacks
    with pytest.raises(ConfigError, match=r"key '\w+'"):
        validate_record(_broken(written, "schema", SCHEMA_SINGLE))


def test_source_without_identity_is_an_empty_object(
    abba: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """identity_summary returns {} when the experiment has no identity.json."""
    _, written = abba
    assert validate_record(_broken(written, "source", {})).source.model_dump() == {}
    with pytest.raises(ConfigError, match=r"key 'source.identity_sha256'"):
        validate_record(_broken(written, "source", {"python": "CPython 3.11.7"}))


def test_not_json_is_refused(single: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, written = single
    with pytest.raises(ConfigError, match="not a JSON document"):
        validate_record(_broken(written, "summary.tok_s_out", float("nan")))


def test_the_schema_names_the_layouts_evidence_files() -> None:
    """The record's evidence names are a type in the schema and a tuple in the layout: the
    same names, in the same order."""


    assert get_args(EvidenceName) == layout.EVIDENCE_FILES
