"""LocalMaxxing's verified-run evidence, taken from a sealed record's facts and never invented.

The lmx CLI's reference ("Verified-run evidence" in cmd/lmx/skill/references/
speed-tests.md) lists what the service checks before it grants the verified-run
badge: the prompt and output (hash and sample), the engine's own timing report, the
engine's identity (version, repository, build, commit), the backend, the peak VRAM,
and the speculative counters and sampling settings in ``engineFlags``. Every function
here is pure: ``RecordFacts`` in, one field (or None, with the reason) out. A field the
record cannot support is left out and said so; the service then decides.

Definitions (also in the payload's notes):

* ``promptSample`` is the RFC 8785 JSON array of the prompts, the exact text
  ``promptSha256`` hashes; cut at the end (marked) when longer than the bound.
* ``outputSample`` is the RFC 8785 JSON array of the headline leg's outputs as
  streamed, row order; head and tail kept (marked) when longer than the bound.
  ``outputSha256`` stays the hash of the teacher's token ids (token-exact evidence).
* ``engineTimingsRaw`` is the engine's report, verbatim (see ``facts.EngineTimings``);
  when every row does not fit the size bound, the leading rows that do, the sums of
  every numeric field over all rows, and the sha256 of the full list of rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tokrecord.engines import engine_for, infer_engine
from tokrecord.evidence import canonical_json
from tokrecord.identity import SourceIdentity
from tokrecord.jsontypes import JSONObject
from tokrecord.probes.telemetry import TelemetrySummary
from tokrecord.submit import contract
from tokrecord.submit.facts import RecordFacts, sha256_of_json

GB: Final = 1e9  # LocalMaxxing quotes VRAM in decimal GB, as the hardware probes do


def cut(text: str, limit: int, tail: int = 0) -> tuple[str, bool]:
    """``text`` within ``limit`` characters: whole, or head + marker (+ the last ``tail``)."""
    if len(text) <= limit:
        return text, False
    marker = contract.SAMPLE_CUT
    head = limit - len(marker) - tail
    return text[:head] + marker + (text[len(text) - tail:] if tail else ""), True


def prompt_sample(facts: RecordFacts) -> tuple[str | None, str]:
    if not facts.prompts:
        return None, "promptSample: left out (the suite has no prompts)"
    text, was_cut = cut(canonical_json(list(facts.prompts)).decode("utf-8"), contract.PROMPT_SAMPLE_MAX)
    return text, ("promptSample: the JSON array promptSha256 hashes, suite.jsonl of leg "
                  f"{facts.leg}" + (f", cut to {contract.PROMPT_SAMPLE_MAX} characters" if was_cut else ""))


def output_sample(facts: RecordFacts) -> tuple[str | None, str]:
    if not any(facts.output_texts):
        return None, f"outputSample: left out (leg {facts.leg}'s rows carry no text)"
    text, was_cut = cut(canonical_json(list(facts.output_texts)).decode("utf-8"),
                        contract.OUTPUT_SAMPLE_MAX, contract.OUTPUT_SAMPLE_TAIL)
    return text, (f"outputSample: leg {facts.leg}'s outputs as streamed (rows.json), JSON array"
                  + (f", head and last {contract.OUTPUT_SAMPLE_TAIL} characters within "
                     f"{contract.OUTPUT_SAMPLE_MAX}" if was_cut else ""))


def _sums(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                sums[key] = sums.get(key, 0) + value
    return dict(sorted(sums.items()))


def engine_timings_raw(facts: RecordFacts) -> tuple[JSONObject | None, str]:
    t = facts.engine_timings
    if t is None:
        return None, (f"engineTimingsRaw: left out (the engine reported no timing of its own over "
                      f"leg {facts.leg}: no per-request timings in its stream, no timing "
                      "histograms on /metrics)")
    base: JSONObject = {"source": t.source, "leg": facts.leg}
    if not t.rows:
        return {**base, "metrics": dict(t.metrics)}, f"engineTimingsRaw: {t.source}"
    rows = [{"row": row_id, "timings": dict(obj)} for row_id, obj in t.rows]
    whole = {**base, "rows": rows}
    if contract.timings_size(whole) <= contract.ENGINE_TIMINGS_MAX_BYTES:
        return whole, f"engineTimingsRaw: {t.source}, all {len(rows)} rows"
    summary = {**base, "rows_total": len(rows), "rows_sha256": sha256_of_json(rows),
               "summed_over_rows": _sums([dict(obj) for _, obj in t.rows])}
    for keep in range(len(rows) - 1, -1, -1):
        candidate = {**summary, "rows": rows[:keep]}
        if contract.timings_size(candidate) <= contract.ENGINE_TIMINGS_MAX_BYTES:
            return candidate, (f"engineTimingsRaw: {t.source}; the first {keep} of {len(rows)} rows "
                               f"verbatim (all would exceed {contract.ENGINE_TIMINGS_MAX_BYTES} "
                               "bytes), sums over every row, sha256 of all rows")
    return None, "engineTimingsRaw: left out (even its summary exceeds the size bound)"


def peak_vram_gb(telemetry: TelemetrySummary | None) -> float | None:
    """The sum over accelerators of each one's highest memory use sampled in the leg's
    window; None when no device reported memory (CPU-only hosts, no telemetry)."""
    if telemetry is None:
        return None
    used = [d.mem_used_max_bytes for d in telemetry.devices if d.mem_used_max_bytes is not None]
    return round(sum(used) / GB, 3) if used and sum(used) > 0 else None


def kv_cache_dtype(argv: Sequence[str]) -> str | None:
    """The KV-cache dtype an explicit flag sets (engine defaults change between versions),
    as the adapter of the argv's engine reads it."""
    return engine_for(infer_engine(argv)).launch_facts(argv, {}).kv_cache_dtype


def _source(facts: RecordFacts, engine: str) -> tuple[str, SourceIdentity] | None:
    sources = facts.identity.sources if facts.identity else {}
    for name in (engine, engine.replace(".", "-"), engine.replace(".", "")):
        if name in sources:
            return name, sources[name]
    return None


def _upstream(engine: str) -> str | None:
    try:
        return engine_for(engine).repository
    except ValueError:
        return None


def engine_repository(facts: RecordFacts, engine: str) -> tuple[str | None, str]:
    """The engine's upstream repository, when the record shows the engine came from it: a
    released distribution (no source tree declared), or a source tree on a public base."""
    upstream = _upstream(engine)
    if upstream is None:
        return None, f"engineRepository: left out (tokrecord knows no upstream repository of {engine})"
    found = _source(facts, engine)
    if found is None:
        return upstream, (f"engineRepository: {engine}'s upstream (the engine ran from a released "
                          "distribution: no source tree declared in identity.json)")
    name, src = found
    if src.public_base_commit and src.base_is_ancestor:
        return upstream, (f"engineRepository: {engine}'s upstream; identity.json sources.{name} is "
                          f"built on public base {src.public_base_commit[:12]}")
    return None, (f"engineRepository: left out (identity.json sources.{name} declares no public base "
                  "it is built on, so its repository may be a fork)")


def engine_build(facts: RecordFacts, engine: str, packages: Sequence[str]) -> tuple[str | None, str]:
    """What the running server said of its build, else the declared source tree, else the
    first of the engine's ``packages`` (distributions) in a runtime lock."""
    reported = dict(facts.engine_reported or {})
    if reported.get("build_info"):
        return str(reported["build_info"])[:256], ("engineBuild: the running server's build_info "
                                                   f"(summary.json engine_version, leg {facts.leg})")
    found = _source(facts, engine)
    if found is not None:
        name, src = found
        text = f"{name} source tree at {src.commit[:12]}"
        if src.dirty_patch is not None:
            text += f" + uncommitted changes (patch sha256 {src.dirty_patch.sha256[:12]})"
        elif src.dirty:
            text += " + uncommitted changes"
        return text, f"engineBuild: identity.json sources.{name}"
    locks = facts.identity.runtime_locks if facts.identity else {}
    for env in ("engine", "harness"):
        for dist in packages:
            if dist in locks.get(env, {}):
                return (f"{dist}=={locks[env][dist]}",
                        f"engineBuild: the distribution in identity.json runtime_locks.{env}")
    return None, "engineBuild: left out (no build in the server's answers or the record's identity)"
