"""Sweep plans: arms generated from [sweep], each bad input named by file and key, and
plans without [sweep] hashing as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import MAX_SWEEP_ARMS, Design, Plan, load_plan

HEAD = """\
name = "nmax-sweep"
design = "sweep"
blocks = 2

[server]
argv = ["llama-server", "--port", "{port}", "-m", "{model}"]
model = "m.gguf"
"""

SWEEP = HEAD + """
[sweep]
extra_args = ["--model-draft", "d.gguf"]
control = "n_max=4"

[[sweep.parameters]]
name = "n_max"
flag = "--spec-draft-n-max"
values = [2, 4, 8]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def refused(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_plan(path)
    message = str(err.value)
    assert str(path) in message
    return message


def test_arms_are_named_from_the_values_with_the_control_first(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, SWEEP))
    assert plan.design is Design.SWEEP and plan.control_arm == "n_max=4"
    arms = plan.all_arms
    assert list(arms) == ["n_max=4", "n_max=2", "n_max=8"]
    assert arms["n_max=8"].extra_args == ("--model-draft", "d.gguf", "--spec-draft-n-max", "8")
    # every arm once per block, control lettered A; 2 blocks x 3 arms
    assert len(plan.legs) == 6 and plan.pairs == ()
    assert [a for _, a in plan.legs[:3]] == ["n_max=4", "n_max=2", "n_max=8"]
    assert [n for n, _ in plan.legs[3:]] == ["C2", "B2", "A2"]  # odd k: the mirrored square


def test_separate_control_and_a_two_parameter_grid(tmp_path: Path) -> None:
    text = HEAD + """
[arms.control]
description = "plain decoding"

[[sweep.parameters]]
name = "n_max"
flag = "--spec-draft-n-max"
values = [4, 8]

[[sweep.parameters]]
name = "p_min"
env = "LLAMA_ARG_DRAFT_P_MIN"
values = [0.5, 0.75]
"""
    plan = load_plan(write(tmp_path, text.replace("[arms.control]", "[sweep]\n[arms.control]")))
    assert list(plan.all_arms) == ["control", "n_max=4,p_min=0.5", "n_max=4,p_min=0.75",
                                   "n_max=8,p_min=0.5", "n_max=8,p_min=0.75"]
    assert plan.all_arms["n_max=8,p_min=0.75"].env == {"LLAMA_ARG_DRAFT_P_MIN": "0.75"}
    assert len(plan.legs) == 2 * 5


def test_one_value_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, SWEEP.replace("values = [2, 4, 8]", "values = [4]"))
    assert "key 'sweep.parameters.0.values'" in message and "at least two values" in message


def test_duplicate_values_are_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, SWEEP.replace("values = [2, 4, 8]", "values = [2, 4, 4]"))
    assert "key 'sweep.parameters.0.values'" in message and "duplicate value 4" in message


def test_values_giving_the_same_argv_are_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, SWEEP.replace("values = [2, 4, 8]", 'values = [2, 4, "4"]'))
    assert "key 'sweep'" in message
    assert "arms 'n_max=4' and 'n_max=4' start the same server" in message
    # a separate control that starts the same server as a swept arm
    text = HEAD + """
[arms.control]
extra_args = ["--spec-draft-n-max", "4"]

[sweep]
[[sweep.parameters]]
name = "n_max"
flag = "--spec-draft-n-max"
values = [2, 4]
"""
    message = refused(tmp_path, text)
    assert "arms 'control' and 'n_max=4' start the same server" in message


def test_too_many_arms_says_the_limit(tmp_path: Path) -> None:
    values = ", ".join(str(v) for v in range(1, MAX_SWEEP_ARMS + 2))
    message = refused(tmp_path, SWEEP.replace("values = [2, 4, 8]", f"values = [{values}]")
                      .replace('control = "n_max=4"', 'control = "n_max=1"'))
    assert "key 'sweep'" in message and f"at most {MAX_SWEEP_ARMS}" in message
    assert f"makes {MAX_SWEEP_ARMS + 1} arms" in message


@pytest.mark.parametrize("design", ["aa", "single", "abba"])
def test_a_sweep_in_another_design_is_refused(tmp_path: Path, design: str) -> None:
    message = refused(tmp_path, SWEEP.replace('design = "sweep"', f'design = "{design}"'))
    assert "key 'sweep'" in message and f"design is '{design}'" in message


def test_control_must_be_an_arm(tmp_path: Path) -> None:
    message = refused(tmp_path, SWEEP.replace('control = "n_max=4"', 'control = "n_max=5"'))
    assert "'n_max=5' is not an arm of the sweep" in message
    message = refused(tmp_path, SWEEP.replace('control = "n_max=4"\n', ""))
    assert "needs a control" in message


def test_plans_without_a_sweep_keep_their_hash() -> None:
    import json

    fixture = FIXTURES_DIR / "legacy-plan"
    plan = Plan.model_validate(json.loads((fixture / "plan.json").read_text()))
    assert plan.sha256 == (fixture / "plan.sha256").read_text().split()[0]
    assert b'"sweep"' not in plan.canonical()


def test_the_sweep_is_in_the_hash(tmp_path: Path) -> None:
    a = load_plan(write(tmp_path, SWEEP))
    b = load_plan(write(tmp_path, SWEEP.replace("values = [2, 4, 8]", "values = [2, 4, 16]")))
    assert a.sha256 != b.sha256 and b'"sweep"' in a.canonical()


def test_a_sequential_sweep_runs_up_to_max_blocks(tmp_path: Path) -> None:
    text = SWEEP.replace("blocks = 2\n", "") + "\n[sequential]\nmax_blocks = 5\n"
    plan = load_plan(write(tmp_path, text))
    assert plan.sequential is not None and plan.max_blocks == 5
    assert len(plan.legs) == 3 * 5  # the most it may run; the rule decides how many


def test_a_sequential_sweep_with_fixed_blocks_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, SWEEP + "\n[sequential]\nmax_blocks = 5\n")
    assert "blocks = 2 with [sequential]" in message and "leave blocks out" in message


def test_plan_power_on_a_sequential_sweep_uses_its_most_blocks(tmp_path: Path) -> None:
    from cli_support import cli_in_process

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    text = SWEEP.replace("blocks = 2\n", "") + "\n[sequential]\nmax_blocks = 5\n"
    path = write(tmp_path, text)
    done = cli_in_process(["plan", "power", str(path), "--sd-leg", "1.11", "--sd-row", "3.42"],
                          {"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    # 3 arms x 5 blocks (it said 1 block, 0 df and no power before)
    assert "5 block(s) = 15 legs" in done.stdout and "8 df" in done.stdout
    assert "sequential: at most 5 blocks" in done.stdout
