"""Reading evidence that may come from a stranger.

`verify`, `lint` and `report` read directories and records that someone else wrote.
Every such file is opened here, and only here:

* never through a symlink (``O_NOFOLLOW``), and only when ``fstat`` says it is a
  regular file, so a link to ``/proc/self/environ`` or a FIFO that never ends is a
  named problem instead of the verifier's secret or a hang;
* never more than a cap for its kind of file, checked on the open descriptor before
  reading and again while reading (a file that grows is cut at the cap);
* JSON only as strict UTF-8, nested no deeper than `MAX_JSON_DEPTH`.

Anything wrong becomes an `UnsafeEvidence` naming the file, never a traceback.
`excerpt` and `terminal_safe` are how a value read from evidence may be shown.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any, Final

from tokrecord.errors import TokrecordError
from tokrecord.jsontypes import JSONObject

MiB: Final = 1 << 20
# Caps per kind of file: a real H200 experiment's largest JSON is 0.3 MiB and its
# largest events.jsonl 1.7 MiB, so these leave two orders of magnitude of headroom
# while keeping a hostile file far below the verifier's memory.
JSON_CAP: Final = 64 * MiB
JSONL_CAP: Final = 256 * MiB
TEXT_CAP: Final = 64 * MiB  # server.log, *.prom, manifests
# A file is hashed as a stream, so this bounds time, not memory (1 GiB hashes in ~1 s).
HASH_CAP: Final = 4096 * MiB
# Our deepest document (a record) nests 8 levels; anything past this is an attack.
MAX_JSON_DEPTH: Final = 64

_CHUNK: Final = 1 << 16


class UnsafeEvidence(TokrecordError):
    """A file of received evidence that cannot be read safely; `file` and `reason` name it."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file, self.reason = file, reason


def open_regular(path: Path) -> int:
    """A read-only descriptor on `path` if it is a regular file reached without a symlink
    at its last component; otherwise UnsafeEvidence.

    O_NONBLOCK keeps a FIFO from blocking the open itself; fstat then refuses it."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise UnsafeEvidence(str(path), "missing") from exc
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeEvidence(str(path), "is a symlink; evidence is read only from plain "
                                 "files") from exc
        raise UnsafeEvidence(str(path), f"cannot be opened: {exc.strerror}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeEvidence(str(path), "is not a regular file (a device, FIFO, socket or "
                                 "directory); evidence is read only from plain files")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path, cap: int) -> bytes:
    """The whole content of a regular file of at most `cap` bytes."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise UnsafeEvidence(str(path), f"is {size} bytes, over the {cap}-byte cap for "
                                 "this kind of file")
        parts: list[bytes] = []
        total = 0
        while True:
            block = os.read(fd, min(_CHUNK, cap + 1 - total))
            if not block:
                break
            parts.append(block)
            total += len(block)
            if total > cap:
                raise UnsafeEvidence(str(path), f"grew past the {cap}-byte cap while read")
        return b"".join(parts)
    finally:
        os.close(fd)


def check_regular(path: Path, cap: int) -> None:
    """Refuse `path` unless it is a regular file, not a link, of at most `cap` bytes: for a
    file a trusted parser then reads by name (the seal has already hashed these bytes)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > cap:
        raise UnsafeEvidence(str(path), f"is {size} bytes, over the {cap}-byte cap for this "
                             "kind of file")


def sha256_regular(path: Path, cap: int = HASH_CAP) -> str:
    """sha256 of a regular file read as a stream, refusing links, devices and files over `cap`."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise UnsafeEvidence(str(path), f"is {size} bytes, over the {cap}-byte cap")
        digest = hashlib.sha256()
        total = 0
        while block := os.read(fd, 1 << 20):
            total += len(block)
            if total > cap:
                raise UnsafeEvidence(str(path), f"grew past the {cap}-byte cap while hashed")
            digest.update(block)
        return digest.hexdigest()
    finally:
        os.close(fd)


def read_text(path: Path, cap: int = TEXT_CAP, *, strict: bool = True) -> str:
    """A text file as UTF-8: invalid bytes are a problem when `strict`, else replaced."""
    data = read_bytes(path, cap)
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise UnsafeEvidence(str(path), f"is not valid UTF-8 (byte {exc.start})") from exc


def _depth(value: Any) -> int:
    """How deep `value` nests, counted without recursion (so depth itself is safe)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
        if deepest > MAX_JSON_DEPTH:
            break
    return deepest


def parse_json(data: bytes, file: str) -> Any:
    """JSON from bytes of received evidence: strict UTF-8, bounded depth, named errors."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeEvidence(file, f"is not valid UTF-8 (byte {exc.start})") from exc
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise UnsafeEvidence(file, f"nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except json.JSONDecodeError as exc:
        raise UnsafeEvidence(file, f"is not JSON ({exc.msg} at line {exc.lineno} "
                             f"column {exc.colno})") from exc
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise UnsafeEvidence(file, f"is not JSON Python can read ({excerpt(str(exc))})") from exc
    if _depth(value) > MAX_JSON_DEPTH:
        raise UnsafeEvidence(file, f"nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json(path: Path, cap: int = JSON_CAP) -> Any:
    """A JSON file of received evidence (see parse_json)."""
    return parse_json(read_bytes(path, cap), str(path))


def read_json_object(path: Path, cap: int = JSON_CAP) -> JSONObject:
    value = read_json(path, cap)
    if not isinstance(value, dict):
        raise UnsafeEvidence(str(path), "is not a JSON object")
    return value


# --------------------------------------------------------------------------- showing values


def terminal_safe(text: str) -> str:
    """`text` without C0/C1 control characters (newline and tab kept): an ESC sequence in a
    file name or a value cannot move the cursor or rewrite what the reader sees."""
    return "".join(c for c in text
                   if c in "\n\t" or unicodedata.category(c) != "Cc")


def excerpt(value: Any, limit: int = 80) -> str:
    """A value read from evidence as it may be shown: its repr with every control
    character escaped, cut to `limit` characters, with the sha256 of the whole when cut."""
    shown = value if isinstance(value, str) else repr(value)
    if isinstance(value, str):
        shown = repr(value)  # escapes ESC, newlines and other controls
    if len(shown) <= limit:
        return terminal_safe(shown)
    whole = hashlib.sha256(shown.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return terminal_safe(shown[:limit]) + f"… ({len(shown)} chars, sha256 {whole}…)"
