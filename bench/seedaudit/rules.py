"""Where each leaf of the seed records is in a tokrecord record, or why it has no place.

Each rule is (seed leaf pattern, outcome). A pattern is a regular expression matched in
full against the leaf's dotted path. An outcome is either `At(paths)`: the fact is
produced at each of those paths (of record.json, or of a sealed addendum with
`addendum:KIND:path`), which must exist and, unless `null_ok` says why, hold a value; or
`NotApplicable(reason)`: a path on somebody's disk or a person's words, which no
measurement produces. `\\1`-style groups of the pattern fill the paths.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class At:
    paths: tuple[str, ...]
    note: str = ""
    null_ok: str = ""  # why a null value is the honest one here


@dataclass(frozen=True)
class NotApplicable:
    reason: str


Outcome = At | NotApplicable


def at(*paths: str, note: str = "", null_ok: str = "") -> At:
    return At(paths, note, null_ok)


LEGS = r"(A1|B1|B2|A2)"
# The sealed submission addenda: the receipt, and the latest check of the public row.
RECEIPT = "addendum:submission-receipt:payload."
CHECK = "addendum:submission-check:payload."
SOURCE_FORM = "one entry per declared source under source.sources (here the source 'main')"
NATIVE = at("source.native_modules.harness", note="hashes of the declared native modules")
NOT_LOGGED = ("vLLM logs no per-rank graph counts, eager breaks or replays; the record "
              "lists them in graph.not_reported rather than guessing")

ABBA: tuple[tuple[str, Outcome], ...] = (
    (r"experiment", at("experiment")),
    (r"date", at("date")),
    (r"status", at("status", CHECK + "public_status",
                   note="the record's status and the latest approval observation")),
    (r"prior_approved_record\.(id|tok_s)", at(r"prior_approved_record.\1")),
    (r"prior_approved_record\.public_api_rechecked_utc",
     at("prior_recheck.public_api_rechecked_utc")),
    (r"prior_approved_record\.status", at("prior_recheck.status", "prior_recheck.public_tok_s")),
    (r"source\.main_repo_commit_during_all_legs",
     at("source.sources.main.commit", "quality.source_identity_passed_all_legs")),
    (r"source\.(vllm|xpu_kernel)_commit", at("source.sources.main.commit", note=SOURCE_FORM)),
    (r"source\.(shared_native|xpu_native|moe_native|grouped_gemm)_sha256", NATIVE),
    (r"source\.(runner|analyzer)_sha256",
     at("source.tokrecord.commit", note="tokrecord is the runner and the analyzer")),
    (r"model\.target", at("model.target", "model.target_manifest_sha256")),
    (r"model\.target_revision", at("model.target_revision")),
    (r"model\.draft", at("model.draft", "model.draft_manifest_sha256")),
    (r"model\.draft_revision", at("model.draft_revision")),
    (r"model\.quantization", NotApplicable(
        "the author's description of the weights; their bytes, config.json included, are "
        "identified by the model manifest")),
    (r"treatment\.(control|candidate)\..*", at(r"treatment.\1.env")),
    (r"treatment\.unchanged_record_stack\..*", at("unchanged_record_stack.env",
                                                  "unchanged_record_stack.argv")),
    (r"component_evidence\.\w+_gate_passed", at("component_evidence.rmsnorm.gate_passed")),
    (r"component_evidence\.\w+_exact_all_cards",
     at("component_evidence.rmsnorm.exact_all_devices")),
    (r"component_evidence\.\w+_launches_per_cycle\.(control|candidate|removed)",
     at(r"component_evidence.rmsnorm.launches_per_cycle.\1")),
    (r"component_evidence\.\w+_saving_ms_per_cycle_range",
     at("component_evidence.rmsnorm.saving_ms_per_cycle_range")),
    (r"component_evidence\.\w+_isolated_saving_ms_per_cycle",
     at("component_evidence.rmsnorm.isolated_saving_ms_per_cycle")),
    (r"protocol\.(.*)", at(r"protocol.\1")),
    (r"runs\." + LEGS + r"\.bench_sha256", at(r"runs.\1.evidence_sha256.rows.json",
                                              r"runs.\1.evidence_sha256.events.jsonl")),
    (r"runs\." + LEGS + r"\.(.*)", at(r"runs.\1.\2")),
    (r"pair_results\.(B1_vs_A1|B2_vs_A2)\.(.*)", at(r"pair_results.\1.\2")),
    (r"quality\.metrics_accounting_passed_all_legs", at("quality.token_count_integrity",
                                                        note="completion tokens reported "
                                                        "equal tokens received, every leg")),
    (r"quality\.(.*)", at(r"quality.\1")),
    (r"record_gate\.(.*)", at(r"record_gate.\1")),
    (r"artifacts\.root", at("artifacts.root")),
    (r"artifacts\.full_analysis(_sha256)?", at("verdict_analysis", note="the full analysis is "
                                               "in the record, which the seal hashes")),
    (r"artifacts\.(all_vs_canonical_teacher|cross_leg_exactness)(_sha256)?",
     at(r"artifacts.\1\2")),
    (r"submission\.queue", at(RECEIPT + "queue_file", RECEIPT + "queue",
                              note="the queue file beside the experiment, and its content")),
    (r"submission\.response", at(RECEIPT + "response", note="the response, in the sealed receipt")),
    (r"submission\.queue_sha256", at(RECEIPT + "queue_sha256")),
    (r"submission\.label", at(RECEIPT + "queue.notes", note="the payload's notes name the sealed record")),
    (r"submission\.id", at(RECEIPT + "submission_id")),
    (r"submission\.submitted_tok_s", at(RECEIPT + "queue.tokSOut")),
    (r"submission\.http_status", at(RECEIPT + "http_status")),
    (r"submission\.status", at(CHECK + "public_status")),
    (r"submission\.api_created_at", at(CHECK + "public_created_at")),
    (r"submission\.public_api_verified_utc",
     at(CHECK + "checked_utc")),
    (r"submission\.public_api_match_count",
     at(CHECK + "found", CHECK + "match")),
)

SINGLE: tuple[tuple[str, Outcome], ...] = (
    (r"schema", at("schema")),
    (r"date", at("date")),
    (r"status", at("status", CHECK + "public_status")),
    (r"source\.(main_harness|main_record|submission_helper)_commit",
     at("source.tokrecord.commit", note="tokrecord runs, records and submits")),
    (r"source\.(vllm|kernel|attention_runtime|native_base|xpumem_source)_commit",
     at("source.sources.main.commit", note=SOURCE_FORM)),
    (r"source\.(vllm|kernel)_public_base", at("source.sources.main.public_base")),
    (r"source\.(vllm|kernel|attention_runtime)_bundle", at("source.sources.main.bundle")),
    (r"source\.(vllm|kernel|attention_runtime)_combined_patch",
     at("source.sources.main.patch")),
    (r"source\.target_revision", at("model.target_revision")),
    (r"source\.draft_revision", at("model.draft_revision")),
    (r"run_root", at("artifacts.root")),
    (r"metric", at("metric")),
    (r"metric_accounting\.correction_note", at("addendum:re-accounting:payload.reaccounted")),
    (r"metric_accounting\.disposition", at("addendum:re-accounting:payload.disposition")),
    (r"metric_accounting\.(.*)", at(r"metric_accounting.\1")),
    (r"record\.(.*)", at(r"record.\1")),
    (r"summary\.(.*)", at(r"summary.\1")),
    (r"quality\.(teacher_exact|cached_tokens_zero)", at(r"quality.\1.count",
                                                        r"quality.\1.status")),
    (r"quality\.rollover", at("quality.rollover.status", "quality.rollover.count")),
    (r"quality\.full512_output_then_next", at("quality.full_output_then_next.count")),
    (r"quality\.long_context_then_next_tested", at("quality.long_context_then_next.status")),
    (r"quality\.sequence_qualification", at("quality.full_output_then_next.reason",
                                            "quality.long_context_then_next.reason")),
    (r"quality\.(fresh_unique_prompts|single_active_generation|no_warmup_generation|"
     r"first_valid_score_is_reported_score)", at(r"quality.\1.status")),
    (r"quality\.suite_invocations", at("quality.one_suite_invocation.count")),
    (r"quality\.retries", at("quality.zero_retries.count")),
    (r"quality\.no_cache_history_ngram_or_response_reuse",
     at("quality.cached_tokens_zero.status", "quality.fresh_unique_prompts.status",
        "quality.one_suite_invocation.status")),
    (r"treatment\.(selector|target_unchanged|num_speculative_tokens|draft_sample_method|"
     r"rejection_sample_method)", at(r"treatment.\1")),
    (r"treatment\.logged_\w+_per_rank", at("treatment.log_facts_per_rank.listening_port",
                                           note="a declared log fact, per rank")),
    (r"treatment\.exact_max_m", at("treatment.log_facts.listening_port",
                                   note="a declared log fact's value")),
    (r"treatment\.(auxiliary_hidden_slice_workspace|width12_router_context_kv_stack)",
     at("treatment.claims.fake_server_listening", note="a log rule's claim that holds")),
    (r"treatment\.draft_lm_head_attribution",
     at("treatment.claims.draft_lm_head_prepared", note="a claim the log does not support, "
        "with the reason it is not claimed")),
    (r"graph\.(mode|cudagraph_mode|capture_sizes|max_capture_size|rank_captures)",
     at(r"graph.\1")),
    (r"graph\.(graphs_per_rank|eager_breaks_per_rank|rank_replays)",
     at(r"graph.\1", "graph.not_reported", null_ok=NOT_LOGGED)),
    (r"operational\.(prestart|poststop)_idle_(seconds|snapshots)",
     at(r"operational.legs.B1.\1_idle_\2")),
    (r"operational\.cleanup_original_status", at("operational.legs.B1.cleanup_passed")),
    (r"operational\.cleanup_stop_status", at("operational.legs.B1.stop_seconds",
                                             "operational.legs.B1.sigkill_sent")),
    (r"operational\.cleanup_worker_status", at("operational.legs.B1.surviving_workers")),
    (r"operational\.cleanup_idle_status", at("operational.legs.B1.idle_passed")),
    (r"operational\.surviving_workers", at("operational.legs.B1.surviving_workers")),
    (r"operational\.port_\d+_listener_after_run",
     at("operational.legs.B1.port_listener_after_run")),
    (r"operational\.artifact_sealed_read_only", at("operational.artifact_sealed_read_only")),
    (r"sha256\.bench", at("sha256.rows.json", "sha256.events.jsonl")),
    (r"sha256\.server_log", at("sha256.server.log")),
    (r"sha256\.metrics_after_suite", at("sha256.metrics-after.prom")),
    (r"sha256\.(exactness|identity|model_release_manifest|runtime_lock)", at(r"sha256.\1")),
    (r"sha256\.\w+_native_module", NATIVE),
    (r"sha256\.(vllm|kernel|attention_runtime)_bundle", at("source.sources.main.bundle_sha256")),
    (r"sha256\.(vllm|kernel|attention_runtime)_combined_patch",
     at("source.sources.main.patch_sha256")),
    (r"sha256\.evidence_manifest", NotApplicable(
        "the evidence manifest (manifest.sha256) lists record.json, so the record cannot hold "
        "its hash; `tokrecord verify` checks the manifest and its signature")),
    (r"reproducibility\.(portable_sealed_evidence|portable_model_manifest|runtime_lock|"
     r"artifact_exact_scope|source_rebuild_scope)", at(r"reproducibility.\1")),
    (r"localmaxxing\.queue_path", at(RECEIPT + "queue_file")),
    (r"localmaxxing\.response_path", at(RECEIPT + "response",
                                        note="the response, in the sealed receipt")),
    (r"localmaxxing\.submission_status", at(CHECK + "public_status")),
    (r"localmaxxing\.endpoint", at(RECEIPT + "base_url", RECEIPT + "endpoint")),
    (r"localmaxxing\.http_status", at(RECEIPT + "http_status")),
    (r"localmaxxing\.submitted_at", at(RECEIPT + "sent_utc", CHECK + "public_created_at")),
    (r"localmaxxing\.public_row_verified_at",
     at(CHECK + "checked_utc")),
    (r"localmaxxing\.id", at(RECEIPT + "submission_id")),
)
