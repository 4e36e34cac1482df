"""The suite refreshes its checkout's git index once (tests/conftest.py): on a fresh clone the
index and the files share a second, and every identity's `git status`, which may not write
the index, would hash each file again (issue 28)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from git_support import git_env, refresh_git_index


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True,
                          env=git_env()).stdout


def _racy(repo: Path) -> list[str]:
    """Tracked files git must hash again: not older than the index, to the second."""
    index_s = int((repo / ".git" / "index").stat().st_mtime)
    return [p for p in _git(repo, "ls-files").split()
            if int((repo / p).stat().st_mtime) >= index_s]


def test_a_racily_clean_checkout_is_refreshed_without_a_change(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    for name in ("a.py", "b.py"):
        (repo / name).write_text(f"# {name}\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "c")
    # The files written in the index's own second, as a clone leaves them (back-dated: no sleep).
    stamp = int((repo / ".git" / "index").stat().st_mtime) - 5
    for name in ("a.py", "b.py", ".git/index"):
        os.utime(repo / name, (stamp, stamp))
    assert _racy(repo) == ["a.py", "b.py"]
    refresh_git_index(repo)
    assert _racy(repo) == []
    assert _git(repo, "status", "--porcelain") == ""  # nothing else changed
    assert (repo / "a.py").read_text() == "# a.py\n"


def test_a_directory_that_is_not_git_is_left_alone(tmp_path: Path) -> None:
    refresh_git_index(tmp_path)  # no error, nothing written
    assert list(tmp_path.iterdir()) == []
