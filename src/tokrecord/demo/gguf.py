"""Convert the demo Llama model into one GGUF file, the format llama.cpp serves.

llama.cpp cannot read the safetensors directory that vLLM serves, so the same model (same float32
weights, same tokenizer) is written once more as GGUF with the ``gguf`` package, the writer
llama.cpp's own ``convert_hf_to_gguf.py`` uses. The conversion follows that script's Llama path
(keys, tensor names, q/k permutation, vocabulary) so llama.cpp runs the model exactly as vLLM
does: greedy outputs are the same token ids on both engines, which is what lets one teacher
check both. Measured (xllamacpp 2026.10.11549, vLLM CPU 0.32.0, default suite, 13 rows x 512
tokens): identical ids for every row with ``llama-server -fa off``; with flash attention on (the
CPU default, ``-fa auto``) 5 rows flip at near-ties (float64 top-2 logit margins 3e-4 to 4e-3,
where vLLM agrees with a float64 reference), so the server must run with ``-fa off``.

Like the safetensors model, the output is byte-identical for the same inputs: the GGUF file sits
in its own cache directory, named after a hash of the source model's manifest, the converter
version and the ``gguf``/``numpy`` versions, with a ``manifest.sha256`` beside it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypedDict

import numpy as np
import numpy.typing as npt
import safetensors.numpy

from tokrecord.demo.model import (
    DEFAULT_CACHE_DIR,
    DEMO_MODEL_NAME,
    TARGET_EXTRA_LAYERS,
    build_atomically,
    build_demo_model,
    cache_main,
    model_manifest,
    model_name,
    verify_manifest,
)

if TYPE_CHECKING:
    import gguf

# Bump when the converter's output changes for reasons the hash inputs do not capture (keys
# written, their order, tensor order): it feeds the cache directory name.
CONVERTER_VERSION: Final = 1

GGUF_FILE_NAME: Final = f"{DEMO_MODEL_NAME}.gguf"
GGUF_DIR_PREFIX: Final = f"{DEMO_MODEL_NAME}-gguf"
ARCH: Final = "llama"

# llama.cpp picks its pre-tokenizer regex from this name, not from tokenizer.json. The demo
# tokenizer's pre-tokenizer is ByteLevel(use_regex=True) without a prefix space, i.e. GPT-2's
# regex, which llama.cpp calls "gpt-2".
TOKENIZER_PRE: Final = "gpt-2"

# HF module name -> GGUF name inside each block ("blk.{i}.{name}.weight"), as llama.cpp's
# tensor map for LLM_ARCH_LLAMA expects.
_BLOCK_TENSORS: Final[Mapping[str, str]] = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def hf_to_gguf_rope_permute(weight: npt.NDArray[np.float32], n_head: int) -> npt.NDArray[np.float32]:
    """Reorder the rows of a q or k projection from HF's RoPE layout to llama.cpp's.

    HF Llama rotates each head's dimension pairs (j, j + d/2) ("rotate_half", NeoX style), while
    llama.cpp's LLM_ARCH_LLAMA uses rope type NORM, which rotates adjacent pairs (2j, 2j + 1) as
    the original Meta checkpoints did. Within every head, output row j of the first half and row
    j of the second half must become rows 2j and 2j + 1; this is ``permute`` in
    ``convert_hf_to_gguf.py``'s LlamaModel. Without it, q.k dot products (and so every output
    after the first attention layer) differ from vLLM's. ``n_head`` is the number of heads the
    rows belong to: attention heads for q, KV heads for k.
    """
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of even size")
    half = rows // n_head // 2
    permuted = weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(permuted.reshape(weight.shape))


def _gguf_tensors(
    weights: Mapping[str, npt.NDArray[np.float32]], config: Mapping[str, Any]
) -> list[tuple[str, npt.NDArray[np.float32]]]:
    """(GGUF name, data) in llama.cpp's usual order; every HF tensor must be used exactly once."""
    out: list[tuple[str, npt.NDArray[np.float32]]] = []
    used: set[str] = set()

    def take(hf_name: str) -> npt.NDArray[np.float32]:
        used.add(hf_name)
        arr = weights[hf_name]
        if arr.dtype != np.float32:
            raise ValueError(f"{hf_name} is {arr.dtype}, expected float32")
        return arr

    out.append(("token_embd.weight", take("model.embed_tokens.weight")))
    for i in range(int(config["num_hidden_layers"])):
        for hf_part, gguf_part in _BLOCK_TENSORS.items():
            arr = take(f"model.layers.{i}.{hf_part}.weight")
            if gguf_part == "attn_q":
                arr = hf_to_gguf_rope_permute(arr, int(config["num_attention_heads"]))
            elif gguf_part == "attn_k":
                arr = hf_to_gguf_rope_permute(arr, int(config["num_key_value_heads"]))
            out.append((f"blk.{i}.{gguf_part}.weight", arr))
    out.append(("output_norm.weight", take("model.norm.weight")))
    if not config.get("tie_word_embeddings", False):
        # Untied, so llama.cpp must get its own output matrix (tied models omit it and llama.cpp
        # falls back to token_embd).
        out.append(("output.weight", take("lm_head.weight")))
    unused = sorted(weights.keys() - used)
    if unused:
        raise ValueError(f"tensors the converter does not map: {unused}")
    return out


def _vocab(tokenizer: Mapping[str, Any], vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges) as convert_hf_to_gguf's GPT-2 vocabulary path writes them.

    Token strings stay in byte-level form ("Ġ" for a space): llama.cpp's BPE vocabulary maps
    them back to bytes itself, as it does for every GPT-2-style GGUF.
    """
    import gguf  # imported where a GGUF is written: it costs 0.25 s to load
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer model is {model.get('type')!r}, expected BPE")
    by_id: dict[int, str] = {int(i): tok for tok, i in model["vocab"].items()}
    special: dict[int, str] = {}
    for added in tokenizer.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        if added.get("special"):
            special[int(added["id"])] = added["content"]
    if max(by_id) >= vocab_size:
        raise ValueError(f"token id {max(by_id)} is outside vocab_size {vocab_size}")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in by_id:
            # Ids the tokenizer never produces: placeholders, as the convert script writes them.
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        elif i in special:
            # CONTROL: rendered as text only when asked, and not parsed out of prompt text unless
            # the request asks for special-token parsing, as with vLLM's completions endpoint.
            tokens.append(special[i])
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.NORMAL))
    # tokenizers >= 0.20 stores merges as [left, right] pairs, older versions as "left right".
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def write_gguf(model_dir: Path, out_file: Path, name: str = DEMO_MODEL_NAME, *,
               f16: bool = False, layers: int | None = None,
               adjust: Callable[[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]]
               | None = None) -> int:
    """Write the HF-format Llama in ``model_dir`` (the demo model or its target) to ``out_file``
    as GGUF under ``name``; the number of parameters written.

    f32 unless ``f16`` (matrices in f16, 1-D norms kept f32 as llama.cpp's converter keeps
    them). ``layers`` keeps only the first N blocks with the same embeddings, final norm and
    head (a draft of the model). ``adjust(gguf_name, data)`` may change a tensor first."""
    import gguf  # imported where a GGUF is written: it costs 0.25 s to load
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "llama":
        raise ValueError(f"model_type is {config.get('model_type')!r}, expected 'llama'")
    weights = safetensors.numpy.load_file(str(model_dir / "model.safetensors"))

    vocab_size = int(config["vocab_size"])
    tokens, types, merges = _vocab(tokenizer, vocab_size)
    n_layers = int(config["num_hidden_layers"]) if layers is None else layers
    tensors = _tensors(weights, config, n_layers, adjust, f16)

    writer = gguf.GGUFWriter(str(out_file), ARCH)
    _write_hparams(writer, config, name, n_layers, f16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(int(config["bos_token_id"]))
    writer.add_eos_token_id(int(config["eos_token_id"]))
    # The HF tokenizer adds nothing to a prompt (no post-processor); llama.cpp must not prepend
    # BOS either, or prompt token counts and every output would differ from vLLM's.
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(tok_config.get("add_eos_token", False)))
    if tok_config.get("chat_template"):
        writer.add_chat_template(str(tok_config["chat_template"]))

    for tensor, data in tensors:
        writer.add_tensor(tensor, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return int(sum(d.size for _, d in tensors))


def _tensors(weights: Mapping[str, npt.NDArray[np.float32]], config: Mapping[str, Any],
             n_layers: int,
             adjust: Callable[[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]] | None,
             f16: bool) -> list[tuple[str, npt.NDArray[Any]]]:
    """The GGUF tensors of the first `n_layers` blocks (and the rest), adjusted, in f16
    where asked (1-D norms stay f32)."""
    tensors = [(t, d) for t, d in _gguf_tensors(weights, config)
               if not t.startswith("blk.") or int(t.split(".")[1]) < n_layers]
    if adjust is not None:
        tensors = [(t, adjust(t, d)) for t, d in tensors]
    if f16:
        return [(t, d.astype(np.float16) if d.ndim == 2 else d) for t, d in tensors]
    return list(tensors)


def _write_hparams(writer: gguf.GGUFWriter, config: Mapping[str, Any], name: str,
                   n_layers: int, f16: bool) -> None:
    import gguf  # imported where a GGUF is written: it costs 0.25 s to load
    n_head = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // n_head)
    # No general.* provenance beyond the name: dates, paths or versions would make rebuilds
    # differ, and the cache directory name already records where the file came from.
    writer.add_name(name)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    # Full-head rotary embedding with HF's base. No rope scaling key: the model has none, and
    # llama.cpp's default (none) matches vLLM's plain RoPE.
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))


class GgufSpec(TypedDict):
    converter_version: int
    source: dict[str, str]  # the HF model's file hashes (model_manifest)
    versions: dict[str, str]


def gguf_spec(model_dir: Path) -> GgufSpec:
    """Everything that determines the GGUF bytes; its hash names the GGUF cache directory."""
    return {
        "converter_version": CONVERTER_VERSION,
        "source": model_manifest(model_dir),
        # The writer's layout (alignment, key encoding) and numpy's tofile could change with
        # these, so a different version means a different directory.
        "versions": {"gguf": _gguf_version(), "numpy": np.__version__},
    }


def _gguf_version() -> str:
    return version("gguf")


def gguf_spec_hash(model_dir: Path) -> str:
    text = json.dumps(gguf_spec(model_dir), sort_keys=True, indent=2) + "\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _is_complete(gguf_dir: Path, file_name: str) -> bool:
    return (gguf_dir / file_name).is_file() and verify_manifest(gguf_dir) == []


def build_demo_gguf(cache_dir: Path = DEFAULT_CACHE_DIR, extra_layers: int = 0) -> Path:
    """Return the demo model's GGUF file under ``cache_dir``, building model and file if needed
    (with ``extra_layers``: the target's, see ``build_demo_model``).

    Same scheme as ``build_demo_model``: the directory is named after the spec hash, reused only
    if its manifest verifies, and written in a temporary sibling that is renamed into place.
    """
    cache_dir = Path(cache_dir)
    model_dir = build_demo_model(cache_dir, extra_layers)
    name = model_name(extra_layers)
    file_name = f"{name}.gguf"
    target = cache_dir / f"{name}-gguf-{gguf_spec_hash(model_dir)[:12]}"
    if _is_complete(target, file_name):
        return target / file_name

    def build(tmp: Path) -> None:
        write_gguf(model_dir, tmp / file_name, name)

    build_atomically(target, build)
    return target / file_name


def build_demo_target_gguf(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The speculative-decoding target as GGUF; its draft is ``build_demo_gguf(cache_dir)``."""
    return build_demo_gguf(cache_dir, TARGET_EXTRA_LAYERS)


def main(argv: Sequence[str] | None = None) -> int:
    return cache_main("python -m tokrecord.demo.gguf",
                      "Build (or find in the cache) the demo Llama model as one GGUF file.",
                      build_demo_gguf, argv)


if __name__ == "__main__":
    raise SystemExit(main())
