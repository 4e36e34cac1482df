"""Each leg's covariates in its summary, and the record's noise diagnostic (issue 33):
written by a real experiment against the fake server, and checked by verify."""

from __future__ import annotations

import json
from pathlib import Path

from plan_support import plan_toml, write_plan
from tokrecord.experiment.noise import DIAGNOSIS_ONLY
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.schema import ExperimentRecordV3, load_record
from tokrecord.record.verify import verify_dir


def test_an_experiment_records_covariates_and_its_noise_diagnostic(tmp_path: Path) -> None:
    path, plan = write_plan(tmp_path, plan_toml("noise", control=2000, candidate=2000, rows=2))
    exp = tmp_path / "exp"
    results = run_experiment(plan, exp, plan_text=path.read_bytes())
    record = build_record(plan, exp, results)
    finish(exp, record)
    for name, result in results.items():
        summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
        cov = summary["covariates"]
        assert cov["schema"] == "tokrecord.leg-covariates/v1", name
        assert cov["ready_s"] == result.ready_seconds
        assert cov["first_ttft_ms"] is not None and cov["host_load1"] is not None
        assert cov["samples_in_window"] >= 1
    noise = record["noise_diagnostic"]
    # The legs in run order (the design's), each with its arm and its own covariates.
    assert [leg["name"] for leg in noise["legs"]] == [name for name, _ in plan.legs]
    assert [leg["arm"] for leg in noise["legs"]] == [arm for _, arm in plan.legs]
    for leg in noise["legs"]:
        assert leg["tok_s"] == results[leg["name"]].summary.tok_s_out
        assert leg["covariates"] == results[leg["name"]].covariates.model_dump(mode="json",
                                                                                by_alias=True)
    assert noise["note"] == DIAGNOSIS_ONLY
    # The verdict is the leg-level analysis of the figures alone: nothing in it names a covariate.
    assert "covariate" not in json.dumps(record["verdict_analysis"])
    loaded = load_record(exp / "record.json")
    assert isinstance(loaded, ExperimentRecordV3) and loaded.noise_diagnostic is not None
    # verify recomputes every leg's covariates and the record (its diagnostic with it).
    assert verify_dir(exp) == []
