"""Designs as specs: one spec per design a plan can ask for, and the one place that
knows what each design means (DESIGN.md, "Designs").

A spec says which legs a design runs and with which arm, which legs it pairs, what it
asks of a plan (arms, blocks, [sequential], [sweep], components), whether it makes a
speed claim, how it is analysed, which record form it writes and how readers name it.
Planning (plan, power, cost), the record builder, the reports and submission ask the spec
instead of comparing design names, so a new design is one new spec here (plus its
analysis) and a test.

This module sits below the plan (experiment.plan imports it) and imports nothing of
tokrecord's at module level, so record/, report/ and submit/ may read it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final, NamedTuple


class Design(StrEnum):
    SINGLE = "single"
    ABBA = "abba"
    AA = "aa"  # the same arm in every leg, in ABBA positions: the machine's noise floor
    SWEEP = "sweep"  # every arm of a [sweep] once per block, Williams-balanced


class DesignLeg(NamedTuple):
    name: str  # A1 B1 B2 A2 B3 A3 A4 B4 ...
    block: int  # 1-based
    treated: bool  # in a B position


class PlannedLeg(NamedTuple):
    """A leg of a design with the arm it runs."""

    name: str
    block: int  # 1-based
    treated: bool  # any arm but the control (a B position)
    arm: str


class RecordForm(StrEnum):
    """Which record a design's experiment writes (record.schema)."""

    SINGLE_LEG = "single-leg"  # tokrecord.single-leg-record
    EXPERIMENT = "experiment"  # tokrecord.experiment-record


class Analysis(StrEnum):
    """How a design's legs become a result."""

    GOAL = "one leg against the plan's goal: no verdict"
    PAIRED_LEGS = "leg-level verdict over the block-paired legs (experiment.stats)"
    NOISE_FLOOR = "leg and row noise of one arm in paired positions (experiment.stats)"
    ARMS_FIT = "every arm against control in one fit, Dunnett intervals (experiment.sweep)"


class Stopping(StrEnum):
    """How many ABBA blocks run: all of them, or until a preregistered boundary is crossed
    (experiment.sequential). The cost report sets the two against each other."""

    FIXED = "fixed"
    SEQUENTIAL = "sequential"

    def label(self, blocks: int) -> str:
        """'fixed 4' (exactly 4 blocks) or 'seq <= 6' (at most 6)."""
        return f"fixed {blocks}" if self is Stopping.FIXED else f"seq <= {blocks}"


def abba_design(blocks: int) -> tuple[DesignLeg, ...]:
    """k counterbalanced blocks: ABBA, BAAB, ABBA, ... Block b holds the legs numbered
    2b-1 and 2b of each letter, so its pairs are B(2b-1) vs A(2b-1) and B(2b) vs A(2b);
    within a block a linear drift is orthogonal to the treatment."""
    legs = []
    for b in range(1, blocks + 1):
        pattern = "ABBA" if b % 2 else "BAAB"
        seen = {"A": 0, "B": 0}
        for letter in pattern:
            number = 2 * b - 1 + seen[letter]
            seen[letter] += 1
            legs.append(DesignLeg(f"{letter}{number}", b, letter == "B"))
    return tuple(legs)


def abba_pairs(blocks: int) -> tuple[tuple[str, str], ...]:
    """(candidate leg, control leg) pairs, in block order: B1 vs A1, B2 vs A2, B3 vs A3..."""
    return tuple((f"B{n}", f"A{n}") for n in range(1, 2 * blocks + 1))


# -- how each design lays out its legs ----------------------------------------------------
# Each takes (the plan's arms in order, its control arm, the blocks it may run).

LegLayout = Callable[[Sequence[str], str, int], tuple[PlannedLeg, ...]]


def _one_candidate_leg(arms: Sequence[str], control: str, blocks: int) -> tuple[PlannedLeg, ...]:
    return (PlannedLeg("B1", 1, True, "candidate"),)


def _abba_legs(arms: Sequence[str], control: str, blocks: int) -> tuple[PlannedLeg, ...]:
    return tuple(PlannedLeg(*leg, "candidate" if leg.treated else "control")
                 for leg in abba_design(blocks))


def _one_arm_in_abba_positions(arms: Sequence[str], control: str, blocks: int
                               ) -> tuple[PlannedLeg, ...]:
    return tuple(PlannedLeg(*leg, arms[0]) for leg in abba_design(blocks))


def _williams_legs(arms: Sequence[str], control: str, blocks: int) -> tuple[PlannedLeg, ...]:
    # experiment.sweep reads experiment.stats, which reads the plan's models, which read
    # this module: the sweep's order is imported when a sweep asks for it.
    from tokrecord.experiment.sweep import sweep_design
    return tuple(PlannedLeg(leg.name, leg.block, leg.arm != control, leg.arm)
                 for leg in sweep_design(tuple(arms), blocks))


def _no_pairs(blocks: int) -> tuple[tuple[str, str], ...]:
    return ()


# -- what each design asks of a plan -----------------------------------------------------


class PlanShape(NamedTuple):
    """What a plan asks for, as a design's checks read it (experiment.plan gives it)."""

    arms: tuple[str, ...]  # the names in [arms]
    blocks: int
    max_blocks: int | None  # [sequential]'s most blocks; None: a fixed plan
    has_sweep: bool  # a [sweep] section is given
    components: tuple[str, ...]  # the declared components' names


# Each raises ValueError, naming what the plan must change, when the plan does not fit;
# a design's checks run in order and the first that fails is the one reported.
PlanCheck = Callable[[PlanShape], None]


def _takes_no_sequential(design: str) -> PlanCheck:
    def check(plan: PlanShape) -> None:
        if plan.max_blocks is not None:
            raise ValueError(f"[sequential] needs design 'abba'; this plan's is {design!r}")
    return check


def _runs_up_to_max_blocks(what: str) -> PlanCheck:
    def check(plan: PlanShape) -> None:
        if plan.max_blocks is not None and plan.blocks not in (1, plan.max_blocks):
            raise ValueError(f"blocks = {plan.blocks} with [sequential]: {what} runs up to "
                             "sequential.max_blocks; leave blocks out")
    return check


def _unique_components(plan: PlanShape) -> None:
    names = list(plan.components)
    if len(names) != len(set(names)):
        raise ValueError(f"component names must be unique: {names}")


def _takes_no_components(why: str) -> PlanCheck:
    def check(plan: PlanShape) -> None:
        if plan.components:
            raise ValueError(why)
    return check


def _needs_arms(design: str, needed: frozenset[str]) -> PlanCheck:
    def check(plan: PlanShape) -> None:
        missing = needed - set(plan.arms)
        if missing:
            raise ValueError(f"design {design!r} needs arms {sorted(needed)}; "
                             f"missing {sorted(missing)}")
    return check


def _one_arm(plan: PlanShape) -> None:
    if len(plan.arms) != 1:
        raise ValueError(f"design 'aa' runs one arm in every leg; this plan has "
                         f"{len(plan.arms)} ({', '.join(sorted(plan.arms))})")


def _one_block(plan: PlanShape) -> None:
    if plan.blocks != 1:
        raise ValueError("design 'single' has one leg: blocks must be 1")


def _needs_sweep_section(plan: PlanShape) -> None:
    if not plan.has_sweep:
        raise ValueError("design 'sweep' needs a [sweep] section")


# -- how readers name each design ---------------------------------------------------------


def _abba_words(name: str, what: str) -> Callable[[int], str]:
    def describe(k: int) -> str:
        patterns = ", ".join("ABBA" if b % 2 else "BAAB" for b in range(1, min(k, 2) + 1))
        more = ", ..." if k > 2 else ""
        return (f"{name}, {k} block{'s' if k != 1 else ''} ({patterns}{more}): {4 * k} legs, "
                f"{2 * k} pairs{what}")
    return describe


def _sweep_words(k: int) -> str:
    return (f"sweep, {k} block{'s' if k != 1 else ''}, every arm once per block in "
            "Williams order (balanced for position and carry-over)")


def _single_words(k: int) -> str:
    return "single, one leg of the candidate arm against the plan's goal"


@dataclass(frozen=True)
class DesignSpec:
    """One design: its legs and arms, its pairs, its claim, its analysis, its record form
    and the words readers use for it."""

    design: Design
    title: str  # the report's kind line: "A/A experiment"
    analysis: Analysis
    record_form: RecordForm
    layout: LegLayout
    pair_layout: Callable[[int], tuple[tuple[str, str], ...]]
    words: Callable[[int], str]  # the design as preregistered, for k blocks
    # What the design asks of a plan (its arms, blocks, [sequential], [sweep], components).
    plan_checks: tuple[PlanCheck, ...]
    # Why the design makes no speed claim (its record gate says so); None: it makes one.
    no_claim: str | None = None
    # Why a record of this design cannot be submitted as one leaderboard entry.
    not_submittable: str | None = None
    pairs_what: str = "candidate vs control"  # what a pair compares

    @property
    def makes_claim(self) -> bool:
        return self.no_claim is None

    @property
    def has_verdict(self) -> bool:
        """A verdict (and so a preregistered power): every design that compares legs."""
        return self.analysis is not Analysis.GOAL

    @property
    def compares_arms(self) -> bool:
        """The candidate arm runs against a control arm (an A/A design runs one arm)."""
        return self.analysis is not Analysis.NOISE_FLOOR

    @property
    def several_legs(self) -> bool:
        """More than one leg: their outputs are compared with each other (cross-leg
        exactness) and their speeds vary from leg to leg (the noise diagnostic)."""
        return self.record_form is RecordForm.EXPERIMENT

    def legs(self, arms: Sequence[str], control: str, blocks: int) -> tuple[PlannedLeg, ...]:
        """Every leg the design may run, in run order, with its arm."""
        return self.layout(arms, control, blocks)

    def pairs(self, blocks: int) -> tuple[tuple[str, str], ...]:
        """(candidate-position leg, control-position leg) pairs, in block order; none for a
        single leg or a sweep (whose arms are compared in one fit)."""
        return self.pair_layout(blocks)

    def check_plan(self, plan: PlanShape) -> None:
        """ValueError naming the first thing the plan asks that this design cannot run."""
        for check in self.plan_checks:
            check(plan)

    def describe(self, blocks: int | None) -> str:
        """'ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs': the design as preregistered."""
        return self.words(blocks or 1)


SPECS: Final[Mapping[Design, DesignSpec]] = MappingProxyType({
    Design.SINGLE: DesignSpec(
        Design.SINGLE, "single-leg experiment", Analysis.GOAL, RecordForm.SINGLE_LEG,
        _one_candidate_leg, _no_pairs, _single_words,
        (_takes_no_sequential("single"), _unique_components,
         _needs_arms("single", frozenset({"candidate"})), _one_block)),
    Design.ABBA: DesignSpec(
        Design.ABBA, "ABBA experiment", Analysis.PAIRED_LEGS, RecordForm.EXPERIMENT,
        _abba_legs, abba_pairs, _abba_words("ABBA", ""),
        (_runs_up_to_max_blocks("a sequential plan"), _unique_components,
         _needs_arms("abba", frozenset({"control", "candidate"})))),
    Design.AA: DesignSpec(
        Design.AA, "A/A experiment", Analysis.NOISE_FLOOR, RecordForm.EXPERIMENT,
        _one_arm_in_abba_positions, abba_pairs,
        _abba_words("A/A", " (one arm in every leg: the noise floor, no speed claim)"),
        (_takes_no_sequential("aa"), _unique_components, _takes_no_components(
            "component evidence compares control and candidate traces; an A/A design has "
            "one arm"), _one_arm),
        no_claim="an A/A design measures the noise floor; it makes no speed claim",
        not_submittable="it measures the machine's noise floor and makes no speed claim",
        pairs_what="B vs A positions, one arm"),
    Design.SWEEP: DesignSpec(
        Design.SWEEP, "sweep experiment", Analysis.ARMS_FIT, RecordForm.EXPERIMENT,
        _williams_legs, _no_pairs, _sweep_words,
        (_needs_sweep_section,
         _takes_no_components("component evidence compares two arms; a sweep has many"),
         _runs_up_to_max_blocks("a sequential sweep")),
        not_submittable="a leaderboard entry is one configuration against its prior"),
})


def design_spec(design: Design | str) -> DesignSpec:
    """The spec of a design, by its enum or its name in a plan or record ('abba');
    ValueError for a name no spec has."""
    return SPECS[Design(design)]


def named_spec(name: str | None) -> DesignSpec | None:
    """The spec a reader's design name stands for; None where the record names no design
    (a v1 experiment record or a single-leg record, whose reports stay as they were)."""
    return None if name is None else design_spec(name)
