"""A sequential plan on the fake server: it stops at the first look that decides, the
record states each look, verify and lint accept it, and a resume runs no further block."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from plan_support import events, plan_toml, write_plan
from tokrecord.errors import ConfigError
from tokrecord.experiment.runner import run_experiment
from tokrecord.experiment.sequential import SEQUENTIAL_METHOD
from tokrecord.record.build import build_record, finish
from tokrecord.record.lint import lint_record
from tokrecord.record.schema import ExperimentRecordV3, validate_record
from tokrecord.record.verify import verify_dir
from tokrecord.report import fmt, load_report, render_html, render_markdown, render_terminal

EIGHT = ["A1", "B1", "B2", "A2", "B3", "A3", "A4", "B4"]
SEQ = "[sequential]\nmax_blocks = 4\nmin_blocks = 2\nspending = \"pocock\"\n"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Four times as fast: decided at the first look (after block 2), not at block 4.
    The legs stream in real time: twice the benches' 250 and 1000 tok/s halves the wait."""
    root = tmp_path_factory.mktemp("seq")
    path, plan = write_plan(root, plan_toml("seq-fast", control=500, candidate=2000, rows=3,
                                            idle=0, prior="value_tok_s = 480", extra=SEQ,
                                            telemetry=False))
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    return SimpleNamespace(plan=plan, path=path, exp=exp, results=results,
                           record=json.loads((exp / "record.json").read_text()))


def test_the_run_stops_at_the_first_deciding_look(stopped: SimpleNamespace) -> None:
    assert list(stopped.results) == EIGHT
    started = [e["leg"] for e in events(stopped.exp) if e["event"] == "leg_start"]
    assert started == ["teacher", *EIGHT]
    looks = [e for e in events(stopped.exp) if e["event"] == "interim_look"]
    assert [(e["look"], e["verdict"], e["action"]) for e in looks] == [
        ("block 2", "FASTER", "stop")]
    stop = next(e for e in events(stopped.exp) if e["event"] == "sequential_stop")
    assert stop["at"] == "block 2" and stop["legs"] == 8 and stop["max_legs"] == 16


def test_the_record_states_each_look_and_the_repeated_interval(stopped: SimpleNamespace
                                                               ) -> None:
    record = stopped.record
    seq = record["sequential"]
    assert record["verdict"] == "FASTER" == seq["verdict"]
    assert record["record_gate"]["verdict"] == seq["record_verdict"] == "FASTER"
    assert record["status"] == "strict_preregistered_record_pass"
    assert record["protocol"]["blocks"] == 2 and record["protocol"]["max_blocks"] == 4
    assert sorted(record["runs"]) == sorted(EIGHT) and len(record["pair_results"]) == 4
    assert seq["spending"] == "pocock" and seq["stopped_at"] == "block 2"
    (look,) = seq["looks"]
    assert look["df"] == 5 and look["fraction"] == 0.5 and look["statistic"] > look["boundary"]
    # The repeated interval is wider than the fixed design's at the same legs.
    va = record["verdict_analysis"]
    assert seq["ci_low"] < va["ci_low"] and seq["ci_high"] > va["ci_high"]
    assert seq["ci_low"] > 1 and "biases" in seq["estimate_note"]
    assert isinstance(validate_record(record), ExperimentRecordV3)


def test_a_sequential_record_verifies_and_lints(stopped: SimpleNamespace) -> None:
    assert verify_dir(stopped.exp) == []
    assert lint_record(stopped.record) == []


def test_the_plan_seals_the_current_method_and_the_record_names_it(stopped: SimpleNamespace
                                                                   ) -> None:
    sealed = json.loads((stopped.exp / "plan.json").read_text())
    assert sealed["sequential"]["method"] == "rci-t/2"
    assert stopped.record["sequential"]["method"].startswith("rci-t/2: ")


def test_lint_checks_the_boundaries_of_the_method_the_record_names(stopped: SimpleNamespace
                                                                   ) -> None:
    """rci-t/2's boundaries spend 0.8 alpha: under rci-t/1's text they are the wrong ones."""
    record = json.loads(json.dumps(stopped.record))
    record["sequential"]["method"] = SEQUENTIAL_METHOD
    fields = {p.field for p in lint_record(record)}
    assert "sequential.looks.0.boundary" in fields
    record["sequential"]["method"] = "made up"
    assert [p.field for p in lint_record(record)] == ["sequential.method"]


def test_every_report_shows_the_adjusted_estimate_beside_the_plain_one(
        stopped: SimpleNamespace) -> None:
    seq = stopped.record["sequential"]
    assert seq["estimate_adjusted_ratio"] is not None
    d = load_report(stopped.exp, verify=False)
    plain = fmt.pct(100 * (seq["estimate_ratio"] - 1))
    adjusted = fmt.pct(100 * (seq["estimate_adjusted_ratio"] - 1))
    for out in (render_terminal(d, width=200), render_markdown(d), render_html(d)):
        flat = " ".join(out.split())
        assert f"plain {plain}, bias-adjusted {adjusted}" in flat
        assert "happens to be large" in flat


def test_lint_catches_a_verdict_the_stopping_rule_did_not_give(stopped: SimpleNamespace
                                                               ) -> None:
    record = json.loads(json.dumps(stopped.record))
    record["sequential"]["looks"][0]["boundary"] *= 0.5
    record["sequential"]["looks"][0]["z_boundary"] = 1.0
    fields = {p.field for p in lint_record(record)}
    assert {"sequential.looks.0.boundary", "sequential.looks.0.z_boundary"} <= fields
    record = json.loads(json.dumps(stopped.record))
    record["verdict"] = "UNDECIDED"
    assert "verdict" in {p.field for p in lint_record(record)}


def test_a_finished_sequential_experiment_runs_no_further_block(stopped: SimpleNamespace
                                                                ) -> None:
    with pytest.raises(ConfigError, match="is complete"):
        run_experiment(stopped.plan, stopped.exp, plan_text=stopped.path.read_bytes())


def test_a_resume_after_the_stop_runs_no_further_block(tmp_path: Path,
                                                       stopped: SimpleNamespace) -> None:
    """Killed after the last leg of the stopping block, before the record: the resume
    recomputes the look from the kept legs and stops there."""
    exp = tmp_path / "exp"
    shutil.copytree(stopped.exp, exp, ignore=shutil.ignore_patterns(
        "record.json", "manifest.sha256", "manifest.sig.json", "*.md", "*.json.sha256"))
    for p in exp.rglob("*"):
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    lines = (exp / "experiment.jsonl").read_text().splitlines(keepends=True)
    keep = [ln for ln in lines if '"complete"' not in ln and "sequential_stop" not in ln
            and "interim_look" not in ln]
    (exp / "experiment.jsonl").write_text("".join(keep))
    results = run_experiment(stopped.plan, exp, plan_text=stopped.path.read_bytes())
    assert list(results) == EIGHT
    assert not (exp / "B5").exists() and not (exp / "A5").exists()
    kinds = [e["event"] for e in events(exp)]
    assert kinds.count("leg_start") == 9 and kinds[-1] == "sequential_stop"


def test_no_effect_with_no_band_runs_to_its_maximum(tmp_path: Path) -> None:
    """An A/A pair of arms with no equivalence band: nothing can decide early, so every
    look but the last goes on and the last one stops, whatever it found."""
    path, plan = write_plan(tmp_path, plan_toml(
        "seq-aa", control=2000, candidate=2000, rows=3, idle=0, telemetry=False,
        extra="[sequential]\nmax_blocks = 3\nmin_blocks = 2\nequivalence_pct = 0\n"))
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    seq = record["sequential"]
    stopped_at = int(seq["stopped_at"].split()[-1])
    assert len(results) == 4 * stopped_at and record["protocol"]["blocks"] == stopped_at
    assert seq["looks"][-1]["action"] == "stop"
    assert all(lk["action"] == "continue" for lk in seq["looks"][:-1])
    if seq["verdict"] == "UNDECIDED":  # the usual outcome (a false SLOWER/FASTER is rare)
        assert stopped_at == 3 and len(seq["looks"]) == 2
