"""What an experiment seals besides its legs: component evidence from profiler traces,
the exactness documents, the portable model manifest and runtime lock, and the single-leg
treatment section. Real fake-server experiments, built, sealed and verified."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from paths import FIXTURES
from plan_support import SUITE_ROWS, plan_toml, write_plan
from tokrecord.errors import ConfigError
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.verify import verify_dir
from tokrecord.report import load_report, render_html, render_markdown, render_terminal

H200 = FIXTURES / "components" / "h200-rmsnorm"
COMPONENT = """
[[components]]
name = "rmsnorm"
description = "RMSNorm fused into one Triton kernel"
kernels = ["pow_tensor_scalar", "MeanOps", "CUDAFunctorOnSelf_add", "rsqrt_kernel",
           "MulFunctor", "_rmsnorm_kernel"]
control_traces = ["traces/control.trace.json"]
candidate_traces = ["traces/candidate.trace.json"]
check = "traces/check.json"
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_dir(root: Path) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text('{"layers": 2}\n')
    (model / "weights.bin").write_bytes(bytes(range(256)))
    return model


@pytest.fixture(scope="module")
def abba(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("components")
    shutil.copytree(H200, root / "traces")
    identity = f'\n[identity]\nmodel_path = "{model_dir(root)}"\n'
    # No sampler: component evidence is not about telemetry.
    path, plan = write_plan(root, plan_toml("components", control=1000, candidate=1200,
                                            extra=COMPONENT + identity, telemetry=False))
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    finish(exp, record)
    return SimpleNamespace(root=root, exp=exp, record=record)


def test_component_evidence_comes_from_the_sealed_copies(abba: SimpleNamespace) -> None:
    ev = abba.record["component_evidence"]["rmsnorm"]
    assert ev["launches_per_cycle"] == {"control": 54, "candidate": 9, "removed": 45}
    assert ev["cycles"] == {"control": [8], "candidate": [8]}
    assert ev["exact"] is True and ev["gate_passed"] is True
    low, high = ev["saving_ms_per_cycle_range"]
    assert 0 < low == high
    copies = abba.exp / "components" / "rmsnorm"
    assert ev["trace_sha256"] == {
        "components/rmsnorm/control-1.trace.json": sha(H200 / "control.trace.json"),
        "components/rmsnorm/candidate-1.trace.json": sha(H200 / "candidate.trace.json")}
    assert sha(copies / "check.json") == ev["check_sha256"] == sha(H200 / "check.json")
    assert not any("component" in r for r in abba.record["record_gate"]["reasons"])


def test_exactness_documents_are_written_and_hashed(abba: SimpleNamespace) -> None:
    art = abba.record["artifacts"]
    cross = abba.exp / art["cross_leg_exactness"]
    teacher = abba.exp / art["all_vs_canonical_teacher"]
    assert (cross.name, teacher.name) == ("cross-leg-exactness.json",
                                          "all-vs-canonical-teacher.json")
    assert sha(cross) == art["cross_leg_exactness_sha256"]
    assert sha(teacher) == art["all_vs_canonical_teacher_sha256"]
    doc = json.loads(cross.read_text())
    assert doc["legs"] == ["A1", "B1", "B2", "A2"] and doc["rows_identical"] == f"{SUITE_ROWS}/{SUITE_ROWS}"
    assert doc["passed"] is True
    row = doc["rows"][0]
    assert len({o["token_ids_sha256"] for o in row["outputs"].values()}) == 1
    tdoc = json.loads(teacher.read_text())
    assert tdoc["passed"] is True
    assert {leg: v["exact"] for leg, v in tdoc["legs"].items()} == dict.fromkeys(doc["legs"],
                                                                                 f"{SUITE_ROWS}/{SUITE_ROWS}")


def test_portable_manifests_match_identity(abba: SimpleNamespace) -> None:
    rep = abba.record["reproducibility"]
    manifest = abba.exp / rep["portable_model_manifest"]
    lock = abba.exp / rep["runtime_lock"]
    identity = json.loads((abba.exp / "identity.json").read_text())
    # The manifest is sha256sum's format, and hashes to identity's manifest_sha256.
    assert sha(manifest) == rep["portable_model_manifest_sha256"] == \
        identity["model"]["manifest_sha256"]
    lines = manifest.read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["config.json", "weights.bin"]
    assert lines[1].split()[0] == hashlib.sha256(bytes(range(256))).hexdigest()
    assert json.loads(lock.read_text()) == identity["runtime_locks"]
    assert sha(lock) == rep["runtime_lock_sha256"]


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def test_verify_recomputes_it_all_and_catches_a_changed_trace(abba: SimpleNamespace,
                                                              tmp_path: Path) -> None:
    assert verify_dir(abba.exp) == []
    copy = writable_copy(abba.exp, tmp_path / "copy")
    trace = copy / "components" / "rmsnorm" / "candidate-1.trace.json"
    data = json.loads(trace.read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e["name"] != "_rmsnorm_kernel"]
    trace.write_text(json.dumps(data))
    fields = {(p.file, p.field) for p in verify_dir(copy)}
    assert ("components/rmsnorm/candidate-1.trace.json", "sha256") in fields
    # The record recomputed from the changed trace differs too, where it should.
    assert ("record.json", "component_evidence.rmsnorm.launches_per_cycle.candidate") in fields


def test_a_bad_component_fails_before_anything_is_written(tmp_path: Path) -> None:
    shutil.copytree(H200, tmp_path / "traces")
    bad = COMPONENT.replace('"_rmsnorm_kernel"]', '"_rmsnorm_kernel"]\ncycle = "decode_step"')
    path, plan = write_plan(tmp_path, plan_toml("bad", extra=bad))
    with pytest.raises(ConfigError, match="no range annotation matches the cycle pattern "
                       "'decode_step'"):
        run_experiment(plan, tmp_path / "exp", plan_text=path.read_bytes())
    assert not (tmp_path / "exp").exists() or not any((tmp_path / "exp").iterdir())


def test_a_component_whose_check_is_not_exact_blocks_the_record(tmp_path: Path) -> None:
    shutil.copytree(H200, tmp_path / "traces")
    check = tmp_path / "traces" / "check.json"
    check.write_text(json.dumps(json.loads(check.read_text()) | {"exact": False}))
    path, plan = write_plan(tmp_path, plan_toml(
        "inexact", design="single", control=None, candidate=2000, extra=COMPONENT,
        prior='value_tok_s = 1000\nid = "prev"'))
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    assert record["valid"] is True and record["status"] == "no_record"
    assert record["record_blockers"] == [
        "component rmsnorm: the component check does not say exact"]
    finish(exp, record)
    assert verify_dir(exp) == []


def test_single_leg_treatment_section(tmp_path: Path) -> None:
    rules = """
[[arms.candidate.log_rules]]
claim = "fake_server_listening"
pattern = "fake server listening on"
[[arms.candidate.log_rules]]
claim = "fp8_draft_projection"
pattern = "fp8 draft projection prepared"
"""
    text = plan_toml("single-treatment", design="single", control=None, candidate=2000,
                     prior='value_tok_s = 1000\nid = "prev"') + rules
    path, plan = write_plan(tmp_path, text)
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    t = record["treatment"]
    assert t["arm"] == "candidate" and t["selector"] == "TOKRECORD_FAKE_TOK_S=2000"
    assert t["target_unchanged"] is True
    assert t["claims"]["fake_server_listening"] is True
    assert t["claims"]["fp8_draft_projection"].startswith(
        "fp8_draft_projection: not claimed because the expected log evidence")
    assert t["num_speculative_tokens"] is None
    assert record["identity_sha256"] is not None and record["source_identity_passed"] is True
    assert record["sha256"]["exactness"] == record["artifacts"][
        "all_vs_canonical_teacher_sha256"]
    assert record["sha256"]["identity"] == sha(exp / "identity.json")
    finish(exp, record)
    assert verify_dir(exp) == []


def test_the_report_shows_the_component_evidence(abba: SimpleNamespace) -> None:
    data = load_report(abba.exp)
    (c,) = data.components
    assert (c.name, c.launches, c.gate) == ("rmsnorm", "54 → 9 (45 removed)", "passed")
    assert c.exact.startswith("exact (the greedy tokens of every checked cycle are equal)")
    text = render_terminal(data, width=200)
    assert "component evidence (profiler traces)" in text and "54 → 9 (45 removed)" in text
    html = render_html(data)
    assert '<section id="components">' in html and "54 → 9 (45 removed)" in html
    assert "54 → 9 (45 removed)" in render_markdown(data)
