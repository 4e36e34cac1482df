"""Identity of source trees: which commit ran, whether it was edited, and how to rebuild it.

A commit hash alone proves nothing when the commit is private. So, against a
declared public base, we also write a git bundle (the commits themselves, which
anyone holding the base can fetch) and a combined patch (the same change as a
plain diff, readable and appliable without git history), plus the uncommitted
diff when the tree is dirty. Evidence files are created exclusively: a second
run into the same directory fails instead of replacing what the first wrote.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, ConfigDict

from tokrecord.errors import ConfigError
from tokrecord.identity.hashing import hash_file

# Source names become file names in the evidence directory.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

# Config a user may have set that would change what a diff looks like (no a/ b/
# prefixes, diffs relative to a subdirectory, colour codes) and so make the
# patch unappliable with plain `git apply`.
_GIT_CONFIG = (
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.relative=false",
    "-c", "color.ui=never",
    "-c", "core.quotePath=true",
)  # fmt: skip

# Diff options for every patch we write: --binary so binary files survive (it
# implies full blob ids), no external diff tools or textconv filters, which
# would produce something that is not a patch.
_DIFF_OPTS = ("--binary", "--full-index", "--no-ext-diff", "--no-textconv", "--no-color")

# GIT_* variables that are safe to inherit: they only say where config lives.
_GIT_ENV_KEEP = frozenset({"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"})


class EvidenceFile(BaseModel):
    """A file written into the evidence directory, with its hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str  # name inside the output directory
    sha256: str
    bytes: int


class SourceIdentity(BaseModel):
    """A git work tree as it was when measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["git"] = "git"
    name: str
    path: str  # absolute top level of the work tree
    commit: str  # full sha of HEAD
    branch: str | None  # None for a detached HEAD
    dirty: bool
    dirty_paths: tuple[str, ...]  # every path `git status` lists, untracked included
    public_base: str | None = None  # the commit-ish as declared
    public_base_commit: str | None = None  # ... resolved to a full sha
    base_is_ancestor: bool | None = None  # False: HEAD is not built on the base
    commits_since_base: int | None = None  # commits in base..HEAD (what the bundle holds)
    bundle: EvidenceFile | None = None  # None when base..HEAD is empty: nothing to ship
    patch: EvidenceFile | None = None  # git diff BASE HEAD
    dirty_patch: EvidenceFile | None = None  # git diff HEAD + untracked files
    # Untracked nested git repositories: a diff cannot carry them, so they are
    # named here instead of silently missing from the dirty patch.
    dirty_patch_omits: tuple[str, ...] = ()


class PackageIdentity(BaseModel):
    """An installed distribution that is not a git checkout: only its version is known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["package"] = "package"
    name: str
    version: str


def check_source_name(name: str) -> str:
    """A source name is used in file names, so it must be a plain, safe one."""
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"source name {name!r} cannot name evidence files: use letters, digits, '.', '_', '-' "
            "(at most 100, starting with a letter or digit)"
        )
    return name


def _git_env() -> dict[str, str]:
    # Inherited GIT_DIR / GIT_WORK_TREE / GIT_INDEX_FILE (set, for example, when
    # running under a git hook) would silently point every command at another
    # repository; GIT_EXTERNAL_DIFF would rewrite patches. Drop them all.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _GIT_ENV_KEEP}
    env["GIT_TERMINAL_PROMPT"] = "0"  # never wait for credentials on a tty
    env["GIT_OPTIONAL_LOCKS"] = "0"  # `git status` must not rewrite the measured repo's index
    env["LC_ALL"] = "C"  # stable, English messages to quote
    return env


def _git_argv(repo: Path, args: Sequence[str]) -> list[str]:
    return ["git", "-C", str(repo), *_GIT_CONFIG, *args]


def _git(
    repo: Path, args: Sequence[str], *, ok: tuple[int, ...] = (0,), stdout: IO[bytes] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git in `repo`; an exit status outside `ok` becomes a ConfigError quoting stderr.

    With `stdout` given, output goes straight into that file (patches and
    bundles are bytes, possibly large, and never need to pass through Python).
    """
    try:
        proc = subprocess.run(
            _git_argv(repo, args),
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Paths in -z output are raw bytes; keep undecodable ones visible
            # rather than failing the whole identity.
            encoding="utf-8",
            errors="backslashreplace",
            check=False,
            env=_git_env(),
        )
    except FileNotFoundError as exc:
        raise ConfigError("git is not installed (needed to identify source trees)") from exc
    if proc.returncode not in ok:
        stderr = (proc.stderr or "").strip() or f"exit status {proc.returncode}"
        raise ConfigError(f"git {' '.join(args[:2])} failed in {repo}: {stderr}")
    return proc


def _run_git(repo: Path, args: Sequence[str], *, ok: tuple[int, ...] = (0,)) -> str:
    return _git(repo, args, ok=ok).stdout or ""


def _toplevel(path: Path, *, subdir_ok: bool) -> Path:
    if not path.is_dir():
        raise ConfigError(f"source tree {path} is not a directory")
    try:
        inside = _run_git(path, ["rev-parse", "--is-inside-work-tree"]).strip()
    except ConfigError as exc:
        raise ConfigError(f"{path} is not a git work tree ({exc})") from exc
    if inside != "true":
        raise ConfigError(f"{path} is not a git work tree (it is inside a .git directory)")
    top = Path(_run_git(path, ["rev-parse", "--show-toplevel"]).strip())
    # A declared source tree that is a plain directory inside some unrelated
    # repository (a home directory under version control, say) would otherwise
    # be identified as that repository: demand the top level unless told not to.
    if not subdir_ok and top.resolve() != path.resolve():
        raise ConfigError(
            f"{path} is not the top level of a git work tree (that is {top}); "
            "declare the checkout's root directory"
        )
    return top


def _dirty_paths(top: Path) -> tuple[str, ...]:
    # -z: raw names, no quoting; --untracked-files=all: list files, not
    # collapsed directories, so the list says exactly what differs.
    out = _run_git(top, ["status", "--porcelain=v1", "-z", "--untracked-files=all"])
    fields = out.split("\0")
    paths: set[str] = set()
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        status, name = entry[:2], entry[3:]
        paths.add(name)
        if "R" in status or "C" in status:
            # Renames and copies are followed by their original path.
            if i < len(fields) and fields[i]:
                paths.add(fields[i])
            i += 1
    return tuple(sorted(paths))


def _untracked(top: Path) -> tuple[list[str], list[str]]:
    """(untracked files, untracked nested repositories), sorted."""
    out = _run_git(top, ["ls-files", "--others", "--exclude-standard", "-z"])
    entries = sorted(p for p in out.split("\0") if p)
    # git lists an untracked nested repository as "dir/" rather than its files.
    return [p for p in entries if not p.endswith("/")], [p for p in entries if p.endswith("/")]


def _open_exclusive(out_dir: Path, names: Sequence[str]) -> list[IO[bytes]]:
    """Create every file or none: evidence is never overwritten, nor half-written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create evidence directory {out_dir}: {exc.strerror or exc}") from exc
    handles: list[IO[bytes]] = []
    try:
        for name in names:
            handles.append((out_dir / name).open("xb"))
    except OSError as exc:
        _discard(handles)
        if isinstance(exc, FileExistsError):
            raise ConfigError(
                f"{exc.filename} already exists; evidence is never overwritten — use a new output directory"
            ) from exc
        raise ConfigError(f"cannot create {exc.filename}: {exc.strerror or exc}") from exc
    return handles


def _discard(handles: Sequence[IO[bytes]]) -> None:
    # Only files this call created exclusively are removed, so nothing that
    # existed before is ever touched.
    for fh in handles:
        fh.close()
        Path(fh.name).unlink(missing_ok=True)


def _evidence(out_dir: Path, fh: IO[bytes]) -> EvidenceFile:
    path = Path(str(fh.name))
    digest, size = hash_file(path)
    return EvidenceFile(file=path.relative_to(out_dir).as_posix(), sha256=digest, bytes=size)


def _write_dirty_patch(top: Path, head: str, fh: IO[bytes], untracked: Sequence[str]) -> None:
    # Tracked changes, staged or not, against HEAD ...
    _git(top, ["diff", *_DIFF_OPTS, head, "--"], stdout=fh)
    fh.flush()
    # ... and untracked files, which `git diff HEAD` leaves out, as new-file
    # diffs (exit status 1 means "differs", which it always does). This reads
    # the files without adding them to the repository's index or object store.
    for rel in untracked:
        _git(top, ["diff", "--no-index", *_DIFF_OPTS, "--", os.devnull, rel], ok=(0, 1), stdout=fh)
        fh.flush()


def source_identity(
    path: Path,
    *,
    public_base: str | None = None,
    out_dir: Path | None = None,
    name: str,
    subdir_ok: bool = False,
) -> SourceIdentity:
    """Identify the git work tree at `path`; with `out_dir`, write its evidence there.

    Files written into `out_dir` (all created exclusively):
    - `<name>.bundle`: commits base..HEAD (only with `public_base`, and only if non-empty);
      its refs are HEAD and, on a branch, that branch;
    - `<name>.patch`: `git diff BASE HEAD --binary` (only with `public_base`);
    - `<name>.dirty.patch`: uncommitted changes against HEAD, untracked files included
      (whenever the tree is dirty).
    `subdir_ok` accepts a directory below the top level (used for tokrecord itself).
    """
    check_source_name(name)
    top = _toplevel(path, subdir_ok=subdir_ok)
    head = _run_git(top, ["rev-parse", "--verify", "HEAD^{commit}"]).strip()
    # The full ref name, not --short: a tag of the same name makes --short
    # answer "heads/<name>", and the bundle needs the exact ref.
    head_ref = _run_git(top, ["symbolic-ref", "--quiet", "HEAD"], ok=(0, 1)).strip()
    branch = head_ref.removeprefix("refs/heads/") if head_ref.startswith("refs/heads/") else None
    dirty_paths = _dirty_paths(top)
    dirty = bool(dirty_paths)

    base_commit, is_ancestor, ahead = (
        _against_base(top, head, public_base, name) if public_base is not None
        else (None, None, None))
    written = _Written()
    if out_dir is not None:
        written = _write_evidence(top, out_dir, name, head, branch, base_commit, ahead, dirty)
    else:
        _check_head_unchanged(top, head)

    return SourceIdentity(
        name=name,
        path=str(top),
        commit=head,
        branch=branch,
        dirty=dirty,
        dirty_paths=dirty_paths,
        public_base=public_base,
        public_base_commit=base_commit,
        base_is_ancestor=is_ancestor,
        commits_since_base=ahead,
        bundle=written.bundle,
        patch=written.patch,
        dirty_patch=written.dirty_patch,
        dirty_patch_omits=tuple(written.omits),
    )


def _against_base(top: Path, head: str, public_base: str, name: str
                  ) -> tuple[str, bool, int]:
    """The public base's commit, whether it is an ancestor of HEAD, and how many commits
    HEAD is ahead of it."""
    try:
        base_commit = _run_git(
            top, ["rev-parse", "--verify", "--end-of-options", f"{public_base}^{{commit}}"]
        ).strip()
    except ConfigError as exc:
        raise ConfigError(
            f"public base {public_base!r} of source {name!r} is not a commit in {top} "
            f"(fetch it first?): {exc}"
        ) from exc
    # Not an ancestor is allowed (a rebased fork) but worth stating: the
    # patch then also undoes base commits that HEAD lacks.
    rc = _git(top, ["merge-base", "--is-ancestor", base_commit, head], ok=(0, 1)).returncode
    ahead = int(_run_git(top, ["rev-list", "--count", f"{base_commit}..{head}"]).strip())
    return base_commit, rc == 0, ahead


@dataclass(frozen=True)
class _Written:
    """The evidence files a source identity wrote (none without an out_dir)."""

    bundle: EvidenceFile | None = None
    patch: EvidenceFile | None = None
    dirty_patch: EvidenceFile | None = None
    omits: tuple[str, ...] = ()


def _write_evidence(top: Path, out_dir: Path, name: str, head: str, branch: str | None,
                    base_commit: str | None, ahead: int | None, dirty: bool) -> _Written:
    """The bundle, patch and dirty patch (those that apply), each created exclusively;
    all are discarded if any fails, or if HEAD moved meanwhile."""
    names: list[str] = []
    if base_commit is not None:
        if ahead:
            names.append(f"{name}.bundle")
        names.append(f"{name}.patch")
    if dirty:
        names.append(f"{name}.dirty.patch")
    handles = _open_exclusive(out_dir, names)
    by_name = dict(zip(names, handles, strict=True))
    bundle = patch = dirty_patch = None
    omits: list[str] = []
    try:
        if (fh := by_name.get(f"{name}.bundle")) is not None:
            # A bundle needs refs to carry; HEAD is one even when detached.
            # `-` writes to stdout, i.e. into our exclusively created file
            # (`git bundle create FILE` would replace an existing FILE).
            refs = ["HEAD"] + ([f"refs/heads/{branch}"] if branch else [])
            _git(top, ["bundle", "create", "-", f"^{base_commit}", *refs], stdout=fh)
            fh.close()
            _check_bundle_head(top, Path(fh.name), head)
            bundle = _evidence(out_dir, fh)
        if (fh := by_name.get(f"{name}.patch")) is not None:
            assert base_commit is not None
            # Resolved shas, not names: the patch must describe exactly the
            # commit recorded above even if a branch moves meanwhile.
            _git(top, ["diff", *_DIFF_OPTS, base_commit, head, "--"], stdout=fh)
            fh.close()
            patch = _evidence(out_dir, fh)
        if (fh := by_name.get(f"{name}.dirty.patch")) is not None:
            untracked, omits = _untracked(top)
            _write_dirty_patch(top, head, fh, untracked)
            fh.close()
            dirty_patch = _evidence(out_dir, fh)
        _check_head_unchanged(top, head)
    except BaseException:
        _discard(handles)
        raise
    finally:
        for fh in handles:
            fh.close()
    return _Written(bundle, patch, dirty_patch, tuple(omits))


def _check_head_unchanged(top: Path, head: str) -> None:
    # HEAD moving while we worked (a commit, a checkout) would make the
    # evidence describe a mix of two trees: refuse rather than record it.
    if _run_git(top, ["rev-parse", "--verify", "HEAD^{commit}"]).strip() != head:
        raise ConfigError(f"HEAD of {top} changed while its identity was being recorded; run again")


def _check_bundle_head(top: Path, bundle: Path, head: str) -> None:
    # The bundle was made from the ref HEAD; make sure it is the commit we recorded.
    heads = _run_git(top, ["bundle", "list-heads", str(bundle), "HEAD"]).split()
    if not heads or heads[0] != head:
        raise ConfigError(f"HEAD of {top} changed while its bundle was being written; run again")


def _tracked_in_checkout(pkg_dir: Path) -> bool:
    # An installed (non-editable) copy can sit inside some git work tree (a
    # project's .venv, say) without being that checkout's code: only call it a
    # checkout when git actually tracks the package's files there.
    try:
        _run_git(pkg_dir, ["ls-files", "--error-unmatch", "--", "__init__.py"])
    except ConfigError:
        return False
    return True


def tokrecord_identity() -> SourceIdentity | PackageIdentity:
    """tokrecord's own identity: its git checkout if it runs from one, else its installed version."""
    import tokrecord

    pkg_dir = Path(tokrecord.__file__).resolve().parent
    if _tracked_in_checkout(pkg_dir):
        return source_identity(pkg_dir, name="tokrecord", subdir_ok=True)
    try:
        version = metadata.version("tokrecord")
    except metadata.PackageNotFoundError:
        version = tokrecord.__version__
    return PackageIdentity(name="tokrecord", version=version)
