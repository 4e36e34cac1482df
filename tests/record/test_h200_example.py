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
