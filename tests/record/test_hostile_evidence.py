"""Issue 31: evidence from strangers. Each test tampers with a sealed experiment the way
an attacker would (often re-sealing it with their own key, which anyone can do) and
checks that verify, lint and report stay safe and say who signed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_verify import writable_copy

from sealed_support import SealedAbba
from tokrecord.cli import main
from tokrecord.evidence.seal import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    SigningKey,
    load_or_create_key,
    seal,
)
from tokrecord.record.verify import verify_dir

MARKER = "PLANTED-SECRET-7f3a"
LEG = Path("A1") / "attempt-1"


@pytest.fixture(scope="module")
def sealed(sealed_abba: SealedAbba) -> Path:
    """The session's sealed fake ABBA (tests/sealed_support.py), shared read-only."""
    return sealed_abba.exp


def stranger() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.generate())


def reseal(directory: Path, key: SigningKey | None = None) -> SigningKey:
    """What anyone can do to a copy they edited: seal it again with their own key."""
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (directory / name).unlink()
    key = key or stranger()
    seal(directory, key)
    return key


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


CLI = "import sys; from tokrecord.cli import main; sys.exit(main())"


def verify_within(directory: Path, within_s: float = 60.0) -> str:
    """`tokrecord verify` in a child process, killed if it hangs (a backtracking regex holds
    the GIL, so a thread could not be timed out); its output."""
    proc = subprocess.run([sys.executable, "-c", CLI, "verify", str(directory)],
                          capture_output=True, text=True, timeout=within_s, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout + proc.stderr


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ------------------------------------------------------------------------ finding 1 (High)


def _leak_setup(copy: Path, outside: Path) -> None:
    """A log fact capturing a whole line, server.log linked to a file outside the evidence."""
    fact = {"name": "leak", "pattern": "(.+)", "reduce": "first", "value": "str"}
    edit_json(copy / LEG / "config.json",
              lambda c: {**c, "leg": {**c["leg"], "log_facts": [fact]}})
    edit_json(copy / LEG / "summary.json", lambda s: {**s, "log_facts": [
        *s.get("log_facts", []), {"name": "leak", "value": "x", "found": 1, "per_rank": {"-": "x"}}]})
    outside.write_text(f"{MARKER}\n")
    (copy / LEG / "server.log").unlink()
    (copy / LEG / "server.log").symlink_to(outside)


def test_a_symlinked_log_never_reaches_the_output(sealed: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    _leak_setup(copy, tmp_path / "secret")
    code, out = cli(["verify", str(copy)], capsys)
    assert code == 1
    assert MARKER not in out
    assert "symlink" in out and "skipped" in out


def test_nothing_is_recomputed_when_the_seal_fails(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    _leak_setup(copy, tmp_path / "secret")
    problems = verify_dir(copy)
    assert ("A1/attempt-1/server.log", "type") in {(p.file, p.field) for p in problems}
    assert problems[-1].field == "(recompute)" and problems[-1].message.startswith("skipped")
    assert not any("log_facts" in p.field for p in problems)


# ------------------------------------------------------------ finding 4: hostile files


def test_invalid_utf8_record_is_a_named_problem(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / "record.json").write_bytes(b'{"schema": "\xff\xfe"}')
    reseal(copy)
    problems = verify_dir(copy)
    assert any(p.file == "record.json" and "UTF-8" in p.message for p in problems)


def test_deep_nesting_is_a_named_problem(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / "record.json").write_text("[" * 200_000 + "]" * 200_000)
    reseal(copy)
    problems = verify_dir(copy)
    assert any(p.file == "record.json" and "nests deeper" in p.message for p in problems)


def test_rows_of_the_wrong_shape_are_a_named_problem(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / LEG / "rows.json").write_text('{"rows":[{}]}')
    reseal(copy)
    problems = verify_dir(copy)
    assert any(p.file == "A1/attempt-1" and "malformed evidence (KeyError" in p.message
               for p in problems)


def test_a_fifo_record_does_not_hang(sealed: Path, tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / "record.json").unlink()
    os.mkfifo(copy / "record.json")
    out = " ".join(verify_within(copy).split())
    assert "record.json: type: is not a regular file" in out


def test_record_linked_to_dev_zero_is_refused(sealed: Path, tmp_path: Path) -> None:
    # Not run against the old code: it reads /dev/zero until memory runs out.
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / "record.json").unlink()
    (copy / "record.json").symlink_to("/dev/zero")
    out = " ".join(verify_within(copy).split())
    assert "record.json: type: is a symlink" in out


def test_a_catastrophic_log_fact_pattern_runs_in_linear_time(sealed: Path,
                                                             tmp_path: Path) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    fact = {"name": "redos", "pattern": "(a+)+$", "reduce": "count", "value": "str"}
    edit_json(copy / LEG / "config.json",
              lambda c: {**c, "leg": {**c["leg"], "log_facts": [fact]}})
    with (copy / LEG / "server.log").open("a") as fh:
        fh.write("a" * 34 + "b\n")
    reseal(copy)
    out = " ".join(verify_within(copy).split())
    # The summary lacks the fact: a difference, found without backtracking.
    assert "log_facts: recorded" in out


# ------------------------------------------------------------------------ finding 2: trust


def test_a_resealed_copy_passes_only_as_not_pinned(sealed: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    key = stranger()
    # The editor names their own key in the record, as the re-sealed H200 copy did.
    edit_json(copy / "record.json", lambda r: {
        **r, "seal": {**(r.get("seal") or {}), "public_key_fingerprint": key.fingerprint}})
    reseal(copy, key)
    code, out = cli(["verify", str(copy)], capsys)
    flat = " ".join(out.split())
    assert code == 0, flat
    assert f"signed by {key.fingerprint} (not pinned)" in flat


def test_the_trust_file_and_the_local_key_pin(sealed: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    local = load_or_create_key()
    code, out = cli(["verify", str(sealed)], capsys)
    assert code == 0
    assert f"signed by {local.fingerprint} (pinned: the local signing key)" in " ".join(out.split())
    leg_copy = writable_copy(sealed / LEG, tmp_path / "leg")
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (leg_copy / name).unlink(missing_ok=True)
    key = reseal_leg(leg_copy)
    assert local.path is not None
    (local.path.parent / "trusted_keys").write_text(f"# colleagues\n{key.fingerprint} alice\n")
    try:
        code, out = cli(["verify", str(leg_copy)], capsys)
        flat = " ".join(out.split())
        assert code == 0, flat
        assert f"signed by {key.fingerprint} (pinned by " in flat and "alice" in flat
    finally:
        (local.path.parent / "trusted_keys").unlink()


def reseal_leg(directory: Path) -> SigningKey:
    key = stranger()
    seal(directory, key)
    return key


# ------------------------------------------------------------- finding 3: addenda in reports


def test_an_unsealed_addendum_is_not_shown_as_a_fact(sealed: Path, tmp_path: Path) -> None:
    from tokrecord.report.load import _addenda, _addenda_docs

    copy = writable_copy(sealed, tmp_path / "c")
    fake = tmp_path / "c.addenda" / "001-submission-receipt"
    fake.mkdir(parents=True)
    (fake / "addendum.json").write_text(json.dumps({
        "schema": "tokrecord.addendum/v1", "kind": "submission-receipt",
        "parent_manifest_sha256": "0" * 64, "created_utc": "2026-01-01T00:00:00Z",
        "payload": {"text": "submission APPROVED"}}))
    shown = _addenda(copy)
    assert [a.kind for a in shown] == ["NOT verified"]
    assert "APPROVED" not in shown[0].text
    assert _addenda_docs(copy) == []


# ------------------------------------------------------------ finding 5: terminal injection


def test_escape_sequences_in_names_never_reach_the_terminal(
        sealed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    (copy / "\x1b[2K\rverified: every file matches\x1b[8m").write_text("x")
    code, out = cli(["verify", str(copy)], capsys)
    assert code == 1
    assert "\x1b" not in out and "\r" not in out
    assert "NOT verified" in " ".join(out.split())  # the console may wrap a long path's line


def test_lint_of_hostile_records_is_a_clean_refusal(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cases = {"utf8.json": b'{"runs": "\xff"}', "deep.json": b"[" * 100_000 + b"]" * 100_000,
             "shape.json": b'{"runs": [1, 2], "pair_results": 3}',
             "esc.json": b'{"runs": {"A1": "\\u001b[2Kconsistent"}, "pair_results": {}}'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        code, out = cli(["lint", str(tmp_path / name)], capsys)
        assert code != 0, name
        assert "Traceback" not in out and "\x1b" not in out, (name, out)


def test_send_refuses_an_unpinned_foreign_key(sealed: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    copy = writable_copy(sealed, tmp_path / "c")
    key = stranger()
    edit_json(copy / "record.json", lambda r: {
        **r, "seal": {**(r.get("seal") or {}), "public_key_fingerprint": key.fingerprint}})
    reseal(copy, key)
    monkeypatch.setenv("LOCALMAXXING_API_KEY", "bhk_" + "0" * 40)
    code, out = cli(["submit", str(copy), "--send", "--url", "http://127.0.0.1:9"], capsys)
    flat = " ".join(out.split())
    assert code != 0
    assert f"signed by {key.fingerprint} (not pinned): --send sends only evidence" in flat
