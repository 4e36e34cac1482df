"""Issue 31 item 8: a started server that listens beyond loopback is named, and a leg
warns of it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from probes_support import FAST_IDLE, FAST_TELEMETRY
from tokrecord.engines import ENGINES, EngineName
from tokrecord.experiment.leg import LegConfig, NullObserver, ServerSpec, run_leg
from tokrecord.server import ServerProcess, free_port
from tokrecord.suite import Suite, SuiteRow


def fake(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "tokrecord.server.fake", "--host", host, "--port", str(port)]


def test_a_server_on_every_interface_is_named(tmp_path: Path) -> None:
    port = free_port()
    with ServerProcess(fake("0.0.0.0", port), port=port, log_path=tmp_path / "a.log") as server:
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        listening = server.exposed()
    assert listening == [f"0.0.0.0:{port} (pid {server.pid})"]


def test_a_server_on_loopback_is_not(tmp_path: Path) -> None:
    port = free_port()
    with ServerProcess(fake("127.0.0.1", port), port=port, log_path=tmp_path / "b.log") as server:
        server.wait_ready(30, engine=ENGINES[EngineName.VLLM])
        assert server.exposed() == []


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.exposed: list[list[str]] = []

    def server_exposed(self, listening: list[str]) -> None:
        self.exposed.append(listening)


def test_the_leg_warns(tmp_path: Path) -> None:
    argv = (sys.executable, "-m", "tokrecord.server.fake", "--host", "0.0.0.0", "--port", "{port}",
            "--model", "{model}", "--tok-s", "5000", "--ttft-ms", "1")
    suite = Suite(name="one", sha256="0" * 64, rows=(SuiteRow(id="r", prompt="p", max_tokens=4),))
    config = LegConfig(name="t", server=ServerSpec(argv=argv, model="m", ready_timeout_s=30,
                                                   stop_grace_s=3),
                       suite=suite, idle=FAST_IDLE, telemetry=FAST_TELEMETRY)
    observer = Recorder()
    result: Any = run_leg(config, tmp_path / "leg", observer)
    assert result.status == "complete"
    assert len(observer.exposed) == 1 and observer.exposed[0][0].startswith("0.0.0.0:")
