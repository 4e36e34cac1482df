"""The weights' quantisation from the model itself, when the server argv does not say.

A GGUF file names its type in its header (`general.file_type`, llama.cpp's
LlamaFileType: MOSTLY_Q4_K_M is "Q4_K_M"); a Hugging Face model directory names it in
config.json (`quantization_config.quant_method`, else `torch_dtype`). The file read must
be the one the record identified: its sha256 is checked against identity.json's model
manifest first, so a file changed since the run (or a record from elsewhere naming a
local path) is never read as the record's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokrecord.identity.model import ModelIdentity

_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8"}
CONFIG_MAX_BYTES = 1 << 20


def gguf_file_type_name(value: int) -> str | None:
    """llama.cpp's name of a GGUF file type, without its MOSTLY_/ALL_ prefix."""
    import gguf  # the demo's GGUF writer; imported here, where a GGUF is read

    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def gguf_quantization(path: Path) -> str | None:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from exc
    field = reader.fields.get("general.file_type")
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    return gguf_file_type_name(int(value[0]))


def config_quantization(config: dict[str, object]) -> str | None:
    q = config.get("quantization_config")
    if isinstance(q, dict) and isinstance(q.get("quant_method"), str):
        return str(q["quant_method"])
    dtype = config.get("torch_dtype") or config.get("dtype")
    return _DTYPES.get(dtype) if isinstance(dtype, str) else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def model_quantization(model: ModelIdentity | None) -> tuple[str | None, str]:
    """(quantisation, where from) read from the identified model's own files, or
    (None, why not)."""
    if model is None:
        return None, "the record has no model identity"
    root = Path(model.path)
    if root.is_file():
        name = root.name
        ggufs = [name] if name.endswith(".gguf") and name in model.files else []
        base = root.parent
    else:
        ggufs = sorted(n for n in model.files if n.endswith(".gguf"))
        base = root
    candidates = [(n, "gguf") for n in ggufs[:1]]
    if "config.json" in model.files:
        candidates.append(("config.json", "config"))
    if not candidates:
        return None, f"the model ({model.path}) has no GGUF file or config.json"
    for name, kind in candidates:
        path = base / name
        if not path.is_file():
            return None, f"{path} is not on this machine"
        if _sha256(path) != model.files[name]:
            return None, f"{path} has changed since the run (its sha256 differs from identity.json)"
        try:
            if kind == "gguf":
                found = gguf_quantization(path)
            else:
                if path.stat().st_size > CONFIG_MAX_BYTES:
                    continue
                found = config_quantization(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, OSError) as exc:
            return None, str(exc)
        if found is not None:
            where = ("general.file_type in the GGUF header" if kind == "gguf"
                     else "config.json's quantization_config or torch_dtype")
            return found, f"{where} of {path} (sha256 as identified in the record)"
    return None, f"neither the GGUF header nor config.json of {model.path} names a type"
