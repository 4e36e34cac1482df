"""Every older form of tokrecord's evidence, upgraded at load: one function per older
schema id, in this module only.

A record or leg file sealed by an earlier tokrecord lacks the keys added since. Each older
schema id has one upgrade function (pyperf's `_json_load(version)` is the model) that maps
a document of that id to the next form: it fills every key that form may lack with None
("not recorded") at the exact path where the key lives, and says which paths it filled.
`load_current` climbs the ladder to the current form; the record schema validates the
result as strictly as a record being written (every key required), and verify does not
count a filled path as a difference. A record whose schema id is newer than this
tokrecord knows is refused here, naming the file and the key, before any reader sees it;
so is an id of no form it knows.

Migration never touches the bytes: a sealed record's signature and hashes are checked
over the files as stored (evidence.seal); only the in-memory reading is upgraded.

A new field means a new schema id and one upgrade step: add the id (record.ids), make the
id it replaces an older form here with one `_upgrade_*` function, and nothing in the
readers changes.

experiment-record/v1 is the one form the ladder leaves as itself: verify recomputes it in
its own form, and that recompute (the v1 builder) is this module's companion,
record/migrate_v1.py. It cannot live here: it builds with record.abba and record.schema,
and the schema imports this module. `recomputed_as` says which form a stored record is
recomputed in; record.migrate_v1.abba_builder turns that into the builder.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import SCHEMA_ROWS, SCHEMA_ROWS_V1
from tokrecord.jsontypes import JSONObject
from tokrecord.record.ids import (
    SCHEMA_ABBA,
    SCHEMA_ABBA_V1,
    SCHEMA_ABBA_V2,
    SCHEMA_SINGLE,
    SCHEMA_SINGLE_V1,
)

# Where a key lives in a document: object keys, and list indices.
KeyPath = tuple[str | int, ...]
# A path pattern: "*" stands for every key of an object, or every item of a list.
_Pattern = tuple[str, ...]

# The forms records are written in today: read as they are.
CURRENT_RECORD_SCHEMAS: Final = (SCHEMA_ABBA, SCHEMA_SINGLE)


@dataclass(frozen=True)
class Upgraded:
    """A document read as the current form of its kind."""

    obj: JSONObject  # a new object: the stored one is never changed
    filled: frozenset[KeyPath]  # where the upgrade put None: the stored form lacks the key
    stored_schema: str  # the schema id as stored


def dotted(path: KeyPath) -> str:
    """A path as verify names fields: keys joined by dots, list items as [i]."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def _fill(obj: JSONObject, patterns: tuple[_Pattern, ...]) -> tuple[JSONObject, frozenset[KeyPath]]:
    """A copy of obj with None at every path a pattern names whose parent is there and an
    object without that key; with the paths filled. Patterns apply in order, so a section
    filled with None is not descended into by a later pattern. A parent of another shape
    (hostile or malformed evidence) is left for the validator to name."""
    out = copy.deepcopy(obj)
    filled: list[KeyPath] = []

    def walk(node: object, pattern: _Pattern, at: KeyPath) -> None:
        head, rest = pattern[0], pattern[1:]
        if not rest:
            if isinstance(node, dict) and head not in node:
                node[head] = None
                filled.append((*at, head))
            return
        if head == "*" and isinstance(node, dict):
            for key, item in node.items():
                walk(item, rest, (*at, key))
        elif head == "*" and isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, rest, (*at, index))
        elif isinstance(node, dict) and head in node:
            walk(node[head], rest, (*at, head))

    for pattern in patterns:
        walk(out, pattern, ())
    return out, frozenset(filled)


def _paths(*dotted_patterns: str) -> tuple[_Pattern, ...]:
    return tuple(tuple(p.split(".")) for p in dotted_patterns)


# -- records: the keys each older form may lack, where they live ----------------------------

# Added with the probes (idle gates, telemetry, hardware): a v1 record or single-leg record
# sealed before them has none.
_PROBES_LEGS: Final = _paths(
    "operational.legs.*.prestart_idle_seconds", "operational.legs.*.poststop_idle_seconds",
    "operational.legs.*.prestart_idle_snapshots", "operational.legs.*.poststop_idle_snapshots",
    "operational.legs.*.idle_passed")
# Added with the engine adapters, the seeds' remaining evidence (portable manifests, the
# exactness documents, copies of the source bundles), crash safety (the clock) and leg
# gates v2 (how rows were compared): in every section both record kinds share.
_SHARED_LATER: Final = _paths(
    "metric_accounting.clock",
    "reproducibility.portable_model_manifest", "reproducibility.portable_model_manifest_sha256",
    "reproducibility.runtime_lock", "reproducibility.runtime_lock_sha256",
    "source.sources.*.bundle", "source.sources.*.patch",
    "artifacts.all_vs_canonical_teacher", "artifacts.all_vs_canonical_teacher_sha256")
# The same steps in an experiment record's own sections.
_EXPERIMENT_LATER: Final = _paths(
    "quality.source_identity_passed_all_legs",
    "artifacts.cross_leg_exactness", "artifacts.cross_leg_exactness_sha256",
    "runs.*.identity_sha256", "runs.*.teacher_exact_compared_by")


def _upgrade_abba_v1(obj: JSONObject) -> tuple[JSONObject, frozenset[KeyPath]]:
    """experiment-record/v1: one ABBA block and the paired bootstrap, a design with no
    later version of itself (v2 is another analysis), so it is read by its own model,
    complete: the probes' keys where it was sealed before them, and every key added after
    the form was last written (which its recompute, record.abba, still leaves out)."""
    return _fill(obj, (
        *_paths("hardware", "quality.idle_before_and_after_all_legs",
                "quality.same_hardware_all_legs", "runs.*.telemetry"),
        *_PROBES_LEGS, *_SHARED_LATER, *_EXPERIMENT_LATER))


def _upgrade_abba_v2(obj: JSONObject) -> tuple[JSONObject, frozenset[KeyPath]]:
    """experiment-record/v2 -> v3: the keys added to v2 without a new id (v2 came after the
    probes: those it always has). The engine adapters' sections, the seeds' evidence
    sections, the noise diagnostic (issue 33), the sequential and sweep sections and the
    protocol's max_blocks and prefix reuse."""
    upgraded, filled = _fill(obj, (
        *_SHARED_LATER, *_EXPERIMENT_LATER,
        *_paths("server_log_facts", "speculative", "component_evidence", "model",
                "unchanged_record_stack", "prior_recheck", "noise_diagnostic",
                "protocol.max_blocks", "protocol.prefix_history_response_reuse",
                # the bias-adjusted estimate came a day after the sequential section
                "sequential", "sequential.estimate_adjusted_ratio",
                "sequential.estimate_adjustment",
                # a sweep's sequential section, left out where the sweep was not sequential
                "sweep", "sweep.sequential")))
    return {**upgraded, "schema": SCHEMA_ABBA}, filled


def _upgrade_single_v1(obj: JSONObject) -> tuple[JSONObject, frozenset[KeyPath]]:
    """single-leg-record/v1 -> v2: the probes' keys (hardware, telemetry, the idle gates)
    where it was sealed before them, and every key added to v1 without a new id."""
    upgraded, filled = _fill(obj, (
        *_paths("hardware", "telemetry"), *_PROBES_LEGS, *_SHARED_LATER,
        *_paths("server_log_facts", "graph", "speculative", "identity_sha256",
                "source_identity_passed", "record_blockers", "treatment", "model",
                "component_evidence", "unchanged_record_stack", "prior_recheck",
                "sha256.exactness", "sha256.model_release_manifest")))
    return {**upgraded, "schema": SCHEMA_SINGLE}, filled


@dataclass(frozen=True)
class _Step:
    upgrade: Callable[[JSONObject], tuple[JSONObject, frozenset[KeyPath]]]
    to: str  # the schema id of the form it yields


# One step per older record id. experiment-record/v1 yields itself (see _upgrade_abba_v1):
# it is recomputed by its own builder, record.migrate_v1.abba_record_v1.
_RECORD_STEPS: Final[Mapping[str, _Step]] = {
    SCHEMA_ABBA_V1: _Step(_upgrade_abba_v1, SCHEMA_ABBA_V1),
    SCHEMA_ABBA_V2: _Step(_upgrade_abba_v2, SCHEMA_ABBA),
    SCHEMA_SINGLE_V1: _Step(_upgrade_single_v1, SCHEMA_SINGLE),
}
KNOWN_RECORD_SCHEMAS: Final = (*CURRENT_RECORD_SCHEMAS, *_RECORD_STEPS)
OLDER_RECORD_SCHEMAS: Final = tuple(_RECORD_STEPS)


def load_current(obj: Mapping[str, object], source: str) -> Upgraded:
    """The record as the current form of its kind (experiment-record/v1 as its own complete
    form), with the paths its upgrades filled. ConfigError naming the file and its 'schema'
    key when the id is newer than this tokrecord reads, or of no form it knows."""
    stored = _schema_known_so_far(obj, source)
    if not isinstance(stored, str) or stored not in KNOWN_RECORD_SCHEMAS:
        found = "missing" if stored is None else repr(stored)
        raise ConfigError(f"{source}: key 'schema': {found}; not a record form this tokrecord "
                          f"reads (it reads {', '.join(map(repr, KNOWN_RECORD_SCHEMAS))})")
    doc, filled, schema = dict(obj), frozenset[KeyPath](), stored
    while (step := _RECORD_STEPS.get(schema)) is not None:
        doc, more = step.upgrade(doc)
        filled |= more
        if step.to == schema:  # a form that is its own latest version
            break
        schema = step.to
    return Upgraded(obj=doc, filled=filled, stored_schema=stored)


def recomputed_as(stored_schema: str) -> str:
    """The form a record stored as `stored_schema` is recomputed in (verify): the current
    form of its kind, reached by the ladder, or the stored form itself where that form is
    its own latest version (experiment-record/v1: record.migrate_v1). An id the ladder
    does not know is returned as it is, for the caller to refuse."""
    schema = stored_schema
    while (step := _RECORD_STEPS.get(schema)) is not None and step.to != schema:
        schema = step.to
    return schema


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


def check_record_version(obj: Mapping[str, object], source: str) -> None:
    """ConfigError naming the file and its 'schema' key when the record is newer than this
    tokrecord reads: it may hold facts an older reader would silently drop."""
    _schema_known_so_far(obj, source)


def check_written_form(obj: Mapping[str, object], source: str) -> str:
    """The schema id of a record about to be written; ConfigError naming the file and its
    'schema' key when it is newer than known, or an older form (read, never written)."""
    stored = _schema_known_so_far(obj, source)
    if stored in OLDER_RECORD_SCHEMAS:
        raise ConfigError(
            f"{source}: key 'schema': {stored!r} is an older form, read but no longer "
            f"written (a record is written as {' or '.join(map(repr, CURRENT_RECORD_SCHEMAS))})")
    return str(stored)


def _schema_known_so_far(obj: Mapping[str, object], source: str) -> object:
    """The record's schema id as stored, refused when newer than this tokrecord knows."""
    stored = obj.get("schema")
    newer = newer_than_known(stored, KNOWN_RECORD_SCHEMAS)
    if newer is not None:
        raise ConfigError(
            f"{source}: key 'schema': {newer.schema!r} is newer than this tokrecord reads "
            f"(newest known: {newer.newest!r}); upgrade tokrecord to read it")
    return stored


# -- leg evidence -------------------------------------------------------------------------


def _upgrade_rows_v1(obj: JSONObject) -> tuple[JSONObject, frozenset[KeyPath]]:
    """leg-rows/v1 -> v2: v2 rows keep the ids a server gave around the ones it held back
    (gapped_token_ids); a v1 row has no such key."""
    upgraded, filled = _fill(obj, _paths("rows.*.trace.gapped_token_ids"))
    return {**upgraded, "schema": SCHEMA_ROWS}, filled


def load_current_rows(obj: object) -> Upgraded | None:
    """A leg's rows.json as the current rows form, with the paths filled; None where it is
    not an object with a schema id (verify names what is wrong with it). The teacher-exact
    rule stays the stored form's (experiment.leg.gates_rule)."""
    if not isinstance(obj, dict) or not isinstance(stored := obj.get("schema"), str):
        return None
    if stored == SCHEMA_ROWS_V1:
        doc, filled = _upgrade_rows_v1(obj)
        return Upgraded(obj=doc, filled=filled, stored_schema=stored)
    return Upgraded(obj=obj, filled=frozenset(), stored_schema=stored)


# summary.json kept its id (leg-summary/v1) as sections were added: each older form is told
# by the section it lacks, and verify derives that section again only where it is there.


def summary_has_covariates(summary: Mapping[str, object]) -> bool:
    """Whether a leg's summary.json was written after issue 33 (each leg's covariates):
    an earlier one has no `covariates` section to compare."""
    return "covariates" in summary


def summary_has_log_facts(summary: Mapping[str, object]) -> bool:
    """Whether a leg's summary.json was written with log facts: an earlier one has no
    `log_facts` section to compare."""
    return "log_facts" in summary


def leg_has_probes(config: Mapping[str, object]) -> bool:
    """Whether a leg's config.json was written with the probes (idle gates, telemetry): a
    leg sealed before them is recomputed without them. config.json kept its id
    (leg-config/v1) when the probes came, so the form is told by its marker: the probes
    added the leg's `idle` section, which every later config has."""
    leg = config.get("leg", {})
    return isinstance(leg, Mapping) and "idle" in leg
