"""The sealed H200 experiments committed under examples/h200 (issue 19) still verify with
this tokrecord, and say what the GPU run measured."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from paths import ROOT
from tokrecord.record.verify import verify_dir

EXAMPLES = ROOT / "examples" / "h200"


@pytest.mark.parametrize("name", ["exp-graphs", "exp-draft"])
def test_committed_h200_experiment_verifies(name: str, tmp_path: Path) -> None:
    with tarfile.open(EXAMPLES / f"{name}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    exp = tmp_path / name
    assert verify_dir(exp) == []
    record = json.loads((exp / "record.json").read_text())
    assert record["verdict"] == "FASTER"
    gpus = {a["name"] for a in record["hardware"]["accelerators"]}
    assert gpus == {"NVIDIA H200"}
    for leg in record["runs"].values():
        assert leg["telemetry"]["energy_method"] == "counter"
        assert leg["telemetry"]["joules_per_output_token"] > 0


def test_committed_h200_sweep_verifies_by_the_method_it_was_sealed_with(tmp_path: Path) -> None:
    """Issue 34's H200 sweep was sealed with the two-sided Dunnett critical value, before
    the one-sided one became the method: it recomputes by its own method, and says why it
    claims no best arm (only the control arm is token-exact)."""
    from tokrecord.experiment.sweep import SWEEP_METHOD_TWO_SIDED, sweep_critical

    with tarfile.open(EXAMPLES / "exp-sweep.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    exp = tmp_path / "exp-sweep"
    assert verify_dir(exp) == []
    record = json.loads((exp / "record.json").read_text())
    a = record["sweep"]["analysis"]
    assert a["method"] == SWEEP_METHOD_TWO_SIDED
    k, df = len(a["arms"]), a["df"]
    assert a["critical_value"] == pytest.approx(sweep_critical(k - 1, df, a["confidence"],
                                                               SWEEP_METHOD_TWO_SIDED))
    # The current method's value is larger: recomputing by it would not match the seal.
    assert sweep_critical(k - 1, df, a["confidence"]) > a["critical_value"] * 1.001
    assert a["best"] is None
    exact = {s["arm"]: s["exact"] for s in a["arm_summaries"]}
    assert exact == {"control": True, "n_max=2": False, "n_max=4": False, "n_max=8": False,
                     "n_max=16": False}
    ratios = {c["arm"]: c["ratio"] for c in a["contrasts"]}
    assert ratios["n_max=16"] > ratios["n_max=8"] > ratios["n_max=4"] > 1.2


def test_the_h200_sweeps_report_names_the_design_and_why_its_headline_is_no_best(
        tmp_path: Path) -> None:
    from tokrecord.report import load_report
    from tokrecord.report.text import headline_text, kind_text

    with tarfile.open(EXAMPLES / "exp-sweep.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    # Not verified again: the test above verifies this sweep (4 s of CPU), and a report's
    # verifying step is `verification`, which tests/report checks (the CLI's report).
    d = load_report(tmp_path / "exp-sweep", verify=False)
    assert kind_text(d) == "sweep experiment, 2 blocks"
    assert not any(r.best for r in d.sweep)
    assert "no arm is claimed best" in headline_text(d)


def test_committed_h200_sequential_abba_stopped_at_its_first_look(tmp_path: Path) -> None:
    """Issue 32 on the GPU: CUDA graphs on vs off as a sequential ABBA (at most 3 blocks,
    Pocock, rci-t/2) stopped FASTER after block 1; verify recomputes the look, and the
    record gate's 98 % look is FASTER too."""
    with tarfile.open(EXAMPLES / "exp-graphs-seq.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    exp = tmp_path / "exp-graphs-seq"
    assert verify_dir(exp) == []
    record = json.loads((exp / "record.json").read_text())
    seq = record["sequential"]
    assert (seq["stopped"], seq["stopped_at"], seq["max_looks"]) == (True, "block 1", 3)
    assert seq["method"].startswith("rci-t/2") and seq["spending"] == "pocock"
    (look,) = seq["looks"]
    assert look["df"] == 2 and look["statistic"] > look["boundary"] > 0
    assert look["statistic"] > look["record_boundary"] and seq["record_verdict"] == "FASTER"
    assert sorted(record["runs"]) == ["A1", "A2", "B1", "B2"]  # blocks 2 and 3 never ran
    assert seq["ci_low"] < seq["estimate_ratio"] < seq["ci_high"] and seq["ci_low"] > 1
