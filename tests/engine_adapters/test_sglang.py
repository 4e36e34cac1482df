"""The SGLang adapter against recorded-format fixtures (tests/fixtures/sglang/SOURCE.md).

None of them comes from a running SGLang: there is none here. They write down the
formats SGLang's source and docs document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paths import FIXTURES
from tokrecord.client import SSEDecoder
from tokrecord.engines import ENGINES, CountSource, Endpoint, EngineName, engine_for, infer_engine
from tokrecord.engines.sglang import SglangParser
from tokrecord.errors import StreamError
from tokrecord.metrics.engine import engine_counters, parse_counters
from tokrecord.suite import SuiteRow

SG = FIXTURES / "sglang"
IDS = [576, 6722, 315, 9625, 374, 12095, 13, 17715]
TEXT = " The capital of France is Paris. Despite"


def _payloads(path: Path) -> list[dict[str, Any]]:
    events = SSEDecoder().feed(path.read_bytes())
    assert events[-1].data == "[DONE]"
    return [json.loads(e.data) for e in events[:-1]]


def _parse_all(path: Path) -> tuple[SglangParser, list[int]]:
    parser = engine_for("sglang").parser(Endpoint.NATIVE)
    assert isinstance(parser, SglangParser)
    return parser, [parser.parse(p).n for p in _payloads(path)]


@pytest.mark.parametrize("name", ["generate-stream.sse", "generate-stream-incremental.sse"])
def test_cumulative_and_incremental_streams_give_the_same_row(name: str) -> None:
    parser, counts = _parse_all(SG / name)
    # completion_tokens 1, 2, 3, 5, ...: the coalesced step carries two tokens.
    assert counts == [1, 1, 1, 2, 1, 1, 1]
    assert parser.token_ids == IDS and parser.have_ids
    assert "".join(parser.text) == TEXT
    assert parser.source is CountSource.TOKEN_IDS and parser.mismatches == 0
    assert parser.incremental is name.endswith("incremental.sse")
    assert parser.finish_reason == "length"
    assert (parser.prompt_tokens, parser.completion_tokens, parser.cached_tokens) == (7, 8, 0)
    assert parser.engine_timings is not None and parser.engine_timings["e2e_latency"] > 0
    assert not parser.finished  # the stream ends with [DONE], which the client reads


def test_speculative_stream_keeps_its_counters_and_the_eos_id() -> None:
    parser, counts = _parse_all(SG / "generate-stream-spec.sse")
    assert counts == [1, 3, 2, 2]
    assert parser.token_ids[-1] == 151645 and len(parser.token_ids) == 8
    assert parser.finish_reason == "stop"
    timings = parser.engine_timings or {}
    assert timings["spec_verify_ct"] == 3
    assert timings["spec_accept_length"] == pytest.approx(8 / 3)


def test_every_split_of_the_recorded_bytes_parses_the_same() -> None:
    data = (SG / "generate-stream.sse").read_bytes()
    for cut in range(0, len(data), 97):
        decoder = SSEDecoder()
        events = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        parser = SglangParser()
        for event in events[:-1]:
            parser.parse(json.loads(event.data))
        assert parser.token_ids == IDS, cut


def test_a_release_without_output_ids_counts_from_completion_tokens() -> None:
    parser = SglangParser()
    for payload in _payloads(SG / "generate-stream.sse"):
        payload.pop("output_ids")
        parser.parse(payload)
    assert len(parser.text) == 7 and "".join(parser.text) == TEXT
    assert parser.source is CountSource.USAGE and not parser.have_ids
    assert parser.completion_tokens == 8


def test_ids_that_disagree_with_the_count_are_a_mismatch() -> None:
    parser = SglangParser()
    meta = {"completion_tokens": 1, "finish_reason": None}
    parser.parse({"text": "a", "output_ids": [1], "meta_info": meta})
    parser.parse({"text": "ab", "output_ids": [1, 2, 3, 4],
                  "meta_info": {**meta, "completion_tokens": 2}})
    assert parser.mismatches == 1 and not parser.have_ids


def test_no_count_at_all_is_refused_not_retokenized() -> None:
    with pytest.raises(StreamError, match="never re-tokenizes"):
        SglangParser().parse({"text": "hello", "meta_info": {}})


def test_an_error_event_is_the_servers_failure() -> None:
    with pytest.raises(StreamError, match="context length"):
        SglangParser().parse({"error": {"message": "exceeds the model's context length"}})


def test_engine_dialect_and_identity() -> None:
    engine = ENGINES[EngineName.SGLANG]
    row = SuiteRow(id="r", prompt="What is the capital of France?", max_tokens=8)
    assert engine.default_endpoint() is Endpoint.NATIVE
    assert engine.path(Endpoint.NATIVE) == "/generate"
    assert engine.build_body(Endpoint.NATIVE, "m", row) == {
        "text": row.prompt,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        "stream": True,
    }
    chat = engine.build_body(Endpoint.CHAT, "m", row, {"seed": 1})
    assert chat["return_token_ids"] and chat["seed"] == 1
    assert chat["stream_options"]["continuous_usage_stats"]
    assert engine.no_cache_args == ("--disable-radix-cache",)
    assert "--skip-server-warmup" in engine.required_args
    assert "/health" not in engine.ready_paths  # SGLang's /health generates a token
    models = json.loads((SG / "v1_models.json").read_text())
    assert engine.served_models(models) == {"qwen/qwen2.5-0.5b-instruct"}
    info = json.loads((SG / "server_info.json").read_text())
    assert engine.version_facts(info) == {"version": "0.0.0.dev1+g44ca2d01f"}
    assert engine.generation_line is not None
    line = '[2026-03-29 07:47:48] INFO:     127.0.0.1:53006 - "POST /generate HTTP/1.1" 200 OK'
    assert engine.generation_line.search(line)
    assert not engine.generation_line.search(line.replace("POST /generate", "GET /health"))


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
        (["sglang", "serve", "--model-path", "m"], "sglang"),
        (["python", "-m", "tokrecord.server.fake", "--dialect", "sglang"], "sglang"),
    ],
)
def test_inferred_from_the_argv(argv: list[str], name: str) -> None:
    assert infer_engine(argv) == name


def test_counter_deltas_with_sglang_names() -> None:
    after = parse_counters((SG / "metrics.txt").read_text())
    counters = engine_counters({}, after, [1.0], engine_for("sglang").metrics)
    assert counters.draft_cycles == 39
    assert counters.draft_tokens is None and counters.accepted_draft_tokens is None
    assert counters.prefix_cache_hits == 12 and counters.prefix_cache_queries == 91
    # The counter appears only once a request had cached tokens: while its collector's
    # prompt-token counter is there, its absence means no hits...
    del after["sglang:cached_tokens_total"]
    assert engine_counters({}, after, [], engine_for("sglang").metrics).prefix_cache_hits == 0
    # ...and without that witness it means the server does not expose it.
    del after["sglang:prompt_tokens_total"]
    assert engine_counters({}, after, [], engine_for("sglang").metrics).prefix_cache_hits is None
