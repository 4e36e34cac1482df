"""Server lifecycle: readiness, early exit, never ready, SIGTERM ignored, port taken."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from probes_support import FakeClock
from tokrecord.engines import ENGINES, EngineName
from tokrecord.errors import ConfigError, ServerError
from tokrecord.server import ServerProcess, free_port, port_is_listening, render_argv
from tokrecord.server.process import (
    _PROC_CHILDREN,
    PortHold,
    _kernel_descendants,
    ready_poll_wait_s,
)


def fake(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tokrecord.server.fake", "--port", str(port), *extra]


def test_ready_then_clean_stop(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(fake(port), port=port, log_path=tmp_path / "server.log")
    with server:
        seconds = server.wait_ready(30, model="tokrecord-fake", engine=ENGINES[EngineName.VLLM])
        assert seconds < 30
        assert port_is_listening(port)
    report = server.cleanup
    assert report is not None and report.passed
    assert report.sigterm_sent and not report.sigkill_sent
    assert report.surviving_workers == 0 and not report.port_listening_after
    assert "listening" in (tmp_path / "server.log").read_text()


def test_a_held_port_is_no_one_elses_until_its_server_starts(tmp_path: Path) -> None:
    # A port a leg chose itself stays bound from the choice to the server's start: no other
    # process can take it in between (four test workers once did, issue 28).
    hold = PortHold()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, \
            pytest.raises(OSError):
        other.bind(("127.0.0.1", hold.port))
    server = ServerProcess(fake(hold.port), port=hold.port, log_path=tmp_path / "server.log",
                           hold=hold)
    with server:  # start gives the port to the server
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        assert port_is_listening(hold.port)
    assert server.cleanup is not None and server.cleanup.passed
    # A hold whose server never starts is given back.
    unused = PortHold()
    ServerProcess(fake(unused.port), port=unused.port, log_path=tmp_path / "unused.log",
                  hold=unused).release_hold()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", unused.port))


def test_early_exit_quotes_log_tail(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(fake(port, "--never-ready", "--exit-after-s", "0.5"), port=port,
                           log_path=tmp_path / "server.log")
    with server, pytest.raises(ServerError, match=r"exited with code 3[\s\S]*last lines"):
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
    assert server.cleanup is not None and server.cleanup.exited_before_stop


def test_never_ready_times_out(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(fake(port, "--never-ready"), port=port, log_path=tmp_path / "s.log")
    clock = FakeClock()  # the 2 s pass on the fake clock: the polls are real, the wait is not
    with server, pytest.raises(ServerError, match="did not become ready within 2 s"):
        server.wait_ready(2, clock=clock, sleep=clock.sleep, engine=ENGINES[EngineName.VLLM])
    assert 2 <= clock() < 3  # it stopped polling at the deadline, not long after
    assert server.cleanup is not None and server.cleanup.passed


def test_ready_poll_wait_hand_values() -> None:
    assert ready_poll_wait_s(0.0, 0.5, 30) == 0.01  # first polls 10 ms apart
    assert ready_poll_wait_s(0.05, 0.5, 30) == 0.01
    assert ready_poll_wait_s(1.0, 0.5, 30) == pytest.approx(0.1)  # a tenth of the wait so far
    assert ready_poll_wait_s(4.0, 0.5, 30) == pytest.approx(0.4)
    assert ready_poll_wait_s(60.0, 0.5, 30) == 0.5  # then every poll_s, as before
    assert ready_poll_wait_s(60.0, 0.5, 0.2) == 0.2  # never past the deadline
    assert ready_poll_wait_s(60.0, 0.5, -1.0) == 0.0


# The server is "ready" when the fake clock says so; the polls themselves are real.
@pytest.mark.parametrize("ready_at", [0.05, 0.65, 70.0])
def test_a_ready_server_is_found_within_a_tenth_of_its_start(tmp_path: Path, ready_at: float,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    port = free_port()
    server = ServerProcess(fake(port, "--never-ready"), port=port, log_path=tmp_path / "s.log")
    clock = FakeClock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.sleep(seconds)

    with server:
        monkeypatch.setattr(server, "_ready", lambda *_: clock() >= ready_at)
        found = server.wait_ready(120, clock=clock, sleep=sleep, engine=ENGINES[EngineName.VLLM])
    # A doubling wait found a server ready at 0.65 s at 1.13 s.
    assert ready_at <= found <= ready_at + min(0.5, max(0.01, 0.1 * ready_at)) + 1e-9
    assert waits[0] == 0.01 and max(waits) <= 0.5


def test_wrong_model_is_named(tmp_path: Path) -> None:
    port = free_port()
    with ServerProcess(fake(port), port=port, log_path=tmp_path / "s.log") as server, \
            pytest.raises(ServerError, match="does not serve model 'other'"):
        server.wait_ready(30, model="other", engine=ENGINES[EngineName.VLLM])


def test_sigterm_ignored_is_killed_and_group_proven_empty(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(fake(port, "--ignore-sigterm", "--spawn-child"), port=port,
                           log_path=tmp_path / "s.log", stop_grace_s=1.0)
    with server:
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        children = psutil.Process(server.pid).children(recursive=True)
        assert children, "fake server should have spawned a child"
    report = server.cleanup
    assert report is not None
    assert report.sigkill_sent
    assert len(report.tracked_pids) >= 2
    assert report.surviving_workers == 0 and report.passed
    assert all(not psutil.pid_exists(c.pid) or c.status() == psutil.STATUS_ZOMBIE
               for c in children)


def test_a_child_that_left_the_group_while_starting_is_stopped_too(tmp_path: Path) -> None:
    # The family is learnt while the server starts (wait_ready, every FAMILY_TRACK_EVERY_S and
    # at ready): a worker in its own session is outside the process group that stop signals,
    # and only that tracking finds it.
    port = free_port()
    spawn = ("import os, subprocess, sys; "
             "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
             "start_new_session=True); "
             "print('detached', child.pid, flush=True); "
             f"os.execv(sys.executable, {fake(port)!r})")
    server = ServerProcess([sys.executable, "-c", spawn], port=port,
                           log_path=tmp_path / "s.log", stop_grace_s=1.0)
    with server:
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        line = next(t for t in (tmp_path / "s.log").read_text().splitlines()
                    if t.startswith("detached"))
        detached = psutil.Process(int(line.split()[1]))
        assert os.getpgid(detached.pid) != os.getpgid(server.pid)
        # Learnt by wait_ready itself, before stop looks again: a worker whose parent exits
        # before the stop is found by nothing else.
        assert detached.pid in {pid for pid, _ in server._tracked}
    report = server.cleanup
    assert report is not None and report.passed
    assert detached.pid in report.tracked_pids
    assert not detached.is_running() or detached.status() == psutil.STATUS_ZOMBIE


def test_port_already_taken(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is already in use"):
            ServerProcess(fake(port), port=port, log_path=tmp_path / "s.log").start()


def test_missing_executable(tmp_path: Path) -> None:
    server = ServerProcess(["/nonexistent/server"], port=free_port(), log_path=tmp_path / "s.log")
    with pytest.raises(ServerError, match="cannot start server"):
        server.start()


def test_render_argv() -> None:
    assert render_argv(["x", "--port", "{port}", "{model}"], {"port": "1", "model": "m"}) == [
        "x", "--port", "1", "m"]
    with pytest.raises(ConfigError, match=r"unknown placeholder \{prot\}"):
        render_argv(["--port", "{prot}"], {"port": "1"})
    # JSON arguments are not templates.
    assert render_argv(['{"method": "ngram", "n": 4}'], {"port": "1"}) == [
        '{"method": "ngram", "n": 4}']


def test_the_kernels_list_of_descendants_is_psutils() -> None:
    # _family reads the kernel's children files where Linux has them; they must name the
    # same processes psutil's children(recursive=True) finds by walking every process.
    tree = ("import subprocess, sys, time; "
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']) "
            "for _ in range(2)]; print('ok', flush=True); time.sleep(30)")
    top = psutil.Popen([sys.executable, "-c", f"import subprocess, sys; "
                        f"p = subprocess.Popen([sys.executable, '-c', {tree!r}]); p.wait()"])
    try:
        deadline = time.monotonic() + 20
        want: set[int] = set()
        while len(want) < 3 and time.monotonic() < deadline:  # the event: the tree is up
            time.sleep(0.01)
            want = {c.pid for c in top.children(recursive=True)}
        assert len(want) == 3  # a child and its two children
        if not _PROC_CHILDREN:
            pytest.skip("this kernel keeps no children files (psutil's walk is used)")
        assert set(_kernel_descendants(top.pid)) == want
        assert _kernel_descendants(2**22 + 1) == []  # no such process: no descendants
    finally:
        for proc in [*top.children(recursive=True), top]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        top.wait()
