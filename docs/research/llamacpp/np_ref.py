"""float64 numpy forward pass of the HF-layout demo Llama: greedy ids and top-2 margins."""
import json, sys
import numpy as np
from safetensors.numpy import load_file
M = "/root/.cache/tokrecord/models/tokrecord-demo-llama-e457d12a04dc"
cfg = json.load(open(f"{M}/config.json"))
W = {k: v.astype(np.float64) for k, v in load_file(f"{M}/model.safetensors").items()}
H, NH, NKV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
eps, theta, L = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["num_hidden_layers"]
inv = 1.0 / theta ** (np.arange(0, D, 2) / D)

def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos):  # x [n, heads, D], HF rotate_half
    f = np.outer(pos, inv); emb = np.concatenate([f, f], -1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin

class KV:
    def __init__(s): s.k = [np.zeros((0, NKV, D))] * L; s.v = [np.zeros((0, NKV, D))] * L

def forward(ids, start, kv):
    x = W["model.embed_tokens.weight"][ids]; n = len(ids); pos = np.arange(start, start + n)
    for i in range(L):
        p = f"model.layers.{i}"
        h = rms(x, W[f"{p}.input_layernorm.weight"])
        q = (h @ W[f"{p}.self_attn.q_proj.weight"].T).reshape(n, NH, D)
        k = (h @ W[f"{p}.self_attn.k_proj.weight"].T).reshape(n, NKV, D)
        v = (h @ W[f"{p}.self_attn.v_proj.weight"].T).reshape(n, NKV, D)
        q, k = rope(q, pos), rope(k, pos)
        kv.k[i] = np.concatenate([kv.k[i], k]); kv.v[i] = np.concatenate([kv.v[i], v])
        K = np.repeat(kv.k[i], NH // NKV, axis=1); V = np.repeat(kv.v[i], NH // NKV, axis=1)
        s = np.einsum("qhd,khd->hqk", q, K) / np.sqrt(D)
        T = K.shape[0]; mask = np.arange(T)[None, :] > (pos[:, None]); s = np.where(mask[None], -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, V).reshape(n, NH * D)
        x = x + o @ W[f"{p}.self_attn.o_proj.weight"].T
        h = rms(x, W[f"{p}.post_attention_layernorm.weight"])
        g = h @ W[f"{p}.mlp.gate_proj.weight"].T; u = h @ W[f"{p}.mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[f"{p}.mlp.down_proj.weight"].T
    return rms(x[-1], W["model.norm.weight"]) @ W["lm_head.weight"].T

def greedy(prompt_ids, n, forced=None):
    """Greedy from prompt; if forced is given, follow it (teacher forcing) and report margins."""
    kv = KV(); logits = forward(np.array(prompt_ids), 0, kv); out, margins = [], []
    for t in range(n):
        top = np.argsort(logits)[::-1][:2]; out.append(int(top[0])); margins.append(float(logits[top[0]] - logits[top[1]]))
        nxt = forced[t] if forced is not None else int(top[0])
        logits = forward(np.array([nxt]), len(prompt_ids) + t, kv)
    return out, margins

if __name__ == "__main__":
    v = json.load(open("vllm_ref.json")); d = json.load(open(sys.argv[1] + ".json"))
    res = {}
    for rid in sys.argv[2:]:
        ref, ll = v[rid]["ids"], d["rows"][rid]["ids_nonstream"]
        k = next(i for i, (a, b) in enumerate(zip(ll, ref)) if a != b)
        ids, m = greedy(v[rid]["prompt_ids"], k + 1)
        print(f"{rid}: diverge at {k}: vllm={ref[k]} llama={ll[k]} float64={ids[k]}; prefix float64==vllm: {ids[:k]==ref[:k]};"
              f" float64 top-2 margin at {k}: {m[k]:.5f}; min margin before: {min(m[:k]):.4f}", flush=True)
