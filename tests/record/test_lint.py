"""lint: the seed records pass; a copy with one derived number changed fails, naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.record.lint import lint_record

SEEDS = FIXTURES_DIR / "seeds"


def seed(name: str) -> dict[str, Any]:
    return json.loads((SEEDS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def mutate(record: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(record)
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value(node[parts[-1]]) if callable(value) else value
    return out


@pytest.mark.parametrize("name", ["single-leg-record", "abba-experiment-record"])
def test_seeds_pass(name: str) -> None:
    assert lint_record(seed(name)) == []


def bump(x: float) -> float:
    return x * 1.001


SINGLE = [
    ("metric_accounting.conventional_interval_value_tok_s", bump),
    ("metric_accounting.conventional_margin_to_goal_tok_s", bump),
    ("record.margin_over_goal_tok_s", bump),
    ("record.delta_vs_approved_tok_s", bump),
    ("record.delta_vs_approved_pct", bump),
    ("record.delta_vs_prior_best_exact_pct", bump),
    ("summary.draft_acceptance_rate", bump),
    ("summary.emitted_tokens_per_draft_cycle", bump),
    ("summary.tok_s_out", bump),
    ("quality.teacher_exact", "14/13"),
    ("sha256.bench", "not-a-hash"),
]


@pytest.mark.parametrize(("path", "change"), SINGLE, ids=[p for p, _ in SINGLE])
def test_single_leg_mutation_is_named(path: str, change: Any) -> None:
    problems = lint_record(mutate(seed("single-leg-record"), path, change))
    assert problems, f"changing {path} was not caught"
    assert path in {p.field for p in problems}, [str(p) for p in problems]


ABBA = [
    ("pair_results.B1_vs_A1.headline_delta_pct", bump),
    ("pair_results.B2_vs_A2.aggregate_cycle_saving_ms", bump),
    ("pair_results.B2_vs_A2.acceptance_rate_delta_percentage_points", lambda x: x - 0.01),
    ("pair_results.B1_vs_A1.passed", False),
    ("record_gate.delta_vs_prior_record_pct", bump),
    ("record_gate.delta_vs_prior_record_tok_s", bump),
    ("record_gate.candidate_lower_start_tok_s", bump),
    ("record_gate.control_lower_start_tok_s", bump),
    ("quality.all_legs_teacher_exact", "51/52"),
]


@pytest.mark.parametrize(("path", "change"), ABBA, ids=[p for p, _ in ABBA])
def test_abba_mutation_is_named(path: str, change: Any) -> None:
    problems = lint_record(mutate(seed("abba-experiment-record"), path, change))
    assert path in {p.field for p in problems}, [str(p) for p in problems]


def test_changed_leg_headline_breaks_pair_and_gate() -> None:
    problems = lint_record(mutate(seed("abba-experiment-record"), "runs.B2.headline_tok_s", bump))
    fields = {p.field for p in problems}
    assert "pair_results.B2_vs_A2.headline_delta_pct" in fields
    assert "record_gate.candidate_lower_start_tok_s" in fields


def test_a_pass_the_numbers_do_not_support_is_caught() -> None:
    record = mutate(seed("abba-experiment-record"), "record_gate.prior_record_tok_s", 40.0)
    record = mutate(record, "record_gate.delta_vs_prior_record_tok_s", 33.89498511171744 - 40.0)
    record = mutate(record, "record_gate.delta_vs_prior_record_pct",
                    100 * (33.89498511171744 / 40.0 - 1))
    problems = lint_record(record)
    assert [p.field for p in problems] == ["record_gate.strict_preregistered_record_pass"]
    assert "does not beat the prior record" in problems[0].message


def test_not_a_record() -> None:
    assert lint_record({"hello": 1})[0].field == "(record)"


# --------------------------------------------------------------------------- v2 and v1 records

FIXTURES = FIXTURES_DIR
V2 = FIXTURES / "report" / "v2-blocks2"  # ABBA over 2 blocks, FASTER, a preregistered power
AA = FIXTURES / "report" / "v2-aa"  # A/A over one block
V1 = FIXTURES / "v1-record" / "abba"


def record_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "record.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", [V2, AA, V1, FIXTURES / "report" / "demo"],
                         ids=["v2-blocks2", "v2-aa", "v1", "v1-demo"])
def test_our_records_pass(path: Path) -> None:
    assert lint_record(record_of(path)) == []


V2_MUTATIONS = [
    # pairs and the gate over every block, not A1 B1 B2 A2 only
    ("pair_results.B4_vs_A4.headline_delta_pct", bump),
    ("pair_results.B3_vs_A3.passed", False),
    ("pair_results.B3_vs_A3.candidate", "B1"),
    ("record_gate.candidate_higher_start_tok_s", bump),
    ("record_gate.control_lower_start_tok_s", bump),
    ("record_gate.pairs_passed", False),
    ("quality.all_legs_teacher_exact", "23/24"),
    # the design
    ("protocol.order", lambda order: order[:4] + order[5:4:-1] + order[4:5] + order[6:]),
    ("protocol.pairs", lambda pairs: pairs[:3]),
    ("runs.B3.treatment", "control"),
    ("metric_accounting.headline_leg", "B1"),
    ("metric_accounting.published_value_tok_s", bump),
    # the leg-level verdict
    ("verdict_analysis.ratio", lambda x: x * 1.01),
    ("verdict_analysis.ci_high", lambda x: x * 1.001),
    ("verdict_analysis.record_ci_low", lambda x: x * 0.999),
    ("verdict_analysis.verdict", "NO DIFFERENCE"),
    ("verdict_analysis.record_verdict", "UNDECIDED"),
    ("verdict_analysis.df", 6),
    ("verdict_analysis.blocks", 1),
    ("verdict_analysis.residual_sd_pct", bump),
    ("verdict", "UNDECIDED"),
    # the preregistered power
    ("power.min_effect_power", lambda x: x - 0.01),
    ("power.blocks", 3),
    ("power.df", 6),
]


@pytest.mark.parametrize(("path", "change"), V2_MUTATIONS, ids=[p for p, _ in V2_MUTATIONS])
def test_v2_mutation_is_named(path: str, change: Any) -> None:
    problems = lint_record(mutate(record_of(V2), path, change))
    assert path in {p.field for p in problems}, [str(p) for p in problems]


def test_v2_leg_headline_change_breaks_pair_gate_and_headline_leg() -> None:
    # B4 becomes the lowest candidate leg: the gate's lower candidate and the headline
    # leg (B2) are now wrong, and so is B4's pair.
    record = mutate(record_of(V2), "runs.B4.headline_tok_s", 2100.0)
    fields = {p.field: p for p in lint_record(record)}
    assert {"pair_results.B4_vs_A4.headline_delta_pct", "record_gate.candidate_lower_start_tok_s",
            "metric_accounting.headline_leg"} <= set(fields)
    assert fields["record_gate.candidate_lower_start_tok_s"].expected == 2100.0
    assert fields["record_gate.candidate_lower_start_tok_s"].message == \
        "lower of B1, B2, B3, B4 headlines"
    assert (fields["metric_accounting.headline_leg"].found,
            fields["metric_accounting.headline_leg"].expected) == ("B2", "B4")


def test_v2_leg_figures_recompute_the_interval() -> None:
    record = mutate(record_of(V2), "verdict_analysis.leg_statistics.B1", lambda x: x + 1.0)
    fields = {p.field for p in lint_record(record)}
    assert {"verdict_analysis.ratio", "verdict_analysis.ci_low", "verdict_analysis.ci_high",
            "verdict_analysis.record_ci_low", "verdict_analysis.residual_sd_pct"} <= fields


def test_v2_missing_and_extra_legs_are_named() -> None:
    record = record_of(V2)
    record["runs"]["B5"] = record["runs"].pop("B4")
    fields = {p.field: p.message for p in lint_record(record)}
    assert fields["runs.B4"].startswith("a leg of the design is missing (2 blocks: A1 B1 B2 A2 "
                                        "B3 A3 A4 B4)")
    assert fields["runs.B5"].startswith("not a leg of the design")


def test_v2_ratio_outside_its_interval_and_inconsistent_verdict() -> None:
    record = mutate(record_of(V2), "verdict_analysis.ratio", 1.2)
    problems = [p for p in lint_record(record) if p.field == "verdict_analysis"]
    assert [p.message for p in problems] == ["ratio outside its CI"]
    assert problems[0].found == [record["verdict_analysis"]["ci_low"], 1.2,
                                 record["verdict_analysis"]["ci_high"]]
    # An interval inside the ±1 % band is NO DIFFERENCE, whatever the record says.
    narrow = mutate(record_of(V2), "verdict_analysis.ci_low", 0.995)
    narrow = mutate(narrow, "verdict_analysis.ci_high", 1.005)
    narrow = mutate(narrow, "verdict_analysis.ratio", 1.0)
    found = {p.field: p for p in lint_record(narrow)}
    assert (found["verdict_analysis.verdict"].found,
            found["verdict_analysis.verdict"].expected) == ("FASTER", "NO DIFFERENCE")


def test_v2_undecided_with_no_interval() -> None:
    record = record_of(V2)
    record["verdict_analysis"].update(ratio=None, ci_low=None, ci_high=None, record_ci_low=None,
                                      record_ci_high=None, verdict="UNDECIDED",
                                      record_verdict="UNDECIDED", reason="no row has a rate")
    record["verdict"] = record["record_gate"]["verdict"] = "UNDECIDED"
    assert lint_record(record) == []
    claims = mutate(record, "verdict_analysis.verdict", "FASTER")
    assert "verdict_analysis.verdict" in {p.field for p in lint_record(claims)}
    half = mutate(record, "verdict_analysis.ci_low", 1.01)
    assert [p.message for p in lint_record(half) if p.field == "verdict_analysis"] == \
        ["ratio and interval are given together or not at all"]


def test_aa_runs_one_arm_and_never_passes() -> None:
    record = mutate(record_of(AA), "runs.B1.treatment", "candidate")
    fields = {p.field: p for p in lint_record(record)}
    assert fields["runs.B1.treatment"].expected == "control"
    assert "protocol.order" in fields
    claimed = mutate(record_of(AA), "record_gate.strict_preregistered_record_pass", True)
    messages = [p.message for p in lint_record(claimed)
                if p.field == "record_gate.strict_preregistered_record_pass"]
    assert "claims a pass but an A/A design makes no speed claim" in messages
    two_arms = mutate(record_of(AA), "treatment", lambda arms: {**arms, "candidate": arms["control"]})
    assert "treatment" in {p.field for p in lint_record(two_arms)}


def test_v1_gate_still_names_b1_and_b2() -> None:
    record = mutate(record_of(V1), "record_gate.candidate_lower_start_tok_s", bump)
    problems = [p for p in lint_record(record) if p.field == "record_gate.candidate_lower_start_tok_s"]
    assert [p.message for p in problems] == ["lower of B1, B2 headlines"]
    order = mutate(record_of(V1), "protocol.order", lambda o: [o[1], o[0], *o[2:]])
    assert [p.message for p in lint_record(order) if p.field == "protocol.order"] == \
        ["order is A1 B1 B2 A2 with each leg's treatment"]
