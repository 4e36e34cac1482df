"""The distribution functions the statistics use, taken from scipy.special: the ufuncs
scipy.stats itself calls for them, with the same arithmetic around them, so the same bits;
and the two numerical routines they need, a root finder and an integral.
Importing scipy.stats costs about 0.5 s of CPU more than scipy.special, in every process that
loads the experiment code (each `tokrecord` command). Even scipy.special (0.25 s), optimize
(0.8 s) and integrate (0.9 s) are imported only when first called: most commands, fake
servers and test workers that load this code never compute a distribution.

`tests/experiment/test_dist.py` checks each against scipy.stats, bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

# scipy.stats' rv_continuous returns `_ppf(q) * scale + loc`: with loc 0 a -0.0 becomes 0.0.
_LOC = 0.0
_SQRT_2PI = np.sqrt(2 * np.pi)
_LOG_2 = np.log(2)


@cache
def _special() -> ModuleType:
    # Remembered: a plain import statement in each function costs 1 us a call, and the
    # power integrand calls these thousands of times.
    from scipy import special

    return special  # type: ignore[no-any-return]


def t_ppf(q: Any, df: Any) -> Any:
    """Student's t quantile (scipy.stats.t.ppf)."""
    return _special().stdtrit(df, q) + _LOC


def t_isf(q: Any, df: Any) -> Any:
    """Student's t upper quantile (scipy.stats.t.isf)."""
    return -_special().stdtrit(df, q) + _LOC


def norm_cdf(x: Any) -> Any:
    """Standard normal CDF (scipy.stats.norm.cdf)."""
    return _special().ndtr(np.asarray(x, dtype=float))


def norm_sf(x: Any) -> Any:
    """Standard normal upper tail (scipy.stats.norm.sf)."""
    return _special().ndtr(-np.asarray(x, dtype=float))


def norm_isf(q: Any) -> Any:
    """Standard normal upper quantile (scipy.stats.norm.isf)."""
    return -_special().ndtri(q) + _LOC


def norm_pdf(x: Any) -> Any:
    """Standard normal density (scipy.stats.norm.pdf)."""
    x = np.asarray(x, dtype=float)
    return np.exp(-x**2 / 2.0) / _SQRT_2PI


def chi2_pdf(x: Any, df: Any) -> Any:
    """Chi-square density (scipy.stats.chi2.pdf), through its log as scipy computes it."""
    x = np.asarray(x, dtype=float)
    return np.exp(_special().xlogy(df / 2.0 - 1, x) - x / 2.0 - _special().gammaln(df / 2.0)
                  - (_LOG_2 * df) / 2.0)


def chi2_ppf(q: Any, df: Any) -> Any:
    """Chi-square quantile (scipy.stats.chi2.ppf)."""
    return 2 * _special().gammaincinv(np.asarray(df) / 2, q) + _LOC


def quad_to_inf(f: Callable[[float], float]) -> float:
    """The integral of f over [0, inf) (scipy.integrate.quad, at most 200 subintervals)."""
    from scipy import integrate

    return float(integrate.quad(f, 0, np.inf, limit=200)[0])


def brentq(f: Callable[[float], float], lo: float, hi: float, *, xtol: float) -> float:
    """The root of f in [lo, hi], where f changes sign (scipy.optimize.brentq)."""
    from scipy import optimize

    return float(optimize.brentq(f, lo, hi, xtol=xtol))
