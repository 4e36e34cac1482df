"""The distribution functions the statistics use, taken from scipy.special: the ufuncs
scipy.stats itself calls for them, with the same arithmetic around them, so the same bits.
Importing scipy.stats costs about 0.5 s of CPU more than scipy.special, in every process that
loads the experiment code (each `tokrecord` command).

`tests/experiment/test_dist.py` checks each against scipy.stats, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

# scipy.stats' rv_continuous returns `_ppf(q) * scale + loc`: with loc 0 a -0.0 becomes 0.0.
_LOC = 0.0
_SQRT_2PI = np.sqrt(2 * np.pi)
_LOG_2 = np.log(2)


def t_ppf(q: Any, df: Any) -> Any:
    """Student's t quantile (scipy.stats.t.ppf)."""
    return special.stdtrit(df, q) + _LOC


def t_isf(q: Any, df: Any) -> Any:
    """Student's t upper quantile (scipy.stats.t.isf)."""
    return -special.stdtrit(df, q) + _LOC


def norm_cdf(x: Any) -> Any:
    """Standard normal CDF (scipy.stats.norm.cdf)."""
    return special.ndtr(np.asarray(x, dtype=float))


def norm_sf(x: Any) -> Any:
    """Standard normal upper tail (scipy.stats.norm.sf)."""
    return special.ndtr(-np.asarray(x, dtype=float))


def norm_isf(q: Any) -> Any:
    """Standard normal upper quantile (scipy.stats.norm.isf)."""
    return -special.ndtri(q) + _LOC


def norm_pdf(x: Any) -> Any:
    """Standard normal density (scipy.stats.norm.pdf)."""
    x = np.asarray(x, dtype=float)
    return np.exp(-x**2 / 2.0) / _SQRT_2PI


def chi2_pdf(x: Any, df: Any) -> Any:
    """Chi-square density (scipy.stats.chi2.pdf), through its log as scipy computes it."""
    x = np.asarray(x, dtype=float)
    return np.exp(special.xlogy(df / 2.0 - 1, x) - x / 2.0 - special.gammaln(df / 2.0)
                  - (_LOG_2 * df) / 2.0)


def chi2_ppf(q: Any, df: Any) -> Any:
    """Chi-square quantile (scipy.stats.chi2.ppf)."""
    return 2 * special.gammaincinv(np.asarray(df) / 2, q) + _LOC
