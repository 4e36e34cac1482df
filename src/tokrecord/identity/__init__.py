"""Identity: what exactly was measured.

A speed figure is only reproducible against named bytes: the source commits
(and, for private work, a bundle and patch against a public base), the native
modules actually loaded, the exact package versions, and the model files. Each
function here returns a frozen model of those facts; `collect_identity` gathers
them all for one run and writes the source evidence files into the run directory.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokrecord.errors import ConfigError
from tokrecord.identity.hashing import BLOCK_SIZE, hash_file, manifest_text, sha256_file
from tokrecord.identity.model import ModelIdentity, hf_snapshot, model_manifest
from tokrecord.identity.pyenv import (
    current_lib_dirs,
    native_modules,
    native_modules_in,
    normalize_name,
    python_lib_dirs,
    python_site_packages,
    runtime_lock,
    runtime_lock_current,
)
from tokrecord.identity.source import (
    EvidenceFile,
    PackageIdentity,
    SourceIdentity,
    check_source_name,
    source_identity,
    tokrecord_identity,
)

__all__ = [
    "BLOCK_SIZE",
    "ENV_ENGINE",
    "ENV_HARNESS",
    "EvidenceFile",
    "Identity",
    "IdentitySpec",
    "ModelIdentity",
    "PackageIdentity",
    "SourceIdentity",
    "SourceSpec",
    "collect_identity",
    "hash_file",
    "hf_snapshot",
    "manifest_text",
    "model_manifest",
    "native_modules",
    "normalize_name",
    "python_site_packages",
    "runtime_lock",
    "runtime_lock_current",
    "sha256_file",
    "source_identity",
    "tokrecord_identity",
]

# Python environments a spec can name: the engine's (its interpreter is given
# to collect_identity) and the harness's own (the running interpreter).
ENV_ENGINE = "engine"
ENV_HARNESS = "harness"
_ENVS = (ENV_ENGINE, ENV_HARNESS)


class SourceSpec(BaseModel):
    """A declared source tree: its checkout, and optionally the public commit it builds on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    public_base: str | None = None


class IdentitySpec(BaseModel):
    """What to identify for a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sources: dict[str, SourceSpec] = Field(default_factory=dict)
    # Python env name ("engine" or "harness") -> globs relative to its site-packages.
    native_globs: dict[str, list[str]] = Field(default_factory=dict)
    model_path: str | None = None

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: dict[str, SourceSpec]) -> dict[str, SourceSpec]:
        for name in value:
            try:
                check_source_name(name)
            except ConfigError as exc:
                # pydantic turns ValueError (not our ConfigError) into a ValidationError.
                raise ValueError(str(exc)) from exc
        return value

    @field_validator("native_globs")
    @classmethod
    def _env_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = sorted(set(value) - set(_ENVS))
        if unknown:
            raise ValueError(f"unknown Python environment(s) {unknown}; known: {list(_ENVS)}")
        return value


class Identity(BaseModel):
    """Everything that names what was measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokrecord: Annotated[SourceIdentity | PackageIdentity, Field(discriminator="kind")]
    sources: dict[str, SourceIdentity]
    native_modules: dict[str, dict[str, str]]  # env name -> {relative path: sha256}
    runtime_locks: dict[str, dict[str, str]]  # env name -> {package: version}
    model: ModelIdentity | None
    # Per arm, the draft model its speculative decoding names (when it is a local path).
    drafts: dict[str, ModelIdentity] = Field(default_factory=dict)
    python: str  # the harness's interpreter version
    platform: str


def collect_identity(spec: IdentitySpec, out_dir: Path, engine_python: Path | None,
                     drafts: Mapping[str, Path] | None = None) -> Identity:
    """Gather the identity of a run; bundles and patches of the sources go into `out_dir`.

    Runtime locks are taken for the harness and, when `engine_python` is given,
    for the engine's environment.
    """
    if ENV_ENGINE in spec.native_globs and engine_python is None:
        raise ConfigError("native module globs name the engine environment, but no engine Python was given")

    sources = {
        name: source_identity(
            Path(src.path).expanduser(), public_base=src.public_base, out_dir=out_dir, name=name
        )
        for name, src in sorted(spec.sources.items())
    }

    native: dict[str, dict[str, str]] = {}
    for env, globs in sorted(spec.native_globs.items()):
        if env == ENV_ENGINE:
            assert engine_python is not None
            roots = python_lib_dirs(engine_python)
        else:
            roots = current_lib_dirs()
        native[env] = native_modules_in(globs, roots)

    locks = {ENV_HARNESS: runtime_lock_current()}
    if engine_python is not None:
        locks[ENV_ENGINE] = runtime_lock(engine_python)

    model = model_manifest(Path(spec.model_path).expanduser()) if spec.model_path is not None else None

    return Identity(
        tokrecord=tokrecord_identity(),
        sources=sources,
        native_modules=native,
        runtime_locks=dict(sorted(locks.items())),
        model=model,
        drafts={arm: model_manifest(path) for arm, path in sorted((drafts or {}).items())},
        python=f"{platform.python_implementation()} {platform.python_version()}",
        platform=platform.platform(),
    )
