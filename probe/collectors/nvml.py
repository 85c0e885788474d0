"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` binding, import name ``pynvml``).

This is the only module in the project that imports ``pynvml``. Everything it hands out
is a plain frozen :class:`GpuSample`; NVML handles never leave this module.

Degradation, from small to large (see /work/shared/reference/nvml.md):

* per field: ``NotSupported`` -> that field is ``None``; ``FunctionNotFound`` (driver
  older than the binding) -> ``None`` and the function is never called again;
* per device: ``GpuIsLost`` -> that device is reported with ``state="lost"`` while the
  others keep updating; it is tried again on the next sample, since a reset brings it back;
* per library: no library / no driver -> no devices and a status that says why in words a
  user can act on; ``nvmlInit`` is retried at most every ``init_retry_s`` seconds, because
  a driver may be loaded after the training started, but a failing init is not free.

PCIe throughput is the one expensive query (the driver samples the bus for ~20 ms per
call, two calls per device), so each device refreshes it only every ``pcie_every``
samples, staggered so one sample pays for at most ``ceil(devices / pcie_every)`` devices;
in between the last reading is reused, and a device has ``None`` until its first turn.

``sample()`` never raises: a monitor that crashes on a flaky driver is worse than none.
Nor may it hold anything up when a driver call blocks (a hung GPU, a driver stuck in the
kernel: nvml.md): :class:`NvmlWorker` makes the calls on a thread of its own, so such a
call costs the GPU fields alone, never the host's figures nor the process's exit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from gputop_dl.probe.samples import ABSENT, FAILING, STARTING, GpuSample, SourceStatus

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a hard dependency
    pynvml = None

SOURCE = "nvml"
WAIT_S = 1.0  # NvmlWorker: how long a sample waits for the GPUs' reading
BLOCKED_S = 5.0  # ... and a call in progress this long is reported as blocked
CLOSE_WAIT_S = 0.5  # close(): how long to wait for a call in progress

# NVML error codes (nvml.h). Literal values rather than pynvml attributes, so this module
# still imports (and reports "nvidia-ml-py not installed") without the binding.
_ERR_UNINITIALIZED = 1
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_OPERATING_SYSTEM = 17
_ERR_LIB_RM_VERSION_MISMATCH = 18

# What a user should read when nvmlInit() fails, by error code.
_INIT_MESSAGES: dict[int, str] = {
    _ERR_LIBRARY_NOT_FOUND: "NVML library not found",
    _ERR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    _ERR_NO_PERMISSION: "no permission to use NVML",
    _ERR_FUNCTION_NOT_FOUND: "NVML library too old for nvidia-ml-py",
    _ERR_LIB_RM_VERSION_MISMATCH: "NVIDIA driver/library version mismatch (reload the driver)",
    _ERR_OPERATING_SYSTEM: "the operating system blocked NVML",
}

# Init failures that mean this node has no GPU NVML could read: no library, no driver,
# no right to use it, a library older than the binding (the others are faults).
_ABSENT_CODES = frozenset(
    {_ERR_LIBRARY_NOT_FOUND, _ERR_DRIVER_NOT_LOADED, _ERR_NO_PERMISSION, _ERR_FUNCTION_NOT_FOUND}
)

# Device-level failures: the whole device is unusable until it comes back.
_LOST_MESSAGES: dict[int, str] = {
    _ERR_GPU_IS_LOST: "GPU is lost",
    _ERR_RESET_REQUIRED: "GPU requires reset",
}


def _reason_bits() -> tuple[tuple[int, str], ...]:
    """Clock event reason bits -> short names, taken from the binding's own constants.

    The newer ``nvmlClocksEventReason*`` names are preferred; the older
    ``nvmlClocksThrottleReason*`` names fill the gaps (BoardLimit, Reliability exist
    only there in 13.615). The fallback literals are the documented nvml.h values.
    """
    table = (
        ("GpuIdle", 0x1, "gpu_idle"),
        ("ApplicationsClocksSetting", 0x2, "app_clocks"),
        ("SwPowerCap", 0x4, "sw_power_cap"),
        ("HwSlowdown", 0x8, "hw_slowdown"),
        ("SyncBoost", 0x10, "sync_boost"),
        ("SwThermalSlowdown", 0x20, "sw_thermal"),
        ("HwThermalSlowdown", 0x40, "hw_thermal"),
        ("HwPowerBrakeSlowdown", 0x80, "hw_power_brake"),
        ("DisplayClockSetting", 0x100, "display_clocks"),
        ("BoardLimit", 0x200, "board_limit"),
        ("Reliability", 0x400, "reliability"),
    )
    bits: list[tuple[int, str]] = []
    for suffix, literal, short in table:
        value = literal
        if pynvml is not None:
            value = getattr(
                pynvml,
                "nvmlClocksEventReason" + suffix,
                getattr(pynvml, "nvmlClocksThrottleReason" + suffix, literal),
            )
        bits.append((int(value), short))
    return tuple(bits)


_REASON_BITS = _reason_bits()


def decode_clock_reasons(mask: int) -> tuple[str, ...]:
    """Bit mask from ``nvmlDeviceGetCurrentClocksEventReasons`` -> short names.

    An empty tuple means "reported, nothing is holding the clocks back" (unlike ``None``).
    Bits this table does not know are shown as hex so they are not silently dropped.
    """
    names: list[str] = []
    known = 0
    for bit, short in _REASON_BITS:
        known |= bit
        if mask & bit:
            names.append(short)
    rest = mask & ~known
    if rest:
        names.append(f"0x{rest:x}")
    return tuple(names)


def physical_gpu_index(
    local_rank: int | None, cuda_visible_devices: str | None
) -> int | str | None:
    """Map a process's local rank to the device it drives, as NVML numbers them.

    ``CUDA_VISIBLE_DEVICES="2,3"`` with local rank 1 -> 3. Entries given as UUIDs
    (``GPU-...``/``MIG-...``) are returned as strings, to be matched against
    ``GpuSample.uuid``. Like the CUDA runtime, the list stops at the first invalid
    entry. ``None`` when the rank is unknown or points past the visible devices.
    Unset ``CUDA_VISIBLE_DEVICES`` means every device is visible: rank r -> device r
    (this assumes CUDA's default order matches NVML's PCI order, true on the usual
    homogeneous training nodes).
    """
    if local_rank is None or local_rank < 0:
        return None
    if cuda_visible_devices is None:
        return local_rank
    visible: list[int | str] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if entry.isdigit():
            visible.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            visible.append(entry)
        else:
            break  # CUDA ignores this entry and everything after it
    if local_rank >= len(visible):
        return None
    return visible[local_rank]


def _text(value: Any) -> str | None:
    """Older bindings return ``bytes`` for names and UUIDs, newer ones ``str``."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class _LibraryGone(Exception):
    """NVML stopped working as a whole (driver unloaded, someone else shut NVML down)."""


class _DeviceLost(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Device:
    """What we remember about one device between samples."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.name: str | None = None
        self.uuid: str | None = None
        # PCIe throughput is refreshed only now and then (each call samples ~20 ms);
        # in between the last reading is reused.
        self.pcie_rx_bps: float | None = None
        self.pcie_tx_bps: float | None = None

    def forget_dynamic(self) -> None:
        self.handle = None
        self.pcie_rx_bps = None
        self.pcie_tx_bps = None


class NvmlCollector:
    """Samples every NVIDIA GPU on the node. Call ``sample()`` from one sampler thread."""

    #: Minimum seconds between two ``nvmlInit`` attempts after a failure.
    init_retry_s: float = 30.0

    def __init__(
        self,
        *,
        training_pids: Callable[[], Collection[int]] | None = None,
        pcie_every: int = 5,
        only: int | str | None = None,
    ) -> None:
        """``only``: the one device to read (its NVML index, or its UUID as
        CUDA_VISIBLE_DEVICES names it): a rank that is not its node's host sampler reads
        its own GPU, not all eight and their ~20 ms PCIe calls."""
        self._training_pids = training_pids
        self._only = only
        # <= 0 disables PCIe throughput entirely (a 20 ms call per direction per device).
        self._pcie_every = pcie_every
        self._lock = threading.Lock()
        self._initialised = False
        self._next_init_at = 0.0  # monotonic time of the next allowed nvmlInit attempt
        self._init_status = SourceStatus(SOURCE, False, "NVML not initialised yet", STARTING)
        self._init_error: int | None = None  # NVML's code for the last failed nvmlInit
        self._devices: list[_Device] = []
        self._missing: set[str] = set()  # functions this driver lacks: never call again
        self._sample_no = 0
        self._errors: list[str] = []  # unexpected per-field errors of the current device

    # -- public API -------------------------------------------------------------------

    def sample(self) -> tuple[tuple[GpuSample, ...], SourceStatus]:
        """One reading of every device. Never raises."""
        with self._lock:
            try:
                return self._sample_locked()
            except _LibraryGone as exc:
                # Start over: the next init attempt (after init_retry_s) says why.
                self._shutdown()
                self._next_init_at = time.monotonic() + self.init_retry_s
                self._init_status = SourceStatus(
                    SOURCE, False, f"NVML stopped working: {exc}", FAILING
                )
                return (), self._init_status
            except Exception as exc:  # last line of defence: report, never crash the host
                return (), SourceStatus(SOURCE, False, f"NVML error: {exc}", FAILING)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Shut NVML down if we initialised it. Safe to call twice. False, and NVML left
        as it is, when a call in progress does not return within ``timeout_s``: a blocked
        driver call must not hold up the process's exit (nvmlShutdown would block too)."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            self._shutdown()
            self._next_init_at = 0.0  # a later sample() starts afresh
            self._init_status = SourceStatus(SOURCE, False, "NVML closed", FAILING)
        finally:
            self._lock.release()
        return True

    @property
    def library_missing(self) -> bool:
        """No NVML library here (a node without NVIDIA's driver): its next init attempt
        is a failed dlopen, which returns at once -- nothing that could hang."""
        return pynvml is None or self._init_error == _ERR_LIBRARY_NOT_FOUND

    # -- init / shutdown --------------------------------------------------------------

    def _shutdown(self) -> None:
        if self._initialised and pynvml is not None:
            # Nothing useful to do about a failing shutdown.
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
        self._initialised = False
        self._devices = []

    def _try_init(self) -> None:
        now = time.monotonic()
        if now < self._next_init_at:
            return  # keep the last failure message; don't hammer a missing driver
        self._next_init_at = now + self.init_retry_s
        if pynvml is None:
            self._init_status = SourceStatus(SOURCE, False, "nvidia-ml-py not installed", ABSENT)
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = int(getattr(exc, "value", -1))
            self._init_error = code
            message = _INIT_MESSAGES.get(code, f"NVML init failed: {exc}")
            state = ABSENT if code in _ABSENT_CODES else FAILING
            self._init_status = SourceStatus(SOURCE, False, message, state)
            return
        except Exception as exc:  # e.g. OSError from ctypes on a broken install
            self._init_status = SourceStatus(SOURCE, False, f"NVML init failed: {exc}", FAILING)
            return
        self._initialised = True
        self._init_error = None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            self._init_status = SourceStatus(
                SOURCE, False, f"NVML cannot count GPUs: {exc}", FAILING
            )
            return
        self._devices = [_Device(i) for i in range(count)]
        self._init_status = (
            SourceStatus(SOURCE, True)
            if count
            else SourceStatus(SOURCE, True, "no NVIDIA GPU", ABSENT)
        )

    # -- sampling ---------------------------------------------------------------------

    def _sample_locked(self) -> tuple[tuple[GpuSample, ...], SourceStatus]:
        if not self._initialised:
            self._try_init()
            if not self._initialised:
                return (), self._init_status
        if not self._devices:
            return (), self._init_status

        pids = self._pids()
        n = self._sample_no
        self._sample_no += 1
        samples: list[GpuSample] = []
        processes: list[list[Any] | None] = []
        for dev in self._devices:
            if not self._wanted(dev):
                continue
            # Stagger PCIe refreshes across devices, so one sample pays for at most
            # ceil(devices / pcie_every) devices' PCIe calls instead of all of them.
            refresh_pcie = self._pcie_every > 0 and (n + dev.index) % self._pcie_every == 0
            sample, procs = self._sample_device(dev, refresh_pcie, pids is not None)
            samples.append(sample)
            processes.append(procs)

        if pids is not None:
            samples = self._attach_training_memory(samples, processes, pids)

        lost = [s.index for s in samples if s.state == "lost"]
        message = ""
        if lost:
            message = "lost: GPU " + ", ".join(str(i) for i in lost)
        return tuple(samples), SourceStatus(SOURCE, True, message)

    def _wanted(self, dev: _Device) -> bool:
        """Whether ``only`` names this device (one given by UUID is looked at until its
        UUID is known: its handle and UUID only, once)."""
        only = self._only
        if only is None or only == dev.index:
            return True
        if not isinstance(only, str):
            return False
        if dev.uuid is None:
            self._errors = []
            try:
                if dev.handle is None:
                    dev.handle = self._call("nvmlDeviceGetHandleByIndex", dev.index)
                if dev.handle is not None:
                    dev.uuid = _text(self._call("nvmlDeviceGetUUID", dev.handle))
            except _DeviceLost:
                dev.forget_dynamic()  # lost before it said who it is: not known to be ours
        return dev.uuid == only

    def _pids(self) -> set[int] | None:
        if self._training_pids is None:
            return None
        try:
            return {int(p) for p in self._training_pids()}
        except Exception:
            return None  # unknown, not "no processes"

    def _call(self, fname: str, *args: Any, key: str | None = None, **kwargs: Any) -> Any:
        """Call ``pynvml.<fname>``; ``None`` when the value is not available.

        ``key`` names the function in the "missing" memory when one Python wrapper
        fronts several C functions (``nvmlDeviceGetMemoryInfo`` with and without v2).
        Raises :class:`_DeviceLost` for device-level failures.
        """
        key = key or fname
        if key in self._missing:
            return None
        func = getattr(pynvml, fname, None)
        if func is None:  # binding older than this function
            self._missing.add(key)
            return None
        try:
            return func(*args, **kwargs)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _ERR_NOT_SUPPORTED:
                return None
            if code == _ERR_FUNCTION_NOT_FOUND:
                self._missing.add(key)
                return None
            if code in _LOST_MESSAGES:
                raise _DeviceLost(_LOST_MESSAGES[code]) from exc
            if code in (_ERR_UNINITIALIZED, _ERR_DRIVER_NOT_LOADED):
                raise _LibraryGone(str(exc)) from exc
            self._errors.append(f"{fname}: {exc}")
            return None
        except pynvml.NVMLLibraryMismatchError:
            # The unversioned wrappers turn FunctionNotFound into this (not an NVMLError).
            self._missing.add(key)
            return None
        except TypeError:
            # A binding whose wrapper lacks an argument we pass (e.g. ``version=``).
            self._missing.add(key)
            return None

    def _sample_device(
        self, dev: _Device, refresh_pcie: bool, want_procs: bool
    ) -> tuple[GpuSample, list[Any] | None]:
        self._errors = []
        try:
            if dev.handle is None:
                handle = self._call("nvmlDeviceGetHandleByIndex", dev.index)
                if handle is None:
                    error = self._errors[0] if self._errors else "no handle"
                    return GpuSample(dev.index, dev.name, dev.uuid, error=error), None
                dev.handle = handle
            h = dev.handle
            if dev.name is None:
                dev.name = _text(self._call("nvmlDeviceGetName", h))
            if dev.uuid is None:
                dev.uuid = _text(self._call("nvmlDeviceGetUUID", h))

            util = self._call("nvmlDeviceGetUtilizationRates", h)
            mem = self._memory(h)
            power_mw = self._call("nvmlDeviceGetPowerUsage", h)
            limit_mw = self._call("nvmlDeviceGetEnforcedPowerLimit", h)
            temp = self._call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
            sm = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
            memclk = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
            reasons = self._clock_reasons(h)
            if refresh_pcie:
                rx = self._call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
                tx = self._call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
                dev.pcie_rx_bps = None if rx is None else float(rx) * 1024.0  # KB/s
                dev.pcie_tx_bps = None if tx is None else float(tx) * 1024.0
            procs = self._processes(h) if want_procs else None
        except _DeviceLost as lost:
            dev.forget_dynamic()  # re-acquire the handle next time: the GPU may come back
            return GpuSample(dev.index, dev.name, dev.uuid, state="lost", error=lost.message), None

        return (
            GpuSample(
                index=dev.index,
                name=dev.name,
                uuid=dev.uuid,
                error="; ".join(self._errors) or None,
                util_pct=None if util is None else float(util.gpu),
                mem_util_pct=None if util is None else float(util.memory),
                mem_used_bytes=None if mem is None else int(mem.used),
                mem_total_bytes=None if mem is None else int(mem.total),
                power_w=None if power_mw is None else power_mw / 1000.0,
                power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
                temperature_c=None if temp is None else float(temp),
                sm_clock_mhz=None if sm is None else float(sm),
                mem_clock_mhz=None if memclk is None else float(memclk),
                pcie_rx_bps=dev.pcie_rx_bps,
                pcie_tx_bps=dev.pcie_tx_bps,
                throttle_reasons=None if reasons is None else decode_clock_reasons(int(reasons)),
            ),
            procs,
        )

    def _memory(self, h: Any) -> Any:
        # v1 reports a wrong ``used`` on recent drivers (it counts reserved memory), so
        # v2 first; v1 only when the driver or the binding lacks v2.
        v2 = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 is None:
            self._missing.add("nvmlDeviceGetMemoryInfo_v2")
        if "nvmlDeviceGetMemoryInfo_v2" not in self._missing:
            mem = self._call(
                "nvmlDeviceGetMemoryInfo", h, version=v2, key="nvmlDeviceGetMemoryInfo_v2"
            )
            if "nvmlDeviceGetMemoryInfo_v2" not in self._missing:
                return mem
        return self._call("nvmlDeviceGetMemoryInfo", h)

    def _clock_reasons(self, h: Any) -> Any:
        # The "Throttle" name is deprecated (gone in CUDA 14) but is all older drivers have.
        if "nvmlDeviceGetCurrentClocksEventReasons" not in self._missing:
            value = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
            if "nvmlDeviceGetCurrentClocksEventReasons" not in self._missing:
                return value
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def _processes(self, h: Any) -> list[Any] | None:
        if "nvmlDeviceGetComputeRunningProcesses" not in self._missing:
            procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
            if "nvmlDeviceGetComputeRunningProcesses" not in self._missing:
                return None if procs is None else list(procs)
        # The unversioned wrapper calls _v3; drivers before 510 only have _v2.
        procs = self._call("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return None if procs is None else list(procs)

    @staticmethod
    def _attach_training_memory(
        samples: list[GpuSample], processes: list[list[Any] | None], pids: set[int]
    ) -> list[GpuSample]:
        """Sum ``usedGpuMemory`` of the training processes on each device.

        NVML lists host PIDs; inside a container they may not match ours. If no
        training PID shows up on any device we cannot tell "not on this GPU" from
        "different PID namespace", so every device gets ``None`` rather than a zero.
        """
        matched_any = any(
            procs and any(getattr(p, "pid", None) in pids for p in procs) for procs in processes
        )
        if not matched_any:
            return samples
        out: list[GpuSample] = []
        for sample, procs in zip(samples, processes, strict=True):
            total: int | None = None
            if procs is not None and sample.state == "ok":
                total = 0
                for p in procs:
                    if getattr(p, "pid", None) not in pids:
                        continue
                    used = getattr(p, "usedGpuMemory", None)
                    if used is None:  # WDDM / not available: the sum would be a guess
                        total = None
                        break
                    total += int(used)
            out.append(replace(sample, training_mem_bytes=total))
        return out


class NvmlWorker:
    """An :class:`NvmlCollector` read on a thread of its own. ``sample()`` asks it for a
    reading and waits up to WAIT_S; past that, the last reading, and once a call has been
    in progress BLOCKED_S, no GPU and why. A driver call that never returns then costs
    the GPU fields alone: the node sampler goes on with the host's figures, and
    ``close()`` returns (the thread is a daemon: the process exits around it)."""

    def __init__(
        self, collector: NvmlCollector, *, wait_s: float = WAIT_S, blocked_s: float = BLOCKED_S
    ) -> None:
        self.collector = collector
        self._wait_s, self._blocked_s = wait_s, blocked_s
        self._lock = threading.Lock()
        self._result: tuple[tuple[GpuSample, ...], SourceStatus] = (
            (),
            SourceStatus(SOURCE, False, "NVML not read yet", STARTING),
        )
        self._busy_since: float | None = None  # monotonic start of the call in progress
        self._asked = threading.Event()
        self._answered = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._asked.wait()
            if self._stop.is_set():
                return
            self._asked.clear()
            result = self.collector.sample()  # never raises
            with self._lock:
                self._result, self._busy_since = result, None
            self._answered.set()

    def sample(self) -> tuple[tuple[GpuSample, ...], SourceStatus]:
        """The GPUs now, or as last read; never blocks longer than the wait."""
        if self.collector.library_missing and self._busy_since is None:
            # No library (a CPU-only node): read here, no hand-over to the thread and
            # back each sample (two GIL switches the training thread would pay for).
            return self.collector.sample()
        with self._lock:
            busy = self._busy_since
            if busy is None:
                self._busy_since = time.monotonic()
                self._answered.clear()
                self._asked.set()
        if busy is None:
            self._answered.wait(self._wait_s)
        with self._lock:
            busy, result = self._busy_since, self._result
        if busy is not None:
            blocked = time.monotonic() - busy
            if blocked >= self._blocked_s:
                return (), SourceStatus(
                    SOURCE,
                    False,
                    f"NVML not answering: a driver call has not returned for {blocked:.0f} s"
                    " (a hung GPU or driver?); GPU figures resume when it does",
                    FAILING,
                )
        return result

    def close(self) -> None:
        """Stop the thread; shut NVML down unless a call is stuck in it."""
        self._stop.set()
        self._asked.set()
        self._thread.join(timeout=CLOSE_WAIT_S)
        if not self._thread.is_alive():
            self.collector.close()
