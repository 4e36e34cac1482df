"""A sequential sweep end to end on the fake server: it stops at the first look that
decides, logs each look, records them, and verify and lint recompute where it stopped.

Arms at 250, 1000 and 400 tok/s: a 4x ratio. Which look decides depends on the leg
figures' noise, which host load raises (on a quiet machine block 2, the first look, on t
with 2 df; in a loaded fresh-clone `make test` it was block 3): the tests check that the
run stopped at the first look whose statistic crossed its boundary, before max_blocks,
and that nothing ran beyond it, whichever look that was. Parallel group."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from plan_support import events, plan_toml, write_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.schema import ExperimentRecordV3, validate_record
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
    # about the design's flow, not its figures: no telemetry sampler per leg (issue 28)
    text = plan_toml("fake-seq-sweep", design="sweep", control=None, rows=3, idle=0,
                     extra=SWEEP, telemetry=False)
    text = text.split("[arms.candidate]")[0] + "[prior]\nvalue_tok_s = 230\n"
    path, plan = write_plan(root, text)
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    looks = [e for e in events(exp) if e["event"] == "interim_look"]
    stop_block = int(looks[-1]["look"].split()[-1]) if looks else 0
    return SimpleNamespace(plan=plan, exp=exp, results=results, path=path, looks=looks,
                           stop_block=stop_block,
                           record=json.loads((exp / "record.json").read_text()))


def test_a_sequential_sweep_stops_at_the_first_look_that_decides(
        swept: SimpleNamespace) -> None:
    # 3 arms x 4 blocks planned; a look before block 4 singles out 1000 tok/s
    assert len(swept.plan.legs) == 12
    b = swept.stop_block
    assert 2 <= b < 4, "a 4x ratio must be decided before the last look"
    assert sorted(swept.results) == sorted(f"{arm}{i}" for arm in "ABC" for i in range(1, b + 1))
    looks = swept.looks
    assert [e["look"] for e in looks] == [f"block {i}" for i in range(2, b + 1)]
    for e in looks[:-1]:  # every earlier look went on
        assert e["action"] == "continue"
    assert looks[-1]["action"] == "stop"
    assert looks[-1]["boundary"] is not None and looks[-1]["statistic"] > looks[-1]["boundary"]
    stop = [e for e in events(swept.exp) if e["event"] == "sequential_stop"]
    assert len(stop) == 1 and stop[0]["at"] == f"block {b}" and stop[0]["verdict"] == "FASTER"
    assert stop[0]["legs"] == 3 * b and stop[0]["max_legs"] == 12


def test_the_record_states_each_look_and_uses_its_boundary(swept: SimpleNamespace) -> None:
    record = validate_record(swept.record)
    assert isinstance(record, ExperimentRecordV3) and record.sweep is not None
    seq = record.sweep.sequential
    b = swept.stop_block
    assert seq is not None and seq.stopped and seq.stopped_at == f"block {b}"
    assert [look.block for look in seq.looks] == list(range(2, b + 1)) and seq.max_blocks == 4
    a = record.sweep.analysis
    # the intervals are the stopping look's repeated ones: its boundary, not Dunnett's value
    assert a.critical_value == seq.looks[-1].boundary
    assert a.mcb_critical_value == seq.looks[-1].boundary
    assert a.blocks == b and a.best == "tok_s=1000" and record.sweep.gate.passed
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
    b = swept.stop_block
    assert f"legs (sweep, {b} blocks)" in text and "(ABBA" not in text
    assert "sweep: each arm against control" in text
    for arm in ("tok_s=250 (control)", "tok_s=1000 (best)", "tok_s=400"):
        assert arm in text
    assert "arm tok_s=1000 is fastest of the token-exact arms" in text
    df = 2 * (b - 1)  # (arms - 1)(blocks - 1)
    assert f"repeated, the sequential boundary on {df} df" in text
    assert f"look block {b}: max t({df}) = " in text
    assert "tok_s=1000 claimed fastest; stop" in text
    assert f"stopped at block {b}, {4 - b} of 4 blocks not run" in text
