"""`tokrecord plan check`: what a plan needs, checked before anything is preregistered.

A wrong model path or a misspelt server flag should cost seconds, not a teacher leg
and a preregistered experiment directory that no fix can resume (the fix changes the
plan's hash). So: every program and file the plan names exists, and each arm's
server starts to readiness (no generation: readiness is the engine's ready paths)
and stops again. The servers' logs go to a temporary directory that is removed
afterwards, so a failing check leaves nothing under tokrecord-runs/; a failure quotes
the log's error line, not its tail.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tokrecord.engines import EngineName
from tokrecord.errors import TokrecordError
from tokrecord.experiment.plan import Plan, plan_engine, speculative_configs
from tokrecord.server.process import (
    PortHold,
    ServerProcess,
    log_error_line,
    render_argv,
    resolve_program,
)


@dataclass(frozen=True)
class Problem:
    key: str  # the plan's dotted key the problem is about
    message: str

    def text(self, source: str) -> str:
        return f"{source}: key '{self.key}': {self.message}"


@dataclass(frozen=True)
class ArmStart:
    arm: str
    ready_s: float | None  # None: it did not become ready
    problem: Problem | None


class CheckObserver(Protocol):
    def arm_starting(self, arm: str, argv: list[str]) -> None: ...
    def arm_done(self, start: ArmStart) -> None: ...


class NullCheckObserver:
    def arm_starting(self, arm: str, argv: list[str]) -> None: ...
    def arm_done(self, start: ArmStart) -> None: ...


def _looks_like_path(model: str) -> bool:
    # A hub id ("org/name") is not a path; these are.
    return model.startswith(("/", "./", "../", "~")) or model.endswith(
        (".gguf", ".safetensors", ".bin"))


def static_problems(plan: Plan, *, resolve: Callable[[str], str | None] = resolve_program,
                    exists: Callable[[Path], bool] = Path.exists) -> list[Problem]:
    """Every missing program and file the plan names, all at once."""
    problems = []
    program = plan.server.argv[0]
    if resolve(program) is None:
        hint = (" (`llama-server` is installed beside tokrecord by `make setup`; the engine by "
                "`tokrecord engine --engine llama.cpp`)" if program == "llama-server" else "")
        problems.append(Problem("server.argv", f"program {program!r} is not found on PATH "
                                f"nor beside tokrecord{hint}"))
    model = plan.server.model
    # llama.cpp loads a file; other engines also take hub ids, which are not checked here.
    if (plan_engine(plan).name is EngineName.LLAMA_CPP or _looks_like_path(model)) and not exists(
            Path(model).expanduser()):
        problems.append(Problem("server.model", f"{model} does not exist"))
    try:
        configs = speculative_configs(plan)
    except (TokrecordError, ValueError) as exc:
        problems.append(Problem("arms", f"cannot read the speculative configuration: {exc}"))
        configs = {}
    for arm, config in sorted(configs.items()):
        draft = config.draft_model if config is not None else None
        if draft is not None and not exists(Path(draft).expanduser()):
            problems.append(Problem(f"arms.{arm}.extra_args", f"draft model {draft} does not exist"))
    for i, component in enumerate(plan.components):
        files = [("control_traces", p) for p in component.control_traces]
        files += [("candidate_traces", p) for p in component.candidate_traces]
        files.append(("check", component.check))
        for key, path in files:
            if not exists(Path(path)):
                problems.append(Problem(f"components.{i}.{key}",
                                        f"{path} does not exist (component {component.name!r})"))
    if plan.suite is not None and not exists(Path(plan.suite)):
        problems.append(Problem("suite", f"{plan.suite} does not exist"))
    if plan.teacher not in (None, "capture") and not exists(Path(str(plan.teacher))):
        problems.append(Problem("teacher", f"{plan.teacher} does not exist"))
    return problems


def start_arm(plan: Plan, arm: str, workdir: Path, observer: CheckObserver) -> ArmStart:
    """Start one arm's server to readiness and stop it; its log stays in workdir."""
    spec, chosen = plan.server, plan.all_arms[arm]
    hold = PortHold(spec.host)  # held until the server starts (server.process.PortHold)
    port = hold.port
    argv = render_argv((*spec.argv, *chosen.extra_args),
                       {"port": str(port), "host": spec.host, "model": spec.model})
    observer.arm_starting(arm, argv)
    log = workdir / f"{arm}.server.log"
    server = ServerProcess(argv, port=port, host=spec.host, log_path=log,
                           env={**spec.env, **chosen.env}, stop_grace_s=spec.stop_grace_s,
                           hold=hold)
    key = f"arms.{arm}" if chosen.extra_args or chosen.env else "server"
    try:
        with server:
            ready = server.wait_ready(spec.ready_timeout_s, model=spec.served_model or spec.model,
                                      engine=plan_engine(plan))
    except TokrecordError as exc:
        line = log_error_line(log, plan_engine(plan).error_line)
        first = str(exc).splitlines()[0].split(" error line:")[0]
        said = f"; the server log says: {line}" if line else f" ({first})"
        return ArmStart(arm, None, Problem(key, f"the {arm} arm's server did not start{said}"))
    cleanup = server.cleanup
    if cleanup is not None and not cleanup.passed:
        return ArmStart(arm, ready, Problem(key, f"the {arm} arm's server left processes "
                                            f"{list(cleanup.surviving_pids)} or its port open"))
    return ArmStart(arm, ready, None)


@dataclass(frozen=True)
class PlanCheck:
    problems: tuple[Problem, ...]
    starts: tuple[ArmStart, ...]

    @property
    def passed(self) -> bool:
        return not self.problems


def check_plan(plan: Plan, *, start_servers: bool = True,
               observer: CheckObserver | None = None) -> PlanCheck:
    """Static problems first; servers are started only when those are none (a missing
    model would only fail again, more slowly)."""
    obs = observer or NullCheckObserver()
    problems = static_problems(plan)
    starts: list[ArmStart] = []
    if not problems and start_servers:
        with tempfile.TemporaryDirectory(prefix="tokrecord-plan-check-") as tmp:
            for arm in sorted(plan.all_arms, key=lambda a: (a != plan.control_arm, a)):
                start = start_arm(plan, arm, Path(tmp), obs)
                obs.arm_done(start)
                starts.append(start)
        problems = [s.problem for s in starts if s.problem is not None]
    return PlanCheck(tuple(problems), tuple(starts))
