"""Constants shared by the fake server's modules."""

from __future__ import annotations

ENV_PREFIX = "TOKRECORD_FAKE_"
DEFAULT_MODEL = "tokrecord-fake"
DEFAULT_MAX_TOKENS = 16
VOCAB_SIZE = 4096
OUTPUT_STRIDE = 7919
# Sleep until this long before a due time, then spin: time.sleep overshoots by tens
# of microseconds to a millisecond, a spin on perf_counter_ns does not.
SPIN_NS = 1_000_000
CHILD_CODE = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
MALFORMED_EVENT = b"data: {not json\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
LAST_CHUNK = b"0\r\n\r\n"
FINISH_REASONS = ("stop", "length", "abort")
# What --dialect accepts (tokrecord.server.fake.dialects has one module per engine).
DIALECT_NAMES = ("vllm", "llama.cpp", "sglang", "openai")
# tokrecord.server.process.LEG_ENV, the leg name the harness exports to every server it
# starts. Spelled here, not imported: tokrecord.server.process pulls in every engine
# adapter and numpy, which tripled each fake server's start-up (0.45 s of CPU, not 0.1 s).
# tests/server/test_fake_server.py checks that the two spellings agree.
LEG_ENV = "TOKRECORD_LEG"
