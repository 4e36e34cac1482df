"""What a reader needs beside the figures: the control's figure next to the headline,
and one line per gate name saying what it proves (README "Quality gates")."""

from __future__ import annotations

from dataclasses import dataclass

from tokrecord.experiment.design import named_spec
from tokrecord.gates import GATES

from . import fmt
from .model import ReportData

TEACHER_LEG = "teacher"  # evidence.layout.TEACHER_LEG: the reference outputs' own leg


@dataclass(frozen=True)
class ControlFigure:
    value: float
    leg: str
    delta_pct: float | None  # the headline relative to it


def control_figure(d: ReportData) -> ControlFigure | None:
    """The lower control leg's rate: the headline is the lower candidate leg, so this is
    its like-for-like comparison (as the record gate's 'control lower'). None without a
    control arm (a single leg, an A/A design)."""
    spec = named_spec(d.design)
    if spec is not None and not spec.compares_arms:
        return None
    controls = [leg for leg in d.legs if leg.arm == "control" and leg.tok_s is not None]
    if not controls:
        return None
    low = min(controls, key=lambda leg: leg.tok_s or 0.0)
    assert low.tok_s is not None
    h = d.headline.value
    delta = 100 * (h / low.tok_s - 1) if h is not None and low.tok_s > 0 else None
    return ControlFigure(low.tok_s, low.name, delta)


def control_text(c: ControlFigure) -> str:
    delta = f"; the headline is {fmt.pct(c.delta_pct)} on it" if c.delta_pct is not None else ""
    return f"{fmt.num(c.value)} tok/s  leg {c.leg}, the lower control leg{delta}"


# One line per gate and per across-legs check, for wherever a gate name is shown.
GATE_EXPLAINED: dict[str, str] = {
    **{g.name: g.explained for g in GATES},
    "identity_unchanged": "the software and model identity did not change between legs",
    "all_legs_teacher_exact": "every leg matched the teacher on every row",
    "all_legs_cross_exact": "every leg's outputs equal every other leg's",
    "all_legs_cached_zero": "no leg used a prompt cache",
    "full_output_then_next_exact": "in every leg, the row after a full output is exact",
    "long_then_next_exact": "in every leg, the row after the longest prompt is exact",
    "rollover_exact": "in every leg, the row across the context boundary is exact",
    "cleanup_passed_all_legs": "every leg's server was stopped with nothing left behind",
    "idle_before_and_after_all_legs": "every leg's idle gates passed",
    "same_hardware_all_legs": "every leg ran on the same hardware",
    "all_legs_valid": "no leg failed a gate or missed a required one",
    "full_abba_causal_pass": "every leg is valid and every ABBA pair met the preregistered "
                             "criteria: the design supports a causal claim",
    "retries": "rows requested more than once (0 is required)",
}


def gate_explained(name: str) -> str:
    """The line for a gate or quality key, by its record name or its label (spaces)."""
    return GATE_EXPLAINED.get(name.replace(" ", "_"), "")
