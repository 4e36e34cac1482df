"""Evidence: write-once run directories.

Every file is created exclusively (an existing file is never replaced) and JSON
is written canonically (sorted keys, no insignificant whitespace, UTF-8) so that
the same facts always hash the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from tokrecord.errors import ConfigError


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8; floats in Python's shortest repr."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _plain(obj: Any) -> Any:
    return obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj


class JsonlWriter:
    """Appends one canonical JSON object per line and flushes it at once."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh

    def write(self, record: Mapping[str, Any]) -> None:
        self._fh.write(canonical_json(record) + b"\n")
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
