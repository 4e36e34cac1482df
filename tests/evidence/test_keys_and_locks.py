"""Issue 31, finding 8: the signing key and the experiment lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokrecord.evidence.seal import KEY_FILE_NAME, SealError, load_or_create_key
from tokrecord.experiment.runner import experiment_lock, lock_path


def test_a_key_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path)
    assert key.path is not None
    key.path.chmod(0o644)
    with pytest.raises(SealError, match=r"mode 0644\); fix it with: chmod 600 "):
        load_or_create_key(tmp_path)
    key.path.chmod(0o600)
    assert load_or_create_key(tmp_path).fingerprint == key.fingerprint


def test_a_new_key_is_announced_with_fingerprint_and_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = load_or_create_key(tmp_path / "cfg")
    err = capsys.readouterr().err
    assert f"created a new signing key {key.fingerprint} at {tmp_path / 'cfg' / KEY_FILE_NAME}" in err
    load_or_create_key(tmp_path / "cfg")
    assert capsys.readouterr().err == ""  # an existing key is not announced again


def test_the_lock_never_follows_a_symlink(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock_path(exp).symlink_to(victim)
    with pytest.raises(OSError), experiment_lock(exp):
        pass
    assert victim.read_text() == "precious\n"
    os.unlink(lock_path(exp))
    with experiment_lock(exp):
        assert lock_path(exp).read_text() == f"{os.getpid()}\n"
