"""One leg: a fresh server, one pass over the suite, everything kept.

Order: start server -> ready (health/models only, no generation) -> scrape
/metrics -> rows, one at a time -> scrape /metrics -> stop -> cleanup proof.
Whatever happens, the server is stopped and the run dir keeps what was received.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypedDict

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokrecord import __version__
from tokrecord.client import RowTrace, close_wire, stream_row
from tokrecord.client.limits import RowLimits
from tokrecord.engines import (
    Endpoint,
    Engine,
    EngineName,
    engine_for,
    fill_endpoint,
    infer_engine,
)
from tokrecord.errors import StreamError, TokrecordError
from tokrecord.evidence import JsonlWriter, RunDir, canonical_json, layout, read_jsonl
from tokrecord.evidence.redact import redact_argv, redact_env
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.gates import (
    EXACTNESS_RULE,
    EXACTNESS_RULE_V1,
    GATES_BY_NAME,
    GATES_VERSION,
    SCHEMA_GATES_PREFIX,
    GateConfig,
    GateResult,
    GateStatus,
    LegEvidence,
    RowOutcome,
    evaluate,
    leg_valid,
)
from tokrecord.gates.teacher import Teacher, TeacherRow
from tokrecord.jsontypes import JSONObject
from tokrecord.metrics import (
    Convention,
    EngineCounters,
    LegSummary,
    RowMetrics,
    engine_counters,
    parse_counters,
    row_metrics,
    summarize,
)
from tokrecord.metrics.logfacts import (
    LogExtractor,
    LogFactValue,
    extract_log_facts,
    merge_extractors,
)
from tokrecord.probes import ProbeSet, Snapshot, detect
from tokrecord.probes.covariates import LegCovariates, leg_covariates
from tokrecord.probes.hardware import cpu_model, os_name
from tokrecord.probes.hardware import describe as describe_hardware
from tokrecord.probes.idle import IdleCriteria, IdleResult, IdleTimeout, wait_idle
from tokrecord.probes.telemetry import (
    TelemetryConfig,
    TelemetrySampler,
    TelemetrySummary,
    read_samples,
    summarize_telemetry,
)
from tokrecord.server.process import (
    LEG_ENV,
    RUN_DIR_ENV,
    CleanupReport,
    PortHold,
    ServerProcess,
    render_argv,
)
from tokrecord.suite import Suite, SuiteRow

SCHEMA_SUMMARY = "tokrecord.leg-summary/v1"
# Rows v2 keep the ids a server gave around the ones it held back (gapped_token_ids);
# gates v2 compare those rows by them (gates.EXACTNESS_RULE). A v1 leg is verified by
# the rule it was sealed with.
SCHEMA_ROWS = "tokrecord.leg-rows/v2"
SCHEMA_CONFIG = "tokrecord.leg-config/v1"
# Gates v3: first_valid_score looks at the earlier attempts (gates.GATES_VERSION).
SCHEMA_GATES = f"{SCHEMA_GATES_PREFIX}{GATES_VERSION}"
SCHEMA_GATES_V1 = "tokrecord.leg-gates/v1"
SCHEMA_ROWS_V1 = "tokrecord.leg-rows/v1"
# Every recorded time comes from this clock; config.json and the record name it.
CLOCK_SOURCE = "time.perf_counter_ns (CLOCK_MONOTONIC)"


class ServerSpec(BaseModel):
    """How to start the server under test. `argv` may use {port}, {host}, {model}."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[str, ...] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    model: str  # filled into {model}: a path or a hub id
    served_model: str | None = None  # the id requests name; defaults to `model`
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port is chosen
    ready_timeout_s: float = Field(default=300.0, gt=0)
    stop_grace_s: float = Field(default=15.0, ge=0)
    metrics_path: str | None = "/metrics"

    @property
    def request_model(self) -> str:
        return self.served_model or self.model


class LegConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "leg"
    arm: str = "default"
    server: ServerSpec
    suite: Suite
    # None: inferred from the server's argv (config.json says it was inferred).
    engine: EngineName | None = None
    endpoint: Endpoint = Endpoint.COMPLETIONS
    headline: Convention = Convention.CONVENTIONAL
    request_extra: JSONObject = Field(default_factory=dict)  # merged into the wire body
    request_timeout_s: float = Field(default=600.0, gt=0)
    row_limits: RowLimits = Field(default_factory=RowLimits)
    gates: GateConfig = Field(default_factory=GateConfig)
    plan_sha256: str | None = None  # the preregistered plan this leg belongs to
    attempt: int = Field(default=1, ge=1)  # >1 only after an interrupted attempt
    idle: IdleCriteria = Field(default_factory=IdleCriteria)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    # Facts read from the server log on top of the engine's own defaults.
    log_facts: tuple[LogExtractor, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _engine_endpoint(cls, data: Any) -> Any:
        server = data.get("server") if isinstance(data, dict) else None
        argv = server.argv if isinstance(server, ServerSpec) else (
            server.get("argv") if isinstance(server, dict) else None)
        return fill_endpoint(data, argv)

    @property
    def engine_name(self) -> EngineName:
        return self.engine if self.engine is not None else infer_engine(self.server.argv)

    @property
    def adapter(self) -> Engine:
        return engine_for(self.engine_name)

    @property
    def extractors(self) -> tuple[LogExtractor, ...]:
        return merge_extractors(self.adapter.log_facts, self.log_facts)


class RowRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    trace: RowTrace
    metrics: RowMetrics

    @property
    def count_matches(self) -> bool:
        return self.trace.completion_tokens == self.trace.n_tokens


class LegStatus(StrEnum):
    """How a leg attempt ended (summary.json writes the value)."""

    COMPLETE = "complete"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class LegResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: str = Field(default=SCHEMA_SUMMARY, alias="schema")
    name: str
    arm: str
    status: LegStatus
    error: str | None
    suite_sha256: str
    rows_planned: int
    summary: LegSummary
    engine: EngineCounters | None
    ready_seconds: float | None
    wall_seconds: float
    cleanup: CleanupReport | None
    cleanup_passed: bool | None
    count_source: str | None
    rows_count_match: int
    rows_cached_zero: int
    rows_cached_reported: int
    teacher_sha256: str | None = None
    plan_sha256: str | None = None
    attempt: int = 1
    idle_before: IdleResult | None = None
    idle_after: IdleResult | None = None
    telemetry: TelemetrySummary | None = None
    gates: tuple[GateResult, ...] = ()
    valid: bool = False
    invalid_reasons: tuple[str, ...] = ()
    run_dir: str
    # Which engine served the leg, and what the running server said of its version.
    engine_name: EngineName | None = None
    engine_version: dict[str, str] | None = None
    # The engine's and the plan's log facts, as found in server.log.
    log_facts: tuple[LogFactValue, ...] = ()
    # What was going on around the leg (probes.covariates): diagnosis, never a gate.
    # Absent from summaries written before issue 33.
    covariates: LegCovariates | None = None


class LegObserver(Protocol):
    """Progress callbacks. The core never prints; a CLI view implements these."""

    def server_starting(self, argv: list[str], log_path: Path) -> None: ...
    def server_waiting(self, elapsed_s: float) -> None: ...
    def server_ready(self, seconds: float) -> None: ...
    def row_started(self, index: int, row: SuiteRow, total: int) -> None: ...
    def row_tokens(self, index: int, received: int, t_ns: int) -> None: ...
    def row_finished(self, index: int, record: RowRecord) -> None: ...
    def server_stopped(self, cleanup: CleanupReport) -> None: ...
    def idle_snapshot(self, phase: str, snap: Snapshot, reasons: list[str], run: int,
                      elapsed_s: float, criteria: IdleCriteria) -> None: ...
    def idle_finished(self, result: IdleResult) -> None: ...
    def server_exposed(self, listening: list[str]) -> None: ...


class NullObserver:
    def server_starting(self, argv: list[str], log_path: Path) -> None: ...
    def server_waiting(self, elapsed_s: float) -> None: ...
    def server_ready(self, seconds: float) -> None: ...
    def row_started(self, index: int, row: SuiteRow, total: int) -> None: ...
    def row_tokens(self, index: int, received: int, t_ns: int) -> None: ...
    def row_finished(self, index: int, record: RowRecord) -> None: ...
    def server_stopped(self, cleanup: CleanupReport) -> None: ...
    def idle_snapshot(self, phase: str, snap: Snapshot, reasons: list[str], run: int,
                      elapsed_s: float, criteria: IdleCriteria) -> None: ...
    def idle_finished(self, result: IdleResult) -> None: ...
    def server_exposed(self, listening: list[str]) -> None: ...


def _scrape(http: httpx.Client, path: str | None) -> str | None:
    if path is None:
        return None
    try:
        resp = http.get(path)
    except httpx.HTTPError as exc:
        raise StreamError(f"cannot scrape {path}: {exc}") from exc
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise StreamError(f"scraping {path} answered HTTP {resp.status_code}")
    return resp.text


def _redacted_leg(config: LegConfig) -> JSONObject:
    """The leg's configuration as evidence: secret-looking env values and flag values
    redacted (evidence.redact), their names kept."""
    leg = config.model_dump(mode="json", exclude={"suite"})
    leg["server"]["argv"] = redact_argv(leg["server"]["argv"])
    leg["server"]["env"] = redact_env(leg["server"]["env"])
    return leg


class _SuiteRef(TypedDict):
    name: str
    sha256: str
    rows: int


class _EngineRef(TypedDict):
    name: str
    inferred: bool


class _Client(TypedDict):
    python: str
    platform: str
    pid: int


class _Clock(TypedDict):
    source: str
    unit: str
    epoch_ns: str


class ConfigFile(TypedDict):
    """config.json: the leg as configured (secrets redacted) and as resolved."""

    schema: str
    tokrecord_version: str
    leg: JSONObject  # LegConfig's JSON form, redacted
    suite: _SuiteRef
    resolved_argv: list[str]
    engine: _EngineRef
    port: int
    client: _Client
    clock: _Clock


def _resolved_config(config: LegConfig, argv: list[str], port: int, epoch_ns: int
                     ) -> ConfigFile:
    return {
        "schema": SCHEMA_CONFIG,
        "tokrecord_version": __version__,
        "leg": _redacted_leg(config),
        "suite": {"name": config.suite.name, "sha256": config.suite.sha256,
                  "rows": len(config.suite.rows)},
        "resolved_argv": redact_argv(argv),
        "engine": {"name": config.engine_name.value, "inferred": config.engine is None},
        "port": port,
        "client": {"python": sys.version.split()[0], "platform": platform.platform(),
                   "pid": os.getpid()},
        "clock": {"source": CLOCK_SOURCE, "unit": "ns since epoch", "epoch_ns": str(epoch_ns)},
    }


def compute_leg(
    rows: list[RowRecord],
    config: LegConfig,
    before: Mapping[str, float] | None,
    after: Mapping[str, float] | None,
) -> tuple[LegSummary, EngineCounters | None]:
    """The pure part: figures from recorded rows and counter scrapes."""
    summary = summarize([r.metrics for r in rows], config.headline)
    engine = None
    if after is not None:
        decode_s = [
            (r.trace.chunks[-1].t_ns - r.trace.chunks[0].t_ns) / 1e9
            for r in rows if r.trace.chunks
        ]
        engine = engine_counters(before or {}, after, decode_s, config.adapter.metrics)
    return summary, engine


def leg_telemetry(records: list[RowRecord], config: LegConfig, summary: LegSummary,
                  samples: list[JSONObject]) -> TelemetrySummary | None:
    """Power and energy over the suite window: first request sent to last byte."""
    if not config.telemetry.enabled:
        return None
    window = None
    if records:
        window = (min(r.trace.t_send_ns for r in records), max(r.trace.t_end_ns for r in records))
    return summarize_telemetry(
        samples, interval_s=config.telemetry.interval_s, window_ns=window,
        output_tokens=sum(r.trace.n_tokens for r in records), headline_tok_s=summary.tok_s_out)


def covariates_of(records: list[RowRecord], samples: list[JSONObject],
                  idle_before: list[JSONObject], ready_s: float | None) -> LegCovariates:
    """The leg's covariates over the same suite window as its telemetry summary."""
    window = None
    if records:
        window = (min(r.trace.t_send_ns for r in records), max(r.trace.t_end_ns for r in records))
    first = records[0].metrics.ttft_ms if records else None
    return leg_covariates(samples, window, idle_before=idle_before, ready_s=ready_s,
                          first_ttft_ms=first)


def idle_snapshots(path: Path) -> list[JSONObject]:
    """An idle gate's kept snapshots; none when it kept no file."""
    return read_jsonl(path, skip_torn=True) if path.exists() else []


@dataclass(frozen=True)
class LegInputs:
    """What a leg's results are derived from: its evidence as recorded. The writer has it
    in memory; verify reads it back from the sealed files (and replays the rows)."""

    records: list[RowRecord]
    config: LegConfig
    metrics_before: Mapping[str, float] | None
    metrics_after: Mapping[str, float] | None
    events: Sequence[Mapping[str, Any]]  # events.jsonl's lines
    server_log: str
    telemetry: list[JSONObject]  # the sampler's rows (telemetry.jsonl)
    cleanup: CleanupReport | None
    teacher: Teacher | None
    idle: Mapping[str, IdleResult | None]
    # The idle gate's snapshots before the leg; None: the leg recorded no covariates.
    idle_before_snapshots: list[JSONObject] | None
    ready_seconds: float | None
    earlier_attempts: tuple[str | None, ...]
    # False for a leg sealed before the probes (record.migrate.leg_has_probes): it has
    # no idle gates and no telemetry summary to derive.
    probes: bool = True
    # The teacher-exact rule and the gates file's version the leg was sealed with.
    rule: int = EXACTNESS_RULE
    version: int = 0


@dataclass(frozen=True)
class LegDerived:
    """Everything a leg's result files hold that is computed from its evidence."""

    summary: LegSummary
    engine: EngineCounters | None
    telemetry: TelemetrySummary | None
    gates: tuple[GateResult, ...]
    log_facts: tuple[LogFactValue, ...]
    covariates: LegCovariates | None


def derive_leg(ev: LegInputs) -> LegDerived:
    """The one derivation of a leg's results: _write_results writes what it returns, and
    verify calls it again over the sealed evidence and compares (STYLE 15)."""
    summary, engine = compute_leg(ev.records, ev.config, ev.metrics_before, ev.metrics_after)
    gates = evaluate_gates(
        ev.records, ev.config, engine, ev.cleanup, ev.teacher,
        requests=[dict(e) for e in ev.events if e.get("kind") == "request"],
        metrics_before=ev.metrics_before, server_log=ev.server_log,
        idle=ev.idle if ev.probes else None, rule=ev.rule, version=ev.version,
        earlier_attempts=ev.earlier_attempts, telemetry=ev.telemetry)
    covariates = None
    if ev.idle_before_snapshots is not None:
        covariates = covariates_of(ev.records, ev.telemetry, ev.idle_before_snapshots,
                                   ev.ready_seconds)
    return LegDerived(
        summary=summary, engine=engine,
        telemetry=leg_telemetry(ev.records, ev.config, summary, ev.telemetry)
        if ev.probes else None,
        gates=tuple(gates),
        log_facts=tuple(extract_log_facts(ev.server_log, ev.config.extractors)),
        covariates=covariates)


def _idle_gate(run: RunDir, probes: ProbeSet, criteria: IdleCriteria, phase: str,
               obs: LegObserver) -> IdleResult:
    """One idle gate, every snapshot kept in idle-<phase>.jsonl as it is taken."""
    log = run.jsonl(layout.idle_log(phase))

    def keep(snap: Snapshot, reasons: list[str], run_len: int, elapsed: float) -> None:
        log.write({**snap.as_json(), "busy": reasons,
                   "consecutive_idle": run_len, "elapsed_s": round(elapsed, 3)})
        obs.idle_snapshot(phase, snap, reasons, run_len, elapsed, criteria)

    try:
        result = wait_idle(probes.snapshot, criteria, phase, on_snapshot=keep)
    finally:
        log.close()
    obs.idle_finished(result)
    return result


def run_leg(
    config: LegConfig,
    out: Path,
    observer: LegObserver | None = None,
    *,
    teacher: Teacher | None = None,
    http_factory: Callable[[str, float], httpx.Client] | None = None,
    probes: ProbeSet | None = None,
) -> LegResult:
    obs: LegObserver = observer or NullObserver()
    run = RunDir.create(out)
    # Detected once per leg: a note (no NVML, no RAPL) is evidence too.
    probe_set = probes if probes is not None else detect()
    spec = config.server
    # A port the plan leaves open is chosen now and held until the server starts.
    hold = None if spec.port else PortHold(spec.host)
    port = spec.port or (hold.port if hold is not None else 0)
    argv = render_argv(spec.argv, {"port": str(port), "host": spec.host, "model": spec.model})
    # The leg's clock: every recorded time is nanoseconds since this instant.
    epoch_ns = time.perf_counter_ns()
    _write_inputs(run, config, argv, port, epoch_ns)
    events = run.jsonl(layout.EVENTS)
    raw_fd = run.raw_fd(layout.RAW_READS)
    leg = _Leg(run, config, obs, probe_set, _leg_server(run, config, argv, port, hold), events,
               raw_fd, epoch_ns, argv, port)
    st = _LegState(t0=time.monotonic())
    make_http = http_factory or (
        # verify=False: the server's base URL is plain http (ServerProcess.base_url), so no
        # CA bundle to load (20 ms of CPU a client).
        lambda base, timeout: httpx.Client(base_url=base, verify=False,
                                           timeout=httpx.Timeout(timeout, connect=10.0))
    )
    try:
        _start_and_stream(leg, st, make_http)
        st.status = "complete"
    except KeyboardInterrupt:
        st.status, st.error = "interrupted", "interrupted by the user (Ctrl-C or SIGTERM)"
        raise
    except TokrecordError as exc:
        st.error = str(exc)
        raise
    except BaseException as exc:
        st.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        leg.server.release_hold()
        _end_leg(leg, st, teacher)
    return _write_results(run, config, st, teacher)


@dataclass(frozen=True)
class _Leg:
    """What one leg works with from start to end (its state is _LegState)."""

    run: RunDir
    config: LegConfig
    obs: LegObserver
    probe_set: ProbeSet
    server: ServerProcess
    events: JsonlWriter
    raw_fd: int
    epoch_ns: int
    argv: list[str]
    port: int


def _leg_server(run: RunDir, config: LegConfig, argv: list[str], port: int,
                hold: PortHold | None) -> ServerProcess:
    # The leg's name goes to the server as TOKRECORD_LEG: a wrapper script (or the fake
    # server's seeded leg jitter) may use it; nothing else is added to the arm's env.
    spec = config.server
    return ServerProcess(argv, port=port, host=spec.host, log_path=run.file(layout.SERVER_LOG),
                         env={**spec.env, LEG_ENV: config.name,
                              RUN_DIR_ENV: str(run.path.resolve())},
                         stop_grace_s=spec.stop_grace_s, hold=hold)


def _start_and_stream(leg: _Leg, st: _LegState,
                      make_http: Callable[[str, float], httpx.Client]) -> None:
    """The leg's own steps: the machine's facts, the idle gate, the sampler, the server
    started to readiness, then every row."""
    run, config, obs, server = leg.run, leg.config, leg.obs, leg.server
    spec = config.server
    run.write_json(layout.PROBES, {"backends": leg.probe_set.backends,
                                   "notes": leg.probe_set.notes})
    run.write_json(layout.HARDWARE, describe_hardware(
        leg.probe_set.snapshot(), cpu=cpu_model(), os=os_name()))
    st.idle["before"] = before_gate = _idle_gate(run, leg.probe_set, config.idle, "before", obs)
    if not before_gate.passed:
        raise IdleTimeout(
            f"the machine did not become idle within {config.idle.timeout_s:g} s "
            f"({before_gate.snapshots} snapshots): {before_gate.reason}; the leg did not start")
    if config.telemetry.enabled:
        st.sampler = TelemetrySampler(run.file(layout.TELEMETRY), config.telemetry.interval_s,
                                      leg.epoch_ns)
        st.sampler.wait_first()
    obs.server_starting(leg.argv, run.file(layout.SERVER_LOG))
    server.start()
    st.started = True
    # So a later resume can find (and stop) a server orphaned by a hard kill.
    run.write_json(layout.SERVER_INFO, {"pid": server.pid, "pgid": server.pid, "port": leg.port,
                                        "argv": redact_argv(leg.argv),
                                        "create_time": server.create_time})
    st.ready_s = server.wait_ready(spec.ready_timeout_s, model=spec.request_model,
                                   on_poll=obs.server_waiting, engine=config.adapter)
    obs.server_ready(st.ready_s)
    listening = server.exposed()
    if listening:
        obs.server_exposed(listening)
    with make_http(server.base_url, config.request_timeout_s) as http:
        try:
            st.version = _engine_version(http, config.adapter)
            _stream_suite(http, run, config, leg.events, obs, leg.epoch_ns, st, leg.raw_fd)
        finally:
            close_wire(http)  # the rows' own connection, before the server stops


def _end_leg(leg: _Leg, st: _LegState, teacher: Teacher | None) -> None:
    """Each step runs whatever the one before it did (a full disk can fail any write):
    the server is stopped and the sampler ended in every case. The first error of a leg
    that had none so far is raised after all of them."""
    run, config, obs = leg.run, leg.config, leg.obs
    late: list[BaseException] = []

    def step(action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as exc:
            late.append(exc)

    if st.started:
        cleanup = st.cleanup = leg.server.stop()
        obs.server_stopped(cleanup)
        step(lambda: run.write_json(layout.CLEANUP, {**cleanup.model_dump(mode="json"),
                                                     "passed": cleanup.passed}))
    if st.sampler is not None:
        st.sampler_problem = st.sampler.stop()
    if st.started and st.status != "interrupted":
        # After an interrupt the user wants out, not a minute of sampling.
        def after() -> None:
            with contextlib.suppress(TokrecordError):
                st.idle["after"] = _idle_gate(run, leg.probe_set, config.idle, "after", obs)
        step(after)
    leg.probe_set.close()
    if st.idle["before"] is not None:
        step(lambda: run.write_json(layout.IDLE, {
            phase: r.model_dump(mode="json") if r else None for phase, r in st.idle.items()}))
    step(leg.events.close)
    os.close(leg.raw_fd)
    if st.status != "complete":
        # The original error is what the user needs; a second one here must not hide it.
        with contextlib.suppress(Exception):
            _write_results(run, config, st, teacher)
    elif late:
        raise late[0]


@dataclass
class _LegState:
    """What a leg has gathered so far; results are written from it whatever happened."""

    t0: float
    records: list[RowRecord] = field(default_factory=list)
    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    ready_s: float | None = None
    status: str = "failed"
    error: str | None = None
    cleanup: CleanupReport | None = None
    sampler_problem: str | None = None
    version: dict[str, str] | None = None
    idle: dict[str, IdleResult | None] = field(
        default_factory=lambda: {"before": None, "after": None})
    started: bool = False  # the server was started: it must be stopped
    sampler: TelemetrySampler | None = None


def _write_inputs(run: RunDir, config: LegConfig, argv: list[str], port: int,
                  epoch_ns: int) -> None:
    run.write_json(layout.CONFIG, _resolved_config(config, argv, port, epoch_ns))
    run.write_bytes(
        layout.SUITE, b"".join(canonical_json(r.model_dump()) + b"\n" for r in config.suite.rows)
    )


def _stream_suite(http: httpx.Client, run: RunDir, config: LegConfig, events: JsonlWriter,
                  obs: LegObserver, epoch_ns: int, st: _LegState, raw_fd: int | None = None
                  ) -> None:
    """The engine's counters before, every row of the suite once, the counters after."""
    spec, engine = config.server, config.adapter
    text = _scrape(http, spec.metrics_path)
    if text is not None:
        run.write_text(layout.METRICS_BEFORE, text)
        st.before = parse_counters(text)
    total = len(config.suite.rows)
    for i, row in enumerate(config.suite.rows):
        obs.row_started(i, row, total)
        body = engine.build_body(config.endpoint, spec.request_model, row, config.request_extra)
        trace = stream_row(
            http, row_index=i, row=row, body=body, endpoint=config.endpoint,
            sink=events, on_tokens=lambda n, t, i=i: obs.row_tokens(i, n, t),  # type: ignore[misc]
            epoch_ns=epoch_ns, engine=engine, raw_fd=raw_fd, limits=config.row_limits,
        )
        record = RowRecord(trace=trace, metrics=row_metrics(trace.t_send_ns, trace.chunks))
        st.records.append(record)
        obs.row_finished(i, record)
    text = _scrape(http, spec.metrics_path)
    if text is not None:
        run.write_text(layout.METRICS_AFTER, text)
        st.after = parse_counters(text)


def _engine_version(http: httpx.Client, engine: Engine) -> dict[str, str] | None:
    """What the server says of its version (None: it has no such path, or no answer)."""
    if engine.version_path is None:
        return None
    try:
        resp = http.get(engine.version_path)
        return engine.version_facts(resp.json()) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _write_results(run: RunDir, config: LegConfig, st: _LegState,
                   teacher: Teacher | None) -> LegResult:
    records, cleanup, idle = st.records, st.cleanup, st.idle
    server_log = (run.file(layout.SERVER_LOG).read_text(errors="replace")
                  if run.file(layout.SERVER_LOG).exists() else "")
    derived = derive_leg(LegInputs(
        records=records, config=config, metrics_before=st.before, metrics_after=st.after,
        events=read_jsonl(run.file(layout.EVENTS)), server_log=server_log,
        telemetry=read_samples(run.file(layout.TELEMETRY))[0], cleanup=cleanup,
        teacher=teacher, idle=idle,
        idle_before_snapshots=idle_snapshots(run.file(layout.IDLE_BEFORE)),
        ready_seconds=st.ready_s, earlier_attempts=earlier_attempts(run.path)))
    summary, engine, gates, telemetry = (derived.summary, derived.engine, derived.gates,
                                         derived.telemetry)
    if telemetry is not None:
        if st.sampler_problem:
            telemetry = telemetry.model_copy(update={"notes": (*telemetry.notes,
                                                               st.sampler_problem)})
        run.write_json(layout.TELEMETRY_SUMMARY, telemetry.model_dump(mode="json", by_alias=True))
    if teacher is not None:
        run.write_json(layout.LEG_TEACHER, teacher.to_json())
    valid, invalid = leg_valid(list(gates))
    if st.status != "complete":
        valid, invalid = False, [f"leg {st.status}", *invalid]
    result = LegResult(
        name=config.name, arm=config.arm, status=LegStatus(st.status), error=st.error,
        suite_sha256=config.suite.sha256, rows_planned=len(config.suite.rows),
        summary=summary, engine=engine, ready_seconds=st.ready_s,
        wall_seconds=round(time.monotonic() - st.t0, 3), cleanup=cleanup,
        cleanup_passed=cleanup.passed if cleanup else None,
        count_source=records[0].trace.count_source.value if records else None,
        rows_count_match=sum(1 for r in records if r.count_matches),
        rows_cached_zero=sum(1 for r in records if r.trace.cached_tokens == 0),
        rows_cached_reported=sum(1 for r in records if r.trace.cached_tokens is not None),
        teacher_sha256=teacher.sha256 if teacher is not None else None,
        plan_sha256=config.plan_sha256, attempt=config.attempt,
        idle_before=idle.get("before"), idle_after=idle.get("after"), telemetry=telemetry,
        gates=gates, valid=valid, invalid_reasons=tuple(invalid),
        run_dir=str(run.path), engine_name=config.engine_name, engine_version=st.version,
        log_facts=derived.log_facts, covariates=derived.covariates,
    )
    run.write_json(layout.GATES, {"schema": SCHEMA_GATES, "valid": valid,
                                  "gates": [g.model_dump(mode="json") for g in gates]})
    run.write_json(layout.ROWS, {"schema": SCHEMA_ROWS,
                                 "rows": [r.model_dump(mode="json") for r in records]})
    run.write_json(layout.SUMMARY, result.model_dump(mode="json", by_alias=True))
    if st.error is not None:
        run.write_json(layout.ERROR, {"status": st.status, "error": st.error,
                                      "rows_completed": len(records)})
    return result


def outcomes(records: list[RowRecord], config: LegConfig) -> list[RowOutcome]:
    return [
        RowOutcome(
            row=r.trace.row, row_id=r.trace.row_id, prompt_sha256=r.trace.prompt_sha256,
            max_tokens=config.suite.rows[r.trace.row].max_tokens, token_ids=r.trace.token_ids,
            text=r.trace.text, finish_reason=r.trace.finish_reason, n_tokens=r.trace.n_tokens,
            completion_tokens=r.trace.completion_tokens, prompt_tokens=r.trace.prompt_tokens,
            cached_tokens=r.trace.cached_tokens, t_send_ns=r.trace.t_send_ns,
            t_end_ns=r.trace.t_end_ns, gapped_token_ids=r.trace.gapped_token_ids,
        )
        for r in records
    ]


def evaluate_gates(
    records: list[RowRecord],
    config: LegConfig,
    engine: EngineCounters | None,
    cleanup: CleanupReport | None,
    teacher: Teacher | None,
    *,
    requests: list[JSONObject],
    metrics_before: Mapping[str, float] | None,
    server_log: str,
    idle: Mapping[str, IdleResult | None] | None,
    rule: int = EXACTNESS_RULE,
    version: int = 0,
    earlier_attempts: tuple[str | None, ...] = (),
    telemetry: list[JSONObject] | None = None,
) -> list[GateResult]:
    """Every quality gate of one leg, from what the leg recorded (the registry,
    gates.GATES, says which). `idle` None: the evidence predates idle gates (verifying
    an older record), so there are none. `rule`: the teacher-exact rule the leg's gates
    were written with (gates_rule); `version`: their file's version (0: current)."""
    adapter = config.adapter
    evidence = LegEvidence(
        outcomes=tuple(outcomes(records, config)), teacher=teacher, config=config.gates,
        planned_rows=len(config.suite.rows), requests=tuple(requests),
        metrics_before=metrics_before, server_log=server_log,
        prefix_cache_hits=engine.prefix_cache_hits if engine else None,
        prefix_cache_queries=engine.prefix_cache_queries if engine else None,
        cached_tokens_hint=adapter.cached_tokens_hint,
        generation_counters=adapter.metrics.generation, generation_line=adapter.generation_line,
        cleanup_passed=cleanup.passed if cleanup else None,
        surviving_workers=cleanup.surviving_workers if cleanup else None,
        port_listening_after=cleanup.port_listening_after if cleanup else None,
        idle=idle, attempt=config.attempt, earlier_attempts=earlier_attempts,
        telemetry=tuple(telemetry or ()), rule=rule, version=version)
    return [_engine_limits(g, adapter) for g in evaluate(evidence)]


def earlier_attempts(run_dir: Path) -> tuple[str | None, ...]:
    """The recorded status of each attempt of this leg before `run_dir` (none for a
    run directory that is not an `attempt-N`)."""
    n = layout.attempt_number(run_dir)
    if n is None:
        return ()
    return tuple(layout.summary_status(p) for p in layout.attempts(run_dir.parent)
                 if (layout.attempt_number(p) or 0) < n)


def _engine_limits(gate: GateResult, engine: Engine) -> GateResult:
    """A gate the engine cannot support says why, in the engine's words."""
    spec = GATES_BY_NAME.get(gate.name)
    reason = engine.limitation(spec.needs if spec is not None else None)
    if reason is None or gate.status is not GateStatus.NOT_TESTED:
        return gate
    return gate.model_copy(update={"reason": reason})


def gates_rule(schema: object) -> int:
    """The teacher-exact rule of a leg whose gates.json (or rows.json) has this schema."""
    return EXACTNESS_RULE_V1 if schema in (SCHEMA_GATES_V1, SCHEMA_ROWS_V1) else EXACTNESS_RULE


def rows_rule(run_dir: Path) -> int:
    """The teacher-exact rule a leg's rows were recorded for (rows.json's schema)."""
    data = json.loads((run_dir / layout.ROWS).read_text(encoding="utf-8"))
    return gates_rule(data.get("schema"))


def load_rows(run_dir: Path) -> list[RowRecord]:
    data = json.loads((run_dir / layout.ROWS).read_text(encoding="utf-8"))
    return [RowRecord.model_validate(r) for r in data["rows"]]


def teacher_from_run(
    run_dir: Path, config: LegConfig, model_manifest: dict[str, str] | None
) -> Teacher:
    """A teacher from a complete leg's recorded rows."""
    records = load_rows(run_dir)
    if len(records) != len(config.suite.rows):
        raise TokrecordError(
            f"cannot capture a teacher from {run_dir}: {len(records)} of "
            f"{len(config.suite.rows)} rows completed"
        )
    return Teacher(
        created_utc=utc_stamp(Stamp.SECONDS),
        suite_name=config.suite.name,
        suite_sha256=config.suite.sha256,
        model=config.server.model,
        model_manifest=model_manifest,
        arm={"name": config.arm, "argv": redact_argv(config.server.argv),
             "env": redact_env(config.server.env)},
        source_run=str(run_dir),
        rows=tuple(
            TeacherRow(
                row=r.trace.row, row_id=r.trace.row_id, prompt_sha256=r.trace.prompt_sha256,
                token_ids=r.trace.token_ids, text=r.trace.text,
                finish_reason=r.trace.finish_reason, n_tokens=r.trace.n_tokens,
                compare_by="token_ids" if r.trace.token_ids is not None else "text",
                gapped_token_ids=r.trace.gapped_token_ids,
            )
            for r in records
        ),
    )
