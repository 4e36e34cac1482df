"""What the real-engine tests (tests/real_engines/) share: a short suite and quick idle gates."""

from __future__ import annotations

from typing import Final

from tokrecord.probes.idle import IdleCriteria

# The first SHORT_ROWS rows of the built-in suite, which keep its long-context row (row 6,
# 850-900 prompt tokens) and a row after it, each cut to SHORT_MAX_TOKENS: the headline
# window (tokens 1..100 after the first) is still full, at a quarter of the tokens per row.
SHORT_ROWS: Final = 8
SHORT_MAX_TOKENS: Final = 128
# Real idle gates with real probes, quickly: snapshots every 0.25 s, two in a row, and no
# host-CPU threshold, because other work on a shared test machine is not the engine's
# fault (the thresholds are tested with a fake probe in tests/probes/test_probes.py).
ENGINE_IDLE: Final = IdleCriteria(interval_s=0.25, consecutive=2, timeout_s=60,
                                  host_cpu_max_pct=None, device_util_max_pct=None,
                                  device_mem_used_max_mib=None, device_processes_max=None)
# vLLM CPU compiles the model with torch.compile at every server start unless told not to:
# minutes of one core per start on a busy 2-core machine, the larger part of each leg. The
# engine tests run it eagerly; the compiled path is the demo's (`make demo ENGINE=vllm`).
VLLM_EAGER: Final = ("--enforce-eager",)
