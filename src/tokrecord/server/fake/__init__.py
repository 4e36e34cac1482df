"""A paced fake streaming LLM server: a measuring reference.

Users run it to check their setup (`python -m tokrecord.server.fake --port 8000`);
the tests use it in place of a real engine. Standard library only, so it starts in
a fraction of a second and depends on nothing that could move its timing.

Dialects (`--dialect`, env TOKRECORD_FAKE_DIALECT; tokrecord.server.fake.dialects, one
module per engine): `vllm` (the default, described below), `openai` (vLLM's routes
without its extensions), `llama.cpp` (native /completion, no `[DONE]`, the socket
closed after each stream) and `sglang` (native /generate with cumulative `meta_info`).
Every dialect keeps the schedule, the tokens, the fault injection and the JSONL log
below; what differs is the bytes, the routes, the error bodies, /metrics and the
server's log lines, each module's docstring says how.

Schedule (all times `time.perf_counter_ns`, the client's clock on the same machine)
    t_req   = when the request's headers have been read (handler entry)
    t_first = t_req + ttft_ms
    due(k)  = t_first + round(k * 1e9 / tok_s)          token k = 0..n-1
The schedule is absolute: every write waits for its own due time (sleep to ~1 ms
before, then spin), so a late write never delays the next one.

Chunks (`--tokens-per-chunk K`) follow what a speculative-decoding engine emits:
chunk 0 holds token 0 alone (the prefill step) and is written at due(0), which is
exactly TTFT; chunk j >= 1 holds tokens 1+(j-1)K .. min(jK, n-1), one verify cycle,
and is written when its LAST token is due. K = 1 is one token per chunk. Each chunk
is one chunked-transfer frame written with one socket write; for chat, vLLM's
role-only first event travels in the same write as chunk 0, as its own frame.

Speculative-decoding counters (exposed only when K > 1): each chunk j >= 1 is one
draft cycle that proposed K-1 draft tokens and had (tokens in chunk - 1) of them
accepted. So `accepted + cycles` equals the decode tokens n-1, and a short last
chunk shows up as a (realistically) imperfect acceptance rate.

Tokens: a prompt is "tokenized" by splitting on whitespace, id = crc32(word) % 4096
(a prompt given as token ids is used as is). Output token k has id
(crc32(prompt key) + 7919 k) % 4096 and text f" t{id}"; the key is the prompt's
UTF-8 text (token-id prompts: the ids joined by single spaces; chat: the rendered
text of `chat_prompt_text`). Same prompt, same output, always.

vLLM's wire format (dialects/openai.py): completions chunks serialise every field
(nulls included, as vLLM's `exclude_unset=False` does); chat chunks only the fields
vLLM sets. Continuous usage needs `include_usage` as well, as in vLLM. One knowing
difference: the final usage object always carries `prompt_tokens_details`
`{"cached_tokens": 0}`, which vLLM omits when nothing was cached.

Log (`--log`, JSONL, created exclusively, one flushed line per event):
    {"kind":"request","req":i,"t_ns":t_req,"path":..,"body":{..}}   every generation POST
    {"kind":"chunk","req":i,"t_ns":<after the write>,"due_ns":..,"tokens":[k..],"n":..,"ids":[..]}
    {"kind":"malformed","req":i,"t_ns":..}                           injected bad event
    {"kind":"done","req":i,"t_ns":..,"tokens":sent,"finish_reason":..,"outcome":..}
outcome is complete, cut, disconnected, failed (--fail-status), not_ready or rejected
(a 4xx answer). Only token-carrying writes have chunk lines; the role event rides in
chunk 0's write, and the usage event, `[DONE]` and the last zero-length frame go out
in one write right after the last token chunk.

Not-ready (`--ready-after-s`, `--never-ready`) answers 503 on /health, /v1/models and
generation; /metrics always answers. `--malformed-after-tokens M` injects one
`data: {not json` event after the chunk that brings the count to M (before the
first chunk when M = 0) and then carries on to a normal end. `--cut-after-tokens C`
(C <= n) sends exactly C tokens, none marked finished, then closes the connection
without the terminating zero-length chunk. Both apply to streams only; a cut
non-streaming request is closed without a response.
"""

from tokrecord.server.fake.config import FakeServerConfig, config_from_args, leg_speed_factor
from tokrecord.server.fake.constants import (
    DEFAULT_MODEL,
    ENV_PREFIX,
    VOCAB_SIZE,
)
from tokrecord.server.fake.serve import main, serve
from tokrecord.server.fake.state import FakeServer
from tokrecord.server.fake.tokens import (
    chat_prompt_text,
    chunk_frame,
    chunk_plan,
    due_ns,
    output_token_ids,
    prompt_token_ids,
    token_text,
)

__all__ = [
    "DEFAULT_MODEL", "ENV_PREFIX", "VOCAB_SIZE", "FakeServer", "FakeServerConfig",
    "chat_prompt_text", "chunk_frame", "chunk_plan", "config_from_args", "due_ns",
    "leg_speed_factor", "main", "output_token_ids", "prompt_token_ids", "serve", "token_text",
]
