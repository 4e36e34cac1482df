"""Who signed, and why we believe it: pinning a seal's key.

A seal proves only that whoever holds its key sealed these bytes; the key travels
inside the seal, so anyone can re-seal an edited copy. A pass therefore names the
key's fingerprint and says how it was pinned, in this order:

1. ``--fingerprint`` given by the user (a mismatch is a problem, not a pin);
2. the trust file ``<config dir>/trusted_keys``: one ``SHA256:…`` fingerprint and a
   label per line, ``#`` comments allowed;
3. the local signing key (evidence this machine sealed itself);
4. otherwise "not pinned": the seal holds, but the signer is whoever they say.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.evidence import safe

TRUST_FILE_NAME: Final = "trusted_keys"
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
NOT_PINNED: Final = "not pinned"


class Signer(BaseModel):
    """The key a seal verified under, and how it was pinned (`NOT_PINNED` if it was not)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str | None  # None: no readable signature to name a key
    pinned_by: str

    @property
    def pinned(self) -> bool:
        return self.fingerprint is not None and self.pinned_by != NOT_PINNED

    def describe(self) -> str:
        if self.fingerprint is None:
            return "signed by no readable key"
        return f"signed by {self.fingerprint} ({self.pinned_by})"


def parse_trusted(text: str, source: str) -> dict[str, str]:
    """fingerprint -> label from a trust file's text; a malformed line is a ConfigError
    naming the file and the line."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fingerprint, _, label = line.partition(" ")
        if not _FINGERPRINT.fullmatch(fingerprint):
            raise ConfigError(f"{source}: line {number}: expected 'SHA256:<43 base64 chars> "
                              "label', as `tokrecord verify` prints a fingerprint")
        out[fingerprint] = label.strip() or "no label"
    return out


def load_trusted(path: Path) -> dict[str, str]:
    """The trust file at `path`; absent is empty."""
    try:
        text = safe.read_text(path, 1 << 20)
    except safe.UnsafeEvidence as exc:
        if exc.reason == "missing":
            return {}
        raise ConfigError(f"trust file {exc.file}: {exc.reason}") from exc
    return parse_trusted(text, str(path))


def pin(fingerprint: str | None, *, expected: str | None, trusted: dict[str, str],
        trust_file: Path, local: str | None) -> Signer:
    """How `fingerprint` is pinned (see the module's order)."""
    if fingerprint is None:
        return Signer(fingerprint=None, pinned_by=NOT_PINNED)
    if expected is not None and fingerprint == expected:
        return Signer(fingerprint=fingerprint, pinned_by="pinned by --fingerprint")
    if fingerprint in trusted:
        label = safe.excerpt(trusted[fingerprint], 60).strip("'\"")
        return Signer(fingerprint=fingerprint, pinned_by=f"pinned by {trust_file}: {label}")
    if local is not None and fingerprint == local:
        return Signer(fingerprint=fingerprint, pinned_by="pinned: the local signing key")
    return Signer(fingerprint=fingerprint, pinned_by=NOT_PINNED)
