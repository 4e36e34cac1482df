"""What was going on around one leg: its covariates, from the telemetry already sampled.

Each fresh server has its own speed; these are the candidates for why (issue 33): the
GPU's utilisation, SM clock, power and temperature over the suite window, the host's
CPU frequency, utilisation and load average over the same window, the other busy
processes the idle gate saw before the leg, the server's ready time and the first
row's TTFT. They are diagnosis only: several of them (power, utilisation, TTFT) move
with the treatment itself, so none of them ever adjusts a verdict.

Pure functions over the sampler's lines (telemetry.jsonl), the idle gate's snapshots
(idle-before.jsonl) and the leg's own figures; ``covariates_from_run_dir`` is the one
reader, for evidence sealed before the leg summary carried them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from tokrecord.jsontypes import JSONObject

SCHEMA_COVARIATES: Final = "tokrecord.leg-covariates/v1"

# Names a noise diagnostic can test, with what each means; units are in the names.
COVARIATES: Final[dict[str, str]] = {
    "gpu_util_pct": "GPU utilisation, mean over the suite window",
    "sm_clock_mhz_mean": "SM clock, mean over the suite window",
    "sm_clock_mhz_min": "SM clock, lowest sample in the suite window",
    "gpu_power_w": "GPU power, mean over the suite window",
    "gpu_temp_c_max": "GPU temperature, highest in the suite window",
    "host_cpu_freq_mhz": "host CPU frequency, mean over the suite window",
    "host_cpu_pct": "host CPU utilisation, mean over the suite window",
    "host_load1": "host load average (1 min), mean over the suite window",
    "busy_processes": "other busy processes seen by the idle gate before the leg",
    "ready_s": "server ready time",
    "first_ttft_ms": "first row's TTFT",
}
# Those that do not depend on the server under test: everything else can be moved by the
# treatment (a faster arm keeps the GPU busier and draws more power), which is why a
# covariate explains variance and never adjusts a verdict.
EXTERNAL: Final = frozenset({"host_cpu_freq_mhz", "busy_processes"})


class LegCovariates(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: str = Field(default=SCHEMA_COVARIATES, alias="schema")
    samples_in_window: int = 0
    gpu_util_pct: float | None = None
    sm_clock_mhz_mean: float | None = None
    sm_clock_mhz_min: float | None = None
    gpu_power_w: float | None = None
    gpu_temp_c_max: float | None = None
    host_cpu_freq_mhz: float | None = None
    host_cpu_pct: float | None = None
    host_load1: float | None = None
    busy_processes: int | None = None
    busy_process_names: tuple[str, ...] = ()
    ready_s: float | None = None
    first_ttft_ms: float | None = None
    # Where they came from: "telemetry" (the samples) or "telemetry-summary" (only the
    # per-leg means survived, as in slimmed evidence).
    source: str = "telemetry"

    def values(self) -> dict[str, float | None]:
        return {name: (None if (v := getattr(self, name)) is None else float(v))
                for name in COVARIATES}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _nums(items: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    out = []
    for item in items:
        v = item.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return out


def busy_before(snapshots: Sequence[Mapping[str, Any]]) -> tuple[int | None, tuple[str, ...]]:
    """The busy processes of the idle gate's last snapshot before the leg (the one that let
    it start), by name; None when the gate kept no snapshot."""
    if not snapshots:
        return None, ()
    host = snapshots[-1].get("host")
    procs = host.get("busy_processes", []) if isinstance(host, Mapping) else []
    names = tuple(sorted(str(p.get("name", "?")) for p in procs if isinstance(p, Mapping)))
    return len(names), names


def leg_covariates(samples: Sequence[Mapping[str, Any]], window_ns: tuple[int, int] | None, *,
                   idle_before: Sequence[Mapping[str, Any]] = (), ready_s: float | None = None,
                   first_ttft_ms: float | None = None) -> LegCovariates:
    """A leg's covariates from its telemetry samples inside the suite window."""
    in_win = [s for s in samples
              if window_ns is not None and window_ns[0] <= int(s.get("t_ns", -1)) <= window_ns[1]]
    devices = [d for s in in_win for d in s.get("devices", []) if isinstance(d, Mapping)]
    hosts = [s["host"] for s in in_win if isinstance(s.get("host"), Mapping)]
    clocks = _nums(devices, "sm_clock_mhz")
    temps = _nums(devices, "temp_c")
    # Power per sample summed over devices (a two-GPU server draws on both), then averaged.
    power = [sum(p) for s in in_win
             if (p := _nums([d for d in s.get("devices", []) if isinstance(d, Mapping)], "power_w"))]
    busy, names = busy_before(idle_before)
    return LegCovariates(
        samples_in_window=len(in_win),
        gpu_util_pct=_mean(_nums(devices, "util_pct")),
        sm_clock_mhz_mean=_mean(clocks), sm_clock_mhz_min=min(clocks) if clocks else None,
        gpu_power_w=_mean(power), gpu_temp_c_max=max(temps) if temps else None,
        host_cpu_freq_mhz=_mean(_nums(hosts, "cpu_freq_mhz")),
        host_cpu_pct=_mean(_nums(hosts, "cpu_util_pct")),
        host_load1=_mean(_nums(hosts, "load1")),
        busy_processes=busy, busy_process_names=names,
        ready_s=ready_s, first_ttft_ms=first_ttft_ms,
    )


def from_telemetry_summary(telemetry: Mapping[str, Any] | None, *,
                           idle_before: Sequence[Mapping[str, Any]] = (),
                           ready_s: float | None = None,
                           first_ttft_ms: float | None = None) -> LegCovariates:
    """What survives when the samples were not kept: the per-leg means of telemetry.json
    (no SM clock, no host load or frequency)."""
    tel = telemetry or {}
    devices = [d for d in tel.get("devices", []) if isinstance(d, Mapping)]
    util = _nums(devices, "util_pct_mean")
    temps = _nums(devices, "temp_c_max")
    power = tel.get("power_w_mean")
    host = tel.get("host_cpu_util_pct_mean")
    busy, names = busy_before(idle_before)
    return LegCovariates(
        samples_in_window=int(tel.get("samples_in_window") or 0),
        gpu_util_pct=_mean(util), gpu_temp_c_max=max(temps) if temps else None,
        gpu_power_w=float(power) if isinstance(power, (int, float)) else None,
        host_cpu_pct=float(host) if isinstance(host, (int, float)) else None,
        busy_processes=busy, busy_process_names=names, ready_s=ready_s,
        first_ttft_ms=first_ttft_ms, source="telemetry-summary",
    )


# Evidence from strangers: no line or file is read past these.
_MAX_FILE_BYTES: Final = 64 * 2**20


def _read_jsonl(path: Path) -> list[JSONObject]:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_FILE_BYTES:
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut short by a kill: every earlier one was whole
        if isinstance(value, dict):
            out.append(value)
    return out


def _read_json(path: Path) -> Any:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_FILE_BYTES:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def covariates_from_run_dir(run_dir: Path) -> LegCovariates | None:
    """A leg's covariates recomputed from the files it kept (telemetry.jsonl, rows.json,
    idle-before.jsonl, summary.json); from telemetry.json's means where the samples were
    not kept. None when the leg kept no summary."""
    summary = _read_json(run_dir / "summary.json")
    if not isinstance(summary, dict):
        return None
    rows = _read_json(run_dir / "rows.json")
    rows = rows.get("rows", []) if isinstance(rows, dict) else []
    traces = [r["trace"] for r in rows if isinstance(r, dict) and isinstance(r.get("trace"), dict)]
    window = None
    sends = [t["t_send_ns"] for t in traces if isinstance(t.get("t_send_ns"), int)]
    ends = [t["t_end_ns"] for t in traces if isinstance(t.get("t_end_ns"), int)]
    if sends and ends:
        window = (min(sends), max(ends))
    first = rows[0].get("metrics") if rows and isinstance(rows[0], dict) else None
    ttft = first.get("ttft_ms") if isinstance(first, dict) else None
    ready = summary.get("ready_seconds")
    idle = _read_jsonl(run_dir / "idle-before.jsonl")
    ready_s = float(ready) if isinstance(ready, (int, float)) else None
    first_ttft_ms = float(ttft) if isinstance(ttft, (int, float)) else None
    samples = _read_jsonl(run_dir / "telemetry.jsonl")
    if samples:
        return leg_covariates(samples, window, idle_before=idle, ready_s=ready_s,
                              first_ttft_ms=first_ttft_ms)
    tel = summary.get("telemetry")
    return from_telemetry_summary(tel if isinstance(tel, dict) else None, idle_before=idle,
                                  ready_s=ready_s, first_ttft_ms=first_ttft_ms)
