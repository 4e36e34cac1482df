"""A plan's prior record, rechecked on the public API before the plan runs.

A plan that names ``[prior] id`` claims to beat that leaderboard row. Before anything
runs, the row is fetched from the leaderboard's public API and the observation kept:
when, its status, its ``tokSOut`` and the service's ``createdAt``. The plan is refused
(``ConfigError``, nothing preregistered) when the row is missing, not APPROVED, or its
value is not the plan's ``value_tok_s``: the record would otherwise be measured
against a prior that is not what the public sees. ``offline`` (``tokrecord run
--offline-prior``) skips the lookup, and the observation then says, in so many words,
that the prior was not rechecked.

The observation is ``prior-check.json`` in the experiment directory (``PRIOR_CHECK``),
written once with exclusive create and sealed with the record; ``load_prior_check``
reads it back for the record (``prior_recheck``). A resumed experiment keeps the
observation made when it was first preregistered.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Final

from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json
from tokrecord.experiment.plan import Plan
from tokrecord.submit.contract import APPROVED
from tokrecord.submit.target import Exchange, Target

PRIOR_CHECK: Final = "prior-check.json"
PRIOR_CHECK_SCHEMA: Final = "tokrecord.prior-check/v1"
REL_TOL: Final = 1e-9  # JSON carries a float exactly; this only forgives a last-digit rounding


def _observation(plan: Plan, target: Target, **fields: Any) -> dict[str, Any]:
    return {"schema": PRIOR_CHECK_SCHEMA, "plan_sha256": plan.sha256, "target": target.name,
            "base_url": target.base_url, "prior_id": plan.prior.id,
            "plan_value_tok_s": plan.prior.value_tok_s, **fields}


def judge(plan: Plan, target: Target, exchange: Exchange) -> tuple[dict[str, Any], str | None]:
    """The observation of one fetch of the prior's public row, and why it refuses the plan
    (None: it does not). Pure: the fetch is the caller's."""
    row = target.public_row(exchange)
    obs = _observation(
        plan, target, rechecked=True, checked_utc=exchange.utc, http_status=exchange.status,
        found=row is not None, status=row.status if row else None,
        tok_s_out=row.tok_s if row else None, created_at=row.created_at if row else None,
        exchange=exchange.to_json())
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


def recheck_prior(plan: Plan, exp_dir: Path, client: Target, offline: bool) -> dict[str, Any] | None:
    """The observation of the plan's prior, made now (or read back on a resume); None when
    the plan names no prior id. Raises ConfigError when the prior refuses the plan. Writes
    nothing: ``write_prior_check`` does, once the experiment directory is preregistered."""
    if plan.prior.id is None:
        return None
    existing = load_prior_check(exp_dir)
    if existing is not None:
        return existing
    if offline:
        return _observation(plan, client, rechecked=False,
                            reason="not rechecked: tokrecord run --offline-prior")
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


def write_prior_check(exp_dir: Path, observation: dict[str, Any]) -> Path:
    """``prior-check.json`` in the experiment directory, once (exclusive create); an
    identical file already there is kept."""
    path = exp_dir / PRIOR_CHECK
    body = canonical_json(observation) + b"\n"
    if path.exists() and path.read_bytes() == body:
        return path
    with open(path, "xb") as fh:
        fh.write(body)
    return path


def load_prior_check(exp_dir: Path) -> dict[str, Any] | None:
    """The sealed observation of the prior (None: the experiment has none)."""
    path = exp_dir / PRIOR_CHECK
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != PRIOR_CHECK_SCHEMA:
        raise ConfigError(f"{path} is not a {PRIOR_CHECK_SCHEMA} document")
    return doc


def prior_record_fields(exp_dir: Path) -> dict[str, Any]:
    """The seeds' ``prior_approved_record`` facts from the observation, for record building:
    ``public_api_rechecked_utc`` and ``status`` when rechecked; ``rechecked: false`` with the
    reason otherwise; {} when the experiment has no observation."""
    doc = load_prior_check(exp_dir)
    if doc is None:
        return {}
    if not doc.get("rechecked"):
        return {"rechecked": False, "public_api_rechecked_utc": None, "status": None,
                "reason": doc.get("reason")}
    return {"rechecked": True, "public_api_rechecked_utc": doc.get("checked_utc"),
            "status": doc.get("status"), "public_tok_s": doc.get("tok_s_out")}
