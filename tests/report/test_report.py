"""tokrecord report: golden terminal and markdown text, the pure figures, the HTML's shape.

The fixture (tests/fixtures/report/demo) is a trimmed copy of a real `make demo`
record (make_fixture.py says what was trimmed). Goldens are compared byte for
byte; regenerate them with TOKRECORD_UPDATE_GOLDEN=1 (the run then fails once,
naming what it rewrote, so an update is never silent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import cli_in_process
from golden_support import GOLDEN, UPDATE, golden  # noqa: F401
from paths import FIXTURES as FIXTURES_DIR
from tokrecord.client import CountSource, RowTrace
from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import RowRecord
from tokrecord.metrics import Chunk, row_metrics
from tokrecord.report import (
    default_paths,
    load_report,
    render_html,
    render_markdown,
    render_terminal,
    write_text,
)
from tokrecord.report.derive import (
    accepted_per_position,
    chunk_sizes,
    interval_stats,
    telemetry_view,
    timeline,
)
from tokrecord.report.html import SECTIONS
from tokrecord.report.model import ReportData, Verification
from tokrecord.report.svg import log_ticks, nice_range, nice_ticks

FIXTURES = FIXTURES_DIR / "report"
DEMO = FIXTURES / "demo"


@pytest.fixture(scope="module")
def demo() -> ReportData:
    return load_report(DEMO, verify=False)


@pytest.fixture(scope="module")
def leg_b1() -> ReportData:
    return load_report(DEMO / "B1" / "attempt-1", verify=False)


# --------------------------------------------------------------------------- goldens


def test_terminal_golden(demo: ReportData) -> None:
    golden("demo.terminal.txt", render_terminal(demo, width=100))


def test_terminal_narrow_golden(demo: ReportData) -> None:
    text = render_terminal(demo, width=80)
    golden("demo.terminal-80.txt", text)
    assert "…" not in text  # a narrow terminal drops columns, never cuts a number


def test_markdown_golden(demo: ReportData) -> None:
    golden("demo.md", render_markdown(demo))


def test_single_leg_goldens(leg_b1: ReportData) -> None:
    golden("leg-B1.terminal.txt", render_terminal(leg_b1, width=100))
    golden("leg-B1.md", render_markdown(leg_b1))


def test_verification_states_golden(demo: ReportData) -> None:
    failed = demo.model_copy(update={"verification": Verification(
        checked=True, ok=False, total=2,
        problems=("A1/attempt-1/rows.json: rows[3].metrics.rate_conventional: recorded 1.0, "
                  "recomputed 2.0", "manifest.sha256: record.json: sha256 does not match"))})
    ok = demo.model_copy(update={"verification": Verification(checked=True, ok=True)})
    golden("demo-verification.terminal.txt",
           render_terminal(failed, width=100) + render_terminal(ok, width=100))


def test_text_is_deterministic() -> None:
    a, b = load_report(DEMO, verify=False), load_report(DEMO, verify=False)
    assert a == b
    assert render_terminal(a) == render_terminal(b)
    assert render_markdown(a) == render_markdown(b)
    assert render_html(a) == render_html(b)


def test_demo_figures_come_from_the_record(demo: ReportData) -> None:
    record = json.loads((DEMO / "record.json").read_text())
    assert demo.verdict == record["verdict"] == "UNDECIDED"
    assert demo.headline.value == record["metric_accounting"]["published_value_tok_s"]
    assert demo.headline.leg == "B1"
    assert [leg.name for leg in demo.legs] == ["A1", "B1", "B2", "A2"]
    for leg in demo.legs:
        assert leg.tok_s == record["runs"][leg.name]["headline_tok_s"]
        assert len(leg.rows) == 13
    assert demo.bootstrap is not None
    assert (demo.bootstrap.ci_low, demo.bootstrap.ci_high) == (record["bootstrap"]["ci_low"],
                                                               record["bootstrap"]["ci_high"])
    b1 = demo.leg("B1")
    assert b1 is not None and b1.speculative is not None
    # vLLM's per-position counters, after - before, sum to the accepted tokens.
    assert b1.speculative.accepted_per_position == (486, 426, 376, 327)
    assert sum(b1.speculative.accepted_per_position) == b1.speculative.accepted_draft_tokens
    a1 = demo.leg("A1")
    assert a1 is not None and a1.speculative is None and a1.chunk_sizes == (a1.chunk_sizes[0],)


# --------------------------------------------------------------------------- the timeline choice


def test_default_timeline_is_first_candidate_row_with_most_bursts(demo: ReportData) -> None:
    first = demo.timelines[0]
    assert first.leg == "B1"
    b1 = demo.leg("B1")
    assert b1 is not None
    most = max(r.multi_token_chunks for r in b1.rows)
    assert first.multi_token_chunks == most > 0
    assert first.row == min(r.row for r in b1.rows if r.multi_token_chunks == most)
    assert [t.leg for t in demo.timelines] == ["B1", "A1", "B2", "A2"]
    assert {t.row for t in demo.timelines} == {first.row}
    assert "most multi-token chunks" in demo.timeline_choice


def test_timeline_by_leg_and_row() -> None:
    by_index = load_report(DEMO, leg="A2", row="3", verify=False)
    assert (by_index.timelines[0].leg, by_index.timelines[0].row) == ("A2", 3)
    by_id = load_report(DEMO, leg="B2", row="sql-review-orders", verify=False)
    assert (by_id.timelines[0].leg, by_id.timelines[0].row_id) == ("B2", "sql-review-orders")
    with pytest.raises(ConfigError, match=r"no leg 'C1'.*A1, B1, B2, A2"):
        load_report(DEMO, leg="C1", verify=False)
    with pytest.raises(ConfigError, match="no row 'nope'"):
        load_report(DEMO, leg="A1", row="nope", verify=False)


# --------------------------------------------------------------------------- pure figures


def make_row(chunks: list[tuple[float, int]], row: int = 0, send_ms: float = 0.0) -> RowRecord:
    cs = tuple(Chunk(t_ns=int(t * 1e6), n=k) for t, k in chunks)
    trace = RowTrace(row=row, row_id=f"r{row}", prompt_sha256="0" * 64, t_send_ns=int(send_ms * 1e6),
                     t_end_ns=cs[-1].t_ns + 1, chunks=cs, events=len(cs), token_ids=None,
                     prompt_token_ids=None, text="", finish_reason="length",
                     count_source=CountSource.TOKEN_IDS, count_mismatches=0, prompt_tokens=3,
                     completion_tokens=sum(k for _, k in chunks), cached_tokens=0)
    return RowRecord(trace=trace, metrics=row_metrics(trace.t_send_ns, cs))


def test_intervals_count_same_chunk_tokens_as_zero() -> None:
    stats = interval_stats([make_row([(10, 1), (15, 1), (20, 3), (30, 1)])])
    assert stats is not None
    # 6 tokens, 5 intervals: 5, 5, 10 ms between chunks, 2 zeros inside the 3-token chunk
    assert (stats.intervals, stats.same_chunk) == (5, 2)
    assert stats.median_ms == 5.0 and stats.max_ms == 10.0
    assert sum(stats.counts) == 3 and len(stats.counts) == len(stats.edges_ms) - 1
    assert interval_stats([]) is None


def test_chunk_sizes_leave_out_the_prefill_chunk() -> None:
    rows = [make_row([(10, 1), (15, 1), (20, 3), (30, 1)]), make_row([(5, 2), (9, 4)], row=1)]
    assert chunk_sizes(rows) == (2, 0, 1, 1)


def test_timeline_staircase_window_and_downsampling() -> None:
    chunks = [(10.0, 1)] + [(10.0 + i, 1 if i % 7 else 4) for i in range(1, 200)]
    t = timeline(make_row(chunks, send_ms=2.0), "B1", "candidate")
    assert t.t_ms[0] == 8.0 and t.ttft_ms == 8.0
    assert t.tokens[-1] == t.n_tokens == sum(k for _, k in chunks)
    assert t.window_ms is not None and t.window_ms[0] == 9.0  # token 1 arrives in chunk 1
    small = timeline(make_row(chunks), "B1", "candidate", max_points=30)
    assert small.downsampled and len(small.t_ms) < len(chunks)
    assert max(small.sizes) == 4 and small.tokens[-1] == t.tokens[-1]
    assert list(small.t_ms) == sorted(small.t_ms)


PROM = """# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="1"}} {b}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",position="0"}} {c}
"""


def test_accepted_per_position_is_a_delta_summed_over_engines() -> None:
    before, after = PROM.format(a=10, b=5, c=1), PROM.format(a=30, b=12, c=4)
    assert accepted_per_position(before, after) == (23, 7)
    assert accepted_per_position(None, after) == (34, 12)
    assert accepted_per_position(before, "vllm:other_total 1\n") is None
    assert accepted_per_position(before, None) is None


def test_telemetry_power_series() -> None:
    rows = [make_row([(1000, 1), (1200, 1)], send_ms=900)]
    lines = [{"t_ns": int(t * 1e9), "host": {"cpu_util_pct": 5.0, "power_w": 40.0 + t},
              "devices": [{"backend": "nvml", "index": 0, "name": "NVIDIA H200", "power_w": 80.0 + t}]}
             for t in (0.5, 1.0, 1.5)]
    view = telemetry_view(lines, rows, {"power_w_mean": 81.25, "energy_j": 0.5, "notes": ["hi"]})
    assert view is not None and view.samples == 3
    labels = [s.label for s in view.series]
    assert labels == ["nvml:0 NVIDIA H200", "host package (RAPL)"]
    assert view.series[0].t_s == (-0.4, 0.1, 0.6)  # since the first request (0.9 s)
    assert view.series[0].power_w == (80.5, 81.0, 81.5)
    assert view.window_s == (0.0, 0.3)
    assert [f.label for f in view.facts] == ["mean power over the suite", "energy over the suite", "note"]
    assert telemetry_view([], rows, None) is None


def test_svg_ticks() -> None:
    assert nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.7, 1.26, 5)[0] >= 0.7
    assert nice_range(3, 97) == (0, 100)
    assert log_ticks(10, 1000) == [10, 20, 50, 100, 200, 500, 1000]
    assert log_ticks(0.01, 1e4)[:2] == [0.01, 0.1]


# --------------------------------------------------------------------------- the HTML's shape


def test_html_is_one_offline_file_with_every_section(demo: ReportData) -> None:
    page = render_html(demo)
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in page, sid
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<script" not in page and "<link" not in page and "url(" not in page
    for attr in re.findall(r'\b(?:src|href)="([^"]*)"', page):
        assert attr.startswith("#"), attr
    # http(s) only as the SVG namespace, never as something to fetch
    assert set(re.findall(r"https?://[^\"' <]+", page)) == {"http://www.w3.org/2000/svg"}
    assert page.count("<svg") >= 9  # rates, 3 timelines, intervals, ABBA, CI, acceptance, chunks
    assert len(page.encode()) < 400_000


def test_html_sections_say_what_is_missing(leg_b1: ReportData) -> None:
    page = render_html(leg_b1)
    assert "Not an ABBA experiment" in page
    assert "No telemetry was recorded" in page


def test_html_draws_power_when_telemetry_is_present(tmp_path: Path) -> None:
    leg = tmp_path / "leg"
    shutil.copytree(DEMO / "B1" / "attempt-1", leg)
    rows = json.loads((leg / "rows.json").read_text())["rows"]
    t0 = rows[0]["trace"]["t_send_ns"]
    with open(leg / "telemetry.jsonl", "w") as fh:
        for i in range(40):
            fh.write(json.dumps({"t_ns": t0 + i * 500_000_000, "host": {"cpu_util_pct": 50.0},
                                 "devices": [{"backend": "nvml", "index": 0, "name": "GPU",
                                              "power_w": 100.0 + i}]}) + "\n")
        fh.write('{"t_ns": 1, "cut sh')  # a last line cut short by a hard kill is dropped
    data = load_report(leg, verify=False)
    assert data.legs[0].telemetry is not None and data.legs[0].telemetry.samples == 40
    assert "Power over time, leg B1" in render_html(data)


# --------------------------------------------------------------------------- files and the CLI


def test_default_paths_are_beside_the_sealed_directory(tmp_path: Path) -> None:
    html, md = default_paths(tmp_path / "exp")
    assert (html, md) == (tmp_path / "exp.report.html", tmp_path / "exp.report.md")
    target = write_text(tmp_path / "sub" / "r.md", "one\n")
    write_text(target, "two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["r.md"]


CLI = [sys.executable, "-m", "tokrecord"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": "100", "PATH": "/usr/bin:/bin", "TERM": "dumb",
           "TOKRECORD_CONFIG_DIR": os.environ["TOKRECORD_CONFIG_DIR"]}
    # In process (tests/cli_support.py): these tests are about what `report` prints and writes.
    return cli_in_process(list(args), env)


def flat(text: str) -> str:
    """Words only: rich wraps long lines at the console width."""
    return " ".join(text.split())


def test_cli_writes_html_and_markdown_beside_the_directory(tmp_path: Path) -> None:
    exp = tmp_path / "demo"
    shutil.copytree(DEMO, exp)
    before = sorted(p.relative_to(exp) for p in exp.rglob("*"))
    proc = run_cli("report", str(exp), "--no-verify")
    assert proc.returncode == 0, proc.stderr
    printed = "\n".join(line.rstrip() for line in proc.stdout.splitlines()) + "\n"
    assert printed.startswith(render_terminal(load_report(exp, verify=False), width=100))
    html, md = tmp_path / "demo.report.html", tmp_path / "demo.report.md"
    assert f"report: {html}" in flat(proc.stdout) and f"markdown: {md}" in flat(proc.stdout)
    assert html.read_text().startswith("<!doctype html>")
    assert md.read_text() == render_markdown(load_report(exp, verify=False))
    assert sorted(p.relative_to(exp) for p in exp.rglob("*")) == before  # the evidence is untouched
    assert "Traceback" not in proc.stderr


def test_cli_verifies_by_default(tmp_path: Path) -> None:
    proc = run_cli("report", str(DEMO / "B1" / "attempt-1"), "--html", str(tmp_path / "r.html"),
                   "--markdown", str(tmp_path / "r.md"))
    assert proc.returncode == 0, proc.stderr
    # the trimmed fixture is not the sealed original: the report says so
    assert "NOT verified" in proc.stdout and "not sealed: no manifest.sha256" in flat(proc.stdout)
    assert "NOT verified" in (tmp_path / "r.md").read_text()


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    proc = run_cli("report", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "is not a directory" in flat(proc.stderr)
    (tmp_path / "empty").mkdir()
    proc = run_cli("report", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "neither an experiment" in flat(proc.stderr)
    proc = run_cli("report", str(DEMO), "--no-verify", "--leg", "Z9",
                   "--html", str(tmp_path / "x.html"), "--markdown", str(tmp_path / "x.md"))
    assert proc.returncode == 2 and "no leg 'Z9'" in flat(proc.stderr)
    assert "Traceback" not in proc.stderr


def test_long_commands_show_progress() -> None:
    import io

    from rich.console import Console

    from tokrecord.cli.view import RichExperimentObserver, RichReportObserver, _Countdown

    countdown = _Countdown("idle gap before B1", 30)
    assert countdown.__rich__() in ("idle gap before B1: 30 s left", "idle gap before B1: 29 s left")
    buf = io.StringIO()
    console = Console(file=buf, width=100, color_system=None)
    observer = RichExperimentObserver(console, show_log_tail=True)
    observer.idle_wait("B1", 0.5)
    assert observer._idle_wait is not None
    observer.leg_starting("B1", "candidate", 1, 2, 4)
    assert observer._idle_wait is None
    assert "idle gap before B1: waiting 0.5 s" in buf.getvalue() and "leg 2/4: B1" in buf.getvalue()
    with RichReportObserver(console) as progress:  # what report and demo show while verifying
        progress.report_leg("A1", 1, 4)
        progress.report_step("verifying")
    help_text = flat(run_cli("demo", "--help").stdout) + flat(run_cli("run", "--help").stdout)
    assert help_text.count("--show-log-tail") == 2
