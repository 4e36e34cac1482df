"""A fake-server plan for experiment tests: a short suite, rates set per arm.

The suite is short (5 rows of 110 tokens: the headline window of tokens 1..100 is
full) so a leg takes about a second. Every plan captures its teacher, so every leg
can be valid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from probes_support import FAST_IDLE_TOML
from tokrecord.evidence import read_jsonl
from tokrecord.experiment.plan import Plan, load_plan

PY = sys.executable
FAKE_ARGV = [PY, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
             "--model", "{model}"]
CLI = [PY, "-m", "tokrecord"]
# What every fake server a test starts finds in its environment: it sleeps to each due write
# rather than spinning the last millisecond (tests/conftest.py, _fake_servers_sleep), and its
# first token comes 10 ms after a request, not the default 50 (some 270 legs of 3 rows wait
# for it; a test about TTFT sets its own). An `env=` given to a command replaces the test
# process's environment, so it carries this too.
SLEEPING_FAKE = {"TOKRECORD_FAKE_SPIN_US": "0", "TOKRECORD_FAKE_TTFT_MS": "10"}
CLI_ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb", **SLEEPING_FAKE}
LEGS = ["A1", "B1", "B2", "A2"]
# A real idle gap before every leg, so each experiment logs and measures its gaps (a test
# checks each measured gap >= the plan's, which needs a gap above 0), but the shortest: the
# gap is real time (the runner sleeps it), 4 gaps an ABBA, in some 30 experiments.
IDLE_GAP_S = 0.01


# Rows a fake-server suite uses, of the five topics (issue 28: three rows of 110 tokens keep a
# leg's headline window and a verdict, with 40 % fewer tokens to stream, parse and replay).
SUITE_ROWS = 3
MAX_TOKENS = 110
TOPICS = ("a least-recently-used cache with expiry", "binary search over rotated arrays",
          "merging overlapping calendar intervals", "a token bucket rate limiter",
          "streaming median of integers")


def suite_jsonl(max_tokens: int = MAX_TOKENS) -> str:
    return "".join(
        json.dumps({"id": f"row-{i}", "prompt": f"Write Python code for {topic}, then explain "
                    f"its complexity (case {i}).", "max_tokens": max_tokens}) + "\n"
        for i, topic in enumerate(TOPICS))


# What `telemetry=False` puts in place of FAST_IDLE_TOML's [telemetry] section.
NO_TELEMETRY = "[telemetry]\nenabled = false\n"


def plan_toml(name: str, *, design: str = "abba", control: float | None = 1000,
              candidate: float = 1050, rows: int = SUITE_ROWS, idle: float = IDLE_GAP_S,
              teacher: str | None = "capture", prior: str = "", extra: str = "",
              telemetry: bool = True) -> str:
    """`telemetry=False` runs no sampler: for tests about a design's flow, identity or
    submission, never about what a leg records. The sampler is a Python process per leg
    (some 0.3 s of CPU and 0.25 s of wall before the server may start); the experiments
    that keep it (test_experiment_fake, test_crash_safety, test_noise_record, the dict
    plans of test_verify, test_hostile_evidence, test_record_schema, test_report_html)
    check it end to end."""
    lines = [f'name = "{name}"', f'design = "{design}"', 'suite = "suite.jsonl"',
             f"suite_rows = {rows}", f"idle_gap_s = {idle}"]
    if teacher is not None:
        lines.append(f'teacher = "{teacher}"')
    probes = FAST_IDLE_TOML if telemetry else (
        FAST_IDLE_TOML.split("[telemetry]")[0] + NO_TELEMETRY)
    lines += [extra, probes, "[server]", f"argv = {json.dumps(FAKE_ARGV)}",
              'model = "fake-model"',
              "ready_timeout_s = 30", "stop_grace_s = 3"]
    if control is not None:
        lines += ["[arms.control]", f'env = {{ TOKRECORD_FAKE_TOK_S = "{control:g}" }}']
    lines += ["[arms.candidate]", f'env = {{ TOKRECORD_FAKE_TOK_S = "{candidate:g}" }}']
    if prior:
        lines += ["[prior]", prior]
    return "\n".join(lines) + "\n"


def write_plan(directory: Path, text: str, max_tokens: int = MAX_TOKENS) -> tuple[Path, Plan]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "suite.jsonl").write_text(suite_jsonl(max_tokens))
    path = directory / "plan.toml"
    path.write_text(text)
    return path, load_plan(path)


def events(exp: Path) -> list[dict[str, Any]]:
    return read_jsonl(exp / "experiment.jsonl")
