"""lint: the seed records pass; a copy with one derived number changed fails, naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tokrecord.record.lint import lint_record

SEEDS = Path(__file__).parent / "fixtures" / "seeds"


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
