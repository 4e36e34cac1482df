"""The command line: exit codes and one clear message per bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_support import cli_in_process
from plan_support import SLEEPING_FAKE
from probes_support import FAST_IDLE_ARGS

CLI = [sys.executable, "-m", "tokrecord"]
FAKE_CMD = f"{sys.executable} -m tokrecord.server.fake --host {{host}} --port {{port}} --model {{model}}"


def cli_env() -> dict[str, str]:
    import os

    return {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb",
            "TOKRECORD_CONFIG_DIR": os.environ["TOKRECORD_CONFIG_DIR"], **SLEEPING_FAKE}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # Legs here are not about the idle gate: quick snapshots, no thresholds.
    fast = FAST_IDLE_ARGS if args and args[0] in ("leg", "teacher", "cache-audit") else ()
    # In process (tests/cli_support.py): exit codes and messages, not the process; the
    # interrupt tests below start `python -m tokrecord` itself.
    return cli_in_process([*args, *fast], cli_env())


def test_leg_against_fake_prints_summary(tmp_path: Path) -> None:
    out = tmp_path / "leg"
    proc = run("leg", "--server-cmd", FAKE_CMD + " --tok-s 2000 --ttft-ms 10", "--model", "m",
               "--rows", "2", "--out", str(out))
    # No teacher: exactness is not tested, so the leg is not valid (exit 3, README "Exit codes").
    assert proc.returncode == 3, proc.stderr
    assert "exit 3: not valid: leg" in proc.stderr
    assert "tok_s_out" in proc.stdout and "conventional" in proc.stdout
    assert "  2/2 " in proc.stderr and "server ready" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["summary"]["rows"] == 2
    # the leg is sealed, and verify recomputes it from its raw events
    assert (out / "manifest.sig.json").is_file() and "tokrecord verify" in proc.stdout
    proc = run("verify", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified" in proc.stdout


def test_unknown_option() -> None:
    proc = run("leg", "--servr-cmd", "x")
    assert proc.returncode == 2
    assert "No such option" in proc.stderr and "--servr-cmd" in proc.stderr


def test_missing_server_command() -> None:
    proc = run("leg", "--model", "m")
    assert proc.returncode == 2
    assert "no server command" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_suite(tmp_path: Path) -> None:
    suite = tmp_path / "s.jsonl"
    row = '{"id": "%s", "prompt": "p", "max_tokens": 4}\n'
    suite.write_text(row % "a" + row % "b")
    proc = run("leg", "--server-cmd", FAKE_CMD, "--model", "m", "--suite", str(suite),
               "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert f"{suite}:2: duplicate prompt" in proc.stderr


def test_config_file_typo_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "leg.toml"
    cfg.write_text('[server]\nargv = ["x"]\nmodel = "m"\nready_timout_s = 3\n')
    proc = run("leg", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert f"{cfg}: key 'server.ready_timout_s'" in proc.stderr


def test_port_taken_and_stream_cut_exit_nonzero(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = run("leg", "--server-cmd", FAKE_CMD, "--model", "m", "--port", str(port),
                   "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "already in use" in proc.stderr
    proc = run("leg", "--server-cmd", FAKE_CMD + " --cut-after-tokens 7", "--model", "m",
               "--rows", "1", "--out", str(tmp_path / "b"))
    assert proc.returncode == 1
    assert "stream cut after 7 tokens" in proc.stderr
    assert (tmp_path / "b" / "events.jsonl").stat().st_size > 0


def _wait_for(path: Path, text: str, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_server_on_unreachable_port_times_out_with_log_tail(tmp_path: Path) -> None:
    # The command ignores {port}: nothing answers where tokrecord looks.
    cmd = f"{sys.executable} -m tokrecord.server.fake --port 0 --model {{model}}"
    proc = run("leg", "--server-cmd", cmd, "--model", "m", "--ready-timeout", "3",
               "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert "did not become ready within 3 s" in proc.stderr
    assert "tokrecord fake server listening" in proc.stderr  # the quoted log tail
    assert json.loads((tmp_path / "o" / "cleanup.json").read_text())["passed"] is True


def test_interrupt_stops_server_and_keeps_run_dir(tmp_path: Path) -> None:
    import signal

    import psutil

    out = tmp_path / "o"
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            [*CLI, "leg", "--server-cmd", FAKE_CMD + " --tok-s 50", "--model", "m",
             "--out", str(out), *FAST_IDLE_ARGS],
            stdout=subprocess.DEVNULL, stderr=stderr,
            env=cli_env(),
            # A shell starts background jobs with SIGINT ignored, and an ignored signal stays
            # ignored across exec (Python then installs no KeyboardInterrupt handler): give
            # the CLI the disposition a terminal would, however this test was launched.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        _wait_for(out / "events.jsonl", '"kind":"chunk"')
        server_pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert server_pids
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    assert "interrupted" in stderr_path.read_text()
    cleanup = json.loads((out / "cleanup.json").read_text())
    assert cleanup["passed"] is True and cleanup["surviving_pids"] == []
    assert all(not psutil.pid_exists(p) for p in server_pids)
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert (out / "events.jsonl").stat().st_size > 0


def test_sigterm_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    import signal

    out = tmp_path / "o"
    proc = subprocess.Popen(
        [*CLI, "leg", "--server-cmd", FAKE_CMD + " --tok-s 50", "--model", "m", "--out", str(out),
         *FAST_IDLE_ARGS],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=cli_env(),
    )
    _wait_for(out / "events.jsonl", '"kind":"chunk"')
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert json.loads((out / "cleanup.json").read_text())["passed"] is True


def test_teacher_then_leg_and_cache_audit(tmp_path: Path) -> None:
    cmd = FAKE_CMD + " --tok-s 4000 --ttft-ms 30"
    proc = run("teacher", "--server-cmd", cmd, "--model", "m", "--rows", "3",
               "--out", str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    teacher = tmp_path / "t.teacher.json"
    assert teacher.is_file() and "teacher:" in proc.stdout
    proc = run("leg", "--server-cmd", cmd, "--model", "m", "--rows", "3",
               "--out", str(tmp_path / "l"), "--teacher", str(teacher))
    assert proc.returncode == 0, proc.stderr
    assert "quality gates: leg VALID" in proc.stdout and "teacher exact" in proc.stdout
    # a teacher from another suite is refused before any server starts
    proc = run("leg", "--server-cmd", cmd, "--model", "m", "--rows", "2",
               "--out", str(tmp_path / "l2"), "--teacher", str(teacher))
    assert proc.returncode == 2 and "teacher was captured on suite" in proc.stderr
    # the fake server caches nothing: the audit passes
    proc = run("cache-audit", "--server-cmd", cmd, "--model", "m", "--out", str(tmp_path / "a"),
               "--threshold-pct", "50")
    assert proc.returncode == 0, proc.stderr
    assert "cache audit: PASS" in proc.stdout
