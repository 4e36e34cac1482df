"""Identity is collected again before every leg: a source tree that changes between
legs fails the record gate, naming what changed; an unchanged one passes every leg."""

from __future__ import annotations

import subprocess
from pathlib import Path

from plan_support import plan_toml, write_plan
from tokrecord.experiment.runner import NullExperimentObserver, run_experiment
from tokrecord.record.build import build_record


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def _source(tmp: Path) -> Path:
    repo = tmp / "kernels"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "kernel.cu").write_text("// v1\n")
    _git(repo, "add", "kernel.cu")
    _git(repo, "commit", "-q", "-m", "v1")
    return repo


class EditBefore(NullExperimentObserver):
    """Commits a change to the source tree just before one leg starts."""

    def __init__(self, repo: Path, leg: str) -> None:
        self.repo, self.leg = repo, leg

    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None:
        if name == self.leg:
            (self.repo / "kernel.cu").write_text("// v2, faster\n")
            _git(self.repo, "commit", "-q", "-am", "v2")


def _run(tmp: Path, observer: NullExperimentObserver | None, repo: Path) -> dict:  # type: ignore[type-arg]
    extra = f'[identity.sources.kernels]\npath = "{repo}"\n'
    # About identity, not speed: the shortest legs (2 rows, fast arms, no idle gap).
    path, plan = write_plan(tmp / "plan", plan_toml("ident", control=4000, candidate=4000, rows=2,
                                                    idle=0, extra=extra, telemetry=False))
    exp = tmp / "exp"
    results = run_experiment(plan, exp, observer, plan_text=path.read_bytes())
    return build_record(plan, exp, results)


def test_unchanged_identity_passes_every_leg(tmp_path: Path) -> None:
    record = _run(tmp_path, None, _source(tmp_path))
    assert record["quality"]["source_identity_passed_all_legs"] is True
    shas = {record["runs"][leg]["identity_sha256"] for leg in ("A1", "B1", "B2", "A2")}
    assert len(shas) == 1 and len(next(iter(shas))) == 64
    assert not any("identity" in r for r in record["record_gate"]["reasons"])


def test_a_source_changed_between_legs_fails_the_record_gate(tmp_path: Path) -> None:
    repo = _source(tmp_path)
    record = _run(tmp_path, EditBefore(repo, "B2"), repo)
    assert record["quality"]["source_identity_passed_all_legs"] is False
    assert record["runs"]["B1"]["identity_sha256"] != record["runs"]["B2"]["identity_sha256"]
    reasons = [r for r in record["record_gate"]["reasons"] if "identity" in r]
    assert reasons and reasons[0].startswith("leg B2: the identity changed since "
                                             "preregistration (sources, sources.kernels)")
    assert not record["record_gate"]["strict_preregistered_record_pass"]
