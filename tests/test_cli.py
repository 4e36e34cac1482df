"""The command line: exit codes and one clear message per bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "tokrecord"]
FAKE_CMD = f"{sys.executable} -m tokrecord.server.fake --host {{host}} --port {{port}} --model {{model}}"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"})


def test_leg_against_fake_prints_summary(tmp_path: Path) -> None:
    out = tmp_path / "leg"
    proc = run("leg", "--server-cmd", FAKE_CMD + " --tok-s 2000 --ttft-ms 10", "--model", "m",
               "--rows", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "tok_s_out" in proc.stdout and "conventional" in proc.stdout
    assert "row  2/2" in proc.stderr and "server ready" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["summary"]["rows"] == 2


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
