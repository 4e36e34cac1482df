"""The record's speculative section: each arm's configuration and its draft's bytes."""

from __future__ import annotations

import json
from pathlib import Path

from tokrecord.experiment.plan import draft_paths, parse_plan
from tokrecord.identity import IdentitySpec, collect_identity
from tokrecord.record import EvidenceFacts, speculative_section


def test_a_local_draft_model_is_identified_by_its_manifest(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(b"draft weights")
    config = json.dumps({"method": "draft_model", "model": str(draft),
                         "num_speculative_tokens": 3})
    plan = parse_plan({
        "name": "spec", "server": {"argv": ["vllm", "serve", "{model}"], "model": "m"},
        "arms": {"control": {}, "candidate": {"extra_args": ["--speculative-config", config]}},
    }, "plan")
    assert draft_paths(plan) == {"candidate": draft}
    identity = collect_identity(IdentitySpec(), tmp_path / "ident", None, draft_paths(plan))
    manifest = identity.drafts["candidate"].manifest_sha256
    facts = EvidenceFacts(date="2026-12-01", root="r", identity={}, hardware={},
                          evidence_sha256={},
                          drafts={"candidate": {"manifest_sha256": manifest, "revision": None}})
    section = speculative_section(plan, facts)
    assert section["control"] is None
    candidate = section["candidate"]
    assert candidate is not None
    assert (candidate.method, candidate.num_speculative_tokens) == ("draft_model", 3)
    assert candidate.draft_model == str(draft)
    assert candidate.draft_manifest_sha256 == manifest and len(manifest) == 64
