"""One sealed fake ABBA shared by the modules that only read it (issue 28); its fixture is
tests/record/conftest.py's `sealed_abba`.

test_verify, test_hostile_evidence and test_record_schema each ran an experiment of their own
(a teacher and four legs) to flip bytes in, tamper with or validate. They now share this one:
tests/conftest.py sends the three modules to one xdist worker as one unit (SHARED_SCOPES),
and the fixture is session-scoped, so it runs once per pytest session. Evidence is sealed
read-only; a test that changes anything changes its own copy (test_verify.writable_copy).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from probes_support import FAST_PLAN_SECTIONS

FAKE = [sys.executable, "-m", "tokrecord.server.fake", "--host", "{host}", "--port", "{port}",
        "--model", "{model}", "--ttft-ms", "5"]


@dataclass(frozen=True)
class SealedAbba:
    exp: Path  # sealed and read-only: copy it before changing anything
    built: dict[str, Any]  # the record as build_record returned it, before the seal


def sealed_abba_plan() -> dict[str, Any]:
    """Telemetry on (the sampler's files are part of what verify re-hashes and recomputes) and
    a prior with every field the schema has. The record names no key (finish without the
    CLI's `seal` section): a stranger's re-sealed copy then verifies as theirs, which the
    hostile-evidence tests build on; test_record_schema adds the section to its copy."""
    return {
        "name": "sealed-abba", "design": "abba", "suite_rows": 2, "teacher": "capture",
        "idle_gap_s": 0, **FAST_PLAN_SECTIONS,
        "server": {"argv": FAKE, "model": "fake", "ready_timeout_s": 30},
        "arms": {"control": {"env": {"TOKRECORD_FAKE_TOK_S": "3000"}},
                 "candidate": {"env": {"TOKRECORD_FAKE_TOK_S": "3300"}}},
        "prior": {"value_tok_s": 3000.0, "id": "prior-1", "goal_tok_s": 3100.0,
                  "best_exact_tok_s": 3050.0},
        "verdict": {"bootstrap_samples": 500},
    }


def build_sealed_abba(tmp_path_factory: pytest.TempPathFactory) -> SealedAbba:
    from tokrecord.experiment.plan import parse_plan
    from tokrecord.experiment.runner import run_experiment
    from tokrecord.record.build import build_record, finish

    plan = parse_plan(sealed_abba_plan(), "test")
    exp = tmp_path_factory.mktemp("sealed-abba") / "exp"
    results = run_experiment(plan, exp)
    record = build_record(plan, exp, results)
    built = copy.deepcopy(record)
    finish(exp, record)
    return SealedAbba(exp=exp, built=built)
