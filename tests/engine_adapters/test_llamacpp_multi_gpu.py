"""llama.cpp split over several GPUs: each device's share from its load lines, per device
(real log lines from public threads: tests/fixtures/llamacpp/SOURCE.md)."""

from __future__ import annotations

import pytest

from paths import FIXTURES
from tokrecord.engines import engine_for
from tokrecord.engines.base import EngineName
from tokrecord.metrics.logfacts import LogExtractor, LogFactValue, extract_log_facts

LLAMA = FIXTURES / "llamacpp"


def facts(name: str) -> dict[str, LogFactValue]:
    text = (LLAMA / name).read_text()
    return {f.name: f for f in extract_log_facts(text, engine_for(EngineName.LLAMA_CPP).log_facts)}


def test_layer_split_gives_each_device_its_buffer() -> None:
    f = facts("multi-gpu-layer.log")["device_model_buffer_mib"]
    assert f.per_rank == {"CUDA0": 24277.75, "CUDA2": 46151.91}
    # CPU_Mapped is host memory, not a device: not counted.
    assert f.value == pytest.approx(24277.75 + 46151.91)
    assert f.found == 2


def test_row_split_keeps_split_buffers_apart_and_counts_devices() -> None:
    got = facts("multi-gpu-row.log")
    per = got["device_model_buffer_mib"].per_rank
    assert per["CUDA3_Split"] == 536.67 and per["CUDA1"] == 7344.20
    assert sorted(per) == ["CUDA0", "CUDA0_Split", "CUDA1", "CUDA1_Split", "CUDA2",
                           "CUDA2_Split", "CUDA3_Split"]
    assert got["devices_found"].value == 4


def test_a_rank_group_is_not_the_value() -> None:
    ex = LogExtractor(name="x", pattern=r"(?P<rank>dev\d) took (\d+) ms", reduce="max",
                      value="int")
    (f,) = extract_log_facts("dev0 took 5 ms\ndev1 took 7 ms\ndev0 took 9 ms\n", [ex])
    assert (f.value, f.per_rank, f.found) == (9, {"dev0": 9, "dev1": 7}, 3)
    with pytest.raises(ValueError, match="needs a capture group"):
        LogExtractor(name="y", pattern=r"(?P<rank>dev\d) took", reduce="max", value="int")
