"""`tokrecord runs`: complete, running, resumable and abandoned experiments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_support import cli_in_process
from tokrecord.errors import ConfigError
from tokrecord.experiment.inventory import RunStatus, list_experiments, remove_experiment
from tokrecord.experiment.runner import experiment_lock


def _experiment(root: Path, dirname: str, name: str, utc: str, *, done: int = 0,
                sealed: bool = False) -> Path:
    d = root / dirname
    d.mkdir(parents=True)
    (d / "plan.sha256").write_text(f"{dirname}  plan.json\n")
    events = [{"event": "preregistered", "name": name, "plan_sha256": dirname, "utc": utc,
               "legs": ["A1", "B1", "B2", "A2"]}]
    events += [{"event": "leg_end", "leg": leg, "status": "complete", "utc": utc}
               for leg in ["teacher", "A1", "B1", "B2", "A2"][:done + 1 if done else 0]]
    (d / "experiment.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if sealed:
        (d / "manifest.sig.json").write_text("{}")
    return d


def test_statuses(tmp_path: Path) -> None:
    old = _experiment(tmp_path, "p-aaa", "p", "2026-12-01T10:00:00Z", done=1)
    new = _experiment(tmp_path, "p-bbb", "p", "2026-12-01T11:00:00Z", done=2)
    done = _experiment(tmp_path, "q-ccc", "q", "2026-12-01T09:00:00Z", done=4, sealed=True)
    (tmp_path / "leg-20261201T000000Z").mkdir()  # a single leg is not an experiment
    entries = {e.path: e for e in list_experiments(tmp_path)}
    assert set(entries) == {old, new, done}
    assert entries[old].status is RunStatus.ABANDONED
    assert entries[old].superseded_by == new
    assert (entries[old].legs_done, entries[old].legs_total) == (1, 4)
    assert entries[new].status is RunStatus.RESUMABLE
    assert entries[done].status is RunStatus.COMPLETE
    with experiment_lock(new):
        assert {e.path: e for e in list_experiments(tmp_path)}[new].status is RunStatus.RUNNING


def test_remove_abandoned_only(tmp_path: Path) -> None:
    old = _experiment(tmp_path, "p-aaa", "p", "2026-12-01T10:00:00Z")
    new = _experiment(tmp_path, "p-bbb", "p", "2026-12-01T11:00:00Z")
    done = _experiment(tmp_path, "q-ccc", "q", "2026-12-01T09:00:00Z", sealed=True)
    with pytest.raises(ConfigError, match="is complete"):
        remove_experiment(done)
    with pytest.raises(ConfigError, match="resumable"):
        remove_experiment(new)
    with pytest.raises(ConfigError, match="not an experiment"):
        remove_experiment(tmp_path / "nothing")
    assert remove_experiment(old).status is RunStatus.ABANDONED
    assert not old.exists() and done.exists()
    remove_experiment(new, force=True)
    assert not new.exists()


def test_runs_command_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _experiment(tmp_path / "tokrecord-runs", "p-aaa", "p", "2026-12-01T10:00:00Z", done=1)
    _experiment(tmp_path / "tokrecord-runs", "p-bbb", "p", "2026-12-01T11:00:00Z")
    monkeypatch.chdir(tmp_path)  # `runs` lists ./tokrecord-runs
    proc = cli_in_process(["runs"], {"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "abandoned (superseded by p-bbb)" in lines[1] and "1/4" in lines[1]
    assert "tokrecord runs --remove tokrecord-runs/p-aaa" in lines[1]
    assert "resumable" in lines[2]
