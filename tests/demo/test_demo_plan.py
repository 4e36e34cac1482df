"""The demo's plans: the llama.cpp arms (draft-model speculation, its identity), the design
sized by the time budget, and what the demo says given the power it had."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokrecord.demo import plan as demo_plan
from tokrecord.demo.plan import (
    DEMO_BUDGET_S,
    DemoTiming,
    blocks_within,
    claim_lines,
    demo_plan_llamacpp,
    demo_seconds,
    design_lines,
    llamacpp_log_rules,
)
from tokrecord.experiment.plan import Plan, draft_paths, speculative_configs
from tokrecord.experiment.power import min_detectable_effect, plan_noise, power_report
from tokrecord.experiment.stats import Verdict, VerdictAnalysis


@pytest.fixture()
def models(tmp_path: Path) -> tuple[Path, Path]:
    # The plan reads only the paths (and the draft's existence, for its identity).
    target = tmp_path / "target.gguf"
    draft = tmp_path / "draft.gguf"
    target.write_bytes(b"GGUF target")
    draft.write_bytes(b"GGUF draft")
    return target, draft


def _plan(models: tuple[Path, Path], blocks: int = 1) -> Plan:
    return demo_plan_llamacpp(Path("/venv/bin/python"), *models, blocks=blocks)


def test_arms_differ_only_by_the_draft(models: tuple[Path, Path]) -> None:
    target, draft = models
    plan = _plan(models)
    assert plan.server.model == str(target)
    assert plan.arms["control"].extra_args == ()
    args = plan.arms["candidate"].extra_args
    assert args == ("--spec-draft-model", str(draft), "--spec-type", "draft-simple",
                    "--spec-draft-n-max", str(demo_plan.DRAFT_N_MAX),
                    "--spec-draft-threads", "1")
    assert plan.arms["control"].env == plan.arms["candidate"].env == {}
    # One thread for the server in both arms: the client keeps the other core.
    argv = plan.server.argv
    assert argv[argv.index("-t") + 1] == "1" and "-tb" not in argv


def test_draft_flows_into_speculative_config_and_identity(models: tuple[Path, Path]) -> None:
    _, draft = models
    plan = _plan(models)
    spec = speculative_configs(plan)
    assert spec["control"] is None
    cand = spec["candidate"]
    assert cand is not None
    assert (cand.method, cand.num_speculative_tokens, cand.draft_model) == (
        "draft-simple", demo_plan.DRAFT_N_MAX, str(draft))
    # The draft's bytes are identified with the plan's (runner: collect_identity(drafts=...)).
    assert draft_paths(plan) == {"candidate": draft}
    draft.unlink()
    assert draft_paths(plan) == {}


def test_plan_preregisters_blocks_effect_and_noise(models: tuple[Path, Path]) -> None:
    plan = _plan(models, blocks=3)
    assert [name for name, _ in plan.legs] == ["A1", "B1", "B2", "A2", "B3", "A3", "A4", "B4",
                                               "A5", "B5", "B6", "A6"]
    assert plan.min_effect_pct == demo_plan.DEMO_MIN_EFFECT_PCT
    noise = plan_noise(plan, "demo")
    assert (noise.sd_leg_pct, noise.sd_row_pct) == (demo_plan.DEMO_NOISE.sd_leg_pct,
                                                    demo_plan.DEMO_NOISE.sd_row_pct)
    assert plan.sha256 != _plan(models, blocks=2).sha256


# The launcher's first line and llama.cpp's own lines, as a speculative leg logs them.
_DRAFT_LOG = (
    "xllamacpp 2026.10.11549 llama_example=12; model=/m/target.gguf host=['127.0.0.1'] "
    "port=1 n_parallel=1 threads=1 cache_prompt=False n_cache_reuse=0 spec_types="
    "['COMMON_SPECULATIVE_TYPE_NONE', 'COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE'] "
    "draft_model='/m/tokrecord-demo-llama.gguf'\n"
    "0.00.045.438 I common_speculative_init_result: loading draft model '/m/d.gguf'\n"
    "srv    load_model: n_slots = 1, ...\n"
    "slot print_timing: id  0 | task 0 | draft acceptance = 1.00000 (  438 accepted /   438 "
    "generated), mean len =  7.00\n"
)
_PLAIN_LOG = (
    "xllamacpp 2026.10.11549 llama_example=12; model=/m/target.gguf host=['127.0.0.1'] "
    "port=1 n_parallel=1 threads=1 cache_prompt=False n_cache_reuse=0 spec_types="
    "['COMMON_SPECULATIVE_TYPE_NONE'] draft_model=''\n"
    "srv    load_model: n_slots = 1, ...\n"
)


@pytest.mark.parametrize(("arm", "log", "other"), [("draft", _DRAFT_LOG, _PLAIN_LOG),
                                                   ("plain", _PLAIN_LOG, _DRAFT_LOG)])
def test_log_rules_hold_for_their_arm_only(arm: str, log: str, other: str) -> None:
    def holds(rule_log: str) -> list[bool]:
        found = []
        for rule in llamacpp_log_rules(arm):
            present = re.search(rule.pattern, rule_log) is not None
            found.append(present if rule.expect == "present" else not present)
        return found

    assert all(holds(log))
    # The treatment claims fail on the other arm's log (the two common ones still hold).
    assert holds(other).count(False) >= 2


def test_blocks_fit_the_budget() -> None:
    t = DemoTiming(setup_s=60, teacher_leg_s=40, control_leg_s=50, candidate_leg_s=40, margin=1.0)
    # 60 + 40 + k * (2 * 90 + 4 * 5) = 100 + 200 k
    assert [demo_seconds(k, t) for k in (1, 2, 3)] == [300, 500, 700]
    assert blocks_within(500, t) == 2
    assert blocks_within(699, t) == 2
    assert blocks_within(700, t) == 3
    assert blocks_within(10_000, t, most=4) == 4
    assert blocks_within(100, t) == 1  # never none; design_lines says it is over budget
    assert demo_seconds(1, t.model_copy(update={"margin": 1.5})) == 60 + 1.5 * 240
    # The shipped figures: `make demo` gets at least two blocks in its 10 minutes.
    assert blocks_within(DEMO_BUDGET_S) >= 2
    assert demo_seconds(blocks_within(DEMO_BUDGET_S)) <= DEMO_BUDGET_S


def test_design_lines_give_blocks_power_and_what_it_can_find(models: tuple[Path, Path]) -> None:
    plan = _plan(models, blocks=1)
    noise = plan_noise(plan, "demo")
    report = power_report(plan, noise, 13)
    mde = min_detectable_effect(noise, 13, 1, 0.95, 1.0)
    lines = design_lines(plan, report, mde, budget_s=60, sized_by_budget=True)
    assert lines[0].startswith("design: 1 ABBA block(s) = 4 legs after the teacher (as many as "
                               "fit the 1 min budget; expected ")
    assert lines[1].startswith("  over budget: 1 block(s) are expected to take ")
    assert "+5 %: " in lines[2] and "noise: leg 2.3 %, row 2.4 %" in lines[2]
    assert lines[3] == f"  with 90 % power this design finds +{mde:g} % or more"
    assert lines[4].startswith("  underpowered for the preregistered +5 %: ")
    assert not any("over budget" in line for line in
                   design_lines(_plan(models, 2), report, mde, 600, False))


def _analysis(ratio: float | None, low: float | None, high: float | None,
              verdict: Verdict) -> VerdictAnalysis:
    return VerdictAnalysis(
        method="m", statistic="s", ratio=ratio, ci_low=low, ci_high=high, confidence=0.95,
        equivalence_pct=1.0, blocks=2, legs=8, rows_used=13, df=5, leg_statistics={},
        residual_sd_pct=None, leg_noise_sd_pct=None, leg_noise_df=5, row_noise_sd_pct=None,
        row_noise_df=0, verdict=verdict, record_confidence=0.98, record_ci_low=None,
        record_ci_high=None, record_verdict=verdict, reason="t(5) on 8 legs")


def test_claims_follow_verdict_and_power() -> None:
    big = claim_lines(_analysis(1.30, 1.25, 1.35, Verdict.FASTER), 6.3)
    assert big == ["claim: the candidate is FASTER by +30.0 % [+25.0 %, +35.0 %], interval "
                   "width 10.0 points"]
    small = claim_lines(_analysis(1.03, 1.01, 1.05, Verdict.FASTER), 6.3)
    assert small[0].startswith("FASTER +3.0 %") and "smaller than the +6.3 %" in small[0]
    assert not small[0].startswith("claim")
    same = claim_lines(_analysis(1.001, 0.995, 1.007, Verdict.NO_DIFFERENCE), 6.3)
    assert same[0].startswith("claim: no difference beyond ±1 %: +0.1 %")
    wide = claim_lines(_analysis(1.02, 0.97, 1.07, Verdict.UNDECIDED), 6.3)
    assert wide[0].startswith("no claim: +2.0 % [-3.0 %, +7.0 %]")
    assert "the effect is smaller than that" in wide[0]
    noisy = claim_lines(_analysis(1.10, 0.99, 1.21, Verdict.UNDECIDED), 6.3)
    assert "noisier than the plan's noise figures" in noisy[0]
    none = claim_lines(_analysis(None, None, None, Verdict.UNDECIDED), 6.3)
    assert none == ["no claim: the verdict could not be computed (t(5) on 8 legs)"]


def test_the_budget_sized_demo_is_sequential_and_never_longer(models: tuple[Path, Path]
                                                              ) -> None:
    from tokrecord.demo.plan import demo_plan_llamacpp, demo_sequential

    assert demo_sequential(1) is None  # one block: nothing to stop early
    spec = demo_sequential(2)
    assert spec is not None and spec.max_blocks == 2 and spec.min_blocks == 1
    plan = demo_plan_llamacpp(Path("/venv/bin/python"), *models, blocks=2, sequential=spec)
    fixed = _plan(models, blocks=2)
    assert plan.legs == fixed.legs  # at most the fixed design's legs, in its order
    assert plan.sha256 != fixed.sha256
    report = power_report(plan, plan_noise(plan, "demo"), 13)
    assert report.blocks == 2  # the power of its maximum, as a fixed design
    lines = design_lines(plan, report, 5.0, budget_s=600, sized_by_budget=True)
    assert lines[0].startswith("design: sequential, at most 2 ABBA blocks = 8 legs after "
                               "the teacher (as many as fit the 10 min budget), a look "
                               "after each block from block 1 (pocock spending)")


def test_sequential_claim_names_the_stop_and_the_repeated_interval() -> None:
    from tokrecord.demo.plan import sequential_claim_lines
    from tokrecord.experiment.plan import Spending
    from tokrecord.experiment.sequential import Design, LookInput, analyse

    found = analyse([LookInput(label="block 1", fraction=0.5, estimate=0.3, se=0.01, df=2)],
                    2, [0.5, 1.0], Spending.POCOCK, 0.95, 0.98, 1.0)
    lines = sequential_claim_lines(found, 2)
    assert lines[0].startswith("claim: the candidate is FASTER by +35.0 % [repeated 95 % CI ")
    assert lines[0].endswith("; stopped after block 1 of 2: 4 legs not run")
    assert "bias-adjusted" not in lines[1]  # analysed without the design: no adjustment
    design = Design(units=(1, 2), max_units=2, extra_df=2)
    adjusted = analyse([LookInput(label="block 1", fraction=0.5, estimate=0.3, se=0.01,
                                  df=2)], 2, [0.5, 1.0], Spending.POCOCK, 0.95, 0.98, 1.0,
                       design)
    assert adjusted.estimate_adjusted_ratio is not None
    assert f"bias-adjusted {100 * (adjusted.estimate_adjusted_ratio - 1):+.1f} %" in \
        sequential_claim_lines(adjusted, 2)[1]


def test_the_demo_is_sequential_unless_asked_for_the_fixed_design() -> None:
    """Issue 32: `make demo` runs sequentially and stops once its effect is decided."""
    from typer.testing import CliRunner

    from tokrecord.cli import app

    out = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    assert "--sequential" in out.output and "--fixed" in out.output
    assert "[default: sequential]" in out.output


def test_the_sweep_demo_takes_four_rows_unless_told(models: tuple[Path, Path]) -> None:
    # 12 legs and a teacher on 2 CPU cores: all 13 rows did not finish in reasonable time
    from tokrecord.demo.plan import SWEEP_DEMO_ROWS, demo_sweep_plan_llamacpp

    plan = demo_sweep_plan_llamacpp(Path("/venv/bin/python"), *models)
    assert SWEEP_DEMO_ROWS == 4 and plan.suite_rows == 4
    assert len(plan.all_arms) == 6 and len(plan.legs) == 12
    assert demo_sweep_plan_llamacpp(Path("/venv/bin/python"), *models, rows=13).suite_rows == 13
