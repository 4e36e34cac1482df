"""The paced fake server: pacing accuracy, vLLM wire format, options, fault injection.

Each test starts the real module as a subprocess (`--port 0`, the bound URL read
from its listening line) in its own session, and the fixture kills the whole
group, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokrecord.errors import ConfigError
from tokrecord.server.fake import (
    ENV_PREFIX,
    FakeServerConfig,
    chat_prompt_text,
    chunk_frame,
    chunk_plan,
    config_from_args,
    output_token_ids,
    prompt_token_ids,
)
from tokrecord.server.fake.tokens import wait_until

STARTUP_TIMEOUT_S = 10.0


@dataclass
class Running:
    proc: subprocess.Popen[str]
    url: str
    log: Path
    stderr: Path

    def log_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def settled_log(self, requests: int = 1) -> list[dict[str, Any]]:
        """The log once `requests` "done" lines are in: the server writes them after
        its last write, so a fast client can read the log before they land."""
        deadline = time.monotonic() + 5
        while True:
            records = self.log_records()
            if sum(r["kind"] == "done" for r in records) >= requests:
                return records
            assert time.monotonic() < deadline, records[-3:]
            time.sleep(0.01)


StartServer = Callable[..., Running]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    procs: list[subprocess.Popen[str]] = []
    counter = iter(range(1000))

    def start(*args: str, env: Mapping[str, str] | None = None) -> Running:
        i = next(counter)
        log = tmp_path / f"fake-{i}.jsonl"
        stderr = tmp_path / f"fake-{i}.err"
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        with stderr.open("w") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tokrecord.server.fake",
                    "--port",
                    "0",
                    "--log",
                    str(log),
                    *args,
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**clean_env, **(env or {})},
                start_new_session=True,
            )
        procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        prefix = "tokrecord fake server listening on "
        assert line.startswith(prefix), f"no listening line: {line!r} {stderr.read_text()}"
        return Running(proc, line[len(prefix) :].strip(), log, stderr)

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass
class Streamed:
    t_send: int
    events: list[tuple[int, str]]  # (arrival perf_counter_ns, data) per SSE event

    def json_events(self) -> list[dict[str, Any]]:
        return [json.loads(data) for _, data in self.events if data != "[DONE]"]

    def token_events(self) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for t, data in self.events:
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            if obj["choices"] and _text(obj["choices"][0]):
                out.append((t, obj))
        return out


def _text(choice: dict[str, Any]) -> str:
    return str(choice["text"] if "text" in choice else choice["delta"].get("content") or "")


def stream(client: httpx.Client, url: str, body: dict[str, Any]) -> Streamed:
    """POST a streaming request; timestamp each event when its bytes arrive."""
    events: list[tuple[int, str]] = []
    buffer = b""
    t_send = time.perf_counter_ns()
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for raw in response.iter_raw():
            t = time.perf_counter_ns()
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                assert event.startswith(b"data: "), event
                events.append((t, event[len(b"data: ") :].decode()))
    assert buffer == b""
    return Streamed(t_send, events)


USAGE = {"include_usage": True, "continuous_usage_stats": True}


def counters(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(f"{url}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


# ------------------------------------------------------------------ pure parts


def test_chunk_plan_prefill_token_alone_then_groups() -> None:
    assert chunk_plan(0, 4) == []
    assert [list(r) for r in chunk_plan(1, 4)] == [[0]]
    assert [list(r) for r in chunk_plan(7, 3)] == [[0], [1, 2, 3], [4, 5, 6]]
    assert [len(r) for r in chunk_plan(11, 4)] == [1, 4, 4, 2]
    assert [len(r) for r in chunk_plan(5, 1)] == [1] * 5


def test_chunk_frame_is_http_chunked_encoding() -> None:
    assert chunk_frame(b"data: x\n\n") == b"9\r\ndata: x\n\n\r\n"
    assert chunk_frame(b"a" * 26) == b"1a\r\n" + b"a" * 26 + b"\r\n"


def test_tokens_are_deterministic() -> None:
    assert prompt_token_ids("hello  world\n") == prompt_token_ids("hello world")
    assert len(prompt_token_ids("a b c")) == 3
    ids = output_token_ids("hello world", 5)
    assert ids == output_token_ids("hello world", 5)
    assert all(0 <= t < 4096 for t in ids)
    assert [(b - a) % 4096 for a, b in itertools.pairwise(ids)] == [7919 % 4096] * 4


def test_config_env_flag_precedence() -> None:
    assert config_from_args(["--port", "1"], {}).tok_s == 1000.0
    env = {
        "TOKRECORD_FAKE_TOK_S": "250",
        "TOKRECORD_FAKE_PORT": "9",
        "TOKRECORD_FAKE_NEVER_READY": "1",
    }
    config = config_from_args([], env)
    assert (config.tok_s, config.port, config.never_ready) == (250.0, 9, True)
    config = config_from_args(["--tok-s", "500", "--no-never-ready", "--port", "7"], env)
    assert (config.tok_s, config.port, config.never_ready) == (500.0, 7, False)
    assert (
        config_from_args(
            ["--eos-after", "none"], {**env, "TOKRECORD_FAKE_EOS_AFTER": "3"}
        ).eos_after
        is None
    )
    assert config_from_args([], {**env, "TOKRECORD_FAKE_EOS_AFTER": "3"}).eos_after == 3


def test_config_errors_name_their_source() -> None:
    with pytest.raises(ConfigError, match="--port"):
        config_from_args([], {})
    with pytest.raises(ConfigError, match="TOKRECORD_FAKE_TOK_S='fast'"):
        config_from_args(["--port", "1"], {"TOKRECORD_FAKE_TOK_S": "fast"})
    with pytest.raises(ConfigError, match="tok_s must be"):
        config_from_args(["--port", "1", "--tok-s", "0"], {})
    with pytest.raises(ConfigError, match="fail_status"):
        FakeServerConfig(port=1, fail_status=200)


def test_spin_is_an_option_and_zero_sleeps_to_the_due_time() -> None:
    assert config_from_args(["--port", "1"], {}).spin_ns == 1_000_000
    assert config_from_args(["--port", "1"], {"TOKRECORD_FAKE_SPIN_US": "0"}).spin_ns == 0
    assert config_from_args(["--port", "1", "--spin-us", "250"],
                            {"TOKRECORD_FAKE_SPIN_US": "0"}).spin_ns == 250_000
    with pytest.raises(ConfigError, match="spin_us must be"):
        config_from_args(["--port", "1", "--spin-us", "-1"], {})
    # Sleeping only is still never early.
    for spin_ns in (0, 1_000_000):
        deadline = time.perf_counter_ns() + 3_000_000
        wait_until(deadline, spin_ns)
        assert time.perf_counter_ns() >= deadline


# ----------------------------------------------------------------- the server


# Only checks a busy host cannot break (so it runs in the parallel group): the schedule is
# exact, nothing is written before it is due, and nothing reaches the client before it was
# due (one CLOCK_MONOTONIC for both processes). How closely the server keeps its schedule
# (lateness, the client's gaps) is a speed figure: bench/fidelity reports it as "schedule
# keeping", on an idle host.
def test_pacing_matches_schedule(start_server: StartServer) -> None:
    server = start_server("--ttft-ms", "100", "--tok-s", "1000")
    url = f"{server.url}/v1/completions"
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{server.url}/health").status_code == 200
        got = stream(client, url, {"prompt": "pace me", "max_tokens": 200, "stream_options": USAGE})
        short = [stream(client, url, {"prompt": "again", "max_tokens": 1}) for _ in range(2)]
    tokens = got.token_events()
    assert len(tokens) == 200
    # The server holds the first token 100 ms after reading the request: never less.
    ttfts_ms = [(s.token_events()[0][0] - s.t_send) / 1e6 for s in (got, *short)]
    assert min(ttfts_ms) >= 100, ttfts_ms

    records = server.settled_log(requests=3)
    first = [r for r in records if r.get("req") == 0]
    chunks = [r for r in first if r["kind"] == "chunk"]
    assert [r["tokens"] for r in chunks] == [[k] for k in range(200)]
    assert min(r["t_ns"] - r["due_ns"] for r in chunks) >= 0
    assert all(t >= r["due_ns"] for (t, _), r in zip(tokens, chunks, strict=True))
    # The schedule is absolute: due times are exactly 1 ms apart, whatever the lateness.
    dues = [r["due_ns"] for r in chunks]
    assert {b - a for a, b in itertools.pairwise(dues)} == {1_000_000}
    assert dues[0] - first[0]["t_ns"] == 100_000_000
    assert first[-1]["kind"] == "done" and first[-1]["outcome"] == "complete"


def test_tokens_per_chunk_emulates_speculative_decoding(start_server: StartServer) -> None:
    server = start_server("--tokens-per-chunk", "4", "--ttft-ms", "5", "--tok-s", "5000")
    prompt = "four at a time"
    with httpx.Client(timeout=10) as client:
        before = counters(client, server.url)
        got = stream(
            client,
            f"{server.url}/v1/completions",
            {"prompt": prompt, "max_tokens": 43, "return_token_ids": True, "stream_options": USAGE},
        )
        after = counters(client, server.url)
    assert got.events[-1][1] == "[DONE]"
    events = got.json_events()
    usage_only = events[-1]
    assert usage_only["choices"] == []
    assert usage_only["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 47,
        "completion_tokens": 43,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    token_chunks = [e for e in events if e["choices"]]
    counts = [len(e["choices"][0]["token_ids"]) for e in token_chunks]
    assert counts == [1] + [4] * 10 + [2]
    cumulative = [e["usage"]["completion_tokens"] for e in token_chunks]
    assert cumulative == [sum(counts[: i + 1]) for i in range(len(counts))]
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == prompt_token_ids(prompt)
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in token_chunks[1:])
    ids = [t for e in token_chunks for t in e["choices"][0]["token_ids"]]
    assert ids == output_token_ids(prompt, 43)
    assert "".join(e["choices"][0]["text"] for e in token_chunks) == "".join(f" t{t}" for t in ids)
    assert [e["choices"][0]["finish_reason"] for e in token_chunks] == [None] * 11 + ["length"]

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta("vllm:spec_decode_num_drafts_total") == 11
    assert delta("vllm:spec_decode_num_draft_tokens_total") == 33
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == 31  # 10*3 + 1
    assert delta("vllm:generation_tokens_total") == 43


def test_chat_stream_format(start_server: StartServer) -> None:
    server = start_server("--ttft-ms", "5", "--tok-s", "5000")
    messages = [{"role": "user", "content": "say something"}]
    with httpx.Client(timeout=10) as client:
        got = stream(
            client,
            f"{server.url}/v1/chat/completions",
            {"messages": messages, "max_tokens": 5, "stream_options": USAGE},
        )
    events = got.json_events()
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    prompt_tokens = len(prompt_token_ids(chat_prompt_text(messages)))
    assert events[0]["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert events[0]["usage"]["completion_tokens"] == 0
    contents = events[1:-1]
    assert [list(e["choices"][0]["delta"]) for e in contents] == [["content"]] * 5
    text = "".join(e["choices"][0]["delta"]["content"] for e in contents)
    assert text == "".join(f" t{t}" for t in output_token_ids(chat_prompt_text(messages), 5))
    assert contents[-1]["choices"][0]["finish_reason"] == "length"
    assert [e["usage"]["completion_tokens"] for e in contents] == [1, 2, 3, 4, 5]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] == prompt_tokens
    assert got.events[-1][1] == "[DONE]"


def test_eos_cap_and_non_streaming(start_server: StartServer) -> None:
    server = start_server(
        "--eos-after", "5", "--max-tokens-cap", "8", "--ttft-ms", "1", "--model", "m1"
    )
    url = f"{server.url}/v1/completions"
    with httpx.Client(timeout=10) as client:
        stopped = client.post(url, json={"prompt": "p", "max_tokens": 10}).json()
        short = client.post(url, json={"prompt": "p", "max_tokens": 3, "model": "m1"}).json()
        wrong = client.post(url, json={"prompt": "p", "model": "other"})
        models = client.get(f"{server.url}/v1/models").json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 5
    assert stopped["choices"][0]["text"] == "".join(f" t{t}" for t in output_token_ids("p", 5))
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 3
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    assert models == {
        "object": "list",
        "data": [{"id": "m1", "object": "model", "owned_by": "tokrecord"}],
    }


def test_env_configures_and_flag_overrides(start_server: StartServer) -> None:
    env = {"TOKRECORD_FAKE_TOK_S": "200", "TOKRECORD_FAKE_TTFT_MS": "1"}
    from_env = start_server(env=env)
    from_flag = start_server("--tok-s", "500", env=env)
    with httpx.Client(timeout=10) as client:
        for server in (from_env, from_flag):
            stream(client, f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 3})
    for server, step in ((from_env, 5_000_000), (from_flag, 2_000_000)):
        dues = [r["due_ns"] for r in server.settled_log() if r["kind"] == "chunk"]
        assert [b - a for a, b in itertools.pairwise(dues)] == [step, step]


def test_metrics_counters_and_concurrency(start_server: StartServer) -> None:
    server = start_server("--ttft-ms", "1", "--tok-s", "100")
    with httpx.Client(timeout=10) as client:
        before = counters(client, server.url)
        result: list[Streamed] = []
        worker = threading.Thread(
            target=lambda: result.append(
                stream(
                    httpx.Client(timeout=10),
                    f"{server.url}/v1/completions",
                    {"prompt": "three word prompt", "max_tokens": 20},
                )
            )
        )
        worker.start()
        # Mid-stream (the 20 tokens take ~190 ms): wait for the generation to show, not
        # for a fixed time that a busy machine could spend before the request is even sent.
        deadline = time.monotonic() + 10
        during = counters(client, server.url)
        while during["tokrecord_fake_active_generations"] == 0 and time.monotonic() < deadline:
            during = counters(client, server.url)
        assert client.get(f"{server.url}/health").status_code == 200
        worker.join(timeout=10)
        # The client has the whole stream once it reads [DONE]; the server's handler counts
        # the generation finished, then books its tokens, only after that last write
        # returns: wait for both.
        deadline = time.monotonic() + 10
        after = counters(client, server.url)
        while (after["tokrecord_fake_active_generations"] != 0
               or after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"]
               ) and time.monotonic() < deadline:
            after = counters(client, server.url)
    assert len(result[0].token_events()) == 20
    assert during["tokrecord_fake_active_generations"] == 1
    assert during["vllm:num_requests_running"] == 1
    assert after["tokrecord_fake_active_generations"] == 0
    assert after["tokrecord_fake_max_concurrent_generations"] == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 20
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 3
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == 3
    assert after["vllm:prefix_cache_hits_total"] == 0
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 1
    assert "vllm:spec_decode_num_drafts_total" not in after  # K = 1: no speculative decoding


def test_fail_status(start_server: StartServer) -> None:
    server = start_server("--fail-status", "500")
    with httpx.Client(timeout=10) as client:
        response = client.post(f"{server.url}/v1/completions", json={"prompt": "x", "stream": True})
        assert client.get(f"{server.url}/health").status_code == 200
    assert response.status_code == 500
    assert response.json()["error"]["code"] == 500


def test_cut_after_tokens_is_an_incomplete_chunked_stream(start_server: StartServer) -> None:
    server = start_server("--cut-after-tokens", "5", "--ttft-ms", "1")
    seen = b""
    with (
        httpx.Client(timeout=10) as client,
        pytest.raises(httpx.RemoteProtocolError),
        client.stream(
            "POST",
            f"{server.url}/v1/completions",
            json={"prompt": "x", "max_tokens": 20, "stream": True},
        ) as response,
    ):
        for raw in response.iter_raw():
            seen += raw
    events = [json.loads(e[len(b"data: ") :]) for e in seen.split(b"\n\n") if e]
    assert len(events) == 5
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    done = server.settled_log()[-1]
    assert (done["kind"], done["outcome"], done["tokens"]) == ("done", "cut", 5)


def test_malformed_event_then_normal_end(start_server: StartServer) -> None:
    server = start_server("--malformed-after-tokens", "2", "--ttft-ms", "1")
    with httpx.Client(timeout=10) as client:
        got = stream(client, f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 4})
    data = [d for _, d in got.events]
    assert data[2] == "{not json"
    assert len(data) == 6 and data[-1] == "[DONE]"


def test_errors_are_json(start_server: StartServer) -> None:
    server = start_server()
    with httpx.Client(timeout=10) as client:
        missing = client.get(f"{server.url}/v2/nothing")
        bad = client.post(
            f"{server.url}/v1/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        no_prompt = client.post(f"{server.url}/v1/completions", json={"max_tokens": 2})
        options_without_stream = client.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "stream_options": USAGE}
        )
        ok = client.post(f"{server.url}/v1/completions", json={"prompt": "still alive"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    assert no_prompt.status_code == 400
    assert options_without_stream.status_code == 400
    assert ok.status_code == 200


def test_readiness_faults(start_server: StartServer) -> None:
    never = start_server("--never-ready")
    later = start_server("--ready-after-s", "0.3")
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{never.url}/health").status_code == 503
        assert client.get(f"{never.url}/v1/models").status_code == 503
        assert client.get(f"{never.url}/metrics").status_code == 200
        assert client.get(f"{later.url}/health").status_code == 503
        # Ready as soon as the server says so: poll for it rather than sleep past 0.3 s.
        deadline = time.monotonic() + 10
        while (code := client.get(f"{later.url}/health").status_code) != 200:
            assert code == 503 and time.monotonic() < deadline, code
            time.sleep(0.01)
        assert later.proc.poll() is None


def test_exit_after_s(start_server: StartServer) -> None:
    server = start_server("--exit-after-s", "0.2")
    assert server.proc.wait(timeout=10) == 3
    assert "exiting with code 3" in server.stderr.read_text()


def test_ignore_sigterm_and_spawned_child(start_server: StartServer) -> None:
    server = start_server("--ignore-sigterm", "--spawn-child")
    children = psutil.Process(server.proc.pid).children()
    assert len(children) == 1
    server.proc.send_signal(signal.SIGTERM)
    # Real elapsed time, on purpose: "still alive a while after SIGTERM" has no event to
    # wait on (the server ignoring the signal is the absence of one).
    time.sleep(0.2)
    assert server.proc.poll() is None
    os.killpg(server.proc.pid, signal.SIGKILL)
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    children[0].wait(timeout=10)


def test_existing_log_is_never_overwritten(tmp_path: Path) -> None:
    log = tmp_path / "taken.jsonl"
    log.write_text("evidence\n")
    done = subprocess.run(
        [sys.executable, "-m", "tokrecord.server.fake", "--port", "0", "--log", str(log)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "never overwritten" in done.stderr
    assert log.read_text() == "evidence\n"


def test_client_disconnect_is_logged_and_server_carries_on(start_server: StartServer) -> None:
    server = start_server("--ttft-ms", "1", "--tok-s", "1000")
    url = f"{server.url}/v1/completions"
    with httpx.Client(timeout=10) as client:
        with client.stream(
            "POST", url, json={"prompt": "x", "max_tokens": 500, "stream": True}
        ) as r:
            next(r.iter_raw())
        # Leaving the block closes the half-read connection.
        assert client.post(url, json={"prompt": "x", "max_tokens": 2}).status_code == 200
    outcomes = [r["outcome"] for r in server.settled_log(requests=2) if r["kind"] == "done"]
    assert sorted(outcomes) == ["complete", "disconnected"]


def test_the_fake_server_starts_without_the_engine_adapters() -> None:
    """Every fake-server leg in the suite starts one: it imports neither the server
    lifecycle nor the engine adapters (issue 28: 0.1 s of CPU per start, not 0.45 s), and
    reads the leg name from the variable the harness sets."""
    from tokrecord.server.fake.constants import LEG_ENV as FAKE_LEG_ENV
    from tokrecord.server.process import LEG_ENV

    assert FAKE_LEG_ENV == LEG_ENV
    code = ("import sys, tokrecord.server.fake; "
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith("
            "('tokrecord.server.process', 'tokrecord.engines'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
