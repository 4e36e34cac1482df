"""The LocalMaxxing speed-test contract as pydantic models: the "local schema".

Written from the public documentation of ``POST /api/speed-tests`` (formerly
``/api/benchmarks``) as known when this was built; the live service publishes
``/api/openapi.json`` and ``/api/agent-context``, which ``tokrecord submit`` reads
at run time when reachable and which win over this file. What is an assumption
here rather than documented is marked as such, so a mismatch found at run time
points at the right line.

Field names are the wire names (camelCase) on purpose: a payload is
``model_dump(exclude_none=True)`` with nothing renamed in between, so what is
validated is byte for byte what is sent. Unknown fields are refused locally
(``extra="forbid"``) because a misspelt optional field would otherwise be
dropped silently by the service.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import rfc8785
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from tokrecord.jsontypes import JSONObject

SCHEMA_NAME: Final = "localmaxxing.speed-test/local-v1"
KEY_PATTERN: Final = r"^bhk_[0-9a-fA-F]{40}$"

# Verified-run evidence bounds. The lmx CLI's reference (cmd/lmx/skill/references/
# speed-tests.md, "Verified-run evidence") names the fields but not their limits; these
# are the limits public submitters work to (a 2000-character prompt sample, a
# 4000-character output sample kept as head and tail, an engineTimingsRaw object of at
# most 8192 bytes): assumptions until the live openapi.json says otherwise.
PROMPT_SAMPLE_MAX: Final = 2000
OUTPUT_SAMPLE_MAX: Final = 4000
OUTPUT_SAMPLE_TAIL: Final = 1000  # characters of the end kept when an output is cut
ENGINE_TIMINGS_MAX_BYTES: Final = 8192  # of its RFC 8785 JSON
SAMPLE_CUT: Final = "\n…\n"  # stands for what a cut sample left out

# Engine names the service lists as accepted (agent-context, 2026); others are
# sent as they are and flagged, since the list grows server-side.
KNOWN_ENGINES: Final = frozenset({
    "llama.cpp", "vllm", "sglang", "ollama", "lmstudio", "exllamav2", "tgi", "tensorrt-llm",
    "mlx", "text-generation-webui", "lmdeploy", "mlc-llm", "hipfire", "tinygrad",
})

Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# Lengths: hfId 256, engineName and quantization 64 are documented; the others
# are local bounds (assumptions) that keep a runaway string out of a payload.
HfId = Annotated[str, StringConstraints(min_length=3, max_length=256,
                                        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")]
Short = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Long = Annotated[str, StringConstraints(min_length=1, max_length=4000)]
Positive = Annotated[float, Field(gt=0)]
PromptSample = Annotated[str, StringConstraints(min_length=1, max_length=PROMPT_SAMPLE_MAX)]
OutputSample = Annotated[str, StringConstraints(min_length=1, max_length=OUTPUT_SAMPLE_MAX)]
# Documented by the lmx CLI: "7-64 character hexadecimal Git commit".
Commit = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{7,64}$")]
Count = Annotated[int, Field(ge=0)]


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class DiscreteGpu(_Wire):
    hwClass: Literal["DISCRETE_GPU"]
    gpuName: Text
    gpuCount: int = Field(ge=1)
    vramGb: Positive
    cpu: Text
    ramGb: Positive
    os: Text


class Unified(_Wire):
    """Unified memory (Apple silicon, GB10, Strix Halo). The exact field set is an
    assumption: the documented hardware union names the class, not its fields."""

    hwClass: Literal["UNIFIED"]
    gpuName: Text | None = None
    cpu: Text
    ramGb: Positive
    os: Text


class CpuOnly(_Wire):
    hwClass: Literal["CPU_ONLY"]
    cpu: Text
    ramGb: Positive
    os: Text


Hardware = Annotated[DiscreteGpu | Unified | CpuOnly, Field(discriminator="hwClass")]


class EngineFlags(_Wire):
    tensorParallel: int | None = Field(default=None, ge=1)
    specDecoding: bool | None = None
    specMethod: Short | None = None
    specNumTokens: int | None = Field(default=None, ge=1)
    specModel: Text | None = None
    specDraftTokens: Count | None = None
    specAcceptedTokens: Count | None = None
    specAcceptanceRate: float | None = Field(default=None, ge=0, le=1)
    specMeanAcceptedLength: float | None = Field(default=None, ge=1)
    prefixCaching: bool | None = None
    kvCacheDtype: Short | None = None
    concurrency: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    commandSnippet: Long | None = None


class SpeedTest(_Wire):
    """One speed-test submission (the request body of ``POST /api/speed-tests``)."""

    hfId: HfId
    hardware: Hardware
    engineName: Short
    quantization: Short
    tokSOut: Positive
    tokSPrefill: Positive | None = None
    tokSTotal: Positive | None = None
    ttftMs: Positive | None = None
    peakVramGb: Positive | None = None
    modelRevision: Text | None = None
    engineVersion: Short | None = None
    engineRepository: Text | None = None
    engineBuild: Text | None = None
    engineCommit: Commit | None = None
    backend: Short | None = None
    promptTokens: int | None = Field(default=None, ge=1)
    outputTokens: int | None = Field(default=None, ge=1)
    contextLength: int | None = Field(default=None, ge=1)
    batchSize: int | None = Field(default=None, ge=1)
    notes: Long | None = None
    engineFlags: EngineFlags | None = None
    promptSha256: Sha256Hex | None = None
    promptSample: PromptSample | None = None
    outputSha256: Sha256Hex | None = None
    outputSample: OutputSample | None = None
    # The engine's own timing object, sent as JSON (what public verified runs send).
    engineTimingsRaw: JSONObject | None = None

    @model_validator(mode="after")
    def _one_more_metric(self) -> SpeedTest:
        # Documented: tokSOut plus at least one of these.
        if all(v is None for v in (self.tokSPrefill, self.tokSTotal, self.ttftMs, self.peakVramGb)):
            raise ValueError("give at least one of tokSPrefill, tokSTotal, ttftMs, peakVramGb "
                             "besides tokSOut")
        return self

    @field_validator("engineTimingsRaw")
    @classmethod
    def _timings_bounded(cls, value: JSONObject | None) -> JSONObject | None:
        if value is not None and (size := timings_size(value)) > ENGINE_TIMINGS_MAX_BYTES:
            raise ValueError(f"is {size} bytes of JSON; at most {ENGINE_TIMINGS_MAX_BYTES}")
        return value

    def wire(self) -> JSONObject:
        """The JSON body to send: absent optional fields are left out, not sent as null."""
        return self.model_dump(mode="json", exclude_none=True)


def timings_size(value: Any) -> int:
    """Bytes of ``value`` as RFC 8785 JSON: how the engineTimingsRaw bound is measured."""
    return len(rfc8785.dumps(value))


class SubmissionResponse(BaseModel):
    """The 201 body. Lenient (extra fields kept): the service may add to it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str = Field(min_length=1)
    status: str
    verifiedRun: bool | None = None
    verificationIssues: list[Any] = Field(default_factory=list)


class Verification(BaseModel):
    """The dry run's ``verification`` object: would this run get the verified-run badge."""

    model_config = ConfigDict(frozen=True, extra="allow")

    verified: bool
    issues: list[Any] = Field(default_factory=list)


# What a public row's ``status`` can say; the last two are final.
PENDING: Final = "PENDING"
APPROVED: Final = "APPROVED"
REJECTED: Final = "REJECTED"
FINAL_STATUSES: Final = frozenset({APPROVED, REJECTED})


def issues(payload: Any) -> list[str]:
    """Every reason ``payload`` breaks the local schema, as ``field: message``; [] when valid."""
    try:
        SpeedTest.model_validate(payload)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc']) or '(payload)'}: {e['msg']}" for e in exc.errors()]
    return []


def json_schema() -> JSONObject:
    """The local schema as JSON Schema (what the stand-in's openapi.json publishes)."""
    return SpeedTest.model_json_schema()
