"""A plan's prior record, rechecked on the public API before the plan runs.

A plan that names ``[prior] id`` claims to beat that leaderboard row. Before anything
runs, the row is fetched from the leaderboard's public API and the observation kept:
when, its status, its ``tokSOut`` and the service's ``createdAt``. The plan is refused
(``ConfigError``, nothing preregistered) when the row is missing, not APPROVED, or its
value is not the plan's ``value_tok_s``: the record would otherwise be measured
against a prior that is not what the public sees. ``offline`` (``tokrecord run
--offline-prior``) skips the lookup, and the observation then says, in so many words,
that the prior was not rechecked.

The observation is ``prior-check.json`` in the experiment directory, written once with
exclusive create and sealed with the record (``tokrecord.experiment.prior_check`` writes
and reads it, so that record building need not import this stage). A resumed
experiment keeps the observation made when it was first preregistered.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

from tokrecord.errors import ConfigError
from tokrecord.evidence.layout import PRIOR_CHECK
from tokrecord.experiment.plan import Plan
from tokrecord.experiment.prior_check import (
    PRIOR_CHECK_SCHEMA,
    PriorObservation,
    load_prior_check,
    prior_record_fields,
    write_prior_check,
)
from tokrecord.submit.contract import APPROVED
from tokrecord.submit.target import Exchange, Target

__all__ = ["PRIOR_CHECK", "judge", "load_prior_check", "prior_record_fields", "recheck_prior",
           "write_prior_check"]
REL_TOL: Final = 1e-9  # JSON carries a float exactly; this only forgives a last-digit rounding


def _observation(plan: Plan, target: Target, rechecked: bool) -> PriorObservation:
    return {"schema": PRIOR_CHECK_SCHEMA, "plan_sha256": plan.sha256, "target": target.name,
            "base_url": target.base_url, "prior_id": plan.prior.id,
            "plan_value_tok_s": plan.prior.value_tok_s, "rechecked": rechecked}


def judge(plan: Plan, target: Target, exchange: Exchange) -> tuple[PriorObservation, str | None]:
    """The observation of one fetch of the prior's public row, and why it refuses the plan
    (None: it does not). Pure: the fetch is the caller's."""
    row = target.public_row(exchange)
    obs = _observation(plan, target, rechecked=True)
    obs["checked_utc"], obs["http_status"] = exchange.utc, exchange.status
    obs["found"], obs["status"] = row is not None, row.status if row else None
    obs["tok_s_out"] = row.tok_s if row else None
    obs["created_at"] = row.created_at if row else None
    obs["exchange"] = exchange.to_json()
    want = plan.prior.value_tok_s
    where = f"{target.base_url}'s public row {plan.prior.id}"
    if row is None:
        why = f"{where} was not found: {target.explain(exchange, None)}"
    elif row.status != APPROVED:
        why = f"{where} is {row.status or 'without a status'}, not {APPROVED}"
    elif want is not None and (row.tok_s is None or not math.isclose(row.tok_s, want, rel_tol=REL_TOL)):
        why = (f"{where} has tokSOut {row.tok_s!r}; the plan's [prior] value_tok_s is {want!r} — "
               "the prior no longer matches")
    else:
        why = None
    obs["match"] = why is None
    obs["refused"] = why
    return obs, why


def recheck_prior(plan: Plan, exp_dir: Path, client: Target, offline: bool
                  ) -> PriorObservation | None:
    """The observation of the plan's prior, made now (or read back on a resume); None when
    the plan names no prior id. Raises ConfigError when the prior refuses the plan. Writes
    nothing: ``write_prior_check`` does, once the experiment directory is preregistered."""
    if plan.prior.id is None:
        return None
    existing = load_prior_check(exp_dir)
    if existing is not None:
        return existing
    if offline:
        offline_obs = _observation(plan, client, rechecked=False)
        offline_obs["reason"] = "not rechecked: tokrecord run --offline-prior"
        return offline_obs
    discovery = client.discover()
    if not discovery.reachable:
        raise ConfigError(
            f"the plan names prior {plan.prior.id}, and {client.base_url} is not reachable to recheck "
            f"it ({'; '.join(discovery.notes)}); run with --offline-prior to go on without the "
            "recheck (the record will say so)")
    obs, why = judge(plan, client, client.fetch(plan.prior.id, discovery))
    if why is not None:
        raise ConfigError(f"the plan is refused: {why}. Fix [prior] in the plan (or run with "
                          "--offline-prior, and the record will say the prior was not rechecked)")
    return obs
