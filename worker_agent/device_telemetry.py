"""Device telemetry: every few seconds, the utilisation, memory and temperature of each GPU of this machine.

Readings come from NVML (the `nvidia-ml-py` package, `import pynvml`). A machine without NVML or without
GPUs has no sampler: the agent says so in one info line and sends nothing. MWMS_DEVICE_SAMPLER=module:callable
replaces NVML with a callable of one's own (a testing and extension hook): called every interval without
arguments, it returns the samples, as `DeviceSample` messages or mappings with the same fields.

Telemetry is best effort: the sampler thread keeps only the newest reading, which the connection sends when
it is connected; a reading nobody sent is replaced by the next one, never buffered on disk.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mwms.agent_link import MAX_DEVICES_PER_MESSAGE
from mwms.v1 import agent_pb2

log = logging.getLogger("mwms.agent.devices")

SAMPLER_ENV = "MWMS_DEVICE_SAMPLER"
DEFAULT_INTERVAL_SECONDS = 5.0
MIB = 1024 * 1024

Sampler = Callable[[], Iterable[agent_pb2.DeviceSample | Mapping[str, Any]]]


class NvmlSampler:
    """Reads every GPU NVML sees; a GPU whose reading fails is left out of that sample (warned once)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._warned: set[int] = set()
        self.count = int(nvml.nvmlDeviceGetCount())
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]

    def __call__(self) -> list[agent_pb2.DeviceSample]:
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                samples.append(self._read(index, handle))
            except self._nvml.NVMLError as error:
                if index not in self._warned:
                    self._warned.add(index)
                    log.warning(
                        "GPU %d: NVML cannot read it (%s); it is left out of device telemetry", index, error
                    )
        return samples

    def _read(self, index: int, handle: Any) -> agent_pb2.DeviceSample:
        nvml = self._nvml
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return agent_pb2.DeviceSample(
            index=index,
            utilization_pct=float(utilization.gpu),
            memory_used_mib=int(memory.used) // MIB,
            memory_total_mib=int(memory.total) // MIB,
            temperature_c=float(self._temperature(handle)),
        )

    def _temperature(self, handle: Any) -> int:
        nvml = self._nvml
        getter = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
        if getter is not None:
            try:
                return int(getter(handle, nvml.NVML_TEMPERATURE_GPU))
            except nvml.NVMLError:
                pass  # drivers before nvmlDeviceGetTemperatureV have only the older call
        return int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def open_nvml_sampler() -> NvmlSampler | None:
    """An NVML sampler of this machine's GPUs, or None without NVML or GPUs (said in one info line)."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        log.info("no device telemetry: nvidia-ml-py is not installed (pip install 'mwms[agent]')")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        log.info("no device telemetry: NVML is not available on this machine (%s)", error)
        return None
    try:
        sampler = NvmlSampler(pynvml)
    except pynvml.NVMLError as error:
        log.info("no device telemetry: NVML cannot list the GPUs (%s)", error)
        pynvml.nvmlShutdown()
        return None
    if sampler.count == 0:
        log.info("no device telemetry: NVML sees no GPU")
        sampler.close()
        return None
    log.info("device telemetry: sampling %d GPU(s) through NVML", sampler.count)
    return sampler


def load_sampler(spec: str) -> Sampler:
    """The callable that MWMS_DEVICE_SAMPLER=module:callable names; ValueError when it cannot be loaded."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{SAMPLER_ENV}={spec!r} must be module:callable")
    try:
        sampler = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{SAMPLER_ENV}={spec!r} cannot be loaded: {error}") from error
    if not callable(sampler):
        raise ValueError(f"{SAMPLER_ENV}={spec!r} does not name a callable")
    return sampler  # type: ignore[no-any-return]


def as_sample(item: agent_pb2.DeviceSample | Mapping[str, Any]) -> agent_pb2.DeviceSample:
    """A sampler's item as a DeviceSample (mappings use the message's field names)."""
    if isinstance(item, agent_pb2.DeviceSample):
        return item
    return agent_pb2.DeviceSample(**dict(item))


class DeviceTelemetry:
    """Samples in a thread of its own every `interval` seconds; the connection takes the newest reading."""

    def __init__(self, sampler: Sampler, interval: float, close: Callable[[], None] | None = None) -> None:
        self._sampler = sampler
        self._interval = interval
        self._close = close
        self._lock = threading.Lock()
        self._newest: agent_pb2.DeviceTelemetry | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-telemetry", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._interval + 5)
        if self._close is not None:
            self._close()

    def take(self) -> agent_pb2.DeviceTelemetry | None:
        """The newest reading not taken yet, or None."""
        with self._lock:
            newest, self._newest = self._newest, None
        return newest

    def sample_once(self) -> agent_pb2.DeviceTelemetry | None:
        """One reading (None when the sampler failed or returned nothing); also kept for `take`."""
        try:
            samples = [as_sample(item) for item in self._sampler()]
        except Exception as error:  # noqa: BLE001 - a failing sampler must not end the agent
            if not self._failing:
                log.warning(
                    "the device sampler failed (%s: %s); retrying every %.0f s",
                    type(error).__name__,
                    error,
                    self._interval,
                )
            self._failing = True
            return None
        self._failing = False
        if len(samples) > MAX_DEVICES_PER_MESSAGE:
            samples = samples[:MAX_DEVICES_PER_MESSAGE]
        if not samples:
            return None
        reading = agent_pb2.DeviceTelemetry(unix_ms=int(time.time() * 1000), devices=samples)
        with self._lock:
            self._newest = reading
        return reading

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self._interval)


def start_device_telemetry(interval: float) -> DeviceTelemetry | None:
    """Starts sampling with MWMS_DEVICE_SAMPLER's callable or NVML; None when off (interval 0) or no GPU."""
    if interval <= 0:
        log.info("no device telemetry: the sample interval is 0")
        return None
    spec = os.environ.get(SAMPLER_ENV, "").strip()
    telemetry: DeviceTelemetry | None
    if spec:
        try:
            sampler = load_sampler(spec)
        except ValueError as error:
            log.error("no device telemetry: %s", error)
            return None
        log.info("device telemetry: sampling with %s every %.0f s", spec, interval)
        telemetry = DeviceTelemetry(sampler, interval)
    else:
        nvml = open_nvml_sampler()
        if nvml is None:
            return None
        telemetry = DeviceTelemetry(nvml, interval, close=nvml.close)
    telemetry.start()
    return telemetry
