"""`[row_limits]` in a plan: reaches every leg, and leaves older plans' hashes alone."""

from __future__ import annotations

import json
from pathlib import Path

from tokrecord.client.limits import RowLimits
from tokrecord.experiment.plan import load_plan
from tokrecord.experiment.runner import leg_config, plan_suite

PLAN = """\
name = "limits"

[server]
argv = ["python", "-m", "tokrecord.server.fake", "--port", "{port}", "--model", "{model}"]
model = "m"

[arms.control]
[arms.candidate]
"""


def test_default_row_limits_leave_the_plan_hash_alone(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    plan = load_plan(path)
    assert "row_limits" not in json.loads(plan.canonical())
    path.write_text(PLAN + "\n[row_limits]\ndeadline_floor_s = 120.0\n")
    assert load_plan(path).sha256 == plan.sha256


def test_plan_row_limits_reach_the_leg(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.replace('[arms.control]', '[row_limits]\ndeadline_floor_s = 30.0\n'
                                 'bytes_per_token = 4096\n\n[arms.control]'))
    plan = load_plan(path)
    assert plan.row_limits == RowLimits(deadline_floor_s=30.0, bytes_per_token=4096)
    assert json.loads(plan.canonical())["row_limits"]["deadline_floor_s"] == 30.0
    config = leg_config(plan, plan_suite(plan), "B1-control", "control", 1)
    assert config.row_limits.deadline_s(100) == 30.0 + 100 * 0.5
    assert config.row_limits.row_bytes(10) == 4 * 1024 * 1024 + 10 * 4096
