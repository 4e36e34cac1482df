"""Identity of Python environments: exact package versions and native module hashes.

The engine usually runs from its own virtual environment, so most facts are
asked of a given interpreter in a subprocess; the harness's own environment is
read in-process with the same rules.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tokrecord.errors import ConfigError
from tokrecord.identity.hashing import sha256_file

_PEP503_RE = re.compile(r"[-_.]+")

# Runs under the target interpreter, which may be older than ours: plain
# Python 3.8 (importlib.metadata), no imports from tokrecord. The first
# distribution of a name on sys.path wins, as it does for `import`. The empty
# entry `-c` puts first (the subprocess's cwd) is dropped: it is not part of
# the environment and a stray *.dist-info there must not enter the lock.
_LOCK_SCRIPT = """
import json, re, sys
sys.path[:] = [p for p in sys.path if p != ""]
from importlib import metadata
out = {}
for dist in metadata.distributions():
    meta = dist.metadata
    name = meta["Name"]
    if not name:
        continue
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key not in out:
        out[key] = meta["Version"]
import site
# The user site is on the path only once it exists: its creation changes the path.
print(json.dumps({"path": sys.path, "watch": sys.path + [site.getusersitepackages()], "lock": out}))
"""

_SITE_SCRIPT = """
import json, sysconfig
paths = sysconfig.get_paths()
print(json.dumps([paths["purelib"], paths["platlib"]]))
"""


def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return _PEP503_RE.sub("-", name).lower()


def _ask(python: Path, script: str, what: str) -> Any:
    try:
        proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ConfigError(f"cannot run Python interpreter {python} to read its {what}: {exc}") from exc
    if proc.returncode != 0:
        raise ConfigError(
            f"Python interpreter {python} failed to report its {what}: "
            f"{proc.stderr.strip() or f'exit status {proc.returncode}'}"
        )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Python interpreter {python} printed no usable {what}: {proc.stdout!r}") from exc


def python_lib_dirs(python: Path) -> tuple[Path, ...]:
    """The interpreter's purelib and platlib, once each (they differ on lib64 distributions)."""
    purelib, platlib = _ask(python, _SITE_SCRIPT, "site-packages directories")
    return tuple(dict.fromkeys((Path(purelib), Path(platlib))))


def python_site_packages(python: Path) -> Path:
    """The interpreter's site-packages (sysconfig purelib)."""
    return python_lib_dirs(python)[0]


def current_lib_dirs() -> tuple[Path, ...]:
    """python_lib_dirs for the running interpreter, without a subprocess."""
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys((Path(paths["purelib"]), Path(paths["platlib"]))))


def _lock(dists: Iterable[metadata.Distribution]) -> dict[str, str]:
    # Same rules as _LOCK_SCRIPT: first of a name wins, nameless metadata skipped. The
    # metadata is parsed once per distribution (`dist.version` would parse it again).
    out: dict[str, str] = {}
    for dist in dists:
        meta = dist.metadata
        name = meta["Name"]
        if not name:
            continue
        out.setdefault(normalize_name(name), meta["Version"])
    return dict(sorted(out.items()))


# A lock is taken again before every leg (a package installed mid-experiment must show),
# and reading every distribution's metadata costs about 0.1 s of CPU per environment. The
# lock read last is reused while nothing it came from can have changed: the stamp below
# covers every directory on the interpreter's path (adding or removing an entry changes a
# directory's mtime) and every *.dist-info / *.egg-info / *.egg in it, with its metadata file
# (pip replaces a distribution's directory on every install, even of the same version).
_Stamp = tuple[tuple[object, ...], ...]
_METADATA_FILES = ("METADATA", "PKG-INFO")


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _path_stamp(paths: Sequence[str]) -> _Stamp:
    stamp: list[tuple[object, ...]] = []
    for entry in paths:
        where = entry or "."  # importlib.metadata reads "" as the working directory
        own = _stat_key(where)
        infos: list[tuple[object, ...]] = []
        if own is not None and os.path.isdir(where):
            with contextlib.suppress(OSError), os.scandir(where) as found:
                for item in found:
                    if item.name.endswith((".dist-info", ".egg-info", ".egg")):
                        full = os.path.join(where, item.name)
                        infos.append((item.name, _stat_key(full),
                                      *(_stat_key(os.path.join(full, m)) for m in _METADATA_FILES)))
        stamp.append((entry, os.path.abspath(where), own, tuple(sorted(infos, key=repr))))
    return tuple(stamp)


@dataclass(frozen=True)
class _Cached:
    paths: tuple[str, ...]  # what the stamp covers
    stamp: _Stamp | None  # None: not to be reused
    lock: Mapping[str, str]


_LOCKS: dict[tuple[object, ...], _Cached] = {}
# What else decides an interpreter's path: the environment it is started with, and the
# working directory (a relative entry).
_PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
             "PYTHONPLATLIBDIR", "VIRTUAL_ENV")


def runtime_lock(python: Path) -> dict[str, str]:
    """{PEP 503 name: version} of every distribution the given interpreter can import, sorted."""
    key = (str(python), _stat_key(str(python)), os.getcwd(),
           tuple(os.environ.get(name) for name in _PATH_ENV))
    known = _LOCKS.get(key)
    if known is not None and _path_stamp(known.paths) == known.stamp:
        return dict(known.lock)
    # Stamped before asking, so that a change while the interpreter reads shows next time.
    # The path is known only from an earlier answer: the first answer is not reused.
    before = _path_stamp(known.paths) if known is not None else None
    raw = _ask(python, _LOCK_SCRIPT, "installed packages")
    lock = raw.get("lock") if isinstance(raw, dict) else None
    watch = raw.get("watch") if isinstance(raw, dict) else None
    if not isinstance(lock, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in lock.items()
    ) or not isinstance(watch, list) or not all(isinstance(p, str) for p in watch):
        raise ConfigError(f"Python interpreter {python} reported packages in an unexpected form")
    out = dict(sorted(lock.items()))
    same_path = known is not None and tuple(watch) == known.paths
    _LOCKS[key] = _Cached(paths=tuple(watch), stamp=before if same_path else None, lock=dict(out))
    return out


def runtime_lock_current() -> dict[str, str]:
    """runtime_lock of the harness's own environment, read in-process."""
    paths = tuple(sys.path)
    key: tuple[object, ...] = ("<harness, in-process>",)
    cached = _LOCKS.get(key)
    if cached is not None and cached.paths == paths and _path_stamp(paths) == cached.stamp:
        return dict(cached.lock)
    stamp = _path_stamp(paths)
    out = _lock(metadata.distributions())
    _LOCKS[key] = _Cached(paths=paths, stamp=stamp, lock=dict(out))
    return out


def glob_files(globs: Sequence[str], root: Path | None) -> dict[str, list[str]]:
    """Regular files (symlinks followed) matched by each glob: {glob: sorted POSIX paths}.

    With `root`, globs are relative to it and so are the paths; without, they
    are taken as written (absolute, or relative to the working directory).
    """
    if root is not None and not root.is_dir():
        raise ConfigError(f"native module root {root} is not a directory")
    found: dict[str, list[str]] = {}
    for pattern in globs:
        if root is not None and Path(pattern).is_absolute():
            raise ConfigError(f"native module glob {pattern!r} must be relative to {root}")
        # include_hidden: a native library in a dot-directory (e.g. `.libs`)
        # must not escape the record because glob skips hidden names by default.
        matches = glob.glob(
            pattern, root_dir=None if root is None else str(root), recursive=True, include_hidden=True
        )
        base = Path() if root is None else root
        found[pattern] = sorted(Path(m).as_posix() for m in matches if (base / m).is_file())
    return found


def native_modules(globs: Sequence[str], root: Path | None, *, require_match: bool = True) -> dict[str, str]:
    """sha256 of every file matching the globs, keyed by POSIX path relative to `root`, sorted.

    A glob that matches nothing raises ConfigError unless `require_match` is
    False: a declared native module that is not there is a misconfiguration,
    and an empty record of it would look like evidence.
    """
    found = glob_files(globs, root)
    if require_match:
        _require_matches(found, [root] if root is not None else [])
    return hash_matches(found, root)


def _require_matches(found: Mapping[str, Sequence[str]], roots: Sequence[Path]) -> None:
    missing = [pattern for pattern, paths in found.items() if not paths]
    if missing:
        where = " or ".join(str(r) for r in roots) or "the working directory"
        raise ConfigError(f"native module glob(s) {', '.join(map(repr, missing))} matched no file in {where}")


def hash_matches(found: Mapping[str, Sequence[str]], root: Path | None) -> dict[str, str]:
    base = Path() if root is None else root
    rels = sorted({rel for paths in found.values() for rel in paths})
    return {rel: sha256_file(base / rel) for rel in rels}


def native_modules_in(globs: Sequence[str], roots: Sequence[Path]) -> dict[str, str]:
    """native_modules over several library directories of one environment, merged.

    Each glob must match somewhere. The same relative path in two directories
    would be two different files under one key, so that is refused.
    """
    per_root = [(root, glob_files(globs, root)) for root in roots]
    merged: dict[str, list[str]] = {pattern: [] for pattern in globs}
    for _, found in per_root:
        for pattern, paths in found.items():
            merged[pattern].extend(paths)
    _require_matches(merged, roots)
    out: dict[str, str] = {}
    for root, found in per_root:
        for rel, digest in hash_matches(found, root).items():
            if rel in out:
                raise ConfigError(
                    f"native module {rel} exists in more than one of {', '.join(map(str, roots))}"
                )
            out[rel] = digest
    return dict(sorted(out.items()))
