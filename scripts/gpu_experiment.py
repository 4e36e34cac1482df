"""Issue 19's real GPU experiment: its models and its preregistered plan.

`scripts/gpu-experiment` runs the whole workflow (build llama.cpp with CUDA, these
models, the ABBA, verify, report, dry-run submission); this module holds the two
steps that are Python:

* ``models``: the project's own model builder (``tokrecord.demo.model``: the same
  tokenizer, seed and draw order) with larger dimensions, about 1B parameters,
  written as GGUF f16 (1-D norms stay f32, as llama.cpp's converter keeps them),
  plus a draft of the target's first layers with the same embeddings, final norm
  and output head. With ``--damp`` the residual branches (attention output and FFN
  down projections) of the target's layers past the draft's are scaled down, so
  those layers are near-identity and the draft predicts most of the target's greedy
  tokens; the target still computes every layer at full size, so each of its
  tokens costs what a 1B model's does.
* ``plan``: the preregistered ABBA plan (TOML) for llama.cpp's CUDA server:
  control plain decoding, candidate that draft (``--spec-type draft-simple``).

Nothing here changes the builder: its module constants are widened only inside
``widened_builder()`` and restored after, so the spec hash (and with it the cache
directory name) records the dimensions used.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import safetensors.numpy

from tokrecord.demo import gguf as demo_gguf
from tokrecord.demo import model as demo_model
from tokrecord.identity import sha256_file

# The demo's own dimensions, and the ~1B target of issue 19 (same vocabulary and tokenizer).
SIZES: dict[str, dict[str, int]] = {
    "demo": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
    # A local rehearsal with the 1B model's depth at the demo's width.
    "deep": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 16,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
}

SERVED_MODEL = demo_model.DEMO_MODEL_NAME


def scaled_init_std(size: Mapping[str, int]) -> dict[str, float]:
    """The demo's init scales, kept per unit of fan-in: a projection's std times
    sqrt(demo fan-in / this fan-in), so activations, attention sharpness and logit
    spread stay what the demo measured (non-degenerate greedy text) at any width."""
    demo = SIZES["demo"]
    base = demo_model.INIT_STD

    def scale(kind: str, fan_in: int, demo_fan_in: int) -> float:
        return base[kind] * math.sqrt(demo_fan_in / fan_in)

    h, dh = size["hidden_size"], demo["hidden_size"]
    q, dq = size["num_attention_heads"] * size["head_dim"], demo["num_attention_heads"] * demo["head_dim"]
    i, di = size["intermediate_size"], demo["intermediate_size"]
    return {
        "embed_tokens": base["embed_tokens"],
        **{k: scale(k, h, dh) for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
        "o_proj": scale("o_proj", q, dq),
        "down_proj": scale("down_proj", i, di),
        "lm_head": scale("lm_head", h, dh),
    }


@contextmanager
def widened_builder(size: Mapping[str, int]) -> Iterator[None]:
    """The project's builder with other dimensions (and fan-in-scaled init), restored after."""
    config, std = dict(demo_model.MODEL_CONFIG), dict(demo_model.INIT_STD)
    try:
        demo_model.MODEL_CONFIG.update(size)
        demo_model.INIT_STD.update(scaled_init_std(size))
        yield
    finally:
        demo_model.MODEL_CONFIG.clear()
        demo_model.MODEL_CONFIG.update(config)
        demo_model.INIT_STD.clear()
        demo_model.INIT_STD.update(std)


def param_count(weights: Mapping[str, npt.NDArray[Any]]) -> int:
    return int(sum(w.size for w in weights.values()))


def write_gguf_f16(model_dir: Path, out_file: Path, *, layers: int | None = None,
                   damp_from: int | None = None, damp: float = 1.0) -> dict[str, Any]:
    """The HF Llama in ``model_dir`` as one GGUF f16 file, by the demo's own converter.

    ``layers``: keep only the first N blocks (a draft: same embeddings, final norm and
    head). ``damp_from``/``damp``: scale attn_output and ffn_down of blocks >= damp_from
    by ``damp`` (near-identity layers). Returns what was written."""
    def adjust(name: str, data: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        block = int(name.split(".")[1]) if name.startswith("blk.") else None
        if (block is not None and damp_from is not None and block >= damp_from
                and name.endswith((".attn_output.weight", ".ffn_down.weight"))):
            return data * np.float32(damp)
        return data

    params = demo_gguf.write_gguf(model_dir, out_file, f16=True, layers=layers, adjust=adjust)
    n_layers = layers if layers is not None else int(json.loads(
        (model_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
    return {"file": out_file.name, "layers": n_layers, "parameters": params,
            "bytes": out_file.stat().st_size, "sha256": sha256_file(out_file),
            "damp_from": damp_from, "damp": damp if damp_from is not None else None}




def build_models(out: Path, size_name: str, draft_layers: int, damp: float | None) -> dict[str, Any]:
    size = SIZES[size_name]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with widened_builder(size):
        spec_hash = demo_model.spec_hash()
        hf_dir = demo_model.build_demo_model(out / "hf")
        config = dict(demo_model.MODEL_CONFIG)
        init_std = dict(demo_model.INIT_STD)
    t_hf = time.monotonic() - t0
    damp_from = draft_layers if damp is not None else None
    target = write_gguf_f16(hf_dir, out / "target-f16.gguf", damp_from=damp_from, damp=damp or 1.0)
    t_target = time.monotonic() - t0 - t_hf
    draft = write_gguf_f16(hf_dir, out / "draft-f16.gguf", layers=draft_layers)
    facts = {
        "size": size_name, "config": config, "init_std": init_std,
        "builder_spec_sha256": spec_hash, "hf_dir": hf_dir.name,
        "hf_parameters": param_count(safetensors.numpy.load_file(str(hf_dir / "model.safetensors"))),
        "target": target, "draft": draft,
        "seconds": {"hf_build": round(t_hf, 2), "target_gguf": round(t_target, 2),
                    "total": round(time.monotonic() - t0, 2)},
    }
    (out / "models.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return facts


# ---- the plan ------------------------------------------------------------------------

def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def _rules(rules: list[dict[str, Any]], arm: str) -> str:
    return "".join(f"\n[[arms.{arm}.log_rules]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in r.items())
                   for r in rules)


def plan_text(*, server: str, models: Path, idle_gap_s: float, draft_n_max: int,
              notes: str, rows: int | None = None, gpu: bool = True,
              launcher: list[str] | None = None, draft_layers: int,
              treatment: str = "draft", sweep_n_max: list[int] | None = None,
              blocks: int = 1, sequential: str | None = None) -> str:
    """The preregistered ABBA. ``treatment``: "draft" (control plain decoding, candidate
    the draft model) or "graphs" (control CUDA graphs off, candidate llama.cpp's
    default, CUDA graphs on: the same kernels in the same order, so outputs must be
    bit-identical) or "sweep" (issue 34: control plain decoding, and the draft model at
    each ``--spec-draft-n-max`` of ``sweep_n_max``, every arm once per block in Williams
    order, ``blocks`` blocks). ``launcher`` replaces the server binary (a local CPU
    rehearsal through xllamacpp); ``gpu`` adds the CUDA flags. ``sequential``
    ("MAX[:MIN[:SPENDING]]", issue 32) makes an ABBA sequential: a look after every block
    from MIN (default 1) on, stopping once decided, MAX blocks at most."""
    argv = [*(launcher or [server]), "-m", "{model}", "-a", SERVED_MODEL, "--host", "{host}",
            "--port", "{port}", "-np", "1", "--no-cache-prompt", "--no-warmup", "--metrics",
            "--seed", "0", "-c", "2048"]
    if gpu:
        argv += ["-ngl", "99"]
    else:
        argv += ["-t", "1", "-fa", "off"]
    draft = str((models / "draft-f16.gguf").resolve())
    cand_args = ["--spec-type", "draft-simple", "-md", draft, "--spec-draft-n-max", str(draft_n_max)]
    if gpu:
        cand_args += ["-ngld", "99"]
    drafting = "draft acceptance = "
    # llama-server's own log (b11434, default verbosity) names no device and no offload: its
    # "Device 0: NVIDIA H200" and "offloaded 17/17 layers to GPU" lines never reach it (both
    # claims read 0 in the first H200 run, examples/h200/README.md). That the GPU ran the legs
    # is in each leg's telemetry (utilization, memory) instead.
    common = [{"claim": "one slot", "pattern": r"n_slots = 1,", "required": True}]
    control = [{"claim": "no speculative decoding", "pattern": drafting, "expect": "absent",
                "required": True}, *common]
    candidate = [{"claim": "the draft model drafts", "pattern": drafting, "required": True}, *common]
    if treatment == "graphs":
        name = "h200-llamacpp-cuda-graphs-on-vs-off"
        candidate = list(control)  # both arms decode plainly, on the same single model
        arms = ('[arms.control]\n'
                'description = "plain decoding, CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1)"\n'
                f'env = {{ GGML_CUDA_DISABLE_GRAPHS = "1" }}\n{_rules(control, "control")}\n'
                f'[arms.candidate]\ndescription = "plain decoding, CUDA graphs on (llama.cpp\'s default)"\n'
                f'{_rules(candidate, "candidate")}')
    elif treatment == "sweep":
        name = "h200-llamacpp-cuda-draft-n-max-sweep"
        values = sweep_n_max or [2, 4, 8, 16]
        common_args = [a for i, a in enumerate(cand_args)
                       if a != "--spec-draft-n-max" and (i == 0 or cand_args[i - 1] != "--spec-draft-n-max")]
        sweep_rules = "".join("\n[[sweep.log_rules]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in r.items())
                              for r in candidate)
        arms = (f'[arms.control]\ndescription = "plain decoding"\n{_rules(control, "control")}\n'
                f'[sweep]\nextra_args = {_toml(common_args)}\n{sweep_rules}\n'
                f'[[sweep.parameters]]\nname = "n_max"\nflag = "--spec-draft-n-max"\n'
                f'values = {_toml(values)}\n')
    else:
        name = "h200-llamacpp-cuda-draft-vs-plain"
        description = (f"draft-model speculative decoding: the target's first {draft_layers} layers, "
                       f"same embeddings and head, up to {draft_n_max} tokens a draft")
        arms = (f'[arms.control]\ndescription = "plain decoding"\n{_rules(control, "control")}\n'
                f'[arms.candidate]\ndescription = {_toml(description)}\n'
                f'extra_args = {_toml(cand_args)}\n{_rules(candidate, "candidate")}')
    rows_line = f"suite_rows = {rows}\n" if rows else ""
    # A sweep's CPU dry run shares a busy host with the server's own thread: its idle gate
    # would wait out every leg; the GPU plan keeps 25 %.
    cpu_max = 100.0 if treatment == "sweep" and not gpu else 25.0
    power = f"device_power_max_w = {200}\n" if gpu else ""
    seq = _sequential_section(sequential, treatment)
    return f"""# Preregistered by scripts/gpu-experiment (issue 19). Paths are the GPU machine's.
name = {_toml(name)}
design = {_toml("sweep" if treatment == "sweep" else "abba")}
blocks = {blocks if treatment == "sweep" else 1}
teacher = "capture"
engine = "llama.cpp"
endpoint = "native"
headline = "chunk-aware"
idle_gap_s = {idle_gap_s!r}
{rows_line}notes = {_toml(notes)}

[server]
argv = {_toml(argv)}
model = {_toml(str((models / "target-f16.gguf").resolve()))}
served_model = {_toml(SERVED_MODEL)}
ready_timeout_s = 180.0

{arms}
[idle]
interval_s = 1.0
consecutive = 5
timeout_s = 120.0
host_cpu_max_pct = {cpu_max!r}
device_util_max_pct = 5.0
device_mem_used_max_mib = 1024
device_processes_max = 0
{power}
[telemetry]
interval_s = 0.25

[gates]
long_context_threshold = 800
rollover_boundary = 1024
{seq}"""


def _sequential_section(spec: str | None, treatment: str) -> str:
    if not spec:
        return ""
    if treatment == "sweep":
        raise SystemExit("--sequential: for an ABBA (draft or graphs); a sweep has its own")
    parts = spec.split(":")
    max_blocks = int(parts[0])
    min_blocks = int(parts[1]) if len(parts) > 1 and parts[1] else 1
    spending = parts[2] if len(parts) > 2 and parts[2] else "pocock"
    # The method is left to the plan's parser (today's default), as a user's plan would.
    return (f"\n[sequential]\nmax_blocks = {max_blocks}\nmin_blocks = {min_blocks}\n"
            f"spending = {_toml(spending)}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_experiment.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("models", help="build the target (GGUF f16) and its draft")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--size", choices=sorted(SIZES), default="1b")
    m.add_argument("--draft-layers", type=int, default=2)
    m.add_argument("--damp", type=float, default=None,
                   help="scale the residual branches of the target's layers past the draft's by this")
    pl = sub.add_parser("plan", help="write the preregistered plan (TOML) to stdout")
    pl.add_argument("--server", required=True, help="the llama-server binary")
    pl.add_argument("--models", type=Path, required=True)
    pl.add_argument("--idle-gap", type=float, default=15.0)
    pl.add_argument("--draft-n-max", type=int, default=8)
    pl.add_argument("--rows", type=int, default=None)
    pl.add_argument("--notes", default="")
    pl.add_argument("--treatment", choices=("draft", "graphs", "sweep"), default="draft")
    pl.add_argument("--sweep-n-max", default=None,
                    help="a sweep (issue 34): control plain decoding and the draft at each of these "
                         "comma-separated n-max values, e.g. 2,4,8,16 (implies --treatment sweep)")
    pl.add_argument("--blocks", type=int, default=2, help="a sweep's blocks (every arm once each)")
    pl.add_argument("--sequential", default=None, metavar="MAX[:MIN[:SPENDING]]",
                    help="an ABBA made sequential (issue 32): at most MAX blocks, a look after "
                         "each from block MIN (1), SPENDING pocock or obrien-fleming")
    pl.add_argument("--cpu-launcher", nargs="+", default=None,
                    help="a local CPU rehearsal: the llama-server command to use instead (xllamacpp)")
    args = p.parse_args(argv)
    if args.cmd == "models":
        print(json.dumps(build_models(args.out, args.size, args.draft_layers, args.damp), indent=2))
        return 0
    facts = json.loads((args.models / "models.json").read_text(encoding="utf-8"))
    sys.stdout.write(plan_text(
        server=args.server, models=args.models, idle_gap_s=args.idle_gap,
        draft_n_max=args.draft_n_max, notes=args.notes, rows=args.rows,
        gpu=args.cpu_launcher is None, launcher=args.cpu_launcher,
        draft_layers=facts["draft"]["layers"],
        treatment="sweep" if args.sweep_n_max else args.treatment,
        sweep_n_max=[int(v) for v in args.sweep_n_max.split(",")] if args.sweep_n_max else None,
        blocks=args.blocks, sequential=args.sequential))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
