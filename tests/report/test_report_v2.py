"""Reports of tokrecord.experiment-record/v2: k blocks, the A/A design, the leg-level verdict
with its noise, and the preregistered power; v1 records keep their paired-bootstrap text.

The fixtures (tests/fixtures/report/v2-blocks2, v2-aa) are trimmed copies of real
fake-server experiments (make_v2_fixture.py says how they were made and what was
trimmed). Goldens work as in test_report.py (TOKRECORD_UPDATE_GOLDEN=1 rewrites them).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli_support import cli_in_process
from golden_support import golden
from paths import FIXTURES as FIXTURES_DIR
from tokrecord.cli.view import print_experiment, verdict_lines
from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import abba_design
from tokrecord.record.schema import (
    AbbaProtocolV2,
    ExperimentRecord,
    ExperimentRecordV3,
    load_record,
    validate_record,
)
from tokrecord.report import load_report, render_html, render_markdown, render_terminal
from tokrecord.report.charts import abba_chart, leg_colors, pairs_chart
from tokrecord.report.derive import pair_names
from tokrecord.report.model import ReportData
from tokrecord.report.svg import tick_label
from tokrecord.report.text import record_text, v2_lines, verdict_text

FIXTURES = FIXTURES_DIR
V2 = FIXTURES / "report" / "v2-blocks2"
AA = FIXTURES / "report" / "v2-aa"
V1 = FIXTURES / "v1-record" / "abba"
LEGS = ["A1", "B1", "B2", "A2", "B3", "A3", "A4", "B4"]


def record_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "record.json").read_text())  # type: ignore[no-any-return]


def v2_record(path: Path) -> ExperimentRecordV3:
    record = load_record(path / "record.json")
    assert isinstance(record, ExperimentRecordV3)
    return record


@pytest.fixture(scope="module")
def v2() -> ReportData:
    return load_report(V2, verify=False)


@pytest.fixture(scope="module")
def aa() -> ReportData:
    return load_report(AA, verify=False)


def section(page: str, sid: str) -> str:
    match = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert match, sid
    return match.group(1)


# --------------------------------------------------------------------------- goldens


def test_v2_goldens(v2: ReportData, aa: ReportData) -> None:
    golden("v2-blocks2.terminal.txt", render_terminal(v2, width=100))
    narrow = render_terminal(v2, width=80)
    golden("v2-blocks2.terminal-80.txt", narrow)
    assert "…" not in narrow
    golden("v2-blocks2.md", render_markdown(v2))
    golden("v2-aa.terminal.txt", render_terminal(aa, width=100))
    golden("v2-aa.md", render_markdown(aa))


# --------------------------------------------------------------------------- two blocks


def test_every_leg_and_pair_in_block_order(v2: ReportData) -> None:
    record = record_of(V2)
    assert (v2.design, v2.blocks) == ("abba", 2)
    assert [leg.name for leg in v2.legs] == LEGS
    assert [leg.arm for leg in v2.legs] == ["candidate" if n[0] == "B" else "control" for n in LEGS]
    for leg in v2.legs:
        assert leg.tok_s == record["runs"][leg.name]["headline_tok_s"]
    assert [p.name for p in v2.pairs] == ["B1 vs A1", "B2 vs A2", "B3 vs A3", "B4 vs A4"]
    for p in v2.pairs:
        key = p.name.replace(" vs ", "_vs_")
        assert p.headline_delta_pct == record["pair_results"][key]["headline_delta_pct"]
    assert v2.bootstrap is None
    # The headline is the lowest of the four candidate legs, not of B1 and B2.
    lowest = min((leg for leg in v2.legs if leg.arm == "candidate"), key=lambda v: v.tok_s or 0)
    assert (v2.headline.leg, v2.headline.value) == (lowest.name, lowest.tok_s) == ("B2", 2111.5293147773846)
    assert v2.headline.note == "the lowest of the 4 candidate legs, as the record gate uses it"
    facts = {f.label: f.value for f in v2.protocol}
    assert facts["design"] == "ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs"
    assert facts["pairs"] == "B1 vs A1 B2 vs A2 B3 vs A3 B4 vs A4"
    assert v2.record_gate is not None
    assert {f.label: f.value for f in v2.record_gate.facts}["all 4 pairs passed"] == "yes"


def test_leg_level_verdict_and_its_noise(v2: ReportData) -> None:
    a = v2.analysis
    assert a is not None
    va = record_of(V2)["verdict_analysis"]
    assert (a.ratio, a.ci_low, a.ci_high, a.df) == (va["ratio"], va["ci_low"], va["ci_high"], 5)
    assert (a.leg_noise_sd_pct, a.leg_noise_df) == (va["leg_noise_sd_pct"], 5)
    assert (a.row_noise_sd_pct, a.row_noise_df) == (va["row_noise_sd_pct"], 14)
    assert [n for n, _ in a.leg_statistics] == LEGS
    # By hand: in balanced ABBA/BAAB blocks the fitted effect is mean(B figures) - mean(A).
    figures = dict(a.leg_statistics)
    effect = (sum(figures[n] for n in LEGS if n[0] == "B")
              - sum(figures[n] for n in LEGS if n[0] == "A")) / 4
    assert math.exp(effect / 100) == pytest.approx(a.ratio, rel=1e-9)
    assert verdict_text(v2) == ("FASTER  candidate/control 1.0703 (+7.025 %), 95 % CI "
                                "[1.0242, 1.1183], leg-level t, df 5")
    lines = dict(v2_lines(v2))
    assert lines["for record"] == ("FASTER at 98 %: CI [1.0104, 1.1336] (the record gate needs "
                                   "FASTER at this confidence)")
    assert lines["noise"] == ("between legs sd 1.778 % (df 5), rows sd 2.774 % (df 14); 8 legs in "
                              "2 blocks, 3 rows rated in every leg")
    assert lines["design"] == "ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs"
    md = render_markdown(v2)
    assert ("**Verdict: FASTER** — candidate/control 1.0703 (+7.025 %), 95 % CI [1.0242, 1.1183] "
            "(leg-level t interval, df 5, equivalence ±1 %)") in md
    assert "paired bootstrap" not in md


def test_power_at_the_planned_blocks(v2: ReportData) -> None:
    p = v2.power
    assert p is not None and p.min_effect is not None
    assert (p.min_effect_pct, p.blocks, p.target_power) == (3.0, 2, 0.9)
    assert (p.min_effect.power, p.min_effect.blocks_for_target) == (0.7072, 3)
    assert p.min_effect_power == record_of(V2)["power"]["min_effect_power"]
    assert dict(v2_lines(v2))["power"] == ("+3 % effect: power 70.7 % at 2 blocks; 90 % needs 3 "
                                           "blocks (noise sd: legs 1.00 %, rows 1.50 %)")
    abba = section(render_html(v2), "abba")
    assert "<h3>Power, as preregistered</h3>" in abba
    rows = re.findall(r"<tr><td>(\+[0-9]+ %[^<]*)</td><td class=\"r\">([^<]+)</td>"
                      r"<td class=\"r\">([^<]+)</td></tr>", abba)
    assert rows == [("+1 %", "13.7 %", "20"), ("+2 %", "39.7 %", "6"),
                    ("+3 % (min effect)", "70.7 %", "3"), ("+5 %", "98.2 %", "2")]


def test_html_abba_section_draws_every_leg_and_pair(v2: ReportData) -> None:
    page = render_html(v2)
    abba = section(page, "abba")
    assert abba.count("<svg") == 3  # legs in run order, pairs, the interval
    legs_svg, pairs_svg, ci_svg = re.findall(r"<svg.*?</svg>", abba, re.S)
    for name in LEGS:
        assert f">{name}</text>" in legs_svg, name  # past one block: names only on the ticks
        assert f"<title>{name} (" in legs_svg
    assert "block 1 (ABBA)" in legs_svg and "block 2 (BAAB)" in legs_svg
    assert legs_svg.count("<circle") == 8
    for pair in ("B1/A1", "B2/A2", "B3/A3", "B4/A4"):
        assert f">{pair}</text>" in pairs_svg
    assert pairs_svg.count("<rect") == 8 + 2  # two bars per pair, two legend swatches
    assert "98 % CI [1.0104, 1.1336]" in ci_svg and "95 % CI [1.0242, 1.1183]" in ci_svg
    figures = re.findall(r"<tr><td>([AB][0-9])</td><td class=\"r\">([0-9])</td><td>([AB])</td>", abba)
    assert figures == [(n, str((int(n[1]) + 1) // 2), n[0]) for n in LEGS]
    summary = section(page, "summary")
    assert "ABBA experiment, 2 blocks" in summary and ">71 %<" in summary  # the power card
    legs = section(page, "legs")
    assert all(f"<td>{p} vs {p.replace('B', 'A')}</td>" in legs for p in ("B1", "B2", "B3", "B4"))
    # Eight distinct colours: two blocks never repeat one.
    assert len(set(leg_colors(v2.legs).values())) == 8


# --------------------------------------------------------------------------- A/A


def test_aa_is_the_noise_floor_and_claims_nothing(aa: ReportData) -> None:
    record = record_of(AA)
    assert (aa.design, aa.blocks) == ("aa", 1)
    assert [leg.arm for leg in aa.legs] == ["control"] * 4
    a = aa.analysis
    assert a is not None and a.no_claim and a.label == "B/A positions"
    assert verdict_text(aa) == (f"UNDECIDED  B/A positions {a.ratio:.4f} "
                                f"({100 * (a.ratio - 1):+.3f} %), 95 % CI [{a.ci_low:.4f}, "
                                f"{a.ci_high:.4f}], leg-level t, df 2; A/A: no speed claim")
    assert record["verdict"] == aa.verdict == "UNDECIDED"
    text = record_text(aa)
    assert text is not None and "an A/A design measures the noise floor" in text
    assert aa.headline.note.startswith("the lowest of the 2 B-position legs")
    terminal = render_terminal(aa)
    assert "A/A experiment, 1 block" in terminal and "pairs (B vs A positions, one arm)" in terminal
    colors = leg_colors(aa.legs)
    # One arm everywhere: B positions are coloured apart from A positions.
    assert {colors["A1"], colors["A2"]}.isdisjoint({colors["B1"], colors["B2"]})
    page = render_html(aa)
    abba = section(page, "abba")
    assert "<h2>A/A legs and the noise floor</h2>" in abba
    assert "B / A positions (grey band" in abba and "candidate / control" not in abba
    assert "No power was preregistered" in abba


# --------------------------------------------------------------------------- no interval


def test_undecided_without_an_interval(tmp_path: Path) -> None:
    copy = tmp_path / "v2"
    shutil.copytree(V2, copy)
    record = record_of(copy)
    reason = "no row has a rate in every leg"
    record["verdict"] = "UNDECIDED"
    record["verdict_analysis"].update(ratio=None, ci_low=None, ci_high=None, record_ci_low=None,
                                      record_ci_high=None, verdict="UNDECIDED",
                                      record_verdict="UNDECIDED", reason=reason)
    (copy / "record.json").write_text(json.dumps(record))
    d = load_report(copy, verify=False)
    assert verdict_text(d) == f"UNDECIDED  no interval: {reason}"
    assert [label for label, _ in v2_lines(d)] == ["design", "power"]  # no noise without a fit
    assert f"**Verdict: UNDECIDED** — no interval: {reason}" in render_markdown(d)
    abba = section(render_html(d), "abba")
    assert abba.count("<svg") == 2  # legs and pairs; no interval to draw
    assert f"Verdict UNDECIDED: no interval: {reason}" in abba
    lines = verdict_lines(v2_record(copy))
    assert f"no interval: {reason}" in lines and not any(x.startswith("noise") for x in lines)


# --------------------------------------------------------------------------- v1 unchanged


def test_v1_record_keeps_the_paired_bootstrap() -> None:
    d = load_report(V1, verify=False)
    boot = record_of(V1)["bootstrap"]
    assert (d.design, d.blocks, d.analysis, d.power) == (None, None, None, None)
    assert d.bootstrap is not None and d.bootstrap.ratio == boot["ratio"]
    assert v2_lines(d) == []
    md = render_markdown(d)
    assert (f"(paired bootstrap, {boot['samples']} samples, equivalence ±1 %)") in md
    assert "leg-level" not in md and "ABBA experiment · " in md
    page = render_html(d)
    assert section(page, "abba").count("<svg") == 2  # legs in order, the interval (as before)
    assert "bootstrap samples" in section(page, "abba")
    assert d.headline.note == "the lower of the two candidate legs, as the record gate uses it"


def test_a_v1_record_verifies_and_reports_from_the_cli(tmp_path: Path) -> None:
    copy = tmp_path / "v1"
    shutil.copytree(V1, copy)
    checked = load_report(copy).verification
    assert checked.checked and checked.ok, checked.problems
    env = {"COLUMNS": "120", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "dumb"}
    # In process (tests/cli_support.py): what `report` writes and prints.
    proc = cli_in_process(["report", str(copy)], env)
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout and "NOT verified" not in proc.stdout
    assert "paired bootstrap" in (tmp_path / "v1.report.md").read_text()
    assert (tmp_path / "v1.report.html").stat().st_size > 0


def test_a_v1_record_sealed_before_the_probes_is_read_by_its_schema_id() -> None:
    demo = FIXTURES / "report" / "demo"  # v1, sealed before idle gates, telemetry and hardware
    old = load_record(demo / "record.json")
    assert isinstance(old, ExperimentRecord) and old.hardware is None
    assert old.runs.B1.telemetry is None and old.operational.legs["B1"].idle_passed is None
    assert old.quality.same_hardware_all_legs is None
    assert not old.recorded("quality", "same_hardware_all_legs")  # record.migrate filled it
    # A record is never written in an older form, and v2 (made after the probes) always has them.
    with pytest.raises(ConfigError, match=r"key 'schema': 'tokrecord\.experiment-record/v1' is "
                                          "an older form"):
        validate_record(record_of(demo))
    newer = record_of(V2)
    del newer["hardware"]
    with pytest.raises(ConfigError, match="key 'hardware': Field required"):
        validate_record(newer, older_form_ok=True)
    newer = record_of(V2)
    newer["operational"]["legs"]["A1"]["idle_passed"] = None
    with pytest.raises(ConfigError, match="idle_passed': Value error, either absent"):
        validate_record(newer, older_form_ok=True)


# --------------------------------------------------------------------------- many blocks


def test_legs_chart_takes_any_number_of_blocks(v2: ReportData) -> None:
    names = [leg.name for leg in abba_design(5)]
    base = v2.legs
    legs = [base[i % 8].model_copy(update={"name": n, "arm": "candidate" if n[0] == "B" else "control",
                                           "tok_s": 2000.0 + 10 * i})
            for i, n in enumerate(names)]
    svg = abba_chart(legs, 5)
    assert svg is not None
    assert svg.count("<circle") == 20
    assert all(f">{n}</text>" in svg for n in names)
    assert all(f"block {b} ({'ABBA' if b % 2 else 'BAAB'})" in svg for b in range(1, 6))
    assert "candidate legs: drift across its 10 legs" in svg
    b10 = 2000.0 + 10 * names.index("B10")
    assert f">{b10:,.0f}</text>" not in svg  # past three blocks no value labels: hover titles
    assert f"<title>B10 (candidate): {b10:,.2f} tok/s" in svg
    pairs = pairs_chart(())
    assert pairs is None


def pairs_only(listed: list[str], found: list[str]) -> ExperimentRecordV3:
    """A v2 record reduced to what pair_names reads (not a valid record)."""
    return ExperimentRecordV3.model_construct(
        protocol=AbbaProtocolV2.model_construct(pairs=listed), pair_results=dict.fromkeys(found))


def test_pairs_are_in_block_order_past_nine() -> None:
    keys = [f"B{n}_vs_A{n}" for n in range(1, 11)]
    record = pairs_only(keys, sorted(keys))
    assert sorted(keys)[:3] == ["B10_vs_A10", "B1_vs_A1", "B2_vs_A2"]  # record.json's key order
    assert pair_names(record) == keys
    assert pair_names(pairs_only([], ["B2_vs_A2", "B1_vs_A1"])) == ["B2_vs_A2", "B1_vs_A1"]


def test_ticks_of_a_narrow_range_far_from_zero() -> None:
    assert [tick_label(v) for v in (1999.5, 2000.0, 2000.25, 1234.125)] == \
        ["1,999.5", "2,000", "2,000.25", "1,234.125"]


# --------------------------------------------------------------------------- the run's summary


def printed(record: dict[str, Any]) -> str:
    buf = io.StringIO()
    print_experiment(Console(file=buf, width=200, color_system=None), record, Path("record.json"))
    return buf.getvalue()


def test_print_experiment_v2_and_v1() -> None:
    out = printed(record_of(V2))
    assert "design: ABBA, 2 blocks (ABBA, BAAB): 8 legs, 4 pairs" in out
    assert ("candidate/control 1.0703 (+7.025 %), 95 % CI [1.0242, 1.1183], leg-level t, df 5 "
            "(equivalence ±1 %)") in out
    assert "for record: FASTER at 98 %: CI [1.0104, 1.1336]" in out
    assert "noise: between legs sd 1.778 % (df 5), rows sd 2.774 % (df 14)" in out
    assert "power: +3 % effect: power 70.7 % at 2 blocks; 90 % needs 3 blocks" in out
    assert "legs (ABBA, 2 blocks)" in out and "verdict: FASTER" in out
    positions = [out.index(f"B{n}_vs_A{n}") for n in range(1, 5)]
    assert positions == sorted(positions)
    assert all(re.search(rf"^ {n} ", out, re.M) for n in LEGS)
    assert "bootstrap" not in out

    aa = printed(record_of(AA))
    assert "design: A/A, 1 block (ABBA): 4 legs, 2 pairs" in aa
    assert "pairs (B vs A positions, one arm)" in aa and "A/A: no speed claim" in aa

    old = printed(record_of(V1))
    boot = record_of(V1)["bootstrap"]
    assert (f"candidate/control = {boot['ratio']:.4f} ({100 * (boot['ratio'] - 1):+.3f} %), 95 % CI "
            f"[{boot['ci_low']:.4f}, {boot['ci_high']:.4f}] (paired bootstrap, 500 samples; "
            "equivalence ±1 %)") in old
    assert "design:" not in old and "leg-level" not in old
    assert re.search(r"experiment v1-abba — legs *\n", old)
