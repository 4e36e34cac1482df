"""Delivery stalls of a hand-started server, seen by a plain client: per pass over the suite,
the rows with a gap over 250 ms between token-carrying reads, the longest gap, and how many
rows have a rated headline window (tokens 1..100 not delivered in one read).

    .venv/bin/python -m bench.stalls --show-cmd vllm          # the demo's server command
    .venv/bin/python -m bench.stalls --show-cmd llama.cpp
    (start that server by hand, with whatever placement or environment is being tried)
    .venv/bin/python -m bench.stalls --dialect vllm --port 8000 --passes 2 [--pin 1]

Figures, not a test. The client is the standard library only (http.client; a read is
stamped when it returns and parsed after the stream, as bench/fidelity's floor client
does), so a stall it shows is the server's delivery, not tokrecord's token loop. It is
how issue 18's levers (CPU placement, VLLM_CPU_* settings, in-process engine) were
measured before and after.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bench.fidelity.floor_client import timed_reads

SERVED_MODEL = "tokrecord-demo"
HEADLINE_LAST = 100


@dataclass(frozen=True)
class RowStats:
    tokens: int
    ttft_ms: float
    max_gap_ms: float
    gaps_over: int  # gaps above the threshold
    rate: float | None  # conventional, tokens 1..100; None when the window came in one read


def _suite(rows: int | None) -> list[dict[str, Any]]:
    text = resources.files("tokrecord").joinpath("data", "suite-default.jsonl").read_text("utf-8")
    suite = [json.loads(line) for line in text.splitlines() if line.strip()]
    return suite[:rows] if rows else suite


def _body(dialect: str, row: dict[str, Any]) -> tuple[str, bytes]:
    if dialect == "llama.cpp":
        return "/completion", json.dumps({
            "prompt": row["prompt"], "n_predict": row["max_tokens"], "temperature": 0,
            "stream": True, "return_tokens": True, "cache_prompt": False}).encode()
    return "/v1/completions", json.dumps({
        "model": SERVED_MODEL, "prompt": row["prompt"], "max_tokens": row["max_tokens"],
        "temperature": 0, "stream": True, "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).encode()


def _tokens(dialect: str, obj: dict[str, Any], seen: int) -> tuple[int, int]:
    """(tokens this event carries, cumulative count) from the server's own counts."""
    if dialect == "llama.cpp":
        total = obj.get("tokens_predicted")
        if isinstance(total, int):
            return total - seen, total
        n = len(obj.get("tokens") or [])
        return n, seen + n
    choices = obj.get("choices") or []
    n = len(choices[0].get("token_ids") or []) if choices else 0
    return n, seen + n


def stream_row(host: str, port: int, dialect: str, row: dict[str, Any],
               gap_ms: float) -> RowStats:
    path, body = _body(dialect, row)
    # A fresh connection per row: llama.cpp closes it after each stream anyway.
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t_send, reads = timed_reads(conn, path, body, "stalls")
    conn.close()
    # Each event takes the time of the read that completed it.
    stamps: list[tuple[int, int]] = []  # (time, cumulative tokens) of token-carrying events
    buffer = b""
    seen = 0
    for t, data in reads:
        buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ").strip()
            if not payload or payload == b"[DONE]":
                continue
            n, seen = _tokens(dialect, json.loads(payload), seen)
            if n > 0:
                stamps.append((t, seen))
    if not stamps:
        raise SystemExit(f"row {row['id']}: no tokens received")
    times = [t for t, _ in stamps]
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
    # Headline window: the read holding token 1 (0-based) to the one holding token 100.
    last = min(HEADLINE_LAST, seen - 1)
    t1 = next(t for t, c in stamps if c > 1)
    tl = next(t for t, c in stamps if c > last)
    rate = (last - 1) * 1e9 / (tl - t1) if last > 1 and tl > t1 else None
    return RowStats(tokens=seen, ttft_ms=(times[0] - t_send) / 1e6,
                    max_gap_ms=max(gaps, default=0.0),
                    gaps_over=sum(g > gap_ms for g in gaps), rate=rate)


def _show_cmd(engine: str, port: int) -> str:
    # Imported here, not at the top: the measuring client itself needs nothing of tokrecord.
    from tokrecord.demo.gguf import build_demo_gguf
    from tokrecord.demo.model import build_demo_model
    from tokrecord.server import embedded, xllamacpp

    models = embedded.cache_root() / "models"
    if engine == "llama.cpp":
        argv, model, env = xllamacpp.llama_server_argv(xllamacpp.ensure_llamacpp()), \
            build_demo_gguf(models), {}
    else:
        argv, model, env = embedded.vllm_argv(embedded.ensure_engine()), \
            build_demo_model(models), embedded.ENGINE_ENV
    filled = [a.format(model=model, host="127.0.0.1", port=port) for a in argv]
    return " ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(filled)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialect", choices=("vllm", "llama.cpp"), default="vllm")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--rows", type=int, default=None, help="first N suite rows (default all)")
    parser.add_argument("--gap-ms", type=float, default=250.0)
    parser.add_argument("--pin", default=None, help="CPUs for this client, e.g. 1 (Linux)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row's figures")
    parser.add_argument("--show-cmd", choices=("vllm", "llama.cpp"), default=None,
                        help="print the demo's server command for this port and exit")
    args = parser.parse_args(argv)
    if args.show_cmd:
        print(_show_cmd(args.show_cmd, args.port))
        return 0
    if args.pin:
        os.sched_setaffinity(0, {int(c) for c in args.pin.split(",")})
    suite = _suite(args.rows)
    passes = []
    load = os.getloadavg()[0]
    print(f"{args.dialect} on {args.host}:{args.port}, {len(suite)} rows x {args.passes} passes, "
          f"gap threshold {args.gap_ms:g} ms, load {load:.2f}", flush=True)
    for p in range(1, args.passes + 1):
        t0 = time.monotonic()
        rows = [stream_row(args.host, args.port, args.dialect, r, args.gap_ms) for r in suite]
        wall = time.monotonic() - t0
        stalled = [i for i, r in enumerate(rows) if r.max_gap_ms > args.gap_ms]
        worst = max(range(len(rows)), key=lambda i: rows[i].max_gap_ms)
        rates = [r.rate for r in rows if r.rate is not None]
        median = f"{statistics.median(rates):.0f}" if rates else "-"
        print(f"pass {p}: rows with a gap > {args.gap_ms:g} ms: {len(stalled)}/{len(rows)} "
              f"{stalled}; max gap {rows[worst].max_gap_ms:.1f} ms (row {worst}); rated "
              f"{len(rates)}/{len(rows)}; median tok/s (1..100) {median}; "
              f"ttft median {statistics.median(r.ttft_ms for r in rows):.0f} ms; "
              f"wall {wall:.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
        passes.append([r.__dict__ for r in rows])
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "passes": passes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
