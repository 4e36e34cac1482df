"""The demo model builder: determinism, manifest, internal consistency, tokenizer, greedy output."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from tokrecord.demo import model as demo

Weights = dict[str, npt.NDArray[np.float32]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo.build_demo_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def weights(model_dir: Path) -> Weights:
    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def target_dir(model_dir: Path) -> Path:
    return demo.build_demo_target(model_dir.parent)


@pytest.fixture(scope="module")
def target_weights(target_dir: Path) -> Weights:
    return load_file(str(target_dir / "model.safetensors"))


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_dir_name_carries_spec_hash(model_dir: Path) -> None:
    assert model_dir.name == f"{demo.DEMO_MODEL_NAME}-{demo.spec_hash()[:12]}"
    assert sorted(_files(model_dir)) == sorted([*demo._MODEL_FILES, demo.MANIFEST_NAME])


def test_double_build_is_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    again = demo.build_demo_model(tmp_path / "other")
    assert again != model_dir
    assert _files(again) == _files(model_dir)


def test_build_in_another_process_with_one_thread_is_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    # tokenizers trains with a rayon thread pool; the result must not depend on its size.
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "tokrecord.demo.model", "--cache-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    built = Path(out.stdout.strip())
    assert built.name == model_dir.name
    assert _files(built) == _files(model_dir)


def test_cached_model_is_reused(model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert demo.build_demo_model(model_dir.parent) == model_dir
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")]


def test_damaged_cache_is_rebuilt(model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(model_dir, cache / model_dir.name)
    (cache / model_dir.name / "config.json").write_text("{}\n")
    rebuilt = demo.build_demo_model(cache)
    assert rebuilt == cache / model_dir.name
    assert demo.verify_manifest(rebuilt) == []
    assert _files(rebuilt) == _files(model_dir)
    assert sorted(p.name for p in cache.iterdir()) == [model_dir.name]  # no temp leftovers


def test_manifest_is_sha256sum_format_and_covers_every_file(model_dir: Path) -> None:
    lines = (model_dir / demo.MANIFEST_NAME).read_text().splitlines()
    listed = [line.split("  ", 1)[1] for line in lines]
    assert listed == sorted(listed)
    on_disk = sorted(p.name for p in model_dir.iterdir() if p.name != demo.MANIFEST_NAME)
    assert listed == on_disk
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert digest == hashlib.sha256((model_dir / rel).read_bytes()).hexdigest()
    assert demo.model_manifest(model_dir) == demo.read_manifest(model_dir)
    assert demo.verify_manifest(model_dir) == []
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--quiet", demo.MANIFEST_NAME], cwd=model_dir, check=True)


def test_manifest_detects_flipped_byte_missing_and_extra_files(model_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "copy"
    shutil.copytree(model_dir, d)
    path = d / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert demo.verify_manifest(d) == ["sha256 mismatch: model.safetensors"]

    (d / "tokenizer_config.json").unlink()
    (d / "stray.txt").write_text("x")
    assert demo.verify_manifest(d) == [
        "sha256 mismatch: model.safetensors",
        "not in manifest: stray.txt",
        "missing: tokenizer_config.json",
    ]
    (d / demo.MANIFEST_NAME).unlink()
    assert demo.verify_manifest(d)[0].startswith("manifest unreadable")


def test_json_files_are_canonical(model_dir: Path) -> None:
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json"):
        text = (model_dir / name).read_text()
        assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n", name
    assert (model_dir / "tokenizer.json").read_text().endswith("}\n")


def test_config_tensors_and_tokenizer_agree(model_dir: Path, weights: Weights, tokenizer: Tokenizer) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is False
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out, kv_out = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    v = cfg["vocab_size"]
    expected = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        expected |= {
            f"{p}.self_attn.q_proj.weight": (q_out, h),
            f"{p}.self_attn.k_proj.weight": (kv_out, h),
            f"{p}.self_attn.v_proj.weight": (kv_out, h),
            f"{p}.self_attn.o_proj.weight": (h, q_out),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    assert {k: t.shape for k, t in weights.items()} == expected
    assert all(t.dtype == np.float32 for t in weights.values())
    assert all(np.all(t == 1.0) for k, t in weights.items() if k.endswith("norm.weight"))
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}

    assert cfg["vocab_size"] == demo.VOCAB_SIZE >= tokenizer.get_vocab_size()
    assert tokenizer.token_to_id(demo.EOS_TOKEN) == cfg["eos_token_id"]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == demo.EOS_TOKEN
    assert tok_cfg["model_max_length"] == cfg["max_position_embeddings"]
    # Special and padding ids can never win a greedy argmax.
    never = list(range(len(demo.SPECIAL_TOKENS)))
    assert never == [tokenizer.token_to_id(t) for t in demo.SPECIAL_TOKENS]
    never += list(range(tokenizer.get_vocab_size(), cfg["vocab_size"]))
    assert np.all(weights["lm_head.weight"][never] == 0.0)


def test_tokenizer_round_trips_text(tokenizer: Tokenizer) -> None:
    text = (
        'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
        "SELECT * FROM t WHERE x <> 'ü' -- naïve café, 数字, emoji 🚀\t\r\n"
    )
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    code = text.split("\n\n")[0]
    # The BPE merges compress code (the corpus is Python) to well under one token per byte.
    assert len(tokenizer.encode(code, add_special_tokens=False).ids) < len(code) / 2
    # No BOS/EOS is added: a prompt's token count is that of its text.
    assert (
        tokenizer.encode("hello", add_special_tokens=True).ids
        == tokenizer.encode("hello", add_special_tokens=False).ids
    )
    chat = f"{demo.IM_START_TOKEN}user\nhi{demo.IM_END_TOKEN}\n"
    chat_ids = tokenizer.encode(chat, add_special_tokens=False).ids
    assert chat_ids[0] == tokenizer.token_to_id(demo.IM_START_TOKEN)
    assert tokenizer.token_to_id(demo.IM_END_TOKEN) in chat_ids


# --- numpy reference forward pass (HF Llama semantics: rotate-half RoPE, GQA, SiLU MLP) ------


def _reference_logits(w: Weights, ids: list[int]) -> npt.NDArray[np.float64]:
    """Logits of the last position, in float64."""
    c = demo.MODEL_CONFIG
    n_heads, n_kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    def rms(x: npt.NDArray[np.float64], g: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + c["rms_norm_eps"]) * g
        return np.asarray(y, dtype=np.float64)

    t = len(ids)
    h = w["model.embed_tokens.weight"][ids].astype(np.float64)
    inv = 1.0 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(t), inv)
    ang = np.concatenate([ang, ang], -1)[:, None, :]

    def rope(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return np.asarray(x * np.cos(ang) + rot * np.sin(ang), dtype=np.float64)

    mask = np.triu(np.full((t, t), -np.inf), 1)
    layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("model.layers."))
    for i in range(layers):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = rope((x @ w[p + "self_attn.q_proj.weight"].T).reshape(t, n_heads, hd))
        k = rope((x @ w[p + "self_attn.k_proj.weight"].T).reshape(t, n_kv, hd))
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(t, n_kv, hd)
        k, v = np.repeat(k, n_heads // n_kv, 1), np.repeat(v, n_heads // n_kv, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        h = h + np.einsum("hts,shd->thd", s, v).reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    out = rms(h[-1:], w["model.norm.weight"]) @ w["lm_head.weight"].T
    return np.asarray(out[0], dtype=np.float64)


# Greedy continuation of "def fib(n):" as served by vLLM CPU 0.32.0 (--dtype float32), with and
# without n-gram speculative decoding. A mismatch means the weights, the tokenizer or the tensor
# layout changed (and the spec hash should have changed with them).
VLLM_FIB_GREEDY_PREFIX = [2569, 2874, 889, 3279, 1966, 337, 1034, 3396, 3896, 51, 979, 2955]


def test_reference_greedy_matches_vllm_and_is_not_degenerate(weights: Weights, tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("def fib(n):", add_special_tokens=False).ids
    # The float64 the reference computes in, cast once rather than in each of 48 passes' matmuls
    # (the same values: 8 s of CPU became under 1).
    wide = {name: t.astype(np.float64) for name, t in weights.items()}
    out: list[int] = []
    margins = []
    for _ in range(48):
        logits = _reference_logits(wide, ids + out)
        top2 = np.sort(logits)[-2:]
        margins.append(top2[1] - top2[0])
        out.append(int(np.argmax(logits)))
    assert out[: len(VLLM_FIB_GREEDY_PREFIX)] == VLLM_FIB_GREEDY_PREFIX
    assert len(set(out)) >= 32  # not stuck on a token or a short loop
    assert not set(out) & {tokenizer.token_to_id(t) for t in demo.SPECIAL_TOKENS}
    assert min(margins) > 1e-4  # far above float32 round-off: no near-ties to flip


# --- the speculative-decoding target: the demo model plus pass-through layers -----------------


def test_plain_model_spec_is_unchanged_by_the_target_builder() -> None:
    # The plain model's cache directory (and every record that names it) must not move.
    assert "pass_through" not in demo.builder_spec()
    assert demo.builder_spec(0) == demo.builder_spec()
    assert demo.spec_hash(demo.TARGET_EXTRA_LAYERS) != demo.spec_hash()
    with pytest.raises(ValueError):
        demo.model_config(-1)


def test_target_dir_config_and_rebuild(target_dir: Path, model_dir: Path, tmp_path: Path) -> None:
    extra = demo.TARGET_EXTRA_LAYERS
    assert target_dir.name == f"{demo.model_name(extra)}-{demo.spec_hash(extra)[:12]}"
    assert target_dir.name.startswith(f"{demo.DEMO_MODEL_NAME}-target{4 + extra}-")
    cfg = json.loads((target_dir / "config.json").read_text())
    base = json.loads((model_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == base["num_hidden_layers"] + extra
    assert {k: v for k, v in cfg.items() if k != "num_hidden_layers"} == \
        {k: v for k, v in base.items() if k != "num_hidden_layers"}
    # Same tokenizer files: llama.cpp refuses a draft whose vocabulary differs.
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (target_dir / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert demo.verify_manifest(target_dir) == []
    again = demo.build_demo_target(tmp_path)
    assert _files(again) == _files(target_dir)


def test_target_holds_the_draft_and_pass_through_layers(target_weights: Weights,
                                                        weights: Weights) -> None:
    base_layers = demo.MODEL_CONFIG["num_hidden_layers"]
    # Every tensor of the demo model is in the target, bit for bit: the draft is the
    # target's first layers with its embeddings, final norm and head.
    for name, tensor in weights.items():
        np.testing.assert_array_equal(target_weights[name], tensor, err_msg=name)
    extra = sorted(set(target_weights) - set(weights))
    assert len(extra) == 9 * demo.TARGET_EXTRA_LAYERS
    for name in extra:
        layer = int(name.split(".")[2])
        assert base_layers <= layer < base_layers + demo.TARGET_EXTRA_LAYERS
        t = target_weights[name]
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert not np.any(t), name  # exactly zero: the layer adds nothing
        elif "norm" not in name:
            # Ordinary numbers, like every other projection: the engine does real work.
            assert 0.04 < float(t.std()) < 0.06, name


def test_target_logits_are_the_drafts(target_weights: Weights, weights: Weights,
                                      tokenizer: Tokenizer) -> None:
    # Why the draft is right about every token: the pass-through layers add +0.0 to the
    # residual stream, so the target's logits are the demo model's, exactly.
    ids = tokenizer.encode("class LRUCache:\n    def get(self, key):", add_special_tokens=False).ids
    for n in (1, 5, len(ids)):
        np.testing.assert_array_equal(_reference_logits(target_weights, ids[:n]),
                                      _reference_logits(weights, ids[:n]))
