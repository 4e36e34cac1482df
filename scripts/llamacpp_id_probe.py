"""Which token ids does a llama.cpp server give for one row: streamed (as legs stream),
streamed with `n_probs` / `post_sampling_probs`, and not streamed? Prints, for each,
how many ids arrived and where the stream held one back (docs: README, "Token-exact on
llama.cpp").

    python scripts/llamacpp_id_probe.py --python ENGINE_PYTHON --model MODEL.gguf [--tokens 256]

ENGINE_PYTHON is the xllamacpp engine environment's python (`tokrecord engine --engine
llama.cpp` prints it); the server is started with the demo's flags and stopped after."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tokrecord.server import xllamacpp

PROMPT = "Write a Python LRU cache with TTL."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    buf = b""
    with httpx.stream("POST", url + "/completion", json=body, timeout=300) as response:
        for raw in response.iter_raw():
            buf += raw
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: "):
                    out.append(json.loads(event[len(b"data: "):]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    port = _free_port()
    argv = [a.replace("{model}", str(args.model)).replace("{host}", "127.0.0.1")
            .replace("{port}", str(port)) for a in xllamacpp.llama_server_argv(args.python)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"prompt": PROMPT, "n_predict": args.tokens, "temperature": 0,
                "cache_prompt": False, "return_tokens": True}
        whole = httpx.post(url + "/completion", json={**body, "stream": False}, timeout=300).json()
        ids = list(whole["tokens"])
        print(f"not streamed: {len(ids)} ids for tokens_predicted {whole['tokens_predicted']}")
        for extra in ({}, {"n_probs": 1}, {"n_probs": 1, "post_sampling_probs": True}):
            given: list[int | None] = []
            probs = 0
            last = 0
            for event in _events(url, {**body, "stream": True, **extra}):
                n = int(event["tokens_predicted"]) - last
                last = int(event["tokens_predicted"])
                own = list(event.get("tokens") or [])
                probs += len(event.get("completion_probabilities") or [])
                given += [None] * (n - len(own)) + own  # held back: before the event's own
            held = [i for i, t in enumerate(given) if t is None]
            agree = all(t is None or t == ids[i] for i, t in enumerate(given))
            print(f"streamed {json.dumps(extra)}: {len(given) - len(held)} ids, {probs} "
                  f"probability entries, held back at tokens {held}; the given ids sit where "
                  f"the non-streamed ids are: {agree and len(given) == len(ids)}")
    finally:
        proc.terminate()
        proc.wait(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
