"""The fidelity bench's own paced servers: tokrecord's client streams from each, and
each server's send log is what truth.py reads, paced as asked. Also the targets
against the floor (bench.fidelity.run.floor_checks), on hand-made results."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the bench lives beside src/

from bench.fidelity.run import RunResult, floor_checks
from bench.fidelity.servers.common import output_ids
from bench.fidelity.tools import SERVERS, Cell, Placement, server_argv
from bench.fidelity.truth import measured_requests, parse_server_log, truth_row

from tokrecord.client import Endpoint, close_wire, stream_row
from tokrecord.engines import ENGINES, EngineName
from tokrecord.evidence import read_jsonl
from tokrecord.server.process import ServerProcess, free_port
from tokrecord.suite import SuiteRow


class ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))


@pytest.fixture(params=["threaded", "aio"])
def paced(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, Cell]]:
    cell = Cell(name="t", tok_s=2000.0, tokens_per_chunk=3, ttft_ms=20.0, max_tokens=40, rows=2)
    log = tmp_path / "sent.jsonl"
    port = free_port()
    server = ServerProcess(server_argv(request.param, cell, log, str(port), Placement()),
                           port=port, log_path=tmp_path / "server.out", stop_grace_s=5)
    server.start()
    try:
        server.wait_ready(30, model="tokrecord-fake", poll_s=0.05, engine=ENGINES[EngineName.VLLM])
        yield server.base_url, log, cell
    finally:
        server.stop()


def test_tokrecord_streams_from_each_bench_server(paced: tuple[str, Path, Cell]) -> None:
    base_url, log, cell = paced
    engine = ENGINES[EngineName.VLLM]
    sink = ListSink()
    rows = [SuiteRow(id=f"r{i}", prompt=f"the prompt {i}", max_tokens=cell.max_tokens)
            for i in range(cell.rows)]
    with httpx.Client(base_url=base_url, timeout=10) as http:
        traces = [stream_row(http, row_index=i, row=r, endpoint=Endpoint.COMPLETIONS, sink=sink,
                             body=engine.build_body(Endpoint.COMPLETIONS, "tokrecord-fake", r),
                             engine=engine) for i, r in enumerate(rows)]
        close_wire(http)
    # A server logs a request once it has sent all of it: the client may finish first.
    deadline = time.monotonic() + 5
    while (len(sent := measured_requests(parse_server_log(read_jsonl(log)), cell.max_tokens,
                                         cell.rows)) < 2 and time.monotonic() < deadline):
        time.sleep(0.01)
    assert len(sent) == 2
    for trace, request, r in zip(traces, sent, rows, strict=True):
        assert trace.token_ids == tuple(output_ids(r.prompt, cell.max_tokens))
        # token 0 alone (the prefill), then groups of 3, as the fake server's schedule
        assert [c.n for c in request.chunks] == [1] + [3] * 13
        assert [c.n for c in trace.chunks] == [c.n for c in request.chunks]
        # paced as asked (sleeping servers are late, never early), and the client
        # stamps every chunk after the server sent it
        assert all(c.t_ns >= c.due_ns for c in request.chunks)
        epoch_free = truth_row(request)
        assert epoch_free.ttft_ms is not None and epoch_free.ttft_ms >= cell.ttft_ms


def result(tool: str, cell: str, run: int, rate: float, ttft: float) -> RunResult:
    return RunResult(cell=cell, run=run, tool=tool, ok=True, rate_error_pct=rate,
                     ttft_error_ms=ttft)


def test_floor_checks_pair_each_run_with_its_floor() -> None:
    cells = {"1000": Cell("1000 tok/s", 1000, 1, 200, 256, 11),
             "1000x4": Cell("x4", 1000, 4, 200, 256, 11)}
    results = [
        result("tokrecord", "1000", 1, +0.30, 0.50), result("floor", "1000", 1, -0.25, 0.20),
        result("tokrecord", "1000", 2, -0.10, 0.40), result("floor", "1000", 2, +0.05, 0.30),
        result("tokrecord", "1000x4", 1, +0.90, 0.45), result("floor", "1000x4", 1, +0.10, 0.40),
        # no floor in run 2 of the 4-token cell: that run is not paired, so not counted
        result("tokrecord", "1000x4", 2, +5.00, 9.00),
    ]
    rate, ttft = floor_checks(results, cells)
    # |+0.30| - |-0.25| = 0.05 and |-0.10| - |+0.05| = 0.05: 1000 only (5000 not run)
    assert rate["runs"] == 2 and rate["worst_run"] == pytest.approx(0.05) and rate["met"]
    # 0.50-0.20, 0.40-0.30, 0.45-0.40 over every cell
    assert ttft["runs"] == 3 and ttft["worst_run"] == pytest.approx(0.30) and not ttft["met"]
    assert ttft["mean"] == pytest.approx((0.30 + 0.10 + 0.05) / 3)


def test_every_server_has_a_module() -> None:
    for module in SERVERS.values():
        __import__(module)
