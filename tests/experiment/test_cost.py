"""The planner's cost of a decision: leg cost, the design simulation, the optimum rows,
and `tokrecord plan power|cost` on the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokrecord.cli import app
from tokrecord.errors import ConfigError
from tokrecord.experiment.cost import (
    LegCost,
    best_spending,
    fixed_design,
    kalibera_jones_rows,
    leg_cost_from_record,
    plan_cost_inputs,
    sequential_blocks_for_power,
    simulate,
)
from tokrecord.experiment.plan import Spending
from tokrecord.experiment.stats import Noise, power

PLAN = """name = "next"
design = "abba"
min_effect_pct = 5
suite_rows = 5
[server]
argv = ["llama-server", "-m", "{model}", "--port", "{port}"]
model = "m.gguf"
[arms.control]
[arms.candidate]
"""


def _record(ready: float = 1.0, idle: float = 2.0, gap: float = 3.0) -> dict[str, object]:
    legs = {n: {"server_ready_seconds": ready, "prestart_idle_seconds": idle,
                "poststop_idle_seconds": idle, "stop_seconds": 0.5} for n in ("A1", "B1")}
    return {"operational": {"legs": legs},
            "protocol": {"idle_gap_seconds_measured": {"A1": gap, "B1": gap},
                         "idle_gap_seconds_minimum": 1.0,
                         "top_level_output_tokens_suite_median": 512},
            "runs": {"A1": {"wall_full_median_tok_s": 1000.0},
                     "B1": {"wall_full_median_tok_s": 1048.0}}}


def test_leg_cost_from_a_record_is_its_medians() -> None:
    cost = leg_cost_from_record(_record(), "r.json")
    assert cost.start_s == pytest.approx(1.0 + 2.0 + 2.0 + 0.5)
    assert cost.gap_s == 3.0
    assert cost.row_s == pytest.approx(512 / 1024)  # median of 1000 and 1048 tok/s
    assert cost.leg_s(10) == pytest.approx(5.5 + 3.0 + 10 * 0.5)


def test_a_record_without_timings_is_refused_by_file_and_key() -> None:
    with pytest.raises(ConfigError, match=r"r\.json: key 'operational\.legs'"):
        leg_cost_from_record({"runs": {}}, "r.json")
    bad = _record()
    bad["runs"] = {}
    with pytest.raises(ConfigError, match=r"r\.json: keys .*runs\.\*\.wall_full_median_tok_s"):
        leg_cost_from_record(bad, "r.json")


def test_cost_figures_with_no_record_and_no_costs_name_the_plan() -> None:
    with pytest.raises(ConfigError, match=r"p\.toml: cost figures need a leg's cost: no "
                       r"earlier record and no costs given"):
        plan_cost_inputs("p.toml", (), None, None, None)
    with pytest.raises(ConfigError, match="give both --start-s and --row-s"):
        plan_cost_inputs("p.toml", (), 3.0, None, None)
    assert plan_cost_inputs("p.toml", (), 3.0, 0.5, None).leg_s(4) == 5.0


def test_kalibera_jones_optimum_by_hand() -> None:
    # r* = sqrt((pi/3) sd_row^2 c0 / (sd_leg^2 c1)) = sqrt(pi/3 * 25 * 12 / (1 * 0.5))
    cost = LegCost(start_s=10.0, gap_s=2.0, row_s=0.5)
    found = kalibera_jones_rows(Noise(sd_leg_pct=1.0, sd_row_pct=5.0), cost)
    assert found == pytest.approx(math.sqrt(math.pi / 3 * 25 * 12 / 0.5))
    assert kalibera_jones_rows(Noise(sd_leg_pct=0.0, sd_row_pct=5.0), cost) is None


@pytest.mark.parametrize(("effect", "blocks"), [(0.0, 3), (3.0, 2), (5.0, 4)])
def test_the_fixed_design_simulation_agrees_with_the_power_formula(effect: float,
                                                                    blocks: int) -> None:
    noise = Noise(sd_leg_pct=2.0, sd_row_pct=3.0)
    f, _, _, _, mean_blocks = simulate(effect, noise, 13, *fixed_design(blocks, 0.95), 1.0,
                                       trials=20_000, seed=3)
    assert mean_blocks == blocks
    assert f == pytest.approx(power(effect, noise, 13, blocks, 0.95, 1.0), abs=0.012)


def test_plan_power_takes_noise_from_the_command_line(tmp_path: Path) -> None:
    """The bug: a plan with min_effect_pct and no [noise] was refused with 'no noise
    given' though --sd-leg and --sd-row gave it."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = CliRunner().invoke(app, ["plan", "power", str(plan), "--sd-leg", "1",
                                   "--sd-row", "2"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "noise: leg 1.000 %, row 2.000 % (from given)" in out.output
    assert "+5 % (min_effect_pct)" in out.output


def test_plan_power_without_any_noise_still_says_so(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = CliRunner().invoke(app, ["plan", "power", str(plan)], env={"COLUMNS": "200"})
    assert out.exit_code != 0 and "no noise given" in out.output
    assert "key 'min_effect_pct'" in out.output


def test_plan_cost_without_costs_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = CliRunner().invoke(app, ["plan", "cost", str(plan), "--sd-leg", "1", "--sd-row",
                                   "2"], env={"COLUMNS": "200"})
    assert out.exit_code != 0
    # The console wraps at 80 columns, inside a long tmp path too: compare without newlines.
    assert f"{plan}: cost figures need a leg's cost" in out.output.replace("\n", "")


def test_plan_cost_prints_fixed_and_sequential_and_warns(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = CliRunner().invoke(app, ["plan", "cost", str(plan), "--sd-leg", "3", "--sd-row",
                                   "5", "--start-s", "10", "--row-s", "0.5", "--json"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    designs = [(o["design"], o["effect_pct"]) for o in report["outcomes"]]
    assert designs == [("fixed", 0), ("sequential", 0), ("fixed", 5), ("sequential", 5),
                       ("fixed", 10), ("sequential", 10)]
    fixed5 = report["outcomes"][2]
    assert fixed5["blocks"] == 1 and fixed5["expected_legs"] == 4
    assert fixed5["expected_wall_s"] == pytest.approx(4 * (10 + 5 * 0.5))
    # One block at 3 % leg noise decides almost nothing: warned before it runs.
    assert any("UNDECIDED" in w for w in report["warnings"])
    seq5 = report["outcomes"][3]
    assert seq5["p_faster"] >= 0.88  # the sequential design chosen for 90 % power
    rec = report["recommendation"]
    assert 3 <= rec["rows"] <= 13 and rec["max_blocks"] >= rec["fixed_blocks"]


@pytest.mark.parametrize(("section", "key", "why"), [
    ("max_blocks = 3\nmin_blocks = 4\n", "sequential.max_blocks",
     "max_blocks (3) is less than min_blocks (4)"),
    ("max_blocks = 4\nspending = \"haybittle\"\n", "sequential.spending", "'pocock'"),
])
def test_plan_commands_name_the_file_and_key_of_a_bad_sequential_section(
        tmp_path: Path, section: str, key: str, why: str) -> None:
    """The issue's bad input, through the command line a user types."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN + "[sequential]\n" + section)
    for command in (["plan", "cost", str(plan), "--sd-leg", "1", "--sd-row", "2",
                     "--start-s", "5", "--row-s", "0.5"],
                    ["plan", "power", str(plan), "--sd-leg", "1", "--sd-row", "2"]):
        out = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
        text = out.output.replace("\n", "")
        assert out.exit_code != 0
        assert f"{plan}: key '{key}'" in text and why in text, text


def test_a_plan_without_a_spending_gets_the_one_that_stops_soonest() -> None:
    """At H200 draft-model noise and +5 %, Pocock-like spending stops earlier on average
    than O'Brien-Fleming-like at 90 % power, so the planner's default design uses it.
    About 3 s at load average 11 on 2 cores: the t boundaries of the four designs it
    compares (200 000 simulated paths each) are what it checks."""
    noise = Noise(sd_leg_pct=3.141, sd_row_pct=5.501)
    chosen, found = best_spending(5.0, noise, 13, 2, 0.95, 1.0, trials=2000)
    each = {s: sequential_blocks_for_power(5.0, noise, 13, s, 2, 0.95, 1.0, trials=2000,
                                           start=7)  # the fixed design's 90 % blocks
            for s in Spending}
    assert found == each[chosen] and found is not None
    assert all(f is None or found[1] <= f[1] for f in each.values())
    assert chosen is Spending.POCOCK
