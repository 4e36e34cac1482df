"""`tokrecord plan power` and `plan check`: a plan looked at before it is preregistered."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tokrecord.errors import ConfigError
from tokrecord.experiment.check import ArmStart, check_plan
from tokrecord.experiment.cost import LegCost, cost_report, plan_cost_inputs
from tokrecord.experiment.plan import Plan, load_plan
from tokrecord.experiment.power import check_powerable, plan_noise, power_report
from tokrecord.experiment.runner import plan_suite
from tokrecord.experiment.stats import Noise
from tokrecord.experiment.sweep import sweep_power_report
from tokrecord.suite import load_suite

from .app import _guard, app, err_console, out_console


class PlanCheckError(ConfigError):
    """A plan whose program, files or servers are not usable (exit 2, like any bad input)."""


plan_app = typer.Typer(help="Look at a plan before it is run.", no_args_is_help=True)
app.add_typer(plan_app, name="plan")


@plan_app.command("power")
@_guard
def power_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (TOML).")],
    records: Annotated[
        list[Path] | None,
        typer.Option("--from", help="Earlier record (record.json or its directory) whose "
                     "measured noise to use; repeat to pool. An A/A record is best."),
    ] = None,
    sd_leg: Annotated[float | None, typer.Option(
        "--sd-leg", min=0, help="Leg-to-leg sd of the log rate, in % (fresh server to "
        "fresh server).")] = None,
    sd_row: Annotated[float | None, typer.Option(
        "--sd-row", min=0, help="Row-to-row sd of the log rate within a leg, in %.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """The power of PLAN for +1/2/3/5 % (and its min_effect_pct), and the blocks needed
    for 90 %. Noise comes from --from, else --sd-leg/--sd-row, else the plan's \\[noise]."""
    # Noise given here stands in for the plan's [noise] (parse_plan would refuse without).
    plan = load_plan(plan_path, noise_given=bool(records) or sd_leg is not None
                     or sd_row is not None)
    check_powerable(plan)
    noise = plan_noise(plan, str(plan_path), records or (), sd_leg, sd_row)
    if plan.sweep is not None:
        _sweep_report(plan, noise, None, as_json)
        return
    report = power_report(plan, noise, len(plan_suite(plan).rows))
    if as_json:
        out_console.print_json(json.dumps(report.model_dump(mode="json")))
        return
    out_console.print(
        f"[bold]{plan.name}[/]: {plan.design.value}, {plan.max_blocks} block(s) = "
        f"{4 * plan.max_blocks} legs{' at most' if plan.sequential else ''}, {report.rows} "
        f"rows, t on {report.df} df, "
        f"{100 * report.confidence:g} % interval, equivalence ±{report.equivalence_pct:g} %")
    df = f" on {report.noise_df} df" if report.noise_df else ""
    out_console.print(
        f"noise: leg {report.sd_leg_pct:.3f} %, row {report.sd_row_pct:.3f} %{df} "
        f"(from {escape('; '.join(report.noise_sources))})", soft_wrap=True)
    table = Table(box=None, padding=(0, 2))
    table.add_column("true effect", justify="right")
    table.add_column(f"P(FASTER) at {plan.max_blocks} block(s)", justify="right")
    table.add_column(f"blocks for {100 * report.target_power:g} %", justify="right")
    for e in report.entries:
        mark = " (min_effect_pct)" if e.effect_pct == plan.min_effect_pct else ""
        table.add_row(f"+{e.effect_pct:g} %{mark}", f"{100 * e.power:.1f} %",
                      str(e.blocks_for_target) if e.blocks_for_target else "> 50")
    out_console.print(table)
    if report.min_effect_power is not None and report.min_effect_power < report.target_power:
        need = next(e.blocks_for_target for e in report.entries
                    if e.effect_pct == plan.min_effect_pct)
        out_console.print(
            f"[yellow]underpowered:[/] +{plan.min_effect_pct:g} % would be called FASTER "
            f"{100 * report.min_effect_power:.0f} % of the time; "
            f"{'blocks = ' + str(need) if need else 'more than 50 blocks'} would reach "
            f"{100 * report.target_power:g} %")


class _CheckView:
    """Narrates each arm's start, as a leg does."""

    def arm_starting(self, arm: str, argv: list[str]) -> None:
        err_console.print(Text(f"plan check: starting the {arm} arm's server to readiness "
                               f"(no generation): {shlex.join(argv)}"), soft_wrap=True)

    def arm_done(self, start: ArmStart) -> None:
        if start.problem is None:
            err_console.print(f"plan check: {start.arm}: ready in {start.ready_s:.1f} s, stopped")


def run_plan_check(plan: Plan, source: str, *, start_servers: bool = True) -> None:
    """Raise ConfigError listing every problem; used by `plan check` and by `run`."""
    result = check_plan(plan, start_servers=start_servers, observer=_CheckView())
    if not result.passed:
        raise PlanCheckError("\n".join(p.text(source) for p in result.problems)
                             + f"\n{source}: the plan check failed; nothing was written under "
                             "tokrecord-runs/")


@plan_app.command("check")
@_guard
def check_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (TOML).")],
    no_start: Annotated[bool, typer.Option(
        "--no-start", help="Only check that the program and files exist; start no server.")
    ] = False,
) -> None:
    """Check PLAN before it is run: its program resolves, its model, draft and component
    files exist, and each arm's server starts to readiness (no generation) and stops.
    `tokrecord run` does this before it preregisters anything."""
    plan = load_plan(plan_path)
    run_plan_check(plan, str(plan_path), start_servers=not no_start)
    what = "program and files exist" if no_start else (
        f"program and files exist; {len(plan.arms)} arm(s) started to readiness and stopped")
    out_console.print(Text(f"{plan_path}: plan check passed: {what}"), soft_wrap=True)
@plan_app.command("cost")
@_guard
def cost_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (TOML).")],
    records: Annotated[
        list[Path] | None,
        typer.Option("--from", help="Earlier record (record.json or its directory): its "
                     "noise, and its legs' cost (ready time, idle gates, idle gap, rows); "
                     "repeat to pool."),
    ] = None,
    sd_leg: Annotated[float | None, typer.Option("--sd-leg", min=0, help=(
        "Leg-to-leg sd of the log rate, in %."))] = None,
    sd_row: Annotated[float | None, typer.Option("--sd-row", min=0, help=(
        "Row-to-row sd of the log rate within a leg, in %."))] = None,
    start_s: Annotated[float | None, typer.Option("--start-s", min=0, help=(
        "Seconds a leg costs besides its rows: server ready, idle gates, stop."))] = None,
    row_s: Annotated[float | None, typer.Option("--row-s", min=0, help=(
        "Seconds one row takes."))] = None,
    gap_s: Annotated[float | None, typer.Option("--gap-s", min=0, help=(
        "The idle gap between legs, in seconds (with --start-s; default 0)."))] = None,
    min_effect: Annotated[float | None, typer.Option("--min-effect", min=0.01, help=(
        "The effect to decide, in % (default: the plan's min_effect_pct)."))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What a decision will cost: expected legs and wall time of the fixed and the
    sequential design at 0, +min_effect and +2 x min_effect, and the rows per leg and
    blocks that minimise the expected wall time for 90 % power."""
    given = bool(records) or sd_leg is not None or sd_row is not None
    plan = load_plan(plan_path, noise_given=given)
    check_powerable(plan)
    cost = plan_cost_inputs(str(plan_path), records or (), start_s, row_s, gap_s)
    noise = plan_noise(plan, str(plan_path), records or (), sd_leg, sd_row)
    if plan.sweep is not None:
        _sweep_report(plan, noise, cost, as_json)
        return
    full = load_suite(Path(plan.suite) if plan.suite else None)
    rows = len(plan_suite(plan).rows)
    report = cost_report(plan, noise, rows, cost, len(full.rows), min_effect)
    if as_json:
        out_console.print_json(json.dumps(report.model_dump(mode="json")))
        return
    c = report.cost
    out_console.print(
        f"[bold]{plan.name}[/]: {rows} rows per leg, noise leg {noise.sd_leg_pct:.3f} %, "
        f"row {noise.sd_row_pct:.3f} % (from {escape('; '.join(noise.sources))})",
        soft_wrap=True)
    if c is not None:
        out_console.print(
            f"one leg: start {c.start_s:.1f} s + gap {c.gap_s:.1f} s + {rows} rows x "
            f"{c.row_s:.2f} s = {c.leg_s(rows):.1f} s (from {escape('; '.join(c.sources))})",
            soft_wrap=True)
    out_console.print(f"fixed N: N ABBA blocks; seq <= K: sequential, at most K blocks, "
                      f"{report.spending.value} spending, looks from block {report.min_blocks}")
    table = Table(box=None, padding=(0, 1))
    for col in ("design", "effect", "FASTER", "NO DIFF", "UNDEC", "exp. legs", "exp. wall"):
        table.add_column(col, justify="right")
    for o in report.outcomes:
        name = o.design.label(o.blocks)
        table.add_row(name, f"+{o.effect_pct:g} %", f"{100 * o.p_faster:.1f} %",
                      f"{100 * o.p_no_difference:.1f} %", f"{100 * o.p_undecided:.1f} %",
                      f"{o.expected_legs:.1f}", _duration(o.expected_wall_s))
    out_console.print(table)
    r = report.recommendation
    if r is not None:
        kj = f"; Kalibera-Jones optimum {r.kalibera_jones_rows:.1f} rows" \
            if r.kalibera_jones_rows else ""
        out_console.print(
            f"recommended for 90 % power at +{report.min_effect_pct:g} %: suite_rows = "
            f"{r.rows}{kj}; fixed: blocks = {r.fixed_blocks or '> 50'} "
            f"({_duration(r.fixed_wall_s)}); sequential: max_blocks = "
            f"{r.max_blocks or '> 50'}, expected {_legs(r.sequential_expected_legs)} legs "
            f"({_duration(r.sequential_wall_s)})", soft_wrap=True)
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")


def _sweep_report(plan: Plan, noise: Noise, cost: LegCost | None, as_json: bool) -> None:
    """A sweep's power to single out the best arm, its family-wise false FASTER rate and
    what it costs (a sweep runs every leg: arms x blocks)."""
    rows = len(plan_suite(plan).rows)
    k = len(plan.all_arms)
    report = sweep_power_report(k, plan.max_blocks, noise.sd_leg_pct, noise.sd_row_pct, rows,
                                plan.verdict.confidence,
                                None if cost is None else cost.leg_s(rows))
    if as_json:
        out_console.print_json(json.dumps(report.model_dump(mode="json")))
        return
    out_console.print(
        f"[bold]{plan.name}[/]: sweep of {k} arms ({escape(', '.join(plan.all_arms))}), "
        f"{report.blocks} block(s) = {report.legs} legs, {rows} rows, {report.df} df; "
        f"noise leg {noise.sd_leg_pct:.3f} %, row {noise.sd_row_pct:.3f} % "
        f"(from {escape('; '.join(noise.sources))})", soft_wrap=True)
    out_console.print(
        f"family-wise false FASTER with every arm equal: {100 * report.family_false_faster:.2f} "
        f"%; wall time {_duration(report.wall_s)}", soft_wrap=True)
    if plan.sequential is not None:
        out_console.print(
            f"sequential: at most {plan.max_blocks} blocks, a look after each from block "
            f"{plan.sequential.min_blocks}; the figures here are the fixed sweep's at "
            f"{plan.max_blocks} blocks, the most it runs (spending alpha over the looks "
            "costs a little of that power; the legs it saves are not predicted here: "
            "bench.verdict.sweep --only seq-best measures both)", soft_wrap=True)
    table = Table(box=None, padding=(0, 2))
    table.add_column("best arm ahead by", justify="right")
    table.add_column(f"P(claimed best) at {report.blocks} block(s)", justify="right")
    table.add_column(f"blocks for {100 * report.target_power:g} %", justify="right")
    for e in report.entries:
        table.add_row(f"+{e.effect_pct:g} %", f"{100 * e.power:.1f} %",
                      str(e.blocks_for_target) if e.blocks_for_target else "> 50")
    out_console.print(table)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _legs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
