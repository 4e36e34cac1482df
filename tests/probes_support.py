"""Idle-gate and telemetry settings for tests that are not about the idle gate.

Legs in tests must not wait seconds for idleness or fail because the test machine
is busy: two quick snapshots, no thresholds. The idle gate itself is tested with a
fake probe (test_probes.py) and the real host in test_leg_fake.py.
"""

from __future__ import annotations

from tokrecord.probes.idle import IdleCriteria
from tokrecord.probes.telemetry import TelemetryConfig

FAST_IDLE = IdleCriteria(interval_s=0.02, consecutive=2, timeout_s=30, host_cpu_max_pct=None,
                         device_util_max_pct=None, device_mem_used_max_mib=None,
                         device_processes_max=None)
FAST_TELEMETRY = TelemetryConfig(interval_s=0.25)
FAST_IDLE_ARGS = ("--idle", "interval_s=0.02", "--idle", "consecutive=2", "--idle",
                  "host_cpu_max_pct=100", "--idle", "device_util_max_pct=100")
FAST_IDLE_TOML = """
[idle]
interval_s = 0.02
consecutive = 2
timeout_s = 30
host_cpu_max_pct = 100
device_util_max_pct = 100

[telemetry]
interval_s = 0.25
"""
# The same, as the `idle` and `telemetry` sections of a plan given as a dict.
FAST_PLAN_SECTIONS = {"idle": FAST_IDLE.model_dump(mode="json"),
                      "telemetry": FAST_TELEMETRY.model_dump(mode="json")}


class FakeClock:
    """A clock the idle gate's sleep advances: seconds pass only when asked to."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
