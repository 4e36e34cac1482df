"""Each leg's covariates in its summary, and the record's noise diagnostic (issue 33):
written by a real experiment against the fake server, and checked by verify."""

from __future__ import annotations

import json
from pathlib import Path

from plan_support import plan_toml, write_plan
from probes_support import FAST_IDLE_TOML
from tokrecord.experiment.noise import DIAGNOSIS_ONLY
from tokrecord.experiment.runner import run_experiment
from tokrecord.record.build import build_record, finish
from tokrecord.record.schema import ExperimentRecordV3, load_record
from tokrecord.record.verify import verify_dir


def test_an_experiment_records_covariates_and_its_noise_diagnostic(tmp_path: Path) -> None:
    # Covariates are read from the telemetry samples inside each leg's suite window, so that
    # window must hold several: 2 rows x 110 tokens at 500 tok/s stream for 0.44 s, sampled
    # every 0.05 s. (At 2000 tok/s and the usual 0.25 s a window of ~0.15 s held no sample
    # when a fresh run's 4 workers loaded the 2 cores, and host_load1 read None.)
    text = plan_toml("noise", control=500, candidate=500, rows=2)
    fast = FAST_IDLE_TOML.replace("[telemetry]\ninterval_s = 0.25", "[telemetry]\ninterval_s = 0.05")
    assert fast != FAST_IDLE_TOML
    path, plan = write_plan(tmp_path, text.replace(FAST_IDLE_TOML, fast))
    assert plan.telemetry.interval_s == 0.05
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
