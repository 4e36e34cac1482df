"""Pairs, the verdict, its power and the record gate: pure functions.

Definitions follow DESIGN.md: a pair is a candidate leg against the control leg
it is paired with (B1 vs A1, B2 vs A2, and B3 vs A3, B4 vs A4 in a second block).

The verdict (`leg_analysis`) treats the leg, not the row, as the unit of
replication: every fresh server runs at its own speed, and that between-leg
variance is what a speed claim must beat. Each leg is reduced to one robust
figure: the Hodges-Lehmann location (median of the pairwise row averages) of its
log rates relative to each row's mean across legs. The rows' own difficulty cancels
exactly, a stalled row cannot move it, and it keeps 95 % of a mean's efficiency
where a plain median keeps 64 % (and, measured against the rows' median instead
of their mean, let the interval's coverage fall to 91 % at large row noise). A t
interval is then taken on those figures with a block effect and a treatment
effect: the split-plot analysis that Kalibera & Jones (ISMM 2013)
recommend, with repetitions at the level whose variance dominates. Within an
ABBA or BAAB block a linear drift is orthogonal to the treatment, so it biases
nothing and only widens the interval.

`paired_bootstrap` is the verdict of records made before that
(`tokrecord.experiment-record/v1`); it is kept so that they still verify.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import StrEnum
from functools import lru_cache, partial
from typing import Final

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from tokrecord.experiment import dist
from tokrecord.experiment.plan import Criteria, VerdictSpec


class LegFigures(BaseModel):
    """What the experiment layer needs of a leg (built from its LegResult and rows)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    arm: str
    headline: float | None
    row_rates: tuple[float | None, ...]  # headline convention, by row index
    aggregate_cycle_ms: float | None
    acceptance_rate: float | None


class PairResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate: str
    control: str
    headline_delta_pct: float | None
    candidate_row_wins: str
    paired_median_delta_pct: float | None
    aggregate_cycle_saving_ms: float | None
    acceptance_rate_delta_percentage_points: float | None
    passed: bool
    failed_criteria: tuple[str, ...] = ()


def pct_delta(candidate: float, control: float) -> float:
    return 100.0 * (candidate / control - 1.0)


def pair_result(candidate: LegFigures, control: LegFigures, criteria: Criteria) -> PairResult:
    rows = [
        (c, a) for c, a in zip(candidate.row_rates, control.row_rates, strict=False)
        if c is not None and a is not None and a > 0
    ]
    wins = sum(1 for c, a in rows if c > a)
    per_row = [pct_delta(c, a) for c, a in rows]
    head = (pct_delta(candidate.headline, control.headline)
            if candidate.headline is not None and control.headline else None)
    paired = float(statistics.median(per_row)) if per_row else None
    saving = (control.aggregate_cycle_ms - candidate.aggregate_cycle_ms
              if control.aggregate_cycle_ms is not None and candidate.aggregate_cycle_ms is not None
              else None)
    acc = (100.0 * (candidate.acceptance_rate - control.acceptance_rate)
           if candidate.acceptance_rate is not None and control.acceptance_rate is not None
           else None)
    failed = []
    if head is None or not head > criteria.headline_delta_pct_gt:
        failed.append(f"headline delta {_f(head)} % not > {criteria.headline_delta_pct_gt:g} %")
    if paired is None or not paired > criteria.paired_median_delta_pct_gt:
        failed.append(f"paired median delta {_f(paired)} % not > "
                      f"{criteria.paired_median_delta_pct_gt:g} %")
    total = len(candidate.row_rates)
    if not (total and wins / total > criteria.row_wins_fraction_gt):
        failed.append(f"row wins {wins}/{total} not > {criteria.row_wins_fraction_gt:g}")
    return PairResult(
        candidate=candidate.name, control=control.name, headline_delta_pct=head,
        candidate_row_wins=f"{wins}/{total}", paired_median_delta_pct=paired,
        aggregate_cycle_saving_ms=saving, acceptance_rate_delta_percentage_points=acc,
        passed=not failed, failed_criteria=tuple(failed),
    )


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


class Verdict(StrEnum):
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    NO_DIFFERENCE = "NO DIFFERENCE"
    UNDECIDED = "UNDECIDED"


class BootstrapResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    samples: int
    seed: int
    equivalence_pct: float
    verdict: Verdict
    method: str = (
        "paired bootstrap of candidate/control: in each pair the same resampled row indices "
        "are applied to both legs (rows resampled within legs, legs kept as blocks); "
        "statistic = mean of candidate leg medians / mean of control leg medians"
    )


def paired_bootstrap(
    pairs: Sequence[tuple[LegFigures, LegFigures]], spec: VerdictSpec
) -> BootstrapResult | None:
    """CI for the candidate/control ratio; None when some pair has no comparable rows."""
    arrays = []
    for cand, ctrl in pairs:
        keep = [i for i, (c, a) in enumerate(zip(cand.row_rates, ctrl.row_rates, strict=False))
                if c is not None and a is not None]
        if not keep:
            return None
        arrays.append((np.array([cand.row_rates[i] for i in keep], dtype=np.float64),
                       np.array([ctrl.row_rates[i] for i in keep], dtype=np.float64)))
    rng = np.random.default_rng(spec.seed)
    cand_medians = np.empty((spec.bootstrap_samples, len(arrays)))
    ctrl_medians = np.empty_like(cand_medians)
    for p, (c, a) in enumerate(arrays):
        idx = rng.integers(0, len(c), size=(spec.bootstrap_samples, len(c)))
        cand_medians[:, p] = np.median(c[idx], axis=1)
        ctrl_medians[:, p] = np.median(a[idx], axis=1)
    ratios = cand_medians.mean(axis=1) / ctrl_medians.mean(axis=1)
    point = float(np.mean([np.median(c) for c, _ in arrays]) /
                  np.mean([np.median(a) for _, a in arrays]))
    alpha = 1.0 - spec.confidence
    low, high = (float(v) for v in np.quantile(ratios, [alpha / 2, 1 - alpha / 2]))
    return BootstrapResult(
        ratio=point, ci_low=low, ci_high=high, confidence=spec.confidence,
        samples=spec.bootstrap_samples, seed=spec.seed, equivalence_pct=spec.equivalence_pct,
        verdict=verdict(low, high, spec.equivalence_pct),
    )


def verdict(ci_low: float, ci_high: float, equivalence_pct: float) -> Verdict:
    """NO DIFFERENCE when the whole interval lies within ±equivalence of no change (even if
    it excludes 1: such an effect is too small to claim); else FASTER / SLOWER when it
    excludes 1; else UNDECIDED."""
    margin = equivalence_pct / 100.0
    if 1 - margin <= ci_low and ci_high <= 1 + margin:
        return Verdict.NO_DIFFERENCE
    if ci_low > 1:
        return Verdict.FASTER
    if ci_high < 1:
        return Verdict.SLOWER
    return Verdict.UNDECIDED


# --------------------------------------------------------------------------- the leg-level verdict

# Below this many residual degrees of freedom the between-leg variance is not
# estimated well enough to bound anything: t(0.975, 1) is 12.7, and one df means
# the whole noise estimate rests on a single difference.
MIN_LEG_DF: Final = 2
# Var(Hodges-Lehmann of n normals) ~ (pi/3) sigma^2 / n (asymptotic efficiency 3/pi):
# the small price of a leg figure that one stalled row cannot move. The planner uses it.
HL_VARIANCE_FACTOR: Final = math.pi / 3
# MAD to sd for a normal distribution.
_MAD_TO_SD: Final = 1.482602218505602
ANALYSIS_METHOD: Final = (
    "leg-level t interval (split-plot, legs as the unit of replication): each leg's figure "
    "is the Hodges-Lehmann location over rows of log(row rate) minus the row's mean across "
    "legs; a least-"
    "squares fit of those figures on block and treatment gives the effect, and its interval "
    "uses the residual between-leg variance with t on its degrees of freedom"
)
ANALYSIS_STATISTIC: Final = (
    "candidate/control = exp(treatment effect on the legs' Hodges-Lehmann log rate relative "
    "to each row's mean over legs); rows rated in every leg only"
)


class AnalysisLeg(BaseModel):
    """A leg as the verdict sees it: its figures, its block and whether it is treated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    figures: LegFigures
    block: int = Field(ge=1)
    treated: bool


class VerdictAnalysis(BaseModel):
    """The verdict with the noise that bounds it, as recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    statistic: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    equivalence_pct: float
    blocks: int
    legs: int
    rows_used: int
    df: int  # residual degrees of freedom of the leg-level fit (the t interval's)
    leg_statistics: dict[str, float]  # each leg's figure, 100 x log units
    residual_sd_pct: float | None  # sd of a leg's figure: between-leg and row parts together
    leg_noise_sd_pct: float | None  # its between-leg part (the row part removed)
    leg_noise_df: int
    row_noise_sd_pct: float | None  # within a leg, row to row (robust: MAD of the residuals)
    row_noise_df: int
    verdict: Verdict
    # A record is a stronger claim than a verdict: the record gate asks for FASTER at this
    # higher confidence (0.98 two-sided: at most 1 % false records in an A/A experiment).
    record_confidence: float
    record_ci_low: float | None
    record_ci_high: float | None
    record_verdict: Verdict
    reason: str


def leg_analysis(legs: Sequence[AnalysisLeg], confidence: float, equivalence_pct: float,
                 record_confidence: float = 0.98) -> VerdictAnalysis:
    """The verdict on candidate/control with between-leg variance in its interval."""
    names = [leg.figures.name for leg in legs]
    blocks = len({leg.block for leg in legs})
    base = partial(VerdictAnalysis, method=ANALYSIS_METHOD, statistic=ANALYSIS_STATISTIC,
                   confidence=confidence, equivalence_pct=equivalence_pct, blocks=blocks,
                   legs=len(legs), record_confidence=record_confidence)

    def undecided(reason: str, rows: int = 0, df: int = 0,
                  stats: dict[str, float] | None = None) -> VerdictAnalysis:
        return base(
            ratio=None, ci_low=None, ci_high=None, rows_used=rows, df=df,
            leg_statistics=stats or {}, residual_sd_pct=None, leg_noise_sd_pct=None,
            leg_noise_df=df, row_noise_sd_pct=None, row_noise_df=0,
            verdict=Verdict.UNDECIDED, record_ci_low=None, record_ci_high=None,
            record_verdict=Verdict.UNDECIDED, reason=reason)

    if not any(leg.treated for leg in legs) or all(leg.treated for leg in legs):
        return undecided("both arms are needed: every leg is on one side")
    width = min((len(leg.figures.row_rates) for leg in legs), default=0)
    keep = [i for i in range(width)
            if all((r := leg.figures.row_rates[i]) is not None and r > 0 for leg in legs)]
    if not keep:
        return undecided("no row has a rate in every leg")
    z = np.log(np.array([[leg.figures.row_rates[i] for i in keep] for leg in legs],
                        dtype=np.float64))
    dev = z - z.mean(axis=0)  # the rows' own speed cancels
    m = hodges_lehmann_rows(dev)
    stats = {n: round(float(100 * v), 9) for n, v in zip(names, m, strict=True)}
    n_legs, n_rows = z.shape
    row_sd, row_df = _row_noise(dev - m[:, None], n_legs, n_rows)
    fit = fit_legs(m, [leg.block for leg in legs], [leg.treated for leg in legs])
    if isinstance(fit, str):
        return undecided(fit, len(keep), 0, stats)
    tau, se, df, s2 = fit
    t = t_quantile(0.5 + confidence / 2, df)
    low, high = math.exp(tau - t * se), math.exp(tau + t * se)
    t_rec = t_quantile(0.5 + record_confidence / 2, df)
    rec_low, rec_high = math.exp(tau - t_rec * se), math.exp(tau + t_rec * se)
    leg_var = s2 - HL_VARIANCE_FACTOR * row_sd**2 / n_rows if row_sd is not None else s2
    found = verdict(low, high, equivalence_pct)
    return base(
        ratio=math.exp(tau), ci_low=low, ci_high=high, rows_used=len(keep), df=df,
        leg_statistics=stats, residual_sd_pct=100 * math.sqrt(s2),
        leg_noise_sd_pct=100 * math.sqrt(max(leg_var, 0.0)), leg_noise_df=df,
        row_noise_sd_pct=None if row_sd is None else 100 * row_sd, row_noise_df=row_df,
        verdict=found, record_ci_low=rec_low, record_ci_high=rec_high,
        record_verdict=verdict(rec_low, rec_high, equivalence_pct),
        reason=f"t({df}) = {t:.3f} on {n_legs} legs in {blocks} block(s), {len(keep)} rows each",
    )


def fit_legs(values: NDArray[np.float64] | Sequence[float], blocks: Sequence[int],
             treated: Sequence[bool]) -> tuple[float, float, int, float] | str:
    """Least squares of leg figures on block and treatment: (effect, its se, residual df,
    residual variance), or why it cannot be estimated."""
    y = np.asarray(values, dtype=np.float64)
    block_ids = sorted(set(blocks))
    x = np.array([[1.0 if blk == b else 0.0 for b in block_ids] + [1.0 if t else 0.0]
                  for blk, t in zip(blocks, treated, strict=True)])
    rank = int(np.linalg.matrix_rank(x))
    if rank < x.shape[1]:
        return "the treatment is confounded with the blocks: no block holds both arms"
    df = len(y) - rank
    if df < MIN_LEG_DF:
        return (f"too few legs to estimate between-leg noise: {len(y)} legs leave {df} "
                f"degree(s) of freedom, {MIN_LEG_DF} are needed")
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    s2 = float(resid @ resid) / df
    se = math.sqrt(s2 * float(np.linalg.inv(x.T @ x)[-1, -1]))
    return float(beta[-1]), se, df, s2


@lru_cache(maxsize=1024)
def t_quantile(q: float, df: int) -> float:
    """scipy's t quantile, remembered: the interim looks ask for the same few again and
    again."""
    return float(dist.t_ppf(q, df))


def hodges_lehmann(values: NDArray[np.float64]) -> float:
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j."""
    i, j = _walsh_pairs(len(values))
    return float(np.median((values[i] + values[j]) / 2))


def hodges_lehmann_rows(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """`hodges_lehmann` of each row of a 2-D array, in one pass (the same figures: the
    sequential bench and every interim look call it thousands of times)."""
    i, j = _walsh_pairs(values.shape[1])
    return np.asarray(np.median((values[:, i] + values[:, j]) / 2, axis=1), dtype=np.float64)


@lru_cache(maxsize=64)
def _walsh_pairs(n: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    i, j = np.triu_indices(n)
    i.flags.writeable = j.flags.writeable = False  # shared by every caller
    return i, j


def _row_noise(resid: NDArray[np.float64], n_legs: int, n_rows: int) -> tuple[float | None, int]:
    """Row-to-row sd within a leg, from the two-way residuals: robust (MAD), and scaled up
    for the two fitted margins, which shrink residuals by (L-1)(R-1)/(LR)."""
    df = (n_legs - 1) * (n_rows - 1)
    if df < 1:
        return None, 0
    mad = float(np.median(np.abs(resid)))
    return _MAD_TO_SD * mad / math.sqrt(df / (n_legs * n_rows)), df


# --------------------------------------------------------------------------- power


class Noise(BaseModel):
    """Noise figures for the planner: sd of log rate x 100 (about a percentage)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sd_leg_pct: float = Field(ge=0)
    sd_row_pct: float = Field(ge=0)
    leg_df: int | None = None  # how well the figures are known; None when given by hand
    sources: tuple[str, ...] = ()


def leg_sd_pct(noise: Noise, rows: int) -> float:
    """The sd of one leg's figure: between-leg noise plus the row noise its location keeps."""
    return math.sqrt(noise.sd_leg_pct**2 + HL_VARIANCE_FACTOR * noise.sd_row_pct**2 / rows)


def abba_df(blocks: int) -> int:
    """Residual df of the leg-level fit: 4k legs less k block effects and one treatment."""
    return 3 * blocks - 1


def power(effect_pct: float, noise: Noise, rows: int, blocks: int, confidence: float,
          equivalence_pct: float) -> float:
    """P(verdict FASTER) for a true effect, under the analysis' own model: the effect
    estimate is normal with sd sigma/sqrt(k), sigma^2 is estimated on 3k-1 df, and FASTER
    needs the interval above 1 and not inside the equivalence band."""
    return _power(effect_pct, leg_sd_pct(noise, rows), blocks, confidence, equivalence_pct)


@lru_cache(maxsize=4096)
def _power(effect_pct: float, sd_pct: float, blocks: int, confidence: float,
           equivalence_pct: float) -> float:
    # Cached: a plan's power table, blocks_for_power's search and the planner's designs ask
    # the same points again. The integrand calls experiment.dist (scipy.stats' norm.sf and
    # chi2.pdf to the bit), without scipy.stats' per-call argument handling, which was most
    # of the cost.
    df = abba_df(blocks)
    if df < MIN_LEG_DF:
        return 0.0
    sigma = sd_pct / 100
    delta = math.log1p(effect_pct / 100)
    band = math.log1p(equivalence_pct / 100)
    t = float(dist.t_ppf(0.5 + confidence / 2, df))
    scale = 1 / math.sqrt(blocks)  # se = s * scale; a balanced design
    if sigma == 0:
        return 1.0 if delta > band else 0.0
    def given(u: float) -> float:
        # u = s/sigma with df*u^2 ~ chi2(df); FASTER iff tau_hat > max(t se, band - t se)
        se_hat = sigma * u * scale
        need = max(t * se_hat, band - t * se_hat)
        return float(dist.norm_sf((need - delta) / (sigma * scale)))

    def density(u: float) -> float:
        return float(dist.chi2_pdf(df * u * u, df) * 2 * df * u)

    value = float(dist.quad_to_inf(lambda u: given(u) * density(u)))
    return min(max(value, 0.0), 1.0)


def blocks_for_power(effect_pct: float, noise: Noise, rows: int, confidence: float,
                     equivalence_pct: float, target: float = 0.9,
                     most: int = 50) -> int | None:
    """The fewest blocks whose power reaches the target; None if even `most` fall short."""
    for k in range(1, most + 1):
        if power(effect_pct, noise, rows, k, confidence, equivalence_pct) >= target:
            return k
    return None


def noise_from_analysis(analysis: VerdictAnalysis, source: str) -> Noise | None:
    if analysis.leg_noise_sd_pct is None or analysis.row_noise_sd_pct is None:
        return None
    return Noise(sd_leg_pct=analysis.leg_noise_sd_pct, sd_row_pct=analysis.row_noise_sd_pct,
                 leg_df=analysis.leg_noise_df, sources=(source,))


def pool_noise(parts: Sequence[Noise]) -> Noise:
    """Variances pooled with their degrees of freedom as weights (1 each when unknown)."""
    if not parts:
        raise ValueError("no noise figures to pool")
    weights = [float(p.leg_df or 1) for p in parts]
    total = sum(weights)
    leg = sum(w * p.sd_leg_pct**2 for w, p in zip(weights, parts, strict=True)) / total
    row = sum(w * p.sd_row_pct**2 for w, p in zip(weights, parts, strict=True)) / total
    dfs = [p.leg_df for p in parts]
    return Noise(sd_leg_pct=math.sqrt(leg), sd_row_pct=math.sqrt(row),
                 leg_df=sum(d for d in dfs if d) if all(dfs) else None,
                 sources=tuple(s for p in parts for s in p.sources))


class RecordGate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_lower_start_tok_s: float | None
    candidate_higher_start_tok_s: float | None
    control_lower_start_tok_s: float | None
    prior_record_tok_s: float | None
    delta_vs_prior_record_tok_s: float | None
    delta_vs_prior_record_pct: float | None
    quality_passed_all_legs: bool
    pairs_passed: bool
    verdict: Verdict | None
    strict_preregistered_record_pass: bool
    reasons: tuple[str, ...] = ()


def record_gate(
    candidates: Sequence[LegFigures],
    controls: Sequence[LegFigures],
    pairs: Sequence[PairResult],
    quality_passed: bool,
    prior: float | None,
    found: Verdict | None,
    require_faster: bool,
    claim: str | None = None,
    found_label: str = "verdict",
    more_reasons: Sequence[str] = (),
    pairs_required: bool = True,
) -> RecordGate:
    """Strict preregistered gate: every quality gate in every leg, every pair passes, and
    the lowest candidate headline beats the prior record (and, when declared, the verdict
    is FASTER). `claim`, when given, is why this design can make no record at all."""
    cand = [c.headline for c in candidates if c.headline is not None]
    ctrl = [c.headline for c in controls if c.headline is not None]
    lower = min(cand) if len(cand) == len(candidates) and cand else None
    higher = max(cand) if cand else None
    reasons = [claim] if claim else []
    reasons += more_reasons
    if not quality_passed:
        reasons.append("a quality gate did not pass in every leg")
    # A sweep has no pairs: its arms are compared in one fit (experiment.sweep).
    pairs_ok = (bool(pairs) and all(p.passed for p in pairs)) if pairs_required else True
    if not pairs_ok:
        reasons.append("not every pair passed its preregistered criteria")
    delta = pct = None
    if prior is None:
        reasons.append("no prior record declared in the plan")
    elif lower is None:
        reasons.append("a candidate leg has no headline")
    else:
        delta, pct = lower - prior, pct_delta(lower, prior)
        if not lower > prior:
            reasons.append(f"lower candidate headline {lower:.3f} does not beat the prior "
                           f"record {prior:.3f}")
    if require_faster and found is not Verdict.FASTER:
        reasons.append(f"{found_label} is {found.value if found else 'not computed'}, not FASTER")
    return RecordGate(
        candidate_lower_start_tok_s=lower, candidate_higher_start_tok_s=higher,
        control_lower_start_tok_s=min(ctrl) if ctrl else None, prior_record_tok_s=prior,
        delta_vs_prior_record_tok_s=delta, delta_vs_prior_record_pct=pct,
        quality_passed_all_legs=quality_passed, pairs_passed=pairs_ok, verdict=found,
        strict_preregistered_record_pass=not reasons, reasons=tuple(reasons),
    )
