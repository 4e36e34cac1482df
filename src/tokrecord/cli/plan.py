"""`tokrecord plan power`: how likely a plan is to say FASTER, before it is preregistered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tokrecord.experiment.plan import load_plan
from tokrecord.experiment.power import check_powerable, plan_noise, power_report
from tokrecord.experiment.runner import plan_suite

from . import _guard, app, out_console

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
    for 90 %. Noise comes from --from, else --sd-leg/--sd-row, else the plan's [noise]."""
    # Noise given here stands in for the plan's [noise] (parse_plan would refuse without).
    plan = load_plan(plan_path, noise_given=bool(records) or sd_leg is not None
                     or sd_row is not None)
    check_powerable(plan)
    noise = plan_noise(plan, str(plan_path), records or (), sd_leg, sd_row)
    report = power_report(plan, noise, len(plan_suite(plan).rows))
    if as_json:
        out_console.print_json(json.dumps(report.model_dump(mode="json")))
        return
    out_console.print(
        f"[bold]{plan.name}[/]: {plan.design.value}, {plan.blocks} block(s) = "
        f"{4 * plan.blocks} legs, {report.rows} rows, t on {report.df} df, "
        f"{100 * report.confidence:g} % interval, equivalence ±{report.equivalence_pct:g} %")
    df = f" on {report.noise_df} df" if report.noise_df else ""
    out_console.print(
        f"noise: leg {report.sd_leg_pct:.3f} %, row {report.sd_row_pct:.3f} %{df} "
        f"(from {escape('; '.join(report.noise_sources))})", soft_wrap=True)
    table = Table(box=None, padding=(0, 2))
    table.add_column("true effect", justify="right")
    table.add_column(f"P(FASTER) at {plan.blocks} block(s)", justify="right")
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
