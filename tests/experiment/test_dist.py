"""experiment.dist against scipy.stats, bit for bit: every verdict, boundary and power figure
goes through them, and a record sealed before must recompute to the same bytes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tokrecord.experiment import dist

# scipy.stats is imported in the tests that use it: every xdist worker collects every module,
# and importing it there costs each worker about 0.7 s of CPU (issue 28).

Q = np.concatenate([np.linspace(1e-6, 1 - 1e-6, 257), [0.5, 0.975, 0.99, 0.995, 1e-300, 0.025]])
DF = [1, 2, 3, 5, 7, 11, 20, 47, 100, 1000]
X = np.concatenate([np.linspace(-9, 9, 361), [0.0, -0.0, 1.959963984540054, 40.0]])


def _same(a: object, b: object) -> None:
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a_.shape == b_.shape
    assert a_.tobytes() == b_.tobytes()  # the bits, signed zeros included


@pytest.mark.parametrize("df", DF)
def test_t_quantiles_are_scipy_stats_to_the_bit(df: int) -> None:
    from scipy import stats as sps

    _same(dist.t_ppf(Q, df), sps.t.ppf(Q, df))
    _same(dist.t_isf(Q, df), sps.t.isf(Q, df))
    for q in (0.5, 0.975, 0.01):  # scalars, as the code calls them
        assert float(dist.t_ppf(q, df)).hex() == float(sps.t.ppf(q, df)).hex()
        assert float(dist.t_isf(q, df)).hex() == float(sps.t.isf(q, df)).hex()


def test_normal_functions_are_scipy_stats_to_the_bit() -> None:
    from scipy import stats as sps

    _same(dist.norm_cdf(X), sps.norm.cdf(X))
    _same(dist.norm_sf(X), sps.norm.sf(X))
    _same(dist.norm_pdf(X), sps.norm.pdf(X))
    _same(dist.norm_isf(Q), sps.norm.isf(Q))
    _same(dist.norm_pdf(X[:, None] - X[None, :40]), sps.norm.pdf(X[:, None] - X[None, :40]))
    assert float(dist.norm_isf(0.5)).hex() == float(sps.norm.isf(0.5)).hex() == "0x0.0p+0"


@pytest.mark.parametrize("df", DF)
def test_chi_square_quantile_and_density_are_scipy_stats_to_the_bit(df: int) -> None:
    from scipy import stats as sps

    _same(dist.chi2_ppf(Q, df), sps.chi2.ppf(Q, df))
    x = np.concatenate([np.linspace(1e-6, 4 * df, 301), [0.0, 1.0, float(df)]])
    _same(dist.chi2_pdf(x, df), sps.chi2.pdf(x, df))


def test_a_different_function_would_be_caught() -> None:
    from scipy import stats as sps

    # The comparison is strict enough to fail: one ulp off is a difference.
    with pytest.raises(AssertionError):
        _same(np.nextafter(sps.t.ppf(Q, 5), 1.0), sps.t.ppf(Q, 5))


def test_root_and_integral_are_scipys() -> None:
    from scipy import integrate, optimize

    f = lambda x: x**3 - 2 * x - 5  # noqa: E731
    assert dist.brentq(f, 2.0, 3.0, xtol=1e-12) == optimize.brentq(f, 2.0, 3.0, xtol=1e-12)
    g = lambda u: float(np.exp(-u * u))  # noqa: E731
    assert dist.quad_to_inf(g) == integrate.quad(g, 0, np.inf, limit=200)[0]
    assert dist.quad_to_inf(g) == pytest.approx(np.sqrt(np.pi) / 2, rel=1e-12)


def test_a_command_imports_no_scipy_until_it_computes() -> None:
    """Every `tokrecord` command loads the experiment code; scipy.special, optimize and
    integrate cost about 2 s of CPU to import, so they wait until a figure needs them."""
    code = ("import sys, tokrecord.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
    code = ("import sys; from tokrecord.experiment import dist; dist.norm_sf(1.0); "
            "print('scipy.special' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "True"
