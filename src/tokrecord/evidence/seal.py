"""Sealing a finished evidence directory so anyone can re-verify it.

A seal is three things, each checkable with standard tools rather than with
tokrecord itself:

* ``manifest.sha256`` — sha256 of every regular file in the directory, in
  ``sha256sum`` format, so ``sha256sum -c manifest.sha256`` checks the content.
* ``manifest.sig.json`` — a DSSE envelope whose payload is an in-toto Statement
  v1 naming every file (the same list as the manifest) plus the sha256 of the
  manifest itself, signed with the user's Ed25519 key.
* read-only modes (files 0444, directories 0555), so nothing is edited by
  accident after sealing. Modes are a guard, not evidence: they do not survive
  a copy or an archive, so the verifier does not check them.

Trust model: the public key travels inside the signed statement, so the
signature by itself only shows that whoever holds *that* key sealed exactly
these bytes. Someone who rewrites the directory can re-seal it with their own
key; what ties a seal to a person is the key's fingerprint, which the verifier
compares against an expected one when the caller passes it.

Addenda (facts learned after sealing) never go inside a sealed directory; they
are separate sealed directories next to it that name the parent's manifest hash.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import rfc8785
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from tokrecord.errors import TokrecordError
from tokrecord.evidence import safe, write_exclusive
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.identity.hashing import manifest_text, sha256_file
from tokrecord.jsontypes import JSONObject

MANIFEST_NAME = "manifest.sha256"
SIGNATURE_NAME = "manifest.sig.json"
# Only the seal's own outputs at the top of the sealed directory are left out of
# the manifest; a file with the same name deeper down is ordinary evidence.
SEAL_OUTPUTS = frozenset({MANIFEST_NAME, SIGNATURE_NAME})

KEY_FILE_NAME = "signing-key.pem"
CONFIG_DIR_ENV = "TOKRECORD_CONFIG_DIR"

DSSE_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tokrecord.dev/evidence/v1"

ADDENDUM_SCHEMA = "tokrecord.addendum/v1"
ADDENDUM_FILE_NAME = "addendum.json"
ADDENDA_SUFFIX = ".addenda"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MANIFEST_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
# Kinds become directory names: keep them to one safe path component.
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_ADDENDUM_DIR = re.compile(r"(\d{3,})-")


class SealError(TokrecordError):
    """A directory cannot be sealed (symlink inside, already sealed, bad key file, ...)."""


# --------------------------------------------------------------------------- keys


def default_config_dir() -> Path:
    """``$TOKRECORD_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/tokrecord``, else ``~/.config/tokrecord``."""
    explicit = os.environ.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "tokrecord"
    return Path.home() / ".config" / "tokrecord"


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 key pair; the private half never appears in repr or output."""

    private_key: Ed25519PrivateKey = field(repr=False)
    path: Path | None = None

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def public_key_raw(self) -> bytes:
        return _raw_public(self.public_key)

    @property
    def public_key_raw_b64(self) -> str:
        return base64.b64encode(self.public_key_raw).decode("ascii")

    @property
    def public_key_pem(self) -> str:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode("ascii")

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.public_key_raw)

    @property
    def keyid(self) -> str:
        return keyid_of(self.public_key_raw)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint_of(raw_public_key: bytes) -> str:
    """``SHA256:`` + unpadded base64 of sha256(raw key) — the form ``ssh-keygen -l`` prints."""
    digest = hashlib.sha256(raw_public_key).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def keyid_of(raw_public_key: bytes) -> str:
    return hashlib.sha256(raw_public_key).hexdigest()


def announce_to_stderr(key: SigningKey) -> None:
    """The default announcement of a new key: a new key is a new identity in every seal,
    so a changed config directory must not swap it silently."""
    sys.stderr.write(f"tokrecord: created a new signing key {key.fingerprint} at {key.path} "
                     "(every seal names it; back it up, and give this fingerprint to whoever "
                     "verifies your evidence)\n")


def load_or_create_key(config_dir: Path | None = None, *,
                       on_create: Callable[[SigningKey], None] = announce_to_stderr
                       ) -> SigningKey:
    """The user's signing key, created on first use as ``<config_dir>/signing-key.pem``
    (and announced through `on_create`)."""
    directory = config_dir if config_dir is not None else default_config_dir()
    path = directory / KEY_FILE_NAME
    if not path.exists():
        _create_key_file(directory, path)
        key = _load_key(path)
        on_create(key)
        return key
    return _load_key(path)


def _create_key_file(directory: Path, path: Path) -> None:
    if not directory.is_dir():
        try:
            directory.mkdir(mode=0o700, parents=True)
            # mkdir's mode is filtered by the umask (which may even strip the
            # owner's bits); set exactly 0700 whatever the umask is.
            directory.chmod(0o700)
        except FileExistsError:
            pass  # created concurrently; fine
        except OSError as exc:
            raise SealError(f"cannot create key directory {directory}: {exc.strerror}") from exc
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Write a private temp file and hard-link it into place: link() fails if the
    # name exists, so creation is exclusive (two first runs never overwrite each
    # other's key) and a reader never sees a half-written key.
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=".signing-key.", dir=directory)
    except OSError as exc:
        raise SealError(f"cannot write a signing key in {directory}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(pem)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp_name, path)
        except FileExistsError:
            pass  # another process won the race; its key is the key
        except OSError:
            # Filesystems without hard links: fall back to O_EXCL, still exclusive.
            _write_exclusive(path, pem, mode=0o600)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), mode)
        fh.write(data)


def _load_key(path: Path) -> SigningKey:
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read(1 << 16)
    except OSError as exc:
        raise SealError(f"cannot read signing key {path}: {exc.strerror}") from exc
    if mode & 0o077:
        # As ssh refuses a private key others can read: whoever reads it can seal as you.
        raise SealError(f"signing key {path} is readable or writable by group or others "
                        f"(mode {stat.S_IMODE(mode):04o}); fix it with: chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SealError(
            f"signing key {path} is not an unencrypted PEM private key ({exc}); "
            "move it away to create a new one"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SealError(f"signing key {path} is not an Ed25519 key")
    return SigningKey(key, path)


# ----------------------------------------------------------------------- manifest


def _scan(directory: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Regular files under ``directory`` (relative POSIX paths, sorted by UTF-8
    bytes, seal outputs excluded) and the entries that cannot be evidence.

    Symlinks are rejected rather than followed: a link's target can change
    without the directory changing, and it can point outside the evidence.
    """
    files: list[str] = []
    bad: list[tuple[str, str]] = []
    stack: list[tuple[Path, str]] = [(directory, "")]
    while stack:
        current, prefix = stack.pop()
        try:
            with os.scandir(current) as it:
                entries = list(it)
        except OSError as exc:
            # An unreadable subdirectory cannot be hashed; report it like any
            # other entry that cannot be evidence instead of crashing the verifier.
            bad.append((prefix.rstrip("/") or ".", f"cannot be listed: {exc.strerror}"))
            continue
        for entry in entries:
            rel = prefix + entry.name
            problem = _name_problem(entry.name)
            if problem is not None:
                bad.append((rel, problem))
            elif entry.is_symlink():
                bad.append((rel, "is a symlink; evidence must be plain files"))
            elif entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), rel + "/"))
            elif entry.is_file(follow_symlinks=False):
                if not (prefix == "" and entry.name in SEAL_OUTPUTS):
                    files.append(rel)
            else:
                bad.append((rel, "is not a regular file or directory"))
    files.sort(key=lambda p: p.encode("utf-8"))
    bad.sort(key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return files, bad


def _name_problem(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # JSON subjects need text names; os.scandir smuggles undecodable bytes as surrogates.
        return "name is not valid UTF-8"
    # sha256sum would need its backslash-escaping for these; refusing them keeps
    # the manifest one plain line per file.
    if any(c in name for c in "\n\r\\"):
        return "name contains a newline or backslash"
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_manifest(directory: Path) -> Path:
    """Write ``manifest.sha256`` (sha256sum format) over every regular file under ``directory``."""
    files, bad = _scan(directory)
    if bad:
        listing = "; ".join(f"{rel}: {why}" for rel, why in bad)
        raise SealError(f"cannot seal {directory}: {listing}")
    # _scan refuses names manifest_text would have to escape, so every line is plain.
    lines = manifest_text({rel: sha256_file(directory / rel) for rel in files})
    target = directory / MANIFEST_NAME
    try:
        write_exclusive(target, lines.encode("utf-8"))  # whole or absent, even under a kill
    except FileExistsError as exc:
        raise SealError(f"{target} already exists; a sealed directory is never re-sealed") from exc
    return target


def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def parse_manifest(data: bytes) -> tuple[list[tuple[str, str]], list[str]]:
    """``(path, sha256)`` entries in file order, and a message per malformed line."""
    errors: list[str] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [], ["manifest is not valid UTF-8"]
    if text and not text.endswith("\n"):
        errors.append("manifest does not end with a newline")
    entries: list[tuple[str, str]] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        match = _MANIFEST_LINE.fullmatch(line)
        if match is None:
            errors.append(f"line {number} is not '<sha256>  <path>'")
            continue
        digest, rel = match.group(1), match.group(2)
        if not _safe_rel(rel):
            errors.append(f"line {number}: path {safe.excerpt(rel)} is not a plain relative path")
        elif rel in seen:
            errors.append(f"line {number}: {rel} is listed twice")
        else:
            seen.add(rel)
            entries.append((rel, digest))
    return entries, errors


# ------------------------------------------------------------------------- DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: what is actually signed.

    Binding the payload type into the signed bytes stops a signature over one
    kind of document from being replayed as another.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(payload), payload)


class _Subject(TypedDict):
    name: str
    digest: dict[str, str]


class _Predicate(TypedDict):
    manifest_sha256: str
    public_key: str
    fingerprint: str
    sealed_utc: str


# The in-toto statement a seal signs.
class _Statement(TypedDict):
    _type: str
    subject: list[_Subject]
    predicateType: str
    predicate: _Predicate


class _Signature(TypedDict):
    keyid: str
    sig: str


class _Envelope(TypedDict):
    payloadType: str
    payload: str
    signatures: list[_Signature]


class AddendumDocument(TypedDict):
    schema: str
    kind: str
    parent_manifest_sha256: str
    created_utc: str
    payload: Mapping[str, Any]


def _rfc8785(document: Mapping[str, Any]) -> bytes:
    return rfc8785.dumps(document)


def sign_manifest(directory: Path, key: SigningKey) -> Path:
    """Write ``manifest.sig.json``: a DSSE envelope over an in-toto statement of the manifest."""
    manifest_bytes = (directory / MANIFEST_NAME).read_bytes()
    entries, errors = parse_manifest(manifest_bytes)
    if errors:
        raise SealError(f"cannot sign {directory / MANIFEST_NAME}: {'; '.join(errors)}")
    statement: _Statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": rel, "digest": {"sha256": digest}} for rel, digest in entries],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "manifest_sha256": _sha256(manifest_bytes),
            "public_key": key.public_key_pem,
            "fingerprint": key.fingerprint,
            "sealed_utc": utc_stamp(Stamp.SECONDS),
        },
    }
    # RFC 8785 so that a statement has exactly one byte form: anyone re-deriving
    # it from the parsed JSON gets the bytes that were signed.
    payload = _rfc8785(statement)
    envelope: _Envelope = {
        "payloadType": DSSE_PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [
            {"keyid": key.keyid, "sig": base64.b64encode(key.sign(pae(DSSE_PAYLOAD_TYPE, payload))).decode()}
        ],
    }
    target = directory / SIGNATURE_NAME
    try:
        write_exclusive(target, _rfc8785(envelope) + b"\n")
    except FileExistsError as exc:
        raise SealError(f"{target} already exists; a sealed directory is never re-sealed") from exc
    return target


# ------------------------------------------------------------------------ sealing


def _walk_dirs_bottom_up(directory: Path) -> Iterator[Path]:
    for root, dirnames, _ in os.walk(directory, topdown=False):
        for name in dirnames:
            yield Path(root) / name
    yield directory


def make_read_only(directory: Path) -> None:
    """Files 0444, directories 0555 — a guard against accidental edits after sealing."""
    files, bad = _scan(directory)
    if bad:
        # chmod follows symlinks: never let one redirect it outside the evidence.
        listing = "; ".join(f"{rel}: {why}" for rel, why in bad)
        raise SealError(f"cannot make {directory} read-only: {listing}")
    for rel in [*files, *(n for n in SEAL_OUTPUTS if (directory / n).is_file())]:
        (directory / rel).chmod(0o444)
    for sub in _walk_dirs_bottom_up(directory):
        sub.chmod(0o555)


class SealResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_sha256: str
    fingerprint: str
    keyid: str
    files: int


def seal(directory: Path, key: SigningKey, *, resume: bool = False) -> SealResult:
    """Manifest, signature, read-only — in that order, so the modes change last.

    `resume`: complete a seal that a kill cut short (the manifest, or the manifest and
    the signature, already written: each is written whole or not at all); a directory
    whose seal is complete is refused all the same."""
    manifest = directory / MANIFEST_NAME
    if resume and (directory / SIGNATURE_NAME).exists():
        raise SealError(f"{directory / SIGNATURE_NAME} already exists; a sealed directory is "
                        "never re-sealed")
    if not (resume and manifest.exists()):
        write_manifest(directory)
    sign_manifest(directory, key)
    make_read_only(directory)
    data = manifest.read_bytes()
    entries, _ = parse_manifest(data)
    return SealResult(
        manifest_sha256=_sha256(data), fingerprint=key.fingerprint, keyid=key.keyid, files=len(entries)
    )


# ---------------------------------------------------------------------- verifying


class Problem(BaseModel):
    """One reason a seal does not hold; ``file`` is relative to the sealed directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    field: str
    message: str


def _read_plain(path: Path) -> bytes | None:
    """Bytes of a regular file, or None; a symlinked seal file is never followed, and
    neither file of a seal is anywhere near the cap."""
    try:
        return safe.read_bytes(path, safe.TEXT_CAP)
    except safe.UnsafeEvidence:
        return None


def verify_seal(directory: Path, expected_fingerprint: str | None = None) -> list[Problem]:
    """Every reason the seal on ``directory`` does not hold; ``[]`` means sealed and intact."""
    if not directory.is_dir():
        return [Problem(file=".", field="directory", message=f"{directory} is not a directory")]
    problems: list[Problem] = []
    files, bad = _scan(directory)
    problems += [Problem(file=rel, field="type", message=why) for rel, why in bad]

    manifest_bytes = _read_plain(directory / MANIFEST_NAME)
    entries: list[tuple[str, str]] = []
    if manifest_bytes is None:
        problems.append(Problem(file=MANIFEST_NAME, field="manifest", message="missing"))
    else:
        entries, errors = parse_manifest(manifest_bytes)
        problems += [Problem(file=MANIFEST_NAME, field="manifest", message=m) for m in errors]

    present = set(files)
    listed = {rel for rel, _ in entries}
    for rel, digest in entries:
        if rel not in present:
            problems.append(
                Problem(file=rel, field="listed", message="listed in the manifest but not present")
            )
            continue
        try:
            actual = safe.sha256_regular(directory / rel)
        except safe.UnsafeEvidence as exc:
            problems.append(Problem(file=rel, field="sha256", message=f"cannot be read: "
                                    f"{exc.reason}"))
            continue
        if actual != digest:
            problems.append(
                Problem(file=rel, field="sha256", message=f"sha256 is {actual}, the manifest says {digest}")
            )
    for rel in files:
        if rel not in listed:
            problems.append(
                Problem(file=rel, field="unlisted", message="present but not listed in the manifest")
            )

    problems += _verify_envelope(directory, manifest_bytes, entries, expected_fingerprint)
    return problems


def signer_fingerprint(directory: Path) -> str | None:
    """The fingerprint of the key in `directory`'s signed statement, or None when there is
    no readable one. Names the key only: verify_seal says whether the seal holds."""
    raw = _read_plain(directory / SIGNATURE_NAME)
    if raw is None:
        return None
    try:
        envelope = safe.parse_json(raw, SIGNATURE_NAME)
    except safe.UnsafeEvidence:
        return None
    payload = _b64decode(envelope.get("payload")) if isinstance(envelope, dict) else None
    if payload is None:
        return None
    statement, _ = _parse_statement(payload)
    key = _load_public_key(statement["predicate"].get("public_key")) if statement else None
    return fingerprint_of(_raw_public(key)) if key is not None else None


def local_fingerprint(config_dir: Path | None = None) -> str | None:
    """The local signing key's fingerprint, or None when there is none (never creates one)."""
    path = (config_dir if config_dir is not None else default_config_dir()) / KEY_FILE_NAME
    if not path.is_file():
        return None
    try:
        return _load_key(path).fingerprint
    except SealError:
        return None


def _b64decode(value: object) -> bytes | None:
    """Standard or URL-safe base64, padded or not (DSSE allows either), else None."""
    if not isinstance(value, str):
        return None
    text = value.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _verify_envelope(
    directory: Path,
    manifest_bytes: bytes | None,
    entries: list[tuple[str, str]],
    expected_fingerprint: str | None,
) -> list[Problem]:
    def problem(field_name: str, message: str, file: str = SIGNATURE_NAME) -> Problem:
        return Problem(file=file, field=field_name, message=message)

    raw = _read_plain(directory / SIGNATURE_NAME)
    if raw is None:
        return [problem("envelope", "missing")]
    try:
        envelope = safe.parse_json(raw, SIGNATURE_NAME)
    except safe.UnsafeEvidence as exc:
        return [problem("envelope", exc.reason)]
    if not isinstance(envelope, dict):
        return [problem("envelope", "not a JSON object")]
    problems: list[Problem] = []
    payload_type = envelope.get("payloadType")
    if payload_type != DSSE_PAYLOAD_TYPE:
        problems.append(problem("payloadType", f"is {safe.excerpt(payload_type)}, "
                                               f"expected {DSSE_PAYLOAD_TYPE!r}"))
    payload = _b64decode(envelope.get("payload"))
    if payload is None:
        return [*problems, problem("payload", "missing or not base64")]
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        return [*problems, problem("signatures", "missing or empty")]

    statement, statement_problems = _parse_statement(payload)
    problems += [problem(f, m) for f, m in statement_problems]
    if statement is None:
        return problems
    predicate: JSONObject = statement["predicate"]
    problems += [problem(f, m) for f, m in _key_problems(predicate, str(payload_type), payload,
                                                          signatures, expected_fingerprint)]
    if manifest_bytes is not None:
        claimed = predicate.get("manifest_sha256")
        actual = _sha256(manifest_bytes)
        if claimed != actual:
            problems.append(
                problem(
                    "predicate.manifest_sha256",
                    f"manifest sha256 is {actual}, the signed statement says {safe.excerpt(claimed)}",
                    file=MANIFEST_NAME,
                )
            )
    problems += _compare_subjects(statement["subject"], entries)
    return problems


def _key_problems(predicate: Mapping[str, Any], payload_type: str, payload: bytes,
                  signatures: list[Any], expected_fingerprint: str | None
                  ) -> list[tuple[str, str]]:
    """(field, message) for the statement's key: not an Ed25519 key, a fingerprint that is
    not the key's or not the one expected, no signature that verifies under it."""
    public_key = _load_public_key(predicate.get("public_key"))
    if public_key is None:
        return [("predicate.public_key", "missing or not an Ed25519 PEM public key")]
    problems: list[tuple[str, str]] = []
    actual_fp = fingerprint_of(_raw_public(public_key))
    if predicate.get("fingerprint") != actual_fp:
        problems.append(("predicate.fingerprint",
                         f"says {safe.excerpt(predicate.get('fingerprint'))}, key is {actual_fp}"))
    if expected_fingerprint is not None and actual_fp != expected_fingerprint:
        problems.append(("fingerprint",
                         f"sealed by key {actual_fp}, expected {expected_fingerprint}"))
    # keyid is an unauthenticated hint in DSSE, so it selects nothing here:
    # the seal holds if any signature verifies under the statement's key.
    signed = pae(payload_type, payload)
    if not any(_verifies(public_key, s, signed) for s in signatures):
        problems.append(("signature", "signature does not verify"))
    return problems


def _parse_statement(payload: bytes) -> tuple[JSONObject | None, list[tuple[str, str]]]:
    try:
        statement = safe.parse_json(payload, "payload")
    except safe.UnsafeEvidence as exc:
        return None, [("statement", f"payload {exc.reason}")]
    if not isinstance(statement, dict):
        return None, [("statement", "payload is not a JSON object")]
    problems: list[tuple[str, str]] = []
    try:
        canonical = rfc8785.dumps(statement) == payload
    except rfc8785.CanonicalizationError:
        canonical = False
    if not canonical:
        # Also catches duplicate keys, which different JSON parsers resolve differently.
        problems.append(("statement", "payload is not RFC 8785 canonical JSON"))
    if statement.get("_type") != STATEMENT_TYPE:
        problems.append(("statement._type", f"is {safe.excerpt(statement.get('_type'))}, "
                                            f"expected {STATEMENT_TYPE!r}"))
    if statement.get("predicateType") != PREDICATE_TYPE:
        problems.append(
            ("statement.predicateType", f"is {safe.excerpt(statement.get('predicateType'))}, "
                                        f"expected {PREDICATE_TYPE!r}")
        )
    if not isinstance(statement.get("predicate"), dict):
        problems.append(("statement.predicate", "missing or not an object"))
        return None, problems
    if not isinstance(statement.get("subject"), list):
        problems.append(("statement.subject", "missing or not a list"))
        return None, problems
    return statement, problems


def _load_public_key(pem: object) -> Ed25519PublicKey | None:
    if not isinstance(pem, str):
        return None
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm):
        return None
    return key if isinstance(key, Ed25519PublicKey) else None


def _verifies(public_key: Ed25519PublicKey, signature: object, signed: bytes) -> bool:
    if not isinstance(signature, dict):
        return False
    sig = _b64decode(signature.get("sig"))
    if sig is None:
        return False
    try:
        public_key.verify(sig, signed)
    except InvalidSignature:
        return False
    return True


def _compare_subjects(subjects: list[Any], entries: list[tuple[str, str]]) -> list[Problem]:
    problems: list[Problem] = []
    signed: dict[str, str] = {}
    for index, subject in enumerate(subjects):
        name = subject.get("name") if isinstance(subject, dict) else None
        digest = subject.get("digest") if isinstance(subject, dict) else None
        sha = digest.get("sha256") if isinstance(digest, dict) else None
        if not isinstance(name, str) or not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            problems.append(
                Problem(file=SIGNATURE_NAME, field="subject", message=f"subject {index} is malformed")
            )
        elif name in signed:
            problems.append(Problem(file=name, field="subject", message="named twice in the statement"))
        else:
            signed[name] = sha
    listed = dict(entries)
    for name, sha in signed.items():
        if name not in listed:
            problems.append(
                Problem(file=name, field="subject", message="in the signed statement but not the manifest")
            )
        elif listed[name] != sha:
            problems.append(
                Problem(
                    file=name,
                    field="subject",
                    message=f"signed statement says sha256 {sha}, the manifest says {listed[name]}",
                )
            )
    for name in listed:
        if name not in signed:
            problems.append(
                Problem(file=name, field="subject", message="in the manifest but not the signed statement")
            )
    return problems


# ------------------------------------------------------------------------ addenda


def addenda_dir(parent_dir: Path) -> Path:
    """``<parent>.addenda`` — beside the parent, because the parent is read-only and sealed."""
    return parent_dir.with_name(parent_dir.name + ADDENDA_SUFFIX)


def write_addendum(
    parent_dir: Path,
    kind: str,
    payload: Mapping[str, Any],
    key: SigningKey,
    addenda_root: Path | None = None,
) -> Path:
    """A new sealed directory ``<parent>.addenda/<NNN>-<kind>/`` bound to the parent's manifest.

    Numbering assumes one writer at a time per parent: two concurrent writers of
    different kinds could both take the same number (each directory is still
    created exclusively, so neither overwrites the other).
    """
    if not _KIND.fullmatch(kind):
        raise SealError(f"addendum kind {kind!r} must match {_KIND.pattern}")
    parent_manifest = _read_plain(parent_dir / MANIFEST_NAME)
    if parent_manifest is None or _read_plain(parent_dir / SIGNATURE_NAME) is None:
        raise SealError(f"{parent_dir} is not sealed; addenda attach only to sealed directories")
    document: AddendumDocument = {
        "schema": ADDENDUM_SCHEMA,
        "kind": kind,
        "parent_manifest_sha256": _sha256(parent_manifest),
        "created_utc": utc_stamp(Stamp.SECONDS),
        "payload": payload,
    }
    # Serialise before creating anything, so a payload RFC 8785 refuses (NaN,
    # integers beyond 2**53) leaves no empty numbered directory behind.
    body = _rfc8785(document) + b"\n"

    root = addenda_root if addenda_root is not None else addenda_dir(parent_dir)
    root.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in root.iterdir() if (m := _ADDENDUM_DIR.match(p.name)) is not None]
    target = root / f"{max(numbers, default=0) + 1:03d}-{kind}"
    try:
        target.mkdir()
    except FileExistsError as exc:
        raise SealError(f"{target} already exists; another addendum is being written") from exc
    with open(target / ADDENDUM_FILE_NAME, "xb") as fh:
        fh.write(body)
    seal(target, key)
    return target
