"""scripts/gpu_experiment.py's sweep plan (issue 34): plain control and the draft at each
n-max, with today's server flags; it parses as a sweep plan."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tokrecord.experiment.plan import CURRENT_SEQUENTIAL_METHOD, Design, parse_plan

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_experiment.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_experiment", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_plan_has_plain_control_and_one_arm_per_n_max(tmp_path: Path) -> None:
    gx = _module()
    text = gx.plan_text(server="/w/llama-server", models=tmp_path, idle_gap_s=10.0,
                        draft_n_max=8, notes="n", draft_layers=2, treatment="sweep",
                        sweep_n_max=[2, 4, 8, 16], blocks=3)
    plan = parse_plan(tomllib.loads(text), "gpu sweep plan")
    assert plan.design is Design.SWEEP and plan.blocks == 3
    assert list(plan.all_arms) == ["control", "n_max=2", "n_max=4", "n_max=8", "n_max=16"]
    assert plan.all_arms["control"].extra_args == ()
    args = plan.all_arms["n_max=16"].extra_args
    assert args[-2:] == ("--spec-draft-n-max", "16") and "-ngld" in args
    assert args.count("--spec-draft-n-max") == 1  # today's n-max is not left in
    assert "-ngl" in plan.server.argv and plan.idle.host_cpu_max_pct == 25.0
    assert len(plan.legs) == 15
    # the CPU dry run: no CUDA flags, and an idle gate a busy host can pass
    cpu = parse_plan(tomllib.loads(gx.plan_text(
        server="x", models=tmp_path, idle_gap_s=1.0, draft_n_max=8, notes="", draft_layers=2,
        treatment="sweep", sweep_n_max=[2, 4], blocks=2, gpu=False,
        launcher=["py", "llama_server.py"])), "cpu")
    assert "-ngl" not in cpu.server.argv and cpu.idle.host_cpu_max_pct == 100.0
    assert "-ngld" not in cpu.all_arms["n_max=4"].extra_args


def test_a_graphs_abba_made_sequential_parses_with_its_stopping_rule(tmp_path: Path) -> None:
    gx = _module()
    text = gx.plan_text(server="/w/llama-server", models=tmp_path, idle_gap_s=10.0,
                        draft_n_max=8, notes="n", draft_layers=2, treatment="graphs",
                        sequential="3")
    plan = parse_plan(tomllib.loads(text), "gpu sequential plan")
    assert plan.design is Design.ABBA and plan.sequential is not None
    seq = plan.sequential
    assert (seq.max_blocks, seq.min_blocks, seq.spending.value) == (3, 1, "pocock")
    assert seq.method is CURRENT_SEQUENTIAL_METHOD  # a user's plan gets today's method
    both = parse_plan(tomllib.loads(gx.plan_text(
        server="s", models=tmp_path, idle_gap_s=10.0, draft_n_max=8, notes="", draft_layers=2,
        treatment="draft", sequential="5:2:obrien-fleming")), "p").sequential
    assert both is not None and (both.max_blocks, both.min_blocks) == (5, 2)
    assert both.spending.value == "obrien-fleming"
    assert "[sequential]" not in gx.plan_text(server="s", models=tmp_path, idle_gap_s=1.0,
                                              draft_n_max=8, notes="", draft_layers=2)
    with pytest.raises(SystemExit, match="sweep"):
        gx.plan_text(server="s", models=tmp_path, idle_gap_s=1.0, draft_n_max=8, notes="",
                     draft_layers=2, treatment="sweep", sequential="3")
