"""The noise diagnostic of an experiment: where its leg-to-leg variance may come from.

For each covariate of the legs (probes.covariates), the share of the leg-to-leg
variance it explains (r squared, within arms: each arm's mean is taken out of both
the leg figures and the covariate, so a covariate that merely differs between arms
explains nothing); the lag-1 correlation of adjacent legs in run order (a passing
disturbance on the host shows as an episode of consecutive legs off the same way);
and the leg figures in run order.

Diagnosis only. A covariate the treatment can move (power, utilisation, TTFT) would
take part of the treatment's own effect with it, so none ever adjusts the verdict;
the diagnostic says so in the record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tokrecord.probes.covariates import COVARIATES, EXTERNAL, LegCovariates

SCHEMA_NOISE: Final = "tokrecord.noise-diagnostic/v1"
DIAGNOSIS_ONLY: Final = (
    "diagnosis only: covariates explain leg-to-leg variance and never adjust the verdict; "
    "power, utilisation, clocks, temperature and TTFT can move with the treatment itself")
# A run of at least this many adjacent legs all at least EPISODE_SD residual sds off the
# same way is an episode.
EPISODE_LEGS: Final = 2
EPISODE_SD: Final = 1.0
# Below this many within-arm df an r is reported with a warning: at df 2 (one ABBA block)
# |r| > 0.95 happens by chance one time in five (the cosine of two random 2-D vectors).
FEW_DF: Final = 6


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class NoiseLeg(_Frozen):
    """One leg in run order: its figure, its deviation from its arm's mean, its covariates."""

    name: str
    arm: str
    tok_s: float
    deviation_pct: float  # 100 * (log figure - the arm's mean log figure)
    covariates: LegCovariates | None = None


class CovariateFit(_Frozen):
    name: str
    description: str
    legs: int  # legs with a value
    df: int  # legs with a value less their arms: what r is estimated on
    r: float | None  # within-arm Pearson correlation with the leg figure
    share_explained: float | None  # r squared: the share of leg-to-leg variance it explains
    treatment_can_move: bool


class Episode(_Frozen):
    legs: tuple[str, ...]
    direction: str  # "low" | "high"
    mean_deviation_pct: float


class NoiseDiagnostic(_Frozen):
    schema_id: str = Field(default=SCHEMA_NOISE, alias="schema")
    legs: tuple[NoiseLeg, ...]  # run order
    covariates: tuple[CovariateFit, ...]  # by share explained, largest first
    best: str | None  # the covariate that tracks the legs best (None: none could be fitted)
    best_r: float | None
    adjacent_r: float | None  # lag-1 correlation of the deviations in run order
    adjacent_pairs: int
    residual_sd_pct: float | None  # sd of the deviations (df: legs less arms)
    episodes: tuple[Episode, ...] = ()
    note: str = DIAGNOSIS_ONLY


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3:
        return None
    sx, sy = float(np.sqrt(x @ x)), float(np.sqrt(y @ y))
    if sx == 0 or sy == 0:
        return None
    return float(np.clip((x @ y) / (sx * sy), -1.0, 1.0))


def _within(values: Sequence[float], arms: Sequence[str]) -> np.ndarray:
    """Each value less the mean of its arm."""
    v = np.asarray(values, dtype=float)
    out = np.empty_like(v)
    for arm in set(arms):
        idx = np.array([a == arm for a in arms])
        out[idx] = v[idx] - v[idx].mean()
    return out


def _fit(name: str, legs: Sequence[NoiseLeg]) -> CovariateFit:
    have = [(leg, v) for leg in legs if leg.covariates is not None
            and (v := leg.covariates.values().get(name)) is not None and math.isfinite(v)]
    r = None
    arms = [leg.arm for leg, _ in have]
    df = len(have) - len(set(arms))
    # Under two within-arm df leave nothing to correlate.
    if len(have) >= 3 and df >= 2:
        y = _within([math.log(leg.tok_s) for leg, _ in have], arms)
        x = _within([v for _, v in have], arms)
        r = _pearson(x, y)
    return CovariateFit(name=name, description=COVARIATES[name], legs=len(have), df=df, r=r,
                        share_explained=None if r is None else r * r,
                        treatment_can_move=name not in EXTERNAL)


def _episodes(legs: Sequence[NoiseLeg], sd: float) -> tuple[Episode, ...]:
    out: list[Episode] = []
    run: list[NoiseLeg] = []
    direction = ""

    def close() -> None:
        if len(run) >= EPISODE_LEGS:
            out.append(Episode(legs=tuple(x.name for x in run), direction=direction,
                               mean_deviation_pct=sum(x.deviation_pct for x in run) / len(run)))

    for leg in legs:
        d = leg.deviation_pct
        side = "low" if d <= -EPISODE_SD * sd else "high" if d >= EPISODE_SD * sd else ""
        if side and side == direction:
            run.append(leg)
            continue
        close()
        run, direction = ([leg], side) if side else ([], "")
    close()
    return tuple(out)


def noise_diagnostic(legs: Sequence[tuple[str, str, float, LegCovariates | None]]
                     ) -> NoiseDiagnostic:
    """The diagnostic of legs given in run order as (name, arm, figure tok/s, covariates).
    Legs without a positive figure are left out."""
    kept = [(n, a, f, c) for n, a, f, c in legs if f is not None and f > 0 and math.isfinite(f)]
    arms = [a for _, a, _, _ in kept]
    dev = (100 * _within([math.log(f) for _, _, f, _ in kept], arms)) if kept else np.array([])
    views = tuple(NoiseLeg(name=n, arm=a, tok_s=f, deviation_pct=float(d), covariates=c)
                  for (n, a, f, c), d in zip(kept, dev, strict=True))
    df = len(kept) - len(set(arms))
    sd = float(math.sqrt(float(dev @ dev) / df)) if df > 0 else None
    fits = sorted((_fit(name, views) for name in COVARIATES),
                  key=lambda f: 1.0 if f.share_explained is None else -f.share_explained)
    best = next((f for f in fits if f.r is not None), None)
    adjacent = _pearson(dev[:-1] - dev[:-1].mean(), dev[1:] - dev[1:].mean()) \
        if len(dev) >= 4 else None
    return NoiseDiagnostic(
        legs=views, covariates=tuple(fits), best=best.name if best else None,
        best_r=best.r if best else None, adjacent_r=adjacent,
        adjacent_pairs=max(len(dev) - 1, 0), residual_sd_pct=sd,
        episodes=_episodes(views, sd) if sd else (),
    )


def best_line(d: NoiseDiagnostic) -> str:
    """One line for the terminal and markdown reports."""
    if d.best is None or d.best_r is None:
        return f"no covariate could be fitted over {len(d.legs)} legs ({DIAGNOSIS_ONLY.split(':')[0]})"
    fit = next(f for f in d.covariates if f.name == d.best)
    adj = "" if d.adjacent_r is None else f"; adjacent legs r = {d.adjacent_r:+.2f}"
    eps = f"; {len(d.episodes)} episode(s)" if d.episodes else ""
    moved = "; the treatment can move it" if fit.treatment_can_move else ""
    few = ": too few to mean much" if fit.df < FEW_DF else ""
    return (f"legs track {fit.name} best ({fit.description}{moved}): r = {d.best_r:+.2f}, "
            f"{100 * (fit.share_explained or 0):.0f} % of the leg-to-leg variance over "
            f"{fit.legs} legs (df {fit.df}{few}){adj}{eps}; diagnosis only, never adjusts the "
            "verdict")


def legs_in_order(order: Sequence[str], arms: Mapping[str, str], figures: Mapping[str, float | None],
                  covariates: Mapping[str, LegCovariates | None]
                  ) -> list[tuple[str, str, float, LegCovariates | None]]:
    """The diagnostic's input from per-leg maps, in the given run order."""
    return [(n, arms[n], f, covariates.get(n)) for n in order
            if n in arms and (f := figures.get(n)) is not None]
