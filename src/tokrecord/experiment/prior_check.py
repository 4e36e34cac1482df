"""The sealed observation of a plan's prior record: ``prior-check.json`` in the experiment.

``tokrecord.submit.prior`` makes the observation (it asks the leaderboard); this module
only writes it, once, and reads it back, so that record building and verification can
read it without importing the submission stage. The document is
``tokrecord.prior-check/v1``: ``rechecked`` (false with ``reason`` under
``--offline-prior``), and when rechecked ``checked_utc``, ``status``, ``tok_s_out``,
``created_at``, ``match`` and the scrubbed HTTP exchange.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict, cast

from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json, layout

PRIOR_CHECK_SCHEMA: Final = "tokrecord.prior-check/v1"


class PriorObservation(TypedDict):
    """A prior-check.json document: always the plan's side; the row's as seen when
    rechecked, else the reason it was not."""

    schema: str
    plan_sha256: str
    target: str
    base_url: str
    prior_id: str | None
    plan_value_tok_s: float | None
    rechecked: bool
    reason: NotRequired[str]
    checked_utc: NotRequired[str | None]
    http_status: NotRequired[int | None]
    found: NotRequired[bool]
    status: NotRequired[str | None]
    tok_s_out: NotRequired[float | None]
    created_at: NotRequired[str | None]
    exchange: NotRequired[Mapping[str, object]]  # submit.target.ExchangeJSON
    match: NotRequired[bool]
    refused: NotRequired[str | None]


def write_prior_check(exp_dir: Path, observation: PriorObservation) -> Path:
    """``prior-check.json`` in the experiment directory, once (exclusive create); an
    identical file already there is kept."""
    path = exp_dir / layout.PRIOR_CHECK
    body = canonical_json(observation) + b"\n"
    if path.exists() and path.read_bytes() == body:
        return path
    with open(path, "xb") as fh:
        fh.write(body)
    return path


def load_prior_check(exp_dir: Path) -> PriorObservation | None:
    """The sealed observation of the prior (None: the experiment has none)."""
    path = exp_dir / layout.PRIOR_CHECK
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != PRIOR_CHECK_SCHEMA:
        raise ConfigError(f"{path} is not a {PRIOR_CHECK_SCHEMA} document")
    return cast(PriorObservation, doc)  # the schema id names the form; readers .get() keys


def prior_record_fields(exp_dir: Path) -> dict[str, Any]:
    """What a record says of the recheck, in the seeds' words (``prior_approved_record``'s
    ``public_api_rechecked_utc`` and ``status``): {} when the experiment has no observation;
    ``rechecked: false`` and the reason under --offline-prior."""
    doc = load_prior_check(exp_dir)
    if doc is None:
        return {}
    if not doc.get("rechecked"):
        return {"rechecked": False, "public_api_rechecked_utc": None, "status": None,
                "public_tok_s": None, "reason": doc.get("reason")}
    return {"rechecked": True, "public_api_rechecked_utc": doc.get("checked_utc"),
            "status": doc.get("status"), "public_tok_s": doc.get("tok_s_out"), "reason": None}
