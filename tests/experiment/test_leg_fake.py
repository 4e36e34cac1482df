"""A leg end to end against the packaged fake server, and every bad-input path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from probes_support import FAST_IDLE, FAST_TELEMETRY
from send_log_support import LOAD_PROOF_REL, median_rate, scheduled_rows, sent_rows
from tokrecord.client import Endpoint
from tokrecord.errors import ServerError, StreamError
from tokrecord.evidence import read_jsonl
from tokrecord.experiment.leg import LegConfig, ServerSpec, run_leg
from tokrecord.suite import Suite, SuiteRow, load_suite


def small_suite(rows: int = 3, max_tokens: int = 150) -> Suite:
    base = load_suite()
    return Suite(
        name="small", sha256=base.sha256,
        rows=tuple(SuiteRow(id=r.id, prompt=r.prompt, max_tokens=max_tokens)
                   for r in base.rows[:rows]),
    )


def config(fake_argv: list[str], *extra: str, env: dict[str, str] | None = None,
           suite: Suite | None = None, endpoint: Endpoint = Endpoint.COMPLETIONS) -> LegConfig:
    return LegConfig(
        name="t",
        server=ServerSpec(argv=(*fake_argv, *extra), model="fake-model", env=env or {},
                          ready_timeout_s=30, stop_grace_s=3),
        suite=suite or small_suite(),
        endpoint=endpoint, idle=FAST_IDLE, telemetry=FAST_TELEMETRY,
    )


# The rate tests below check the client against the fake server's own send log
# (tests/send_log_support.py), not against the nominal rate: the rate the server was told
# is proved exactly by its schedule (due times), and the client's figure is checked to
# track what was really sent within a tolerance load cannot break. The client's precision
# against the send log is checked by bench/fidelity, on an idle host, with figures.
# No real-time assertion is left, so they run in the parallel group.
@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.CHAT])
def test_leg_at_known_rate(fake_argv: list[str], run_root: Path, tmp_path: Path,
                           endpoint: Endpoint) -> None:
    log = tmp_path / "sent.jsonl"
    cfg = config(fake_argv, "--ttft-ms", "40", "--tok-s", "1000", "--log", str(log),
                 endpoint=endpoint, suite=small_suite(5, 150))
    result = run_leg(cfg, run_root / "leg")
    s = result.summary
    assert result.status == "complete" and s.rows == 5
    assert median_rate(scheduled_rows(log)) == pytest.approx(1000, rel=1e-6)
    sent = sent_rows(log)
    assert len(sent) == 5
    assert s.tok_s_out == pytest.approx(median_rate(sent), rel=LOAD_PROOF_REL)
    assert s.tok_s_out_chunk_aware == pytest.approx(median_rate(sent, chunk_aware=True),
                                                    rel=LOAD_PROOF_REL)
    # Direction only: the server waits 40 ms after reading a request the client sent after
    # its t_send, so no client TTFT can be shorter, however busy the host.
    assert s.ttft_ms_median is not None and s.ttft_ms_median >= 40
    assert result.rows_count_match == 5 and result.count_source == "token_ids"
    assert result.cleanup_passed
    out = run_root / "leg"
    for name in ("config.json", "suite.jsonl", "events.jsonl", "rows.json", "summary.json",
                 "server.log", "metrics-before.prom", "metrics-after.prom", "cleanup.json"):
        assert (out / name).is_file(), name
    events = read_jsonl(out / "events.jsonl")
    assert [e["row"] for e in events if e["kind"] == "request"] == [0, 1, 2, 3, 4]
    assert sum(e["n"] for e in events if e["kind"] == "chunk") == 750
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "tokrecord.leg-summary/v1"


def test_rate_set_through_env(fake_argv: list[str], run_root: Path, tmp_path: Path) -> None:
    log = tmp_path / "sent.jsonl"
    cfg = config(fake_argv, "--ttft-ms", "20", "--log", str(log),
                 env={"TOKRECORD_FAKE_TOK_S": "500"}, suite=small_suite(5, 120))
    summary = run_leg(cfg, run_root / "leg").summary
    # the env var reached the server: its schedule is 500 tok/s exactly
    assert median_rate(scheduled_rows(log)) == pytest.approx(500, rel=1e-6)
    assert summary.tok_s_out == pytest.approx(median_rate(sent_rows(log)), rel=LOAD_PROOF_REL)


def test_multi_token_chunks(fake_argv: list[str], run_root: Path, tmp_path: Path) -> None:
    log = tmp_path / "sent.jsonl"
    cfg = config(fake_argv, "--ttft-ms", "20", "--tok-s", "1000", "--tokens-per-chunk", "4",
                 "--log", str(log), suite=small_suite(2, 200))
    result = run_leg(cfg, run_root / "leg")
    s = result.summary
    assert median_rate(scheduled_rows(log), chunk_aware=True) == pytest.approx(1000, rel=1e-6)
    assert s.tok_s_out_chunk_aware == pytest.approx(
        median_rate(sent_rows(log), chunk_aware=True), rel=LOAD_PROOF_REL)
    assert s.quantisation_bound_pct_max == pytest.approx(300 / 99)
    assert result.engine is not None and result.engine.draft_cycles == 100


def _fails(cfg: LegConfig, out: Path, exc: type[Exception], match: str) -> dict:  # type: ignore[type-arg]
    with pytest.raises(exc, match=match):
        run_leg(cfg, out)
    error = json.loads((out / "error.json").read_text())
    assert (out / "events.jsonl").exists() and (out / "server.log").exists()
    assert json.loads((out / "cleanup.json").read_text())["passed"] is True
    return error


def test_http_error(fake_argv: list[str], run_root: Path) -> None:
    error = _fails(config(fake_argv, "--fail-status", "500"), run_root / "x", StreamError,
                   r"row 0 \(.*\): HTTP 500")
    assert error["rows_completed"] == 0


def test_stream_cut_mid_row_keeps_what_arrived(fake_argv: list[str], run_root: Path) -> None:
    out = run_root / "x"
    _fails(config(fake_argv, "--cut-after-tokens", "30"), out, StreamError,
           "stream cut after 30 tokens")
    chunks = [e for e in read_jsonl(out / "events.jsonl") if e["kind"] == "chunk"]
    assert sum(e["n"] for e in chunks) == 30
    assert read_jsonl(out / "events.jsonl")[-1]["ok"] is False


def test_malformed_sse(fake_argv: list[str], run_root: Path) -> None:
    _fails(config(fake_argv, "--malformed-after-tokens", "5"), run_root / "x", StreamError,
           "malformed SSE event after 5 tokens")


def test_server_never_ready(fake_argv: list[str], run_root: Path) -> None:
    cfg = LegConfig(
        server=ServerSpec(argv=(*fake_argv, "--never-ready"), model="m", ready_timeout_s=2),
        suite=small_suite(), idle=FAST_IDLE,
    )
    _fails(cfg, run_root / "x", ServerError, "did not become ready within 2 s")


def test_out_dir_never_reused(fake_argv: list[str], run_root: Path) -> None:
    out = run_root / "leg"
    out.mkdir(parents=True)
    (out / "old").write_text("evidence")
    from tokrecord.errors import ConfigError

    with pytest.raises(ConfigError, match="already exists and is not empty"):
        run_leg(config(fake_argv), out)


def test_fake_server_module_runs() -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "tokrecord.server.fake", "--help"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--tok-s" in proc.stdout


def test_one_token_change_in_teacher_fails_at_that_index(fake_argv: list[str], run_root: Path) -> None:
    from tokrecord.experiment.leg import teacher_from_run
    from tokrecord.gates import GateStatus
    from tokrecord.gates.teacher import load_teacher, write_teacher

    cfg = config(fake_argv, "--ttft-ms", "5", "--tok-s", "4000")
    run_leg(cfg, run_root / "teacher-leg")
    teacher_path = write_teacher(run_root / "teacher.json",
                                 teacher_from_run(run_root / "teacher-leg", cfg, None))
    good = run_leg(cfg, run_root / "exact", teacher=load_teacher(teacher_path))
    assert good.valid and good.gates[0].count == "3/3"

    data = json.loads(teacher_path.read_text())
    ids = data["rows"][1]["token_ids"]
    ids[57] = (ids[57] + 1) % 4096
    bad_path = run_root / "bad-teacher.json"
    bad_path.write_text(json.dumps(data))
    bad = run_leg(cfg, run_root / "diverged", teacher=load_teacher(bad_path))
    exact = bad.gates[0]
    assert exact.name == "teacher_exact" and exact.status is GateStatus.FAIL
    assert exact.count == "2/3"
    divergence = exact.evidence["divergences"][0]
    assert divergence["row"] == 1 and divergence["index"] == 57
    assert divergence["expected"][4] == ids[57] and divergence["got"][4] != ids[57]
    assert not bad.valid and "teacher_exact: fail" in bad.invalid_reasons
    # row 0 is full and row 1 now diverges: the sequence gate sees it too
    assert next(g for g in bad.gates if g.name == "full_output_then_next").status is GateStatus.FAIL
    assert json.loads((run_root / "diverged" / "gates.json").read_text())["valid"] is False


def test_every_json_file_is_rfc8785_canonical(fake_argv: list[str], run_root: Path) -> None:
    import rfc8785

    cfg = config(fake_argv, "--ttft-ms", "5", "--tok-s", "4000",
                 env={"TOKRECORD_FAKE_TOK_S": "4000"}).model_copy(
        update={"request_extra": {"top_p": 1e-7, "presence_penalty": 0.0}})
    out = run_root / "leg"
    run_leg(cfg, out)
    for path in out.iterdir():
        if path.suffix == ".json":
            data = path.read_bytes()
            assert data == rfc8785.dumps(json.loads(data)) + b"\n", path.name
        elif path.suffix == ".jsonl":
            for line in path.read_bytes().splitlines():
                assert line == rfc8785.dumps(json.loads(line)), (path.name, line[:80])
    clock = json.loads((out / "config.json").read_text())["clock"]
    assert int(clock["epoch_ns"]) > 0
    # times are on the leg's clock: small, well inside the I-JSON integer range
    assert all(e.get("t_ns", 0) < 2**53 for e in read_jsonl(out / "events.jsonl"))
