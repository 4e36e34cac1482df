"""Build the tiny deterministic demo Llama model that the embedded engine serves.

tokrecord's default engine (vLLM's CPU build) needs a model, and tokrecord must work with no
network, so it builds one: a byte-level BPE tokenizer trained on a small corpus shipped in the
package, and a 4-layer Llama with weights drawn from a seeded numpy generator. No torch is
needed: numpy, ``safetensors.numpy`` and ``tokenizers`` write every file.

The same builder also makes the speculative-decoding target (``build_demo_target``): the same
four layers, embeddings, final norm and head, then more layers whose output projections are zero,
so each adds nothing to the residual stream while the engine still computes it. The plain demo
model is then exactly the target's first layers: a draft model that predicts the target's greedy
tokens and costs a fraction of a target step, so draft-model speculation is faster by
construction, not by luck of the prompts.

The same builder spec (config, seed, init scales, corpus, library versions) always yields
byte-identical files; the spec hash names the cache directory, and ``manifest.sha256`` (in
``sha256sum`` format) lets anyone re-verify the files. The model is random: its outputs mean
nothing, but they are deterministic, so teacher-exact checks and speculative decoding behave as
they would with a real model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import safetensors
import safetensors.numpy
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokrecord.identity.hashing import manifest_text, sha256_file
from tokrecord.jsontypes import JSONObject

DEMO_MODEL_NAME: Final = "tokrecord-demo-llama"

# Bump when the builder's output changes for reasons the spec below does not capture (file
# layout, JSON contents, draw order): it feeds the spec hash, so old cache entries are not reused.
BUILDER_VERSION: Final = 1

MANIFEST_NAME: Final = "manifest.sha256"
CORPUS_RESOURCE: Final = "demo-corpus.txt"
DEFAULT_CACHE_DIR: Final = Path.home() / ".cache" / "tokrecord" / "models"

VOCAB_SIZE: Final = 4096
SEED: Final = 20250611

# The trainer gives special tokens the first ids, in this order (asserted after training).
EOS_TOKEN: Final = "<|endoftext|>"
IM_START_TOKEN: Final = "<|im_start|>"
IM_END_TOKEN: Final = "<|im_end|>"
SPECIAL_TOKENS: Final = (EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
EOS_TOKEN_ID: Final = 0
# No separate BOS: the tokenizer has no post-processor, so nothing is prepended to prompts and a
# prompt's token count is exactly that of its text. bos_token_id only fills the config field.
BOS_TOKEN_ID: Final = EOS_TOKEN_ID

# ChatML-style; one line so Jinja whitespace handling cannot surprise anyone.
CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Fixed tokenizer-trainer settings (part of the spec hash).
TOKENIZER_TRAINER: Final[JSONObject] = {
    "model": "BPE",
    "pre_tokenizer": "ByteLevel(add_prefix_space=False)",
    "decoder": "ByteLevel",
    "vocab_size": VOCAB_SIZE,
    "min_frequency": 2,
    "input": "whole corpus as one sequence",
}

MODEL_CONFIG: Final[JSONObject] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": BOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "initializer_range": 0.02,
    "use_cache": True,
}

# Standard deviations of the zero-mean normal draws, per tensor kind (all norms are ones).
# Why these values (measured with vLLM CPU 0.32.0 on the default suite, 13 rows x 512 tokens):
# - Embeddings std 1: every layer's input goes through RMSNorm anyway; unit scale keeps the
#   residual stream well conditioned in float32.
# - Projections std 0.05: with a unit-RMS input of width 256, q and k entries have std ~0.8 and
#   attention scores (64-dim dot products / 8) std ~0.6, so attention mixes the context softly
#   and the attention/MLP updates stay a bit smaller than the embedding in the residual stream.
#   The next token then depends on the context, so greedy decoding is not degenerate (258-373
#   distinct tokens in each 512-token row), yet it keeps drifting back into phrases it has
#   already produced, which gives n-gram speculative decoding drafts to accept (~70% accepted,
#   like real code generation and unlike pure noise). Measured alternatives: 0.1 never repeats
#   an n-gram (zero drafts: speculative decoding has nothing to measure); 0.03 and below fall
#   into short loops (as few as 28 distinct tokens per row).
# - lm_head std 0.5: the final RMSNorm output has unit RMS, so logits have std ~8 (0.5 * 16).
#   The top two of 4096 such logits are typically ~1.5 apart, far beyond float32 round-off from a
#   different batch shape or kernel path, so greedy outputs do not flip between the plain engine
#   and speculative decoding (which verifies several positions in one forward pass); measured:
#   token-identical over the whole suite.
INIT_STD: Final[dict[str, float]] = {
    "embed_tokens": 1.0,
    "q_proj": 0.05,
    "k_proj": 0.05,
    "v_proj": 0.05,
    "o_proj": 0.05,
    "gate_proj": 0.05,
    "up_proj": 0.05,
    "down_proj": 0.05,
    "lm_head": 0.5,
}

_MODEL_FILES: Final = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2) + "\n").encode("utf-8")


def corpus_bytes() -> bytes:
    """The tokenizer training corpus shipped in the package (Python stdlib text, PSF license)."""
    return resources.files("tokrecord").joinpath("data", CORPUS_RESOURCE).read_bytes()


# The target: the demo model's layers, then these many pass-through layers. Sized on the 2-core
# machine (llama.cpp, one thread; bench figures in README "The demo"): a target step then costs
# several draft steps, which is what makes a draft worth running, while a plain leg still
# streams the 13-row suite in well under half a minute.
TARGET_EXTRA_LAYERS: Final = 12

# The pass-through layers' attention and MLP inputs are drawn like the others (so the engine
# does ordinary work on ordinary numbers); their o_proj and down_proj are exactly zero, so
# every such layer adds +0.0 to the residual stream and the target's logits are the draft's,
# bit for bit, on any kernel that computes 0 * x as 0.
PASS_THROUGH_ZERO: Final = ("o_proj", "down_proj")


def model_name(extra_layers: int = 0) -> str:
    if extra_layers < 0:
        raise ValueError(f"extra_layers is {extra_layers}, must be >= 0")
    if not extra_layers:
        return DEMO_MODEL_NAME
    return f"{DEMO_MODEL_NAME}-target{MODEL_CONFIG['num_hidden_layers'] + extra_layers}"


def model_config(extra_layers: int = 0) -> JSONObject:
    """The HF config of the demo model, or of the target with ``extra_layers`` more layers."""
    if extra_layers < 0:
        raise ValueError(f"extra_layers is {extra_layers}, must be >= 0")
    return {**MODEL_CONFIG,
            "num_hidden_layers": MODEL_CONFIG["num_hidden_layers"] + extra_layers}


def builder_spec(extra_layers: int = 0) -> JSONObject:
    """Everything that determines the built files; its hash names the cache directory."""
    # The plain model's spec has no pass-through keys, so its hash (and cache) is unchanged.
    extra: JSONObject = ({"pass_through": {"layers": extra_layers,
                                               "zero": list(PASS_THROUGH_ZERO)}}
                             if extra_layers else {})
    return {
        "builder_version": BUILDER_VERSION,
        "name": model_name(extra_layers),
        "config": model_config(extra_layers),
        **extra,
        "seed": SEED,
        "init_std": INIT_STD,
        "special_tokens": list(SPECIAL_TOKENS),
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_trainer": TOKENIZER_TRAINER,
        "corpus_sha256": hashlib.sha256(corpus_bytes()).hexdigest(),
        # Output bytes may change with these libraries (RNG streams, trainer tie-breaking,
        # serialisation), so a different version means a different model directory.
        "versions": {
            "numpy": np.__version__,
            "safetensors": safetensors.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }


def spec_hash(extra_layers: int = 0) -> str:
    return hashlib.sha256(_json_bytes(builder_spec(extra_layers))).hexdigest()


def train_tokenizer(corpus: str) -> Tokenizer:
    """Train the byte-level BPE tokenizer on ``corpus`` (deterministic: see the test suite)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_TRAINER["vocab_size"],
        min_frequency=TOKENIZER_TRAINER["min_frequency"],
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, so any text encodes without an unknown token. Sorted because the
        # library returns them in no promised order (the trainer sorts them again anyway).
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()),
    )
    # One sequence, not lines: the pre-tokenizer keeps newline+indent runs together, so the
    # vocabulary learns code indentation the way it appears in prompts.
    tok.train_from_iterator([corpus], trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"special token {token!r} did not get id {i}")
    if tok.get_vocab_size(with_added_tokens=True) > VOCAB_SIZE:
        raise RuntimeError("trained vocabulary is larger than the model's vocab_size")
    return tok


def _tensor_plan(extra_layers: int = 0) -> Iterator[tuple[str, tuple[int, ...], str | None]]:
    """(name, shape [out, in], init kind or None for an all-ones norm) in the fixed draw order.

    Draw order: embeddings; then per layer q, k, v, o, gate, up, down (norms draw nothing); then
    lm_head; then the target's pass-through layers, in the same per-layer order. Changing it
    changes every weight after the change; the pass-through layers come last so that every
    weight of the plain model is drawn identically in the target.
    """
    c = MODEL_CONFIG
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    q_out = c["num_attention_heads"] * c["head_dim"]
    kv_out = c["num_key_value_heads"] * c["head_dim"]
    yield "model.embed_tokens.weight", (c["vocab_size"], hidden), "embed_tokens"
    yield from _layer_plan(range(c["num_hidden_layers"]), hidden, inter, q_out, kv_out)
    yield "model.norm.weight", (hidden,), None
    yield "lm_head.weight", (c["vocab_size"], hidden), "lm_head"
    base = c["num_hidden_layers"]
    yield from _layer_plan(range(base, base + extra_layers), hidden, inter, q_out, kv_out)


def _layer_plan(layers: range, hidden: int, inter: int, q_out: int, kv_out: int
                ) -> Iterator[tuple[str, tuple[int, ...], str | None]]:
    for i in layers:
        p = f"model.layers.{i}"
        yield f"{p}.self_attn.q_proj.weight", (q_out, hidden), "q_proj"
        yield f"{p}.self_attn.k_proj.weight", (kv_out, hidden), "k_proj"
        yield f"{p}.self_attn.v_proj.weight", (kv_out, hidden), "v_proj"
        yield f"{p}.self_attn.o_proj.weight", (hidden, q_out), "o_proj"
        yield f"{p}.mlp.gate_proj.weight", (inter, hidden), "gate_proj"
        yield f"{p}.mlp.up_proj.weight", (inter, hidden), "up_proj"
        yield f"{p}.mlp.down_proj.weight", (hidden, inter), "down_proj"
        yield f"{p}.input_layernorm.weight", (hidden,), None
        yield f"{p}.post_attention_layernorm.weight", (hidden,), None


def make_weights(never_emit: Sequence[int], extra_layers: int = 0
                 ) -> dict[str, npt.NDArray[np.float32]]:
    """Draw all weights from ``default_rng(SEED)`` in ``_tensor_plan`` order.

    In the pass-through layers (``extra_layers`` of them, after the plain model's), o_proj and
    down_proj are drawn like every other projection, to keep the stream's order simple, and
    then set to exactly zero.

    The lm_head rows of ``never_emit`` ids (special tokens, vocabulary padding) are zeroed after
    the draws: their logit is then exactly 0 while the maximum of 4096 random logits with std ~8
    is far above 0, so greedy decoding never emits EOS (every row runs to max_tokens, as the
    full-output gates expect) nor an id the tokenizer cannot decode.
    """
    rng = np.random.default_rng(SEED)
    first_pass_through = MODEL_CONFIG["num_hidden_layers"]
    weights: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape, kind in _tensor_plan(extra_layers):
        if kind is None:
            weights[name] = np.ones(shape, dtype=np.float32)
            continue
        draw = rng.standard_normal(shape, dtype=np.float32)
        if kind in PASS_THROUGH_ZERO and _layer_index(name) >= first_pass_through:
            weights[name] = np.zeros(shape, dtype=np.float32)
        else:
            weights[name] = np.ascontiguousarray(draw * np.float32(INIT_STD[kind]))
    weights["lm_head.weight"][list(never_emit), :] = 0.0
    return weights


def _layer_index(name: str) -> int:
    """The layer of "model.layers.{i}.…", -1 for tensors outside the layers."""
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def _write_model_files(out: Path, extra_layers: int = 0) -> None:
    corpus = corpus_bytes().decode("utf-8")
    tok = train_tokenizer(corpus)
    trained = tok.get_vocab_size(with_added_tokens=True)
    never_emit = sorted({*range(len(SPECIAL_TOKENS)), *range(trained, VOCAB_SIZE)})

    (out / "config.json").write_bytes(_json_bytes(model_config(extra_layers)))
    (out / "generation_config.json").write_bytes(
        _json_bytes({"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID})
    )
    (out / "tokenizer.json").write_bytes((tok.to_str(pretty=True) + "\n").encode("utf-8"))
    (out / "tokenizer_config.json").write_bytes(
        _json_bytes(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": EOS_TOKEN,
                "eos_token": EOS_TOKEN,
                "model_max_length": MODEL_CONFIG["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
                # Decoding must give back exactly the bytes the tokens stand for.
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
                "add_eos_token": False,
            }
        )
    )
    (out / "special_tokens_map.json").write_bytes(
        _json_bytes(
            {
                "bos_token": EOS_TOKEN,
                "eos_token": EOS_TOKEN,
                "additional_special_tokens": [IM_START_TOKEN, IM_END_TOKEN],
            }
        )
    )
    # "format": "pt" is what transformers/vLLM expect in the header of a torch-style checkpoint.
    safetensors.numpy.save_file(
        make_weights(never_emit, extra_layers), str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )


def model_manifest(model_dir: Path) -> dict[str, str]:
    """sha256 of every file under ``model_dir`` (except the manifest), keyed by POSIX rel path."""
    model_dir = Path(model_dir)
    out: dict[str, str] = {}
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir).as_posix()
        if path.is_file() and rel != MANIFEST_NAME:
            out[rel] = sha256_file(path)
    return dict(sorted(out.items()))


def write_manifest(model_dir: Path) -> Path:
    manifest = model_manifest(model_dir)
    path = Path(model_dir) / MANIFEST_NAME
    path.write_text(manifest_text(manifest), encoding="utf-8")
    return path


def read_manifest(model_dir: Path) -> dict[str, str]:
    """Parse ``manifest.sha256`` (``<hex>  <path>`` lines, as ``sha256sum`` writes them)."""
    entries: dict[str, str] = {}
    text = (Path(model_dir) / MANIFEST_NAME).read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise ValueError(f"{MANIFEST_NAME} line {n} is not '<sha256>  <path>': {line!r}")
        entries[rel] = digest
    return entries


def verify_manifest(model_dir: Path) -> list[str]:
    """Re-hash the model files against ``manifest.sha256``; returns the problems (empty: ok)."""
    try:
        listed = read_manifest(model_dir)
    except (OSError, ValueError) as exc:
        return [f"manifest unreadable: {exc}"]
    if not listed:
        return ["manifest is empty"]
    actual = model_manifest(model_dir)
    problems = []
    for rel in sorted(listed.keys() | actual.keys()):
        if rel not in actual:
            problems.append(f"missing: {rel}")
        elif rel not in listed:
            problems.append(f"not in manifest: {rel}")
        elif listed[rel] != actual[rel]:
            problems.append(f"sha256 mismatch: {rel}")
    return problems


def _is_complete(model_dir: Path) -> bool:
    return model_dir.is_dir() and verify_manifest(model_dir) == []


def build_demo_model(cache_dir: Path, extra_layers: int = 0) -> Path:
    """Return the demo model directory under ``cache_dir``, building it if needed; with
    ``extra_layers``, the target with that many pass-through layers after the demo model's.

    The directory is named after the builder spec hash, so a cached model is reused only when
    every input is the same, and only if its manifest still verifies. A build happens in a
    temporary sibling and is renamed into place, so readers never see a half-written model.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{model_name(extra_layers)}-{spec_hash(extra_layers)[:12]}"
    if _is_complete(target):
        return target

    return build_atomically(target, lambda out: _write_model_files(out, extra_layers))


def build_demo_target(cache_dir: Path) -> Path:
    """The speculative-decoding target: the demo model plus ``TARGET_EXTRA_LAYERS`` pass-through
    layers. Its draft is ``build_demo_model`` (the same first layers, embeddings and head)."""
    return build_demo_model(cache_dir, TARGET_EXTRA_LAYERS)


def build_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Build a cache directory in a temporary sibling, add its manifest and rename it into
    place, so readers never see a half-written one; a damaged copy is replaced."""
    cache_dir = target.parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache_dir))
    try:
        write(tmp)
        write_manifest(tmp)
        # mkdtemp makes the dir 0700 and safetensors writes 0600; give the served model ordinary
        # permissions so an engine running as another user can read it.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if target.exists() or target.is_symlink():
            # A damaged or partial copy: move it aside first (rename is atomic), then delete.
            stale = cache_dir / f".{target.name}.stale-{uuid.uuid4().hex}"
            os.replace(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same build first; its copy is as good as ours.
            if _is_complete(target):
                return target
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def cache_main(prog: str, description: str, build: Callable[[Path], Path],
               argv: Sequence[str] | None) -> int:
    """`python -m ...`: build (or find in the cache) a model, print its path."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help=f"where model directories live (default: {DEFAULT_CACHE_DIR})",
    )
    args = parser.parse_args(argv)
    print(build(args.cache_dir))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cache_main("python -m tokrecord.demo.model",
                      "Build (or find in the cache) the tiny deterministic demo Llama model.",
                      build_demo_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
