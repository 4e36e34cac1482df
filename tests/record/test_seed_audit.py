"""The seed audit's rules (bench/seedaudit): every seed leaf has one, and the lookups
they rely on behave. The audit itself (python -m bench.seedaudit) makes real records."""

from __future__ import annotations

import json
import re

import pytest
from bench.seedaudit.__main__ import _MISSING, classify, leaves, lookup
from bench.seedaudit.rules import ABBA, SINGLE, Outcome

from paths import FIXTURES

SEEDS = FIXTURES / "seeds"


@pytest.mark.parametrize(("seed", "rules"), [("abba-experiment-record.json", ABBA),
                                             ("single-leg-record.json", SINGLE)])
def test_every_seed_leaf_has_a_rule(seed: str, rules: tuple[tuple[str, Outcome], ...]) -> None:
    unmatched = [leaf for leaf, _ in leaves(json.loads((SEEDS / seed).read_text()))
                 if not any(re.fullmatch(p, leaf) for p, _ in rules)]
    assert unmatched == []


def test_leaves_keep_lists_of_values_whole() -> None:
    assert list(leaves({"a": {"b": [1, 2]}, "c": [{"d": 1}], "e": {}})) == [
        ("a.b", [1, 2]), ("c[0].d", 1), ("e", {})]


def test_lookup_follows_keys_that_hold_dots() -> None:
    record = {"sha256": {"rows.json": "x"}, "a": {"b": None}}
    assert lookup(record, "sha256.rows.json") == "x"
    assert lookup(record, "a.b") is None
    assert lookup(record, "a.c") is _MISSING


def test_classify_produced_missing_null_and_not_applicable() -> None:
    record = {"graph": {"mode": "NONE", "graphs_per_rank": None, "not_reported": ["x"]},
              "artifacts": {"root": "/x"}, "summary": {"tok_s_out": None}}
    assert classify("graph.mode", SINGLE, record, {})[0] == "produced"
    # Null where the rule says why a null is the honest value: produced, with the reason.
    kind, detail = classify("graph.graphs_per_rank", SINGLE, record, {})
    assert kind == "produced" and "not_reported" in detail
    assert classify("summary.tok_s_out", SINGLE, record, {}) == (
        "missing", "summary.tok_s_out is null")
    assert classify("summary.ttft_ms_median", SINGLE, record, {})[0] == "missing"
    assert classify("sha256.evidence_manifest", SINGLE, record, {})[0] == "not applicable"
    assert classify("no.such.leaf", SINGLE, record, {}) == ("missing", "no rule")
