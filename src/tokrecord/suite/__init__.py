"""The prompt suite: an ordered, content-hashed list of unique rows."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokrecord.errors import SuiteError

DEFAULT_SUITE = "suite-default.jsonl"


class SuiteRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(gt=0)

    @property
    def prompt_sha256(self) -> str:
        return hashlib.sha256(self.prompt.encode("utf-8")).hexdigest()


class Suite(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    sha256: str  # of the file's bytes: any edit makes it a different suite
    rows: tuple[SuiteRow, ...]

    def head(self, count: int) -> Suite:
        """The first `count` rows, as a suite of its own (its hash names the cut)."""
        if not 0 < count <= len(self.rows):
            raise SuiteError(f"cannot take {count} rows of a {len(self.rows)}-row suite")
        digest = hashlib.sha256(f"{self.sha256}:head:{count}".encode()).hexdigest()
        return Suite(name=f"{self.name}[:{count}]", sha256=digest, rows=self.rows[:count])


def parse_suite(data: bytes, name: str) -> Suite:
    """Parse JSONL bytes; every problem names the file and line."""
    rows: list[SuiteRow] = []
    seen_prompts: dict[str, int] = {}
    seen_ids: dict[str, int] = {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{name}: not UTF-8 text ({exc})") from exc
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{name}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
        try:
            row = SuiteRow.model_validate(obj)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()
            )
            raise SuiteError(f"{name}:{lineno}: {problems}") from exc
        if row.prompt in seen_prompts:
            raise SuiteError(
                f"{name}:{lineno}: duplicate prompt (same text as line {seen_prompts[row.prompt]}); "
                "every prompt must be unique so no cache can help"
            )
        if row.id in seen_ids:
            raise SuiteError(f"{name}:{lineno}: duplicate id {row.id!r} (first on line {seen_ids[row.id]})")
        seen_prompts[row.prompt] = lineno
        seen_ids[row.id] = lineno
        rows.append(row)
    if not rows:
        raise SuiteError(f"{name}: the suite has no rows")
    return Suite(name=name, sha256=hashlib.sha256(data).hexdigest(), rows=tuple(rows))


def load_suite(path: Path | None = None) -> Suite:
    """Load a suite file, or the packaged default suite when no path is given."""
    if path is None:
        data = resources.files("tokrecord.data").joinpath(DEFAULT_SUITE).read_bytes()
        return parse_suite(data, DEFAULT_SUITE)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SuiteError(f"cannot read suite {path}: {exc.strerror}") from exc
    return parse_suite(data, str(path))
