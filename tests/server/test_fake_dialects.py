"""The fake server speaks each engine's dialect: a short row streamed with plain httpx,
every event parsed by that engine's own parser, the counts and ids exact.

The servers are the real module as a subprocess: test_fake_server's `start_server`
fixture, imported, so each test's parameter of that name re-binds it (F811 below).
"""
# ruff: noqa: F811

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_fake_server import Running, StartServer, start_server  # noqa: F401

from tokrecord.engines import Endpoint, StreamParser, engine_for
from tokrecord.engines.base import DONE
from tokrecord.engines.openai import OpenAIParser
from tokrecord.errors import ConfigError, StreamError
from tokrecord.server.fake import config_from_args, output_token_ids, prompt_token_ids
from tokrecord.suite import SuiteRow

ROW = SuiteRow(id="r0", prompt="the quick brown fox", max_tokens=9)


def _stream(server: Running, engine: str, endpoint: Endpoint, row: SuiteRow = ROW,
            extra: dict[str, Any] | None = None) -> tuple[StreamParser, list[str], httpx.Headers]:
    """POST the engine's own body for `row`; feed every event to the engine's parser."""
    adapter = engine_for(engine)
    body = adapter.build_body(endpoint, "tokrecord-fake", row, extra)
    parser = adapter.parser(endpoint)
    data: list[str] = []
    buffer = b""
    with (httpx.Client(timeout=10) as client,
          client.stream("POST", server.url + adapter.path(endpoint), json=body) as response):
        assert response.status_code == 200, response.read()
        headers = response.headers
        for raw in response.iter_raw():
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                assert event.startswith(b"data: "), event
                data.append(event[len(b"data: "):].decode())
    assert buffer == b""
    for payload in data:
        if payload != DONE:
            parser.parse(json.loads(payload))
    return parser, data, headers


def _counters(server: Running) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _expect_row(parser: StreamParser, prompt: str = ROW.prompt, n: int = ROW.max_tokens) -> None:
    assert parser.token_ids == output_token_ids(prompt, n) and parser.have_ids
    assert "".join(parser.text) == "".join(f" t{t}" for t in output_token_ids(prompt, n))
    assert parser.completion_tokens == n
    assert parser.prompt_tokens == len(prompt_token_ids(prompt))
    assert parser.mismatches == 0


# ----------------------------------------------------------------------- vLLM


def test_vllm_dialect_is_the_default(start_server: StartServer) -> None:
    server = start_server("--ttft-ms", "1", "--tokens-per-chunk", "4")
    parser, data, _ = _stream(server, "vllm", Endpoint.COMPLETIONS)
    _expect_row(parser)
    assert data[-1] == DONE and not parser.finished
    assert parser.cached_tokens == 0 and parser.finish_reason == "length"
    assert parser.source.value == "token_ids"


# --------------------------------------------------------------------- OpenAI


def test_plain_openai_counts_from_continuous_usage_and_has_no_ids(
    start_server: StartServer,
) -> None:
    server = start_server("--dialect", "openai", "--ttft-ms", "1", "--tokens-per-chunk", "3")
    parser, data, _ = _stream(server, "openai", Endpoint.CHAT)
    events = [json.loads(d) for d in data if d != DONE]
    assert not any("token_ids" in c or "stop_reason" in c
                   for e in events for c in e["choices"])
    assert "prompt_tokens_details" not in events[-1]["usage"]
    assert parser.source.value == "usage" and not parser.have_ids
    assert isinstance(parser, OpenAIParser) and parser.last_completion_tokens == ROW.max_tokens
    assert parser.cached_tokens is None  # a plain server reports none
    assert not any(name.startswith("vllm:") for name in _counters(server))


def test_plain_openai_without_continuous_usage_is_refused(start_server: StartServer) -> None:
    server = start_server("--dialect", "openai", "--no-continuous-usage", "--ttft-ms", "1")
    with pytest.raises(StreamError, match="no token count per chunk"):
        _stream(server, "openai", Endpoint.COMPLETIONS)


# ------------------------------------------------------------------ llama.cpp


def test_llamacpp_native_stream(start_server: StartServer) -> None:
    server = start_server("--dialect", "llama.cpp", "--ttft-ms", "1", "--tokens-per-chunk", "3")
    parser, data, headers = _stream(server, "llama.cpp", Endpoint.NATIVE)
    _expect_row(parser)
    assert DONE not in data and parser.finished
    assert headers["connection"] == "close" and headers["server"] == "llama.cpp"
    final = json.loads(data[-1])
    assert final["stop"] and final["stop_type"] == "limit" and parser.finish_reason == "length"
    assert parser.cached_tokens == 0  # the engine's body says cache_prompt: false
    timings = parser.engine_timings or {}
    # 9 tokens in chunks of 1, 3, 3, 2: three verify steps of two drafts each.
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (6, 5)
    counters = _counters(server)
    assert counters["llamacpp:spec_decode_num_drafts_total"] == 3
    assert counters["llamacpp:spec_decode_num_accepted_tokens_total"] == 5
    assert counters["llamacpp:tokens_predicted_total"] == 9
    assert counters["llamacpp:n_decode_total"] == 4
    assert counters["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"] == 5


def test_llamacpp_prompt_cache_shows_in_cache_n(start_server: StartServer) -> None:
    server = start_server("--dialect", "llama.cpp", "--ttft-ms", "1")
    again = SuiteRow(id="r1", prompt="the quick brown cat jumps", max_tokens=2)
    _stream(server, "llama.cpp", Endpoint.NATIVE)
    cached, _, _ = _stream(server, "llama.cpp", Endpoint.NATIVE, again, {"cache_prompt": True})
    assert cached.cached_tokens == 3  # "the quick brown"
    assert _counters(server)["llamacpp:prompt_tokens_cached_total"] == 3
    off = start_server("--dialect", "llama.cpp", "--ttft-ms", "1", "--no-cache-prompt")
    _stream(off, "llama.cpp", Endpoint.NATIVE)
    parser, _, _ = _stream(off, "llama.cpp", Endpoint.NATIVE, again, {"cache_prompt": True})
    assert parser.cached_tokens == 0


def test_llamacpp_outside(start_server: StartServer) -> None:
    loading = start_server("--dialect", "llama.cpp", "--never-ready")
    server = start_server("--dialect", "llama.cpp", "--ttft-ms", "1")
    with httpx.Client(timeout=10) as client:
        health = client.get(f"{loading.url}/health")
        assert health.status_code == 503
        assert health.json() == {"error": {"code": 503, "message": "Loading model",
                                           "type": "unavailable_error"}}
        assert client.get(f"{loading.url}/v1/models").status_code == 200  # listed while loading
        assert client.get(f"{server.url}/health").json() == {"status": "ok"}
        assert client.get(f"{server.url}/props").json()["build_info"] == "b0-fake"
        missing = client.get(f"{server.url}/nothing").json()
        assert missing["error"]["type"] == "not_found_error"
        ids = engine_for("llama.cpp").served_models(client.get(f"{server.url}/v1/models").json())
    assert ids == {"tokrecord-fake"}
    _stream(server, "llama.cpp", Endpoint.NATIVE)
    server.settled_log()
    log = server.stderr.read_text()
    assert "srv  log_server_r: request: POST /completion 127.0.0.1 200" in log.splitlines()
    assert "srv  log_server_r: request: GET /health 127.0.0.1 200" in log.splitlines()
    generation = engine_for("llama.cpp").generation_line
    assert generation is not None and len(generation.findall(log)) == 1


def test_llamacpp_openai_stream_has_no_count(start_server: StartServer) -> None:
    server = start_server("--dialect", "llama.cpp", "--ttft-ms", "1")
    with pytest.raises(StreamError, match=r"llama\.cpp: use endpoint"):
        _stream(server, "llama.cpp", Endpoint.COMPLETIONS)


# --------------------------------------------------------------------- SGLang


def test_sglang_native_stream(start_server: StartServer) -> None:
    server = start_server("--dialect", "sglang", "--ttft-ms", "1", "--tokens-per-chunk", "3",
                          "--disable-radix-cache", "--skip-server-warmup")
    parser, data, _ = _stream(server, "sglang", Endpoint.NATIVE)
    _expect_row(parser)
    assert data[-1] == DONE and not parser.finished
    assert parser.cached_tokens == 0 and parser.finish_reason == "length"
    events = [json.loads(d) for d in data[:-1]]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 4, 7, 9]
    assert events[-1]["output_ids"] == parser.token_ids  # cumulative, SGLang's default
    timings = parser.engine_timings or {}
    assert (timings["spec_verify_ct"], timings["spec_num_correct_drafts"]) == (3, 5)
    assert timings["spec_accept_length"] == pytest.approx(3.0)
    counters = _counters(server)
    assert counters["sglang:spec_verify_calls_total"] == 3
    assert counters["sglang:num_requests_total"] == 1
    assert counters["sglang:generation_tokens_total"] == 9
    assert "sglang:cached_tokens_total" not in counters  # never incremented: not written


def test_sglang_radix_cache_and_flush(start_server: StartServer) -> None:
    server = start_server("--dialect", "sglang", "--ttft-ms", "1", "--skip-server-warmup")
    again = SuiteRow(id="r1", prompt="the quick brown cat jumps", max_tokens=2)
    _stream(server, "sglang", Endpoint.NATIVE)
    cached, _, _ = _stream(server, "sglang", Endpoint.NATIVE, again)
    assert cached.cached_tokens == 3
    assert _counters(server)["sglang:cached_tokens_total"] == 3
    assert httpx.post(f"{server.url}/flush_cache", timeout=10).text.startswith("Cache flushed.")
    flushed, _, _ = _stream(server, "sglang", Endpoint.NATIVE, again)
    assert flushed.cached_tokens == 0


def test_sglang_warmup_is_a_generation_before_row_0(start_server: StartServer) -> None:
    warm = start_server("--dialect", "sglang")
    cold = start_server("--dialect", "sglang", "--skip-server-warmup")
    assert _counters(warm)["sglang:num_requests_total"] == 1
    assert "sglang:num_requests_total" not in _counters(cold)
    generation = engine_for("sglang").generation_line
    assert generation is not None
    log = warm.stderr.read_text()
    assert len(generation.findall(log)) == 1
    assert "The server is fired up and ready to roll!" in log
    assert not generation.findall(cold.stderr.read_text())


def test_sglang_outside(start_server: StartServer) -> None:
    loading = start_server("--dialect", "sglang", "--never-ready")
    server = start_server("--dialect", "sglang", "--skip-server-warmup", "--ttft-ms", "1")
    adapter = engine_for("sglang")
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{loading.url}/health").status_code == 503
        for path in adapter.ready_paths:
            assert client.get(f"{loading.url}{path}").status_code == 503
        health = client.get(f"{server.url}/health")
        assert (health.status_code, health.content) == (200, b"")
        assert adapter.version_path is not None
        info = client.get(f"{server.url}{adapter.version_path}").json()
        assert client.get(f"{server.url}/get_server_info").json() == info
        assert adapter.version_facts(info) == {"version": "0.0.0+tokrecord.fake"}
        assert client.get(f"{server.url}/get_model_info").json()["is_generation"] is True
        models = client.get(f"{server.url}/v1/models").json()
        bad = client.post(f"{server.url}/generate", json={"sampling_params": {}})
    assert adapter.served_models(models) == {"tokrecord-fake"}
    assert bad.status_code == 400 and bad.json()["object"] == "error"
    _stream(server, "sglang", Endpoint.NATIVE)
    server.settled_log()
    log = server.stderr.read_text()
    assert '"POST /generate HTTP/1.1" 200 OK' in log
    assert "Prefill batch, #new-seq: 1, #new-token: 4, #cached-token: 0" in log


def test_sglang_openai_endpoints_with_token_ids(start_server: StartServer) -> None:
    server = start_server("--dialect", "sglang", "--skip-server-warmup", "--ttft-ms", "1")
    parser, _, _ = _stream(server, "sglang", Endpoint.COMPLETIONS)
    assert parser.token_ids == output_token_ids(ROW.prompt, ROW.max_tokens)
    assert parser.source.value == "token_ids"
    assert parser.prompt_token_ids == prompt_token_ids(ROW.prompt)


def test_dialect_options_from_flags_and_environment() -> None:
    assert config_from_args(["--port", "1"], {}).dialect == "vllm"
    env = {"TOKRECORD_FAKE_DIALECT": "sglang", "TOKRECORD_FAKE_DISABLE_RADIX_CACHE": "1"}
    config = config_from_args(["--port", "1"], env)
    assert (config.dialect, config.disable_radix_cache) == ("sglang", True)
    assert config_from_args(["--port", "1", "--dialect", "llama.cpp"], env).dialect == "llama.cpp"
    # Engines spell some switches --no-x: the flag sets them, it does not negate them.
    flags = ["--port", "1", "--no-cache-prompt", "--no-continuous-usage", "--no-enable-prefix-caching"]
    config = config_from_args(flags, {})
    assert (config.no_cache_prompt, config.no_continuous_usage) == (True, True)
    assert config.enable_prefix_caching is False
    with pytest.raises(ConfigError, match=r"dialect must be one of vllm, llama\.cpp, sglang, openai"):
        config_from_args(["--port", "1", "--dialect", "tgi"], {})


# ------------------------------------------------------- every dialect, same schedule

NATIVE_OF = {"vllm": Endpoint.COMPLETIONS, "openai": Endpoint.COMPLETIONS,
             "llama.cpp": Endpoint.NATIVE, "sglang": Endpoint.NATIVE}


@pytest.mark.parametrize("dialect", list(NATIVE_OF))
def test_every_dialect_keeps_the_schedule_and_the_log(start_server: StartServer,
                                                       dialect: str) -> None:
    server = start_server("--dialect", dialect, "--ttft-ms", "20", "--tok-s", "500",
                          "--tokens-per-chunk", "2", "--skip-server-warmup")
    parser, _, _ = _stream(server, dialect, NATIVE_OF[dialect])
    assert parser.completion_tokens == ROW.max_tokens
    records = server.settled_log()
    chunks = [r for r in records if r["kind"] == "chunk"]
    assert [r["n"] for r in chunks] == [1, 2, 2, 2, 2]
    dues = [r["due_ns"] for r in chunks]
    assert dues[0] - records[0]["t_ns"] == 20_000_000  # TTFT from the request's arrival
    assert [b - a for a, b in itertools.pairwise(dues)] == [4_000_000] * 4
    assert all(r["t_ns"] >= r["due_ns"] for r in chunks)
    assert records[-1]["outcome"] == "complete"


@pytest.mark.parametrize("dialect", ["llama.cpp", "sglang"])
def test_faults_apply_to_native_streams(start_server: StartServer, dialect: str) -> None:
    endpoint = NATIVE_OF[dialect]
    adapter = engine_for(dialect)
    body = adapter.build_body(endpoint, "tokrecord-fake", ROW)
    cut = start_server("--dialect", dialect, "--ttft-ms", "1", "--cut-after-tokens", "3")
    seen = b""
    with (httpx.Client(timeout=10) as client, pytest.raises(httpx.RemoteProtocolError),
          client.stream("POST", cut.url + adapter.path(endpoint), json=body) as response):
        for raw in response.iter_raw():
            seen += raw
    assert seen.count(b"data: ") == 3
    assert cut.settled_log()[-1]["outcome"] == "cut"
    bad = start_server("--dialect", dialect, "--ttft-ms", "1", "--malformed-after-tokens", "1")
    with httpx.Client(timeout=10) as client:
        text = client.post(bad.url + adapter.path(endpoint), json=body).text
    assert text.split("\n\n")[1] == "data: {not json"
