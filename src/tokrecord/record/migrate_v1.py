"""experiment-record/v1's recompute: the one older record form that is not upgraded to the
current one but derived again in its own form (record.migrate's ladder leaves it as
itself: `_upgrade_abba_v1`).

A v1 record is one ABBA block read by the paired bootstrap, a design with no later
version of itself (v2's k blocks are another analysis). verify recomputes a sealed v1
record from its legs exactly as it was built then, so that it verifies: this module is
that builder, apart from the current one (record.abba) so that no v1 branch is left
there. It lives beside record/migrate.py rather than in it because it builds with
record.abba and record.schema, and the schema imports migrate (one module family, no
cycle). `abba_builder` is the one dispatch: the builder of a stored record's form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pydantic import TypeAdapter

from tokrecord.errors import ConfigError
from tokrecord.experiment.leg import LegResult, RowRecord
from tokrecord.experiment.plan import Plan, abba_pairs
from tokrecord.experiment.stats import Verdict, paired_bootstrap
from tokrecord.gates import RowOutcome
from tokrecord.record import (
    EvidenceFacts,
    accounting,
    log_facts,
    operational,
    reproducibility,
)
from tokrecord.record.abba import (
    abba_record,
    arm_sections,
    attempt_counts,
    figures,
    findings,
    hardware_section,
    leg_blocks,
    protocol_section,
    quality_section,
    record_status,
    whole,
)
from tokrecord.record.ids import SCHEMA_ABBA, SCHEMA_ABBA_V1
from tokrecord.record.migrate import recomputed_as
from tokrecord.record.schema import (
    AbbaArtifacts,
    AbbaPairs,
    AbbaProtocol,
    AbbaRuns,
    Attempt,
    Empty,
    ExperimentRecord,
    ExperimentRecordV3,
    PriorApprovedRecord,
    Source,
    Treatments,
)

_SOURCE: TypeAdapter[Any] = TypeAdapter(Source)

# What recomputes an ABBA record: the legs, the state log's attempts and idle gaps, the
# evidence facts, the preregistered power and an older sweep method.
AbbaBuilder = Callable[
    [Plan, Mapping[str, LegResult], Mapping[str, Sequence[RowRecord]],
     Mapping[str, Sequence[RowOutcome]], Sequence[Mapping[str, Any]], Mapping[str, float],
     EvidenceFacts, Mapping[str, Any] | None, str | None],
    ExperimentRecord | ExperimentRecordV3]


def abba_record_v1(
    plan: Plan,
    results: Mapping[str, LegResult],
    rows: Mapping[str, Sequence[RowRecord]],
    outcomes: Mapping[str, Sequence[RowOutcome]],
    attempts: Sequence[Mapping[str, Any]],
    idle_gaps: Mapping[str, float],
    facts: EvidenceFacts,
    power: Mapping[str, Any] | None = None,  # v1 had no preregistered power: not read
    sweep_method: str | None = None,
) -> ExperimentRecord:
    """A v1 record, recomputed exactly as it was built before v2 (so that it verifies):
    the first block's two pairs, the paired bootstrap's verdict (for the record too), and
    no component evidence among the gate's reasons."""
    figs = figures(results, rows)
    pair_names = abba_pairs(1)
    boot = paired_bootstrap([(figs[c], figs[a]) for c, a in pair_names], plan.verdict)
    f = findings(plan, results, outcomes, facts, figs, pair_names,
                 boot.verdict if boot else Verdict.UNDECIDED, boot.verdict if boot else None,
                 found_label="verdict", more_reasons=[], sweep_method=sweep_method)
    tries = attempt_counts(attempts, results)
    return ExperimentRecord(
        schema=SCHEMA_ABBA_V1, experiment=plan.name, date=facts.date, status=record_status(f),
        plan_sha256=plan.sha256,
        prior_approved_record=PriorApprovedRecord(id=plan.prior.id, tok_s=plan.prior.value_tok_s),
        attempts=[Attempt.model_validate(a) for a in attempts],
        quality=quality_section(results, facts, f, tries), verdict=f.verdict,
        record_gate=whole(f.gate),
        metric_accounting=accounting(plan, f.headline),
        log_facts=log_facts(results),
        operational=operational(results, idle_gaps),
        reproducibility=reproducibility(facts.root),
        source=_SOURCE.validate_python(facts.identity), hardware=hardware_section(facts, f),
        artifacts=AbbaArtifacts(root=facts.root), submission=Empty(),
        treatment=Treatments.model_validate(arm_sections(plan)),
        protocol=protocol_section(AbbaProtocol, plan, results, rows, idle_gaps),
        runs=AbbaRuns.model_validate(leg_blocks(results, facts, tries)),
        pair_results=AbbaPairs.model_validate({k: whole(v) for k, v in f.pairs.items()}),
        bootstrap=None if boot is None else whole(boot),
    )


# The builder of each record form verify recomputes in (record.migrate.recomputed_as).
_BUILDERS: Final[Mapping[str, AbbaBuilder]] = {SCHEMA_ABBA: abba_record,
                                               SCHEMA_ABBA_V1: abba_record_v1}


def abba_builder(stored_schema: str) -> AbbaBuilder:
    """The builder that recomputes an ABBA record stored as `stored_schema`: the current
    one (record.abba) for every form the ladder upgrades to the current one, this
    module's v1 recompute for experiment-record/v1."""
    builder = _BUILDERS.get(recomputed_as(stored_schema))
    if builder is None:
        raise ConfigError(f"unknown experiment record schema {stored_schema!r}")
    return builder
