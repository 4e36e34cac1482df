"""What a new user meets first: help text, the llama.cpp example plan, row-flag notes,
the exit code of a leg that is not valid."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli_support import cli_in_process
from plan_support import SLEEPING_FAKE, plan_toml, write_plan
from tokrecord.cli.view import flag_notes
from tokrecord.demo.gguf import build_demo_gguf
from tokrecord.engines import EngineName, infer_engine
from tokrecord.experiment.plan import load_plan, plan_engine, speculative_configs
from tokrecord.report.browser import CHROMIUM_HINT

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llamacpp" / "ngram-vs-plain.toml"
CLI = [sys.executable, "-m", "tokrecord"]
ENV = {"PATH": "/usr/bin:/bin", "TERM": "dumb", **SLEEPING_FAKE}


def _help(*args: str) -> str:
    # In process (tests/cli_support.py): the help text, not the process.
    proc = cli_in_process([*args, "--help"], {**ENV, "COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_keeps_bracketed_section_names() -> None:
    assert "the plan's [prior] id on the public API" in _help("run")
    assert "the [prior] id is rechecked" in _help("run")
    assert "else the plan's [noise]." in _help("plan", "power")
    assert "a plan's [idle] section declares" in _help("probe")


def test_example_plan_names_the_demo_gguf_that_make_demo_builds(tmp_path: Path) -> None:
    plan = load_plan(EXAMPLE)
    assert plan.server.argv[0] == "llama-server"
    assert infer_engine(plan.server.argv) is EngineName.LLAMA_CPP
    assert plan_engine(plan).name is EngineName.LLAMA_CPP
    configs = speculative_configs(plan)
    assert configs["control"] is None
    assert configs["candidate"] is not None and configs["candidate"].method == "ngram-simple"
    # The plan names the file under ~/.cache/tokrecord/models; `make demo` (build_demo_gguf)
    # writes it at the same place relative to the models directory.
    models = Path.home() / ".cache" / "tokrecord" / "models"
    relative = Path(plan.server.model).relative_to(models)
    assert build_demo_gguf(tmp_path) == tmp_path / relative


def test_each_flag_is_explained_once() -> None:
    seen: set[str] = set()
    first = flag_notes(("short", "stall"), seen)
    assert [line.split(":")[0].strip() for line in first] == ["short", "stall"]
    assert "100 ms and 20x the row's median gap" in first[1]
    assert flag_notes(("stall",), seen) == []
    assert "a row flag" in flag_notes(("new_flag",), seen)[0]


def test_run_exits_3_when_a_leg_is_not_valid(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # About the exit code, not speed: the shortest legs (2 rows, fast arms, no idle gap).
    text = plan_toml("invalid-legs", control=4000, candidate=4000, rows=2, idle=0,
                     telemetry=False) + '''[[arms.candidate.log_rules]]
claim = "a line no fake server prints"
pattern = "no such line, ever"
required = true
'''
    path, _ = write_plan(tmp_path, text)
    monkeypatch.chdir(tmp_path)  # the default tokrecord-runs/ goes under it
    proc = cli_in_process(["run", str(path), "--no-check", "--offline-prior"],
                          {**ENV, "COLUMNS": "200"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "exit 3: not valid: B1, B2" in proc.stderr
    assert "sealed and signed" in proc.stdout  # everything was written first


def test_the_fake_servers_dialect_is_its_engine_however_it_is_started() -> None:
    assert infer_engine(["tokrecord", "fake-server", "--dialect", "llama.cpp"]) is \
        EngineName.LLAMA_CPP
    assert infer_engine([sys.executable, "-m", "tokrecord.server.fake", "--dialect=sglang"]) is \
        EngineName.SGLANG
    assert infer_engine(["/venv/bin/tokrecord", "fake-server", "--port", "{port}"]) is \
        EngineName.VLLM


def test_the_chromium_hint_works_without_a_clone() -> None:
    assert "apt-get install -y chromium" in CHROMIUM_HINT
    assert "TOKRECORD_CHROMIUM" in CHROMIUM_HINT


def test_a_narrow_console_wraps_the_legs_table_and_cuts_no_figure() -> None:
    import io
    import json

    from rich.console import Console

    from paths import FIXTURES
    from tokrecord.cli.view import print_experiment

    record = json.loads((FIXTURES / "report" / "demo" / "record.json").read_text())
    buf = io.StringIO()
    print_experiment(Console(file=buf, width=80, color_system=None), record, Path("record.json"))
    legs = buf.getvalue().split("quality gates per leg")[0]
    assert "…" not in legs
    assert "208.7" in legs  # B1's headline, whole (folded if need be)
