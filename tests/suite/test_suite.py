from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokrecord.errors import SuiteError
from tokrecord.suite import load_suite, parse_suite


def jsonl(*rows: dict) -> bytes:  # type: ignore[type-arg]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_default_suite_shape() -> None:
    suite = load_suite()
    assert len(suite.rows) == 13
    assert len({r.prompt for r in suite.rows}) == 13
    assert all(r.max_tokens == 512 for r in suite.rows)
    assert len(suite.sha256) == 64


def test_hash_changes_with_content() -> None:
    a = parse_suite(jsonl({"id": "a", "prompt": "x", "max_tokens": 4}), "s")
    b = parse_suite(jsonl({"id": "a", "prompt": "y", "max_tokens": 4}), "s")
    assert a.sha256 != b.sha256


def test_duplicate_prompt_names_both_lines() -> None:
    data = jsonl({"id": "a", "prompt": "same", "max_tokens": 4},
                 {"id": "b", "prompt": "same", "max_tokens": 4})
    with pytest.raises(SuiteError, match=r"s\.jsonl:2: duplicate prompt .*line 1"):
        parse_suite(data, "s.jsonl")


def test_duplicate_id() -> None:
    data = jsonl({"id": "a", "prompt": "p", "max_tokens": 4},
                 {"id": "a", "prompt": "q", "max_tokens": 4})
    with pytest.raises(SuiteError, match="duplicate id 'a'"):
        parse_suite(data, "s.jsonl")


def test_invalid_json_names_line() -> None:
    with pytest.raises(SuiteError, match=r"s\.jsonl:2: invalid JSON"):
        parse_suite(jsonl({"id": "a", "prompt": "p", "max_tokens": 4}) + b"{oops\n", "s.jsonl")


def test_bad_field_names_key() -> None:
    with pytest.raises(SuiteError, match=r"s\.jsonl:1: max_tokens"):
        parse_suite(jsonl({"id": "a", "prompt": "p", "max_tokens": 0}), "s.jsonl")
    with pytest.raises(SuiteError, match=r"s\.jsonl:1: promt"):
        parse_suite(jsonl({"id": "a", "promt": "p", "prompt": "q", "max_tokens": 3}), "s.jsonl")


def test_empty_and_missing(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no rows"):
        parse_suite(b"\n\n", "e.jsonl")
    with pytest.raises(SuiteError, match="cannot read suite"):
        load_suite(tmp_path / "missing.jsonl")


def test_head_is_a_new_suite() -> None:
    suite = load_suite()
    head = suite.head(3)
    assert len(head.rows) == 3 and head.sha256 != suite.sha256
    with pytest.raises(SuiteError):
        suite.head(99)
