"""The local submission ledger: one record is submitted to one leaderboard once.

``<config dir>/submissions.jsonl`` (``$TOKRECORD_CONFIG_DIR``, else
``~/.config/tokrecord``), append-only, one canonical JSON object per line:
``submitted`` when a service accepted a record, ``checked`` when its public row was
compared later. The key is the record's manifest sha256 with the target and the
service URL: a stand-in and the public site are different leaderboards, so a
rehearsal against one never blocks the real submission to the other.

A send holds an exclusive lock on the ledger from the duplicate check to the
append, so two concurrent sends of one record cannot both go out.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from tokrecord.evidence import canonical_json
from tokrecord.evidence.seal import default_config_dir
from tokrecord.jsontypes import JSONObject
from tokrecord.submit.facts import SubmitError

LEDGER_NAME: Final = "submissions.jsonl"
LEDGER_SCHEMA: Final = "tokrecord.submission-ledger/v1"


def normalise_url(url: str) -> str:
    return url.rstrip("/").lower()


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def default(cls) -> Ledger:
        return cls(default_config_dir() / LEDGER_NAME)

    def entries(self) -> list[JSONObject]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SubmitError(f"cannot read the submission ledger {self.path}: {exc.strerror}") from exc
        out: list[JSONObject] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SubmitError(f"{self.path}: line {number} is not JSON ({exc.msg}); the ledger "
                                  "is append-only, repair it by hand") from exc
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def submitted(self, record_sha256: str, target: str, base_url: str) -> JSONObject | None:
        """The latest accepted submission of this record to this service, if any."""
        found = None
        for entry in self.entries():
            if (entry.get("event") == "submitted" and entry.get("record_manifest_sha256") == record_sha256
                    and entry.get("target") == target
                    and normalise_url(str(entry.get("base_url"))) == normalise_url(base_url)):
                found = entry
        return found

    def append(self, entry: Mapping[str, Any]) -> None:
        line = canonical_json({"schema": LEDGER_SCHEMA, **entry}) + b"\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: one write per line, so a reader never sees half an entry.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
