"""Speculative decoding as each engine's argv configures it (the record's `speculative`)."""

from __future__ import annotations

import json

from tokrecord.engines import engine_for


def test_vllm_reads_its_speculative_config_json() -> None:
    spec = engine_for("vllm").speculative(["vllm", "serve", "m", "--speculative-config", json.dumps(
        {"method": "eagle3", "model": "/m/draft", "num_speculative_tokens": 7,
         "draft_sample_method": "greedy", "rejection_sample_method": "standard"})])
    assert spec is not None
    assert (spec.method, spec.num_speculative_tokens, spec.draft_model) == ("eagle3", 7, "/m/draft")
    assert (spec.draft_sample_method, spec.rejection_sample_method) == ("greedy", "standard")
    assert engine_for("vllm").speculative(["vllm", "serve", "m"]) is None
    bad = engine_for("vllm").speculative(["vllm", "--speculative-config", "{not json"])
    assert bad is not None and bad.method == "unknown" and bad.notes


def test_llamacpp_spec_types_and_draft_models() -> None:
    engine = engine_for("llama.cpp")
    ngram = engine.speculative(["llama-server", "--spec-type", "ngram-simple",
                                "--spec-ngram-simple-size-m", "4"])
    assert ngram is not None and (ngram.method, ngram.num_speculative_tokens) == ("ngram-simple", 4)
    draft = engine.speculative(["llama-server", "-m", "t.gguf", "-md", "d.gguf",
                                "--spec-type", "draft-simple", "--spec-draft-n-max", "8"])
    assert draft is not None
    assert (draft.method, draft.draft_model, draft.num_speculative_tokens) == (
        "draft-simple", "d.gguf", 8)
    # -md alone loads a draft that drafts nothing: said so, not hidden.
    idle = engine.speculative(["llama-server", "-md", "d.gguf"])
    assert idle is not None and "drafts nothing" in idle.method
    assert engine.speculative(["llama-server", "--spec-type", "none"]) is None


def test_sglang_speculative_algorithm() -> None:
    spec = engine_for("sglang").speculative([
        "python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE",
        "--speculative-num-draft-tokens", "5", "--speculative-draft-model-path", "/d"])
    assert spec is not None and (spec.method, spec.num_speculative_tokens, spec.draft_model) == (
        "EAGLE", 5, "/d")
