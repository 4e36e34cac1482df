"""The teacher: canonical outputs of a reference arm, captured once, compared ever after.

Token ids come from the server; a row without ids keeps its text and says so,
because text equality is weaker evidence than token equality. A row whose server
held some ids back at known positions (llama.cpp's UTF-8 hold-back) keeps the ids it
was given, by position (teacher v2); a v1 teacher has no such key, and its hash is
that of the file it was read from.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokrecord.errors import ConfigError
from tokrecord.evidence import canonical_json, write_exclusive

SCHEMA_TEACHER_V1: Final = "tokrecord.teacher/v1"
SCHEMA_TEACHER: Final = "tokrecord.teacher/v2"


class TeacherRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    row: int
    row_id: str
    prompt_sha256: str
    token_ids: tuple[int, ...] | None
    text: str
    finish_reason: str | None
    n_tokens: int
    compare_by: Literal["token_ids", "text"]
    gapped_token_ids: tuple[int | None, ...] | None = None


class Teacher(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: Literal["tokrecord.teacher/v1", "tokrecord.teacher/v2"] = Field(
        default=SCHEMA_TEACHER, alias="schema")
    created_utc: str
    suite_name: str
    suite_sha256: str
    model: str
    model_manifest: dict[str, str] | None
    arm: dict[str, Any]
    source_run: str
    rows: tuple[TeacherRow, ...]

    @property
    def sha256(self) -> str:
        """Hash of the canonical form: equal to the file's hash when written by us."""
        return hashlib.sha256(canonical_json(self.to_json()) + b"\n").hexdigest()

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", by_alias=True)
        if self.schema_id == SCHEMA_TEACHER_V1:  # the key v1 never had, for v1's hash
            for row in data["rows"]:
                row.pop("gapped_token_ids", None)
        return data


def write_teacher(path: Path, teacher: Teacher) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A teacher, once written, is never replaced; and never half written (a kill).
    write_exclusive(path, canonical_json(teacher.to_json()) + b"\n")
    return path


def load_teacher(path: Path) -> Teacher:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read teacher {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: teacher is not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: teacher is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    try:
        return Teacher.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: not a tokrecord teacher: key '{where}': {first['msg']}") from exc
