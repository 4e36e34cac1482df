"""A pid the server's helper left behind, taken by an unrelated process, is never
signalled: processes are tracked by identity (pid and start time), not by pid."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tokrecord.engines import ENGINES, EngineName
from tokrecord.server import ServerProcess, free_port

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")

# A server with one helper child (its pid written down), serving every GET with 200.
SERVER = """
import http.server, subprocess, sys, threading
helper = subprocess.Popen(["sleep", "600"])
open(sys.argv[2], "w").write(str(helper.pid))
threading.Thread(target=helper.wait, daemon=True).start()  # reaps it when it dies
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _take_pid(pid: int, attempts: int = 50) -> subprocess.Popen[bytes] | None:
    """An unrelated process (outside the server's session) with exactly `pid`, made by
    setting the kernel's last pid just below it; None when another fork wins each time."""
    for _ in range(attempts):
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.serial  # sets the kernel's next pid: parallel workers' forks would race it
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="needs a writable ns_last_pid")
def test_a_reused_pid_of_a_reaped_helper_is_not_killed(tmp_path: Path) -> None:
    port = free_port()
    script, pid_file = tmp_path / "server.py", tmp_path / "helper.pid"
    script.write_text(SERVER)
    server = ServerProcess([sys.executable, str(script), str(port), str(pid_file)], port=port,
                           log_path=tmp_path / "server.log", stop_grace_s=1.0)
    stranger = None
    try:
        server.start()
        # Records the server's family, the helper included.
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        helper = int(pid_file.read_text())
        os.kill(helper, 9)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(helper) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server's thread reaps it
        assert not psutil.pid_exists(helper)
        stranger = _take_pid(helper)
        if stranger is None:
            pytest.skip(f"could not get pid {helper} back from the kernel")
        report = server.stop()
        assert stranger.poll() is None, "the unrelated process that took the pid was killed"
        assert report.passed and helper not in report.surviving_pids
    finally:
        server.stop()
        if stranger is not None:
            with contextlib.suppress(ProcessLookupError):
                stranger.kill()
            stranger.wait()
