"""Component evidence from profiler traces: hand-made traces with known answers, and the
traces captured on an NVIDIA H200 (tests/fixtures/components)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paths import FIXTURES
from tokrecord.metrics.components import (
    ComponentSpec,
    TraceError,
    TraceReading,
    component_evidence,
    read_check,
    read_trace,
)

H200 = FIXTURES / "components" / "h200-rmsnorm"
RMSNORM = ("pow_tensor_scalar", "MeanOps", "CUDAFunctorOnSelf_add", "rsqrt_kernel",
           "MulFunctor", "_rmsnorm_kernel")


def spec(**over: Any) -> ComponentSpec:
    fields: dict[str, Any] = {"name": "norm", "kernels": ("norm_", "fused_norm"),
                              "control_traces": ("a",), "candidate_traces": ("b",),
                              "check": "c"} | over
    return ComponentSpec.model_validate(fields)


def kernel(name: str, ts: float, dur: float, pid: int = 0, corr: int = 0) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": pid, "tid": 7, "ts": ts,
            "dur": dur, "args": {"device": pid, "correlation": corr}}


def cycle(ts: float, dur: float, cat: str = "gpu_user_annotation", pid: int = 0
          ) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": "decode_cycle", "pid": pid, "tid": 1, "ts": ts,
            "dur": dur, "args": {}}


def trace(*events: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": list(events)}


def test_kernels_are_counted_per_gpu_cycle() -> None:
    # Two cycles: [0, 100) holds norm_a (3 us), norm_b (2 us) and a gemm; [100, 200) holds
    # norm_a (4 us). A kernel after the last cycle and one on another device are outside.
    t = trace(cycle(0, 100), cycle(100, 100), kernel("norm_a", 10, 3), kernel("norm_b", 20, 2),
              kernel("gemm", 30, 50), kernel("norm_a", 110, 4), kernel("norm_a", 250, 9),
              kernel("norm_a", 50, 9, pid=1))
    r = read_trace(t, spec())
    assert r.delimited_by == "gpu_user_annotation"
    assert [(c.launches, c.kernel_us, c.all_launches) for c in r.cycles] == [(2, 5.0, 3),
                                                                             (1, 4.0, 1)]
    assert r.launches_per_cycle == 1.5  # the median of 2 and 1
    assert r.kernel_ms_per_cycle == pytest.approx(0.0045)
    assert r.devices == (0, 1)


def test_without_gpu_ranges_kernels_follow_their_launch_correlation() -> None:
    # The CPU range [0, 10) launched correlations 1 and 2; the kernels ran later, at 40+,
    # outside the CPU range: only the correlation ids place them in the cycle.
    launch = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 5, "tid": 5,
               "ts": ts, "dur": 1, "args": {"correlation": c}} for ts, c in ((2, 1), (4, 2),
                                                                             (20, 3))]
    t = trace(cycle(0, 10, cat="user_annotation", pid=5), *launch,
              kernel("norm_a", 40, 3, corr=1), kernel("gemm", 45, 5, corr=2),
              kernel("norm_a", 60, 7, corr=3))
    r = read_trace(t, spec())
    assert r.delimited_by == "correlation"
    assert [(c.launches, c.kernel_us) for c in r.cycles] == [(1, 3.0)]


@pytest.mark.parametrize(("t", "message"), [
    ({"nope": 1}, "no traceEvents"),
    (trace(cycle(0, 10)), "no GPU kernels"),
    (trace(kernel("norm_a", 1, 1)), "no range annotation matches"),
])
def test_unusable_traces_say_why(t: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(t, spec())


def test_spec_rejects_bad_patterns_and_unpaired_traces() -> None:
    with pytest.raises(ValueError, match="invalid regular expression"):
        spec(kernels=("norm(",))
    with pytest.raises(ValueError, match="one trace per device"):
        spec(control_traces=("a", "b"))


def reading(*cycles: tuple[int, float]) -> TraceReading:
    return read_trace(trace(*(e for i, (n, us) in enumerate(cycles)
                              for e in (cycle(1000 * i, 1000),
                                        *(kernel("norm_x", 1000 * i + j + 1, us / n)
                                          for j in range(n))))), spec())


def test_saving_is_a_range_over_devices() -> None:
    # Device 1: control 6 launches / 12 us, candidate 1 / 4 us: saving 0.008 ms.
    # Device 2: control 6 / 10 us, candidate 1 / 5 us: saving 0.005 ms.
    ev = component_evidence(
        spec(control_traces=("a", "b"), candidate_traces=("c", "d")),
        {"control": [reading((6, 12.0), (6, 12.0)), reading((6, 10.0))],
         "candidate": [reading((1, 4.0)), reading((1, 5.0))]},
        {"exact": True, "isolated_ms_per_cycle": {"control": 1.25, "candidate": 1.0}},
        {"a": "0" * 64}, "1" * 64)
    assert ev["launches_per_cycle"] == {"control": 6, "candidate": 1, "removed": 5}
    assert ev["saving_ms_per_cycle_range"] == pytest.approx([0.005, 0.008])
    assert ev["isolated_saving_ms_per_cycle"] == pytest.approx(0.25)
    assert ev["gate_passed"] is True and ev["gate_reasons"] == []
    assert ev["cycles"] == {"control": [2, 1], "candidate": [1, 1]}


def test_a_check_that_is_not_exact_fails_the_gate() -> None:
    ev = component_evidence(spec(), {"control": [reading((6, 12.0))],
                                     "candidate": [reading((1, 4.0))]},
                            {"exact": True, "devices": [{"exact": True}, {"exact": False}]},
                            {}, "1" * 64)
    assert ev["exact"] is True and ev["exact_all_devices"] is False
    assert ev["gate_passed"] is False
    assert ev["gate_reasons"] == ["the component check is not exact on every device"]


def test_a_check_needs_its_exact_flag() -> None:
    with pytest.raises(TraceError, match='boolean "exact"'):
        read_check({"exact": "yes"})
    assert read_check({"exact": False}) == (False, None)


def h200(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((H200 / name).read_text())
    return data


def test_h200_traces_show_the_fused_norm_removing_45_launches_a_cycle() -> None:
    s = spec(kernels=RMSNORM)
    control, candidate = read_trace(h200("control.trace.json"), s), \
        read_trace(h200("candidate.trace.json"), s)
    # 8 profiled cycles; 9 norms a cycle (8 layers and the final one), 6 kernels unfused
    # and 1 fused; every other kernel (gemv, residual add, argmax) is the same in both.
    assert len(control.cycles) == len(candidate.cycles) == 8
    assert {c.launches for c in control.cycles} == {54}
    assert {c.launches for c in candidate.cycles} == {9}
    assert {c.all_launches - c.launches for c in control.cycles} == \
        {c.all_launches - c.launches for c in candidate.cycles} == {18}
    ev = component_evidence(s, {"control": [control], "candidate": [candidate]},
                            h200("check.json"), {}, "1" * 64)
    assert ev["launches_per_cycle"] == {"control": 54, "candidate": 9, "removed": 45}
    low, high = ev["saving_ms_per_cycle_range"]
    assert low == high > 0  # one device: the range is a point
    assert ev["exact"] is True and ev["gate_passed"] is True


def test_h200_control_trace_reads_the_same_through_correlation() -> None:
    s = spec(kernels=RMSNORM)
    t = h200("control.trace.json")
    cpu_only = {"traceEvents": [e for e in t["traceEvents"]
                                if e["cat"] != "gpu_user_annotation"]}
    by_gpu, by_corr = read_trace(t, s), read_trace(cpu_only, s)
    assert by_corr.delimited_by == "correlation"
    assert [c.launches for c in by_corr.cycles] == [c.launches for c in by_gpu.cycles]
    assert [c.kernel_us for c in by_corr.cycles] == pytest.approx(
        [c.kernel_us for c in by_gpu.cycles])

