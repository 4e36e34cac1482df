"""Evidence: write-once run directories.

Every file is created exclusively (an existing file is never replaced) and JSON
is written in the JSON Canonicalization Scheme (RFC 8785) so that the same facts
always hash the same, whoever re-serialises them. Timestamps are nanoseconds
since the leg's own clock epoch, which keeps every integer inside the I-JSON range
RFC 8785 requires (absolute monotonic nanoseconds exceed 2^53 after ~104 days).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import rfc8785
from pydantic import BaseModel

from tokrecord.errors import ConfigError


def canonical_json(obj: Any) -> bytes:
    """RFC 8785 (JCS) bytes: sorted keys, no whitespace, ECMAScript number forms."""
    try:
        return bytes(rfc8785.dumps(obj))
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(f"cannot canonicalise as RFC 8785 JSON: {exc}") from exc


def canonical_sha256(obj: Any) -> str:
    """sha256 of the RFC 8785 form of ``obj`` (no trailing newline)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def _fast_canonical(record: Mapping[str, Any]) -> bytes:
    # For records without floats, sorted compact json.dumps IS the RFC 8785 form
    # (same key order for ASCII keys, same string escapes, integers as written) and
    # is several times faster: this serialises every chunk in the token loop.
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _plain(obj: Any) -> Any:
    return obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj


class JsonlWriter:
    """Appends one canonical JSON object per line and flushes it at once."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh

    def write(self, record: Mapping[str, Any]) -> None:
        # Chunk events hold only ints, strings and lists of ints (see client.stream).
        line = _fast_canonical(record) if record.get("kind") == "chunk" else canonical_json(record)
        self._fh.write(line + b"\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class RunDir:
    """A run directory that only ever gains files."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path) -> RunDir:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigError(
                f"output directory {path} already exists and is not empty; evidence is never "
                "overwritten — choose a new --out"
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create output directory {path}: {exc.strerror}") from exc
        return cls(path)

    def file(self, name: str) -> Path:
        return self.path / name

    def write_bytes(self, name: str, data: bytes) -> Path:
        target = self.path / name
        with open(target, "xb") as fh:
            fh.write(data)
        return target

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_bytes(name, canonical_json(_plain(obj)) + b"\n")

    def jsonl(self, name: str) -> JsonlWriter:
        return JsonlWriter(open(self.path / name, "xb"))


def read_json(path: Path, error: type[Exception]) -> Any:
    """A JSON file; a missing, unreadable or malformed one is `error` naming the path."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not JSON: {exc}") from exc


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
