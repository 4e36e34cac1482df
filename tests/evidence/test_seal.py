"""Sealing evidence: keys, manifest, DSSE/in-toto signature, tamper detection, addenda."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tokrecord.evidence.seal import (
    DSSE_PAYLOAD_TYPE,
    MANIFEST_NAME,
    PREDICATE_TYPE,
    SIGNATURE_NAME,
    STATEMENT_TYPE,
    Problem,
    SealError,
    SigningKey,
    default_config_dir,
    load_or_create_key,
    pae,
    seal,
    verify_seal,
    write_addendum,
    write_manifest,
)

FILES = {
    "events.jsonl": b'{"a":1}\n{"a":2}\n',
    "identity.json": b'{"commit":"abc"}\n',
    "models/manifest.json": b'{"files":[]}\n',
    "models/weights/part-0.bin": bytes(range(256)) * 4,
}


def _make_writable(root: Path) -> None:
    if not root.exists():
        return
    root.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o755)
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o644)


@pytest.fixture(autouse=True)
def _restore_write_bits(tmp_path: Path) -> Iterator[None]:
    # Sealed directories are 0555/0444; give the write bits back so tmp_path can be removed.
    yield
    _make_writable(tmp_path)


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return load_or_create_key(tmp_path / "config")


def _populate(root: Path) -> Path:
    for rel, data in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


@pytest.fixture
def sealed(tmp_path: Path, key: SigningKey) -> Path:
    run = _populate(tmp_path / "run")
    seal(run, key)
    return run


def _writable(path: Path) -> None:
    """Unlock one file (and its directory) of a sealed tree, as a tamperer would."""
    path.parent.chmod(0o755)
    if path.exists():
        path.chmod(0o644)


def _flip(path: Path, index: int = 0) -> None:
    _writable(path)
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def _envelope(run: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((run / SIGNATURE_NAME).read_bytes())
    return result


def _rewrite_envelope(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    envelope = _envelope(run)
    change(envelope)
    _writable(run / SIGNATURE_NAME)
    (run / SIGNATURE_NAME).write_bytes(json.dumps(envelope).encode())


def _statement(run: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(base64.b64decode(_envelope(run)["payload"]))
    return result


def _has(problems: list[Problem], file: str, field: str) -> bool:
    return any(p.file == file and p.field == field for p in problems)


# ---------------------------------------------------------------------------- keys


def test_key_created_once_then_reused_with_private_modes(tmp_path: Path) -> None:
    config = tmp_path / "cfg" / "tokrecord"
    # A permissive umask must not leak into the key's modes.
    old_umask = os.umask(0)
    try:
        first = load_or_create_key(config)
    finally:
        os.umask(old_umask)
    key_file = config / "signing-key.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert key_file.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS8, unencrypted
    assert [p.name for p in config.iterdir()] == ["signing-key.pem"]  # no temp file left behind
    before = key_file.read_bytes()

    second = load_or_create_key(config)
    assert second.fingerprint == first.fingerprint
    assert key_file.read_bytes() == before

    raw = base64.b64decode(first.public_key_raw_b64)
    assert len(raw) == 32
    assert first.keyid == hashlib.sha256(raw).hexdigest()
    digest_b64 = base64.b64encode(hashlib.sha256(raw).digest()).decode()
    assert first.fingerprint == "SHA256:" + digest_b64.rstrip("=")
    assert "=" not in first.fingerprint
    pub = serialization.load_pem_public_key(first.public_key_pem.encode())
    assert isinstance(pub, Ed25519PublicKey)
    pub.verify(first.sign(b"x"), b"x")
    assert "private_key" not in repr(first)


def test_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "signing-key.pem").write_bytes(b"not a key")
    with pytest.raises(SealError, match=r"signing-key\.pem"):
        load_or_create_key(tmp_path)


def test_default_config_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKRECORD_CONFIG_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_config_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TOKRECORD_CONFIG_DIR")
    assert default_config_dir() == tmp_path / "xdg" / "tokrecord"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_config_dir() == tmp_path / "home" / ".config" / "tokrecord"
    load_or_create_key()
    assert (tmp_path / "home" / ".config" / "tokrecord" / "signing-key.pem").is_file()


# ------------------------------------------------------------------------ manifest


def test_pae_matches_hand_computed_example() -> None:
    # The DSSE spec's own example: len("http://example.com/HelloWorld") == 29.
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("", b"") == b"DSSEv1 0  0 "
    # Lengths count bytes, not characters.
    assert pae("t", "é".encode()) == b"DSSEv1 1 t 2 \xc3\xa9"


def test_manifest_covers_every_file_in_sha256sum_format(tmp_path: Path) -> None:
    run = _populate(tmp_path / "run")
    (run / "models" / MANIFEST_NAME).write_bytes(b"nested files of that name are evidence\n")
    manifest = write_manifest(run)
    lines = manifest.read_text().splitlines()
    expected_paths = sorted([*FILES, f"models/{MANIFEST_NAME}"], key=str.encode)
    assert [line.split("  ", 1)[1] for line in lines] == expected_paths
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert digest == hashlib.sha256((run / rel).read_bytes()).hexdigest()
    with pytest.raises(SealError, match="already exists"):
        write_manifest(run)
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", MANIFEST_NAME], cwd=run, check=True)


def test_symlink_inside_is_refused(tmp_path: Path, key: SigningKey) -> None:
    run = _populate(tmp_path / "run")
    (run / "link").symlink_to(run / "events.jsonl")
    with pytest.raises(SealError, match="link: is a symlink"):
        seal(run, key)
    assert not (run / MANIFEST_NAME).exists()


# -------------------------------------------------------------------------- sealing


def test_seal_then_verify_is_clean(tmp_path: Path, key: SigningKey) -> None:
    run = _populate(tmp_path / "run")
    result = seal(run, key)
    assert result.files == len(FILES)
    assert result.fingerprint == key.fingerprint
    assert result.keyid == key.keyid
    assert result.manifest_sha256 == hashlib.sha256((run / MANIFEST_NAME).read_bytes()).hexdigest()
    assert verify_seal(run) == []
    assert verify_seal(run, expected_fingerprint=key.fingerprint) == []

    for p in [run, *run.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o555 if p.is_dir() else 0o444), p


def test_envelope_is_dsse_in_toto_verifiable_without_tokrecord(sealed: Path, key: SigningKey) -> None:
    envelope = _envelope(sealed)
    assert set(envelope) == {"payloadType", "payload", "signatures"}
    assert envelope["payloadType"] == DSSE_PAYLOAD_TYPE
    [signature] = envelope["signatures"]
    assert signature["keyid"] == key.keyid
    payload = base64.b64decode(envelope["payload"])
    statement = json.loads(payload)
    assert payload == rfc8785.dumps(statement)
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["predicateType"] == PREDICATE_TYPE
    manifest = (sealed / MANIFEST_NAME).read_bytes()
    assert statement["subject"] == [
        {"name": rel, "digest": {"sha256": digest}}
        for digest, rel in (line.split("  ", 1) for line in manifest.decode().splitlines())
    ]
    predicate = statement["predicate"]
    assert predicate["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert predicate["fingerprint"] == key.fingerprint
    assert predicate["sealed_utc"].endswith("Z")
    # Re-verify by hand from the spec, using only cryptography.
    pub = serialization.load_pem_public_key(predicate["public_key"].encode())
    assert isinstance(pub, Ed25519PublicKey)
    type_bytes = DSSE_PAYLOAD_TYPE.encode()
    pae_bytes = b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(payload), payload)
    pub.verify(base64.b64decode(signature["sig"]), pae_bytes)


def test_sealing_twice_is_refused(sealed: Path, key: SigningKey) -> None:
    _make_writable(sealed)
    with pytest.raises(SealError, match="never re-sealed"):
        seal(sealed, key)


# ------------------------------------------------------------------------- tampering


def test_flipped_data_byte_names_the_file(sealed: Path) -> None:
    _flip(sealed / "models/weights/part-0.bin", 100)
    problems = verify_seal(sealed)
    assert [(p.file, p.field) for p in problems] == [("models/weights/part-0.bin", "sha256")]


def test_flipped_manifest_byte_is_caught(sealed: Path) -> None:
    _flip(sealed / MANIFEST_NAME, 0)
    problems = verify_seal(sealed)
    assert _has(problems, MANIFEST_NAME, "predicate.manifest_sha256")


def test_flipped_manifest_path_byte_is_caught(sealed: Path) -> None:
    # Renaming an entry in the manifest: file now unlisted, entry now missing.
    manifest = (sealed / MANIFEST_NAME).read_bytes()
    _flip(sealed / MANIFEST_NAME, manifest.index(b"  events.jsonl") + 2)
    problems = verify_seal(sealed)
    assert _has(problems, MANIFEST_NAME, "predicate.manifest_sha256")
    assert _has(problems, "events.jsonl", "unlisted")
    assert _has(problems, "dvents.jsonl", "listed")


def test_flipped_signature_byte_does_not_verify(sealed: Path) -> None:
    def flip_sig(envelope: dict[str, Any]) -> None:
        sig = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
        sig[5] ^= 0x01
        envelope["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()

    _rewrite_envelope(sealed, flip_sig)
    problems = verify_seal(sealed)
    assert [(p.file, p.field, p.message) for p in problems] == [
        (SIGNATURE_NAME, "signature", "signature does not verify")
    ]


def test_modified_statement_without_resigning_does_not_verify(sealed: Path) -> None:
    statement = _statement(sealed)
    statement["predicate"]["sealed_utc"] = "1999-01-01T00:00:00Z"

    def swap(envelope: dict[str, Any]) -> None:
        envelope["payload"] = base64.b64encode(rfc8785.dumps(statement)).decode()

    _rewrite_envelope(sealed, swap)
    problems = verify_seal(sealed)
    assert [(p.file, p.field) for p in problems] == [(SIGNATURE_NAME, "signature")]


def test_modified_subject_digest_is_caught_twice(sealed: Path) -> None:
    statement = _statement(sealed)
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    name = statement["subject"][0]["name"]

    def swap(envelope: dict[str, Any]) -> None:
        envelope["payload"] = base64.b64encode(rfc8785.dumps(statement)).decode()

    _rewrite_envelope(sealed, swap)
    problems = verify_seal(sealed)
    assert _has(problems, SIGNATURE_NAME, "signature")
    assert _has(problems, name, "subject")


def test_deleted_file_is_named(sealed: Path) -> None:
    _writable(sealed / "models" / "manifest.json")
    (sealed / "models" / "manifest.json").unlink()
    problems = verify_seal(sealed)
    assert [(p.file, p.field) for p in problems] == [("models/manifest.json", "listed")]


def test_extra_file_is_named(sealed: Path) -> None:
    (sealed / "models").chmod(0o755)
    (sealed / "models" / "late.txt").write_bytes(b"added after sealing\n")
    problems = verify_seal(sealed)
    assert [(p.file, p.field) for p in problems] == [("models/late.txt", "unlisted")]


def test_wrong_expected_fingerprint(sealed: Path, tmp_path: Path) -> None:
    other = load_or_create_key(tmp_path / "other-config")
    problems = verify_seal(sealed, expected_fingerprint=other.fingerprint)
    assert [(p.file, p.field) for p in problems] == [(SIGNATURE_NAME, "fingerprint")]


def test_resealed_with_another_key_needs_the_fingerprint_to_catch(
    sealed: Path, key: SigningKey, tmp_path: Path
) -> None:
    # A tamperer can always re-seal with their own key; only the fingerprint check catches it.
    _flip(sealed / "events.jsonl")
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        _writable(sealed / name)
        (sealed / name).unlink()
    seal(sealed, load_or_create_key(tmp_path / "attacker"))
    assert verify_seal(sealed) == []
    assert _has(verify_seal(sealed, expected_fingerprint=key.fingerprint), SIGNATURE_NAME, "fingerprint")


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b"[]", b'{"payloadType": "x"}', b'{"payloadType":"x","payload":"!!","signatures":[]}'],
)
def test_malformed_envelope_is_a_problem_not_an_exception(sealed: Path, content: bytes) -> None:
    _writable(sealed / SIGNATURE_NAME)
    (sealed / SIGNATURE_NAME).write_bytes(content)
    problems = verify_seal(sealed)
    assert problems
    assert all(p.file == SIGNATURE_NAME for p in problems)


def test_missing_seal_files(sealed: Path) -> None:
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        _writable(sealed / name)
        (sealed / name).unlink()
    problems = verify_seal(sealed)
    assert _has(problems, MANIFEST_NAME, "manifest")
    assert _has(problems, SIGNATURE_NAME, "envelope")
    assert {p.file for p in problems if p.field == "unlisted"} == set(FILES)


def test_manifest_path_escaping_the_directory_is_rejected(sealed: Path) -> None:
    _writable(sealed / MANIFEST_NAME)
    with open(sealed / MANIFEST_NAME, "ab") as fh:
        fh.write(b"0" * 64 + b"  ../outside\n")
    problems = verify_seal(sealed)
    assert any(p.file == MANIFEST_NAME and "../outside" in p.message for p in problems)
    assert not any(p.file == "../outside" for p in problems)


# -------------------------------------------------------------------------- addenda


def test_addenda_are_sealed_siblings(sealed: Path, key: SigningKey) -> None:
    parent_manifest = (sealed / MANIFEST_NAME).read_bytes()
    first = write_addendum(sealed, "rerun-note", {"note": "re-ran verify", "n": 3}, key)
    assert first == sealed.parent / "run.addenda" / "001-rerun-note"
    assert verify_seal(sealed) == []  # parent untouched
    assert sorted(p.name for p in sealed.iterdir()) == sorted(
        [MANIFEST_NAME, SIGNATURE_NAME, "events.jsonl", "identity.json", "models"]
    )
    assert verify_seal(first, expected_fingerprint=key.fingerprint) == []
    raw = (first / "addendum.json").read_bytes()
    document = json.loads(raw)
    assert raw == rfc8785.dumps(document) + b"\n"
    assert document["schema"] == "tokrecord.addendum/v1"
    assert document["kind"] == "rerun-note"
    assert document["parent_manifest_sha256"] == hashlib.sha256(parent_manifest).hexdigest()
    assert document["payload"] == {"note": "re-ran verify", "n": 3}
    assert document["created_utc"].endswith("Z")

    second = write_addendum(sealed, "errata", {}, key)
    assert second.name == "002-errata"
    assert verify_seal(second) == []
    assert stat.S_IMODE(second.stat().st_mode) == 0o555


def test_addendum_custom_root_and_bad_inputs(sealed: Path, key: SigningKey, tmp_path: Path) -> None:
    root = tmp_path / "elsewhere"
    assert write_addendum(sealed, "x", {}, key, addenda_root=root) == root / "001-x"
    (root / "007-old").mkdir()  # numbering continues after the highest, gaps or not
    assert write_addendum(sealed, "y", {}, key, addenda_root=root).name == "008-y"
    with pytest.raises(SealError, match="kind"):
        write_addendum(sealed, "../evil", {}, key)
    unsealed = _populate(tmp_path / "unsealed")
    with pytest.raises(SealError, match="not sealed"):
        write_addendum(unsealed, "x", {}, key)
