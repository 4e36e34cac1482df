"""Running a preregistered plan: preregister, legs in design order, resume, results.

Layout of an experiment directory (append-only; nothing is rewritten):
    plan.json, plan.sha256, plan.toml      the preregistration, before any leg
    power.json                             the power for the plan's min_effect_pct, when declared
    experiment.jsonl                       the state log: every event, in order
    teacher/attempt-1/, teacher.json       when the plan captures its teacher
    A1/attempt-1/, B1/attempt-1/, ...      one run dir per leg attempt
    record.json                            the results, once every leg is complete (record.build)
An interrupted leg keeps its attempt dir; it is run again from scratch as the next
attempt on a fresh server, and the record lists every attempt.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psutil

from tokrecord.errors import ConfigError, TokrecordError
from tokrecord.evidence import JsonlWriter, canonical_json, layout, read_jsonl
from tokrecord.experiment.components import check_components, copy_components
from tokrecord.experiment.leg import (
    LegConfig,
    LegObserver,
    LegResult,
    NullObserver,
    ServerSpec,
    run_leg,
    teacher_from_run,
)
from tokrecord.experiment.plan import ArmName, Plan, draft_paths
from tokrecord.experiment.power import plan_noise, power_report
from tokrecord.gates.teacher import Teacher, load_teacher, write_teacher
from tokrecord.identity import Identity, IdentitySpec, collect_identity, manifest_text
from tokrecord.suite import Suite, load_suite

STATE = layout.STATE
POWER_FILE = layout.POWER


class ExperimentObserver(LegObserver, Protocol):
    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None: ...
    def leg_kept(self, name: str, result: LegResult) -> None: ...
    def idle_wait(self, before: str, seconds: float) -> None: ...


class NullExperimentObserver(NullObserver):
    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None: ...
    def leg_kept(self, name: str, result: LegResult) -> None: ...
    def idle_wait(self, before: str, seconds: float) -> None: ...


def default_experiment_dir(plan: Plan, root: Path = Path("tokrecord-runs")) -> Path:
    return root / f"{plan.name}-{plan.sha256[:12]}"


def plan_suite(plan: Plan) -> Suite:
    suite = load_suite(Path(plan.suite) if plan.suite else None)
    return suite.head(plan.suite_rows) if plan.suite_rows else suite


def leg_config(plan: Plan, suite: Suite, name: str, arm_name: ArmName, attempt: int) -> LegConfig:
    arm = plan.arms[arm_name]
    s = plan.server
    return LegConfig(
        name=name, arm=arm_name,
        server=ServerSpec(argv=(*s.argv, *arm.extra_args), env={**s.env, **arm.env}, model=s.model,
                          served_model=s.served_model, host=s.host,
                          ready_timeout_s=s.ready_timeout_s, stop_grace_s=s.stop_grace_s,
                          metrics_path=s.metrics_path),
        suite=suite, engine=plan.engine, endpoint=plan.endpoint, headline=plan.headline,
        request_extra=plan.request_extra,
        gates=plan.gates.model_copy(update={"log_rules": arm.log_rules}),
        plan_sha256=plan.sha256, attempt=attempt, idle=plan.idle, telemetry=plan.telemetry,
        log_facts=plan.log_facts,
    )


class _State:
    """The append-only state log of an experiment."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = read_jsonl(path) if path.exists() else []

    def append(self, event: str, **fields: Any) -> None:
        record = {"event": event, "utc": _utc(), "unix": time.time(), **fields}
        writer = JsonlWriter(open(self.path, "ab"))  # noqa: SIM115 - closed below
        try:
            writer.write(record)
        finally:
            writer.close()
        self.events.append(record)

    def last_stop_unix(self) -> float | None:
        stops = [e["unix"] for e in self.events if e["event"] == "leg_end"]
        return max(stops) if stops else None


def _utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _complete(leg_dir: Path) -> LegResult | None:
    """The leg's complete attempt (layout.complete_attempt) as a result, if it has one."""
    run_dir = layout.complete_attempt(leg_dir)
    if run_dir is None:
        return None
    result = LegResult.model_validate(json.loads((run_dir / layout.SUMMARY).read_text(
        encoding="utf-8")))
    # The directory as found now: the experiment may be resumed from elsewhere.
    return result.model_copy(update={"run_dir": str(run_dir)})


def _stop_orphan(run_dir: Path) -> bool:
    """A hard-killed run can leave its server running: stop that process group."""
    info = run_dir / "server.json"
    if not info.exists():
        return False
    recorded = json.loads(info.read_text())
    pgid = int(recorded["pgid"])
    try:
        proc = psutil.Process(pgid)
        created, status = proc.create_time(), proc.status()
    except psutil.Error:
        return False
    # A reused pid belongs to some other process: never kill that one. A zombie is
    # already dead (its parent has yet to reap it).
    if abs(created - float(recorded.get("create_time", -1))) > 1.0 or status == psutil.STATUS_ZOMBIE:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(psutil.Error):
        proc.wait(timeout=10)
    return True


def preregister(plan: Plan, exp_dir: Path, plan_text: bytes | None) -> _State:
    """Write the plan and its hash before anything runs; on resume, check it is unchanged."""
    state_path = exp_dir / STATE
    if (exp_dir / layout.PLAN_HASH).exists():
        registered = (exp_dir / layout.PLAN_HASH).read_text().split()[0]
        if registered != plan.sha256:
            raise ConfigError(
                f"{exp_dir} holds a different preregistered plan ({registered[:12]}…); this plan "
                f"hashes to {plan.sha256[:12]}…. A preregistered plan cannot change: give the "
                "new plan a new name or --out"
            )
        state = _State(state_path)
        if any(e["event"] == "complete" for e in state.events) or (exp_dir / layout.RECORD).exists():
            raise ConfigError(
                f"experiment {exp_dir} is complete; a preregistered plan is run once "
                "(no fifth leg, no re-run): see its record.json"
            )
        state.append("resumed", plan_sha256=plan.sha256)
        return state
    if exp_dir.exists() and any(exp_dir.iterdir()):
        raise ConfigError(f"{exp_dir} exists and is not an experiment directory")
    check_components(plan.components)  # a bad trace or pattern fails before anything is written
    exp_dir.mkdir(parents=True, exist_ok=True)
    with open(exp_dir / layout.PLAN, "xb") as fh:
        fh.write(plan.canonical() + b"\n")
    with open(exp_dir / layout.PLAN_HASH, "x", encoding="utf-8") as fh:
        fh.write(f"{plan.sha256}  plan.json\n")
    if plan_text is not None:
        with open(exp_dir / layout.PLAN_TOML, "xb") as fh:
            fh.write(plan_text)
    state = _State(state_path)
    state.append("preregistered", plan_sha256=plan.sha256, name=plan.name,
                 design=plan.design.value, legs=[n for n, _ in plan.legs])
    if plan.min_effect_pct is not None:
        report = power_report(plan, plan_noise(plan, str(exp_dir / layout.PLAN)),
                              len(plan_suite(plan).rows))
        with open(exp_dir / POWER_FILE, "xb") as fh:
            fh.write(canonical_json(report.model_dump(mode="json")) + b"\n")
        state.append("power_computed", path=POWER_FILE, min_effect_pct=plan.min_effect_pct,
                     power=report.min_effect_power, blocks=plan.blocks)
    identity = collect_identity(_identity_spec(plan), exp_dir / layout.IDENTITY_DIR,
                                engine_python(plan), draft_paths(plan))
    with open(exp_dir / layout.IDENTITY, "xb") as fh:
        fh.write(_identity_bytes(identity))
    state.append("identity_collected", path="identity.json")
    written = write_portable_manifests(identity, exp_dir)
    state.append("portable_manifests_written", paths=written)
    if plan.components:
        state.append("components_copied", paths=copy_components(plan.components, exp_dir))
    return state


def write_portable_manifests(identity: Identity, exp_dir: Path) -> list[str]:
    """The model's file manifest (sha256sum form, so `sha256sum -c` checks a copy of the
    weights; its own sha256 is identity's manifest_sha256) and the runtime locks, as files
    a reproduction can use without reading identity.json."""
    written = []
    if identity.model is not None:
        path = exp_dir / layout.MODEL_MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(manifest_text(identity.model.files), encoding="utf-8")
        written.append(layout.MODEL_MANIFEST)
    path = exp_dir / layout.RUNTIME_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canonical_json(identity.runtime_locks) + b"\n")
    written.append(layout.RUNTIME_LOCK)
    return written


def _identity_bytes(identity: Identity) -> bytes:
    return canonical_json(identity.model_dump(mode="json")) + b"\n"


def check_identity(plan: Plan, exp_dir: Path) -> dict[str, Any]:
    """Identity collected again, just before a leg, against the preregistered identity.json:
    its sha256, whether it matches, and which of its parts changed (names, not guesses)."""
    with tempfile.TemporaryDirectory(prefix="tokrecord-identity-") as tmp:
        now = collect_identity(_identity_spec(plan), Path(tmp), engine_python(plan),
                               draft_paths(plan))
    data = _identity_bytes(now)
    before = json.loads((exp_dir / layout.IDENTITY).read_text(encoding="utf-8"))
    after = now.model_dump(mode="json")
    changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    changed += sorted(f"sources.{n}" for n in (after.get("sources") or {})
                      if (after["sources"][n] != (before.get("sources") or {}).get(n)))
    return {"identity_sha256": hashlib.sha256(data).hexdigest(),
            "matches_preregistered": not changed, "changed": changed}


def engine_python(plan: Plan) -> Path | None:
    """The server's interpreter, when the server is a Python program (vLLM, SGLang)."""
    exe = Path(plan.server.argv[0])
    return exe if exe.name.startswith("python") and exe.exists() else None


def _identity_spec(plan: Plan) -> IdentitySpec:
    spec = plan.identity
    if spec.model_path is None and Path(plan.server.model).exists():
        spec = spec.model_copy(update={"model_path": plan.server.model})
    return spec


def _run_attempts(
    state: _State,
    leg_dir: Path,
    make_config: Callable[[int], LegConfig],
    observer: ExperimentObserver,
    teacher: Teacher | None,
    index: int,
    total: int,
    before_run: Callable[[], None] = lambda: None,
    identity: Callable[[], dict[str, Any]] | None = None,
) -> LegResult:
    """Keep a complete attempt; else mark earlier ones interrupted, wait `before_run`
    (the idle gap, measured after any orphaned server is stopped) and run a fresh one."""
    name = leg_dir.name
    done = _complete(leg_dir)
    if done is not None:
        observer.leg_kept(name, done)
        return done
    _reconcile(state, leg_dir)
    before_run()
    attempt = len(layout.attempts(leg_dir)) + 1
    run_dir = layout.attempt_dir(leg_dir, attempt)
    config = make_config(attempt)
    observer.leg_starting(name, config.arm, attempt, index, total)
    if identity is not None:
        state.append("leg_identity", leg=name, attempt=attempt, **identity())
    state.append("leg_start", leg=name, arm=config.arm, attempt=attempt, run_dir=str(run_dir))
    try:
        result = run_leg(config, run_dir, observer, teacher=teacher)
    except KeyboardInterrupt:
        state.append("leg_end", leg=name, attempt=attempt, run_dir=str(run_dir),
                     status="interrupted", valid=False, error="interrupted")
        raise
    except TokrecordError as exc:
        state.append("leg_end", leg=name, attempt=attempt, run_dir=str(run_dir),
                     status="failed", valid=False, error=str(exc))
        raise
    state.append("leg_end", leg=name, attempt=attempt, run_dir=str(run_dir),
                 status=result.status, valid=result.valid, headline=result.summary.tok_s_out)
    return result


def _reconcile(state: _State, leg_dir: Path) -> None:
    """Before anything else runs: stop a server a hard kill left behind, and write the
    end event the killed run never wrote, so the log and the idle gap see it."""
    name = leg_dir.name
    for run_dir in layout.attempts(leg_dir):
        if layout.summary_status(run_dir) == "complete":
            continue
        attempt = layout.attempt_number(run_dir)
        # Matched by (leg, attempt): the same directory may be spelled differently on resume.
        recorded = any(e["event"] == "leg_end" and e.get("leg") == name
                       and e.get("attempt") == attempt for e in state.events)
        if _stop_orphan(run_dir):
            state.append("orphan_server_stopped", leg=name, attempt=attempt)
        if not recorded:
            state.append("leg_end", leg=name, attempt=attempt, run_dir=str(run_dir),
                         status="interrupted", valid=False, error="no result: the run was killed")


def _teacher(plan: Plan, exp_dir: Path, suite: Suite, state: _State,
             observer: ExperimentObserver) -> Teacher | None:
    if plan.teacher is None:
        return None
    if plan.teacher != "capture":
        teacher = load_teacher(Path(plan.teacher))
        if teacher.suite_sha256 != suite.sha256:
            raise ConfigError(f"{plan.teacher}: teacher was captured on another suite "
                              f"({teacher.suite_name})")
        return teacher
    path = exp_dir / layout.TEACHER
    if path.exists():
        return load_teacher(path)
    arm: ArmName = "control" if "control" in plan.arms else "candidate"
    result = _run_attempts(
        state, exp_dir / layout.TEACHER_LEG,
        lambda k: leg_config(plan, suite, "teacher", arm, k).model_copy(update={"name": "teacher"}),
        observer, None, 0, len(plan.legs),
    )
    teacher = teacher_from_run(Path(result.run_dir), leg_config(plan, suite, "teacher", arm, 1),
                               None)
    write_teacher(path, teacher)
    state.append("teacher_captured", path=str(path), sha256=teacher.sha256, arm=arm)
    return teacher


def run_experiment(
    plan: Plan,
    exp_dir: Path,
    observer: ExperimentObserver | None = None,
    *,
    plan_text: bytes | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, LegResult]:
    """Run (or resume) every leg of the plan; returns the complete legs by name."""
    obs: ExperimentObserver = observer or NullExperimentObserver()
    suite = plan_suite(plan)
    state = preregister(plan, exp_dir, plan_text)
    teacher = _teacher(plan, exp_dir, suite, state, obs)
    results: dict[str, LegResult] = {}
    total = len(plan.legs)
    for index, (name, arm) in enumerate(plan.legs, start=1):
        results[name] = _run_attempts(
            state, exp_dir / name, functools.partial(leg_config, plan, suite, name, arm),
            obs, teacher, index, total,
            before_run=functools.partial(_honour_idle_gap, plan, state, name, obs, sleep),
            identity=functools.partial(check_identity, plan, exp_dir),
        )
    return results


def _honour_idle_gap(plan: Plan, state: _State, before: str, obs: ExperimentObserver,
                     sleep: Callable[[float], None]) -> None:
    """Wait until the declared gap since the previous server stopped; record the real gap."""
    last = state.last_stop_unix()
    if last is None or plan.idle_gap_s <= 0:
        return
    wait = plan.idle_gap_s - (time.time() - last)
    if wait > 0:
        obs.idle_wait(before, wait)
        sleep(wait)
    state.append("idle_gap", before=before, seconds=time.time() - last, minimum=plan.idle_gap_s)


def mark_complete(exp_dir: Path, record_path: Path) -> None:
    """The state log's last event: the record is written; no leg runs after this."""
    _State(exp_dir / STATE).append("complete", record=str(record_path))


def attempts_log(exp_dir: Path) -> list[dict[str, Any]]:
    """Every leg attempt with its outcome, from the state log."""
    return [
        {k: e.get(k) for k in ("leg", "attempt", "status", "valid", "error", "run_dir")}
        for e in read_jsonl(exp_dir / STATE) if e["event"] == "leg_end"
    ]


def leg_identities(exp_dir: Path) -> dict[str, dict[str, Any]]:
    """Per leg, the identity check of its last attempt (the one a record counts)."""
    out: dict[str, dict[str, Any]] = {}
    for e in read_jsonl(exp_dir / STATE):
        if e["event"] == "leg_identity":
            out[e["leg"]] = {k: e[k] for k in ("identity_sha256", "matches_preregistered",
                                               "changed")}
    return out


def idle_gaps(exp_dir: Path) -> dict[str, float]:
    return {e["before"]: round(float(e["seconds"]), 3)
            for e in read_jsonl(exp_dir / STATE) if e["event"] == "idle_gap"}
