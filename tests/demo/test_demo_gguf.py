"""The demo model as GGUF: byte-identical rebuilds, manifest, keys, tensors, q/k permutation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

gguf = pytest.importorskip("gguf")

from safetensors.numpy import load_file  # noqa: E402

from tokrecord.demo import gguf as demo_gguf  # noqa: E402
from tokrecord.demo import model as demo  # noqa: E402

F32 = npt.NDArray[np.float32]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def gguf_file(cache: Path) -> Path:
    return demo_gguf.build_demo_gguf(cache)


@pytest.fixture(scope="module")
def reader(gguf_file: Path) -> Any:
    return gguf.GGUFReader(str(gguf_file))


@pytest.fixture(scope="module")
def weights(cache: Path) -> dict[str, F32]:
    return load_file(str(demo.build_demo_model(cache) / "model.safetensors"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def _tensor(reader: Any, name: str) -> F32:
    (t,) = [t for t in reader.tensors if t.name == name]
    return np.asarray(t.data)


def test_layout_and_manifest(gguf_file: Path, cache: Path) -> None:
    model_dir = demo.build_demo_model(cache)
    gguf_dir = gguf_file.parent
    assert gguf_file.name == demo_gguf.GGUF_FILE_NAME
    assert gguf_dir.name == f"{demo_gguf.GGUF_DIR_PREFIX}-{demo_gguf.gguf_spec_hash(model_dir)[:12]}"
    names = sorted(p.name for p in gguf_dir.iterdir())
    assert names == sorted([demo_gguf.GGUF_FILE_NAME, demo.MANIFEST_NAME])
    assert demo.read_manifest(gguf_dir) == {demo_gguf.GGUF_FILE_NAME: _sha256(gguf_file)}
    assert demo.verify_manifest(gguf_dir) == []
    # The source model directory is left exactly as built (its own manifest still verifies).
    assert demo.verify_manifest(model_dir) == []


def test_rebuild_is_byte_identical(gguf_file: Path, tmp_path: Path) -> None:
    again = demo_gguf.build_demo_gguf(tmp_path / "other")
    assert again != gguf_file
    assert _sha256(again) == _sha256(gguf_file)
    assert (again.parent / demo.MANIFEST_NAME).read_bytes() == (
        gguf_file.parent / demo.MANIFEST_NAME
    ).read_bytes()


def test_cached_file_is_reused_and_damage_rebuilds(tmp_path: Path) -> None:
    first = demo_gguf.build_demo_gguf(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert demo_gguf.build_demo_gguf(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    digest = _sha256(first)
    with first.open("r+b") as f:
        f.seek(-4, 2)
        f.write(b"\0\0\0\1")
    assert demo.verify_manifest(first.parent) != []
    assert _sha256(demo_gguf.build_demo_gguf(tmp_path)) == digest


def test_architecture_keys(reader: Any) -> None:
    c = demo.MODEL_CONFIG
    expected = {
        "general.architecture": "llama",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        "llama.vocab_size": c["vocab_size"],
        "llama.context_length": c["max_position_embeddings"],
        "llama.embedding_length": c["hidden_size"],
        "llama.block_count": c["num_hidden_layers"],
        "llama.feed_forward_length": c["intermediate_size"],
        "llama.attention.head_count": c["num_attention_heads"],
        "llama.attention.head_count_kv": c["num_key_value_heads"],
        "llama.attention.key_length": c["head_dim"],
        "llama.attention.value_length": c["head_dim"],
        "llama.rope.dimension_count": c["head_dim"],
    }
    for key, value in expected.items():
        assert _field(reader, key) == value, key
    assert _field(reader, "llama.rope.freq_base") == pytest.approx(c["rope_theta"])
    assert _field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(c["rms_norm_eps"])


def test_tokenizer_keys(reader: Any, cache: Path) -> None:
    tok = json.loads((demo.build_demo_model(cache) / "tokenizer.json").read_text(encoding="utf-8"))
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    assert tokens == [by_id[i] for i in range(demo.VOCAB_SIZE)]
    types = _field(reader, "tokenizer.ggml.token_type")
    n_special = len(demo.SPECIAL_TOKENS)
    assert types[:n_special] == [int(gguf.TokenType.CONTROL)] * n_special
    assert set(types[n_special:]) == {int(gguf.TokenType.NORMAL)}
    assert _field(reader, "tokenizer.ggml.merges") == [" ".join(m) for m in tok["model"]["merges"]]
    assert _field(reader, "tokenizer.ggml.bos_token_id") == demo.BOS_TOKEN_ID
    assert _field(reader, "tokenizer.ggml.eos_token_id") == demo.EOS_TOKEN_ID
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.chat_template") == demo.CHAT_TEMPLATE


def test_tensors_match_safetensors(reader: Any, weights: dict[str, F32]) -> None:
    c = demo.MODEL_CONFIG
    assert len(reader.tensors) == len(weights)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    np.testing.assert_array_equal(_tensor(reader, "token_embd.weight"), weights["model.embed_tokens.weight"])
    np.testing.assert_array_equal(_tensor(reader, "output.weight"), weights["lm_head.weight"])
    np.testing.assert_array_equal(
        _tensor(reader, "blk.3.ffn_down.weight"), weights["model.layers.3.mlp.down_proj.weight"]
    )
    np.testing.assert_array_equal(
        _tensor(reader, "blk.0.attn_v.weight"), weights["model.layers.0.self_attn.v_proj.weight"]
    )
    # q and k are stored permuted (same values, rows reordered per head).
    q_hf = weights["model.layers.0.self_attn.q_proj.weight"]
    k_hf = weights["model.layers.0.self_attn.k_proj.weight"]
    np.testing.assert_array_equal(
        _tensor(reader, "blk.0.attn_q.weight"),
        demo_gguf.hf_to_gguf_rope_permute(q_hf, c["num_attention_heads"]),
    )
    np.testing.assert_array_equal(
        _tensor(reader, "blk.0.attn_k.weight"),
        demo_gguf.hf_to_gguf_rope_permute(k_hf, c["num_key_value_heads"]),
    )


def test_permute_interleaves_the_two_halves_of_each_head() -> None:
    w = np.arange(2 * 8, dtype=np.float32).reshape(2 * 8, 1)  # 2 heads of dim 8
    got = demo_gguf.hf_to_gguf_rope_permute(w, 2)[:, 0].tolist()
    assert got == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def _rope_neox(x: npt.NDArray[np.float64], pos: int, theta: float) -> npt.NDArray[np.float64]:
    """HF Llama's rotate_half RoPE on one head: pairs (j, j + d/2)."""
    d = x.shape[0]
    ang = pos / theta ** (np.arange(0, d, 2) / d)
    a, b = x[: d // 2], x[d // 2 :]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)])


def _rope_norm(x: npt.NDArray[np.float64], pos: int, theta: float) -> npt.NDArray[np.float64]:
    """llama.cpp's LLAMA RoPE (rope type NORM) on one head: adjacent pairs (2j, 2j + 1)."""
    d = x.shape[0]
    ang = pos / theta ** (np.arange(0, d, 2) / d)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[1::2] = b * np.cos(ang) + a * np.sin(ang)
    return out


def test_permuted_projection_under_llamacpp_rope_equals_hf_rope() -> None:
    # Why the permutation is right: llama.cpp's rotation of the permuted projection is the
    # permutation of HF's rotation, so every q.k attention score is unchanged.
    rng = np.random.default_rng(0)
    d, n_head, theta = 64, 2, 10000.0
    w = rng.standard_normal((n_head * d, 16)).astype(np.float32)
    x = rng.standard_normal(16)
    w_gguf = demo_gguf.hf_to_gguf_rope_permute(w, n_head)
    order = demo_gguf.hf_to_gguf_rope_permute(np.arange(n_head * d, dtype=np.float32)[:, None], n_head)
    perm = order[:, 0].astype(int)
    for pos in (0, 1, 17, 1000):
        for h in range(n_head):
            rows = slice(h * d, (h + 1) * d)
            hf = _rope_neox((w @ x)[rows], pos, theta)
            gg = _rope_norm((w_gguf @ x)[rows], pos, theta)
            np.testing.assert_allclose(gg, hf[perm[rows] - h * d], rtol=1e-6, atol=1e-6)


def test_cli_prints_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_gguf.main(["--cache-dir", str(tmp_path)]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.is_file() and printed.suffix == ".gguf"


def test_target_gguf_layers_name_and_zero_projections(cache: Path, gguf_file: Path) -> None:
    target = demo_gguf.build_demo_target_gguf(cache)
    extra = demo.TARGET_EXTRA_LAYERS
    name = demo.model_name(extra)
    assert target.name == f"{name}.gguf" and target.parent.name.startswith(f"{name}-gguf-")
    assert demo_gguf.build_demo_gguf(cache) == gguf_file  # the draft is the plain demo GGUF
    r = gguf.GGUFReader(str(target))
    layers = demo.MODEL_CONFIG["num_hidden_layers"] + extra
    assert _field(r, "llama.block_count") == layers
    assert _field(r, "general.name") == name
    assert len(r.tensors) == 3 + 9 * layers  # embeddings, output norm, head + 9 per layer
    draft = gguf.GGUFReader(str(gguf_file))
    for t in draft.tensors:  # every draft tensor is in the target, unchanged
        np.testing.assert_array_equal(_tensor(r, t.name), np.asarray(t.data), err_msg=t.name)
    for i in range(demo.MODEL_CONFIG["num_hidden_layers"], layers):
        assert not np.any(_tensor(r, f"blk.{i}.attn_output.weight"))
        assert not np.any(_tensor(r, f"blk.{i}.ffn_down.weight"))
        assert np.any(_tensor(r, f"blk.{i}.attn_q.weight"))
    assert _field(r, "tokenizer.ggml.tokens") == _field(draft, "tokenizer.ggml.tokens")
