"""Paced servers the client was never tuned against, each of its own I/O design.

The packaged fake server (`tokrecord.server.fake`) is the server tokrecord's token
loop was tuned on; a figure that holds only there is not a result. These two share
nothing with it but the wire format (vLLM's streamed `/v1/completions` with
`token_ids` and continuous usage) and the send-log format that `truth.py` reads:

- `threaded`: `socketserver` threads, HTTP parsed by hand, `time.sleep` pacing and
  one `sendall` per chunk; the log stamp is taken just before each `sendall`.
- `aio`: one asyncio event loop with a `Protocol` per connection, as uvicorn (vLLM's
  and SGLang's API server) is; pacing by `loop.call_at`, one `transport.write` per
  chunk; the log stamp is taken just before each write.

Neither spins: they sleep to the due time, as real servers wait on their GPU.
"""
