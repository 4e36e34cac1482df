"""verify on a sealed experiment: accepted as is; a byte flip anywhere is caught by file."""

from __future__ import annotations

import base64
import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from sealed_support import SealedAbba
from tokrecord.record.lint import lint_record
from tokrecord.record.verify import verify_dir


@pytest.fixture(scope="module")
def sealed(sealed_abba: SealedAbba) -> Path:
    """The session's sealed fake ABBA (tests/sealed_support.py), shared read-only."""
    return sealed_abba.exp


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_sealed_experiment_verifies_and_is_read_only(sealed: Path) -> None:
    assert verify_dir(sealed) == []
    assert not (sealed / "record.json").stat().st_mode & stat.S_IWUSR
    record = json.loads((sealed / "record.json").read_text())
    assert lint_record(record) == []
    assert record["source"]["identity_sha256"]
    assert record["source"]["tokrecord"]["commit"]


def files(problems: list[Any]) -> set[str]:
    return {p.file for p in problems}


def test_byte_flip_in_events_is_caught(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    events = copy / "B1" / "attempt-1" / "events.jsonl"
    text = events.read_text()
    # a digit inside a chunk's arrival time: the hash and the recomputed figures both change
    flip(events, text.index('"t_ns":', text.index('"kind":"chunk"')) + 12)
    problems = verify_dir(copy)
    assert "B1/attempt-1/events.jsonl" in files(problems)
    assert any(p.field == "sha256" for p in problems)


def test_byte_flip_in_summary_names_the_field(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    summary = copy / "A2" / "attempt-1" / "summary.json"
    text = summary.read_text()
    flip(summary, text.index(".", text.index('"tok_s_out":')) + 1)
    problems = verify_dir(copy)
    fields = {(p.file, p.field) for p in problems}
    assert ("A2/attempt-1/summary.json", "sha256") in fields
    assert ("A2/attempt-1/summary.json", "summary.tok_s_out") in fields


def test_byte_flip_in_manifest_is_caught(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    flip(copy / "manifest.sha256", 3)
    assert "manifest.sha256" in files(verify_dir(copy))


def test_byte_flip_in_signature_is_caught(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    sig_path = copy / "manifest.sig.json"
    envelope = json.loads(sig_path.read_text())
    raw = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    raw[0] ^= 0x01
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    sig_path.write_text(json.dumps(envelope))
    problems = verify_dir(copy)
    assert any("signature does not verify" in p.message for p in problems)


def test_byte_flip_in_record_is_caught(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    record = copy / "record.json"
    text = record.read_text()
    # the first fractional digit: still valid JSON, a different number
    flip(record, text.index(".", text.index('"headline_delta_pct":')) + 1)
    problems = verify_dir(copy)
    assert ("record.json", "sha256") in {(p.file, p.field) for p in problems}
    assert any(p.file == "record.json" and "headline_delta_pct" in p.field for p in problems)


def test_unsealed_directory_is_not_verified(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    problems = verify_dir(tmp_path)
    assert any("not sealed" in p.message for p in problems)


def test_addendum_is_sealed_beside_the_untouched_parent(sealed: Path, tmp_path: Path) -> None:
    import hashlib
    import os

    from cli_support import cli_in_process

    copy = tmp_path / "exp"
    shutil.copytree(sealed, copy)  # read-only modes are kept: the parent stays untouched
    env = {**os.environ, "COLUMNS": "200"}
    proc = cli_in_process(["addendum", str(copy), "--kind", "re-accounting",
                           "--text", "headline re-stated in the legacy convention"], env)
    assert proc.returncode == 0, proc.stderr
    note_dir = tmp_path / "exp.addenda" / "001-re-accounting"
    note = json.loads((note_dir / "addendum.json").read_text())
    assert note["parent_manifest_sha256"] == hashlib.sha256(
        (copy / "manifest.sha256").read_bytes()).hexdigest()
    assert note["payload"]["text"].startswith("headline re-stated")
    assert verify_dir(copy) == []
    from tokrecord.evidence.seal import verify_seal

    assert verify_seal(note_dir) == []
    assert verify_dir(note_dir) == []  # `tokrecord verify` takes an addendum too
    # Bound to the parent's manifest: an addendum moved beside another record fails.
    other = tmp_path / "other"
    shutil.copytree(sealed, other)
    for path in other.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (other / "manifest.sha256").write_text((other / "manifest.sha256").read_text() + "\n")
    moved = tmp_path / "other.addenda" / "001-re-accounting"
    shutil.copytree(note_dir, moved)
    assert [p.field for p in verify_dir(moved)] == ["parent_manifest_sha256"]
