"""File hashing and sha256sum-format manifests.

Everything identity records is a sha256 of bytes on disk, so one streaming
helper and one manifest writer serve sources, native modules and models alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from tokrecord.errors import ConfigError

# Model shards run to tens of GiB: stream them in blocks rather than reading whole.
BLOCK_SIZE = 1 << 20


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file's content, following symlinks.

    The size comes from the bytes actually hashed, not from stat, so the two
    always describe the same content even if the file is being replaced.
    """
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as fh:
            while block := fh.read(BLOCK_SIZE):
                digest.update(block)
                size += len(block)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} to hash it: {exc.strerror or exc}") from exc
    return digest.hexdigest(), size


def sha256_file(path: Path) -> str:
    """sha256 hex of a file's content (symlinks followed), read in 1 MiB blocks."""
    return hash_file(path)[0]


def _escape_name(name: str) -> tuple[str, bool]:
    # GNU sha256sum escapes backslash and newline in names and marks such lines
    # with a leading backslash; without this a name holding "\n" would forge a
    # second manifest line.
    if "\\" not in name and "\n" not in name and "\r" not in name:
        return name, False
    escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return escaped, True


def manifest_text(entries: Mapping[str, str]) -> str:
    """`<hex>  <path>\\n` lines sorted by path: the format `sha256sum -c` checks.

    Sorting is by Python string order (code points), which is locale-free, so
    the same entries always give the same text and therefore the same hash.
    """
    lines: list[str] = []
    for name in sorted(entries):
        escaped, marked = _escape_name(name)
        prefix = "\\" if marked else ""
        lines.append(f"{prefix}{entries[name]}  {escaped}\n")
    return "".join(lines)
