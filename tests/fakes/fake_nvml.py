"""A fake NVML at the ``pynvml`` function boundary.

It replaces the ``pynvml`` module functions the collector calls and returns the real
binding's structures (``c_nvmlUtilization_t``, ``c_nvmlMemory_v2_t``/``c_nvmlMemory_t``,
process lists built by ``pynvml.nvmlStructToFriendlyObject`` from ``c_nvmlProcessInfo_t``)
and raises real ``pynvml.NVMLError(code)`` instances, so the collector sees exactly what
nvidia-ml-py 13.615 would hand it. Behaviours copied from the binding's source:

* every call before ``nvmlInit`` or after ``nvmlShutdown`` raises ``Uninitialized`` (1);
* ``nvmlDeviceGetMemoryInfo(h, version=...)`` calls the C function ``..._v2``; a driver
  without it raises ``FunctionNotFound`` (13);
* ``nvmlDeviceGetComputeRunningProcesses`` is decorated with ``throwOnVersionMismatch``:
  a missing ``_v3`` surfaces as ``NVMLLibraryMismatchError`` (not an ``NVMLError``);
* ``usedGpuMemory`` equal to ``NVML_VALUE_NOT_AVAILABLE`` becomes ``None``;
* names/UUIDs are ``str`` (``convertStrBytes``), or ``bytes`` like older bindings.

Missing functions are named by their C symbol (``nvmlDeviceGetMemoryInfo_v2``,
``nvmlDeviceGetComputeRunningProcesses_v3``, ``nvmlDeviceGetCurrentClocksEventReasons``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED  # 3
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # 9
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND  # 12
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND  # 13
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST  # 15
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN  # 999

H100 = "NVIDIA H100 80GB HBM3"
H100_TOTAL = 85_520_809_984  # 81559 MiB, what an H100 80GB reports as total


@dataclass
class FakeGpu:
    """One device's readings, in NVML's own units (mW, KB/s, MHz, bytes)."""

    index: int
    name: str = H100
    uuid: str = ""
    util_gpu: int = 97
    util_memory: int = 43
    mem_total: int = H100_TOTAL
    mem_reserved: int = 566_755_328
    mem_used: int = 61_203_283_968
    mem_used_v1: int = 61_770_039_296  # v1 folds "reserved" into used (the known v1 error)
    power_mw: int = 612_345
    power_limit_mw: int = 700_000
    temperature_c: int = 63
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    pcie_rx_kbps: int = 2_500_000
    pcie_tx_kbps: int = 1_250_000
    clock_reasons: int = 0
    # (pid, usedGpuMemory); None = NVML_VALUE_NOT_AVAILABLE (WDDM)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    not_supported: set[str] = field(default_factory=set)  # function names -> NotSupported
    errors: dict[str, int] = field(default_factory=dict)  # function name -> error code
    lost: bool = False

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-4c2b9b1e-7f7e-4a1c-9d4e-00000000000{self.index}"


@dataclass
class _Handle:
    """Stands for the opaque ``c_nvmlDevice_t`` pointer."""

    index: int


class FakeNvml:
    """Scenario state plus the fake functions. ``install(monkeypatch)`` puts it in place."""

    def __init__(self, gpus: int | list[FakeGpu] = 8) -> None:
        self.gpus: list[FakeGpu] = (
            [FakeGpu(i) for i in range(gpus)] if isinstance(gpus, int) else list(gpus)
        )
        self.init_error: int | None = None  # code nvmlInit raises, e.g. 12
        self.missing: set[str] = set()  # C symbols this "driver" lacks
        self.names_as_bytes = False  # behave like older bindings
        self.pcie_latency_s = 0.0  # the real call blocks ~20 ms sampling the bus
        self.calls: Counter[str] = Counter()
        # Like the library, nvmlInit and nvmlShutdown are counted: NVML stays up until
        # every nvmlInit had its nvmlShutdown (pynvml's _nvmlLib_refcount, nvml.h).
        self.refs = 0
        # A function named here blocks until its event is set: a driver call stuck in
        # the kernel (a hung GPU, a driver in D state), as the real call can.
        self.blocked: dict[str, threading.Event] = {}

    # -- installation -----------------------------------------------------------------

    _FUNCTIONS = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        for name in self._FUNCTIONS:
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeNvml]:
        """For code outside pytest fixtures (the bench)."""
        with pytest.MonkeyPatch.context() as mp:
            self.install(mp)
            yield self

    # -- helpers ----------------------------------------------------------------------

    @property
    def initialised(self) -> bool:
        return self.refs > 0

    @initialised.setter
    def initialised(self, value: bool) -> None:
        """False: the driver went away under every user (an unload), whatever the count."""
        self.refs = max(self.refs, 1) if value else 0

    def _enter(self, fname: str, symbol: str | None = None) -> None:
        self.calls[fname] += 1
        if fname in self.blocked:
            self.blocked[fname].wait()
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if (symbol or fname) in self.missing:
            raise pynvml.NVMLError(FUNCTION_NOT_FOUND)

    def _gpu(self, fname: str, handle: _Handle, symbol: str | None = None) -> FakeGpu:
        self._enter(fname, symbol)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        if fname in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[fname])
        if fname in gpu.not_supported:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return gpu

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.names_as_bytes else value

    # -- the fake pynvml functions ----------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.refs += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        if not version:
            gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
            return pynvml.c_nvmlMemory_t(
                total=gpu.mem_total, free=gpu.mem_total - gpu.mem_used_v1, used=gpu.mem_used_v1
            )
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle, symbol="nvmlDeviceGetMemoryInfo_v2")
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=gpu.mem_total,
            reserved=gpu.mem_reserved,
            free=gpu.mem_total - gpu.mem_reserved - gpu.mem_used,
            used=gpu.mem_used,
        )

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type == pynvml.NVML_CLOCK_SM:
            return gpu.sm_clock_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPcieThroughput(self, device: _Handle, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", device)
        if self.pcie_latency_s:
            time.sleep(self.pcie_latency_s)  # the driver samples the bus for ~20 ms
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kbps
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kbps
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def _procs(self, fname: str, handle: _Handle, symbol: str) -> list[Any]:
        gpu = self._gpu(fname, handle, symbol=symbol)
        out = []
        for pid, used in gpu.processes:
            raw = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            obj = pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_t(
                    pid=pid, usedGpuMemory=raw, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0
                )
            )
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None  # as the binding does (WDDM case)
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list[Any]:
        return self._procs(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            handle,
            "nvmlDeviceGetComputeRunningProcesses_v3",
        )

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._procs(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            handle,
            "nvmlDeviceGetComputeRunningProcesses_v2",
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        # Mirrors @throwOnVersionMismatch around the _v3 call in the real binding.
        try:
            return self._procs(
                "nvmlDeviceGetComputeRunningProcesses",
                handle,
                "nvmlDeviceGetComputeRunningProcesses_v3",
            )
        except pynvml.NVMLError_FunctionNotFound as exc:
            raise pynvml.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML "
                "lib version. Either use matching pyNVML and NVML lib versions or use a "
                "versioned function such as nvmlDeviceGetComputeRunningProcesses_v2"
            ) from exc


def reason_mask(*names: str) -> int:
    """``reason_mask("SwPowerCap", "HwThermalSlowdown")`` from the binding's constants."""
    mask = 0
    for name in names:
        mask |= int(getattr(pynvml, "nvmlClocksEventReason" + name))
    return mask
