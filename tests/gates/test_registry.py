"""The gate registry (issue 30): one spec per gate, one evaluation loop, versioned so
that a sealed leg is recomputed with the gates it was sealed with; and the clocks gate
it was built to make easy, checked on the real H200 telemetry of examples/h200."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from paths import FIXTURES, ROOT
from tokrecord.engines import ENGINES, Capability, EngineName
from tokrecord.gates import (
    CACHED_TOKENS_ZERO,
    CLOCK_DROP_MAX_PCT,
    CLOCKS_STABLE,
    FIRST_VALID_SCORE,
    GATES,
    GATES_BY_NAME,
    GATES_VERSION,
    GateConfig,
    GateStatus,
    LegEvidence,
    RowOutcome,
    clocks_stable,
    evaluate,
    gates_version,
)
from tokrecord.probes.nvidia import sample_from_nvml, throttle_reasons

PASS, FAIL, NOT_TESTED = GateStatus.PASS, GateStatus.FAIL, GateStatus.NOT_TESTED
EXAMPLES = ROOT / "examples" / "h200"


def outcome(row: int, t_send_ns: int, t_end_ns: int) -> RowOutcome:
    return RowOutcome(row=row, row_id=f"r{row}", prompt_sha256=f"{row:064x}", max_tokens=3,
                      token_ids=(1, 2, 3), text="abc", finish_reason="length", n_tokens=3,
                      completion_tokens=3, prompt_tokens=10, cached_tokens=0,
                      t_send_ns=t_send_ns, t_end_ns=t_end_ns)


ROWS = tuple(outcome(i, i * 1_000, i * 1_000 + 500) for i in range(3))  # window 0..2500 ns


def evidence(**changes: Any) -> LegEvidence:
    """A clean leg of three rows, every request in order, cleanup passed."""
    base: dict[str, Any] = dict(
        outcomes=ROWS, teacher=None, config=GateConfig(), planned_rows=3,
        requests=tuple({"kind": "request", "row": i} for i in range(3)),
        metrics_before={}, server_log="", cleanup_passed=True, surviving_workers=0,
        port_listening_after=False)
    return LegEvidence(**{**base, **changes})


def device(t_ns: int, clock: float | None, reasons: list[str] | None = None,
           backend: str = "nvml") -> dict[str, Any]:
    return {"t_ns": t_ns, "devices": [{"backend": backend, "index": 0, "sm_clock_mhz": clock,
                                       "throttle_reasons": reasons}]}


# --------------------------------------------------------------------------- the registry


def test_each_gate_is_one_spec_with_a_unique_name_and_label() -> None:
    assert len({g.name for g in GATES}) == len(GATES) == len(GATES_BY_NAME)
    assert len({g.label for g in GATES}) == len(GATES)
    assert all(g.explained and g.label for g in GATES)
    assert all((g.check is None) == (g.scope == "experiment") for g in GATES)
    assert GATES_VERSION == 3 and gates_version(f"tokrecord.leg-gates/v{GATES_VERSION}") == 3
    assert gates_version("tokrecord.leg-gates/v1") == 1
    assert gates_version("tokrecord.leg-rows/v2") == gates_version(None) == 2


def test_an_engine_limitation_names_a_capability_some_gate_needs() -> None:
    # Engines declare what they lack, never a gate's name: the registry says which gate
    # needs it, so a renamed gate cannot silently lose its engine's explanation.
    needed = {g.needs for g in GATES if g.needs is not None}
    lacked = {x.lacks for e in ENGINES.values() for x in e.limitations}
    assert lacked and lacked <= needed
    assert [g.name for g in GATES if g.needs is Capability.PREFIX_CACHE_COUNTER] == [
        CACHED_TOKENS_ZERO]
    assert ENGINES[EngineName.OPENAI].limitation(Capability.PREFIX_CACHE_COUNTER) == (
        "a generic OpenAI server documents no prefix-cache counter")
    assert ENGINES[EngineName.OPENAI].limitation(None) is None
    assert ENGINES[EngineName.VLLM].limitation(Capability.PREFIX_CACHE_COUNTER) is None


def test_evaluate_runs_every_leg_gate_in_registry_order() -> None:
    gates = evaluate(evidence())
    leg_specs = [g.name for g in GATES if g.check is not None]
    # No idle evidence (an older leg) means no idle gates; every other leg gate is there.
    assert [g.name for g in gates] == [n for n in leg_specs if not n.startswith("idle_")]


def test_a_passing_gate_is_required_exactly_when_its_spec_says() -> None:
    passed = [g for g in evaluate(evidence()) if g.status is PASS]
    assert {g.name for g in passed} >= {FIRST_VALID_SCORE, "cleanup", "zero_retries"}
    for g in passed:
        assert g.required == GATES_BY_NAME[g.name].required, g.name


def test_a_sealed_leg_is_recomputed_with_the_gates_of_its_version() -> None:
    rerun = dict(attempt=2, earlier_attempts=("complete",))
    v2 = {g.name: g for g in evaluate(evidence(version=2, **rerun))}
    assert CLOCKS_STABLE not in v2  # came with version 3
    # Version 2 sealed the gate that always passed: verify must recompute it as sealed.
    assert v2[FIRST_VALID_SCORE].status is PASS
    assert v2[FIRST_VALID_SCORE].evidence == {"attempts": 1}
    now = {g.name: g for g in evaluate(evidence(**rerun))}
    assert now[FIRST_VALID_SCORE].status is FAIL
    assert now[CLOCKS_STABLE].status is NOT_TESTED and not now[CLOCKS_STABLE].required


# --------------------------------------------------------------------------- clocks stable


def test_clocks_not_tested_without_accelerator_clocks() -> None:
    for samples in ([], [{"t_ns": 100, "devices": []}], [device(100, None)],
                    [device(9_999, 1980.0)]):  # the last falls outside the rows' window
        g = clocks_stable(ROWS, samples)
        assert g.status is NOT_TESTED and not g.blocks_validity, samples


def test_clocks_pass_within_the_bound_and_fail_beyond_it() -> None:
    within = 1980 * (1 - (CLOCK_DROP_MAX_PCT - 0.1) / 100)
    g = clocks_stable(ROWS, [device(100, 1980.0, []), device(1_500, within, [])])
    assert g.status is PASS and g.count == "1/1"
    assert g.evidence["devices"]["nvml:0"]["drop_pct"] == pytest.approx(
        CLOCK_DROP_MAX_PCT - 0.1, abs=1e-3)
    beyond = 1980 * (1 - (CLOCK_DROP_MAX_PCT + 0.1) / 100)
    g = clocks_stable(ROWS, [device(100, 1980.0, []), device(1_500, beyond, [])])
    assert g.status is FAIL and g.count == "0/1" and not g.required
    assert g.reason.startswith("nvml:0's SM clock fell 2.1 % (1980 to ")


def test_clocks_fail_on_a_throttle_reason_even_at_full_clock() -> None:
    g = clocks_stable(ROWS, [device(100, 1980.0, []), device(900, 1980.0, ["sw_thermal_slowdown"])])
    assert g.status is FAIL
    assert g.reason == "nvml:0 reported sw_thermal_slowdown in 1 of 2 samples"


def test_clocks_without_reasons_say_only_the_clock_was_checked() -> None:
    g = clocks_stable(ROWS, [device(100, 1980.0, backend="nvidia-smi")])
    assert g.status is PASS
    assert g.reason.endswith("nvidia-smi:0 reports no throttle reasons, so only the clock "
                             "was checked")


def test_nvml_clocks_event_reasons_name_only_throttling() -> None:
    assert throttle_reasons(None) is None
    assert throttle_reasons(0x1 | 0x2 | 0x10 | 0x100) == ()  # idle, settings, sync, display
    assert throttle_reasons(0x1 | 0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    raw = json.loads((FIXTURES / "nvidia-h200" / "nvml-tokrecord" / "nvml-busy.json").read_text())
    assert sample_from_nvml(raw[0]).throttle_reasons is None  # captured before the field
    assert sample_from_nvml({**raw[0], "clocks_event_reasons": 0x20}).throttle_reasons == (
        "sw_thermal_slowdown",)


def _h200_legs(name: str) -> Iterator[tuple[str, tuple[RowOutcome, ...], list[dict[str, Any]]]]:
    """Each leg of a committed H200 experiment: its rows' times and its telemetry lines."""
    files: dict[str, dict[str, bytes]] = {}
    with tarfile.open(EXAMPLES / f"{name}.tar.gz") as tar:
        for member in tar:
            leg, _, base = member.name.rpartition("/")
            if base in ("rows.json", "telemetry.jsonl") and (f := tar.extractfile(member)):
                files.setdefault(leg, {})[base] = f.read()
    for leg, got in sorted(files.items()):
        rows = json.loads(got["rows.json"])["rows"]
        outcomes = tuple(outcome(i, r["trace"]["t_send_ns"], r["trace"]["t_end_ns"])
                         for i, r in enumerate(rows))
        yield leg, outcomes, [json.loads(line) for line in got["telemetry.jsonl"].splitlines()]


@pytest.mark.parametrize("name", ["exp-graphs", "exp-draft"])
def test_clocks_on_real_h200_telemetry(name: str) -> None:
    """The H200 held 1980 MHz through every leg (NVML, 0.25 s samples); the same lines
    with one sample slowed past the bound, or throttled, fail."""
    legs = list(_h200_legs(name))
    assert len(legs) == 5  # A1 A2 B1 B2 and the teacher
    for leg, rows, samples in legs:
        g = clocks_stable(rows, samples)
        assert g.status is PASS, (leg, g.reason)
        seen = g.evidence["devices"]["nvml:0"]
        assert seen["sm_clock_mhz_min"] == seen["sm_clock_mhz_max"] == 1980.0
        assert seen["samples"] >= 20 and seen["throttle_reasons"] is None
        inside = next(i for i, s in enumerate(samples)
                      if rows[5].t_send_ns <= s["t_ns"] <= rows[5].t_end_ns)
        slowed = [dict(s) for s in samples]
        slowed[inside] = {**samples[inside], "devices": [
            {**samples[inside]["devices"][0], "sm_clock_mhz": 1980 * 0.97}]}
        assert clocks_stable(rows, slowed).status is FAIL
        slowed[inside] = {**samples[inside], "devices": [
            {**samples[inside]["devices"][0], "throttle_reasons": ["hw_slowdown"]}]}
        assert clocks_stable(rows, slowed).status is FAIL
