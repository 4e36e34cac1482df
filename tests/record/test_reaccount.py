"""Re-accounting arithmetic: the single-leg seed's correction, reproduced from rows."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import rfc8785

from paths import FIXTURES
from tokrecord.errors import ConfigError
from tokrecord.metrics import Chunk, Convention, RowMetrics, row_metrics
from tokrecord.record.reaccount import LegRows, reaccount

SEED = json.loads((FIXTURES / "seeds" / "single-leg-record.json").read_text())
NS = 1_000_000_000
T_SEND = 5_000_000_000
TTFT_NS = 40_000_000


def row(window_ns: int, tokens: int = 120, per_chunk: int = 1) -> RowMetrics:
    """A row whose headline window (t_100 - t_1) lasts exactly `window_ns`."""
    t1 = T_SEND + TTFT_NS + 7_000_000
    times = [T_SEND + TTFT_NS] + [t1 + (k - 1) * window_ns // 99 for k in range(1, 100)]
    times += [t1 + window_ns + 8_000_000 * (k - 100) for k in range(100, tokens)]
    if per_chunk == 1:
        return row_metrics(T_SEND, [Chunk(t_ns=t, n=1) for t in times])
    # several tokens per chunk: each chunk arrives with its last token
    chunks = [Chunk(t_ns=times[min(i + per_chunk, tokens) - 1], n=min(per_chunk, tokens - i))
              for i in range(0, tokens, per_chunk)]
    return row_metrics(T_SEND, chunks)


def leg(name: str, rows: Sequence[RowMetrics], candidate: bool = True) -> LegRows:
    return LegRows(name=name, run_dir=f"{name}/attempt-1", events_sha256="ab" * 32,
                   row_ids=tuple((i, f"row-{i}") for i in range(len(rows))), rows=tuple(rows),
                   candidate=candidate)


def seed_leg() -> LegRows:
    """13 rows (the seed's 13/13) whose median legacy window rate is the seed's published
    headline: the median row's window is 100 events over 100 / 102.971... s."""
    published = SEED["metric_accounting"]["published_value_tok_s"]
    median_window = round(100 * NS / published)
    windows = [median_window + d * 45_000_000 for d in range(-6, 7)]
    return leg("B1", [row(w) for w in windows])


def seed_references() -> dict[str, float | None]:
    rec = SEED["record"]
    return {"goal": rec["goal_tok_s"], "prior_approved": rec["prior_approved_tok_s"],
            "prior_best_exact": rec["prior_best_exact_tok_s"]}


def test_single_leg_seed_correction_is_reproduced() -> None:
    acc, rec = SEED["metric_accounting"], SEED["record"]
    assert acc["published_convention"] == Convention.LEGACY.value
    out = reaccount([seed_leg()], Convention.LEGACY, Convention.CONVENTIONAL, seed_references(),
                    acc["disposition"], record_schema=SEED["schema"], version="test")
    before, after = out.original, out.reaccounted
    # Integer-nanosecond timestamps: within half a nanosecond of the seed's window.
    assert before.headline_tok_s == pytest.approx(acc["published_value_tok_s"], rel=1e-9)
    assert after.headline_tok_s == pytest.approx(acc["conventional_interval_value_tok_s"], rel=1e-9)
    assert (round(before.headline_tok_s, 3), round(after.headline_tok_s, 3)) == (102.971, 101.942)
    goal_before, goal_after = before.margins["goal"], after.margins["goal"]
    assert goal_before.reference_tok_s == goal_after.reference_tok_s == rec["goal_tok_s"] == 102.0
    assert goal_before.margin_tok_s == pytest.approx(rec["margin_over_goal_tok_s"], abs=1e-6)
    assert goal_after.margin_tok_s == pytest.approx(acc["conventional_margin_to_goal_tok_s"],
                                                    abs=1e-6)
    assert round(goal_after.margin_tok_s, 3) == -0.058
    best = before.margins["prior_best_exact"]
    assert best.margin_tok_s == pytest.approx(rec["delta_vs_prior_best_exact_tok_s"], abs=1e-6)
    assert best.margin_pct == pytest.approx(rec["delta_vs_prior_best_exact_pct"], abs=1e-6)
    approved = before.margins["prior_approved"]
    assert approved.margin_tok_s == pytest.approx(rec["delta_vs_approved_tok_s"], abs=1e-6)
    assert approved.margin_pct == pytest.approx(rec["delta_vs_approved_pct"], abs=1e-6)
    assert before.formula == "100 / (timestamp[100] - timestamp[1])"
    assert after.formula == "99 / (timestamp[100] - timestamp[1])"
    assert out.disposition == acc["disposition"]
    assert out.text == (
        "re-accounted legacy-inclusive-events 102.971 tok/s -> conventional 101.942 tok/s "
        "(goal 102: margin +0.971 -> -0.058; prior approved 94.92: margin +8.051 -> +7.022; "
        "prior best exact 100.525: margin +2.447 -> +1.417); disposition: "
        + acc["disposition"])


def test_per_row_rates_in_both_conventions() -> None:
    out = reaccount([seed_leg()], Convention.LEGACY, Convention.CONVENTIONAL, {}, "qualify",
                    record_schema="s", version="test")
    rows = out.legs["B1"].rows
    assert [r.row for r in rows] == list(range(13)) and rows[0].id == "row-0"
    for r in rows:
        assert r.original_tok_s is not None and r.reaccounted_tok_s is not None
        assert r.original_tok_s / r.reaccounted_tok_s == pytest.approx(100 / 99, rel=1e-12)
    assert out.legs["B1"].original_tok_s == out.original.headline_tok_s
    assert out.legs["B1"].reaccounted_tok_s == out.reaccounted.headline_tok_s
    assert out.original.margins == {} and out.original.rows_rated == 13
    assert out.events_sha256 == {"B1": "ab" * 32}
    payload = out.payload()
    assert payload["schema"] == "tokrecord.reaccount/v1" and "schema_id" not in payload
    assert payload["tokrecord_version"] == "test"
    rfc8785.dumps(payload)  # sealable: no NaN, nothing beyond JSON


def test_experiment_headline_is_the_lowest_candidate_in_each_convention() -> None:
    # B2's chunks carry 4 tokens: its per-token rates are quantised below its chunk-aware
    # rate, so the lowest candidate differs by convention. The control leg is slower but is
    # never the headline.
    b1 = leg("B1", [row(980_000_000), row(990_000_000), row(1_000_000_000)])
    b2 = leg("B2", [row(990_000_000, 121, per_chunk=4)] * 3)
    a1 = leg("A1", [row(2_000_000_000)] * 3, candidate=False)
    out = reaccount([a1, b1, b2], Convention.CONVENTIONAL, Convention.CHUNK_AWARE,
                    {"prior_approved": 90.0}, "note", record_schema="s", version="test")
    assert out.original.headline_leg == "B2"
    assert out.original.headline_tok_s == b2.rows[0].rate_conventional == pytest.approx(99.598,
                                                                                         abs=1e-3)
    assert out.original.quantisation_bound_pct == pytest.approx(300 / 99)  # per-token: its bound
    assert out.reaccounted.headline_leg == "B1"
    assert out.reaccounted.headline_tok_s == b1.rows[1].rate_chunk_aware == 100.0
    assert out.reaccounted.quantisation_bound_pct is None  # chunk-aware: none
    assert out.reaccounted.margins["prior_approved"].margin_tok_s == pytest.approx(10.0)
    assert not out.legs["A1"].candidate and out.legs["A1"].original_tok_s is not None
    assert set(out.events_sha256) == {"A1", "B1", "B2"}


def test_same_convention_is_refused() -> None:
    with pytest.raises(ConfigError, match="already publishes its headline in the conventional"):
        reaccount([seed_leg()], Convention.CONVENTIONAL, Convention.CONVENTIONAL, {}, "x",
                  record_schema="s", version="test")


def test_disposition_is_required() -> None:
    with pytest.raises(ConfigError, match="--disposition"):
        reaccount([seed_leg()], Convention.LEGACY, Convention.CONVENTIONAL, {}, "  ",
                  record_schema="s", version="test")


def test_rows_without_a_rate() -> None:
    empty = leg("B1", [row_metrics(T_SEND, [])])
    out = reaccount([empty], Convention.LEGACY, Convention.CONVENTIONAL, {"goal": 10.0}, "x",
                    record_schema="s", version="test")
    assert out.original.headline_tok_s is None and out.reaccounted.margins["goal"].margin_tok_s is None
    assert out.text == ("re-accounted legacy-inclusive-events no rate -> conventional no rate; "
                        "disposition: x")
    assert out.legs["B1"].rows[0].flags == ("no_tokens",)
