"""Building a record from an experiment directory, and sealing it: the record's I/O.

`build_record` reads what the pure builders in `tokrecord.record` need (each leg's
rows, the state log's attempts and idle gaps, the preregistered power, and the
`EvidenceFacts`: hardware, file hashes, identity, date) and calls them. `finish`
validates the record, writes it, closes the state log and seals the directory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json, layout, write_exclusive
from tokrecord.evidence.seal import MANIFEST_NAME, SigningKey, load_or_create_key, seal
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.experiment.components import sealed_component_evidence
from tokrecord.experiment.design import RecordForm
from tokrecord.experiment.leg import LegResult, RowRecord, load_rows, outcomes, rows_rule
from tokrecord.experiment.plan import Plan
from tokrecord.experiment.prior_check import prior_record_fields
from tokrecord.experiment.runner import (
    attempts_log,
    completed,
    idle_gaps,
    leg_config,
    leg_identities,
    mark_complete,
    plan_suite,
)
from tokrecord.gates import EXACTNESS_RULE, RowOutcome
from tokrecord.gates.teacher import Teacher, load_teacher
from tokrecord.identity import sha256_file
from tokrecord.jsontypes import JSONObject
from tokrecord.record import EvidenceFacts
from tokrecord.record.exactness import document_hashes, exactness_documents, stated_hashes
from tokrecord.record.ids import SCHEMA_ABBA
from tokrecord.record.migrate_v1 import abba_builder
from tokrecord.record.schema import AnyRecord, validate_record
from tokrecord.record.single import single_leg_record


def build_record(plan: Plan, exp_dir: Path, results: Mapping[str, LegResult],
                 schema: str | None = None, sweep_method: str | None = None) -> dict[str, Any]:
    """The record of a finished experiment, from its legs' evidence; `schema` names an
    older record form, and `sweep_method` an older sweep method, when an older record is
    recomputed (verify)."""
    tries = attempts_log(exp_dir)
    run_dirs = {name: (Path(r.run_dir), r.arm) for name, r in results.items()}
    rows, outs = leg_outcomes(plan, run_dirs)
    docs = _documents(plan, exp_dir, run_dirs, outs)
    facts = evidence_facts(exp_dir, results, plan, document_hashes(docs))
    if plan.design_spec.record_form is RecordForm.SINGLE_LEG:
        built: AnyRecord = single_leg_record(plan, results["B1"], tries, facts)
    else:
        power_path = exp_dir / layout.POWER
        power = json.loads(power_path.read_text(encoding="utf-8")) if power_path.exists() \
            else None
        # The current builder, or the v1 recompute for a v1 record (record.migrate_v1).
        build = abba_builder(schema or SCHEMA_ABBA)
        built = build(plan, results, rows, outs, tries, idle_gaps(exp_dir), facts, power,
                      sweep_method)
    # As record.json holds it: the keys each section was given, none it was not.
    return built.model_dump(mode="json", by_alias=True, exclude_unset=True)


def leg_outcomes(plan: Plan, run_dirs: Mapping[str, tuple[Path, str]]
                 ) -> tuple[dict[str, list[RowRecord]], dict[str, list[RowOutcome]]]:
    """Each leg's rows and the gates' view of them (name -> (run dir, arm))."""
    suite = plan_suite(plan)
    rows = {name: load_rows(d) for name, (d, _) in run_dirs.items()}
    outs = {name: outcomes(rows[name], leg_config(plan, suite, name, arm, 1))
            for name, (_, arm) in run_dirs.items()}
    return rows, outs


def canonical_teacher(exp_dir: Path, run_dirs: Mapping[str, tuple[Path, str]]
                      ) -> Teacher | None:
    """The teacher the legs were gated against: the experiment's captured one, else the
    copy each leg keeps (a given teacher file may live anywhere; its copy travels)."""
    candidates = [exp_dir / layout.TEACHER] + [d / layout.LEG_TEACHER for d, _ in
                                               run_dirs.values()]
    found = next((p for p in candidates if p.exists()), None)
    return load_teacher(found) if found is not None else None


def _documents(plan: Plan, exp_dir: Path, run_dirs: Mapping[str, tuple[Path, str]],
               outs: Mapping[str, list[RowOutcome]]) -> dict[str, bytes]:
    """The exactness documents of these legs: the same bytes when the record is built and
    when finish writes them."""
    # The documents follow the rule the legs were recorded by (rows v1 or v2).
    rule = min((rows_rule(d) for d, _ in run_dirs.values()), default=EXACTNESS_RULE)
    return exactness_documents(outs, canonical_teacher(exp_dir, run_dirs),
                               cross=plan.design_spec.several_legs, rule=rule)


def _write_documents(exp_dir: Path, record: Mapping[str, Any]) -> None:
    """The exactness documents, recomputed from the legs the record names, written
    beside it; their hashes must be the ones the record states."""
    stated = stated_hashes(record.get("artifacts") or {})
    if not stated:
        return
    plan = Plan.model_validate(json.loads((exp_dir / layout.PLAN).read_text(encoding="utf-8")))
    runs = record.get("runs") or {"B1": {"run_dir": record["artifacts"]["run_dir"],
                                         "treatment": "candidate"}}
    run_dirs = {name: (Path(r["run_dir"]), r["treatment"]) for name, r in runs.items()}
    docs = _documents(plan, exp_dir, run_dirs, leg_outcomes(plan, run_dirs)[1])
    if document_hashes(docs) != stated:
        raise ConfigError("the exactness documents do not hash to what the record states")
    for name, data in docs.items():
        path = exp_dir / name
        # Written by a finish that a kill cut short: the same bytes, or an error.
        if path.exists():
            if path.read_bytes() != data:
                raise ConfigError(f"{path} exists and differs from the recomputed document")
            continue
        write_exclusive(path, data)


def finish(exp_dir: Path, record: dict[str, Any], key: SigningKey | None = None) -> Path:
    """Write record.json and its exactness documents, close the experiment and seal it
    (manifest, signature, read-only): no leg can run, and nothing can change, after this.

    Resumable: a finish that a kill cut short is completed by the next one. A record
    already written is the record (it is never rebuilt or replaced); each later step is
    done only if it was not, and nothing is added once the manifest exists."""
    path = exp_dir / layout.RECORD
    if not path.exists():
        validate_record(record)  # a record that breaks tokrecord.record/v1 is never sealed
        _write_documents(exp_dir, record)
        write_exclusive(path, canonical_json(record) + b"\n")
    elif not (exp_dir / MANIFEST_NAME).exists():
        _write_documents(exp_dir, json.loads(path.read_text(encoding="utf-8")))
    if not (exp_dir / MANIFEST_NAME).exists() and not completed(exp_dir):
        mark_complete(exp_dir, path)
    seal(exp_dir, key or load_or_create_key(), resume=True)
    return path


def evidence_facts(exp_dir: Path, results: Mapping[str, LegResult], plan: Plan | None = None,
                   documents: Mapping[str, str] | None = None) -> EvidenceFacts:
    return EvidenceFacts(
        date=utc_stamp(Stamp.DATE), root=str(exp_dir),
        identity=identity_summary(exp_dir), drafts=draft_identities(exp_dir),
        leg_identity=leg_identities(exp_dir),
        documents_sha256=dict(documents or {}),
        portable_sha256={name: sha256_file(exp_dir / name)
                         for name in (layout.MODEL_MANIFEST, layout.RUNTIME_LOCK)
                         if (exp_dir / name).exists()},
        components=sealed_component_evidence(plan.components, exp_dir) if plan else [],
        prior_recheck=prior_record_fields(exp_dir) or None,
        hardware={name: hardware(Path(r.run_dir)) for name, r in results.items()},
        evidence_sha256={name: evidence_hashes(Path(r.run_dir)) for name, r in results.items()})


def evidence_hashes(run_dir: Path) -> dict[str, str]:
    return {name: sha256_file(run_dir / name) for name in layout.EVIDENCE_FILES
            if (run_dir / name).exists()}


def hardware(run_dir: Path) -> JSONObject | None:
    """What the probes saw at the start of the leg (hardware.json), or None for
    evidence made before probes existed."""
    path = run_dir / layout.HARDWARE
    if not path.exists():
        return None
    data: JSONObject = json.loads(path.read_text(encoding="utf-8"))
    return data


def draft_identities(exp_dir: Path) -> dict[str, JSONObject]:
    """Per arm, the draft model identity.json holds (its path, manifest and revision)."""
    path = exp_dir / layout.IDENTITY
    if not path.exists():
        return {}
    drafts = json.loads(path.read_text(encoding="utf-8")).get("drafts") or {}
    return {arm: {k: d.get(k) for k in ("path", "manifest_sha256", "revision")}
            for arm, d in drafts.items()}


def _copy(part: dict[str, Any] | None) -> str | None:
    """A source's bundle or patch as the sealed directory holds it."""
    return f"{layout.IDENTITY_DIR}/{part['file']}" if part and part.get("file") else None


def identity_summary(exp_dir: Path) -> dict[str, Any]:
    """The identity facts a reader looks for first, and the hash of the full file."""
    path = exp_dir / layout.IDENTITY
    if not path.exists():
        return {}
    ident = json.loads(path.read_text(encoding="utf-8"))
    tok = ident.get("tokrecord") or {}
    model = ident.get("model") or {}
    out: dict[str, Any] = {
        "identity_sha256": sha256_file(path),
        "tokrecord": {k: tok.get(k) for k in ("kind", "commit", "dirty", "version") if k in tok},
        "sources": {name: {"commit": s.get("commit"), "dirty": s.get("dirty"),
                           "public_base": s.get("public_base"),
                           "bundle_sha256": (s.get("bundle") or {}).get("sha256"),
                           "patch_sha256": (s.get("patch") or {}).get("sha256"),
                           "bundle": _copy(s.get("bundle")), "patch": _copy(s.get("patch"))}
                    for name, s in (ident.get("sources") or {}).items()},
        "native_modules": ident.get("native_modules") or {},
        "runtime_lock_sha256": hashlib.sha256(
            json.dumps(ident.get("runtime_locks"), sort_keys=True).encode()).hexdigest(),
        "runtime_lock_packages": {env: len(lock)
                                  for env, lock in (ident.get("runtime_locks") or {}).items()},
        "model_manifest_sha256": model.get("manifest_sha256"),
        "model_revision": model.get("revision"),
        "python": ident.get("python"),
        "platform": ident.get("platform"),
    }
    return out
