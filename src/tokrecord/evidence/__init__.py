"""Evidence: write-once run directories.

Every file is created exclusively (an existing file is never replaced) and JSON
is written in the JSON Canonicalization Scheme (RFC 8785) so that the same facts
always hash the same, whoever re-serialises them. Timestamps are nanoseconds
since the leg's own clock epoch, which keeps every integer inside the I-JSON range
RFC 8785 requires (absolute monotonic nanoseconds exceed 2^53 after ~104 days).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import rfc8785

from tokrecord.errors import ConfigError, EvidenceError, TokrecordError
from tokrecord.jsontypes import JSONObject

# The errors that mean "this machine cannot keep evidence here", as opposed to a bug.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.EIO, errno.EFBIG})


def evidence_error(exc: OSError, what: str = "evidence") -> EvidenceError:
    """One message for a write that failed: which file, why, and what to do."""
    where = f" {exc.filename}" if exc.filename else ""
    return EvidenceError(
        f"cannot write {what}{where}: {exc.strerror or exc}; what was written is kept "
        "(free space or make the directory writable, then run the same command to resume)")


def write_exclusive(path: Path, data: bytes) -> None:
    """Create `path` holding exactly `data`, or fail: never half a file, never a replaced one.

    The bytes go to an unnamed file (O_TMPFILE) that is linked into place only when
    complete, so a SIGKILL (or a full disk) at any instant leaves either nothing or the
    whole file, and nothing to clean up. link() fails if the name exists: creation stays
    exclusive. Where O_TMPFILE is not supported, a named temporary beside the target is
    linked the same way and removed.
    """
    directory = path.parent
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
    except (OSError, AttributeError) as exc:
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
            raise
        _write_linked_temp(path, data)
        return
    try:
        _write_all(fd, data)
        # linkat(2) with AT_SYMLINK_FOLLOW (a dir fd makes os.link use it; plain link(2)
        # would try to link /proc's symlink itself).
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=dir_fd, follow_symlinks=True)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:  # no /proc: the named temporary instead
        os.close(fd)
        fd = -1
        _write_linked_temp(path, data)
    finally:
        if fd >= 0:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_linked_temp(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


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
    # pydantic is looked up, not imported: no model exists before it is, and the telemetry
    # sampler (a process per leg) writes through here without it (0.1 s of CPU to import).
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(obj, pydantic.BaseModel):
        return obj.model_dump(mode="json")
    return obj


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
        write_exclusive(target, data)  # whole or absent, whatever instant a kill lands
        return target

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_bytes(name, canonical_json(_plain(obj)) + b"\n")

    def jsonl(self, name: str) -> JsonlWriter:
        return JsonlWriter(open(self.path / name, "xb"))

    def raw_fd(self, name: str) -> int:
        """An append-only, unbuffered file descriptor for bytes kept as they arrive."""
        return os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                       0o644)


def read_json(path: Path, error: type[Exception]) -> Any:
    """A JSON file; a missing, unreadable or malformed one is `error` naming the path."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not JSON: {exc}") from exc


class TornLineError(TokrecordError):
    """A JSONL line that does not parse: a write cut by a kill or a full disk."""

    def __init__(self, path: Path, line: int) -> None:
        super().__init__(f"{path}: line {line} is torn (not a whole JSON object): a write "
                         "was cut short by a kill or a full disk")
        self.path, self.line = path, line


def torn_lines(path: Path) -> list[int]:
    """1-based numbers of the lines of a JSONL file that are not whole JSON objects: a
    line that does not parse, and a last line without its newline."""
    return scan_jsonl(path)[1]


def scan_jsonl(path: Path) -> tuple[list[JSONObject], list[int]]:
    """The whole records of a JSONL file, and the numbers of its torn lines."""
    data = path.read_bytes()
    records: list[JSONObject] = []
    torn: list[int] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            torn.append(number)
            continue
        if number == len(lines) or not isinstance(value, dict):
            torn.append(number)  # no newline after it: the writer never finished the line
            continue
        records.append(value)
    return records, torn


def read_jsonl(path: Path, *, skip_torn: bool = False) -> list[JSONObject]:
    """Every record of a JSONL file. A torn line is an error naming the file and the
    line, unless `skip_torn` (the state log, whose torn lines are named in it)."""
    records, torn = scan_jsonl(path)
    if torn and not skip_torn:
        raise TornLineError(path, torn[0])
    return records
