"""The fake tokenizer, the output it generates and the absolute schedule of its writes."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Mapping, Sequence

from tokrecord.server.fake.constants import OUTPUT_STRIDE, SPIN_NS, VOCAB_SIZE


def prompt_token_ids(text: str) -> list[int]:
    """The fake tokenizer: one token per whitespace-separated word."""
    return [zlib.crc32(word.encode("utf-8")) % VOCAB_SIZE for word in text.split()]


def output_token_ids(prompt_key: str, n: int) -> list[int]:
    """The n output token ids the fake server generates for a prompt key."""
    seed = zlib.crc32(prompt_key.encode("utf-8"))
    return [(seed + OUTPUT_STRIDE * k) % VOCAB_SIZE for k in range(n)]


def token_text(token_id: int) -> str:
    return f" t{token_id}"


def chat_prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    """The fake chat template: `<|role|> content ` per message, then `<|assistant|>`."""
    return "".join(f"<|{m['role']}|> {m['content']} " for m in messages) + "<|assistant|>"


def chunk_plan(n: int, tokens_per_chunk: int) -> list[range]:
    """Token positions per chunk: token 0 alone (prefill), then groups of K."""
    if n <= 0:
        return []
    return [range(0, 1)] + [
        range(start, min(start + tokens_per_chunk, n)) for start in range(1, n, tokens_per_chunk)
    ]


def due_ns(t_first_ns: int, k: int, tok_s: float) -> int:
    return t_first_ns + round(k * 1e9 / tok_s)


def wait_until(deadline_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Sleep to about `spin_ns` before the deadline, then spin; never returns early."""
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining > spin_ns:
        time.sleep((remaining - spin_ns) / 1e9)
    while time.perf_counter_ns() < deadline_ns:
        pass


def chunk_frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame: hex length CRLF payload CRLF."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def sse_event(obj: object) -> bytes:
    return b"data: " + _dumps(obj).encode("utf-8") + b"\n\n"


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
