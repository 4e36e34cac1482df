"""The report's noise panel and line (issue 33), on the committed H200 experiment: a
record sealed before the diagnostic existed, so the report recomputes it from the
telemetry its legs kept."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from paths import ROOT
from tokrecord.experiment.noise import NoiseDiagnostic
from tokrecord.report import render_html, render_markdown, render_terminal
from tokrecord.report.load import load_report
from tokrecord.report.noise import noise_svg


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("h200")
    with tarfile.open(ROOT / "examples" / "h200" / "exp-draft.tar.gz") as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "exp-draft"


def test_old_record_reports_covariates_recomputed_from_its_telemetry(h200: Path) -> None:
    d = load_report(h200, verify=False)
    noise = d.noise
    assert isinstance(noise, NoiseDiagnostic)
    assert [leg.name for leg in noise.legs] == ["A1", "B1", "B2", "A2"]
    assert [leg.arm for leg in noise.legs] == ["control", "candidate", "candidate", "control"]
    for leg in noise.legs:
        cov = leg.covariates
        assert cov is not None and cov.source == "telemetry"  # the samples were kept
        assert cov.sm_clock_mhz_mean is not None and cov.sm_clock_mhz_min is not None
        assert cov.gpu_power_w is not None and cov.ready_s is not None
        view = d.leg(leg.name)
        assert view is not None and leg.tok_s == view.tok_s
    # Two legs per arm: within each arm the two deviations are equal and opposite.
    by_arm: dict[str, list[float]] = {}
    for leg in noise.legs:
        by_arm.setdefault(leg.arm, []).append(leg.deviation_pct)
    for devs in by_arm.values():
        assert sum(devs) == pytest.approx(0.0, abs=1e-9)
    text = render_terminal(d, width=200)
    assert "tracks" in text and "diagnosis only" in text
    md = render_markdown(d)
    assert "- **Tracks:** " in md and "diagnosis only" in md
    html = render_html(d)
    assert '<section id="noise">' in html and 'aria-label="leg figures in run order"' in html
    assert html.count("<circle") >= len(noise.legs)


def test_the_chart_colours_legs_by_arm(h200: Path) -> None:
    noise = load_report(h200, verify=False).noise
    assert noise is not None
    svg = noise_svg(noise)
    assert svg.count('fill="#2563eb"><title>') == 2  # control legs
    assert svg.count('fill="#ea580c"><title>') == 2  # candidate legs
