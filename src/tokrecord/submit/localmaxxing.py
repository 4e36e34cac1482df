"""LocalMaxxing (https://localmaxxing.com): the first leaderboard target.

``build_payload`` is pure: verified ``RecordFacts`` plus what the user had to
supply (``PayloadOptions``) in, a payload of the ``SpeedTest`` contract and the
derivation of every field out. It refuses rather than guesses: no Hugging Face
id is invented, no hardware is assumed, no quantization is inferred from a name.

``LocalMaxxing`` is the HTTP side: discovery through ``/api/openapi.json`` and
``/api/agent-context`` (which path the service takes: ``/api/speed-tests`` or the
older ``/api/benchmarks``), the ``/dry-run`` twin and its ``verification``, the send
with bounded 429 retries that honour ``retryAfterMs``, and the fetch of a public row
(a submission's, or a plan's prior). Connect timeouts are short: an unreachable
service is reported at once and the dry run falls back to the local schema.

``explain`` turns a failed exchange into something a person can act on: a 403 from
the CDN in front of the service (it blocks some default client user agents) is named
as such, a 401 says the key is missing or wrong (never what it is), a 400 lists the
service's field errors and its ``suggestedHfId``, a 429 says how long to wait.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple
from urllib.parse import quote, urlparse

import httpx
from pydantic import ValidationError

from tokrecord import __version__
from tokrecord.engines import FAKE_MODULE, EngineName, engine_for, infer_engine
from tokrecord.engines.base import LaunchFacts, SpeculativeConfig
from tokrecord.evidence.redact import is_secret_env, redact_argv
from tokrecord.evidence.stamp import Stamp, utc_stamp
from tokrecord.experiment.stats import VerdictAnalysis
from tokrecord.gates import SINGLE_ACTIVE_GENERATION
from tokrecord.identity import SourceIdentity
from tokrecord.identity.model import ModelIdentity
from tokrecord.jsontypes import JSONObject
from tokrecord.record.schema import AnyRecord, Hardware
from tokrecord.submit import contract, verified
from tokrecord.submit.facts import RecordFacts, SubmitError, median_low, output_sha256, prompt_sha256
from tokrecord.submit.quant import model_quantization
from tokrecord.submit.target import (
    Acceptance,
    ApiKey,
    Built,
    Discovery,
    Exchange,
    PayloadOptions,
    PublicRow,
    Sleep,
    Verification,
    with_retries,
)

NAME: Final = "localmaxxing"
DEFAULT_URL: Final = "https://localmaxxing.com"
URL_ENV: Final = "LOCALMAXXING_URL"
KEY_ENV: Final = "LOCALMAXXING_API_KEY"
USER_AGENT_ENV: Final = "LOCALMAXXING_USER_AGENT"
USER_AGENT: Final = f"tokrecord/{__version__} (+https://localmaxxing.com speed-test submission)"
SPEED_TESTS: Final = "/api/speed-tests"
BENCHMARKS: Final = "/api/benchmarks"  # the older name of the same endpoint
OPENAPI: Final = "/api/openapi.json"
AGENT_CONTEXT: Final = "/api/agent-context"
# Response headers worth keeping as evidence; everything else is noise.
KEPT_HEADERS: Final = ("content-type", "date", "location", "retry-after", "x-ratelimit-limit",
                       "x-ratelimit-remaining", "x-ratelimit-reset",
                       # Which CDN answered: a 403 from one is not the API's.
                       "server", "cf-ray", "cf-mitigated", "x-vercel-id", "x-vercel-mitigated")

# Device probe backend -> the compute backend it implies.
BACKENDS: Final = {"nvml": "cuda", "amd-smi": "rocm", "rocm-smi": "rocm", "xpu-smi": "xpu"}
SINGLE_ACTIVE: Final = SINGLE_ACTIVE_GENERATION  # the gate that proves a batch of one


# ------------------------------------------------------------------ command lines


def detect_engine(argv: Sequence[str]) -> str | None:
    """The engine an argv runs, by its program or module name (the engine adapters'
    inference); None when unknown, "tokrecord-fake" for the packaged fake server."""
    if FAKE_MODULE in argv:
        return "tokrecord-fake"
    engine = infer_engine(argv)
    return None if engine is EngineName.OPENAI else engine.value


def launch_facts(argv: Sequence[str], env: Mapping[str, str]) -> LaunchFacts:
    """The argv's settings as the adapter of the engine it runs reads them."""
    return engine_for(infer_engine(argv)).launch_facts(argv, env)


def quantization_from_argv(argv: Sequence[str]) -> tuple[str | None, str]:
    """(quantization, where from): an explicit ``--quantization`` wins over ``--dtype``."""
    facts = launch_facts(argv, {})
    return facts.quantization, facts.quantization_source


def _speculative(config: SpeculativeConfig | None) -> tuple[JSONObject, list[str]]:
    """The payload's speculative flags, from the engine adapter's reading of the argv."""
    if config is None:
        return {"specDecoding": False}, []
    out: JSONObject = {"specDecoding": True}
    if config.method != "unknown":
        out["specMethod"] = config.method
    if config.num_speculative_tokens is not None:
        out["specNumTokens"] = config.num_speculative_tokens
    if config.draft_model is not None:
        out["specModel"] = config.draft_model
    return out, list(config.notes)


def command_snippet(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The server command as run (placeholders kept), env first; credentials left out."""
    # Server env vars that may hold credentials never reach a public command snippet.
    hidden = sorted(k for k in env if is_secret_env(k))
    shown = [f"{k}={v}" for k, v in sorted(env.items()) if k not in hidden]
    args = redact_argv(argv)
    if args and args[0].rsplit("/", 1)[-1].startswith("python"):
        args[0] = "python"  # the interpreter's absolute path says nothing to a reader
    text = shlex.join([*shown, *args])
    notes = [f"server env {', '.join(hidden)} left out of commandSnippet (may hold credentials)"] \
        if hidden else []
    return text, notes


# ------------------------------------------------------------------------ payload


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _hardware(record: AnyRecord) -> JSONObject:
    hw = record.hardware
    if hw is None:
        raise SubmitError("record.json has no hardware section (it predates the hardware probes); "
                          "LocalMaxxing needs the hardware a record was measured on, and tokrecord "
                          "takes it only from the record's own probes — re-run the experiment")
    out: JSONObject = {"hwClass": hw.hw_class, "cpu": hw.cpu, "ramGb": hw.ram_gb, "os": hw.os}
    if hw.hw_class == "DISCRETE_GPU":
        out.update(gpuName=hw.gpu_name, gpuCount=hw.gpu_count, vramGb=hw.vram_gb)
    elif hw.hw_class == "UNIFIED" and hw.gpu_name:
        out["gpuName"] = hw.gpu_name
    return out


def _backend(hw: Hardware | None) -> str | None:
    if hw is None:
        return None
    if hw.hw_class == "CPU_ONLY":
        return "cpu"
    found = {BACKENDS.get(a.backend) for a in hw.accelerators}
    return found.pop() if len(found) == 1 and None not in found else None


def _model_field(known: str | None, key: str, given: str | None, option: str) -> tuple[str | None, str]:
    """A model field (hf_id, revision) identity.json knows, else the option given."""
    if known and given and known != given:
        raise SubmitError(f"the record's model identity says {key} {known!r}; {option} {given!r} "
                          "contradicts it")
    if known:
        return str(known), f"identity.json model.{key} (from the Hugging Face snapshot path)"
    if given:
        return given, f"{option} (the record's model is not a Hugging Face snapshot)"
    return None, f"unknown: the record does not name it and {option} was not given"


def _engine_packages(engine: str) -> tuple[str, ...]:
    """The distributions an engine's version is read from: its adapter's, in order."""
    if engine == "tokrecord-fake":
        return ("tokrecord",)
    try:
        return engine_for(engine).packages or (engine,)
    except ValueError:  # an engine named by --engine-name that tokrecord has no adapter for
        return (engine,)


def _engine_version(facts: RecordFacts, engine: str) -> tuple[str | None, str]:
    locks = facts.identity.runtime_locks if facts.identity else {}
    for env in ("engine", "harness"):
        lock = locks.get(env) or {}
        names = _engine_packages(engine)
        for name in (*names, *sorted(k for k in lock if k.startswith(names[0]))):
            if name in lock:
                return str(lock[name]), f"identity.json runtime_locks.{env}[{name}]"
    said = (facts.engine_reported or {}).get("version")
    if said:
        return str(said)[:64], f"what the running server said (summary.json engine_version, leg {facts.leg})"
    return None, "not in the record's runtime locks"


def _engine_commit(facts: RecordFacts, engine: str) -> tuple[str | None, str, list[str]]:
    identity = facts.identity
    if engine == "tokrecord-fake":
        tok = identity.tokrecord if identity else None
        if isinstance(tok, SourceIdentity):
            return tok.commit, "identity.json tokrecord.commit", \
                (["tokrecord's tree was dirty when measured"] if tok.dirty else [])
        return None, "tokrecord is an installed package, not a git checkout", []
    sources = identity.sources if identity else {}
    for name in (engine, engine.replace(".", "-"), engine.replace(".", "")):
        src = sources.get(name)
        if src is not None and src.commit:
            warn = [f"the {name} source tree was dirty when measured: engineCommit alone does not "
                    "describe the build (the dirty patch is in the record's identity evidence)"] \
                if src.dirty else []
            return src.commit, f"identity.json sources.{name}.commit", warn
    return None, f"no source tree named {engine!r} declared in the plan's [identity]", []


def _single_active(record: AnyRecord) -> bool:
    return record.shows_single_active()


def _interval(a: VerdictAnalysis | None) -> str:
    """The v2 verdict's interval, which rests on the between-leg noise ('' for v1, whose
    notes stay as they were)."""
    if a is None:
        return ""
    if a.ratio is None or a.ci_low is None or a.ci_high is None:
        return f" (no interval: {a.reason})"
    return (f" (candidate/control {a.ratio:.4f}, {100 * a.confidence:.0f} % CI "
            f"[{a.ci_low:.4f}, {a.ci_high:.4f}], leg-level t interval, df {a.df})")


def _where(facts: RecordFacts) -> str:
    """Which leg the headline is, of which record."""
    rec = facts.record
    named = rec.experiment_verdict()
    if named is None:
        return f"leg {facts.leg} of a single-leg record"
    experiment, verdict = named
    n = len(facts.candidate_legs) or 2
    which = "the lower of the two" if n == 2 else f"the lowest of the {n}"
    blocks = f" ({facts.blocks} blocks)" if facts.blocks > 1 else ""
    return (f"leg {facts.leg}, {which} candidate legs of ABBA experiment "
            f"{experiment}{blocks}; verdict {verdict.value}{_interval(rec.verdict_analysis)}")


def notes_text(facts: RecordFacts, out_sha: str | None) -> str:
    rec = facts.record
    parts = [
        f"tokrecord {__version__} sealed record, manifest sha256 {facts.manifest_sha256} "
        f"(plan sha256 {rec.plan_sha256}); check it with tokrecord verify.",
        f"tokSOut = median over {facts.rows} rows of the per-row rate over tokens 1..100 after the "
        f"first token, client timestamps, {facts.convention} convention: {facts.formula}; "
        f"{_where(facts)}; record status {rec.status}.",
        f"Same rows in other conventions: conventional {_fmt(facts.conventional_tok_s)}, legacy "
        f"inclusive-events {_fmt(facts.legacy_tok_s)}, chunk-aware {_fmt(facts.chunk_aware_tok_s)} "
        f"tok/s; per-token quantisation bound {_fmt(facts.quantisation_bound_pct, 2)} %.",
        "ttftMs = median over rows; promptTokens/outputTokens = lower median over rows; one request "
        "at a time, fresh server, no warmup, no cache.",
        "promptSha256 = sha256 of the RFC 8785 JSON array of the prompt strings in row order "
        "(promptSample: that array, cut when long; outputSample: the same form of the leg's "
        "outputs as streamed).",
    ]
    if out_sha is not None:
        parts.append("outputSha256 = sha256 of the RFC 8785 JSON array of the teacher's token-id "
                     f"arrays in row order; every row token-exact ({facts.teacher_exact_count}).")
    return " ".join(parts)


@dataclass
class _Derived:
    """Where each payload field came from, what a reader should know, and the inputs the
    record cannot supply (named together, in one message)."""

    derivation: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def build_payload(facts: RecordFacts, options: PayloadOptions) -> Built:
    """The LocalMaxxing payload of a verified record, with the source of every field."""
    if not facts.leg_valid:
        raise SubmitError(f"the headline leg {facts.leg} is not valid (a gate failed or a required "
                          "gate was not tested); a speed claim is submitted only from a valid leg")
    if facts.headline_tok_s is None:
        raise SubmitError(f"the headline leg {facts.leg} has no headline rate")
    notes = _Derived()
    weights = facts.identity.model if facts.identity else None
    hf_id, revision = _model_fields(weights, options, notes)
    hardware = _hardware(facts.record)
    notes.derivation.append("hardware: record.json hardware (the record's probes)")
    engine, version, commit = _engine_fields(facts, options, notes)
    launch = launch_facts(facts.server_argv, facts.server_env)
    quant = _quantization(launch, weights, options, notes)
    if notes.missing:
        raise SubmitError(f"{len(notes.missing)} input{'s' if len(notes.missing) > 1 else ''} the "
                          "record cannot supply; give:\n  " + "\n  ".join(notes.missing))
    single = _single_active(facts.record)
    flags = _engine_flags(facts, launch, single, notes)
    out_sha = _output_hash(facts, notes)
    extra = _verified_fields(facts, engine, notes)
    payload: JSONObject = {  # the service's wire form, checked by contract.SpeedTest
        "hfId": hf_id,
        "modelRevision": revision,
        "hardware": hardware,
        "engineName": engine,
        "engineVersion": version,
        "engineRepository": extra.engine_repository,
        "engineBuild": extra.engine_build,
        "engineCommit": commit,
        "quantization": quant,
        "backend": _backend(facts.record.hardware),
        "tokSOut": facts.headline_tok_s,
        "ttftMs": facts.ttft_ms,
        "peakVramGb": extra.peak_vram_gb,
        "promptTokens": median_low(facts.prompt_tokens),
        "outputTokens": median_low(facts.output_tokens),
        "contextLength": launch.context_length,
        "batchSize": 1 if single else None,
        "engineFlags": flags,
        "promptSha256": prompt_sha256(facts),
        "promptSample": extra.prompt_sample,
        "outputSha256": out_sha,
        "outputSample": extra.output_sample,
        "engineTimingsRaw": extra.engine_timings_raw,
        "notes": notes_text(facts, out_sha),
    }
    notes.derivation += _figure_sources(facts, payload, flags)
    return _validated(payload, notes)


def _model_fields(weights: ModelIdentity | None, options: PayloadOptions, notes: _Derived
                  ) -> tuple[str | None, str | None]:
    """hfId and modelRevision: what the record's model identity knows, else the options."""
    hf_id, why = _model_field(weights.hf_id if weights else None, "hf_id", options.hf_id, "--hf-id")
    if hf_id is None:
        notes.missing.append("--hf-id ORG/NAME: the model's upstream Hugging Face repo (the "
                             "record's model is not a Hugging Face snapshot; tokrecord never "
                             "invents one; add --model-revision when known)")
    notes.derivation.append(f"hfId: {why}")
    revision, why = _model_field(weights.revision if weights else None, "revision",
                                 options.model_revision, "--model-revision")
    notes.derivation.append(f"modelRevision: {why}")
    return hf_id, revision


def _engine_fields(facts: RecordFacts, options: PayloadOptions, notes: _Derived
                   ) -> tuple[str, str | None, str | None]:
    """engineName (the argv's, else --engine-name), its version and its commit."""
    detected = detect_engine(facts.server_argv)
    if detected and options.engine_name and options.engine_name != detected:
        raise SubmitError(f"the server argv runs {detected}; --engine-name {options.engine_name!r} "
                          "contradicts it")
    engine = detected or options.engine_name
    if engine is None:
        notes.missing.append("--engine-name: the server argv does not say which engine it runs "
                             f"(one of {', '.join(sorted(contract.KNOWN_ENGINES))})")
        engine = "unknown"
    notes.derivation.append(f"engineName: {'the server argv' if detected else '--engine-name'}")
    if engine not in contract.KNOWN_ENGINES:
        notes.warnings.append(f"engine {engine!r} is not among the engine names LocalMaxxing "
                              "lists; the service may refuse it")
    version, why = _engine_version(facts, engine)
    notes.derivation.append(f"engineVersion: {why}")
    commit, why, warn = _engine_commit(facts, engine)
    notes.derivation.append(f"engineCommit: {why}")
    notes.warnings += warn
    return engine, version, commit


def _quantization(launch: LaunchFacts, weights: ModelIdentity | None, options: PayloadOptions,
                  notes: _Derived) -> str | None:
    """--quantization, else the server argv's, else the model files'."""
    quant, why = launch.quantization, launch.quantization_source
    if options.quantization:
        notes.derivation.append(f"quantization: --quantization (the server argv says: {why})")
        return options.quantization
    if quant is not None:
        notes.derivation.append(f"quantization: the server argv, {why}")
        return quant
    quant, from_model = model_quantization(weights)
    if quant is None:
        notes.missing.append(f"--quantization: neither the server argv ({why}) nor the model "
                             f"({from_model}) says (e.g. fp16, bf16, fp8, AWQ, Q4_K_M)")
    else:
        notes.derivation.append(f"quantization: {from_model}")
    return quant


def _engine_flags(facts: RecordFacts, launch: LaunchFacts, single: bool,
                  notes: _Derived) -> JSONObject:
    """engineFlags: the adapter's reading of the argv, the engine's speculative counters,
    the request's temperature and the command itself."""
    flags, flag_notes = _speculative(launch.speculative)
    notes.warnings += flag_notes
    if flags.get("specDecoding"):
        if facts.draft_tokens is not None:
            flags["specDraftTokens"] = facts.draft_tokens
        if facts.accepted_draft_tokens is not None:
            flags["specAcceptedTokens"] = facts.accepted_draft_tokens
        if facts.draft_acceptance_rate is not None:
            flags["specAcceptanceRate"] = facts.draft_acceptance_rate
        if facts.emitted_tokens_per_draft_cycle is not None:
            flags["specMeanAcceptedLength"] = facts.emitted_tokens_per_draft_cycle
        if facts.draft_tokens is None or facts.accepted_draft_tokens is None:
            notes.warnings.append(f"speculative decoding is on, but leg {facts.leg} has no engine "
                                  "counter of draft and accepted tokens: "
                                  "specDraftTokens/specAcceptedTokens left out")
    if launch.tensor_parallel is not None:
        flags["tensorParallel"] = launch.tensor_parallel
    if launch.prefix_caching is not None:
        flags["prefixCaching"] = launch.prefix_caching
    if launch.kv_cache_dtype is not None:
        flags["kvCacheDtype"] = launch.kv_cache_dtype
    if single:
        flags["concurrency"] = 1
    flags["temperature"] = float(facts.request_extra.get("temperature", 0))
    snippet, snippet_notes = command_snippet(facts.server_argv, facts.server_env)
    flags["commandSnippet"] = snippet
    notes.warnings += snippet_notes
    notes.derivation.append(f"engineFlags: leg {facts.leg}'s server argv and env (config.json), "
                            "engine counters for the acceptance figures, the request's temperature")
    return flags


def _output_hash(facts: RecordFacts, notes: _Derived) -> str | None:
    """outputSha256, or why it is left out."""
    out_sha = output_sha256(facts)
    if out_sha is None:
        count = facts.teacher_exact_count
        all_exact = count is not None and "/" in count and len(set(count.split("/"))) == 1
        # Exact by text only (no token ids in the stream) is exact, but gives no token-id hash.
        why = (f"not every row was compared with the teacher by token ids "
               f"({facts.teacher_exact_by}), so there is no complete token-id array to hash"
               if all_exact and facts.teacher_exact_by else
               "its rows were compared with the teacher by text: the server streamed no token "
               "ids, so there is no token-id array to hash" if all_exact else
               f"not every row was token-exact against a teacher (teacher_exact: "
               f"{count or 'not tested'})")
        notes.warnings.append(f"outputSha256 left out for leg {facts.leg}: {why}")
    return out_sha


class _Verified(NamedTuple):
    engine_repository: str | None
    engine_build: str | None
    prompt_sample: str | None
    output_sample: str | None
    engine_timings_raw: Mapping[str, Any] | None
    peak_vram_gb: float | None


def _verified_fields(facts: RecordFacts, engine: str, notes: _Derived) -> _Verified:
    """The fields the verified-run badge asks for (submit.verified), by payload name."""
    repository, why = verified.engine_repository(facts, engine)
    notes.derivation.append(why)
    build, why = verified.engine_build(facts, engine, _engine_packages(engine))
    notes.derivation.append(why)
    p_sample, why = verified.prompt_sample(facts)
    notes.derivation.append(why)
    o_sample, why = verified.output_sample(facts)
    notes.derivation.append(why)
    timings, why = verified.engine_timings_raw(facts)
    notes.derivation.append(why)
    if timings is None:
        notes.warnings.append(why.removeprefix("engineTimingsRaw: left out ").strip("()")
                              + ": engineTimingsRaw left out, which the verified-run badge asks for")
    vram = verified.peak_vram_gb(facts.telemetry)
    notes.derivation.append(
        f"peakVramGb: leg {facts.leg}'s telemetry, the sum over accelerators of each one's "
        "highest memory use in the suite window" if vram is not None else
        "peakVramGb: left out (no accelerator memory in the leg's telemetry)")
    return _Verified(repository, build, p_sample, o_sample, timings, vram)


def _figure_sources(facts: RecordFacts, payload: Mapping[str, Any],
                    flags: Mapping[str, Any]) -> list[str]:
    return [
        f"tokSOut: metric_accounting.published_value_tok_s ({facts.convention} convention, leg {facts.leg})",
        f"ttftMs: leg {facts.leg} ttft median",
        f"promptTokens/outputTokens: leg {facts.leg} rows.json, lower median over rows",
        f"backend: {payload['backend']}, from the hardware class and the probes' device backends"
        if payload["backend"] else "backend: left out (not implied by the probes)",
        "batchSize: 1, from the single_active_generation gate" if payload["batchSize"] else
        "batchSize: left out (single active generation not proven)",
        "promptSha256/outputSha256: see notes for the exact definitions",
        "concurrency: 1, from the single_active_generation gate" if flags.get("concurrency") else
        "concurrency: left out (single active generation not proven)",
    ]


def _validated(payload: Mapping[str, Any], notes: _Derived) -> Built:
    try:
        model = contract.SpeedTest.model_validate({k: v for k, v in payload.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise SubmitError(f"the record does not make a valid LocalMaxxing payload: {problems}") from exc
    return Built(payload=model.wire(), derivation=tuple(notes.derivation),
                 warnings=tuple(notes.warnings))


# --------------------------------------------------------------------------- HTTP


def _json_schema_props(doc: Mapping[str, Any], path: str) -> tuple[tuple[str, ...] | None,
                                                                  tuple[str, ...] | None]:
    """Top-level properties and required names of ``POST path``'s JSON body, when declared."""
    try:
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            node: Any = doc
            for part in ref[2:].split("/"):
                node = node[part]
            schema = node
        props = tuple(sorted(schema.get("properties") or {}))
        required = tuple(sorted(schema.get("required") or ()))
        return (props or None), required
    except (KeyError, TypeError, AttributeError):
        return None, None


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process, shared by the clients: each new one loads
    the CA bundle again (some 20 ms of CPU), and a submission opens several."""
    return httpx.create_ssl_context()


class LocalMaxxing:
    """The LocalMaxxing service at ``base_url`` (the public site, or a stand-in)."""

    name = NAME
    key_env = KEY_ENV
    key_pattern = contract.KEY_PATTERN

    def __init__(self, base_url: str = DEFAULT_URL, *, transport: httpx.BaseTransport | None = None,
                 connect_timeout_s: float = 3.0, timeout_s: float = 30.0,
                 user_agent: str = USER_AGENT) -> None:
        self.base_url = base_url.rstrip("/")
        self.user_agent = user_agent
        self._client = httpx.Client(
            base_url=self.base_url, transport=transport, follow_redirects=False, verify=_tls(),
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers={"User-Agent": user_agent, "Accept": "application/json"})

    def close(self) -> None:
        self._client.close()

    # -- pure parts

    def build(self, facts: RecordFacts, options: PayloadOptions) -> Built:
        return build_payload(facts, options)

    def validate(self, payload: Mapping[str, Any]) -> list[str]:
        return contract.issues(payload)

    # -- HTTP

    def _request(self, method: str, path: str, *, body: bytes | None = None, key: ApiKey | None = None,
                 waited_s: float = 0.0) -> Exchange:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if key is not None:
            headers.update(key.header())
        url = self.base_url + path
        utc = utc_stamp(Stamp.MICROSECONDS)
        try:
            response = self._client.request(method, path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            message = f"{type(exc).__name__}: {exc}"
            return Exchange(method, url, None, {}, None, utc,
                            error=key.scrub(message) if key else message, waited_s=waited_s)
        text = response.text
        if key is not None:
            text = key.scrub(text)
        parsed: Any
        try:
            parsed = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text
        kept = {k: (key.scrub(v) if key else v) for k, v in response.headers.items() if k in KEPT_HEADERS}
        return Exchange(method, url, response.status_code, kept, parsed, utc, waited_s=waited_s)

    def discover(self) -> Discovery:
        notes: list[str] = []
        openapi = self._request("GET", OPENAPI)
        if openapi.status is None:
            return Discovery(False, SPEED_TESTS, SPEED_TESTS + "/dry-run",
                             (f"{self.base_url} not reachable ({openapi.error}); endpoint paths "
                              "are the documented defaults",))
        submit_path: str | None = None
        dry_path: str | None = None
        declared: tuple[str, ...] | None = None
        required: tuple[str, ...] | None = None
        openapi_sha: str | None = None
        if openapi.status == 200 and isinstance(openapi.body, dict):
            openapi_sha = hashlib.sha256(json.dumps(openapi.body, sort_keys=True).encode()).hexdigest()
            paths = openapi.body.get("paths") or {}
            for candidate in (SPEED_TESTS, BENCHMARKS):
                if candidate in paths:
                    submit_path = candidate
                    break
            if submit_path is None:
                notes.append(f"openapi.json declares neither {SPEED_TESTS} nor {BENCHMARKS}")
            else:
                notes.append(f"openapi.json declares {submit_path}")
                if submit_path + "/dry-run" in paths:
                    dry_path = submit_path + "/dry-run"
                else:
                    notes.append(f"openapi.json declares no {submit_path}/dry-run")
                declared, required = _json_schema_props(openapi.body, submit_path)
        else:
            notes.append(f"openapi.json: HTTP {openapi.status}")
        context = self._request("GET", AGENT_CONTEXT)
        context_sha: str | None = None
        if context.status == 200 and isinstance(context.body, dict):
            context_sha = hashlib.sha256(json.dumps(context.body, sort_keys=True).encode()).hexdigest()
            meta = context.body.get("_meta") or {}
            notes.append("agent-context found")
            if submit_path is None:
                # "POST https://host/api/benchmarks" → the path part.
                for key_name, setter in (("submitEndpoint", "submit"), ("dryRunEndpoint", "dry")):
                    text = str(meta.get(key_name) or "").split()[-1:] or [""]
                    path = urlparse(text[0]).path
                    if path.startswith("/api/"):
                        if setter == "submit":
                            submit_path = path
                        else:
                            dry_path = path
                if submit_path:
                    notes.append(f"agent-context names {submit_path}")
        else:
            notes.append(f"agent-context: {context.error or f'HTTP {context.status}'}")
        submit_path = submit_path or SPEED_TESTS
        return Discovery(True, submit_path, dry_path or submit_path + "/dry-run", tuple(notes),
                         openapi_sha, context_sha, declared, required)

    def dry_run(self, body: bytes, key: ApiKey | None, discovery: Discovery) -> Exchange:
        return self._request("POST", discovery.dry_run_path, body=body, key=key)

    def send(self, body: bytes, key: ApiKey, discovery: Discovery, *, sleep: Sleep, max_retries: int,
             max_wait_s: float) -> list[Exchange]:
        """POST once, then again after each 429's ``retryAfterMs`` (bounded in count and time)."""
        return with_retries(
            lambda waited: self._request("POST", discovery.submit_path, body=body, key=key,
                                         waited_s=waited),
            retry_after_s, sleep=sleep, max_retries=max_retries, max_wait_s=max_wait_s)

    def verification(self, exchange: Exchange) -> Verification | None:
        """The dry run's ``verification`` ({verified, issues}); None when it gave none."""
        body = exchange.body
        if exchange.status not in (200, 201) or not isinstance(body, Mapping):
            return None
        try:
            v = contract.Verification.model_validate(body.get("verification"))
        except ValidationError:
            return None
        return Verification(v.verified, tuple(_issue_text(i) for i in v.issues))

    def retry_after(self, exchange: Exchange) -> float | None:
        return retry_after_s(exchange)

    def public_row(self, exchange: Exchange) -> PublicRow | None:
        if exchange.status != 200:
            return None
        row = self.row_fields(exchange.body)
        tok = row.get("tokSOut")
        status, created = row.get("status"), row.get("createdAt")
        return PublicRow(fields=row, status=str(status) if status is not None else None,
                         created_at=str(created) if created is not None else None,
                         tok_s=float(tok) if isinstance(tok, int | float) and not isinstance(tok, bool)
                         else None)

    def explain(self, exchange: Exchange, key: ApiKey | None) -> str:
        return explain(exchange, key, self.user_agent)

    def accept(self, exchange: Exchange) -> Acceptance:
        rate = {k: v for k, v in exchange.headers.items() if k.startswith("x-ratelimit-")}
        if exchange.status in (200, 201) and isinstance(exchange.body, dict):
            try:
                response = contract.SubmissionResponse.model_validate(exchange.body)
            except ValidationError:
                return Acceptance(False, None, None, None, [], rate)
            return Acceptance(True, response.id, response.status, response.verifiedRun,
                              list(response.verificationIssues), rate)
        return Acceptance(False, None, None, None, [], rate)

    def fetch(self, submission_id: str, discovery: Discovery) -> Exchange:
        return self._request("GET", f"{discovery.submit_path}/{quote(submission_id, safe='')}")

    def row_fields(self, row: Any) -> Mapping[str, Any]:
        if not isinstance(row, Mapping):
            return {}
        if "tokSOut" not in row:
            # Some list/detail routes wrap the row; unwrap one level.
            for wrapper in ("speedTest", "benchmark", "data", "result"):
                inner = row.get(wrapper)
                if isinstance(inner, Mapping):
                    return inner
        return row


def retry_after_s(exchange: Exchange) -> float | None:
    """Seconds to wait after a 429: the body's ``retryAfterMs``, else the Retry-After header."""
    body = exchange.body
    if isinstance(body, dict):
        ms = body.get("retryAfterMs")
        if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
            return float(ms) / 1000.0
    header = exchange.headers.get("retry-after")
    if header is not None:
        try:
            return max(0.0, float(header))
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------------- errors


def _issue_text(issue: Any) -> str:
    """One field error as ``field: message``, whatever shape the service gave it."""
    if isinstance(issue, Mapping):
        where = issue.get("path") or issue.get("field") or issue.get("loc")
        if isinstance(where, list | tuple):
            where = ".".join(str(p) for p in where)
        message = issue.get("message") or issue.get("msg") or json.dumps(issue, sort_keys=True)
        return f"{where}: {message}" if where else str(message)
    return str(issue)


def field_errors(body: Any) -> list[str]:
    """The service's field errors in a 400 body: ``issues``/``errors`` lists, or a
    ``fieldErrors`` mapping (field -> messages), at the top level or under ``details``."""
    if not isinstance(body, Mapping):
        return []
    out: list[str] = []
    for node in (body, body.get("details"), body.get("error")):
        if not isinstance(node, Mapping):
            continue
        for name in ("issues", "errors"):
            value = node.get(name)
            if isinstance(value, list):
                out += [_issue_text(i) for i in value]
            elif isinstance(value, Mapping):
                out += [f"{k}: {'; '.join(map(str, v)) if isinstance(v, list) else v}"
                        for k, v in value.items()]
        fields = node.get("fieldErrors")
        if isinstance(fields, Mapping):
            out += [f"{k}: {'; '.join(map(str, v)) if isinstance(v, list) else v}"
                    for k, v in fields.items()]
    return list(dict.fromkeys(out))


def _error_text(body: Any) -> str:
    if isinstance(body, Mapping):
        for name in ("error", "message", "detail"):
            if isinstance(body.get(name), str):
                return str(body[name])
        return json.dumps(body, sort_keys=True)[:300]
    return str(body or "")[:300]


def from_cdn(exchange: Exchange) -> bool:
    """A response the CDN in front of the service wrote, not the API: an HTML (or other
    non-JSON) body, or a CDN's own mitigation header."""
    h = exchange.headers
    if h.get("cf-mitigated") or h.get("x-vercel-mitigated"):
        return True
    return not isinstance(exchange.body, Mapping) and (
        "json" not in h.get("content-type", "") or bool(h.get("cf-ray") or h.get("x-vercel-id")))


def explain(exchange: Exchange, key: ApiKey | None, user_agent: str) -> str:
    """What went wrong with ``exchange``, said so that a person can act on it."""
    where = f"{exchange.method} {exchange.url}"
    status = exchange.status
    if status is None:
        return f"{where}: no response ({exchange.error})"
    if status == 403 and from_cdn(exchange):
        server = exchange.headers.get("server")
        return (f"{where}: HTTP 403 from the CDN in front of the service{f' ({server})' if server else ''}, "
                "not from the API: it blocks some default client user agents. This request sent "
                f"User-Agent {user_agent!r}; set ${USER_AGENT_ENV} to another one (or try another "
                "network) and run again")
    if status == 401:
        which = ("no key was sent" if key is None else
                 f"the key from {key.source} was refused: it is missing on the service or wrong")
        return (f"{where}: HTTP 401, the API key is missing or wrong ({which}); put a valid bhk_ key "
                f"from your LocalMaxxing account in ${KEY_ENV} (it is read from there only, and "
                "never printed or stored)")
    if status == 403:
        return f"{where}: HTTP 403 from the API: {_error_text(exchange.body)}"
    if status in (400, 422):
        errors = field_errors(exchange.body)
        text = f"{where}: HTTP {status}, the service refused the payload: {_error_text(exchange.body)}"
        if errors:
            text += "; field errors: " + "; ".join(errors)
        suggested = exchange.body.get("suggestedHfId") if isinstance(exchange.body, Mapping) else None
        if suggested:
            text += f"; the service suggests hfId {suggested!r} (give it with --hf-id)"
        return text
    if status == 429:
        delay = retry_after_s(exchange)
        return (f"{where}: HTTP 429, rate limited" + (f"; the service asks to wait {delay:.1f} s, more "
                "than the bounds allow (raise --max-wait-s, or try later)" if delay is not None else
                "; the service did not say for how long: try later"))
    return f"{where}: HTTP {status}: {_error_text(exchange.body)}"
