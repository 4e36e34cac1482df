"""The on-disk layout of evidence: the one place that knows file names and attempts.

A leg's run directory holds the files below; an experiment directory holds its
preregistration, its state log, one directory per leg with one `attempt-N` run
directory per attempt, and the record. Which attempt of a leg counts is answered
here too: the first whose summary says `complete` (a leg is never run again once
it has one, so there is at most one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tokrecord.evidence import safe

# -- a leg's run directory ------------------------------------------------------------------
CONFIG: Final = "config.json"
SUITE: Final = "suite.jsonl"
EVENTS: Final = "events.jsonl"
SERVER_LOG: Final = "server.log"
SERVER_INFO: Final = "server.json"
PROBES: Final = "probes.json"
HARDWARE: Final = "hardware.json"
TELEMETRY: Final = "telemetry.jsonl"
TELEMETRY_SUMMARY: Final = "telemetry.json"
METRICS_BEFORE: Final = "metrics-before.prom"
METRICS_AFTER: Final = "metrics-after.prom"
CLEANUP: Final = "cleanup.json"
IDLE: Final = "idle.json"
IDLE_BEFORE: Final = "idle-before.jsonl"  # each idle gate's snapshots, as taken
IDLE_AFTER: Final = "idle-after.jsonl"
TELEMETRY_PROBES: Final = "telemetry.probes.json"  # the sampler's header (probes.telemetry)
LEG_TEACHER: Final = "teacher.json"
GATES: Final = "gates.json"
ROWS: Final = "rows.json"
SUMMARY: Final = "summary.json"
ERROR: Final = "error.json"
# Every read's bytes and stamp, appended as they arrive (client.rawlog), and what a
# resume decoded from them after a hard kill (experiment.recovery).
RAW_READS: Final = "raw-reads.bin"
RECOVERED_EVENTS: Final = "recovered-events.jsonl"
RECOVERY: Final = "recovery.json"
# The files a record hashes for each leg (when present), in this order.
EVIDENCE_FILES: Final = (SUMMARY, ROWS, EVENTS, GATES, CONFIG, SERVER_LOG, CLEANUP,
                         METRICS_BEFORE, METRICS_AFTER, IDLE, TELEMETRY, HARDWARE)

# -- an experiment directory ----------------------------------------------------------------
PLAN: Final = "plan.json"
PLAN_HASH: Final = "plan.sha256"
PLAN_TOML: Final = "plan.toml"
POWER: Final = "power.json"
STATE: Final = "experiment.jsonl"
IDENTITY: Final = "identity.json"
IDENTITY_DIR: Final = "identity"
TEACHER: Final = "teacher.json"
TEACHER_LEG: Final = "teacher"
RECORD: Final = "record.json"
PRIOR_CHECK: Final = "prior-check.json"  # the plan's prior, as the public API showed it
ATTEMPT_PREFIX: Final = "attempt-"
# Profiler traces and checks of the plan's [[components]], copied at preregistration.
COMPONENTS_DIR: Final = "components"
COMPONENT_CHECK: Final = "check.json"
# Portable copies of identity's model manifest (sha256sum form: its sha256 is identity's
# manifest_sha256) and runtime locks, written at preregistration.
MODEL_MANIFEST: Final = "manifests/model-release-files.sha256"
RUNTIME_LOCK: Final = "manifests/runtime-lock.json"
# Exactness documents the record hashes, written with it.
CROSS_LEG_EXACTNESS: Final = "cross-leg-exactness.json"
ALL_VS_TEACHER: Final = "all-vs-canonical-teacher.json"


def idle_log(phase: str) -> str:
    """The file of an idle gate's snapshots: IDLE_BEFORE or IDLE_AFTER."""
    return {"before": IDLE_BEFORE, "after": IDLE_AFTER}[phase]


def attempt_dir(leg_dir: Path, attempt: int) -> Path:
    return leg_dir / f"{ATTEMPT_PREFIX}{attempt}"


def attempt_number(run_dir: Path) -> int | None:
    """N of `.../attempt-N`, or None for any other directory."""
    name = run_dir.name
    if not name.startswith(ATTEMPT_PREFIX) or not name[len(ATTEMPT_PREFIX):].isdigit():
        return None
    return int(name[len(ATTEMPT_PREFIX):])


def attempts(leg_dir: Path) -> list[Path]:
    """A leg's attempt directories, by attempt number."""
    if not leg_dir.is_dir():
        return []
    found = [(n, p) for p in leg_dir.iterdir() if p.is_dir() and (n := attempt_number(p))]
    return [p for _, p in sorted(found)]


def summary_status(run_dir: Path) -> str | None:
    """The status its summary.json records; None when there is none (a killed run).
    A summary that cannot be read is reported as "unreadable" so that verify names it."""
    path = run_dir / SUMMARY
    if not path.exists():
        return None
    # Read as received evidence: verify and report ask this of a stranger's directory.
    try:
        status = safe.read_json_object(path).get("status")
    except safe.UnsafeEvidence:
        return "unreadable"
    return str(status)


def complete_attempt(leg_dir: Path) -> Path | None:
    """The attempt that counts for a leg: the first whose summary says complete."""
    return next((p for p in attempts(leg_dir) if summary_status(p) == "complete"), None)


def leg_dirs(exp_dir: Path) -> list[Path]:
    """Every leg directory of an experiment (the teacher's included), by name."""
    return sorted(p for p in exp_dir.iterdir() if p.is_dir() and attempts(p))


def locate_run_dir(exp_dir: Path, recorded: str, leg: str) -> Path:
    """A run dir a record names, found inside the experiment wherever it now lives: the
    record keeps the path as written, but only `<leg>/attempt-N` of it is meaningful."""
    path = Path(recorded)
    n = attempt_number(path)
    if path.parent.name != leg or n is None:
        raise ValueError(f"run_dir {recorded!r} of leg {leg} is not .../{leg}/"
                         f"{ATTEMPT_PREFIX}N")
    return attempt_dir(exp_dir / leg, n)
