"""AMD GPUs through `amd-smi metric --json`, or the older `rocm-smi --json`.

amd-smi wraps readings as {"value": v, "unit": u} (or "N/A"), and has printed
either a bare list of GPUs or {"gpu_data": [...]} depending on the version; both
are accepted. rocm-smi prints {"card0": {"GPU use (%)": "12", ...}, "system": ...}.
"""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

from tokrecord.jsontypes import JSONObject

from .model import DeviceSample, ProbeError, run_tool

_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "KIB": 1024, "MIB": 1024**2,
               "GIB": 1024**3}


def _value(node: Any) -> tuple[float | None, str | None]:
    if isinstance(node, dict) and "value" in node:
        try:
            return float(node["value"]), node.get("unit")
        except (TypeError, ValueError):
            return None, None
    if isinstance(node, int | float):
        return float(node), None
    return None, None


def _dig(entry: JSONObject, *path: str) -> Any:
    node: Any = entry
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _bytes(node: Any) -> int | None:
    v, unit = _value(node)
    if v is None:
        return None
    return int(v * _UNIT_BYTES.get((unit or "MB").upper(), 1024**2))


def _first(entry: JSONObject, *paths: tuple[str, ...]) -> float | None:
    for path in paths:
        v, _ = _value(_dig(entry, *path))
        if v is not None:
            return v
    return None


def parse_amd_smi(text: str, names: dict[int, str] | None = None) -> list[DeviceSample]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"amd-smi printed invalid JSON: {exc}") from exc
    gpus = data.get("gpu_data", []) if isinstance(data, dict) else data
    out = []
    for g in gpus:
        if not isinstance(g, dict) or "gpu" not in g:
            continue
        idx = int(g["gpu"])
        energy = _first(g, ("energy", "total_energy_consumption"))
        energy_unit = _dig(g, "energy", "total_energy_consumption", "unit")
        if energy is not None and str(energy_unit).upper() in ("UJ", "µJ".upper()):
            energy /= 1e6
        out.append(DeviceSample(
            backend="amd-smi", index=idx, name=(names or {}).get(idx, f"AMD GPU {idx}"),
            util_pct=_first(g, ("usage", "gfx_activity")),
            mem_used_bytes=_bytes(_dig(g, "mem_usage", "used_vram")),
            mem_total_bytes=_bytes(_dig(g, "mem_usage", "total_vram")),
            power_w=_first(g, ("power", "socket_power"), ("power", "average_socket_power")),
            energy_j=energy,
            sm_clock_mhz=_first(g, ("clock", "gfx_0", "clk"), ("clock", "gfx", "clk")),
            temp_c=_first(g, ("temperature", "hotspot"), ("temperature", "edge")),
        ))
    return out


_CARD = re.compile(r"^card(\d+)$")


def _rocm_num(card: JSONObject, *keys: str) -> float | None:
    for key in keys:
        raw = card.get(key)
        if raw is None:
            continue
        try:
            return float(str(raw).strip())
        except ValueError:
            continue
    return None


def parse_rocm_smi(text: str) -> list[DeviceSample]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"rocm-smi printed invalid JSON: {exc}") from exc
    out = []
    for key, card in data.items():
        m = _CARD.match(key)
        if m is None or not isinstance(card, dict):
            continue
        used = _rocm_num(card, "VRAM Total Used Memory (B)")
        total = _rocm_num(card, "VRAM Total Memory (B)")
        sclk = str(card.get("sclk clock speed:", "")).strip("()Mhz ")
        out.append(DeviceSample(
            backend="rocm-smi", index=int(m.group(1)),
            name=str(card.get("Card Series") or card.get("Card series") or f"AMD GPU {m.group(1)}"),
            util_pct=_rocm_num(card, "GPU use (%)"),
            mem_used_bytes=None if used is None else int(used),
            mem_total_bytes=None if total is None else int(total),
            power_w=_rocm_num(card, "Current Socket Graphics Package Power (W)",
                              "Average Graphics Package Power (W)"),
            sm_clock_mhz=float(sclk) if sclk.replace(".", "").isdigit() else None,
            temp_c=_rocm_num(card, "Temperature (Sensor junction) (C)",
                             "Temperature (Sensor edge) (C)"),
        ))
    return out


class _SmiProbe:
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self._argv = argv

    def read(self) -> list[DeviceSample]:
        text = run_tool(self._argv)
        return parse_amd_smi(text) if self.name == "amd-smi" else parse_rocm_smi(text)

    def close(self) -> None:
        pass


def detect_amd() -> tuple[_SmiProbe | None, str | None]:
    candidates = []
    if exe := shutil.which("amd-smi"):
        candidates.append(_SmiProbe("amd-smi", [exe, "metric", "--json"]))
    if exe := shutil.which("rocm-smi"):
        candidates.append(_SmiProbe("rocm-smi", [exe, "--showuse", "--showpower",
                                                 "--showmeminfo", "vram", "--showtemp",
                                                 "--json"]))
    if not candidates:
        return None, None  # silent: no AMD tooling on this machine
    notes = []
    for probe in candidates:
        try:
            if probe.read():
                return probe, None
            notes.append(f"{probe.name} lists no GPU")
        except ProbeError as exc:
            notes.append(str(exc))
    return None, "AMD: " + "; ".join(notes)
