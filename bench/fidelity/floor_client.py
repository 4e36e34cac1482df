"""The floor: a minimal standard-library streaming client, as a reference point.

Its token loop only stamps `perf_counter_ns()` when a read returns and keeps the
bytes; SSE framing and JSON are parsed after the stream ends. Whatever error it
shows is what this machine (scheduler, loopback, Python's I/O) costs any client, so
tokrecord is judged against it measured in the same run, not against a number from
another day. Run by the bench as a subprocess; writes one JSON file:

    {"requests": [{"t_send_ns": .., "chunks": [[t_ns, tokens], ..]}, ..], "cpu_self_s": ..}
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any


def timed_reads(conn: http.client.HTTPConnection, path: str, body: bytes, who: str
                ) -> tuple[int, list[tuple[int, bytes]]]:
    """POST and read the streamed response to its end, stamping each read as it returns:
    (send time, [(read time, bytes)]). Nothing is parsed while the stream runs."""
    reads: list[tuple[int, bytes]] = []
    t_send = time.perf_counter_ns()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{who}: HTTP {resp.status}: {resp.read()[:300]!r}")
    while True:
        data = resp.read1(65536)
        t = time.perf_counter_ns()
        if not data:
            break
        reads.append((t, data))
    return t_send, reads


def stream_one(conn: http.client.HTTPConnection, body: bytes) -> dict[str, Any]:
    t_send, reads = timed_reads(conn, "/v1/completions", body, "floor client")
    # After the stream: every SSE event takes the time of the read that completed it.
    chunks: list[list[int]] = []
    buffer = b""
    for t, data in reads:
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                continue
            obj = json.loads(payload)
            choices = obj.get("choices") or []
            ids = choices[0].get("token_ids") if choices else None
            if ids:
                chunks.append([t, len(ids)])
    return {"t_send_ns": t_send, "chunks": chunks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL with a 'prompt' field")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line]
    conn = http.client.HTTPConnection(args.host, args.port, timeout=600)
    results = []
    for prompt in prompts:
        body = json.dumps({
            "model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }).encode()
        results.append(stream_one(conn, body))
    conn.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    args.out.write_text(json.dumps({"requests": results,
                                    "cpu_self_s": usage.ru_utime + usage.ru_stime}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
