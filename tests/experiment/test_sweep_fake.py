"""A sweep end to end on the fake server: legs in Williams order, a record with its
`sweep` section that validates, and verify recomputing it from the evidence."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from plan_support import events, plan_toml, write_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.schema import ExperimentRecordV3, validate_record
from tokrecord.record.verify import verify_dir

# Paced fake servers in real time, but only checks load cannot flip: the arms run at 500,
# 800 and 2000 tok/s, and the tests assert which is best, a ratio above 2.5 (true: 4), a
# lower bound above 1 and a best-arm headline above 1200 (true: 2000). A busy host blurs a
# leg by some percent, never by those margins: parallel group. The rates are twice the
# benches' (same ratios): the legs stream in real time, and halving them saves some 5 s of
# waiting; faster still, a few ms of scheduling delay would be a large share of a leg's
# 100-token headline window.

SWEEP = """blocks = 3
[sweep]
control = "tok_s=500"
[[sweep.parameters]]
name = "tok_s"
env = "TOKRECORD_FAKE_TOK_S"
values = [500, 2000, 800]
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("sweep")
    text = plan_toml("fake-sweep", design="sweep", control=None, rows=3, idle=0, extra=SWEEP,
                     telemetry=False)
    # a sweep generates its arms
    text = text.split("[arms.candidate]")[0] + "[prior]\nvalue_tok_s = 460\n"
    path, plan = write_plan(root, text)
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    return SimpleNamespace(plan=plan, exp=exp, results=results,
                           record=json.loads((exp / "record.json").read_text()))


def test_legs_run_every_arm_once_per_block_in_williams_order(sweep: SimpleNamespace) -> None:
    started = [e["leg"] for e in events(sweep.exp) if e["event"] == "leg_start"]
    assert started == ["teacher", "A1", "B1", "C1", "C2", "B2", "A2", "B3", "C3", "A3"]
    assert [sweep.results[n].arm for n in ("A1", "B1", "C1")] == [
        "tok_s=500", "tok_s=2000", "tok_s=800"]


def test_record_has_the_sweep_and_validates(sweep: SimpleNamespace) -> None:
    record = validate_record(sweep.record)
    assert isinstance(record, ExperimentRecordV3) and record.sweep is not None
    a = record.sweep.analysis
    assert a.control == "tok_s=500" and a.arms == ("tok_s=500", "tok_s=2000", "tok_s=800")
    assert a.df == 4 and [c.arm for c in a.contrasts] == ["tok_s=2000", "tok_s=800"]
    fast = a.contrasts[0]
    assert fast.ratio > 2.5 and fast.ci_low > 1
    assert all(s.exact for s in a.arm_summaries)
    assert record.protocol.design == "sweep" and record.pair_results == {}
    assert set(record.treatment) == set(a.arms)
    # 2000 against 800 and 500 tok/s: singled out, and the record is its legs'
    assert a.best == "tok_s=2000" and record.sweep.gate.passed
    assert sweep.record["status"] == "strict_preregistered_record_pass"
    assert record.record_gate.candidate_lower_start_tok_s is not None
    assert record.record_gate.candidate_lower_start_tok_s > 1200
    best_legs = {"B1", "B2", "B3"}  # arm B is tok_s=2000: the headline is its slowest leg
    assert record.metric_accounting.headline_leg in best_legs


def test_submit_refuses_a_sweep_before_verifying_and_names_its_best_arm(
        sweep: SimpleNamespace) -> None:
    from tokrecord.submit.facts import SubmitError, load_facts

    def never(_: Path) -> list[Any]:
        raise AssertionError("a sweep must be refused before it is verified")

    with pytest.raises(SubmitError, match=r"design 'sweep'.*best arm is tok_s=2000"):
        load_facts(sweep.exp, verify=never)


def test_verify_recomputes_the_sweep(sweep: SimpleNamespace, tmp_path: Path) -> None:
    assert verify_dir(sweep.exp) == []


def test_lint_recomputes_the_sweep_and_names_a_tampered_field(sweep: SimpleNamespace) -> None:
    import copy

    from tokrecord.record.lint import lint_record

    assert lint_record(sweep.record) == []
    bad = copy.deepcopy(sweep.record)
    bad["sweep"]["analysis"]["contrasts"][0]["ci_low"] *= 1.01
    bad["runs"]["B1"]["treatment"] = "tok_s=800"
    fields = {p.field for p in lint_record(bad)}
    assert "sweep.analysis.contrasts.0.ci_low" in fields and "runs.B1.treatment" in fields
    bad = copy.deepcopy(sweep.record)
    bad["protocol"]["blocks"] = 10**9
    assert "protocol.blocks" in {p.field for p in lint_record(bad)}


def test_report_has_the_sweep_table_and_chart(sweep: SimpleNamespace) -> None:
    from tokrecord.record.schema import validate_record
    from tokrecord.report.sweep import sweep_chart, sweep_rows, sweep_statement

    record = validate_record(sweep.record)
    assert isinstance(record, ExperimentRecordV3)
    rows = sweep_rows(record)
    assert [r.arm for r in rows] == ["tok_s=500", "tok_s=2000", "tok_s=800"]
    assert rows[0].control and rows[1].best and all(r.exact for r in rows)
    chart = sweep_chart(rows, 0.95)
    assert chart is not None and "<svg" in chart and "tok_s=2000" in chart
    statement = sweep_statement(record)
    assert statement is not None and "arm tok_s=2000 is fastest" in statement


def test_run_prints_the_sweep_summary_not_an_empty_pairs_table(sweep: SimpleNamespace) -> None:
    from rich.console import Console

    from tokrecord.cli.view import print_experiment

    console = Console(width=200, record=True, color_system=None)
    print_experiment(console, sweep.record, sweep.exp / "record.json")
    text = console.export_text()
    assert "pairs (candidate vs control)" not in text and "legs (sweep, 3 blocks)" in text
    rows = [line for line in text.splitlines() if line.startswith(" tok_s=")]
    assert [r.split()[0] for r in rows] == ["tok_s=500", "tok_s=2000", "tok_s=800"]
    best = next(r for r in rows if "(best)" in r)  # its simultaneous interval and exactness
    assert "FASTER" in best and "yes" in best and "[+" in best
    assert "(Dunnett, 4 df)" in text and "sequential sweep" not in text
