"""The report as a first reader meets it: the control beside the headline, the teacher
labelled as the teacher, an acceptance chart whose labels do not collide, and a line for
every gate name."""

from __future__ import annotations

import re

from paths import FIXTURES
from tokrecord.report import load_report
from tokrecord.report.charts import LABEL_MIN_PX, acceptance_chart, tick_step
from tokrecord.report.explain import GATE_EXPLAINED, control_figure, gate_explained
from tokrecord.report.html import render_html
from tokrecord.report.model import Attempt, LegStatus, Speculative

DEMO = FIXTURES / "report" / "demo"
V2 = FIXTURES / "report" / "v2-blocks2"
AA = FIXTURES / "report" / "v2-aa"


def test_control_figure_is_the_lower_control_leg() -> None:
    d = load_report(DEMO, verify=False)
    controls = {leg.name: leg.tok_s for leg in d.legs if leg.arm == "control"}
    c = control_figure(d)
    assert c is not None
    low = min(controls, key=lambda n: controls[n] or 0.0)
    assert (c.leg, c.value) == (low, controls[low])
    # By hand: headline 208.76 (B1) on the lower control leg A1.
    assert d.headline.value is not None and c.delta_pct is not None
    assert abs(c.delta_pct - 100 * (d.headline.value / c.value - 1)) < 1e-12
    assert round(c.delta_pct, 3) == -6.286
    assert control_figure(load_report(AA, verify=False)) is None  # one arm: no control


def test_html_puts_the_control_beside_the_headline_and_labels_the_teacher() -> None:
    d = load_report(DEMO, verify=False)
    teacher = Attempt(leg="teacher", attempt=1, status=LegStatus.COMPLETE, valid=False)
    page = render_html(d.model_copy(update={"attempts": (teacher, *d.attempts)}))
    cards = re.findall(r'<div class="k">([^<]+)</div>', page)
    assert cards[:2] == ["headline", "control"]
    assert "<td>teacher</td><td>1</td><td>complete</td><td>teacher (the reference)</td>" in page


def test_every_gate_name_in_the_fixtures_is_explained() -> None:
    for path in (DEMO, V2, AA):
        d = load_report(path, verify=False)
        names = {g.name for leg in d.legs for g in leg.gates}
        names |= {g.name for g in d.experiment_gates} | {f.label for f in d.quality}
        assert {n for n in names if not gate_explained(n)} == set(), path
    assert "causal claim" in GATE_EXPLAINED["full_abba_causal_pass"]
    page = render_html(load_report(DEMO, verify=False))
    assert "the design supports a causal claim" in page


def test_a_48_position_acceptance_chart_has_no_colliding_labels() -> None:
    d = load_report(DEMO, verify=False)
    spec = Speculative(draft_cycles=100, draft_tokens=4800, accepted_draft_tokens=2400,
                       acceptance_rate=0.5, emitted_per_cycle=25.0, aggregate_cycle_ms=1.0,
                       accepted_per_position=tuple(range(100, 52, -1)))
    legs = [leg.model_copy(update={"speculative": spec}) for leg in d.legs
            if leg.arm == "candidate"]
    svg = acceptance_chart(legs)
    assert svg is not None
    assert not re.search(r">\d+ %</text>", svg)  # no value labels over 48 x 2 thin bars
    assert "values on hover and in the table" in svg
    ticks = [int(t) for t in re.findall(r'text-anchor="middle"[^>]*>(\d+)</text>', svg)]
    assert ticks == [1, *range(2, 49, 2)]
    # Six positions leave room: every bar is labelled, every position ticked.
    six_spec = spec.model_copy(update={"accepted_per_position": (90, 80, 70, 60, 50, 40)})
    few = [leg.model_copy(update={"speculative": six_spec}) for leg in legs]
    six = acceptance_chart(few)
    assert six is not None and len(re.findall(r">\d+ %</text>", six)) == 12


def test_tick_step() -> None:
    assert tick_step(820 / 6) == 1
    assert tick_step(820 / 48) == 2
    assert tick_step(820 / 200) == 10
    assert LABEL_MIN_PX > 0
