"""The sequential sweep's stopping rule (experiment.sweep_sequential): its boundaries
spend what the spending function allows for the largest of k-1 t statistics, and the
rule stops at the first look that decides, never later."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokrecord.experiment.plan import SequentialSpec, Spending
from tokrecord.experiment.sequential import Action, spent
from tokrecord.experiment.stats import LegFigures, Verdict
from tokrecord.experiment.sweep import SweepLegInput, dunnett_critical, sweep_design
from tokrecord.experiment.sweep_sequential import (
    blocks_needed,
    max_t_boundaries,
    sequential_sweep,
    sweep_look_boundary,
)


def test_one_look_is_the_one_sided_dunnett_value() -> None:
    # with one planned look the whole alpha is spent there: Dunnett (1955), one-sided
    for k, b in ((3, 4), (5, 6)):
        (c,) = max_t_boundaries(k, (b,), b, 0.025, Spending.OBRIEN_FLEMING, sims=100_000)
        assert c == pytest.approx(dunnett_critical(k - 1, (k - 1) * (b - 1), 0.975, False),
                                  abs=0.03)


def _null_crossing(k: int, looks: tuple[int, ...], cs: tuple[float, ...], sims: int,
                   seed: int) -> np.ndarray:
    """Whether each null path's max t crosses some look's boundary, by the plain fit
    (fresh draws, other seed): block + arm least squares, as experiment.sweep fits it."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((sims, looks[-1], k))
    crossed = np.zeros(sims, dtype=bool)
    for b, c in zip(looks, cs, strict=True):
        y = e[:, :b, :]
        resid = y - y.mean(axis=2, keepdims=True) - y.mean(axis=1, keepdims=True) \
            + y.mean(axis=(1, 2), keepdims=True)
        df = (k - 1) * (b - 1)
        s2 = (resid ** 2).sum(axis=(1, 2)) / df
        means = y.mean(axis=1)
        t = (means[:, 1:] - means[:, :1]).max(axis=1) / np.sqrt(2 * s2 / b)
        crossed |= t > c
    return crossed


@pytest.mark.parametrize("spending", [Spending.OBRIEN_FLEMING, Spending.POCOCK])
def test_the_boundaries_spend_the_family_wise_alpha_over_all_looks(spending: Spending) -> None:
    # On independent paths fitted the plain way, P(max_i t_i crosses at some look) is the
    # alpha spent: 2.5 %, within 4 Monte-Carlo sd; at each look the cumulative spend too.
    # Dunnett's single-look value at every look would cross far more often (checked).
    k, looks = 4, (2, 3, 4, 5, 6)
    cs = max_t_boundaries(k, looks, 6, 0.025, spending, sims=100_000)
    sims = 60_000
    crossed = _null_crossing(k, looks, cs, sims, seed=7)
    sd = math.sqrt(0.025 * 0.975 / sims)
    assert abs(crossed.mean() - 0.025) < 4 * sd
    naive = tuple(dunnett_critical(k - 1, (k - 1) * (b - 1), 0.975, False) for b in looks)
    assert _null_crossing(k, looks, naive, sims, seed=7).mean() > 0.04
    half = _null_crossing(k, looks[:3], cs[:3], sims, seed=8).mean()
    assert abs(half - spent(spending, 0.025, 4 / 6)) < 4 * sd + 0.002


def _legs(effects: list[float], blocks: int, sd: float, seed: int,
          exact: tuple[bool, ...] | None = None) -> list[SweepLegInput]:
    rng = np.random.default_rng(seed)
    arms = [f"a{i}" for i in range(len(effects))]
    out = []
    for leg in sweep_design(arms, blocks):
        i = arms.index(leg.arm)
        z = math.log(1000) + effects[i] + rng.normal(0, sd) + rng.normal(0, 0.01, 8)
        rates = tuple(float(r) for r in np.exp(z))
        out.append(SweepLegInput(
            figures=LegFigures(name=leg.name, arm=leg.arm, headline=float(np.median(rates)),
                               row_rates=rates, aggregate_cycle_ms=None, acceptance_rate=None),
            block=leg.block, exact=True if exact is None else exact[i]))
    return out


SPEC = SequentialSpec(min_blocks=2, max_blocks=5, spending=Spending.POCOCK)
ARMS = ("a0", "a1", "a2")


def test_a_clear_best_arm_stops_the_first_look_and_no_block_after_it_is_wanted() -> None:
    legs = _legs([0.0, 0.3, 0.1], 4, 0.002, seed=1)
    seq, found = sequential_sweep(legs, ARMS, "a0", SPEC, 0.95, 0.98, 1.0)
    assert seq.stopped and seq.stopped_at == "block 2" and len(seq.looks) == 1
    look = seq.looks[0]
    assert look.action is Action.STOP and look.best == "a1" and look.verdict is Verdict.FASTER
    assert found.blocks == 2 and found.best == "a1" and found.critical_value == look.boundary
    # blocks 3 and 4 were (wrongly) run: the rule still asks for 2, so resume and verify
    # never go past it
    assert blocks_needed(legs, ARMS, "a0", SPEC, 0.95, 0.98, 1.0) == 2


def test_an_inexact_arm_is_never_best_even_when_fastest() -> None:
    legs = _legs([0.0, 0.3, 0.1], 2, 0.002, seed=1, exact=(True, False, True))
    seq, found = sequential_sweep(legs, ARMS, "a0", SPEC, 0.95, 0.98, 1.0)
    assert found.best == "a2" and seq.looks[0].best == "a2"


def test_no_difference_goes_on_until_max_blocks_and_then_stops() -> None:
    legs = _legs([0.0, 0.0, 0.0], 5, 0.02, seed=3)
    for b in (2, 3, 4):
        part = [leg for leg in legs if leg.block <= b]
        seq, _ = sequential_sweep(part, ARMS, "a0", SPEC, 0.95, 0.98, 1.0)
        assert not seq.stopped and [x.action for x in seq.looks][-1] is Action.CONTINUE
        assert blocks_needed(part, ARMS, "a0", SPEC, 0.95, 0.98, 1.0) == b + 1
    seq, found = sequential_sweep(legs, ARMS, "a0", SPEC, 0.95, 0.98, 1.0)
    assert seq.stopped and seq.stopped_at == "block 5" and len(seq.looks) == 4
    assert found.best is None and found.blocks == 5


def test_every_arm_decided_stops_without_a_best_arm() -> None:
    # two arms equal and 10 % faster than control, within a 1 % band of each other:
    # no single best, but every interval decides (FASTER), so the rule stops
    legs = _legs([0.0, 0.1, 0.1], 5, 0.001, seed=4)
    seq, found = sequential_sweep(legs, ARMS, "a0", SPEC, 0.95, 0.98, 1.0)
    assert seq.stopped_at == "block 2" and found.best is None
    assert seq.looks[0].decided == ("a1", "a2")


def test_lint_boundary_refuses_hostile_sections() -> None:
    good = {"min_blocks": 2, "max_blocks": 5, "spending": "pocock"}
    assert sweep_look_boundary(good, 3, 2, 0.95) == pytest.approx(
        max_t_boundaries(3, (2, 3, 4, 5), 5, 0.025, Spending.POCOCK)[0])
    for bad in ({**good, "max_blocks": 10**9}, {**good, "spending": "x"},
                {**good, "min_blocks": True}, {**good, "min_blocks": 3}):
        assert sweep_look_boundary(bad, 3, 2, 0.95) is None
    assert sweep_look_boundary(good, 11, 2, 0.95) is None
