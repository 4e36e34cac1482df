"""`tokrecord runs`: the experiments under a directory, and what each can still become.

A fixed plan hashes differently, so its next run preregisters a new experiment and the
old one is left behind. Each is listed as complete (sealed), running (its lock is held),
resumable (the same command continues it) or abandoned (incomplete, and a later
experiment of the same plan name exists). Only an incomplete experiment can be removed:
a sealed record is evidence and tokrecord never deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tokrecord.errors import ConfigError
from tokrecord.evidence import layout, read_jsonl
from tokrecord.evidence.seal import SIGNATURE_NAME
from tokrecord.experiment.runner import experiment_lock, lock_path


class RunStatus(StrEnum):
    COMPLETE = "complete"
    RUNNING = "running"
    RESUMABLE = "resumable"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class ExperimentEntry:
    path: Path
    name: str
    plan_sha256: str
    status: RunStatus
    legs_done: int
    legs_total: int
    started_utc: str
    last_utc: str
    superseded_by: Path | None  # the later experiment of the same name, when abandoned


def _locked(exp_dir: Path) -> bool:
    path = lock_path(exp_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we took
    return False


def _read(exp_dir: Path) -> tuple[str, str, int, int, str, str, bool] | None:
    """(name, sha, done, total, started, last, complete) of an experiment directory."""
    if not (exp_dir / layout.PLAN_HASH).is_file() or not (exp_dir / layout.STATE).is_file():
        return None
    events = read_jsonl(exp_dir / layout.STATE, skip_torn=True)
    first = next((e for e in events if e.get("event") == "preregistered"), None)
    if first is None:
        return None
    planned = set(first.get("legs") or ())  # the teacher leg is not one of them
    done = {e.get("leg") for e in events if e.get("event") == "leg_end"
            and e.get("status") == "complete" and e.get("leg") in planned}
    complete = (exp_dir / SIGNATURE_NAME).exists() or any(
        e.get("event") == "complete" for e in events)
    return (str(first.get("name")), str(first.get("plan_sha256")), len(done),
            len(first.get("legs") or ()), str(first.get("utc")), str(events[-1].get("utc")),
            complete)


def list_experiments(root: Path) -> list[ExperimentEntry]:
    """Every experiment directly under root, oldest first."""
    if not root.is_dir():
        return []
    read = [(d, r) for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")
            and (r := _read(d)) is not None]
    read.sort(key=lambda item: item[1][4])
    entries = []
    for i, (path, (name, sha, done, total, started, last, complete)) in enumerate(read):
        later = next((p for p, r in read[i + 1:] if r[0] == name), None)
        if complete:
            status = RunStatus.COMPLETE
        elif _locked(path):
            status = RunStatus.RUNNING
        elif later is not None:
            status = RunStatus.ABANDONED
        else:
            status = RunStatus.RESUMABLE
        entries.append(ExperimentEntry(path, name, sha, status, done, total, started, last,
                                       later if status is RunStatus.ABANDONED else None))
    return entries


def remove_experiment(exp_dir: Path, *, force: bool = False) -> ExperimentEntry:
    """Delete an abandoned (or, with force, a resumable) experiment; never a complete one."""
    entry = next((e for e in list_experiments(exp_dir.parent)
                  if e.path.resolve() == exp_dir.resolve()), None)
    if entry is None:
        raise ConfigError(f"{exp_dir} is not an experiment directory (no {layout.PLAN_HASH} "
                          f"and {layout.STATE})")
    if entry.status is RunStatus.COMPLETE:
        raise ConfigError(f"{exp_dir} is complete: a sealed record is evidence, and tokrecord "
                          "does not delete it")
    if entry.status is RunStatus.RUNNING:
        raise ConfigError(f"{exp_dir} is being run now; stop that run first")
    if entry.status is RunStatus.RESUMABLE and not force:
        raise ConfigError(f"{exp_dir} is resumable (no later experiment named {entry.name!r}): "
                          "its plan's `tokrecord run` continues it; add --force to remove it")
    # Held while deleting, so a run of the same plan cannot start into a half-deleted one.
    with experiment_lock(exp_dir):
        shutil.rmtree(exp_dir)
    with contextlib.suppress(OSError):
        lock_path(exp_dir).unlink()
    return entry
