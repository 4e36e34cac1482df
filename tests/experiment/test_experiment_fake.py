"""Preregistered experiments end to end against the packaged paced fake server.

Every experiment here starts real fake-server processes, one per leg; rates are set per
arm through TOKRECORD_FAKE_TOK_S. The suite is short (3-5 rows of 150 tokens: the
headline window of tokens 1..100 is full) so a leg takes about a second. Every plan
captures its teacher, so every leg can be valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from cli_support import cli_in_process
from plan_support import (
    CLI,
    CLI_ENV,
    LEGS,
    MAX_TOKENS,
    SUITE_ROWS,
    events,
    plan_toml,
    write_plan,
)
from tokrecord.errors import ConfigError
from tokrecord.evidence import read_jsonl
from tokrecord.experiment.plan import Plan
from tokrecord.experiment.runner import (
    NullExperimentObserver,
    preregister,
    run_experiment,
)
from tokrecord.experiment.stats import pct_delta
from tokrecord.record.build import build_record, finish


def leg_events(exp: Path, kind: str, leg: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events(exp) if e["event"] == kind and (leg is None or e.get("leg") == leg)]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # In process (tests/cli_support.py): a run or resume and what it printed; the kills
    # are of separate `python -m tokrecord` processes (start_cli).
    return cli_in_process(list(args), CLI_ENV)


def start_cli(plan_path: Path, exp: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen([*CLI, "run", str(plan_path), "--out", str(exp)],
                                stdout=fh, stderr=fh, env=CLI_ENV)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, ValueError):
            if check():
                return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def has_chunk(events_path: Path) -> bool:
    return '"kind":"chunk"' in events_path.read_text(errors="replace")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def attempts_of(record: dict[str, Any], leg: str) -> list[tuple[int, str]]:
    return [(a["attempt"], a["status"]) for a in record["attempts"] if a["leg"] == leg]


def read_record(exp: Path) -> dict[str, Any]:
    return json.loads((exp / "record.json").read_text())  # type: ignore[no-any-return]


@contextlib.contextmanager
def reaping(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Never leave the CLI we started running when an assertion fails."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# --------------------------------------------------------------------------- a real ABBA


# The candidate is 60 % faster and the prior sits 10 % above the control: a busy host
# blurs each leg's rate by a few percent, never by enough to flip which arm is faster, to
# put a candidate leg below the prior or to lift the verdict's interval off FASTER (at
# 30 %, with t(2) = 4.3, a machine at load 10 once put the interval's low end at 0.97). So the
# tests on `faster` check directions (and exact derivations), never an effect's size, and
# run in the parallel group. The size of an effect is a speed figure: bench/fidelity checks
# the client's rates against the server's send log, bench/verdict the verdict's calibration.
@pytest.fixture(scope="module")
def faster(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("faster")
    path, plan = write_plan(root, plan_toml("faster", control=1000, candidate=1600,
                                            teacher="capture", prior="value_tok_s = 1100"))
    exp = root / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    record_path = finish(exp, record)
    return SimpleNamespace(root=root, path=path, plan=plan, exp=exp, results=results,
                           record=record, record_path=record_path)


def test_abba_faster_candidate_sets_a_record(faster: SimpleNamespace) -> None:
    record, results = faster.record, faster.results
    assert list(results) == LEGS
    assert [results[n].arm for n in LEGS] == ["control", "candidate", "candidate", "control"]
    for name in LEGS:
        assert results[name].status == "complete" and results[name].valid, name
        run = record["runs"][name]
        assert run["valid"] is True and run["attempts"] == 1
        assert run["teacher_exact"] == f"{SUITE_ROWS}/{SUITE_ROWS}"
        assert run["headline_tok_s"] == results[name].summary.tok_s_out
        assert run["evidence_sha256"].keys() >= {"summary.json", "rows.json", "events.jsonl"}
    # Direction: each candidate leg is faster than each control leg.
    assert min(record["runs"][n]["headline_tok_s"] for n in ("B1", "B2")) > max(
        record["runs"][n]["headline_tok_s"] for n in ("A1", "A2"))
    quality = record["quality"]
    assert quality["all_legs_teacher_exact"] == f"{4 * SUITE_ROWS}/{4 * SUITE_ROWS}"
    assert quality["all_legs_cross_exact"] is True and quality["all_legs_valid"] is True
    assert quality["retries"] == 0 and quality["full_abba_causal_pass"] is True
    for key, (cand, ctrl) in {"B1_vs_A1": ("B1", "A1"), "B2_vs_A2": ("B2", "A2")}.items():
        pair = record["pair_results"][key]
        assert pair["headline_delta_pct"] > 0
        assert pair["headline_delta_pct"] == pytest.approx(
            pct_delta(results[cand].summary.tok_s_out, results[ctrl].summary.tok_s_out), rel=1e-12)
        assert pair["paired_median_delta_pct"] > 0
        assert pair["candidate_row_wins"].endswith(f"/{SUITE_ROWS}") and pair["passed"] is True
    assert "bootstrap" not in record and record["schema"] == "tokrecord.experiment-record/v3"
    va = record["verdict_analysis"]
    assert va["ratio"] > 1
    assert va["ci_low"] > 1 and va["ci_low"] <= va["ratio"] <= va["ci_high"]
    assert va["df"] == 2 and va["blocks"] == 1 and va["legs"] == 4 and va["rows_used"] == SUITE_ROWS
    assert va["leg_noise_df"] == 2 and va["leg_noise_sd_pct"] is not None
    assert record["verdict"] == "FASTER" == va["verdict"]
    assert record["protocol"]["design"] == "abba" and record["protocol"]["blocks"] == 1
    assert record["protocol"]["pairs"] == ["B1_vs_A1", "B2_vs_A2"]
    assert record["power"] is None
    gate = record["record_gate"]
    heads = [results[n].summary.tok_s_out for n in ("B1", "B2")]
    assert gate["candidate_lower_start_tok_s"] == min(heads)
    assert gate["candidate_higher_start_tok_s"] == max(heads)
    assert gate["control_lower_start_tok_s"] == min(results[n].summary.tok_s_out
                                                    for n in ("A1", "A2"))
    assert gate["prior_record_tok_s"] == 1100
    assert gate["delta_vs_prior_record_tok_s"] == pytest.approx(min(heads) - 1100, rel=1e-12)
    assert gate["strict_preregistered_record_pass"] is True and gate["reasons"] == []
    assert record["status"] == "strict_preregistered_record_pass"
    assert record["protocol"]["order"] == ["A1-control", "B1-candidate", "B2-candidate",
                                           "A2-control"]
    assert record["protocol"]["prompt_count_per_leg"] == SUITE_ROWS
    assert record["protocol"]["max_tokens"] == MAX_TOKENS


def test_record_file_is_what_build_record_returned(faster: SimpleNamespace) -> None:
    assert faster.record_path == faster.exp / "record.json"
    assert read_record(faster.exp) == json.loads(json.dumps(faster.record))
    assert events(faster.exp)[-1]["event"] == "complete"


def test_plan_hash_in_every_leg_and_the_record(faster: SimpleNamespace) -> None:
    sha = faster.plan.sha256
    exp = faster.exp
    assert (exp / "plan.sha256").read_text().split() == [sha, "plan.json"]
    assert (exp / "plan.json").read_bytes() == faster.plan.canonical() + b"\n"
    assert (exp / "plan.toml").read_bytes() == faster.path.read_bytes()
    assert faster.record["plan_sha256"] == sha
    for name in [*LEGS, "teacher"]:
        run_dir = exp / name / "attempt-1"
        config = json.loads((run_dir / "config.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        assert config["leg"]["plan_sha256"] == sha, name
        assert summary["plan_sha256"] == sha, name
    prereg = events(exp)[0]
    assert prereg["event"] == "preregistered" and prereg["plan_sha256"] == sha
    assert prereg["legs"] == LEGS


def test_state_log_order_and_idle_gaps(faster: SimpleNamespace) -> None:
    kinds = {"preregistered", "leg_start", "leg_end", "teacher_captured", "idle_gap", "complete",
             "resumed", "orphan_server_stopped"}
    log = [(e["event"], e.get("leg") or e.get("before")) for e in events(faster.exp)
           if e["event"] in kinds]
    assert log == [
        ("preregistered", None), ("leg_start", "teacher"), ("leg_end", "teacher"),
        ("teacher_captured", None),
        ("idle_gap", "A1"), ("leg_start", "A1"), ("leg_end", "A1"),
        ("idle_gap", "B1"), ("leg_start", "B1"), ("leg_end", "B1"),
        ("idle_gap", "B2"), ("leg_start", "B2"), ("leg_end", "B2"),
        ("idle_gap", "A2"), ("leg_start", "A2"), ("leg_end", "A2"),
        ("complete", None),
    ]
    measured = faster.record["protocol"]["idle_gap_seconds_measured"]
    assert set(measured) == {"A1", "B1", "B2", "A2"}
    assert all(v >= faster.plan.idle_gap_s > 0 for v in measured.values()), measured
    # the teacher is captured from the control arm on its own fresh server
    teacher = json.loads((faster.exp / "teacher.json").read_text())
    assert teacher["arm"]["name"] == "control"


def test_completed_plan_is_never_run_again(faster: SimpleNamespace) -> None:
    exp = faster.exp
    state_before = (exp / "experiment.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="is complete; a preregistered plan is run once"):
        run_experiment(faster.plan, exp)
    proc = cli("run", str(faster.path), "--out", str(exp))
    assert proc.returncode == 2, proc.stderr
    assert "is complete" in proc.stderr and "Traceback" not in proc.stderr
    assert (exp / "experiment.jsonl").read_bytes() == state_before
    for name in LEGS:
        assert sorted(p.name for p in (exp / name).iterdir()) == ["attempt-1"]


def test_changed_plan_is_refused_on_a_completed_experiment(faster: SimpleNamespace) -> None:
    exp = faster.exp
    state_before = (exp / "experiment.jsonl").read_bytes()
    changed = faster.path.read_text().replace("value_tok_s = 1100", "value_tok_s = 1000")
    path, plan = write_plan(faster.root / "changed", changed)
    assert plan.name == faster.plan.name and plan.sha256 != faster.plan.sha256
    with pytest.raises(ConfigError, match="holds a different preregistered plan"):
        run_experiment(plan, exp)
    proc = cli("run", str(path), "--out", str(exp))
    assert proc.returncode == 2 and "different preregistered plan" in proc.stderr
    assert (exp / "experiment.jsonl").read_bytes() == state_before


def test_changed_plan_is_refused_after_preregistration(tmp_path: Path) -> None:
    _, plan = write_plan(tmp_path, plan_toml("pre", control=4000, candidate=4000, rows=2))
    exp = tmp_path / "exp"
    preregister(plan, exp, None)
    _, changed = write_plan(tmp_path / "b", plan_toml("pre", control=4000, candidate=4100, rows=2))
    with pytest.raises(ConfigError, match="different preregistered plan"):
        run_experiment(changed, exp)
    assert not (exp / "A1").exists()
    assert next(e["event"] for e in events(exp)) == "preregistered"
    assert not any(e["event"] in ("leg_start", "resumed") for e in events(exp))
    # a directory that is not an experiment is never used
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    with pytest.raises(ConfigError, match="is not an experiment directory"):
        run_experiment(plan, other)


# Equal arms, and pairs that must beat +20 % to pass: no load makes an A/A pair pass that,
# so "no record, and the comparison is why" holds on any host (parallel group). How close
# to zero an A/A delta lands, and how rarely an A/A verdict says FASTER, are the verdict's
# calibration: bench/verdict measures them by simulation.
def test_a_a_experiment_makes_no_record(tmp_path: Path) -> None:
    path, plan = write_plan(tmp_path, plan_toml("aa", control=1000, candidate=1000,
                                                prior="value_tok_s = 500", telemetry=False,
                                                extra="[criteria]\nheadline_delta_pct_gt = 20"))
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    finish(exp, record)
    assert all(r.valid for r in results.values())
    for key, (cand, ctrl) in {"B1_vs_A1": ("B1", "A1"), "B2_vs_A2": ("B2", "A2")}.items():
        pair = record["pair_results"][key]
        assert pair["headline_delta_pct"] == pytest.approx(
            pct_delta(results[cand].summary.tok_s_out, results[ctrl].summary.tok_s_out), rel=1e-12)
        assert pair["passed"] is False
        assert any("not > 20 %" in c for c in pair["failed_criteria"]), pair["failed_criteria"]
    va = record["verdict_analysis"]
    assert va["ci_low"] <= va["ratio"] <= va["ci_high"]
    gate = record["record_gate"]
    assert record["status"] == "no_record"
    assert gate["strict_preregistered_record_pass"] is False
    assert gate["reasons"]
    # the prior is beaten (~1000 > 500) and every leg is valid: what fails is the comparison
    assert "not every pair passed its preregistered criteria" in gate["reasons"]
    assert all("prior" not in r and "quality" not in r for r in gate["reasons"]), gate["reasons"]
    assert read_record(exp)["status"] == "no_record"


# --------------------------------------------------------------------------- resume


def test_resume_after_interruption_between_legs(tmp_path: Path) -> None:
    # The idle gap is where the interruption lands: long enough to catch after A1's
    # leg_end on a busy host (the wait polls every 20 ms). No sampler: between legs none runs.
    path, plan = write_plan(tmp_path, plan_toml("between", control=4000, candidate=4200,
                                                   rows=3, idle=0.6, telemetry=False))
    exp, log = tmp_path / "exp", tmp_path / "cli.log"
    with reaping(start_cli(path, exp, log)) as proc:
        wait_until(lambda: bool(leg_events(exp, "leg_end", "A1")), "A1's leg_end")
        assert not leg_events(exp, "leg_start", "B1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130, log.read_text()
    assert not leg_events(exp, "leg_start", "B1") and not (exp / "B1").exists()
    a1_summary = (exp / "A1" / "attempt-1" / "summary.json").read_bytes()
    assert json.loads(a1_summary)["status"] == "complete"

    proc2 = cli("run", str(path), "--out", str(exp))
    assert proc2.returncode == 0, proc2.stderr
    record = read_record(exp)
    assert [(a["leg"], a["attempt"], a["status"]) for a in record["attempts"]] == [
        ("teacher", 1, "complete"), ("A1", 1, "complete"), ("B1", 1, "complete"),
        ("B2", 1, "complete"), ("A2", 1, "complete")]
    assert record["quality"]["retries"] == 0
    assert all(record["runs"][n]["attempts"] == 1 for n in LEGS)
    # A1 was kept, not run again
    assert len(leg_events(exp, "leg_start", "A1")) == 1
    assert sorted(p.name for p in (exp / "A1").iterdir()) == ["attempt-1"]
    assert (exp / "A1" / "attempt-1" / "summary.json").read_bytes() == a1_summary
    assert [e["event"] for e in events(exp)].count("resumed") == 1
    # the idle gap before B1 is measured from A1's stop, across the interruption
    assert record["protocol"]["idle_gap_seconds_measured"]["B1"] >= plan.idle_gap_s
    assert record["status"] == "no_record"  # no prior declared


def test_resume_after_interruption_during_a_leg(tmp_path: Path) -> None:
    path, _ = write_plan(tmp_path, plan_toml("during", control=4000, candidate=300, rows=3))
    exp, log = tmp_path / "exp", tmp_path / "cli.log"
    b1 = exp / "B1" / "attempt-1"
    with reaping(start_cli(path, exp, log)) as proc:
        wait_until(lambda: has_chunk(b1 / "events.jsonl"), "a chunk in B1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130, log.read_text()
    summary = json.loads((b1 / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["valid"] is False
    assert json.loads((b1 / "cleanup.json").read_text())["passed"] is True
    ends = leg_events(exp, "leg_end", "B1")
    assert [(e["attempt"], e["status"]) for e in ends] == [(1, "interrupted")]

    proc2 = cli("run", str(path), "--out", str(exp))
    assert proc2.returncode == 0, proc2.stderr
    record = read_record(exp)
    b2 = exp / "B1" / "attempt-2"
    assert json.loads((b2 / "summary.json").read_text())["status"] == "complete"
    # attempt 2 ran from scratch: every row requested again on its own server
    assert [e["row"] for e in read_jsonl(b2 / "events.jsonl") if e["kind"] == "request"] == [0, 1, 2]
    assert attempts_of(record, "B1") == [(1, "interrupted"), (2, "complete")]
    assert [a["leg"] for a in record["attempts"]] == ["teacher", "A1", "B1", "B1", "B2", "A2"]
    assert record["quality"]["retries"] == 1
    assert record["runs"]["B1"]["attempts"] == 2
    assert record["runs"]["B1"]["run_dir"] == str(b2)
    assert all(record["runs"][n]["attempts"] == 1 for n in ("A1", "B2", "A2"))
    assert record["quality"]["all_legs_valid"] is True
    # the evidence of the interrupted attempt is kept, not rewritten
    assert json.loads((b1 / "summary.json").read_text()) == summary


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """An experiment hard-killed while B1 streams, then resumed with the same command."""
    root = tmp_path_factory.mktemp("killed")
    # A real idle gap (the test checks the retry waited it after the orphan's stop), but a
    # short one: the runner sleeps it before every leg.
    path, plan = write_plan(root, plan_toml("killed", control=4000, candidate=300, rows=3,
                                            idle=0.3))
    exp, log = root / "exp", root / "cli.log"
    b1 = exp / "B1" / "attempt-1"
    pid = None
    try:
        with reaping(start_cli(path, exp, log)) as proc:
            wait_until(lambda: has_chunk(b1 / "events.jsonl"), "a chunk in B1")
            pid = int(json.loads((b1 / "server.json").read_text())["pgid"])
            proc.kill()
            proc.wait(timeout=30)
        orphan_alive_after_kill = alive(pid)
        state_after_kill = events(exp)
        resumed = cli("run", str(path), "--out", str(exp))
        orphan_alive_after_resume = alive(pid)
    finally:
        if pid is not None and alive(pid):  # the server this fixture started, by its group id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return SimpleNamespace(root=root, plan=plan, exp=exp, b1=b1, pid=pid, resumed=resumed,
                           orphan_alive_after_kill=orphan_alive_after_kill,
                           orphan_alive_after_resume=orphan_alive_after_resume,
                           state_after_kill=state_after_kill)


def test_resume_after_sigkill_stops_the_orphan_and_completes(killed: SimpleNamespace) -> None:
    assert killed.orphan_alive_after_kill, "the hard kill should have left the server running"
    assert [e["event"] for e in killed.state_after_kill][-1] == "leg_start"
    assert not (killed.b1 / "summary.json").exists()
    assert killed.resumed.returncode == 0, killed.resumed.stderr
    assert not killed.orphan_alive_after_resume
    exp = killed.exp
    stopped = [e for e in events(exp) if e["event"] == "orphan_server_stopped"]
    assert [(e["leg"], e["attempt"]) for e in stopped] == [("B1", 1)]
    ends = leg_events(exp, "leg_end", "B1")
    assert [(e["attempt"], e["status"], e["valid"]) for e in ends] == [
        (1, "interrupted", False), (2, "complete", True)]
    assert ends[0]["error"] == "no result: the run was killed"
    record = read_record(exp)
    assert attempts_of(record, "B1") == [(1, "interrupted"), (2, "complete")]
    assert record["quality"]["retries"] == 1 and record["runs"]["B1"]["attempts"] == 2
    assert events(exp)[-1]["event"] == "complete"


def test_idle_gap_is_honoured_after_the_orphan_is_stopped(killed: SimpleNamespace) -> None:
    exp = killed.exp
    stopped = next(e for e in events(exp) if e["event"] == "orphan_server_stopped")
    retry = next(e for e in leg_events(exp, "leg_start", "B1") if e["attempt"] == 2)
    assert retry["unix"] - stopped["unix"] >= killed.plan.idle_gap_s


# --------------------------------------------------------------------------- resume by another path


class _InterruptB1(NullExperimentObserver):
    """Ctrl-C while B1's first tokens arrive (in-process, the same path as SIGTERM)."""

    def __init__(self) -> None:
        self.leg = ""

    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None:
        self.leg = name

    def row_tokens(self, index: int, received: int, t_ns: int) -> None:
        if self.leg == "B1":
            raise KeyboardInterrupt


def _interrupted_at_b1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plan:
    # One leg: what is checked is the resume by another path, not the design (issue 28: an
    # ABBA ran five legs here, twice).
    _, plan = write_plan(tmp_path, plan_toml("spelling", design="single", control=None,
                                             candidate=4000, rows=2, idle=0, teacher=None))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(plan, Path("exp"), _InterruptB1())
    return plan


def test_resume_through_another_spelling_of_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _interrupted_at_b1(tmp_path, monkeypatch)
    exp = tmp_path / "exp"  # the same directory, now absolute
    results = run_experiment(plan, exp)
    record = build_record(plan, exp, results)
    # (A single-leg record counts no retries: test_resume_after_interruption_during_a_leg
    # checks an ABBA's count of 1.)
    assert attempts_of(record, "B1") == [(1, "interrupted"), (2, "complete")]


def test_resume_from_another_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _interrupted_at_b1(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp)
    record = build_record(plan, exp, results)
    assert attempts_of(record, "B1") == [(1, "interrupted"), (2, "complete")]


# --------------------------------------------------------------------------- single leg


# The arm runs at 2000 tok/s against a prior of 1000: a busy host cannot halve the measured
# rate, so the record passes on any host (parallel group). Every other figure is checked
# as a derivation of the measured one; the precision of the measured one is bench/fidelity's.
def test_single_design_one_candidate_leg(tmp_path: Path) -> None:
    prior = "value_tok_s = 1000\nid = \"prev\"\nbest_exact_tok_s = 1900\ngoal_tok_s = 1800"
    path, plan = write_plan(tmp_path, plan_toml(
        "single", design="single", control=None, candidate=2000, prior=prior,
        extra='headline = "legacy-inclusive-events"'))
    assert [n for n, _ in plan.legs] == ["B1"]
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    assert list(results) == ["B1"]
    assert sorted(p.name for p in exp.iterdir() if p.is_dir()) == ["B1", "manifests", "teacher"]
    record = build_record(plan, exp, results)
    finish(exp, record)
    assert read_record(exp) == json.loads(json.dumps(record))

    assert record["schema"] == "tokrecord.single-leg-record/v2"
    assert record["plan_sha256"] == plan.sha256
    s = results["B1"].summary
    acc = record["metric_accounting"]
    assert acc["published_convention"] == "legacy-inclusive-events"
    assert acc["published_formula"] == "100 / (timestamp[100] - timestamp[1])"
    assert acc["conventional_interval_formula"] == "99 / (timestamp[100] - timestamp[1])"
    assert acc["timestamped_events"] == 100 and acc["inter_token_intervals"] == 99
    conv, legacy = acc["conventional_interval_value_tok_s"], acc["legacy_inclusive_events_value_tok_s"]
    assert 1000 < conv <= 2000 * 1.25  # beats the prior; the arm's rate reached the server
    assert legacy / conv == pytest.approx(100 / 99, rel=1e-9)  # same window, 100 vs 99
    assert acc["published_value_tok_s"] == legacy == s.tok_s_out
    assert acc["chunk_aware_value_tok_s"] == pytest.approx(conv, rel=1e-9)  # one token per chunk
    assert acc["conventional_goal_tok_s"] == 1800
    assert acc["conventional_margin_to_goal_tok_s"] == pytest.approx(conv - 1800, rel=1e-12)

    rec = record["record"]
    value = rec["value_tok_s"]
    assert value == legacy
    assert "conventional" in rec["value_qualification"]
    assert rec["prior_approved_tok_s"] == 1000 and rec["prior_approved_id"] == "prev"
    assert rec["delta_vs_approved_tok_s"] == pytest.approx(value - 1000, rel=1e-12)
    assert rec["delta_vs_approved_pct"] == pytest.approx(100 * (value / 1000 - 1), rel=1e-12)
    assert rec["prior_best_exact_tok_s"] == 1900
    assert rec["delta_vs_prior_best_exact_pct"] == pytest.approx(100 * (value / 1900 - 1),
                                                                 rel=1e-12)
    assert rec["margin_over_goal_tok_s"] == pytest.approx(value - 1800, rel=1e-12)
    assert record["status"] == "record_pass" and record["valid"] is True
    # the teacher comes from the candidate arm (there is no control) on its own server
    assert [(a["leg"], a["attempt"], a["status"]) for a in record["attempts"]] == [
        ("teacher", 1, "complete"), ("B1", 1, "complete")]
    assert json.loads((exp / "teacher.json").read_text())["arm"]["name"] == "candidate"
    assert record["quality"]["teacher_exact"]["count"] == f"{SUITE_ROWS}/{SUITE_ROWS}"
    assert record["operational"]["legs"]["B1"]["cleanup_passed"] is True
    assert record["summary"]["tok_s_out"] == value
    assert record["sha256"].keys() >= {"summary.json", "rows.json", "events.jsonl"}
    assert [e["before"] for e in events(exp) if e["event"] == "idle_gap"] == ["B1"]
