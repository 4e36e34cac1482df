"""Terminal views: progress on stderr while a leg runs, the summary table on stdout."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.status import Status
from rich.table import Table

from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import LegResult, RowRecord
from tokrecord.experiment.stats import RecordGate
from tokrecord.gates import (
    CLEANUP,
    GATES,
    GATES_BY_NAME,
    TEACHER_EXACT,
    TOKEN_COUNT_INTEGRITY,
    GateStatus,
)
from tokrecord.metrics.rows import ROW_FLAGS
from tokrecord.probes import Snapshot
from tokrecord.probes.idle import IdleCriteria, IdleResult
from tokrecord.record.schema import (
    AbbaRecord,
    ExperimentRecord,
    ExperimentRecordV3,
    GateSummary,
    LegOperational,
    SingleLegRecord,
    validate_record,
)
from tokrecord.report import fmt as report_fmt
from tokrecord.report.derive import analysis_view, pair_names, power_view, record_design
from tokrecord.report.sweep import sweep_looks_lines, sweep_rows, sweep_statement
from tokrecord.report.text import (
    interval_text,
    noise_text,
    power_text,
    record_interval_text,
    sweep_table,
)
from tokrecord.server.process import CleanupReport, log_tail
from tokrecord.suite import SuiteRow


def fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


class RichLegObserver:
    """One line per event, and a throttled live status line while a row streams."""

    def __init__(self, console: Console, *, show_log_tail: bool = False) -> None:
        self.console = console
        self.show_log_tail = show_log_tail
        self._log_path: Path | None = None
        self._last_tail_at = -1.0
        self._row_t0 = 0
        self._status = console.status("")
        self._live = False
        self._total = 0
        self._row_id = ""
        self._next_update = 0
        self._explained: set[str] = set()

    def server_starting(self, argv: list[str], log_path: Path) -> None:
        self._log_path = log_path
        self.console.print(f"[bold]starting server[/]: {escape(' '.join(argv))}")
        self.console.print(f"  log: {escape(str(log_path))}")
        self._status.update("waiting for the server to become ready…")
        self._status.start()
        self._live = True

    def server_waiting(self, elapsed_s: float) -> None:
        self._status.update(f"waiting for the server to become ready… {elapsed_s:.0f} s")
        if self.show_log_tail and self._log_path and elapsed_s - self._last_tail_at >= 15:
            self._last_tail_at = elapsed_s
            self.console.print(log_tail(self._log_path, 3))

    def server_ready(self, seconds: float) -> None:
        self.console.print(
            f"server ready in {seconds:.1f} s (health and model list only; no warmup)"
        )

    def server_exposed(self, listening: list[str]) -> None:
        self.console.print(
            f"warning: the server listens beyond loopback, on {', '.join(listening)}: anyone "
            "on the network can reach it (give the server --host {host}; the leg's host is "
            "loopback)", style="yellow", markup=False, highlight=False)

    def row_started(self, index: int, row: SuiteRow, total: int) -> None:
        self._total, self._row_id = total, row.id
        self._row_t0 = time.perf_counter_ns()
        self._next_update = 0
        self._status.update(f"row {index + 1}/{total} {row.id}: waiting for the first token")

    def row_tokens(self, index: int, received: int, t_ns: int) -> None:
        # Called from the token loop: a comparison unless a redraw is due.
        if received < self._next_update:
            return
        self._next_update = received + 32
        secs = (time.perf_counter_ns() - self._row_t0) / 1e9  # t_ns is on the leg's clock
        rate = received / secs if secs > 0 else 0.0
        self._status.update(
            f"row {index + 1}/{self._total} {self._row_id}: {received} tokens, "
            f"{rate:,.1f} tok/s since send"
        )

    def row_finished(self, index: int, record: RowRecord) -> None:
        m = record.metrics
        flags = f" [yellow]{','.join(m.flags)}[/]" if m.flags else ""
        self.console.print(
            f"  {index + 1:>2}/{self._total} {escape(record.trace.row_id[:20]):<20} "
            f"{m.n_tokens:>4} tok ttft {fmt(m.ttft_ms, 1):>7} ms "
            f"{fmt(m.rate_conventional, 1):>9} tok/s {record.trace.finish_reason}{flags}"
        )
        for line in flag_notes(m.flags, self._explained):
            self.console.print(f"[dim]{escape(line)}[/]")

    def server_stopped(self, cleanup: CleanupReport) -> None:
        if self._live:
            self._status.stop()
            self._live = False
        verdict = "[green]clean[/]" if cleanup.passed else "[red]NOT CLEAN[/]"
        how = "SIGKILL" if cleanup.sigkill_sent else "SIGTERM"
        port = "still listening" if cleanup.port_listening_after else "closed"
        self.console.print(
            f"server stopped in {cleanup.stop_seconds:.1f} s ({how}): {verdict}, "
            f"{cleanup.surviving_workers} surviving processes, port {cleanup.port} {port}"
        )

    def idle_snapshot(self, phase: str, snap: Snapshot, reasons: list[str], run: int,
                      elapsed_s: float, criteria: IdleCriteria) -> None:
        busy = f"busy: {escape(reasons[0])}" if reasons else "idle"
        line = (f"idle gate ({phase}): {run}/{criteria.consecutive} consecutive idle, "
                f"{elapsed_s:.0f}/{criteria.timeout_s:g} s; {busy}")
        if not self._live:
            self._status.start()
            self._live = True
        self._status.update(line)

    def idle_finished(self, result: IdleResult) -> None:
        if self._live:
            self._status.stop()
            self._live = False
        if result.skipped:
            self.console.print(f"idle gate ({result.phase}): [yellow]switched off[/] by the criteria")
        elif result.passed:
            self.console.print(f"idle gate ({result.phase}): [green]idle[/] after "
                               f"{result.seconds:.1f} s, {result.snapshots} snapshots")
        else:
            self.console.print(f"idle gate ({result.phase}): [red]NOT IDLE[/] after "
                               f"{result.seconds:.1f} s: {escape(result.reason or '')}")


UNKNOWN_FLAG = "a row flag (README: Metrics)"


def flag_notes(flags: tuple[str, ...], explained: set[str]) -> list[str]:
    """One line for each row flag not explained yet (explained is updated)."""
    new = [f for f in flags if f not in explained]
    explained.update(new)
    return [f"       {f}: {ROW_FLAGS.get(f, UNKNOWN_FLAG)}" for f in new]


def summary_table(result: LegResult) -> Table:
    s = result.summary
    table = Table(title=f"leg {result.name} ({result.arm}): {result.status}", show_header=False)
    table.add_column("figure", style="bold", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("note")
    table.add_row("tok_s_out (median, 1..100)", fmt(s.tok_s_out),
                  f"headline: {s.headline_convention.value}")
    table.add_row("  conventional", fmt(s.tok_s_out_conventional), "99/(t100-t1)")
    table.add_row("  legacy", fmt(s.tok_s_out_legacy), "100/(t100-t1)")
    bound = s.quantisation_bound_pct_max
    table.add_row("  chunk-aware", fmt(s.tok_s_out_chunk_aware),
                  f"per-token forms ±{fmt(bound)} % (chunks)" if bound else "one token per chunk")
    table.add_row("p10", fmt(s.tok_s_out_p10), "tok/s, linear interpolation")
    table.add_row("mean / stdev", f"{fmt(s.tok_s_out_mean)} / {fmt(s.tok_s_out_stdev)}",
                  "tok/s, sample stdev")
    table.add_row("full after TTFT", fmt(s.tok_s_full_after_ttft_median), "median, tok/s")
    table.add_row("wall full", fmt(s.tok_s_wall_full_median), "median, tok/s")
    table.add_row("TTFT", fmt(s.ttft_ms_median), "median, ms")
    table.add_row("rows", f"{s.rows}/{result.rows_planned}",
                  f"{s.rows_short} short, {s.rows - s.rows_rated} unrated")
    table.add_row("output tokens", str(s.output_tokens_total),
                  f"from {result.count_source or '—'}")
    table.add_row("reported = received", f"{result.rows_count_match}/{s.rows}", "completion tokens")
    cached = (f"{result.rows_cached_zero}/{s.rows}" if result.rows_cached_reported
              else "not reported")
    table.add_row("cached tokens zero", cached, "usage, per row")
    e = result.engine
    if e is not None:
        if e.draft_cycles:
            table.add_row("drafts: cycles/tokens/acc",
                          f"{e.draft_cycles}/{e.draft_tokens}/{e.accepted_draft_tokens}", "")
            table.add_row("acceptance rate", fmt(e.draft_acceptance_rate, 4), "accepted/draft")
            table.add_row("emitted per cycle", fmt(e.emitted_tokens_per_draft_cycle, 3), "")
            table.add_row("aggregate cycle", fmt(e.aggregate_cycle_ms, 3), "ms")
        table.add_row("prefix cache hits/queries",
                      f"{e.prefix_cache_hits}/{e.prefix_cache_queries}", "engine counters")
    table.add_row("server ready", fmt(result.ready_seconds, 1), "s, no warmup request")
    c = result.cleanup
    if c is not None:
        port = "open" if c.port_listening_after else "closed"
        table.add_row(GATES_BY_NAME[CLEANUP].label, "pass" if c.passed else "FAIL",
                      f"{c.surviving_workers} survivors, port {port}")
    for r in (result.idle_before, result.idle_after):
        if r is not None:
            table.add_row(f"idle {r.phase}", "off" if r.skipped else "pass" if r.passed else "FAIL",
                          f"{r.seconds:.1f} s, {r.snapshots} snapshots")
    t = result.telemetry
    if t is not None:
        if t.energy_j is not None:
            table.add_row("power / energy", f"{fmt(t.power_w_mean, 1)} W / {fmt(t.energy_j, 1)} J",
                          f"{t.power_source}, {t.energy_method}, suite window")
            table.add_row("J per output token", fmt(t.joules_per_output_token, 4),
                          f"{fmt(t.tok_s_per_watt, 3)} tok/s per W")
        else:
            table.add_row("power / energy", "—", "; ".join(t.notes))
        table.add_row("host CPU", fmt(t.host_cpu_util_pct_mean, 0),
                      f"% mean over the suite, {t.samples_in_window} samples")
    table.add_row("wall time", fmt(result.wall_seconds, 1), "s")
    return table


def print_leg(out: Console, err: Console, result: LegResult) -> None:
    """Results to stdout; warnings (with advice) to stderr."""
    out.print(summary_table(result))
    out.print(f"run dir: {escape(result.run_dir)}", soft_wrap=True)
    for warning in result.summary.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")


_STATUS_STYLE: dict[str, str] = {GateStatus.PASS: "green", GateStatus.FAIL: "bold red",
                                 GateStatus.NOT_TESTED: "yellow", "n/t": "yellow"}
# Short terminal labels; gates.json keeps the full names.
_LABELS = {g.name: g.label for g in GATES}


def gates_table(result: LegResult) -> Table:
    verdict = "VALID" if result.valid else "NOT VALID"
    table = Table(title=f"quality gates: leg {verdict}", box=None, padding=(0, 1))
    table.add_column("gate", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("evidence")
    for gate in result.gates:
        style = _STATUS_STYLE.get(gate.status.value, "")
        label = _LABELS.get(gate.name, gate.name)
        name = label if gate.required else f"{label}*"
        table.add_row(name, f"[{style}]{gate.status.value}[/]", gate.count or "",
                      escape(gate.reason))
    return table


def print_gates(out: Console, result: LegResult) -> None:
    if not result.gates:
        return
    out.print(gates_table(result))
    out.print("  * optional: may be not tested; a failure still invalidates the leg")
    if not result.valid:
        out.print("[bold red]leg not valid:[/] " + escape("; ".join(result.invalid_reasons)))


class _Countdown:
    """A status text that computes the time left each time it is drawn."""

    def __init__(self, label: str, seconds: float) -> None:
        self.label = label
        self.deadline = time.monotonic() + seconds

    def __rich__(self) -> str:
        return f"{escape(self.label)}: {max(0.0, self.deadline - time.monotonic()):.0f} s left"


class RichExperimentObserver(RichLegObserver):
    """Leg headers, idle gaps and kept legs on top of the per-leg progress."""

    _idle_wait: Status | None = None

    def leg_starting(self, name: str, arm: str, attempt: int, index: int, total: int) -> None:
        self._end_idle_wait()
        again = f", attempt {attempt} (earlier attempts interrupted)" if attempt > 1 else ""
        which = "teacher capture" if name == "teacher" else f"leg {index}/{total}"
        self.console.rule(f"[bold]{which}: {name} ({arm}){again}")

    def leg_kept(self, name: str, result: LegResult) -> None:
        self.console.print(f"leg {name}: complete earlier, kept "
                           f"({fmt(result.summary.tok_s_out)} tok/s) — {escape(result.run_dir)}")

    def idle_wait(self, before: str, seconds: float) -> None:
        self.console.print(f"idle gap before {before}: waiting {seconds:.1f} s")
        # The runner sleeps in one call; the status redraws itself, so the countdown moves.
        self._idle_wait = self.console.status(_Countdown(f"idle gap before {before}", seconds))
        self._idle_wait.start()

    def _end_idle_wait(self) -> None:
        if self._idle_wait is not None:
            self._idle_wait.stop()
            self._idle_wait = None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f} %"


def experiment_tables(record: AbbaRecord) -> list[Table]:
    legs = [name for name in record.protocol.leg_names() if name in record.runs_by_name()]
    by_text = sum(_rows_by_text(leg) for leg in record.runs_by_name().values())
    # A sweep has no pairs (its arms share one fit): its own table is printed instead.
    pairs = [] if _is_sweep(record) else [_pairs_table(record)]
    return [_runs_table(record, legs), _gates_matrix(record, legs), *pairs,
            _quality_table(record, by_text), _record_gate_table(record.record_gate)]


def _is_sweep(record: AbbaRecord) -> bool:
    return isinstance(record, ExperimentRecordV3) and record.sweep is not None


def _runs_table(record: AbbaRecord, legs: list[str]) -> Table:
    design, blocks = record_design(record)
    # v1 records keep their title; v2 names its design (A/A legs all run one arm).
    kind = {"aa": "A/A", "sweep": "sweep"}.get(str(design), "ABBA")
    what = "" if design is None else \
        f" ({kind}, {blocks} block{'s' if blocks != 1 else ''})"
    runs = Table(title=f"experiment {record.experiment} — legs{what}", box=None, padding=(0, 1))
    for col in ("leg", "arm", "tok/s", "p10", "TTFT ms", "cycle ms", "acc.", "exact", "W",
                "J/tok", "idle", "valid"):
        # fold: a narrow console wraps a figure rather than cutting it to "194.…"
        runs.add_column(col, justify="right" if col not in ("leg", "arm") else "left",
                        overflow="fold")
    for name in legs:
        leg = record.runs_by_name()[name]
        tel = leg.telemetry
        runs.add_row(name, leg.treatment, fmt(leg.headline_tok_s), fmt(leg.p10_tok_s),
                     fmt(leg.ttft_median_ms, 1), fmt(leg.aggregate_cycle_ms),
                     fmt(leg.draft_acceptance_rate, 3),
                     _teacher_exact_cell(leg.teacher_exact,
                                         getattr(leg, "teacher_exact_compared_by", None)),
                     fmt(tel.power_w_mean if tel else None, 0),
                     fmt(tel.joules_per_output_token if tel else None, 3),
                     _idle_cell(record.operational.legs.get(name)),
                     "yes" if leg.valid else "[red]NO[/]")
    return runs


def _idle_cell(op: LegOperational | None) -> str:
    """How long the idle gates before and after the leg took (a record sealed before the
    idle gates has none)."""
    if op is None or op.prestart_idle_seconds is None:
        return "—"
    return f"{op.prestart_idle_seconds:.0f}+{fmt(op.poststop_idle_seconds, 0)} s"


def _pairs_table(record: AbbaRecord) -> Table:
    design, _ = record_design(record)
    pairs = Table(title="pairs (B vs A positions, one arm)" if design == "aa"
                  else "pairs (candidate vs control)", box=None, padding=(0, 1))
    for col in ("pair", "headline Δ", "paired median Δ", "row wins", "cycle saving ms", "pass"):
        pairs.add_column(col, justify="left" if col == "pair" else "right")
    results = record.pairs_by_name()
    for name in pair_names(record):  # block order (B10_vs_A10 after B9_vs_A9)
        p = results[name]
        pairs.add_row(name, _pct(p.headline_delta_pct), _pct(p.paired_median_delta_pct),
                      p.candidate_row_wins, fmt(p.aggregate_cycle_saving_ms, 3),
                      "[green]pass[/]" if p.passed else "[red]fail[/]")
    return pairs


def _gates_matrix(record: AbbaRecord, legs: list[str]) -> Table:
    runs = record.runs_by_name()
    matrix = Table(title="quality gates per leg", box=None, padding=(0, 1))
    matrix.add_column("gate", no_wrap=True)
    for name in legs:
        matrix.add_column(name, justify="right", no_wrap=True)
    present = runs[legs[0]].gates
    # Past one block the columns are narrow: "not tested" would be cut to "not tes…".
    short = len(legs) > 4
    if short:
        matrix.caption = "n/t: not tested"
    by_text = {name: _rows_by_text(runs[name]) for name in legs}
    for gate in [g for g in _LABELS if g in present] + [g for g in present if g not in _LABELS]:
        cells = [_gate_cell(runs[name].gates.get(gate), short) for name in legs]
        if gate == TEACHER_EXACT:  # "13/13" alone would claim ids where text was compared
            cells = [c + "*" if by_text[name] else c for c, name in zip(cells, legs, strict=True)]
        matrix.add_row(_LABELS.get(gate, gate), *cells)
    if any(by_text.values()):
        note = ("*: some rows compared by text, every id the server sent compared by position "
                "(README: Token-exact on llama.cpp)")
        matrix.caption = f"{matrix.caption}; {note}" if matrix.caption else note
    return matrix


def _rows_by_text(leg: object) -> int:
    """How many of a leg's teacher-exact rows were compared by text (0 where its record
    does not say: sealed before leg gates v2)."""
    found = re.search(r"(\d+) by text", getattr(leg, "teacher_exact_compared_by", None) or "")
    return int(found.group(1)) if found else 0


def _gate_cell(gate: GateSummary | None, short: bool) -> str:
    status: str = "—" if gate is None else gate.status.value
    if short and status == GateStatus.NOT_TESTED:
        status = "n/t"
    style = _STATUS_STYLE.get(status, "")
    text = (gate.count or status) if gate is not None and status == GateStatus.PASS else status
    return f"[{style}]{text}[/]" if style else text


# The quality keys across legs, in this order (a record sealed before the idle gates and
# hardware probes lacks the keys they added).
def _teacher_exact_cell(count: str, compared_by: str | None) -> str:
    """The count alone only when no row was compared by text (records sealed before leg
    gates v2 do not say)."""
    found = re.search(r"(\d+) by text", compared_by or "")
    return f"{count}, {found.group(1)} by text" if found else count


_QUALITY_ROWS = ("all_legs_teacher_exact", "all_legs_cross_exact", "all_legs_cached_zero",
                 "full_output_then_next_exact", "long_then_next_exact", "rollover_exact",
                 TOKEN_COUNT_INTEGRITY, "cleanup_passed_all_legs",
                 "idle_before_and_after_all_legs", "same_hardware_all_legs", "all_legs_valid",
                 "retries")


def _quality_table(record: AbbaRecord, rows_by_text: int = 0) -> Table:
    quality = Table(title="quality across legs", box=None, padding=(0, 1), show_header=False)
    quality.add_column("gate")
    quality.add_column("value", justify="right")
    q = record.quality
    for key in _QUALITY_ROWS:
        if key in q.model_fields_set and record.recorded("quality", key):
            value = str(getattr(q, key))
            if key == "all_legs_teacher_exact" and rows_by_text:
                value += f", {rows_by_text} by text"
            quality.add_row(key, value)
    return quality


def _record_gate_table(gate: RecordGate) -> Table:
    rg = Table(title="record gate (strict preregistered)", box=None, padding=(0, 1),
               show_header=False)
    rg.add_column("figure")
    rg.add_column("value", justify="right")
    rg.add_row("candidate lower / higher", f"{fmt(gate.candidate_lower_start_tok_s)} / "
               f"{fmt(gate.candidate_higher_start_tok_s)}")
    rg.add_row("control lower", fmt(gate.control_lower_start_tok_s))
    rg.add_row("prior record", fmt(gate.prior_record_tok_s))
    rg.add_row("delta vs prior", f"{fmt(gate.delta_vs_prior_record_tok_s, 3)} tok/s, "
               f"{_pct(gate.delta_vs_prior_record_pct)}")
    rg.add_row("pass", "[green]PASS[/]" if gate.strict_preregistered_record_pass
               else "[red]no record[/]")
    return rg


def verdict_lines(record: AbbaRecord) -> list[str]:
    """A v2 record's design, leg-level interval, its noise and the preregistered power, in
    the report's words (none for v1: its bootstrap line is printed as it always was)."""

    design, blocks = record_design(record)
    if design is None:
        return []
    lines = [f"design: {report_fmt.design(design, blocks)}"]
    a = analysis_view(record)
    if a is not None:
        lines.append(interval_text(a) + (f" (equivalence ±{a.equivalence_pct:g} %)"
                                         if a.ratio is not None else ""))
        for_record = record_interval_text(a) if a.ratio is not None else None
        if for_record is not None:
            lines.append(f"for record: {for_record}")
        if a.ratio is not None:
            lines.append(f"noise: {noise_text(a)}")
    p = power_view(record)
    lines.append(f"power: {power_text(p)}" if p is not None
                 else "power: none preregistered (the plan declared no min_effect_pct)")
    return lines


def print_experiment(out: Console, record: AbbaRecord | Mapping[str, Any], path: Path) -> None:
    """An experiment record's tables, verdict and where it is; a record just written may
    still be its JSON, read here as its model."""
    model = record if isinstance(record, ExperimentRecord | ExperimentRecordV3) else \
        validate_record(record, source=str(path), older_form_ok=True)
    if isinstance(model, SingleLegRecord):
        raise ConfigError(f"{path}: a single-leg record has no experiment tables")
    for table in experiment_tables(model):
        out.print(table)
    if isinstance(model, ExperimentRecordV3) and model.sweep is not None:
        out.print(sweep_table(sweep_rows(model), sweep_statement(model)))
        for line in sweep_looks_lines(model):
            out.print(escape(line), soft_wrap=True)
    boot = model.bootstrap if isinstance(model, ExperimentRecord) else None
    if boot is not None:
        out.print(
            f"candidate/control = {boot.ratio:.4f} "
            f"({_pct(100 * (boot.ratio - 1))}), {100 * boot.confidence:.0f} % CI "
            f"[{boot.ci_low:.4f}, {boot.ci_high:.4f}] (paired bootstrap, "
            f"{boot.samples} samples; equivalence ±{boot.equivalence_pct:g} %)"
        )
    for line in verdict_lines(model):
        out.print(escape(line), soft_wrap=True)
    out.print(f"[bold]verdict: {model.verdict.value}[/]")
    for reason in model.record_gate.reasons:
        out.print(f"  no record: {escape(reason)}")
    out.print(f"record: {escape(str(path))}", soft_wrap=True)


class RichReportObserver:
    """Progress while a report is built: what it is doing and for how long (verification
    re-hashes every file and re-parses every raw event, which takes a while on big legs)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                  TimeElapsedColumn(), console=console, transient=True,
                                  disable=not console.is_terminal)
        self._task = self._progress.add_task("reading the record", total=None)

    def __enter__(self) -> RichReportObserver:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def report_step(self, message: str) -> None:
        self._progress.update(self._task, description=escape(message))

    def report_leg(self, name: str, index: int, total: int) -> None:
        self._progress.update(self._task, description=f"leg {escape(name)} ({index}/{total}): rows, "
                              "intervals, engine counters, telemetry")
