"""The HTML report in a real browser: headless Chromium (Debian's `chromium` package,
which `make test` installs when missing: scripts/ensure-chromium).

Each page must load with no console error, ask for nothing but itself, and show
every section with its charts drawn at a real size. Without a Chromium these tests
fail (they never skip): a report nobody checked in a browser is not tested.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_support import cli_in_process
from paths import FIXTURES as FIXTURES_DIR
from tokrecord.experiment.plan import parse_plan
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.verify import verify_dir
from tokrecord.report import load_report, render_html
from tokrecord.report.browser import Browser, find_chromium
from tokrecord.report.html import SECTIONS

DEMO = FIXTURES_DIR / "report" / "demo"
FAKE = [sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--ttft-ms", "5"]
SECTION_IDS = [sid for sid, _ in SECTIONS]
LAYOUT = """JSON.stringify({
  title: document.title,
  sections: [...document.querySelectorAll('section[id]')].map(s => ({
    id: s.id,
    height: s.getBoundingClientRect().height,
    svgs: [...s.querySelectorAll('svg')].map(v => {
      const r = v.getBoundingClientRect();
      return [r.width, r.height, v.querySelectorAll('path,circle,rect').length];
    }),
  })),
})"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if find_chromium() is None:
        pytest.fail("no Chromium found: run scripts/ensure-chromium (make test does; it installs "
                    "Debian's chromium package) or set TOKRECORD_CHROMIUM to a Chromium binary")
    with Browser() as b:
        yield b


def open_page(browser: Browser, page: Path) -> dict[str, Any]:
    """Load the page; assert it is clean and offline; its layout."""
    url = page.resolve().as_uri()
    session, load = browser.open(url)
    assert load.console_errors == [], load.console_errors
    assert load.requests == [url], load.requests  # itself, and nothing else
    layout: dict[str, Any] = json.loads(browser.evaluate(session, LAYOUT))
    browser.call("Target.closeTarget", {"targetId": browser.call(
        "Target.getTargetInfo", session=session)["targetInfo"]["targetId"]})
    sections = {s["id"]: s for s in layout["sections"]}
    assert list(sections) == SECTION_IDS
    for sid, s in sections.items():
        assert s["height"] > 40, sid
        for width, height, marks in s["svgs"]:
            assert width > 300 and height > 100 and marks > 0, (sid, width, height, marks)
    return sections


def svg_count(sections: dict[str, Any], sid: str) -> int:
    return len(sections[sid]["svgs"])


def test_fixture_report_renders_cleanly(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "demo.html"
    page.write_text(render_html(load_report(DEMO, verify=False)))
    sections = open_page(browser, page)
    assert svg_count(sections, "rates") == 1
    assert svg_count(sections, "timeline") == 3  # the row, its headline window, every leg
    assert svg_count(sections, "intervals") == 1
    assert svg_count(sections, "abba") == 2  # legs in order, the confidence interval
    assert svg_count(sections, "speculative") == 2  # per position, tokens per chunk
    assert svg_count(sections, "telemetry") == 0


def test_leg_report_with_telemetry_renders_cleanly(browser: Browser, tmp_path: Path) -> None:
    leg = tmp_path / "leg"
    shutil.copytree(DEMO / "B1" / "attempt-1", leg)
    t0 = json.loads((leg / "rows.json").read_text())["rows"][0]["trace"]["t_send_ns"]
    with open(leg / "telemetry.jsonl", "w") as fh:
        for i in range(60):
            fh.write(json.dumps({"t_ns": t0 + (i - 10) * 500_000_000, "host": {"power_w": 50.0},
                                 "devices": [{"backend": "nvml", "index": 0, "name": "GPU",
                                              "power_w": 100.0 + (i % 7)}]}) + "\n")
    page = tmp_path / "leg.html"
    page.write_text(render_html(load_report(leg, verify=False)))
    sections = open_page(browser, page)
    assert svg_count(sections, "telemetry") == 1
    assert svg_count(sections, "abba") == 1


@pytest.mark.parametrize(("name", "abba_svgs"), [("v2-blocks2", 3), ("v2-aa", 3)])
def test_v2_reports_render_cleanly(browser: Browser, tmp_path: Path, name: str,
                                   abba_svgs: int) -> None:
    """k blocks and the A/A design: legs in run order, pairs, the leg-level interval."""
    fixture = DEMO.parent / name
    page = tmp_path / f"{name}.html"
    page.write_text(render_html(load_report(fixture, verify=False)))
    sections = open_page(browser, page)
    assert svg_count(sections, "abba") == abba_svgs
    legs = len(json.loads((fixture / "record.json").read_text())["runs"])
    width, _, marks = sections["abba"]["svgs"][0]  # the legs chart: one dot per leg, and more
    assert width > 800 and marks > legs


# --------------------------------------------------------------------------- a fresh experiment


def _fast_probes() -> dict[str, Any]:
    """Quick idle-gate and telemetry settings where this tokrecord has them."""
    try:
        from probes_support import FAST_IDLE, FAST_TELEMETRY  # type: ignore[import-not-found]
    except ImportError:
        return {}
    return {"idle": FAST_IDLE.model_dump(mode="json"),
            "telemetry": FAST_TELEMETRY.model_dump(mode="json")}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = parse_plan({
        "name": "report-me", "design": "abba", "suite_rows": 3, "teacher": "capture",
        "idle_gap_s": 0, **_fast_probes(),
        "server": {"argv": FAKE, "model": "fake", "ready_timeout_s": 30},
        "arms": {"control": {"env": {"TOKRECORD_FAKE_TOK_S": "2000"}},
                 "candidate": {"env": {"TOKRECORD_FAKE_TOK_S": "2200",
                                       "TOKRECORD_FAKE_TOKENS_PER_CHUNK": "4"}}},
        "verdict": {"bootstrap_samples": 500},
    }, "test")
    exp = tmp_path_factory.mktemp("fresh") / "exp"
    results = run_experiment(plan, exp)
    finish(exp, build_record(plan, exp, results))
    return exp


def test_fresh_experiment_report_from_the_cli(browser: Browser, fresh: Path) -> None:
    shot = fresh.parent / "report.png"
    env = {"COLUMNS": "100", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "dumb",
           "TOKRECORD_CONFIG_DIR": os.environ["TOKRECORD_CONFIG_DIR"]}
    if os.environ.get("TOKRECORD_CHROMIUM"):
        env["TOKRECORD_CHROMIUM"] = os.environ["TOKRECORD_CHROMIUM"]
    # In process (tests/cli_support.py): what `report` writes and prints.
    proc = cli_in_process(["report", str(fresh), "--screenshot", str(shot)], env)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "evidence verified: every file matches the signed manifest" in out
    html, md = fresh.parent / "exp.report.html", fresh.parent / "exp.report.md"
    assert f"report: {html}" in out and f"markdown: {md}" in out
    assert "**Evidence:** verified" in md.read_text()
    assert verify_dir(fresh) == []  # the sealed evidence is untouched

    sections = open_page(browser, html)
    page = html.read_text()
    assert "NOT verified" not in page and ">verified<" in page
    # the timeline is the candidate's: the fake server sends 4 tokens per chunk there
    data = load_report(fresh, verify=False)
    assert data.timelines[0].leg == "B1" and data.timelines[0].multi_token_chunks > 0
    assert "does not expose acceptance per position" in page
    assert svg_count(sections, "speculative") == 1  # tokens per chunk (no per-position counters)

    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width == 1200 and height > 3000  # the whole page, not one screen
