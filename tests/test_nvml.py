"""NVML collector against a fake at the pynvml function boundary, plus the real binding.

The fake returns the binding's own ctypes structures and raises real NVMLError
subclasses, so these tests exercise the same code paths a machine with GPUs would.
"""

from __future__ import annotations

import pynvml
import pytest
from fakes.fake_nvml import (
    DRIVER_NOT_LOADED,
    FUNCTION_NOT_FOUND,
    H100,
    H100_TOTAL,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    UNKNOWN,
    FakeGpu,
    FakeNvml,
    reason_mask,
)

from gputop_dl.probe.collectors import nvml as nvml_mod
from gputop_dl.probe.collectors.nvml import NvmlCollector, decode_clock_reasons, physical_gpu_index


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml(8).install(monkeypatch)


def test_eight_gpus_units_and_fields(fake: FakeNvml) -> None:
    fake.gpus[2].clock_reasons = reason_mask("SwPowerCap", "HwThermalSlowdown")
    col = NvmlCollector(pcie_every=1)
    gpus, status = col.sample()
    assert status.ok and status.source == "nvml" and status.message == ""
    assert [g.index for g in gpus] == list(range(8))
    g = gpus[0]
    assert g.name == H100 and g.uuid == "GPU-4c2b9b1e-7f7e-4a1c-9d4e-000000000000"
    assert g.state == "ok" and g.error is None
    assert g.util_pct == 97.0 and g.mem_util_pct == 43.0
    # v2 memory: the v1 figure (which counts reserved memory as used) must not leak in
    assert g.mem_used_bytes == 61_203_283_968 and g.mem_total_bytes == H100_TOTAL
    assert g.power_w == pytest.approx(612.345)  # from 612345 mW
    assert g.power_limit_w == pytest.approx(700.0)
    assert g.temperature_c == 63.0
    assert g.sm_clock_mhz == 1980.0 and g.mem_clock_mhz == 2619.0
    assert g.pcie_rx_bps == 2_500_000 * 1024  # from KB/s
    assert g.pcie_tx_bps == 1_250_000 * 1024
    assert g.throttle_reasons == ()  # reported, nothing throttling: not None
    assert gpus[2].throttle_reasons == ("sw_power_cap", "hw_thermal")
    assert g.training_mem_bytes is None  # no training_pids given: unknown
    col.close()
    assert not fake.initialised


def test_init_is_lazy_and_close_shuts_down(fake: FakeNvml) -> None:
    col = NvmlCollector()
    assert fake.calls["nvmlInit"] == 0
    col.sample()
    col.sample()
    assert fake.calls["nvmlInit"] == 1
    col.close()
    col.close()  # idempotent
    assert fake.calls["nvmlShutdown"] == 1


def test_field_not_supported_is_none_not_zero(fake: FakeNvml) -> None:
    fake.gpus[1].not_supported = {
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPcieThroughput",
    }
    gpus, status = NvmlCollector(pcie_every=1).sample()
    assert status.ok
    g1 = gpus[1]
    assert g1.state == "ok" and g1.error is None
    assert g1.power_w is None and g1.util_pct is None and g1.mem_util_pct is None
    assert g1.pcie_rx_bps is None and g1.pcie_tx_bps is None
    assert g1.temperature_c == 63.0 and g1.power_limit_w == 700.0  # rest of the device intact
    assert gpus[0].power_w == pytest.approx(612.345)  # other devices untouched


def test_unexpected_field_error_is_reported_on_the_device(fake: FakeNvml) -> None:
    fake.gpus[3].errors = {"nvmlDeviceGetTemperature": UNKNOWN}
    gpus, _ = NvmlCollector().sample()
    assert gpus[3].temperature_c is None
    assert gpus[3].state == "ok"
    assert gpus[3].error == "nvmlDeviceGetTemperature: Unknown Error"


def test_gpu_lost_mid_run_then_back(fake: FakeNvml) -> None:
    col = NvmlCollector()
    gpus, _ = col.sample()
    assert gpus[5].state == "ok"

    fake.gpus[5].lost = True
    fake.gpus[0].power_mw = 100_000  # others keep updating
    gpus, status = col.sample()
    assert status.ok and status.message == "lost: GPU 5"
    lost = gpus[5]
    assert lost.state == "lost" and lost.error == "GPU is lost"
    assert lost.name == H100 and lost.uuid is not None  # identity kept from before
    assert lost.power_w is None and lost.util_pct is None
    assert gpus[0].power_w == pytest.approx(100.0)
    assert all(g.state == "ok" for g in gpus if g.index != 5)

    fake.gpus[5].lost = False
    gpus, status = col.sample()
    assert gpus[5].state == "ok" and gpus[5].error is None and status.message == ""
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 9  # handle re-acquired after a loss
    assert gpus[5].power_w == pytest.approx(612.345)


def test_lost_from_the_first_sample_has_no_identity(fake: FakeNvml) -> None:
    fake.gpus[7].lost = True
    gpus, _ = NvmlCollector().sample()
    assert gpus[7].state == "lost" and gpus[7].name is None and gpus[7].uuid is None


@pytest.mark.parametrize(
    ("code", "message", "state"),
    [
        (LIBRARY_NOT_FOUND, "NVML library not found", "absent"),
        (DRIVER_NOT_LOADED, "NVIDIA driver not loaded", "absent"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to use NVML", "absent"),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "NVML library too old for nvidia-ml-py", "absent"),
        (
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "NVIDIA driver/library version mismatch (reload the driver)",
            "failing",  # the GPUs are there: a fault to warn about
        ),
        (UNKNOWN, "NVML init failed: Unknown Error", "failing"),
    ],
)
def test_init_failure_statuses(fake: FakeNvml, code: int, message: str, state: str) -> None:
    """The collector says what a failure means (a viewer does not read it from words)."""
    fake.init_error = code
    gpus, status = NvmlCollector().sample()
    assert gpus == ()
    assert status == nvml_mod.SourceStatus("nvml", False, message, state)


def test_init_retry_is_rate_limited_then_succeeds(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(nvml_mod.time, "monotonic", lambda: now[0])
    fake.init_error = DRIVER_NOT_LOADED
    col = NvmlCollector()
    for _ in range(5):
        _, status = col.sample()
        assert status.message == "NVIDIA driver not loaded"
    assert fake.calls["nvmlInit"] == 1  # not retried on every sample

    fake.init_error = None  # driver loaded later
    now[0] += 29.0
    assert col.sample()[1].message == "NVIDIA driver not loaded"
    assert fake.calls["nvmlInit"] == 1
    now[0] += 2.0
    gpus, status = col.sample()
    assert status.ok and len(gpus) == 8
    assert fake.calls["nvmlInit"] == 2


def test_no_gpu_is_an_ok_status(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(0).install(monkeypatch)
    gpus, status = NvmlCollector().sample()
    assert gpus == () and status.ok and status.message == "no NVIDIA GPU"


def test_function_not_found_is_remembered(fake: FakeNvml) -> None:
    fake.missing = {"nvmlDeviceGetEnforcedPowerLimit"}
    col = NvmlCollector()
    for _ in range(3):
        gpus, status = col.sample()
        assert status.ok
        assert all(g.power_limit_w is None and g.power_w is not None for g in gpus)
        assert all(g.error is None for g in gpus)
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 1  # never asked again


def test_old_driver_fallbacks(fake: FakeNvml) -> None:
    # A driver without memory v2, the clock *event* reasons and processes _v3.
    fake.missing = {
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    }
    fake.gpus[0].clock_reasons = reason_mask("GpuIdle")
    fake.gpus[0].processes = [(4242, 1 << 30)]
    col = NvmlCollector(training_pids=lambda: [4242])
    for _ in range(2):
        gpus, _ = col.sample()
        assert gpus[0].mem_used_bytes == 61_770_039_296  # v1 figure, better than nothing
        assert gpus[0].throttle_reasons == ("gpu_idle",)
        assert gpus[0].training_mem_bytes == 1 << 30
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 1


def test_binding_without_version_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(1).install(monkeypatch)

    def v1_only(handle: object) -> pynvml.c_nvmlMemory_t:  # an older binding's signature
        return fake.nvmlDeviceGetMemoryInfo(handle)  # type: ignore[arg-type]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", v1_only)
    gpus, _ = NvmlCollector().sample()
    assert gpus[0].mem_used_bytes == 61_770_039_296


def test_bytes_names_from_older_bindings(fake: FakeNvml) -> None:
    fake.names_as_bytes = True
    gpus, _ = NvmlCollector().sample()
    assert gpus[0].name == H100 and isinstance(gpus[0].name, str)
    assert gpus[0].uuid is not None and gpus[0].uuid.startswith("GPU-")


def test_pcie_only_every_n_samples_staggered(fake: FakeNvml) -> None:
    col = NvmlCollector(pcie_every=5)
    per_sample = []
    for _ in range(10):
        before = fake.calls["nvmlDeviceGetPcieThroughput"]
        gpus, _ = col.sample()
        per_sample.append(fake.calls["nvmlDeviceGetPcieThroughput"] - before)
    # 8 devices x 2 directions per 5 samples, never all 16 calls in one sample
    assert sum(per_sample) == 2 * 16
    assert max(per_sample) <= 4
    # after a full cycle every device has a value, reused between refreshes
    assert all(g.pcie_rx_bps == 2_500_000 * 1024 for g in gpus)
    fake.gpus[0].pcie_rx_kbps = 1
    gpus, _ = col.sample()  # sample 10: device 0 refreshes ((10 + 0) % 5 == 0)
    assert gpus[0].pcie_rx_bps == 1024
    gpus, _ = col.sample()
    assert gpus[0].pcie_rx_bps == 1024  # reused, not re-read


def test_pcie_disabled(fake: FakeNvml) -> None:
    gpus, _ = NvmlCollector(pcie_every=0).sample()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert all(g.pcie_rx_bps is None for g in gpus)


def test_training_memory_sums_only_training_pids(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [(100, 2 << 30), (101, 1 << 30), (999, 5 << 30)]
    fake.gpus[1].processes = [(999, 5 << 30)]
    fake.gpus[2].processes = [(100, None)]  # usedGpuMemory not available
    gpus, _ = NvmlCollector(training_pids=lambda: {100, 101}).sample()
    assert gpus[0].training_mem_bytes == 3 << 30
    assert gpus[1].training_mem_bytes == 0  # a real zero: NVML listed it, not ours
    assert gpus[2].training_mem_bytes is None
    assert gpus[3].training_mem_bytes == 0


def test_training_memory_unknown_when_no_pid_matches(fake: FakeNvml) -> None:
    # Inside a container NVML lists host PIDs: no match anywhere means "unknown".
    fake.gpus[0].processes = [(55123, 2 << 30)]
    gpus, _ = NvmlCollector(training_pids=lambda: {7}).sample()
    assert all(g.training_mem_bytes is None for g in gpus)


def test_training_pids_callback_failure_is_unknown(fake: FakeNvml) -> None:
    def boom() -> list[int]:
        raise RuntimeError("psutil went away")

    gpus, status = NvmlCollector(training_pids=boom).sample()
    assert status.ok and all(g.training_mem_bytes is None for g in gpus)


def test_driver_unloaded_mid_run_recovers_later(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(nvml_mod.time, "monotonic", lambda: now[0])
    col = NvmlCollector()
    assert len(col.sample()[0]) == 8
    fake.initialised = False  # someone shut NVML down under us: every call -> Uninitialized
    gpus, status = col.sample()
    assert gpus == () and not status.ok and status.message.startswith("NVML stopped working")
    now[0] += 31.0
    assert len(col.sample()[0]) == 8


def test_sample_never_raises(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    def weird(handle: object) -> object:
        raise ZeroDivisionError("binding bug")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", weird)
    gpus, status = NvmlCollector().sample()
    assert gpus == () and not status.ok and "binding bug" in status.message


def test_decode_clock_reasons_unknown_bits_kept() -> None:
    mask = reason_mask("HwSlowdown", "HwPowerBrakeSlowdown", "SwThermalSlowdown") | (1 << 40)
    assert decode_clock_reasons(mask) == (
        "hw_slowdown",
        "sw_thermal",
        "hw_power_brake",
        "0x" + format(1 << 40, "x"),
    )


@pytest.mark.parametrize(
    ("rank", "cvd", "expected"),
    [
        (1, "2,3", 3),
        (0, "2,3", 2),
        (2, "2,3", None),
        (1, " 4, 5 ", 5),
        (
            0,
            "GPU-8f2c1a9e-0000-1111-2222-333344445555,1",
            "GPU-8f2c1a9e-0000-1111-2222-333344445555",
        ),
        (1, "0,-1,2", None),  # CUDA stops at the first invalid entry
        (0, "", None),  # nothing visible
        (3, None, 3),  # unset: all devices visible in order
        (None, "0,1", None),
    ],
)
def test_physical_gpu_index(rank: int | None, cvd: str | None, expected: int | str | None) -> None:
    assert physical_gpu_index(rank, cvd) == expected


def test_real_binding_without_driver_reports_library_not_found() -> None:
    """On this machine (no NVIDIA driver) the real pynvml must give a clean status."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    col = NvmlCollector()
    gpus, status = col.sample()
    assert gpus == ()
    assert status == nvml_mod.SourceStatus("nvml", False, "NVML library not found", "absent")
    col.close()


def test_fake_is_faithful_to_the_binding(fake: FakeNvml) -> None:
    """Guards the fake itself: real structures, real error classes."""
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t
    )
    assert isinstance(pynvml.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    fake.gpus[0].not_supported = {"nvmlDeviceGetPowerUsage"}
    with pytest.raises(pynvml.NVMLError_NotSupported) as info:
        pynvml.nvmlDeviceGetPowerUsage(h)
    assert str(info.value) == "Not Supported" and info.value.value == NOT_SUPPORTED
    fake.missing = {"nvmlDeviceGetComputeRunningProcesses_v3"}
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    fake.missing = {"nvmlDeviceGetMemoryInfo_v2"}
    with pytest.raises(pynvml.NVMLError_FunctionNotFound) as info2:
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert info2.value.value == FUNCTION_NOT_FOUND and str(info2.value) == "Function Not Found"
    fake.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlShutdown()


def test_fake_gpu_defaults() -> None:
    g = FakeGpu(3)
    assert g.uuid.endswith("3") and g.name == H100


# ---------------------------------------------------------------- a driver call that blocks


def test_a_blocked_driver_call_costs_the_gpus_alone(fake: FakeNvml) -> None:
    """A hung GPU's nvmlDeviceGetUtilizationRates never returns (nvml.md: monitors that
    hang on these are a known complaint): each node sample still comes within the wait,
    says why the GPUs are missing, and close() returns."""
    import threading
    import time

    from gputop_dl.probe.collectors.sampler import NodeSampler

    sampler = NodeSampler(main_pid=None, interval_s=0.2, host=True)
    assert isinstance(sampler._nvml, nvml_mod.NvmlWorker)
    sampler._nvml._wait_s, sampler._nvml._blocked_s = 0.3, 0.5
    first = sampler.sample()
    assert len(first.gpus) == 8 and first.cpu is not None
    release = fake.blocked["nvmlDeviceGetUtilizationRates"] = threading.Event()
    try:
        t0 = time.monotonic()
        during = []
        for _ in range(4):  # the sampler's pace
            s0 = time.monotonic()
            during.append(sampler.sample())
            assert time.monotonic() - s0 < 0.3 + 0.2  # each waited at most the wait
            time.sleep(0.2)
        assert time.monotonic() - t0 > 0.5
        assert all(s.cpu is not None and s.memory is not None for s in during)  # the host
        last = during[-1]
        assert last.gpus == ()
        (status,) = [s for s in last.statuses if s.source == "nvml"]
        assert not status.ok and "NVML not answering" in status.message
        t0 = time.monotonic()
        sampler.close()
        assert time.monotonic() - t0 < 2.0  # not held by the call (nor by nvmlShutdown)
        assert fake.initialised  # left as it is: its shutdown would block as well
    finally:
        release.set()


def test_the_gpus_come_back_when_the_call_returns(fake: FakeNvml) -> None:
    import threading
    import time

    worker = nvml_mod.NvmlWorker(NvmlCollector(), wait_s=0.2, blocked_s=0.3)
    try:
        assert len(worker.sample()[0]) == 8
        release = fake.blocked["nvmlDeviceGetPowerUsage"] = threading.Event()
        worker.sample()  # waits 0.2 s
        time.sleep(0.2)
        gpus, status = worker.sample()
        assert gpus == () and "not answering" in status.message
        del fake.blocked["nvmlDeviceGetPowerUsage"]
        release.set()
        for _ in range(20):  # at the sampler's pace
            gpus, status = worker.sample()
            if gpus:
                break
            time.sleep(0.1)
        assert len(gpus) == 8 and status.ok
    finally:
        worker.close()
    assert not fake.initialised  # closed cleanly: NVML shut down


@pytest.mark.parametrize(("only", "read"), [(3, [3]), ("GPU-own", [5]), (None, list(range(8)))])
def test_a_rank_reads_its_own_gpu_only(
    fake: FakeNvml, only: int | str | None, read: list[int]
) -> None:
    """Not every GPU with its ~20 ms PCIe calls, in each of a node's eight ranks."""
    fake.gpus[5].uuid = "GPU-own"
    col = NvmlCollector(pcie_every=1, only=only)
    gpus, status = col.sample()
    assert status.ok and [g.index for g in gpus] == read
    col.sample()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2 * 2 * len(read)


def test_nvml_is_counted_like_the_library(fake: FakeNvml) -> None:
    """Two users (the probe's sampler, an agent's) in one process: one's close leaves
    the other's NVML working, as the real library's count of nvmlInit does."""
    a, b = NvmlCollector(), NvmlCollector()
    assert a.sample()[1].ok and b.sample()[1].ok
    assert a.close()
    gpus, status = b.sample()
    assert status.ok and len(gpus) == 8


HUNG_GPU_TRAINING = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from fakes.fake_nvml import FakeNvml
from gputop_dl import probe

with FakeNvml(8).installed() as fake:
    # The driver hangs in the first utilization query and never comes back.
    fake.blocked["nvmlDeviceGetUtilizationRates"] = threading.Event()
    p = probe.Probe(name="hung-gpu", listen="tcp://127.0.0.1:*")
    for _ in p.watch(range(100), samples=8):
        time.sleep(0.01)
    time.sleep(1.5)  # the node sampler's first sample is stuck in NVML by now
    print("trained", p._sampler.taken, flush=True)
"""


def test_a_training_whose_gpu_driver_hangs_still_exits(tmp_path: object) -> None:
    """The worst a monitor can do: a training that finished, held at exit by its probe
    waiting for a driver call that never returns (the probe's close shut NVML down under
    the lock the stuck call held)."""
    import os
    import subprocess
    import sys
    import time

    tests = os.path.dirname(os.path.abspath(__file__))
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", HUNG_GPU_TRAINING, tests],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUTOP_RUNTIME_DIR": str(tmp_path)},
    )
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("trained"), out.stdout
    assert int(out.stdout.split()[1]) >= 1  # the sampler went on past the stuck call
    assert took < 15, took  # 1 s of steps, 1.5 s of wait, the exit: not held


def test_without_the_library_no_thread_hand_over_a_sample() -> None:
    """A node without NVIDIA's driver (this one): once the library is known missing,
    samples are read in place (a failed dlopen returns at once), the NVML thread is not
    woken for each."""
    import threading

    collector = NvmlCollector()
    read_on: list[str] = []
    real = collector.sample

    def sample() -> tuple[tuple[object, ...], object]:
        read_on.append(threading.current_thread().name)
        return real()

    collector.sample = sample  # type: ignore[method-assign,assignment]
    worker = nvml_mod.NvmlWorker(collector)
    try:
        gpus, status = worker.sample()  # the first, through the thread
        assert gpus == () and status.message == "NVML library not found"
        assert collector.library_missing
        for _ in range(3):
            assert worker.sample()[1].message == "NVML library not found"
    finally:
        worker.close()
    assert read_on == ["gputop-nvml"] + [threading.current_thread().name] * 3, read_on
