"""Designs as specs (experiment.design): each design's legs, arms, pairs, claim, analysis
and words, checked against hand-written layouts; plans and records answer through them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paths import FIXTURES
from plan_support import plan_toml, write_plan
from tokrecord.experiment.design import (
    SPECS,
    Analysis,
    Design,
    PlannedLeg,
    RecordForm,
    Stopping,
    design_spec,
    named_spec,
)
from tokrecord.record.schema import load_record
from tokrecord.report import fmt
from tokrecord.submit.facts import SubmitError, refuse_no_claim

ABBA_2_BLOCKS = (  # ABBA then BAAB (DESIGN.md, "Data flow")
    PlannedLeg("A1", 1, False, "control"), PlannedLeg("B1", 1, True, "candidate"),
    PlannedLeg("B2", 1, True, "candidate"), PlannedLeg("A2", 1, False, "control"),
    PlannedLeg("B3", 2, True, "candidate"), PlannedLeg("A3", 2, False, "control"),
    PlannedLeg("A4", 2, False, "control"), PlannedLeg("B4", 2, True, "candidate"),
)


def test_every_design_has_one_spec_under_its_own_name() -> None:
    assert set(SPECS) == set(Design)
    for design, spec in SPECS.items():
        assert spec.design is design
        assert design_spec(design.value) is spec
    assert named_spec(None) is None
    with pytest.raises(ValueError):
        design_spec("abab")


def test_abba_legs_arms_and_pairs_by_hand() -> None:
    spec = design_spec(Design.ABBA)
    assert spec.legs(("control", "candidate"), "control", 2) == ABBA_2_BLOCKS
    assert spec.pairs(2) == (("B1", "A1"), ("B2", "A2"), ("B3", "A3"), ("B4", "A4"))
    assert spec.makes_claim and spec.has_verdict and spec.compares_arms and spec.several_legs
    assert spec.analysis is Analysis.PAIRED_LEGS and spec.record_form is RecordForm.EXPERIMENT
    assert spec.describe(2) == "ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs"
    assert spec.describe(3) == "ABBA, 3 blocks (ABBA, BAAB, ...): 12 legs, 6 pairs"


def test_aa_runs_its_one_arm_in_abba_positions_and_claims_nothing() -> None:
    spec = design_spec(Design.AA)
    legs = spec.legs(("plain",), "control", 1)
    assert [(leg.name, leg.treated, leg.arm) for leg in legs] == [
        ("A1", False, "plain"), ("B1", True, "plain"), ("B2", True, "plain"),
        ("A2", False, "plain")]
    assert spec.pairs(1) == (("B1", "A1"), ("B2", "A2"))
    assert not spec.makes_claim and not spec.compares_arms and spec.has_verdict
    assert spec.no_claim == "an A/A design measures the noise floor; it makes no speed claim"
    assert spec.pairs_what == "B vs A positions, one arm"
    assert spec.describe(None) == ("A/A, 1 block (ABBA): 4 legs, 2 pairs (one arm in every "
                                   "leg: the noise floor, no speed claim)")


def test_single_is_one_candidate_leg_without_verdict_or_pairs() -> None:
    spec = design_spec(Design.SINGLE)
    assert spec.legs(("candidate",), "control", 1) == (PlannedLeg("B1", 1, True, "candidate"),)
    assert spec.pairs(1) == ()
    assert not spec.has_verdict and not spec.several_legs and spec.makes_claim
    assert spec.record_form is RecordForm.SINGLE_LEG


def test_sweep_runs_every_arm_once_per_block_in_williams_order() -> None:
    spec = design_spec(Design.SWEEP)
    # Two arms: the Williams square's rows (0, 1) then (1, 0).
    assert spec.legs(("control", "n2"), "control", 2) == (
        PlannedLeg("A1", 1, False, "control"), PlannedLeg("B1", 1, True, "n2"),
        PlannedLeg("B2", 2, True, "n2"), PlannedLeg("A2", 2, False, "control"))
    # Treated is "not the control", whichever position the control's letter has.
    legs = spec.legs(("x", "y", "z"), "y", 1)
    assert [(leg.name, leg.treated) for leg in legs] == [("A1", True), ("B1", False),
                                                         ("C1", True)]
    assert spec.pairs(4) == ()
    assert spec.makes_claim and spec.not_submittable is not None
    assert spec.analysis is Analysis.ARMS_FIT


def test_stopping_labels_of_the_cost_table() -> None:
    assert Stopping.FIXED.label(4) == "fixed 4"
    assert Stopping.SEQUENTIAL.label(6) == "seq <= 6"


@pytest.mark.parametrize("design", ["abba", "aa", "single"])
def test_a_plan_takes_its_legs_and_pairs_from_its_spec(tmp_path: Path, design: str) -> None:
    text = plan_toml(f"t-{design}", design=design, control=None if design != "abba" else 1000,
                     telemetry=False)
    _, plan = write_plan(tmp_path, text)
    spec = design_spec(design)
    assert plan.design_spec is spec
    expected = spec.legs(tuple(plan.all_arms), plan.control_arm, plan.max_blocks)
    assert plan.legs == tuple((leg.name, leg.arm) for leg in expected)
    assert plan.pairs == spec.pairs(plan.max_blocks)
    assert [leg.treated for leg in plan.design_legs] == [leg.treated for leg in expected]
    if design == "abba":
        assert plan.legs == (("A1", "control"), ("B1", "candidate"), ("B2", "candidate"),
                             ("A2", "control"))


def test_records_answer_through_their_design() -> None:
    v1 = load_record(FIXTURES / "v1-record" / "abba" / "record.json")
    assert v1.design_spec() is design_spec(Design.ABBA)
    assert v1.named_design() == (None, None)  # v1's reports name no design
    assert (v1.verdict_analysis, v1.power, v1.sweep, v1.sequential) == (None, None, None, None)
    assert [name for name, _, _ in v1.leg_dirs()] == ["A1", "B1", "B2", "A2"]
    assert v1.protocol.named_pairs() == []

    aa = load_record(FIXTURES / "report" / "v2-aa" / "record.json")
    raw = json.loads((FIXTURES / "report" / "v2-aa" / "record.json").read_text())
    assert aa.design_spec() is design_spec(Design.AA)
    assert aa.named_design() == ("aa", raw["protocol"]["blocks"])
    assert aa.bootstrap is None
    assert aa.arm_names() == sorted(raw["treatment"])
    assert [name for name, _, _ in aa.leg_dirs()] == [e.split("-")[0]
                                                      for e in raw["protocol"]["order"]]
    with pytest.raises(SubmitError, match=r"^this is an A/A experiment \(design 'aa': the same "
                       r"arm, .*it measures the machine's noise floor"):
        refuse_no_claim(aa)
    refuse_no_claim(v1)  # an ABBA makes a claim


def test_report_words_are_the_specs() -> None:
    for design in Design:
        assert fmt.design(design.value, 2) == design_spec(design).describe(2)
