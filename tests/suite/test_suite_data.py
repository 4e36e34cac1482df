"""The default suite shipped in the package: shape, uniqueness, and the long-context row."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tokrecord.demo import model as demo

LONG_MIN, LONG_MAX = 850, 900
LONG_INDEX = 6


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    text = resources.files("tokrecord").joinpath("data", "suite-default.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def counts(rows: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    model_dir = demo.build_demo_model(tmp_path_factory.mktemp("cache"))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [len(tok.encode(r["prompt"], add_special_tokens=False).ids) for r in rows]


def test_rows_are_well_formed_and_unique(rows: list[dict[str, Any]]) -> None:
    assert len(rows) == 13
    for r in rows:
        assert list(r) == ["id", "prompt", "max_tokens"]
        assert r["max_tokens"] == 512
        assert r["id"] and r["prompt"].strip() == r["prompt"]
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["prompt"] for r in rows}) == len(rows)


def test_prompts_differ_from_their_first_characters(rows: list[dict[str, Any]]) -> None:
    # No two prompts may share a prefix long enough to share a prefix-cache block.
    prompts = [r["prompt"] for r in rows]
    for i, a in enumerate(prompts):
        for b in prompts[i + 1 :]:
            shared = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)
            assert shared <= 10, (a[:20], b[:20])


def test_exactly_one_long_prompt_and_a_row_follows_it(counts: list[int]) -> None:
    assert LONG_MIN <= counts[LONG_INDEX] <= LONG_MAX
    assert len(counts) > LONG_INDEX + 1  # long-context-then-next needs a following row
    others = counts[:LONG_INDEX] + counts[LONG_INDEX + 1 :]
    assert all(30 <= n <= 250 for n in others), others


def test_suite_file_is_canonical_jsonl(rows: list[dict[str, Any]]) -> None:
    path = Path(str(resources.files("tokrecord").joinpath("data", "suite-default.jsonl")))
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and b"\r" not in raw
    assert raw.decode() == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
