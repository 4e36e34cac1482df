"""tokrecord.identity: source bundles/patches that really rebuild HEAD, hashes, locks, manifests."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from pydantic import ValidationError

import tokrecord
from tokrecord.errors import ConfigError
from tokrecord.identity import (
    Identity,
    IdentitySpec,
    PackageIdentity,
    SourceIdentity,
    SourceSpec,
    collect_identity,
    manifest_text,
    model_manifest,
    native_modules,
    python_site_packages,
    runtime_lock,
    runtime_lock_current,
    sha256_file,
    source_identity,
    tokrecord_identity,
)
from tokrecord.identity import source as source_mod

# Binary content with NUL and high bytes: only a --binary patch carries it.
BINARY_V1 = bytes(range(256)) * 4
BINARY_V2 = bytes(reversed(range(256))) * 4 + b"\x00tail"


def git(repo: Path, *args: str) -> str:
    """Run git for test set-up with a fixed identity, ignoring the user's config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout.strip()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repo with a tagged public base and two commits on top (edits, binary, rename, delete)."""
    r = tmp_path / "src-repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "README").write_text("base\n")
    (r / "pkg").mkdir()
    (r / "pkg" / "mod.py").write_text("x = 1\n")
    (r / "pkg" / "old_name.py").write_text("y = 2\n" * 20)
    (r / "gone.txt").write_text("to be deleted\n")
    (r / "blob.bin").write_bytes(BINARY_V1)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    git(r, "tag", "base")
    (r / "pkg" / "mod.py").write_text("x = 1\nz = 3\n")
    (r / "blob.bin").write_bytes(BINARY_V2)
    (r / "new.bin").write_bytes(b"\x00\x01\x02" * 100)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "one")
    git(r, "mv", "pkg/old_name.py", "pkg/new_name.py")
    git(r, "rm", "-q", "gone.txt")
    git(r, "commit", "-q", "-m", "two")
    return r


def base_clone(tmp_path: Path, src: Path, name: str = "verify") -> Path:
    """A fresh repository holding only the public base's objects, checked out at it."""
    dst = tmp_path / name
    dst.mkdir()
    git(dst, "init", "-q")
    git(dst, "fetch", "-q", "--no-tags", str(src), "refs/tags/base:refs/tags/base")
    git(dst, "checkout", "-q", "--detach", "base")
    return dst


def test_bundle_and_patch_rebuild_head(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "evidence"
    ident = source_identity(repo, public_base="base", out_dir=out, name="vllm")
    head = git(repo, "rev-parse", "HEAD")
    assert ident.commit == head and len(head) == 40
    assert ident.branch == "main"
    assert not ident.dirty and ident.dirty_paths == ()
    assert ident.public_base == "base"
    assert ident.public_base_commit == git(repo, "rev-parse", "base^{commit}")
    assert ident.base_is_ancestor is True
    assert ident.commits_since_base == 2
    assert ident.dirty_patch is None
    assert ident.bundle is not None and ident.patch is not None
    assert ident.bundle.file == "vllm.bundle" and ident.patch.file == "vllm.patch"
    assert sorted(p.name for p in out.iterdir()) == ["vllm.bundle", "vllm.patch"]
    for ev in (ident.bundle, ident.patch):
        assert ev.sha256 == sha(out / ev.file)
        assert ev.bytes == (out / ev.file).stat().st_size

    # The bundle is thin (base..HEAD): a repository without the base cannot use it ...
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    proc = subprocess.run(
        ["git", "-C", str(empty), "bundle", "verify", str(out / "vllm.bundle")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0

    # ... while one holding only the public base gets exactly HEAD from it.
    verify = base_clone(tmp_path, repo)
    git(verify, "bundle", "verify", str(out / "vllm.bundle"))
    git(verify, "fetch", "-q", str(out / "vllm.bundle"), "HEAD:refs/bundle/head", "main:refs/bundle/main")
    assert git(verify, "rev-parse", "refs/bundle/head") == head
    assert git(verify, "rev-parse", "refs/bundle/main") == head

    # The combined patch applied onto the base gives HEAD's tree, binary files included.
    patch_ws = base_clone(tmp_path, repo, "patch-ws")
    git(patch_ws, "apply", "--index", str(out / "vllm.patch"))
    assert git(patch_ws, "write-tree") == git(repo, "rev-parse", "HEAD^{tree}")
    assert (patch_ws / "blob.bin").read_bytes() == BINARY_V2


def test_dirty_tree_and_dirty_patch(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("base\nlocal edit\n")  # unstaged
    (repo / "pkg" / "mod.py").write_text("x = 100\n")
    git(repo, "add", "pkg/mod.py")  # staged
    (repo / "blob.bin").write_bytes(BINARY_V1 + b"\xff")  # binary edit
    (repo / "notes").mkdir()
    (repo / "notes" / "untracked.txt").write_text("not yet added\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "ignored.log").write_text("ignored\n")

    out = tmp_path / "evidence"
    ident = source_identity(repo, public_base="base", out_dir=out, name="src")
    assert ident.dirty
    assert ident.dirty_paths == (".gitignore", "README", "blob.bin", "notes/untracked.txt", "pkg/mod.py")
    assert ident.commit == git(repo, "rev-parse", "HEAD")  # the commit, not the working tree
    assert ident.dirty_patch is not None and ident.dirty_patch.file == "src.dirty.patch"
    assert ident.dirty_patch.sha256 == sha(out / "src.dirty.patch")
    assert ident.dirty_patch_omits == ()

    # HEAD (from the bundle) + the dirty patch reproduces the working tree.
    ws = base_clone(tmp_path, repo)
    git(ws, "fetch", "-q", str(out / "src.bundle"), "HEAD:refs/bundle/head")
    git(ws, "checkout", "-q", "--detach", "refs/bundle/head")
    git(ws, "apply", str(out / "src.dirty.patch"))
    for rel in ["README", "pkg/mod.py", "blob.bin", "notes/untracked.txt", ".gitignore"]:
        assert (ws / rel).read_bytes() == (repo / rel).read_bytes(), rel
    assert not (ws / "ignored.log").exists()

    # The measured repository was only read: its index still stages just mod.py.
    assert git(repo, "diff", "--cached", "--name-only") == "pkg/mod.py"


def test_dirty_patch_without_public_base(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("changed\n")
    out = tmp_path / "evidence"
    ident = source_identity(repo, out_dir=out, name="src")
    assert ident.public_base is None and ident.public_base_commit is None
    assert ident.bundle is None and ident.patch is None
    assert ident.dirty_paths == ("README",)
    assert [p.name for p in out.iterdir()] == ["src.dirty.patch"]
    assert "+changed" in (out / "src.dirty.patch").read_text()


def test_no_out_dir_writes_nothing(repo: Path, tmp_path: Path) -> None:
    ident = source_identity(repo, public_base="base", name="src")
    assert ident.public_base_commit is not None and ident.commits_since_base == 2
    assert ident.bundle is None and ident.patch is None and ident.dirty_patch is None


def test_branch_named_like_a_tag(repo: Path, tmp_path: Path) -> None:
    git(repo, "tag", "main", "base")  # makes "main" ambiguous between branch and tag
    ident = source_identity(repo, public_base="base", out_dir=tmp_path / "ev", name="src")
    assert ident.branch == "main"
    verify = base_clone(tmp_path, repo)
    git(verify, "fetch", "-q", str(tmp_path / "ev" / "src.bundle"), "refs/heads/main:refs/bundle/main")
    assert git(verify, "rev-parse", "refs/bundle/main") == ident.commit


def test_detached_head_bundle(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    out = tmp_path / "evidence"
    ident = source_identity(repo, public_base="base", out_dir=out, name="src")
    assert ident.branch is None and ident.commits_since_base == 1
    verify = base_clone(tmp_path, repo)
    git(verify, "fetch", "-q", str(out / "src.bundle"), "HEAD:refs/bundle/head")
    assert git(verify, "rev-parse", "refs/bundle/head") == git(repo, "rev-parse", "HEAD")


def test_head_at_base_has_no_bundle(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "--detach", "base")
    out = tmp_path / "evidence"
    ident = source_identity(repo, public_base="base", out_dir=out, name="src")
    assert ident.commits_since_base == 0
    assert ident.bundle is None  # git refuses empty bundles; there is nothing to ship
    assert ident.patch is not None and ident.patch.bytes == 0


def test_base_not_ancestor_is_recorded(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side", "base")
    (repo / "README").write_text("side\n")
    git(repo, "commit", "-q", "-am", "side")
    ident = source_identity(repo, public_base="main", out_dir=tmp_path / "ev", name="src")
    assert ident.base_is_ancestor is False
    assert ident.branch == "side"


def test_non_git_path_is_a_config_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ConfigError, match=re.escape(str(plain))):
        source_identity(plain, name="x")
    with pytest.raises(ConfigError, match="not a directory"):
        source_identity(tmp_path / "missing", name="x")


def test_subdirectory_needs_opt_in(repo: Path) -> None:
    with pytest.raises(ConfigError, match="top level"):
        source_identity(repo / "pkg", name="x")
    ident = source_identity(repo / "pkg", name="x", subdir_ok=True)
    assert Path(ident.path) == repo.resolve()


def test_unknown_public_base(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no-such-ref"):
        source_identity(repo, public_base="no-such-ref", out_dir=tmp_path / "ev", name="x")
    assert not (tmp_path / "ev").exists() or not any((tmp_path / "ev").iterdir())


def test_unsafe_source_name(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="source name"):
        source_identity(repo, public_base="base", out_dir=tmp_path, name="../escape")
    with pytest.raises(ValidationError):
        IdentitySpec(sources={"a/b": SourceSpec(path=str(repo))})


def test_evidence_is_never_overwritten(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("dirty\n")
    out = tmp_path / "evidence"
    first = source_identity(repo, public_base="base", out_dir=out, name="src")
    before = {p.name: sha(p) for p in out.iterdir()}
    assert set(before) == {"src.bundle", "src.patch", "src.dirty.patch"}
    with pytest.raises(ConfigError, match="never overwritten"):
        source_identity(repo, public_base="base", out_dir=out, name="src")
    assert {p.name: sha(p) for p in out.iterdir()} == before
    assert first.bundle is not None and before["src.bundle"] == first.bundle.sha256

    # A clash on a later file leaves no earlier file of that call behind.
    out2 = tmp_path / "evidence2"
    out2.mkdir()
    (out2 / "src.patch").write_bytes(b"someone else's")
    with pytest.raises(ConfigError, match=re.escape("src.patch")):
        source_identity(repo, public_base="base", out_dir=out2, name="src")
    assert [p.name for p in out2.iterdir()] == ["src.patch"]
    assert (out2 / "src.patch").read_bytes() == b"someone else's"


def test_tokrecord_identity_from_checkout_or_package(monkeypatch: pytest.MonkeyPatch) -> None:
    ident = tokrecord_identity()
    pkg_dir = Path(tokrecord.__file__).resolve().parent
    if isinstance(ident, SourceIdentity):
        assert ident.name == "tokrecord" and len(ident.commit) == 40
        assert pkg_dir.is_relative_to(Path(ident.path))
        assert ident.bundle is None and ident.patch is None and ident.dirty_patch is None
    else:
        assert ident.version == metadata.version("tokrecord")
    monkeypatch.setattr(source_mod, "_tracked_in_checkout", lambda _p: False)
    assert tokrecord_identity() == PackageIdentity(name="tokrecord", version=metadata.version("tokrecord"))


def test_installed_copy_inside_a_checkout_is_not_that_checkout(tmp_path: Path) -> None:
    # A package directory that git does not track (e.g. in a project's .venv).
    git(tmp_path, "init", "-q")
    pkg = tmp_path / ".venv" / "site-packages" / "tokrecord"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    assert not source_mod._tracked_in_checkout(pkg)
    assert not source_mod._tracked_in_checkout(tmp_path / "nowhere")


def make_hf_snapshot(root: Path) -> Path:
    repo = root / "hub" / "models--org--name"
    blobs = repo / "blobs"
    snap = repo / "snapshots" / "abc123"
    (snap / "sub").mkdir(parents=True)
    blobs.mkdir()
    (blobs / "b1").write_bytes(b'{"model_type": "llama"}')
    (blobs / "b2").write_bytes(b"\x00weights\x01" * 1000)
    (snap / "config.json").symlink_to("../../blobs/b1")
    (snap / "sub" / "model.safetensors").symlink_to("../../../blobs/b2")
    (snap / "README.md").write_text("plain file\n")
    (snap / ".git").mkdir()
    (snap / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return snap


def test_model_manifest_hf_snapshot(tmp_path: Path) -> None:
    snap = make_hf_snapshot(tmp_path)
    ident = model_manifest(snap)
    assert ident.revision == "abc123" and ident.hf_id == "org/name"
    assert list(ident.files) == ["README.md", "config.json", "sub/model.safetensors"]  # .git skipped
    assert ident.files["config.json"] == hashlib.sha256(b'{"model_type": "llama"}').hexdigest()
    assert ident.files["sub/model.safetensors"] == hashlib.sha256(b"\x00weights\x01" * 1000).hexdigest()
    assert ident.file_count == 3
    assert ident.total_bytes == len(b'{"model_type": "llama"}') + 9 * 1000 + len("plain file\n")
    text = manifest_text(ident.files)
    assert ident.manifest_sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert text.splitlines()[1] == f"{ident.files['config.json']}  config.json"

    # sha256sum itself accepts the manifest.
    if shutil.which("sha256sum"):
        (tmp_path / "m.sha256").write_text(text)
        proc = subprocess.run(
            ["sha256sum", "--check", "--strict", str(tmp_path / "m.sha256")],
            cwd=snap,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_model_manifest_plain_dir_single_file_and_errors(tmp_path: Path) -> None:
    plain = tmp_path / "model"
    plain.mkdir()
    (plain / "w.gguf").write_bytes(b"GGUF" + b"\x00" * 10)
    (plain / "loop").symlink_to(".")  # a directory link loop must not hang the walk
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "tokenizer.json").write_text("{}")
    (plain / "linked").symlink_to(extra)  # a linked directory is followed
    ident = model_manifest(plain)
    assert ident.revision is None and ident.hf_id is None
    assert set(ident.files) == {"w.gguf", "linked/tokenizer.json"}
    single = model_manifest(plain / "w.gguf")
    assert single.files == {"w.gguf": hashlib.sha256(b"GGUF" + b"\x00" * 10).hexdigest()}

    (plain / "dangling").symlink_to("missing-blob")
    with pytest.raises(ConfigError, match="dangling"):
        model_manifest(plain)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no files"):
        model_manifest(empty)
    with pytest.raises(ConfigError, match="does not exist"):
        model_manifest(tmp_path / "absent")


def test_manifest_text_format() -> None:
    entries = {"b": "2" * 64, "a/x": "1" * 64, "odd\nname": "3" * 64}
    assert manifest_text(entries) == (f"{'1' * 64}  a/x\n{'2' * 64}  b\n\\{'3' * 64}  odd\\nname\n")
    assert manifest_text({}) == ""


def test_sha256_file_streams_large_files(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)  # spans several 1 MiB blocks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    with pytest.raises(ConfigError, match="cannot read"):
        sha256_file(tmp_path / "missing")


def test_runtime_lock_of_an_interpreter() -> None:
    lock = runtime_lock(Path(sys.executable))
    assert lock["pytest"] == metadata.version("pytest")
    assert lock["pydantic"] == metadata.version("pydantic")
    assert lock["pydantic-core"] == metadata.version("pydantic_core")  # PEP 503 names
    assert list(lock) == sorted(lock)
    assert lock == runtime_lock_current()


def _install(site: Path, name: str, version: str) -> Path:
    """A distribution as pip leaves it: a <name>-<version>.dist-info with its METADATA."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def test_the_reused_lock_sees_an_install_a_removal_and_a_rewrite(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The lock read last is reused while its path is unchanged (identity.pyenv): every
    # change a leg's lock must show still shows, in the harness's lock and an engine's.
    python = Path(sys.executable)
    runtime_lock(python), runtime_lock(python)  # a lock to reuse, taken before the path moved
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))  # the engine interpreter's path too

    moments = iter(range(1, 100))

    def changed(*paths: Path) -> None:
        # Seconds apart, as a pip install between two legs is: importlib.metadata itself
        # caches a directory's listing by its mtime, and two changes inside one clock tick
        # of the filesystem would read as one there. Only what the change touched moves.
        stamp = 1_700_000_000 + next(moments)
        for path in paths:
            os.utime(path, (stamp, stamp))

    def locks() -> tuple[str | None, str | None]:
        return (runtime_lock_current().get("tokrecord-probe-dist"),
                runtime_lock(python).get("tokrecord-probe-dist"))

    assert locks() == (None, None)
    assert locks() == (None, None)  # reused now: the engine's path is known
    info = _install(site, "tokrecord_probe_dist", "1.0")
    changed(site, info, info / "METADATA")
    assert locks() == ("1.0", "1.0")
    assert locks() == ("1.0", "1.0")
    # Rewritten in place, the directory kept (no pip does this, but a hand edit might).
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tokrecord_probe_dist\nVersion: 1.0.post1\n")
    changed(info / "METADATA")
    assert locks() == ("1.0.post1", "1.0.post1")
    shutil.rmtree(info)
    info = _install(site, "tokrecord_probe_dist", "2.0")  # an upgrade: a new directory
    changed(site, info, info / "METADATA")
    assert locks() == ("2.0", "2.0")
    shutil.rmtree(info)
    changed(site)
    assert locks() == (None, None)


def test_runtime_lock_bad_interpreter(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot run"):
        runtime_lock(tmp_path / "no-python")


def test_python_site_packages() -> None:
    assert python_site_packages(Path(sys.executable)) == Path(sysconfig.get_paths()["purelib"])


def test_native_modules_glob(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "vllm" / "ops").mkdir(parents=True)
    (site / "vllm" / ".libs").mkdir()
    (site / "vllm" / "_C.abi3.so").write_bytes(b"elf-C")
    (site / "vllm" / "ops" / "_moe.so").write_bytes(b"elf-moe")
    (site / "vllm" / ".libs" / "libgomp.so").write_bytes(b"elf-gomp")
    (site / "vllm" / "ops" / "kernel.py").write_text("# not native")
    (site / "other").mkdir()
    (site / "other" / "x.so").write_bytes(b"elf-other")
    mods = native_modules(["vllm/**/*.so"], site)
    assert mods == {
        "vllm/.libs/libgomp.so": hashlib.sha256(b"elf-gomp").hexdigest(),
        "vllm/_C.abi3.so": hashlib.sha256(b"elf-C").hexdigest(),
        "vllm/ops/_moe.so": hashlib.sha256(b"elf-moe").hexdigest(),
    }
    assert list(mods) == sorted(mods)
    with pytest.raises(ConfigError, match="matched no file"):
        native_modules(["vllm/**/*.so", "xpu_kernels/*.so"], site)
    assert native_modules(["nothing/*.so"], site, require_match=False) == {}


def test_collect_identity(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("dirty\n")
    snap = make_hf_snapshot(tmp_path)
    spec = IdentitySpec(
        sources={"engine-src": SourceSpec(path=str(repo), public_base="base")},
        native_globs={"engine": ["pydantic_core/*.so"], "harness": ["pydantic_core/*.so"]},
        model_path=str(snap),
    )
    out = tmp_path / "identity"
    ident = collect_identity(spec, out, Path(sys.executable))
    assert sorted(p.name for p in out.iterdir()) == [
        "engine-src.bundle",
        "engine-src.dirty.patch",
        "engine-src.patch",
    ]
    src = ident.sources["engine-src"]
    assert src.dirty and src.commit == git(repo, "rev-parse", "HEAD")
    assert ident.native_modules["engine"] == ident.native_modules["harness"]
    assert any(k.startswith("pydantic_core/_pydantic_core") for k in ident.native_modules["engine"])
    assert ident.runtime_locks["engine"] == ident.runtime_locks["harness"]
    assert ident.model is not None and ident.model.revision == "abc123"
    assert ident.python.endswith(sys.version.split()[0])
    # The record round-trips through JSON, union discriminator included.
    assert Identity.model_validate_json(ident.model_dump_json()) == ident

    with pytest.raises(ConfigError, match="no engine Python"):
        collect_identity(IdentitySpec(native_globs={"engine": ["x/*.so"]}), tmp_path / "o2", None)
    with pytest.raises(ValidationError):
        IdentitySpec(native_globs={"gpu-env": ["x/*.so"]})
    with pytest.raises(ValidationError):
        IdentitySpec.model_validate({"sources": {}, "extra": 1})
