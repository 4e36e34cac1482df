"""A submission's lifecycle, read back from its sealed addenda (pure: documents in, view out).

A record is never edited, so its submission status is not a field of record.json:
it is the latest sealed observation of the service. The receipt of an accepted
submission is the first (the status the submit response gave, usually PENDING);
every ``submission-check`` addendum after it is one more (the public row's status
then, whether it still matched what was sent, and the service's ``createdAt``).
Observations are grouped by service (target and base URL) and submission id, in
addendum order, which is the order they were sealed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

RECEIPT_KIND: Final = "submission-receipt"
CHECK_KIND: Final = "submission-check"
FINAL: Final = frozenset({"APPROVED", "REJECTED"})


@dataclass(frozen=True)
class Observation:
    addendum: str  # the sealed directory's name (NNN-kind)
    kind: str
    utc: str  # when the service was observed
    status: str | None
    match: bool | None  # checks: did the public row match what was sent (None: receipt)
    found: bool = True  # checks: was the public row there
    created_at: str | None = None  # the service's createdAt for the row
    mismatched: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lifecycle:
    target: str
    base_url: str
    submission_id: str
    observations: tuple[Observation, ...]

    @property
    def status(self) -> str | None:
        """The record's submission status at this service: the latest observation's."""
        return self.observations[-1].status if self.observations else None

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def text(self) -> str:
        """One line: the status now, then every observation with its time."""
        steps = []
        for o in self.observations:
            when = o.utc.replace("T", " ").rstrip("Z")[:19]
            what = o.status or ("not found" if not o.found else "?")
            if o.kind == RECEIPT_KIND:
                steps.append(f"submitted {when} {what}")
            else:
                steps.append(f"{when} {what}" + ("" if o.match in (True, None) or not o.found
                                                 else f" (differs: {', '.join(o.mismatched) or '?'})"))
        checks = sum(1 for o in self.observations if o.kind == CHECK_KIND)
        return (f"{self.status or 'unknown'} at {self.base_url} (id {self.submission_id}; "
                f"{checks} check{'s' if checks != 1 else ''}): " + " → ".join(steps))


def _payload(doc: Any) -> Mapping[str, Any] | None:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("payload"), Mapping):
        return None
    payload: Mapping[str, Any] = doc["payload"]
    return payload


def lifecycles(docs: Sequence[tuple[str, Any]]) -> tuple[Lifecycle, ...]:
    """Every submission's lifecycle, from (addendum directory name, addendum.json) pairs
    in name order; submissions in the order they were accepted."""
    found: dict[tuple[str, str, str], list[Observation]] = {}
    for name, doc in docs:
        payload = _payload(doc)
        if payload is None:
            continue
        kind = str(doc.get("kind"))
        sid = payload.get("submission_id")
        key = (str(payload.get("target")), str(payload.get("base_url")), str(sid))
        if kind == RECEIPT_KIND and payload.get("accepted") is True and sid:
            found.setdefault(key, []).append(Observation(
                addendum=name, kind=kind, utc=str(payload.get("sent_utc") or doc.get("created_utc")),
                status=_str(payload.get("status")), match=None,
                created_at=_str((payload.get("response") or {}).get("createdAt")
                                if isinstance(payload.get("response"), Mapping) else None)))
        elif kind == CHECK_KIND and key in found:
            found[key].append(Observation(
                addendum=name, kind=kind, utc=str(payload.get("checked_utc") or doc.get("created_utc")),
                status=_str(payload.get("public_status")), match=bool(payload.get("match")),
                found=bool(payload.get("found", True)),
                created_at=_str(payload.get("public_created_at")),
                mismatched=tuple(str(m.get("field")) for m in payload.get("mismatches") or ()
                                 if isinstance(m, Mapping))))
    return tuple(Lifecycle(t, url, sid, tuple(obs)) for (t, url, sid), obs in found.items())


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
