"""Every older form of tokrecord's evidence, and how it is read today: one table, one module.

A record or leg file sealed by an earlier tokrecord lacks the keys added since. This
module is the only place that knows which those are, by the step that added them
(pyperf's `_json_load(version)` is the model): the record schema reads a key a step
lists as "not recorded" (None) in a record that predates the step, verify does not
count it as a difference, and a leg config that predates the probes is recomputed
without them. Everything else reads one form. A record whose schema id is newer than
this tokrecord knows is refused here, naming the file and the key, before any reader
sees it.

Migration never touches the bytes: a sealed record's signature and hashes are checked
over the files as stored (evidence.seal); only the in-memory reading is upgraded.

A new key means one new `Step` below, and nothing in the readers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tokrecord.errors import ConfigError
from tokrecord.gates import IDLE_AFTER, IDLE_BEFORE
from tokrecord.record.ids import SCHEMA_ABBA, SCHEMA_ABBA_V1, SCHEMA_SINGLE

_V1_FORMS: Final = frozenset({SCHEMA_ABBA_V1, SCHEMA_SINGLE})  # written before the probes
KNOWN_RECORD_SCHEMAS: Final = (SCHEMA_ABBA_V1, SCHEMA_ABBA, SCHEMA_SINGLE)

# -- the steps, oldest first --------------------------------------------------------------

# Keys added to records with the probes (idle gates, telemetry, hardware). A v1 record
# sealed by an earlier tokrecord has none of them and must still be read (verify skips
# them likewise): their fields default to None, which a reader takes as "not recorded";
# the schema still requires every one of them in a record that is written.
ADDED_LATER: Final = frozenset({
    "telemetry", "hardware", "idle_before_and_after_all_legs", "same_hardware_all_legs",
    "prestart_idle_seconds", "poststop_idle_seconds", "prestart_idle_snapshots",
    "poststop_idle_snapshots", "idle_passed"})
# Added with the engine adapters: records sealed before have none (a reader sees None).
ADDED_WITH_ENGINES: Final = frozenset({"server_log_facts", "graph", "speculative",
                                       "identity_sha256", "source_identity_passed_all_legs"})
# Added with the seeds' remaining evidence (components, exactness documents, portable
# manifests, the single-leg treatment): likewise absent from records sealed before.
ADDED_WITH_EVIDENCE: Final = frozenset({
    "component_evidence", "all_vs_canonical_teacher", "all_vs_canonical_teacher_sha256",
    "cross_leg_exactness", "cross_leg_exactness_sha256", "portable_model_manifest",
    "portable_model_manifest_sha256", "runtime_lock", "runtime_lock_sha256", "treatment",
    "record_blockers", "source_identity_passed", "model", "unchanged_record_stack",
    "prefix_history_response_reuse", "bundle", "patch", "prior_recheck"})
# Added with crash safety (bench.chaos): the stamps' clock, named in the accounting.
ADDED_WITH_CRASH_SAFETY: Final = frozenset({"clock"})
# Added with leg gates v2 (rows compared by ids wherever complete): how each leg's
# teacher-exact rows were compared.
ADDED_WITH_ID_EXACTNESS: Final = frozenset({"teacher_exact_compared_by"})
# Added with the noise diagnostic (issue 33): null where a leg carries no covariates.
ADDED_WITH_NOISE: Final = frozenset({"noise_diagnostic"})
# Added with sequential designs: records sealed before have neither. The sequential
# section's bias-adjusted estimate came a day later (issue 32's second pass).
ADDED_WITH_SEQUENTIAL: Final = frozenset({"sequential", "max_blocks", "estimate_adjusted_ratio",
                                          "estimate_adjustment"})
# Added with sweep designs (issue 34): records sealed before have none.
ADDED_WITH_SWEEP: Final = frozenset({"sweep"})

# The engine-to-noise steps came after the ABBA v1 form was last written: verify still
# recomputes that form, without them.
_AFTER_ABBA_V1: Final = (ADDED_WITH_ENGINES | ADDED_WITH_EVIDENCE | ADDED_WITH_CRASH_SAFETY
                         | ADDED_WITH_ID_EXACTNESS | ADDED_WITH_NOISE)
# Sections a record of another design leaves out, whichever tokrecord wrote it.
_DESIGN_SECTIONS: Final = ADDED_WITH_SEQUENTIAL | ADDED_WITH_SWEEP

# A leg's own files (summary.json, rows.json) gained keys over the same steps: verify
# does not count their absence from a leg sealed earlier as a difference.
ADDED_TO_LEG_FILES: Final = (
    ADDED_LATER | _AFTER_ABBA_V1 | ADDED_WITH_SEQUENTIAL | ADDED_WITH_SWEEP
    | {IDLE_BEFORE, IDLE_AFTER, "exactness", "model_release_manifest"}
    # rows v2: the ids around held-back ones (a v1 row has no such key)
    | {"gapped_token_ids"}
    # issue 33: each leg's covariates
    | {"covariates"})


def absent_ok(schema_id: object, *, sealed: bool) -> frozenset[str]:
    """The keys a record of this schema id may lack: those of the steps after its form
    was last written. `sealed`: a reader's view of evidence sealed by an older tokrecord
    (every step since its form may be missing); otherwise a record about to be written."""
    later = _AFTER_ABBA_V1 if schema_id == SCHEMA_ABBA_V1 else frozenset()
    if sealed:
        later = _AFTER_ABBA_V1 | (ADDED_LATER if schema_id in _V1_FORMS else later)
    return later | _DESIGN_SECTIONS


def added_to_leg_files(key: str) -> bool:
    """Whether a leg file sealed earlier may lack this key (see ADDED_TO_LEG_FILES)."""
    return key in ADDED_TO_LEG_FILES


# -- versions -----------------------------------------------------------------------------

_VERSIONED = re.compile(r"^(tokrecord\.[a-z-]+)/v([0-9]{1,6})$")


@dataclass(frozen=True)
class Newer:
    """A schema id of a known family with a version this tokrecord does not know."""

    schema: str
    newest: str


def newer_than_known(schema: object, known: tuple[str, ...]) -> Newer | None:
    """Whether `schema` names a later version of one of `known`'s families."""
    if not isinstance(schema, str) or (match := _VERSIONED.match(schema)) is None:
        return None
    family, version = match.group(1), int(match.group(2))
    ours = [int(m.group(2)) for k in known if (m := _VERSIONED.match(k)) and m.group(1) == family]
    if ours and version > max(ours):
        return Newer(schema=schema, newest=f"{family}/v{max(ours)}")
    return None


def check_record_version(obj: Mapping[str, Any], source: str) -> None:
    """ConfigError naming the file and its 'schema' key when the record is newer than this
    tokrecord reads: it may hold facts an older reader would silently drop."""
    newer = newer_than_known(obj.get("schema"), KNOWN_RECORD_SCHEMAS)
    if newer is not None:
        raise ConfigError(
            f"{source}: key 'schema': {newer.schema!r} is newer than this tokrecord reads "
            f"(newest known: {newer.newest!r}); upgrade tokrecord to read it")


# -- leg evidence -------------------------------------------------------------------------


def leg_has_probes(config: Mapping[str, Any]) -> bool:
    """Whether a leg's config.json was written with the probes (idle gates, telemetry):
    a leg sealed before them is recomputed without them."""
    leg = config.get("leg", {})
    return isinstance(leg, Mapping) and "idle" in leg
