"""A sequential sweep end to end on the fake server: it stops at the first look that
decides, logs each look, records them, and verify and lint recompute where it stopped.

Arms at 250, 1000 and 400 tok/s: a 4x ratio that no host load blurs, so the first look
(block 2) singles out 1000 tok/s on any machine: parallel group."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from plan_support import events, plan_toml, write_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.schema import ExperimentRecordV2, validate_record
from tokrecord.record.verify import verify_dir

SWEEP = """[sequential]
max_blocks = 4
spending = "pocock"
[sweep]
control = "tok_s=250"
[[sweep.parameters]]
name = "tok_s"
env = "TOKRECORD_FAKE_TOK_S"
values = [250, 1000, 400]
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("seqsweep")
    text = plan_toml("fake-seq-sweep", design="sweep", control=None, rows=3, idle=0,
                     extra=SWEEP)
    text = text.split("[arms.candidate]")[0] + "[prior]\nvalue_tok_s = 230\n"
    path, plan = write_plan(root, text)
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    return SimpleNamespace(plan=plan, exp=exp, results=results, path=path,
                           record=json.loads((exp / "record.json").read_text()))


def test_a_sequential_sweep_stops_at_the_first_look_that_decides(
        swept: SimpleNamespace) -> None:
    # 3 arms x 4 blocks planned; the look after block 2 singles out 1000 tok/s
    assert len(swept.plan.legs) == 12
    assert sorted(swept.results) == ["A1", "A2", "B1", "B2", "C1", "C2"]
    looks = [e for e in events(swept.exp) if e["event"] == "interim_look"]
    assert [e["look"] for e in looks] == ["block 2"] and looks[0]["action"] == "stop"
    assert looks[0]["boundary"] is not None and looks[0]["statistic"] > looks[0]["boundary"]
    stop = [e for e in events(swept.exp) if e["event"] == "sequential_stop"]
    assert len(stop) == 1 and stop[0]["at"] == "block 2" and stop[0]["verdict"] == "FASTER"
    assert stop[0]["legs"] == 6 and stop[0]["max_legs"] == 12


def test_the_record_states_each_look_and_uses_its_boundary(swept: SimpleNamespace) -> None:
    record = validate_record(swept.record)
    assert isinstance(record, ExperimentRecordV2) and record.sweep is not None
    seq = record.sweep.sequential
    assert seq is not None and seq.stopped and seq.stopped_at == "block 2"
    assert [look.block for look in seq.looks] == [2] and seq.max_blocks == 4
    a = record.sweep.analysis
    # the intervals are the look's repeated ones: its boundary, not Dunnett's value
    assert a.critical_value == seq.looks[0].boundary
    assert a.mcb_critical_value == seq.looks[0].boundary
    assert a.blocks == 2 and a.best == "tok_s=1000" and record.sweep.gate.passed
    assert swept.record["sequential"] is None  # an ABBA's section; a sweep's is its own


def test_verify_and_lint_recompute_the_sequential_sweep(swept: SimpleNamespace) -> None:
    from tokrecord.record.lint import lint_record

    assert verify_dir(swept.exp) == []
    assert lint_record(swept.record) == []


def test_run_prints_the_sweep_summary_and_its_looks_not_an_empty_pairs_table(
        swept: SimpleNamespace) -> None:
    from rich.console import Console

    from tokrecord.cli.view import print_experiment

    console = Console(width=200, record=True, color_system=None)
    print_experiment(console, swept.record, swept.exp / "record.json")
    text = console.export_text()
    assert "pairs (candidate vs control)" not in text  # what `run` printed, empty
    assert "legs (sweep, 2 blocks)" in text and "(ABBA" not in text
    assert "sweep: each arm against control" in text
    for arm in ("tok_s=250 (control)", "tok_s=1000 (best)", "tok_s=400"):
        assert arm in text
    assert "arm tok_s=1000 is fastest of the token-exact arms" in text
    assert "repeated, the sequential boundary on 2 df" in text
    assert "look block 2: max t(2) = " in text and "tok_s=1000 claimed fastest; stop" in text
    assert "stopped at block 2, 2 of 4 blocks not run" in text
