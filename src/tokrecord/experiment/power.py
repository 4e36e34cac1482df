"""Power before preregistration: how likely a plan is to say FASTER for a true effect.

Noise comes from earlier records (an A/A record is the machine's own noise floor) or
from figures given by hand. The figures are those of the verdict's own model
(`stats.leg_analysis`): sd of a leg's log rate between fresh servers, and row to row
within a leg, both x 100 (about a percentage). The prediction itself is
`stats.power`; `bench/verdict` checks it against simulation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import Plan, abba_design
from tokrecord.experiment.stats import (
    Noise,
    VerdictAnalysis,
    abba_df,
    blocks_for_power,
    fit_legs,
    noise_from_analysis,
    pool_noise,
    power,
)

EFFECTS_PCT: Final = (1.0, 2.0, 3.0, 5.0)
TARGET_POWER: Final = 0.9
POWER_METHOD: Final = (
    "P(verdict FASTER) under the verdict's model: the effect estimate is normal with sd "
    "sigma/sqrt(blocks), sigma^2 = sd_leg^2 + (pi/3) sd_row^2 / rows is estimated on "
    "3 x blocks - 1 df, FASTER needs the t interval above 1 and outside the equivalence band; "
    "integrated over the distribution of the estimated sd"
)


class PowerEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    effect_pct: float
    power: float
    blocks_for_target: int | None  # None: not reached within 50 blocks


class PowerReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    blocks: int
    df: int
    rows: int
    confidence: float
    equivalence_pct: float
    target_power: float
    sd_leg_pct: float
    sd_row_pct: float
    noise_df: int | None
    noise_sources: tuple[str, ...]
    min_effect_pct: float | None
    min_effect_power: float | None
    entries: tuple[PowerEntry, ...]


def power_report(plan: Plan, noise: Noise, rows: int,
                 effects: Sequence[float] = EFFECTS_PCT) -> PowerReport:
    conf, eq = plan.verdict.confidence, plan.verdict.equivalence_pct
    wanted = sorted({*effects, *([plan.min_effect_pct] if plan.min_effect_pct else [])})
    entries = tuple(
        PowerEntry(effect_pct=e, power=round(power(e, noise, rows, plan.max_blocks, conf, eq), 4),
                   blocks_for_target=blocks_for_power(e, noise, rows, conf, eq, TARGET_POWER))
        for e in wanted)
    mine = next((x.power for x in entries if x.effect_pct == plan.min_effect_pct), None)
    return PowerReport(
        method=POWER_METHOD, blocks=plan.max_blocks, df=abba_df(plan.max_blocks), rows=rows,
        confidence=conf, equivalence_pct=eq, target_power=TARGET_POWER,
        sd_leg_pct=round(noise.sd_leg_pct, 6), sd_row_pct=round(noise.sd_row_pct, 6),
        noise_df=noise.leg_df, noise_sources=noise.sources, min_effect_pct=plan.min_effect_pct,
        min_effect_power=mine, entries=entries)


def min_detectable_effect(noise: Noise, rows: int, blocks: int, confidence: float,
                          equivalence_pct: float, target: float = TARGET_POWER,
                          most_pct: float = 100.0) -> float | None:
    """The smallest true speed-up (in %, to 0.1) that `blocks` blocks call FASTER with at
    least `target` probability; None when not even +`most_pct` % reaches it. Power rises
    with the effect, so a bisection finds it."""

    def enough(effect: float) -> bool:
        return power(effect, noise, rows, blocks, confidence, equivalence_pct) >= target

    if not enough(most_pct):
        return None
    low, high = 0.0, most_pct  # low falls short, high reaches it
    while high - low > 0.05:
        mid = (low + high) / 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    # The first 0.1 step at or above `low` that reaches it: one step less falls short.
    found = math.ceil(low * 10) / 10
    while not enough(found):
        found = round(found + 0.1, 1)
    return found


def noise_from_record(record: Mapping[str, Any], source: str) -> Noise:
    """The noise an earlier record measured. A v2 record (ABBA or A/A) states it; an
    older or hand-made record (the seed form) gives its legs' headlines only, so the
    leg noise is fitted to those, with the row noise folded into it."""
    analysis = record.get("verdict_analysis")
    if isinstance(analysis, Mapping):
        found = noise_from_analysis(VerdictAnalysis.model_validate(analysis), source)
        if found is None:
            raise ConfigError(f"{source}: its verdict estimated no noise "
                              f"({analysis.get('reason')})")
        return found
    runs = record.get("runs")
    if not isinstance(runs, Mapping) or len(runs) < 4:
        raise ConfigError(f"{source}: not an experiment record with ABBA legs (key 'runs')")
    # The legs as the design names them: which block each is in, and which side.
    design = abba_design(max(1, len(runs) // 4))
    if sorted(runs) != sorted(leg.name for leg in design):
        raise ConfigError(f"{source}: key 'runs': legs {', '.join(sorted(runs))} are not an "
                          "ABBA design's")
    heads = [runs[leg.name].get("headline_tok_s") if isinstance(runs[leg.name], Mapping)
             else None for leg in design]
    if not all(isinstance(h, int | float) and h > 0 for h in heads):
        raise ConfigError(f"{source}: key 'runs.*.headline_tok_s': every leg needs a headline")
    fit = fit_legs([math.log(float(h)) for h in heads],  # type: ignore[arg-type]
                   [leg.block for leg in design], [leg.treated for leg in design])
    if isinstance(fit, str):
        raise ConfigError(f"{source}: {fit}")
    _, _, df, s2 = fit
    return Noise(sd_leg_pct=100 * math.sqrt(s2), sd_row_pct=0.0, leg_df=df,
                 sources=(f"{source} (legs' headlines only: row noise folded into leg noise)",))


def read_records(paths: Sequence[Path]) -> list[tuple[Path, Mapping[str, Any]]]:
    """Earlier records (record.json, or an experiment directory) as (file, dict); a
    ConfigError naming the file when one cannot be read or is not a JSON object."""
    found = []
    for path in paths:
        file = path / "record.json" if path.is_dir() else path
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read record {file}: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file}: not JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"{file}: not a record")
        found.append((file, data))
    return found


def load_noise(paths: Sequence[Path]) -> Noise:
    """Pooled noise of earlier records (record.json, or an experiment directory)."""
    return pool_noise([noise_from_record(data, str(file)) for file, data in read_records(paths)])


def plan_noise(plan: Plan, source: str, records: Sequence[Path] = (),
               sd_leg_pct: float | None = None, sd_row_pct: float | None = None) -> Noise:
    """Noise for the plan: records or figures given now, else the plan's own [noise]."""
    if (sd_leg_pct is None) != (sd_row_pct is None):
        raise ConfigError("give both --sd-leg and --sd-row, or neither")
    if records:
        return load_noise(records)
    if sd_leg_pct is not None and sd_row_pct is not None:
        return Noise(sd_leg_pct=sd_leg_pct, sd_row_pct=sd_row_pct, sources=("given",))
    n = plan.noise
    if n is not None and n.from_records:
        return load_noise([Path(p) for p in n.from_records])
    if n is not None and n.sd_leg_pct is not None and n.sd_row_pct is not None:
        return Noise(sd_leg_pct=n.sd_leg_pct, sd_row_pct=n.sd_row_pct,
                     sources=(f"{source} [noise]",))
    raise ConfigError(
        f"{source}: the power cannot be computed: no noise given. Pass --from RECORD (an "
        "earlier record of this machine; an A/A record is best) or --sd-leg and --sd-row, "
        "or declare [noise] in the plan")


def check_powerable(plan: Plan) -> None:
    if not plan.design_spec.has_verdict:
        raise ConfigError("a single-leg plan has no verdict, so no power: use design "
                          "'abba' (or 'aa' to measure the noise floor)")
