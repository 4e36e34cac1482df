"""Identity of model weights: a sha256 manifest of every file, and the HF revision.

A model name says little (repos are re-uploaded under the same name); the bytes
do. Hugging Face cache snapshots are directories of symlinks into `blobs/`, so
links are followed and hashed by content, under the name the snapshot gives them.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.identity.hashing import hash_file, manifest_text


class ModelIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str  # absolute, as given (not symlink-resolved: the snapshot name carries the revision)
    files: dict[str, str]  # relative POSIX path -> sha256, sorted
    manifest_sha256: str  # sha256 of manifest_text(files)
    total_bytes: int
    file_count: int
    revision: str | None  # HF commit of the snapshot, when the path is in an HF cache
    hf_id: str | None  # "ORG/NAME", likewise


def hf_snapshot(path: Path) -> tuple[str | None, str | None]:
    """(revision, hf_id) when `path` is in `.../models--ORG--NAME/snapshots/<REV>/...`."""
    # The path as given first; then with links resolved, for a link that
    # points into a cache (e.g. ./model -> ~/.cache/huggingface/...).
    for candidate in (path.absolute(), path.resolve()):
        parts = candidate.parts
        for i in range(1, len(parts) - 1):
            repo = parts[i - 1]
            if parts[i] == "snapshots" and repo.startswith("models--") and len(repo) > len("models--"):
                # HF cache folders are "models--" + repo id with "/" as "--";
                # HF forbids "--" inside names, so the mapping is reversible.
                return parts[i + 1], repo[len("models--") :].replace("--", "/")
    return None, None


def _walk_files(root: Path) -> list[str]:
    """Relative POSIX paths of all files under root, links followed, `.git` skipped."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()

    def onerror(exc: OSError) -> None:
        raise ConfigError(f"cannot list model directory {exc.filename}: {exc.strerror or exc}") from exc

    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=onerror):
        st = os.stat(dirpath)
        # Following directory links can loop (a link to a parent); visit each
        # real directory once.
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in filenames:
            full = Path(dirpath, fn)
            try:
                mode = full.stat().st_mode
            except OSError as exc:
                # A dangling link in a snapshot is a blob that never finished
                # downloading: the model on disk is incomplete.
                raise ConfigError(f"model file {full} cannot be read: {exc.strerror or exc}") from exc
            if not stat.S_ISREG(mode):
                # A fifo or device would block or never end when hashed.
                raise ConfigError(f"model file {full} is not a regular file")
            out.append(full.relative_to(root).as_posix())
    return sorted(out)


def model_manifest(path: Path) -> ModelIdentity:
    """sha256 of every file of a model directory (or of one model file, e.g. a GGUF)."""
    if path.is_file():
        names = [path.name]
        root = path.parent
    elif path.is_dir():
        root = path
        names = _walk_files(path)
    else:
        raise ConfigError(f"model path {path} does not exist")
    if not names:
        raise ConfigError(f"model directory {path} holds no files")
    files: dict[str, str] = {}
    total = 0
    for rel in names:
        digest, size = hash_file(root / rel)
        files[rel] = digest
        total += size
    revision, hf_id = hf_snapshot(path)
    return ModelIdentity(
        path=str(path.absolute()),
        files=files,
        manifest_sha256=hashlib.sha256(manifest_text(files).encode("utf-8")).hexdigest(),
        total_bytes=total,
        file_count=len(files),
        revision=revision,
        hf_id=hf_id,
    )
