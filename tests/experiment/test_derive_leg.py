"""experiment.leg.derive_leg: the one derivation of a leg's results, which the writer writes
and verify recomputes. Checked against a real sealed H200 leg (examples/h200), read back
from its files, and against that evidence altered."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from tokrecord.evidence import layout, read_jsonl
from tokrecord.experiment.leg import (
    LegConfig,
    LegInputs,
    derive_leg,
    gates_rule,
    idle_snapshots,
    load_rows,
)
from tokrecord.gates import GateStatus, gates_version
from tokrecord.gates.teacher import load_teacher
from tokrecord.metrics import parse_counters
from tokrecord.probes.idle import IdleResult
from tokrecord.probes.telemetry import read_samples
from tokrecord.record.verify import diff
from tokrecord.server.process import CleanupReport
from tokrecord.suite import Suite, parse_suite

LEG = "exp-graphs/A1/attempt-1"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("h200")
    with tarfile.open(ROOT / "examples" / "h200" / "exp-graphs.tar.gz") as tar:
        tar.extractall(out, members=[m for m in tar.getmembers() if m.name.startswith(LEG)],
                       filter="data")
    return out / LEG


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _inputs(run_dir: Path) -> LegInputs:
    raw = _json(run_dir / layout.CONFIG)
    rows = parse_suite((run_dir / layout.SUITE).read_bytes(), layout.SUITE).rows
    suite = Suite(name=raw["suite"]["name"], sha256=raw["suite"]["sha256"], rows=rows)
    config = LegConfig.model_validate({**raw["leg"], "suite": suite})
    cleanup = _json(run_dir / layout.CLEANUP)
    schema = _json(run_dir / layout.GATES)["schema"]
    return LegInputs(
        records=load_rows(run_dir), config=config,
        metrics_before=parse_counters((run_dir / layout.METRICS_BEFORE).read_text()),
        metrics_after=parse_counters((run_dir / layout.METRICS_AFTER).read_text()),
        events=read_jsonl(run_dir / layout.EVENTS),
        server_log=(run_dir / layout.SERVER_LOG).read_text(errors="replace"),
        telemetry=read_samples(run_dir / layout.TELEMETRY)[0],
        cleanup=CleanupReport.model_validate({k: v for k, v in cleanup.items() if k != "passed"}),
        teacher=load_teacher(run_dir / layout.LEG_TEACHER),
        idle={k: IdleResult.model_validate(v) for k, v in _json(run_dir / layout.IDLE).items()},
        idle_before_snapshots=idle_snapshots(run_dir / layout.IDLE_BEFORE),
        ready_seconds=_json(run_dir / layout.SUMMARY)["ready_seconds"], earlier_attempts=(),
        rule=gates_rule(schema), version=gates_version(schema))


def test_derives_what_the_sealed_leg_recorded(run_dir: Path) -> None:
    derived = derive_leg(_inputs(run_dir))
    summary = _json(run_dir / layout.SUMMARY)
    assert diff(summary["summary"], derived.summary.model_dump(mode="json")) == []
    assert derived.engine is not None
    assert diff(summary["engine"], derived.engine.model_dump(mode="json")) == []
    gates = _json(run_dir / layout.GATES)["gates"]
    assert [g["name"] for g in gates] == [g.name for g in derived.gates]
    assert diff(gates, [g.model_dump(mode="json") for g in derived.gates]) == []
    assert derived.telemetry is not None
    telemetry = summary["telemetry"]
    assert diff({**telemetry, "notes": []},
                {**derived.telemetry.model_dump(mode="json", by_alias=True), "notes": []}) == []
    recorded = {f["name"] for f in summary["log_facts"]}
    assert recorded and recorded <= {f.name for f in derived.log_facts}
    assert derived.covariates is not None  # this leg predates them; derived all the same


def test_altered_evidence_changes_what_is_derived(run_dir: Path) -> None:
    ev = _inputs(run_dir)
    before = {g.name: g.status for g in derive_leg(ev).gates}
    assert before["cleanup"] is GateStatus.PASS and before["idle_before"] is GateStatus.PASS
    assert ev.cleanup is not None
    survivor = ev.cleanup.model_copy(update={"surviving_pids": (4242,)})
    ev_bad = replace(ev, cleanup=survivor, records=ev.records[:-1])
    after = derive_leg(ev_bad)
    assert {g.name: g.status for g in after.gates}["cleanup"] is GateStatus.FAIL
    assert after.summary.rows == len(ev.records) - 1
    # A leg sealed before the probes: no telemetry summary and no idle gates.
    old = derive_leg(replace(ev, probes=False, idle_before_snapshots=None))
    assert old.telemetry is None and old.covariates is None
    assert not {"idle_before", "idle_after"} & {g.name for g in old.gates}
