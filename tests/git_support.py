"""The suite's one git chore on its own checkout (tests/conftest.py calls it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def git_env() -> dict[str, str]:
    """This environment without GIT_* variables: under a git hook they would point git at
    the hook's repository and index instead of the one named with -C."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def refresh_git_index(repo: Path) -> None:
    """Bring the checkout's git index up to date with its files' stat data.

    Every fake leg records tokrecord's own identity, a `git status` that may not write the
    index (identity/source.py: GIT_OPTIONAL_LOCKS=0). On a fresh clone the files and the
    index are written in the same second, so git takes every file as "racily clean" and
    hashes all of them again at each status, for ever: 55 ms of CPU more per identity,
    some 13 s over the parallel group's 230 identities (issue 28). One refresh ends it.
    Content is never touched; a checkout that is not git, or whose index is locked, is
    left as it is."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["git", "-C", str(repo), "update-index", "-q", "--refresh"], env=git_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                       check=False)
