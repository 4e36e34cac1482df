"""verify reads a leg's idle snapshots (its covariates) only under a size cap: a
re-sealed 1 GB sparse idle-before.jsonl made verify take 1.4 GB (bench/hostile)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from probes_support import FAST_IDLE, FAST_TELEMETRY
from tokrecord.evidence.seal import MANIFEST_NAME, SIGNATURE_NAME, SigningKey, seal
from tokrecord.experiment.leg import LegConfig, ServerSpec, run_leg
from tokrecord.record.verify import verify_leg
from tokrecord.suite import Suite, SuiteRow


def test_a_huge_idle_snapshot_file_is_refused_unread(tmp_path: Path) -> None:
    argv = (sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port",
            "{port}", "--model", "{model}", "--tok-s", "5000", "--ttft-ms", "1")
    suite = Suite(name="one", sha256="0" * 64, rows=(SuiteRow(id="r", prompt="p", max_tokens=4),))
    config = LegConfig(name="t", server=ServerSpec(argv=argv, model="m", ready_timeout_s=30),
                       suite=suite, idle=FAST_IDLE, telemetry=FAST_TELEMETRY)
    leg = tmp_path / "leg"
    run_leg(config, leg)
    with open(leg / "idle-before.jsonl", "r+b") as f:
        # sparse: no disk, all zeros. 48 MiB, not the 1 GiB bench/hostile uses: seal and
        # verify each hash it whole (seconds per GiB). Three times the 16 MiB cap, and under
        # the 256 MiB every other JSONL may have: read whole it would grow verify past the
        # 32 MiB bound below, so the test fails without the cap (issue 28: 320 MiB cost 2 s).
        f.truncate(48 << 20)
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (leg / name).unlink(missing_ok=True)
    seal(leg, SigningKey(Ed25519PrivateKey.generate()))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    problems, _ = verify_leg(leg, tmp_path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert any(p.file.endswith("idle-before.jsonl") for p in problems), problems
    assert grown_mib < 32, f"verify grew by {grown_mib:.0f} MiB"
