"""The llama.cpp parser against a stream the real server sent (tests/fixtures/llamacpp)."""

from __future__ import annotations

import json
from typing import Any

from paths import FIXTURES
from tokrecord.client import SSEDecoder
from tokrecord.engines import CountSource, Endpoint, engine_for
from tokrecord.engines.llamacpp import LlamaCppParser
from tokrecord.suite import load_suite

STREAM = FIXTURES / "llamacpp" / "completion-stream-ngram.txt"


def _payloads() -> list[dict[str, Any]]:
    events = SSEDecoder().feed(STREAM.read_bytes())
    return [json.loads(e.data) for e in events]


def test_counts_come_from_tokens_predicted_and_sum_to_the_final_count() -> None:
    parser = engine_for("llama.cpp").parser(Endpoint.NATIVE)
    counts = [parser.parse(p).n for p in _payloads()]
    assert sum(counts) == 512 == parser.completion_tokens
    assert parser.finished
    assert parser.finish_reason == "length"  # stop_type "limit", in OpenAI's words
    assert parser.prompt_tokens == 96
    assert parser.cached_tokens == 0  # timings.cache_n
    assert parser.engine_timings is not None and parser.engine_timings["draft_n"] > 0


def test_held_back_tokens_drop_their_ids_so_the_row_keeps_no_ids() -> None:
    payloads = _payloads()
    parser = LlamaCppParser()
    for p in payloads:
        parser.parse(p)
    # Chunks whose id list is shorter than the tokens they stand for: a token that left
    # incomplete UTF-8 was held back and sent without its id.
    short = 0
    last = 0
    for p in payloads:
        delta = p["tokens_predicted"] - last
        last = p["tokens_predicted"]
        short += delta > 0 and len(p.get("tokens") or []) != delta
    assert short > 0
    assert parser.mismatches == short
    assert parser.have_ids is False
    assert parser.source is CountSource.TOKEN_IDS  # the first chunk carried its one id
    # The text is complete even so: the held-back bytes came with the next chunk.
    assert "".join(parser.text) == "".join(p["content"] for p in payloads)


def test_native_body_turns_the_prompt_cache_off_and_asks_for_ids() -> None:
    row = load_suite(None).rows[0]
    engine = engine_for("llama.cpp")
    body = engine.build_body(Endpoint.NATIVE, "tokrecord-demo", row, {"top_k": 1})
    assert body == {"prompt": row.prompt, "n_predict": row.max_tokens, "temperature": 0,
                    "stream": True, "return_tokens": True, "cache_prompt": False, "top_k": 1}
    assert engine.path(Endpoint.NATIVE) == "/completion"
    # On the OpenAI endpoints too: llama.cpp caches prompts per request by default.
    assert engine.build_body(Endpoint.COMPLETIONS, "m", row)["cache_prompt"] is False


def test_the_log_line_per_generation_task_is_counted() -> None:
    line = engine_for("llama.cpp").generation_line
    assert line is not None
    log = ("0.00.534 I slot launch_slot_: id  0 | task 1 | processing task, is_child = 0\n"
           "0.00.792 I slot print_timing: id  0 | task 1 | prompt eval time = 13.19 ms\n"
           "0.00.802 I slot launch_slot_: id  0 | task 514 | processing task, is_child = 0\n")
    assert len(line.findall(log)) == 2


def test_held_back_ids_are_gaps_at_known_positions() -> None:
    # llama.cpp sends no event for a token that leaves incomplete UTF-8; the next event
    # has its text but only its own id, and tokens_predicted counts both. In this
    # capture, tokens_predicted jumps 8 -> 10 with "tokens": [1446]: token 8's id was
    # held back, token 9 is 1446.
    parser = LlamaCppParser()
    for p in _payloads():
        parser.parse(p)
    assert parser.positions_known and len(parser.positional_ids) == 512
    assert parser.positional_ids[7:10] == [1576, None, 1446]
    gaps = [i for i, t in enumerate(parser.positional_ids) if t is None]
    assert len(gaps) == parser.mismatches  # one id held back per short chunk here
    given = [t for t in parser.positional_ids if t is not None]
    assert given == [i for p in _payloads() for i in p.get("tokens") or []]


def test_ids_held_back_to_the_end_are_gaps_and_a_stream_without_ids_has_no_positions() -> None:
    parser = LlamaCppParser()
    parser.parse({"content": "a", "tokens": [5], "stop": False, "tokens_predicted": 1})
    parser.parse({"content": "", "tokens": [], "stop": True, "stop_type": "limit",
                  "tokens_predicted": 3, "tokens_evaluated": 2, "timings": {"cache_n": 0}})
    assert parser.positional_ids == [5, None, None] and parser.positions_known
    # Without return_tokens every event's "tokens" is empty: no id, no position.
    bare = LlamaCppParser()
    bare.parse({"content": "a", "tokens": [], "stop": False, "tokens_predicted": 1})
    assert not bare.positions_known and bare.positional_ids == []
