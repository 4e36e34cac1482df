"""Sequential designs: a stopping rule over a sequence of looks, with alpha spending.

Pure and not tied to two arms: it takes looks (an estimate on the log scale, its
standard error, the residual degrees of freedom and the fraction of the maximum
information reached) and returns, look by look, the boundary, the statistic, the
repeated confidence interval and what to do. An ABBA experiment feeds it one look
per block (`stats.sequential_analysis`); a multi-arm sweep can feed it its own.

Why this method (group-sequential, Lan-DeMets alpha spending, repeated confidence
intervals), and not an always-valid confidence sequence:
- The noise that bounds a speed claim is between fresh servers, estimated from a
  handful of legs (3k - 1 df after k blocks). Confidence sequences that are valid at
  every sample need a known variance or pay heavily for an estimated one, and are
  built for many looks; here there are at most tens of looks, at block boundaries
  fixed before the run, which is the case group-sequential designs are optimal for.
- Spending (Lan & DeMets 1983) fixes how much of the error rate each look may use as
  a function of the information fraction alone, so the boundaries are preregistered
  with the plan and need no assumption about the effect.
- The reported interval is the repeated confidence interval (Jennison & Turnbull
  1989): estimate +- boundary x se at the look where the run stopped. The boundaries
  are set so that, with no effect, the statistic crosses the upper one at some look
  with probability alpha/2, so these intervals cover the truth at every look at once
  with probability >= 1 - alpha. Their coverage therefore holds whatever made the run
  stop: a boundary, the equivalence band, or the last block. A decision is read from
  the interval exactly as the fixed design's (`stats.verdict`), so false FASTER over
  all looks is at most alpha/2 by the same argument.
- The noise is estimated, on few df, and every look shares that estimate. Carrying
  normal boundaries (numerical integration over the looks, Armitage, McPherson &
  Rowe 1969) to each look's t at the same nominal level (Jennison & Turnbull 2000,
  ch. 11) spends about 7 % too much alpha at 1-3 blocks (measured: 2.67 % instead of
  2.5 %). So the t boundaries are simulated under the verdict's own model
  (`t_boundaries`: 200000 paths, fixed seed), spending exactly what the spending
  function allows up to Monte-Carlo error; the normal boundaries are recorded beside
  them. The default `min_blocks` = 2 keeps the first look off the 2-df case.
- The verdict's model is normal legs; real ones are not. On the H200 draft-model A/A
  legs (two-peaked between fresh servers) the leg-level t exceeds its nominal 2.5 % tail
  at nearly every look, by up to 20 %, whether the legs are drawn with or without replacement
  (bench.verdict.seqcause), so boundaries spending exactly alpha under the model spend
  about 2.75 % on them, and the repeated interval covers slightly under 95 %. Method
  rci-t/2 (the current one) sets the same simulated boundaries to spend 0.8 alpha; rci-t/1
  spends alpha and is kept so that records sealed under it recompute exactly. The plan
  seals which one it runs (`SequentialSpec.method`), and the record names it.

O'Brien-Fleming-like spending (the default) spends almost nothing early: its last
boundary is near the fixed design's, so its maximum costs little more than the fixed
design, while a large effect stops early. Pocock-like spending stops earlier on
average for effects near the design's but its last boundary is wider.

The estimate at the stop is the plain one, which early stopping biases away from zero
(a run stops early when its estimate happens to be large); the record says so, and
gives beside it the bias-adjusted estimate (`adjusted_estimate`, Whitehead 1986),
computed on simulated paths of the same model (`draw_paths`, `run_paths`: any design
of units and boundaries, so a sweep can use them too).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from enum import StrEnum
from functools import lru_cache
from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tokrecord.experiment import dist
from tokrecord.experiment.plan import SequentialMethod, Spending
from tokrecord.experiment.stats import Verdict, verdict

_GRID: Final = 801  # points per look in the numerical integration
_TAIL_SD: Final = 9.0  # the integration's lower edge, in sd of the statistic under no effect
BIAS_NOTE: Final = (
    "the estimate is the plain one at the look where the run stopped; stopping when a "
    "boundary is crossed biases it away from no change (most when the run stopped early). "
    "The reported interval is the repeated confidence interval, whose coverage holds "
    "after optional stopping")


class Action(StrEnum):
    CONTINUE = "continue"
    STOP = "stop"


@lru_cache(maxsize=4096)
def spent(spending: Spending, alpha: float, fraction: float) -> float:
    """Lan-DeMets spending: the error rate used by information fraction t (0..1]."""
    t = min(max(fraction, 0.0), 1.0)
    if t <= 0:
        return 0.0
    if spending is Spending.OBRIEN_FLEMING:
        return float(2 * dist.norm_sf(dist.norm_isf(alpha / 2) / math.sqrt(t)))
    if spending is Spending.POCOCK:
        return alpha * math.log1p((math.e - 1) * t)
    raise ValueError(f"unknown spending {spending!r}")


@lru_cache(maxsize=256)
def z_boundaries(fractions: tuple[float, ...], alpha: float,
                 spending: Spending) -> tuple[float, ...]:
    """One-sided upper boundaries c_j for a normal statistic Z_j observed at increasing
    information fractions, such that P(Z_i > c_i for some i <= j | no effect) equals the
    alpha spent by fraction t_j. No lower boundary is used to set them, so by symmetry
    the two-sided repeated intervals cover with probability >= 1 - 2 alpha."""
    ts = tuple(float(t) for t in fractions)
    if not ts or any(not 0 < t <= 1 for t in ts) or any(b <= a for a, b in itertools.pairwise(ts)):
        raise ValueError(f"information fractions must increase within (0, 1]: {ts}")
    bounds: list[float] = []
    # Track the score S_j = Z_j sqrt(t_j), whose increments are independent N(0, dt):
    # the sub-density of S_j on runs that have not crossed yet, on a grid.
    grid = weights = density = np.empty(0)
    prev_t = 0.0
    used = 0.0
    for t in ts:
        target = spent(spending, alpha, t) - used
        if not bounds:
            c = float(dist.norm_isf(max(target, 1e-300)))
            b = c * math.sqrt(t)
        else:
            dt = t - prev_t
            step = math.sqrt(dt)
            mass = weights * density

            def excess(b_try: float, mass: np.ndarray = mass, grid: np.ndarray = grid,
                       step: float = step, want: float = target) -> float:
                # The mass crossing b_try at this look, beyond the alpha it may spend.
                return float(mass @ dist.norm_sf((b_try - grid) / step)) - want

            if target <= 0:
                b = math.inf
            else:
                hi = float(grid[-1]) + 12 * step
                lo = float(grid[0])
                b = lo if excess(lo) <= 0 else dist.brentq(excess, lo, hi, xtol=1e-10)
            c = b / math.sqrt(t)
        bounds.append(c)
        used += spent(spending, alpha, t) - used
        # The sub-density below the boundary at this look, for the next.
        upper = b if math.isfinite(b) else _TAIL_SD * math.sqrt(t)
        new_grid = np.linspace(-_TAIL_SD * math.sqrt(t), upper, _GRID)
        if density.size == 0:
            new_density = dist.norm_pdf(new_grid / math.sqrt(t)) / math.sqrt(t)
        else:
            step = math.sqrt(t - prev_t)
            kernel = dist.norm_pdf((new_grid[:, None] - grid[None, :]) / step) / step
            new_density = kernel @ (weights * density)
        grid, density = new_grid, new_density
        weights = _simpson(grid)
        prev_t = t
    return tuple(bounds)


def _simpson(grid: np.ndarray) -> np.ndarray:
    n = len(grid)
    h = (grid[-1] - grid[0]) / (n - 1)
    w = np.ones(n)
    w[1:-1:2] = 4
    w[2:-1:2] = 2
    return np.asarray(w * h / 3)


# Simulated paths for the t boundaries: the Monte-Carlo error of the alpha each look
# spends is about sqrt(alpha / SIMS), 0.0004 at alpha = 0.025.
SIMS: Final = 200_000
# Below this many simulated crossings a look's boundary is taken from the normal one
# (nominal-level carry-over): a quantile of a handful of paths is noise, and such a look
# spends almost nothing either way.
_MIN_CROSSINGS: Final = 50


@lru_cache(maxsize=256)
def t_boundaries(units: tuple[int, ...], max_units: int, extra_df: int, alpha: float,
                 spending: Spending, sims: int = SIMS, seed: int = 20131) -> tuple[float, ...]:
    """Upper boundaries for the t statistics of a design that adds, per unit (an ABBA
    block), one treatment contrast and `extra_df` degrees of freedom of pure error, looked
    at after each count in `units`: P(some t_i > c_i, i <= j | no effect) is the alpha
    spent by units_j / max_units. The statistics share their variance estimate, so their
    joint law is not the normal one with each look's df plugged in (carrying each normal
    boundary over at its own df spends about 7 % too much alpha at 1-3 blocks); it is
    simulated here exactly under the verdict's own model, with a fixed seed so that the
    boundaries are the same wherever they are recomputed."""
    if not units or any(b <= a for a, b in itertools.pairwise(units)) or units[0] < 1 \
            or units[-1] > max_units:
        raise ValueError(f"look units must increase within 1..{max_units}: {units}")
    rng = np.random.default_rng(seed)
    fractions = tuple(u / max_units for u in units)
    z_ref = z_boundaries(fractions, alpha, spending)
    total = np.zeros(sims)
    squares = np.zeros(sims)
    extra = np.zeros(sims)
    alive = np.ones(sims, dtype=bool)
    seen = 0
    used = 0.0
    out = []
    for j, u in enumerate(units):
        while seen < u:
            d = rng.standard_normal(sims)
            total += d
            squares += d * d
            if extra_df:
                extra += rng.chisquare(extra_df, sims)
            seen += 1
        df = u * (1 + extra_df) - 1
        target = spent(spending, alpha, fractions[j]) - used
        used += target
        if df < 1:
            out.append(math.inf)
            continue
        mean = total / u
        ss = extra + squares - u * mean * mean
        t = mean / np.sqrt(ss / df / u)
        want = target * sims
        if want < _MIN_CROSSINGS:
            c = t_boundary(z_ref[j], df)
        else:
            ranked = np.sort(t[alive])[::-1]
            c = float(ranked[min(round(want), len(ranked) - 1)])
        alive &= ~(t > c)
        out.append(c)
    return tuple(out)


def t_boundary(z: float, df: int) -> float:
    """A normal boundary carried to a t statistic on df degrees of freedom at the same
    nominal one-sided level."""
    if not math.isfinite(z):
        return math.inf
    return float(dist.t_isf(dist.norm_sf(z), df))


class LookInput(BaseModel):
    """What one interim analysis found: a log-scale estimate and its standard error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str  # e.g. "block 3"
    fraction: float = Field(gt=0, le=1)  # of the maximum information
    estimate: float | None  # log ratio; None when the analysis could not estimate it
    se: float | None = Field(default=None, ge=0)
    df: int = Field(ge=0)
    reason: str = ""  # why there is no estimate


class Look(BaseModel):
    """One look as recorded: the statistic against its boundaries, and what it decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    fraction: float
    df: int
    estimate_ratio: float | None
    statistic: float | None  # t = estimate / se
    z_boundary: float  # the normal-scale boundary the spending gives
    boundary: float | None  # on the t scale at this look's df (verdict confidence)
    record_boundary: float | None  # the same at the record's confidence; None: no df
    alpha_spent: float  # two-sided, cumulative, at the verdict's confidence
    ci_low: float | None  # repeated confidence interval (ratio scale)
    ci_high: float | None
    record_ci_low: float | None
    record_ci_high: float | None
    verdict: Verdict
    action: Action
    reason: str


class SequentialAnalysis(BaseModel):
    """A sequential design's looks and its decision, as recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    spending: Spending
    confidence: float
    record_confidence: float
    equivalence_pct: float
    max_looks: int
    looks: tuple[Look, ...]  # the looks taken, the last one where the run stopped
    stopped: bool  # a decision was reached (a boundary, the band, or the last look)
    stopped_at: str | None
    verdict: Verdict  # UNDECIDED while running, or when the last look decides nothing
    record_verdict: Verdict
    estimate_ratio: float | None
    ci_low: float | None
    ci_high: float | None
    record_ci_low: float | None
    record_ci_high: float | None
    estimate_note: str
    # Added after the first sequential records (they have neither): the bias-adjusted
    # estimate at the stop and how it is computed.
    estimate_adjusted_ratio: float | None = None
    estimate_adjustment: str | None = None


ADJUSTMENT_METHOD: Final = (
    "bias-adjusted (Whitehead 1986): the true effect whose expected estimate at the stop, "
    "under this stopping rule and the verdict's model with the per-block sd of the look "
    "that stopped, equals the estimate observed; expectation over 4000 simulated paths, "
    "seed 19861")


SEQUENTIAL_METHOD: Final = (  # rci-t/1's; its records carry this text unchanged
    "group-sequential, Lan-DeMets alpha spending; t boundaries simulated under the "
    "verdict's model (one contrast and 2 df of pure error per ABBA block, 200000 paths, "
    "seed 20131; the normal boundary by numerical integration beside them); the interval "
    "is the repeated confidence interval (estimate +- boundary x se), "
    "valid after optional stopping; a look stops on FASTER, SLOWER or NO DIFFERENCE read "
    "from that interval, and the last look stops whatever it finds")


SEQUENTIAL_METHOD_V2: Final = (
    "rci-t/2: group-sequential, Lan-DeMets alpha spending of 0.8 alpha (a margin for legs "
    "that are not normal: on the real H200 draft-model A/A legs the leg-level t exceeds "
    "its nominal tail by up to 20 % at a look); t boundaries simulated under the "
    "verdict's model (one contrast and 2 df of pure error per ABBA block, 200000 paths, "
    "seed 20131; the normal boundary by numerical integration beside them); the interval "
    "is the repeated confidence interval (estimate +- boundary x se), valid after optional "
    "stopping; a look stops on FASTER, SLOWER or NO DIFFERENCE read from that interval, and "
    "the last look stops whatever it finds")

# The share of the spending function's alpha each method's boundaries spend.
ALPHA_FACTOR: Final[dict[SequentialMethod, float]] = {SequentialMethod.RCI_T_1: 1.0,
                                                       SequentialMethod.RCI_T_2: 0.8}
METHOD_TEXT: Final[dict[SequentialMethod, str]] = {SequentialMethod.RCI_T_1: SEQUENTIAL_METHOD,
                                                    SequentialMethod.RCI_T_2: SEQUENTIAL_METHOD_V2}


def method_of_text(text: object) -> SequentialMethod | None:
    """The method a recorded `method` text names (lint reads raw records); None: unknown."""
    for method, known in METHOD_TEXT.items():
        if text == known:
            return method
    return None


class Design(BaseModel):
    """What the t boundaries depend on: the units (blocks) at each planned look, the
    most units, and the pure-error df each unit adds beside its contrast."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    units: tuple[int, ...]
    max_units: int
    extra_df: int = Field(ge=0)


def boundaries(design: Design, confidence: float, spending: Spending,
               method: SequentialMethod = SequentialMethod.RCI_T_1) -> tuple[float, ...]:
    return t_boundaries(design.units, design.max_units, design.extra_df,
                        ALPHA_FACTOR[method] * (1 - confidence) / 2, spending)


def analyse(looks: Sequence[LookInput], max_looks: int, fractions: Sequence[float],
            spending: Spending, confidence: float, record_confidence: float,
            equivalence_pct: float, design: Design | None = None,
            adjust: bool = True,
            method: SequentialMethod = SequentialMethod.RCI_T_1) -> SequentialAnalysis:
    """Walk the looks taken so far against the preregistered boundaries: `fractions` are
    the information fractions of all `max_looks` planned looks (the last is 1). Looks
    after the first that stops are not analysed (and should not exist). With `design`
    the t boundaries are simulated for it (t_boundaries); without, each normal boundary
    is carried to its look's df (t_boundary). With `design` and `adjust`, a run that
    stopped also gets the bias-adjusted estimate (`adjusted_estimate`). `method` is the
    plan's (`SequentialSpec.method_in_force`): how much of alpha the boundaries spend."""
    if len(fractions) != max_looks:
        raise ValueError(f"{max_looks} looks planned but {len(fractions)} fractions given")
    alpha = ALPHA_FACTOR[method] * (1 - confidence) / 2
    alpha_rec = ALPHA_FACTOR[method] * (1 - record_confidence) / 2
    zs = z_boundaries(tuple(fractions), alpha, spending)
    zs_rec = z_boundaries(tuple(fractions), alpha_rec, spending)
    ts = boundaries(design, confidence, spending, method) if design else None
    ts_rec = boundaries(design, record_confidence, spending, method) if design else None
    out: list[Look] = []
    last_verdict, last_record = Verdict.UNDECIDED, Verdict.UNDECIDED
    stopped = False
    for j, look in enumerate(looks):
        if j >= max_looks:
            break
        final = j == max_looks - 1
        c = c_rec = None
        if look.df > 0:
            c = ts[j] if ts else t_boundary(zs[j], look.df)
            c_rec = ts_rec[j] if ts_rec else t_boundary(zs_rec[j], look.df)
            if not (math.isfinite(c) and math.isfinite(c_rec)):
                c = c_rec = None
        spent_now = 2 * spent(spending, alpha, fractions[j])
        if look.estimate is None or look.se is None or c is None or c_rec is None:
            found, rec = Verdict.UNDECIDED, Verdict.UNDECIDED
            action = Action.STOP if final else Action.CONTINUE
            out.append(Look(label=look.label, fraction=fractions[j], df=look.df,
                            estimate_ratio=None, statistic=None, z_boundary=zs[j], boundary=c,
                            record_boundary=c_rec, alpha_spent=spent_now, ci_low=None,
                            ci_high=None, record_ci_low=None, record_ci_high=None,
                            verdict=found, action=action,
                            reason=look.reason or "no estimate at this look"))
        else:
            est, se = look.estimate, look.se
            # No residual noise at all (a degenerate input): no finite statistic, and
            # the interval (a point) still decides.
            stat = est / se if se > 0 else None
            low, high = _interval(est, se, c)
            rlow, rhigh = _interval(est, se, c_rec)
            found = verdict(low, high, equivalence_pct)
            rec = verdict(rlow, rhigh, equivalence_pct)
            action = Action.STOP if final or found is not Verdict.UNDECIDED else Action.CONTINUE
            shown = "n/a" if stat is None else f"{stat:.3f}"
            why = (f"t({look.df}) = {shown} against +-{c:.3f}: "
                   + (found.value if found is not Verdict.UNDECIDED
                      else "the last look, undecided" if final else "continue"))
            out.append(Look(label=look.label, fraction=fractions[j], df=look.df,
                            estimate_ratio=math.exp(est), statistic=stat, z_boundary=zs[j],
                            boundary=c, record_boundary=c_rec, alpha_spent=spent_now,
                            ci_low=low, ci_high=high, record_ci_low=rlow,
                            record_ci_high=rhigh, verdict=found, action=action, reason=why))
        last_verdict, last_record = found, rec
        if action is Action.STOP:
            stopped = True
            break
    last = out[-1] if out else None
    adjusted = None
    if (adjust and design is not None and ts is not None and stopped and last is not None
            and last.estimate_ratio is not None and looks[len(out) - 1].se is not None):
        found_adj = adjusted_estimate(design, ts, len(out) - 1, math.log(last.estimate_ratio),
                                      float(looks[len(out) - 1].se or 0.0), equivalence_pct)
        adjusted = None if found_adj is None else math.exp(found_adj)
    return SequentialAnalysis(
        method=METHOD_TEXT[method], spending=spending, confidence=confidence,
        record_confidence=record_confidence, equivalence_pct=equivalence_pct,
        max_looks=max_looks, looks=tuple(out), stopped=stopped,
        stopped_at=last.label if stopped and last else None,
        verdict=last_verdict if stopped else Verdict.UNDECIDED,
        record_verdict=last_record if stopped else Verdict.UNDECIDED,
        estimate_ratio=last.estimate_ratio if last else None,
        ci_low=last.ci_low if last else None, ci_high=last.ci_high if last else None,
        record_ci_low=last.record_ci_low if last else None,
        record_ci_high=last.record_ci_high if last else None, estimate_note=BIAS_NOTE,
        estimate_adjusted_ratio=adjusted,
        estimate_adjustment=ADJUSTMENT_METHOD if adjusted is not None else None)


def _interval(est: float, se: float, c: float) -> tuple[float, float]:
    return math.exp(est - c * se), math.exp(est + c * se)


# --------------------------------------------------------------------------- paths and the estimate

class Outcome(StrEnum):
    """How a simulated path ended (`simulate_paths`)."""

    FASTER = "FASTER"
    SLOWER = "SLOWER"
    NO_DIFFERENCE = "NO DIFFERENCE"
    UNDECIDED = "UNDECIDED"


_CODES: Final = (Outcome.FASTER, Outcome.SLOWER, Outcome.NO_DIFFERENCE, Outcome.UNDECIDED)


class Paths(BaseModel):
    """Standardised noise of simulated runs of a design (sigma = 1 per unit): per look,
    the mean of the units' contrasts and the standard error the fit would report. A
    true effect and a noise level turn them into runs (`run_paths`); drawing them once
    lets every effect share the same draws, so functions of the effect are smooth."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    design: Design
    means: np.ndarray  # [path, look]
    ses: np.ndarray  # [path, look]


def draw_paths(design: Design, sims: int, seed: int) -> Paths:
    """Paths under the verdict's model: per unit one contrast ~ N(0, 1) and `extra_df`
    df of pure error; at a look on u units, t = mean / (s / sqrt(u)) on u(1+extra)-1 df."""
    rng = np.random.default_rng(seed)
    most = design.units[-1]
    d = rng.standard_normal((sims, most))
    w = rng.chisquare(design.extra_df, (sims, most)) if design.extra_df else np.zeros(
        (sims, most))
    means = np.empty((sims, len(design.units)))
    ses = np.empty_like(means)
    for j, u in enumerate(design.units):
        part = d[:, :u]
        mean = part.mean(axis=1)
        df = u * (1 + design.extra_df) - 1
        ss = w[:, :u].sum(axis=1) + ((part - mean[:, None]) ** 2).sum(axis=1)
        means[:, j] = mean
        ses[:, j] = np.sqrt(ss / max(df, 1) / u)
    return Paths(design=design, means=means, ses=ses)


def run_paths(paths: Paths, critical: Sequence[float], effect: float, sigma: float,
              band: float, band_low: float | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each path walked through the stopping rule at a true log effect and per-unit sd
    sigma (log scale), with the interval estimate +- c_j se_j and the equivalence band
    [band_low, band] (log scale; band_low None: -band): (outcome index into Outcome order
    FASTER, SLOWER, NO DIFFERENCE, UNDECIDED; the look index it stopped at; its estimate
    there). The planner (experiment.cost) walks the same paths with the verdict's own
    band, log(1 - eq) .. log(1 + eq)."""
    low_band = -band if band_low is None else band_low
    n, looks = paths.means.shape
    if len(critical) != looks:
        raise ValueError(f"{looks} looks but {len(critical)} boundaries")
    est = effect + sigma * paths.means
    se = sigma * paths.ses
    outcome = np.full(n, -1, dtype=np.int8)
    stop = np.full(n, looks - 1, dtype=np.int64)
    for j, c in enumerate(critical):
        if not math.isfinite(c):
            continue
        low, high = est[:, j] - c * se[:, j], est[:, j] + c * se[:, j]
        found = np.where((low >= low_band) & (high <= band), 2,
                         np.where(low > 0, 0, np.where(high < 0, 1, -1)))
        if j == looks - 1:
            found = np.where(found < 0, 3, found)
        new = (outcome < 0) & (found >= 0)
        outcome[new] = found[new]
        stop[new] = j
    outcome[outcome < 0] = 3
    return outcome, stop, est[np.arange(n), stop]


# Paths for the bias-adjusted estimate: its Monte-Carlo error is about
# 1.2 se / sqrt(ADJUST_SIMS) at the stop: 0.02 standard errors.
ADJUST_SIMS: Final = 4000
ADJUST_SEED: Final = 19861  # Whitehead 1986


@lru_cache(maxsize=64)
def _adjust_paths(design: Design) -> Paths:
    return draw_paths(design, ADJUST_SIMS, ADJUST_SEED)


def adjusted_estimate(design: Design, critical: Sequence[float], stop_look: int,
                      estimate: float, se: float, equivalence_pct: float) -> float | None:
    """The bias-adjusted estimate (Whitehead 1986): the true log effect whose expected
    estimate at the stop, under this stopping rule, equals the estimate observed. Its
    expectation is computed on fixed simulated paths of the verdict's model, with the
    per-unit sd taken from the look that stopped (se x sqrt(units)). A run that stops
    early because its estimate is large is pulled back towards no change; a run that
    went to the last look is moved little. None when there is no standard error."""
    if se <= 0 or not math.isfinite(se) or not 0 <= stop_look < len(design.units):
        return None
    sigma = se * math.sqrt(design.units[stop_look])
    band = math.log1p(equivalence_pct / 100)
    paths = _adjust_paths(design)

    def gap(effect: float) -> float:
        _, _, at_stop = run_paths(paths, critical, effect, sigma, band)
        return float(at_stop.mean()) - estimate

    # The estimate's expectation moves with the effect (slope between about 1/2 and 2):
    # a bracket of 20 sigma around the observed one holds the root.
    lo, hi = estimate - 20 * sigma, estimate + 20 * sigma
    if gap(lo) > 0 or gap(hi) < 0:
        return None
    return dist.brentq(gap, lo, hi, xtol=1e-6 * sigma)

