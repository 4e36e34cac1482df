"""`tokrecord plan check`: every missing input at once, each arm's server started to
readiness and stopped, a failure quoting the log's error line, nothing written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cli_support import cli_in_process
from plan_support import plan_toml, write_plan
from tokrecord.experiment.check import check_plan, static_problems
from tokrecord.experiment.plan import parse_plan

LLAMA_ARGV = ["llama-server", "-m", "{model}", "--port", "{port}"]


def _plan(**over: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "name": "p", "engine": "llama.cpp",
        "server": {"argv": LLAMA_ARGV, "model": "/models/m.gguf"},
        "arms": {"control": {},
                 "candidate": {"extra_args": ["--spec-draft-model", "/models/d.gguf",
                                              "--spec-type", "draft-simple"]}},
    }
    raw.update(over)
    return raw


def test_static_problems_lists_every_missing_input_at_once() -> None:
    plan = parse_plan(_plan(), "p.toml")
    problems = static_problems(plan, resolve=lambda name: None, exists=lambda p: False)
    assert [p.key for p in problems] == ["server.argv", "server.model",
                                         "arms.candidate.extra_args"]
    assert "'llama-server' is not found" in problems[0].message
    assert "tokrecord engine --engine llama.cpp" in problems[0].message
    assert problems[1].text("p.toml") == "p.toml: key 'server.model': /models/m.gguf does not exist"
    assert "draft model /models/d.gguf" in problems[2].message


def test_static_problems_none_when_everything_exists() -> None:
    plan = parse_plan(_plan(), "p.toml")
    assert static_problems(plan, resolve=lambda name: "/bin/" + name, exists=lambda p: True) == []


def test_a_hub_id_is_not_a_path_for_vllm() -> None:
    plan = parse_plan(_plan(engine="vllm", server={"argv": ["vllm", "serve", "{model}"],
                                                   "model": "org/name"},
                            arms={"control": {}, "candidate": {}}), "p.toml")
    assert static_problems(plan, resolve=lambda name: "/bin/vllm", exists=lambda p: False) == []
    local = parse_plan(_plan(engine="vllm", server={"argv": ["vllm"], "model": "./weights"},
                             arms={"control": {}, "candidate": {}}), "p.toml")
    assert [p.key for p in static_problems(local, resolve=lambda n: "/bin/vllm",
                                           exists=lambda p: False)] == ["server.model"]


def test_component_files_are_checked_by_key() -> None:
    component = {"name": "k", "kernels": ["gemm"], "control_traces": ["a.json"],
                 "candidate_traces": ["b.json"], "check": "c.json"}
    plan = parse_plan(_plan(components=[component]), "p.toml")
    present = {Path("/models/m.gguf"), Path("/models/d.gguf"), Path("a.json")}
    problems = static_problems(plan, resolve=lambda n: "/bin/x", exists=lambda p: p in present)
    assert [p.key for p in problems] == ["components.0.candidate_traces", "components.0.check"]


def test_each_arm_starts_to_readiness_on_the_fake_server(tmp_path: Path) -> None:
    _, plan = write_plan(tmp_path, plan_toml("ok"))
    seen: list[str] = []

    class Obs:
        def arm_starting(self, arm: str, argv: list[str]) -> None:
            seen.append(arm)

        def arm_done(self, start: object) -> None: ...

    result = check_plan(plan, observer=Obs())
    assert result.passed, result.problems
    assert seen == ["control", "candidate"]
    assert all(s.ready_s is not None and s.ready_s > 0 for s in result.starts)


def test_a_bad_flag_quotes_the_error_line_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = plan_toml("bad").replace(
        "[arms.candidate]", '[arms.candidate]\nextra_args = ["--no-such-flag"]')
    path, _ = write_plan(tmp_path, text)
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)  # in process (tests/cli_support.py); nothing may appear here
    proc = cli_in_process(["run", str(path)], {"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stderr
    assert "key 'arms.candidate': the candidate arm's server did not start; the server log " \
           "says: " in proc.stderr
    assert "unrecognized arguments: --no-such-flag" in proc.stderr
    assert "last lines of" not in proc.stderr  # the error line, not the tail
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no tokrecord-runs/


def test_plan_check_command_passes_and_reports(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = write_plan(tmp_path, plan_toml("ok"))
    monkeypatch.chdir(tmp_path)
    proc = cli_in_process(["plan", "check", str(path), "--no-start"], dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "plan check passed: program and files exist" in proc.stdout


def test_llama_server_resolves_beside_tokrecord_without_path() -> None:
    from tokrecord.experiment.runner import engine_python
    from tokrecord.server import xllamacpp
    from tokrecord.server.process import resolve_program

    ours = Path(sys.executable).parent / "llama-server"  # installed by make setup
    assert resolve_program("llama-server", path="/nonexistent") == str(ours)
    assert xllamacpp.is_console_script(str(ours))
    assert not xllamacpp.is_console_script("/usr/bin/true")
    assert resolve_program("no-such-program-35", path="/nonexistent") is None
    # Identity reads the engine's runtime lock from the python the console script runs.
    plan = parse_plan(_plan(), "p.toml")
    assert engine_python(plan) == xllamacpp.engine_python()
