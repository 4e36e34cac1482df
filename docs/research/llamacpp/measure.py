"""Measure llama.cpp's HTTP server (xllamacpp launcher) on the demo GGUF.

usage: measure.py LABEL PORT [extra llama-server args...]
Writes LABEL.json (per-row token ids, chunk timestamps, final chunks) and prints a summary.
"""
from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent
PY = "/root/.cache/tokrecord/scratch/xllamacpp/bin/python"
GGUF = "/root/.cache/tokrecord/models/tokrecord-demo-llama-gguf-7e0b21686c03/tokrecord-demo-llama.gguf"
SUITE = "/work/main/src/tokrecord/data/suite-default.jsonl"

label, port = sys.argv[1], int(sys.argv[2])
extra = sys.argv[3:]
base = f"http://127.0.0.1:{port}"
rows = [json.loads(line) for line in open(SUITE)]
out: dict = {"label": label, "extra": extra}


def sse_events(resp: httpx.Response):
    """Yield (t_read, data_str) per SSE data event, timestamped when its bytes arrived."""
    buf = b""
    for raw in resp.iter_raw():
        t = time.perf_counter()
        buf += raw
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: "):
                    yield t, line[6:].decode()
                elif line.startswith(b":"):
                    yield t, "#comment " + line.decode()


argv = [PY, str(HERE.parents[2] / "src" / "tokrecord" / "data" / "llama_server.py"), "-m", GGUF, "--host", "127.0.0.1", "--port", str(port),
        "-t", "1", "-np", "1", "--metrics", *extra]
log = open(HERE / f"{label}.server.log", "w")
t0 = time.perf_counter()
proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
import atexit
atexit.register(lambda: proc.poll() is None and proc.kill())
first_conn = None
ready = None
health_codes = []
while time.perf_counter() - t0 < 60:
    try:
        r = httpx.get(base + "/health", timeout=1)
        if first_conn is None:
            first_conn = time.perf_counter() - t0
        health_codes.append(r.status_code)
        if r.status_code == 200:
            ready = time.perf_counter() - t0
            break
    except httpx.TransportError:
        pass
    time.sleep(0.005)
assert proc.poll() is None, "server exited (port in use?)"
out["ready_s"] = ready
out["first_http_s"] = first_conn
out["health_codes_seen"] = sorted(set(health_codes))
print(f"[{label}] first HTTP answer {first_conn:.3f}s, /health 200 at {ready:.3f}s (codes {sorted(set(health_codes))})")

c = httpx.Client(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
for ep in ("/health", "/props", "/slots", "/v1/models", "/models"):
    r = c.get(base + ep)
    out[ep] = {"status": r.status_code, "body": r.text[:6000]}

# prompt tokenisation, for comparison with vLLM's prompt_token_ids
out["tokenize"] = {}
for row in rows:
    r = c.post(base + "/tokenize", json={"content": row["prompt"]})
    out["tokenize"][row["id"]] = r.json().get("tokens")

# connection behaviour: raw HTTP/1.1 keep-alive request, then see whether the server hangs up
def raw_stream_then_check(path: str, body: dict) -> dict:
    s = socket.create_connection(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    req = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
           f"Connection: keep-alive\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    s.sendall(req)
    data = b""
    s.settimeout(60)
    closed = False
    t_done = None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            closed = True
            break
        data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        is_chunked = b"chunked" in head.lower()
        clen = None
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                clen = int(line.split(b":")[1])
        if (is_chunked and rest.endswith(b"0\r\n\r\n")) or (clen is not None and len(rest) >= clen):
            t_done = time.perf_counter()
            s.settimeout(6)
            try:
                more = s.recv(65536)
                closed = more == b""
            except TimeoutError:
                closed = False
            break
    waited = time.perf_counter() - t_done if t_done else None
    head = data.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
    second = None
    if not closed:
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(2)
            second = s.recv(4096)[:40].decode(errors="replace")
        except OSError as e:
            second = repr(e)
    s.close()
    return {"headers": head, "closed_after": closed, "eof_after_s": waited if closed else None,
            "second_request_same_socket": second}

out["conn_native"] = raw_stream_then_check(
    "/completion", {"prompt": rows[0]["prompt"], "n_predict": 8, "stream": True, "cache_prompt": False,
                    "temperature": 0})
out["conn_oai"] = raw_stream_then_check(
    "/v1/completions", {"prompt": rows[0]["prompt"], "max_tokens": 8, "stream": True, "temperature": 0})
out["conn_nonstream"] = raw_stream_then_check(
    "/completion", {"prompt": rows[0]["prompt"], "n_predict": 8, "stream": False, "cache_prompt": False,
                    "temperature": 0})
print(f"[{label}] conn native: closed_after={out['conn_native']['closed_after']}; oai: {out['conn_oai']['closed_after']};"
      f" non-stream: {out['conn_nonstream']['closed_after']}")

# OpenAI /v1/completions stream sample
body = {"model": "x", "prompt": rows[0]["prompt"], "max_tokens": 16, "stream": True, "temperature": 0,
        "stream_options": {"include_usage": True}, "return_tokens": True, "return_token_ids": True,
        "cache_prompt": False}
with c.stream("POST", base + "/v1/completions", json=body) as r:
    ev = [d for _, d in sse_events(r)]
out["oai_stream_sample"] = {"status": r.status_code, "headers": dict(r.headers), "first": ev[:2], "last": ev[-3:],
                            "n_events": len(ev)}

# the suite, native /completion streaming
import os
out["rows"] = {}
REPS = int(os.environ.get("REPS", "1"))
for rep, row in [(rep, row) for rep in range(REPS) for row in rows]:
    body = {"prompt": row["prompt"], "n_predict": row["max_tokens"], "stream": True, "cache_prompt": False,
            "temperature": 0, "return_tokens": True}
    ts, ids_per_chunk, raws, npred_seen, counts = [], [], [], [], []
    t_send = time.perf_counter()
    with c.stream("POST", base + "/completion", json=body) as r:
        hdrs = dict(r.headers)
        for t, d in sse_events(r):
            if d.startswith("#comment"):
                continue
            j = json.loads(d)
            raws.append(d)
            toks = j.get("tokens") or []
            n_new = j.get("tokens_predicted", 0) - (npred_seen[-1] if npred_seen else 0)
            if n_new > 0 or toks:
                ts.append(t)
                ids_per_chunk.append(toks)
                npred_seen.append(j.get("tokens_predicted", 0))
                counts.append(n_new)
            final = j if j.get("stop") else None
    ids = [x for ch in ids_per_chunk for x in ch]
    # per-token timestamps: a chunk stands for tokens_predicted(now) - tokens_predicted(before)
    # tokens (more than its one id when text was held back for an incomplete UTF-8 tail)
    tok_t = [t for t, n in zip(ts, counts) for _ in range(n)]
    ns = c.post(base + "/completion", json={**body, "stream": False}).json()
    rate_1_100 = (99 / (tok_t[99] - tok_t[0])) if len(tok_t) >= 100 and tok_t[99] > tok_t[0] else None
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    n_multi_reads = sum(1 for a, b in zip(ts, ts[1:]) if b == a)  # events that arrived in the same read
    out["rows"][row["id"] if rep == 0 else f"{row['id']}#{rep}"] = {
        "ids": ids, "ids_nonstream": ns.get("tokens"), "chunk_counts": counts,
        "t_rel": [round(t - t_send, 6) for t in ts], "reads_with_many_events": n_multi_reads,
        "n_tokens_timed": len(tok_t), "ttft_s": ts[0] - t_send,
        "total_s": ts[-1] - t_send, "rate_1_100": rate_1_100, "max_gap_s": max(gaps),
        "median_gap_s": statistics.median(gaps), "final": final, "first_raw": raws[0], "last_raw": raws[-1],
        "n_events": len(raws), "headers": hdrs,
    }
    fr = final or {}
    print(f"[{label}] r{rep} {row['id']:24s} ids_streamed={len(ids)} timed={len(tok_t)} nonstream={len(ns.get('tokens') or [])} chunks={len(ids_per_chunk)} multi={sum(1 for n in counts if n > 1)} ttft={ts[0]-t_send:.3f}s "
          f"rate1-100={rate_1_100:.0f}/s overall={(len(tok_t)-1)/(tok_t[-1]-tok_t[0]):.0f}/s max_gap={max(gaps)*1000:.1f}ms "
          f"stop={fr.get('stop_type')} cache_n={fr.get('timings', {}).get('cache_n')} "
          f"draft={fr.get('timings', {}).get('draft_n')}/{fr.get('timings', {}).get('draft_n_accepted')}", flush=True)

out["metrics"] = c.get(base + "/metrics").text
out["slots_after"] = c.get(base + "/slots").text[:6000]
proc.terminate()
try:
    proc.wait(10)
except subprocess.TimeoutExpired:
    proc.kill()
out["exit_code"] = proc.returncode
json.dump(out, open(HERE / f"{label}.json", "w"), indent=1)
print(f"[{label}] done; server exit {proc.returncode}")
