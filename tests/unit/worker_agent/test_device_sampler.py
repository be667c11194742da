"""The agent's device sampler: NVML readings become DeviceSample messages; MWMS_DEVICE_SAMPLER replaces NVML.

No GPU exists on the machines these tests run on, so the conversion is checked against an NVML-like object
when the real NVML cannot start (the one stand-in in these tests); with a GPU it runs against NVML itself.
"""

from __future__ import annotations

import math
import time
import types
from typing import Any

import pytest

from mwms.agent_link import MAX_DEVICES_PER_MESSAGE
from mwms.v1 import agent_pb2
from mwms.worker_agent import device_telemetry
from mwms.worker_agent.device_telemetry import (
    DeviceTelemetry,
    NvmlSampler,
    load_sampler,
    open_nvml_sampler,
    start_device_telemetry,
)

MIB = 1024 * 1024


def _real_nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001 - any failure means no NVML here
        return False


class _NvmlLike:
    """Answers the NVML calls the sampler makes, as pynvml's types do (bytes, percent, integer degrees)."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self._gpus = gpus
        self.shut_down = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        gpu = self._gpus[handle]
        if gpu.get("broken"):
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=gpu["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._gpus[handle]
        return types.SimpleNamespace(used=gpu["used"], total=gpu["total"], free=gpu["total"] - gpu["used"])

    def nvmlDeviceGetTemperatureV(self, handle: int, sensor: int) -> int:
        raise self.NVMLError("Function Not Found")  # an older driver: the sampler falls back

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._gpus[handle]["temp"]

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def test_nvml_readings_become_device_samples() -> None:
    if _real_nvml_works():
        sampler = open_nvml_sampler()
        assert sampler is not None
        samples = sampler()
        sampler.close()
        assert samples and all(0 <= s.utilization_pct <= 100 and s.memory_total_mib > 0 for s in samples)
        return
    nvml = _NvmlLike(
        [
            {"util": 87, "used": 40_000 * MIB + 123, "total": 143_771 * MIB, "temp": 61},
            {"broken": True, "used": 0, "total": 1, "temp": 0},
            {"util": 0, "used": 512 * MIB, "total": 143_771 * MIB, "temp": 33},
        ]
    )
    sampler = NvmlSampler(nvml)
    samples = sampler()
    assert [
        (s.index, s.utilization_pct, s.memory_used_mib, s.memory_total_mib, s.temperature_c) for s in samples
    ] == [
        (0, 87.0, 40_000, 143_771, 61.0),
        (2, 0.0, 512, 143_771, 33.0),
    ]
    assert len(sampler()) == 2  # the unreadable GPU is left out every time, warned once
    sampler.close()
    assert nvml.shut_down


def test_without_nvml_there_is_no_sampler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if _real_nvml_works():
        pytest.skip("this machine has NVML and GPUs")
    monkeypatch.delenv(device_telemetry.SAMPLER_ENV, raising=False)
    caplog.set_level("INFO", logger="mwms.agent.devices")
    assert start_device_telemetry(5.0) is None
    assert [r.message for r in caplog.records if r.message.startswith("no device telemetry")]


# --- MWMS_DEVICE_SAMPLER --------------------------------------------------------------------------------

CALLS: list[int] = []


def two_gpus() -> list[Any]:
    CALLS.append(1)
    return [
        {
            "index": 0,
            "utilization_pct": 50.0,
            "memory_used_mib": 10,
            "memory_total_mib": 80,
            "temperature_c": 40.0,
        },
        agent_pb2.DeviceSample(
            index=1, utilization_pct=75.5, memory_used_mib=20, memory_total_mib=80, temperature_c=41
        ),
    ]


def too_many() -> list[Any]:
    return [{"index": i} for i in range(MAX_DEVICES_PER_MESSAGE + 10)]


def failing() -> list[Any]:
    raise RuntimeError("the fake sampler fails")


def test_the_sampler_hook_loads_module_callable() -> None:
    assert load_sampler(f"{__name__}:two_gpus") is two_gpus
    for bad in ("no_colon", f"{__name__}:missing", "no_such_module_xyz:f", f"{__name__}:MIB"):
        with pytest.raises(ValueError, match="MWMS_DEVICE_SAMPLER"):
            load_sampler(bad)


def test_readings_are_kept_newest_only_and_bounded() -> None:
    telemetry = DeviceTelemetry(two_gpus, interval=60)
    assert telemetry.take() is None
    telemetry.sample_once()
    second = telemetry.sample_once()
    assert second is not None and telemetry.take() is second  # the older reading was replaced, not queued
    assert telemetry.take() is None
    assert [(d.index, d.utilization_pct) for d in second.devices] == [(0, 50.0), (1, 75.5)]
    assert second.unix_ms > 0

    bounded = DeviceTelemetry(too_many, interval=60).sample_once()
    assert bounded is not None and len(bounded.devices) == MAX_DEVICES_PER_MESSAGE

    assert DeviceTelemetry(failing, interval=60).sample_once() is None  # logged, the thread goes on


def test_the_hook_starts_a_sampling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device_telemetry.SAMPLER_ENV, f"{__name__}:two_gpus")
    assert start_device_telemetry(0) is None  # interval 0: off
    CALLS.clear()
    telemetry = start_device_telemetry(0.05)
    assert telemetry is not None
    try:
        deadline = time.monotonic() + 10
        reading = None
        while reading is None and time.monotonic() < deadline:
            reading = telemetry.take()
            time.sleep(0.02)
        assert reading is not None and len(reading.devices) == 2
    finally:
        telemetry.stop()
    assert CALLS


def test_values_pass_through_as_sent() -> None:
    """The agent does not judge values: the coordinator bounds them (and refuses NaN)."""
    reading = DeviceTelemetry(lambda: [{"index": 0, "utilization_pct": math.nan}], interval=60).sample_once()
    assert reading is not None and math.isnan(reading.devices[0].utilization_pct)
