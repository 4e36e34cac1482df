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

Crash safety: one run per experiment at a time (a lock beside the directory,
`.<name>.lock`, released by the kernel whatever kills the holder); the
preregistration is built in a hidden sibling and renamed into place, so a kill leaves
either no experiment or a whole preregistration; a resume first stops any server a
hard kill orphaned, decodes the raw reads of a killed attempt (experiment.recovery)
and names every torn JSONL line in the state log.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypedDict

import psutil

from tokrecord.errors import ConfigError, EvidenceError, TokrecordError
from tokrecord.evidence import (
    WRITE_ERRNOS,
    canonical_json,
    evidence_error,
    layout,
    read_jsonl,
    scan_jsonl,
    write_exclusive,
)
from tokrecord.evidence.seal import SIGNATURE_NAME
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.experiment.components import check_components, copy_components
from tokrecord.experiment.interim import analysis_legs, leg_figures, sequential_analysis
from tokrecord.experiment.journal import (
    Complete,
    ComponentsCopied,
    Entry,
    IdentityCollected,
    IdleGap,
    InterimLook,
    LegEnd,
    LegIdentity,
    LegStart,
    OrphanServerStopped,
    PortableManifestsWritten,
    PowerComputed,
    Preregistered,
    RawRecovered,
    Resumed,
    SequentialStop,
    TeacherCaptured,
    TornJsonl,
    parse_entries,
    parse_entry,
)
from tokrecord.experiment.leg import (
    LegConfig,
    LegObserver,
    LegResult,
    NullObserver,
    ServerSpec,
    load_rows,
    run_leg,
    teacher_from_run,
)
from tokrecord.experiment.plan import Plan, draft_paths
from tokrecord.experiment.power import plan_noise, power_report
from tokrecord.experiment.recovery import recover_attempt
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.sweep import SweepSequential
from tokrecord.experiment.sweep_sequential import leg_exact, plan_sequential_sweep
from tokrecord.gates.teacher import Teacher, load_teacher, write_teacher
from tokrecord.identity import Identity, IdentitySpec, collect_identity, manifest_text
from tokrecord.jsontypes import JSONObject
from tokrecord.server import xllamacpp
from tokrecord.server.process import resolve_program, servers_of_run
from tokrecord.suite import Suite, load_suite

STATE = layout.STATE
POWER_FILE = layout.POWER
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ExperimentBusyError(TokrecordError):
    """Another `tokrecord run` holds the experiment: refused, never interleaved."""

    exit_code = 75  # EX_TEMPFAIL: try again once the other run has ended


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


def leg_config(plan: Plan, suite: Suite, name: str, arm_name: str, attempt: int) -> LegConfig:
    arm = plan.all_arms[arm_name]
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
        log_facts=plan.log_facts, row_limits=plan.row_limits,
    )


class _State:
    """The append-only state log of an experiment.

    A line torn by a kill or a full disk is never rewritten: the next append first
    ends it with a newline and then names it in a `torn_jsonl` event; readers skip it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Entry] = []
        self._torn: list[int] = []
        self._unterminated = False
        if path.exists():
            found, self._torn = scan_jsonl(path)
            self.events = parse_entries(found, path)
            data = path.read_bytes()
            self._unterminated = bool(data) and not data.endswith(b"\n")
        self._named = {e.line for e in self.events if isinstance(e, TornJsonl) and e.file == STATE}

    def append(self, entry: Entry) -> None:
        torn = [n for n in self._torn if n not in self._named]
        if self._unterminated:
            self._write_line(b"\n")
            self._unterminated = False
        for line in torn:
            self._named.add(line)
            self._write(TornJsonl(file=STATE, line=line))
        self._write(entry)

    def _write(self, entry: Entry) -> None:
        # Wall time for people; the monotonic clock (and the boot it counts from) for
        # durations, which a wall-clock jump must not move.
        record = {**entry.line_fields(), "utc": utc_stamp(Stamp.MICROSECONDS),
                  "unix": time.time(), "monotonic_ns": time.monotonic_ns(), "boot_id": _boot_id()}
        self._write_line(canonical_json(record) + b"\n")
        self.events.append(parse_entry(record, str(self.path)))

    def ends(self) -> list[LegEnd]:
        return [e for e in self.events if isinstance(e, LegEnd)]

    def ended(self, leg: str, attempt: int | None) -> bool:
        """Whether the log holds an end of this attempt (matched by leg and number: the
        same directory may be spelled differently on resume)."""
        return any(e.leg == leg and e.attempt == attempt for e in self.ends())

    def _write_line(self, data: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise _written(exc, self.path) from exc
        try:
            os.write(fd, data)  # one append: a line is never interleaved with another
        except OSError as exc:
            raise _written(exc, self.path) from exc
        finally:
            os.close(fd)

    def last_stop(self) -> tuple[float, int | None, str | None] | None:
        """(unix, monotonic_ns, boot_id) of the last leg's end, if any leg ended."""
        stops = self.ends()
        if not stops:
            return None
        last = stops[-1]
        return float(last.unix or 0.0), last.monotonic_ns, last.boot_id


def _boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _written(exc: OSError, path: Path) -> TokrecordError | OSError:
    if exc.errno in WRITE_ERRNOS:
        if exc.filename is None:
            exc.filename = str(path)
        return evidence_error(exc)
    return exc


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
    """A hard-killed run can leave its server running: stop its process group. Found by
    the pid in server.json or, when the kill came before that was written, by the run
    directory in the server's environment (RUN_DIR_ENV)."""
    groups: set[int] = set()
    for proc in servers_of_run(run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(proc.pid))
    info = run_dir / layout.SERVER_INFO
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        recorded = json.loads(info.read_text())
        pgid = int(recorded["pgid"])
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pgid)
            # A reused pid belongs to some other process: never kill that one. A zombie
            # is already dead (its parent has yet to reap it).
            if abs(proc.create_time() - float(recorded.get("create_time", -1))) <= 1.0 and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                groups.add(pgid)
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pgid).wait(timeout=10)
    return bool(groups)


def _sweep_orphans(exp_dir: Path) -> set[tuple[str, int]]:
    """Before anything is written (a read-only or full directory must not keep a server
    alive): stop every server of an attempt that has no result."""
    stopped: set[tuple[str, int]] = set()
    if not exp_dir.is_dir():
        return stopped
    for leg_dir in layout.leg_dirs(exp_dir):
        for run_dir in layout.attempts(leg_dir):
            if layout.summary_status(run_dir) is None and _stop_orphan(run_dir):
                stopped.add((leg_dir.name, layout.attempt_number(run_dir) or 0))
    return stopped


def lock_path(exp_dir: Path) -> Path:
    """`.<name>.lock` beside the experiment: outside the evidence, which it must not change."""
    resolved = exp_dir.resolve()
    return resolved.with_name(f".{resolved.name}.lock")


_HELD: dict[Path, int] = {}


@contextlib.contextmanager
def experiment_lock(exp_dir: Path) -> Iterator[None]:
    """Hold the experiment for this process: a second `tokrecord run` of it (same plan,
    any spelling of the directory) is refused while this one runs. flock(2): the kernel
    releases it whatever ends the holder, SIGKILL included, so a lock is never stale.
    Re-entrant within a process (the CLI holds it across run, record and seal)."""
    path = lock_path(exp_dir)
    if path in _HELD:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: the pid is written into the lock below, and a lock replaced by a
        # symlink must not redirect that write (and its truncation) to another file.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        # flock needs no write access: an existing lock on a read-only file system still
        # locks (and the run then fails on its first write, with the right message).
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            raise _written(exc, path) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExperimentBusyError(f"lock {path} is not a regular file; remove it and run again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ExperimentBusyError(
            f"experiment {exp_dir} is already being run (pid {holder}, lock {path}): a second "
            "run of the same plan is refused, never interleaved. Wait for it to end; if it "
            "was stopped, run the same command to resume") from None
    with contextlib.suppress(OSError):  # the holder's pid, for the message above
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[path] = fd
    try:
        yield
    finally:
        del _HELD[path]
        os.close(fd)


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
        completed = any(isinstance(e, Complete) for e in state.events)
        if (exp_dir / SIGNATURE_NAME).exists() or (
                completed and not (exp_dir / layout.RECORD).exists()):
            raise ConfigError(
                f"experiment {exp_dir} is complete; a preregistered plan is run once "
                "(no fifth leg, no re-run): see its record.json"
            )
        # A record without its seal: a kill came while finishing. The legs are all kept,
        # and finishing resumes (record.build.finish); nothing is added to a directory
        # whose manifest is already written, or after its `complete`.
        if not completed and not (exp_dir / "manifest.sha256").exists():
            state.append(Resumed(plan_sha256=plan.sha256))
        return state
    if exp_dir.exists() and any(exp_dir.iterdir()):
        raise ConfigError(f"{exp_dir} exists and is not an experiment directory")
    check_components(plan.components)  # a bad trace or pattern fails before anything is written
    try:
        exp_dir.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed into place: a kill at any instant leaves no experiment
        # or a whole preregistration, never half of one that no resume could accept.
        for stale in exp_dir.parent.glob(f".{exp_dir.name}.preregistering-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a killed run's; the lock is ours
        staging = Path(tempfile.mkdtemp(prefix=f".{exp_dir.name}.preregistering-",
                                        dir=exp_dir.parent))
        try:
            _preregister_into(plan, staging, exp_dir, plan_text)
            if exp_dir.exists():
                exp_dir.rmdir()  # empty (checked above)
            os.rename(staging, exp_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a SIGKILL leaves it: see above
            raise
    except OSError as exc:
        raise _written(exc, exp_dir) from exc
    return _State(state_path)


def _preregister_into(plan: Plan, out: Path, exp_dir: Path, plan_text: bytes | None) -> None:
    write_exclusive(out / layout.PLAN, plan.canonical() + b"\n")
    write_exclusive(out / layout.PLAN_HASH, f"{plan.sha256}  plan.json\n".encode())
    if plan_text is not None:
        write_exclusive(out / layout.PLAN_TOML, plan_text)
    state = _State(out / STATE)
    state.append(Preregistered(plan_sha256=plan.sha256, name=plan.name,
                               design=plan.design.value, legs=[n for n, _ in plan.legs]))
    # A sweep's power is another question (experiment.sweep; `plan power` prints it).
    if plan.min_effect_pct is not None and plan.sweep is None:
        # Named by its final place: the record keeps this string.
        report = power_report(plan, plan_noise(plan, str(exp_dir / layout.PLAN)),
                              len(plan_suite(plan).rows))
        write_exclusive(out / POWER_FILE, canonical_json(report.model_dump(mode="json")) + b"\n")
        state.append(PowerComputed(path=POWER_FILE, min_effect_pct=plan.min_effect_pct,
                                   power=report.min_effect_power, blocks=plan.blocks))
    identity = collect_identity(_identity_spec(plan), out / layout.IDENTITY_DIR,
                                engine_python(plan), draft_paths(plan))
    write_exclusive(out / layout.IDENTITY, _identity_bytes(identity))
    state.append(IdentityCollected(path="identity.json"))
    written = write_portable_manifests(identity, out)
    state.append(PortableManifestsWritten(paths=written))
    if plan.components:
        state.append(ComponentsCopied(paths=copy_components(plan.components, out)))


def write_portable_manifests(identity: Identity, exp_dir: Path) -> list[str]:
    """The model's file manifest (sha256sum form, so `sha256sum -c` checks a copy of the
    weights; its own sha256 is identity's manifest_sha256) and the runtime locks, as files
    a reproduction can use without reading identity.json."""
    written = []
    if identity.model is not None:
        path = exp_dir / layout.MODEL_MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        write_exclusive(path, manifest_text(identity.model.files).encode("utf-8"))
        written.append(layout.MODEL_MANIFEST)
    path = exp_dir / layout.RUNTIME_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    write_exclusive(path, canonical_json(identity.runtime_locks) + b"\n")
    written.append(layout.RUNTIME_LOCK)
    return written


def _identity_bytes(identity: Identity) -> bytes:
    return canonical_json(identity.model_dump(mode="json")) + b"\n"


class IdentityCheck(TypedDict):
    """The identity collected again before a leg, against the preregistered one (the
    journal's LegIdentity fields)."""

    identity_sha256: str
    matches_preregistered: bool
    changed: list[str]


def check_identity(plan: Plan, exp_dir: Path) -> IdentityCheck:
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
    if xllamacpp.is_console_script(resolve_program(plan.server.argv[0])):
        return xllamacpp.engine_python()  # tokrecord's `llama-server` runs the engine's python
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
    identity: Callable[[], IdentityCheck] | None = None,
    stopped: set[tuple[str, int]] | None = None,
) -> LegResult:
    """Keep a complete attempt; else mark earlier ones interrupted, wait `before_run`
    (the idle gap, measured after any orphaned server is stopped) and run a fresh one."""
    name = leg_dir.name
    done = _complete(leg_dir)
    if done is not None:
        _record_kept_end(state, name, done)
        observer.leg_kept(name, done)
        return done
    _reconcile(state, leg_dir, stopped)
    before_run()
    attempt = len(layout.attempts(leg_dir)) + 1
    run_dir = layout.attempt_dir(leg_dir, attempt)
    config = make_config(attempt)
    observer.leg_starting(name, config.arm, attempt, index, total)
    if identity is not None:
        state.append(LegIdentity(leg=name, attempt=attempt, **identity()))
    state.append(LegStart(leg=name, arm=config.arm, attempt=attempt, run_dir=str(run_dir)))
    try:
        result = run_leg(config, run_dir, observer, teacher=teacher)
    except KeyboardInterrupt:
        state.append(LegEnd(leg=name, attempt=attempt, run_dir=str(run_dir),
                            status="interrupted", valid=False, error="interrupted"))
        raise
    except TokrecordError as exc:
        state.append(LegEnd(leg=name, attempt=attempt, run_dir=str(run_dir),
                            status="failed", valid=False, error=str(exc)))
        raise
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        if exc.filename is None:  # a write to an open file: name the attempt it was in
            exc.filename = str(run_dir)
        error = evidence_error(exc)
        with contextlib.suppress(EvidenceError):  # the log may be on the same full disk
            state.append(LegEnd(leg=name, attempt=attempt, run_dir=str(run_dir),
                                status="failed", valid=False, error=str(error)))
        raise error from exc
    state.append(LegEnd(leg=name, attempt=attempt, run_dir=str(run_dir),
                        status=result.status, valid=result.valid,
                        headline=result.summary.tok_s_out))
    return result


def _record_kept_end(state: _State, name: str, done: LegResult) -> None:
    """A kill between a leg's summary and its `leg_end` leaves a complete attempt the
    log never closed: write that end now, from the summary, so that the attempt is
    listed like every other (the record's attempts come from the log)."""
    attempt = layout.attempt_number(Path(done.run_dir))
    if state.ended(name, attempt):
        return
    state.append(LegEnd(leg=name, attempt=attempt, run_dir=done.run_dir,
                        status=done.status, valid=done.valid, headline=done.summary.tok_s_out,
                        written_on_resume=True))


def _reconcile(state: _State, leg_dir: Path, stopped: set[tuple[str, int]] | None = None
               ) -> None:
    """Before anything else runs: stop a server a hard kill left behind, write the end
    event the killed run never wrote (so the log and the idle gap see it), decode what
    its raw log kept, and name every torn JSONL line of the attempt."""
    name = leg_dir.name
    exp_dir = leg_dir.parent
    for run_dir in layout.attempts(leg_dir):
        status = layout.summary_status(run_dir)
        if status == "complete":
            continue
        attempt = layout.attempt_number(run_dir)
        recorded = state.ended(name, attempt)
        if _stop_orphan(run_dir) or (name, attempt or 0) in (stopped or set()):
            state.append(OrphanServerStopped(leg=name, attempt=attempt))
        if not recorded:
            state.append(LegEnd(leg=name, attempt=attempt, run_dir=str(run_dir),
                                status="interrupted", valid=False,
                                error="no result: the run was killed"))
        if status is None and not (run_dir / layout.RECOVERY).exists():
            found = recover_attempt(run_dir)
            if found is not None:
                state.append(RawRecovered(leg=name, attempt=attempt, **found))
        _name_torn(state, exp_dir, run_dir)


def _name_torn(state: _State, exp_dir: Path, run_dir: Path) -> None:
    """A `torn_jsonl` event for each torn line of the attempt's JSONL files, once."""
    named = {(e.file, e.line) for e in state.events if isinstance(e, TornJsonl)}
    for path in sorted(run_dir.glob("*.jsonl")):
        rel = path.relative_to(exp_dir).as_posix()
        for line in scan_jsonl(path)[1]:
            if (rel, line) not in named:
                state.append(TornJsonl(file=rel, line=line))


def _teacher(plan: Plan, exp_dir: Path, suite: Suite, state: _State,
             observer: ExperimentObserver, stopped: set[tuple[str, int]] | None = None
             ) -> Teacher | None:
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
    arm: str = "control" if "control" in plan.arms else "candidate"
    if plan.sweep is not None:
        arm = plan.control_arm
    result = _run_attempts(
        state, exp_dir / layout.TEACHER_LEG,
        lambda k: leg_config(plan, suite, "teacher", arm, k).model_copy(update={"name": "teacher"}),
        observer, None, 0, len(plan.legs), stopped=stopped,
    )
    teacher = teacher_from_run(Path(result.run_dir), leg_config(plan, suite, "teacher", arm, 1),
                               None)
    write_teacher(path, teacher)
    state.append(TeacherCaptured(path=str(path), sha256=teacher.sha256, arm=arm))
    return teacher


def run_experiment(
    plan: Plan,
    exp_dir: Path,
    observer: ExperimentObserver | None = None,
    *,
    plan_text: bytes | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, LegResult]:
    """Run (or resume) every leg of the plan; returns the complete legs by name. Holds
    the experiment's lock throughout (experiment_lock)."""
    obs: ExperimentObserver = observer or NullExperimentObserver()
    suite = plan_suite(plan)
    with experiment_lock(exp_dir):
        stopped = _sweep_orphans(exp_dir)
        state = preregister(plan, exp_dir, plan_text)
        teacher = _teacher(plan, exp_dir, suite, state, obs, stopped)
        results: dict[str, LegResult] = {}
        total = len(plan.legs)
        per_block = len(plan.all_arms) if plan.sweep is not None else 4
        for index, (name, arm) in enumerate(plan.legs, start=1):
            if plan.sequential is not None and (index - 1) % per_block == 0 and \
                    not _next_block_wanted(plan, state, results,
                                           (index - 1) // per_block + 1, obs):
                break
            results[name] = _run_attempts(
                state, exp_dir / name, functools.partial(leg_config, plan, suite, name, arm),
                obs, teacher, index, total,
                before_run=functools.partial(_honour_idle_gap, plan, state, name, obs, sleep),
                identity=functools.partial(check_identity, plan, exp_dir), stopped=stopped,
            )
    if plan.sequential is not None and len(results) == total:
        _next_block_wanted(plan, state, results, plan.max_blocks + 1, obs)
    return results


def _next_block_wanted(plan: Plan, state: _State, results: dict[str, LegResult], block: int,
                       obs: ExperimentObserver) -> bool:
    """A sequential plan's interim analysis before `block` starts: log each look once
    (a resume recomputes them from the kept legs, the same way), and say whether the
    stopping rule wants this block."""
    figures = {name: leg_figures(r, load_rows(Path(r.run_dir))) for name, r in results.items()}
    found: SequentialAnalysis | SweepSequential = plan_sequential_sweep(
        plan, figures, {name: leg_exact(r) for name, r in results.items()})[0] \
        if plan.sweep is not None else sequential_analysis(plan, analysis_legs(plan, figures))
    logged = {e.look for e in state.events if isinstance(e, InterimLook)}
    for look in found.looks:
        if look.label not in logged:
            state.append(InterimLook(look=look.label, statistic=look.statistic,
                                     boundary=look.boundary, df=look.df,
                                     verdict=look.verdict.value, action=look.action.value))
            progress = getattr(obs, "interim_look", None)
            if callable(progress):
                progress(look)
    if found.stopped:
        if not any(isinstance(e, SequentialStop) for e in state.events):
            state.append(SequentialStop(at=found.stopped_at, verdict=found.verdict.value,
                                        legs=len(results), max_legs=len(plan.legs)))
        return False
    return block <= plan.max_blocks


def _since(last: tuple[float, int | None, str | None]) -> float:
    """Seconds since a logged instant: on the monotonic clock when the instant was taken
    in this boot (a wall-clock jump moves neither end), else on the wall clock."""
    unix, mono_ns, boot = last
    if mono_ns is not None and boot is not None and boot == _boot_id():
        return (time.monotonic_ns() - int(mono_ns)) / 1e9
    return time.time() - unix


def _honour_idle_gap(plan: Plan, state: _State, before: str, obs: ExperimentObserver,
                     sleep: Callable[[float], None]) -> None:
    """Wait until the declared gap since the previous server stopped; record the real gap."""
    last = state.last_stop()
    if last is None or plan.idle_gap_s <= 0:
        return
    wait = plan.idle_gap_s - _since(last)
    if wait > 0:
        obs.idle_wait(before, wait)
        sleep(wait)
    state.append(IdleGap(before=before, seconds=_since(last), minimum=plan.idle_gap_s,
                         clock="monotonic" if last[2] == _boot_id() and last[1] is not None
                         else "wall"))


def completed(exp_dir: Path) -> bool:
    """Whether the state log has its `complete` event."""
    return any(isinstance(e, Complete) for e in _State(exp_dir / STATE).events)


def mark_complete(exp_dir: Path, record_path: Path) -> None:
    """The state log's last event: the record is written; no leg runs after this."""
    _State(exp_dir / STATE).append(Complete(record=str(record_path)))


def attempts_log(exp_dir: Path) -> list[JSONObject]:
    """Every leg attempt with its outcome, from the state log."""
    return [
        {"leg": e.leg, "attempt": e.attempt, "status": e.status, "valid": e.valid,
         "error": e.error, "run_dir": e.run_dir}
        for e in _read(exp_dir) if isinstance(e, LegEnd)
    ]


def leg_identities(exp_dir: Path) -> dict[str, JSONObject]:
    """Per leg, the identity check of its last attempt (the one a record counts)."""
    out: dict[str, JSONObject] = {}
    for e in _read(exp_dir):
        if isinstance(e, LegIdentity):
            out[e.leg] = {"identity_sha256": e.identity_sha256,
                          "matches_preregistered": e.matches_preregistered, "changed": e.changed}
    return out


def idle_gaps(exp_dir: Path) -> dict[str, float]:
    return {e.before: round(float(e.seconds), 3)
            for e in _read(exp_dir) if isinstance(e, IdleGap)}


def _read(exp_dir: Path) -> list[Entry]:
    path = exp_dir / STATE
    return parse_entries(read_jsonl(path, skip_torn=True), path)
