"""Crash safety: the lock, torn lines, write errors, the raw log, resumable steps.

What bench/chaos found, each fixed and pinned here: a second run of a running plan
is refused by a lock; a torn JSONL line is detected and named; a read-only or full
run directory gives one message and exit 74; a SIGKILL in the middle of a fast row
loses none of its raw events; a kill while preregistering or sealing leaves an
experiment that the same command completes; the idle gap is measured on the
monotonic clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cli_support import cli_in_process
from plan_support import CLI, CLI_ENV, plan_toml, write_plan
from tokrecord.client.rawlog import HEADER, RAW_READ, read_raw
from tokrecord.evidence import (
    TornLineError,
    read_jsonl,
    scan_jsonl,
    write_exclusive,
)
from tokrecord.experiment import runner
from tokrecord.experiment.journal import LegEnd, LegStart, Resumed
from tokrecord.experiment.recovery import recover_attempt
from tokrecord.experiment.runner import (
    ExperimentBusyError,
    attempts_log,
    experiment_lock,
    run_experiment,
)
from tokrecord.record.build import build_record, finish
from tokrecord.record.verify import verify_dir
from tokrecord.server.process import RUN_DIR_ENV, servers_of_run


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # In process (tests/cli_support.py): what a run prints and exits with; the kills are of
    # separate `python -m tokrecord` processes.
    return cli_in_process(list(args), CLI_ENV)


def one_message(proc: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in proc.stderr and proc.stderr.count("tokrecord: error:") == 1


# --------------------------------------------------------------------------------- the lock


def test_a_second_run_of_a_running_experiment_is_refused(tmp_path: Path) -> None:
    path, _ = write_plan(tmp_path, plan_toml("locked", rows=3))
    exp = tmp_path / "exp"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from tokrecord.experiment.runner import experiment_lock\n"
         f"with experiment_lock(Path({str(exp)!r})):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = cli("run", str(path), "--out", str(exp))
        assert proc.returncode == 75, proc.stderr
        assert one_message(proc) and "already being run" in proc.stderr
        assert f"pid {holder.pid}" in proc.stderr
        assert not exp.exists()  # refused before anything was written
        # Another spelling of the same directory is the same experiment.
        with pytest.raises(ExperimentBusyError), experiment_lock(tmp_path / "." / "exp"):
            pass
    finally:
        holder.kill()
        holder.wait()
    # SIGKILL released it: the kernel drops a flock with its holder.
    with experiment_lock(exp), experiment_lock(exp):  # re-entrant in one process
        pass


# ------------------------------------------------------------------------------ torn lines


def test_a_torn_last_line_is_detected_and_named(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b'{"kind":"request","row":0}\n{"kind":"chu')
    records, torn = scan_jsonl(log)
    assert records == [{"kind": "request", "row": 0}] and torn == [2]
    with pytest.raises(TornLineError, match=r"events.jsonl: line 2 is torn"):
        read_jsonl(log)
    # A whole-looking last line without its newline was cut too (before the newline).
    log.write_bytes(b'{"a":1}\n{"b":2}')
    assert scan_jsonl(log) == ([{"a": 1}], [2])


def test_a_torn_state_log_is_named_and_never_rewritten(tmp_path: Path) -> None:
    state_path = tmp_path / "experiment.jsonl"
    whole = (b'{"attempt":1,"event":"leg_end","leg":"A1","run_dir":"A1/attempt-1",'
             b'"status":"failed","unix":1,"valid":false}\n')
    state_path.write_bytes(whole + b'{"event":"leg_st')
    state = runner._State(state_path)
    state.append(Resumed(plan_sha256="x"))
    data = state_path.read_bytes()
    assert data.startswith(whole + b'{"event":"leg_st\n')  # ended, not replaced
    events = read_jsonl(state_path, skip_torn=True)
    assert [e["event"] for e in events] == ["leg_end", "torn_jsonl", "resumed"]
    assert events[1]["file"] == "experiment.jsonl" and events[1]["line"] == 2
    assert [a["leg"] for a in attempts_log(tmp_path)] == ["A1"]
    runner._State(state_path).append(Resumed(plan_sha256="x"))  # named once only
    assert sum(e["event"] == "torn_jsonl" for e in read_jsonl(state_path, skip_torn=True)) == 1


# ------------------------------------------------------------------------- write exclusive


def test_write_exclusive_never_replaces_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_exclusive(target, b"{}\n")
    with pytest.raises(FileExistsError):
        write_exclusive(target, b'{"other":1}\n')
    assert target.read_bytes() == b"{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# ---------------------------------------------------------------------- read-only, full disk


@contextlib.contextmanager
def tmpfs(path: Path, opts: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def leftover_servers(root: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(RUN_DIR_ENV, "").startswith(str(root)) and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


def test_a_read_only_directory_gives_one_message_and_exit_74(tmp_path: Path) -> None:
    path, _ = write_plan(tmp_path, plan_toml("read-only", rows=3))
    with tmpfs(tmp_path / "ro", "size=4m,ro") as mnt:
        proc = cli("run", str(path), "--out", str(mnt / "exp"))
        assert proc.returncode == 74, proc.stderr
        assert one_message(proc), proc.stderr
        assert "Read-only file system" in proc.stderr and "run the same command" in proc.stderr


def test_a_full_disk_gives_one_message_then_resumes(tmp_path: Path) -> None:
    path, _ = write_plan(tmp_path, plan_toml("full", rows=3, idle=0))
    with tmpfs(tmp_path / "disk", "size=320k") as mnt:
        exp = mnt / "exp"
        proc = cli("run", str(path), "--out", str(exp))
        assert proc.returncode == 74, proc.stderr
        assert one_message(proc), proc.stderr
        assert "No space left on device" in proc.stderr
        assert not leftover_servers(mnt)
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        again = cli("run", str(path), "--out", str(exp))
        assert again.returncode == 0, again.stderr
        assert verify_dir(exp) == []


# -------------------------------------------------------------------------- the raw log


def test_raw_log_recovers_a_row_cut_by_sigkill(tmp_path: Path) -> None:
    """A real SIGKILL of the harness while a fast row streams (150 tokens at 1000 tok/s,
    reads ~1 ms apart, so nothing is decoded during the row)."""
    # The teacher's leg is the one killed; then one leg, not four, to complete (issue 28).
    path, _ = write_plan(tmp_path, plan_toml("kill-mid-row", design="single", control=None,
                                             rows=3, idle=0))
    exp = tmp_path / "exp"
    run_dir = exp / "teacher" / "attempt-1"
    proc = subprocess.Popen([*CLI, "run", str(path), "--out", str(exp)], env=CLI_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                rows, _ = read_raw(run_dir / "raw-reads.bin")
                ended = {e.get("row") for e in scan_jsonl(run_dir / "events.jsonl")[0]
                         if e.get("kind") == "end"}
                if 1 in rows and len(rows[1].reads) >= 5 and 1 not in ended:
                    proc.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.001)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    kept = [e for e in scan_jsonl(run_dir / "events.jsonl")[0] if e.get("row") == 1]
    assert not any(e["kind"] == "end" for e in kept)  # the live client never recorded it
    resumed = cli("run", str(path), "--out", str(exp))
    assert resumed.returncode == 0, resumed.stderr
    recovered = read_jsonl(run_dir / "recovered-events.jsonl")
    row1 = [e for e in recovered if e["row"] == 1]
    chunks = [e for e in row1 if e["kind"] == "chunk"]
    assert len(chunks) >= 5 and all(e["recovered"] for e in row1)
    assert [e["t_ns"] for e in chunks] == sorted(e["t_ns"] for e in chunks)
    end = row1[-1]
    assert end["kind"] == "end" and end["ok"] is False and "incomplete" in end["error"]
    state = read_jsonl(exp / "experiment.jsonl", skip_torn=True)
    assert any(e["event"] == "raw_recovered" and e["leg"] == "teacher" for e in state)
    # The cut row is evidence, never counted: the record counts attempt 2 only.
    record = json.loads((exp / "record.json").read_text())
    teacher = [a for a in record["attempts"] if a["leg"] == "teacher"]
    assert [(a["attempt"], a["status"]) for a in teacher] == [(1, "interrupted"), (2, "complete")]
    assert verify_dir(exp) == []


def test_recovery_decodes_a_prefix_and_names_a_torn_tail(tmp_path: Path) -> None:
    run_dir = tmp_path / "A1" / "attempt-1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(
        {"engine": {"name": "vllm"}, "leg": {"endpoint": "completions"}}))
    body = b"".join(
        b'data: {"choices":[{"text":"t%d","token_ids":[%d],"finish_reason":null}],'
        b'"usage":{"completion_tokens":%d}}\n\n' % (k, k, k + 1) for k in range(4))
    raw = HEADER.pack(2, 0, 0, 0)  # a plain (httpx) row 0
    for k in range(0, len(body), 40):
        piece = body[k:k + 40]
        raw += HEADER.pack(RAW_READ, 0, len(piece), 1000 + k)
        raw += piece
    raw += HEADER.pack(RAW_READ, 0, 50, 9999) + b"only part"  # the kill cut this write
    (run_dir / "raw-reads.bin").write_bytes(raw)
    found = recover_attempt(run_dir)
    assert found is not None and found["raw_torn_bytes"] == HEADER.size + len(b"only part")
    records = read_jsonl(run_dir / "recovered-events.jsonl")
    assert [r["n"] for r in records if r["kind"] == "chunk"] == [1, 1, 1, 1]
    assert records[-1]["ok"] is False and "mid-row" in records[-1]["error"]
    assert recover_attempt(run_dir) is None  # once: the files are write-once


def test_an_orphan_is_found_by_its_run_dir_without_server_json(tmp_path: Path) -> None:
    """A kill between the server's start and server.json: its environment names it."""
    run_dir = tmp_path / "B1" / "attempt-1"
    run_dir.mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, RUN_DIR_ENV: str(run_dir.resolve())},
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not servers_of_run(run_dir) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert servers_of_run(run_dir)
        assert runner._stop_orphan(run_dir)
        # _stop_orphan waits for (so reaps) the process: gone, whatever Popen says.
        assert not servers_of_run(run_dir) and orphan.poll() is not None
    finally:
        if orphan.poll() is None:
            orphan.kill()


# ------------------------------------------------------------ preregistration and finishing


def test_a_kill_while_preregistering_leaves_no_half_experiment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One leg, no teacher: the kill is in preregistration, before any leg (issue 28: an ABBA
    # ran five legs here to check what happens before the first).
    path, plan = write_plan(tmp_path, plan_toml("prereg", design="single", control=None,
                                                rows=3, idle=0, teacher=None))
    exp = tmp_path / "exp"

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # stands for a kill in the middle of identity collection

    monkeypatch.setattr(runner, "collect_identity", killed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(plan, exp, plan_text=path.read_bytes())
    assert not exp.exists() and not list(tmp_path.glob(".exp.preregistering-*"))
    monkeypatch.undo()
    # What a SIGKILL leaves (no handler ran): a staging directory beside, removed next time.
    stale = tmp_path / ".exp.preregistering-killed"
    (stale / "identity").mkdir(parents=True)
    (stale / "plan.json").write_bytes(plan.canonical() + b"\n")
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    finish(exp, build_record(plan, exp, results))
    assert not stale.exists() and verify_dir(exp) == []


def test_a_finish_cut_after_the_manifest_is_completed(tmp_path: Path) -> None:
    # The teacher and one leg (a valid leg, so the rerun exits 0): the cut is in finish,
    # after every leg (issue 28: an ABBA's five legs ran here).
    path, plan = write_plan(tmp_path, plan_toml("finish", design="single", control=None,
                                                rows=3, idle=0))
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    # What a kill right after the manifest leaves: record, documents, manifest; no signature.
    finish(exp, record)
    (exp / "manifest.sig.json").chmod(0o644)
    sig = (exp / "manifest.sig.json").read_bytes()
    exp.chmod(0o755)
    (exp / "manifest.sig.json").unlink()
    proc = cli("run", str(path), "--out", str(exp))
    assert proc.returncode == 0, proc.stderr
    assert (exp / "manifest.sig.json").exists() and (exp / "manifest.sig.json").read_bytes() != b""
    assert sig != b"" and verify_dir(exp) == []
    assert json.loads((exp / "record.json").read_text()) == json.loads(json.dumps(record))


# --------------------------------------------------------------------------------- the clock


def test_the_idle_gap_is_measured_on_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    boot = runner._boot_id()
    if boot is None:
        pytest.skip("no boot id on this system")
    now_mono = time.monotonic_ns()
    last = (time.time(), now_mono - 2_000_000_000, boot)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600.0)  # the wall clock jumps back
    assert 2.0 <= runner._since(last) < 3.0
    # Another boot: the monotonic clock is not comparable, the wall clock is all there is.
    assert runner._since((real() - 5.0, now_mono, "another-boot")) == pytest.approx(-3595, abs=1)


def test_a_kill_after_the_summary_gets_its_leg_end_on_resume(tmp_path: Path) -> None:
    # Found by bench/chaos: a kill between a leg's summary.json and its `leg_end` left
    # a complete attempt that the state log, and so the record's attempts, never listed.
    from types import SimpleNamespace

    from tokrecord.experiment.leg import LegResult

    run_dir = tmp_path / "B1" / "attempt-1"
    state = runner._State(tmp_path / runner.STATE)
    state.append(LegStart(leg="B1", arm="candidate", attempt=1, run_dir=str(run_dir)))
    done = LegResult.model_construct(run_dir=str(run_dir), status="complete", valid=True,
                                     summary=SimpleNamespace(tok_s_out=2100.5))
    runner._record_kept_end(state, "B1", done)
    runner._record_kept_end(state, "B1", done)  # once only, whatever the resumes
    assert runner.attempts_log(tmp_path) == [
        {"leg": "B1", "attempt": 1, "status": "complete", "valid": True, "error": None,
         "run_dir": str(run_dir)}]
    (end,) = [e for e in runner._State(tmp_path / runner.STATE).events if isinstance(e, LegEnd)]
    assert end.written_on_resume is True and end.headline == 2100.5
