"""Device timing from CUDA events, against a simulated device (tests/fakes/fake_cuda.py):
what ``device_s``, ``device_idle_s`` and ``device_caught_up`` say in the situations a
training meets, that nothing synchronizes the device, and the device-index mapping."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gputop_dl.probe.core import Probe, _DrainState, caught_up_at_start
from gputop_dl.probe.device_timing import CudaTimer, device_ref
from gputop_dl.probe.messages import DeviceRef, StepRecord, Steps
from gputop_dl.probe.protocol import decode, encode_steps
from tests.fakes.fake_cuda import Device, fake_torch

MS = 1e-3


def run_steps(
    monkeypatch: pytest.MonkeyPatch,
    device: Device,
    n: int,
    wait_s: float,
    work: Callable[[Device], None],
) -> list[StepRecord]:
    """Drive the probe's training-thread API over ``n`` simulated steps, then let the
    device finish and drain the records as the publisher thread would."""
    monkeypatch.setenv("GPUTOP_DISABLE", "1")  # no publisher thread: we drain by hand
    p = Probe(name="sim")
    p._timing_checks = 3
    p._timer = CudaTimer(fake_torch(device))
    for _ in range(n):
        t0 = device.now
        device.host(wait_s)
        p._open_step(t0, device.now, 32)
        work(device)
        p._close_step(device.now)
    device.host(10.0)  # long after: every event has completed
    batch = p._drain(_DrainState(), 0.0, force=False)
    assert batch is not None and device.syncs == 0  # the probe never synchronizes
    message = decode(encode_steps("sim", batch.base, batch.rows, 0, 0, 0))  # as a viewer reads
    assert isinstance(message, Steps)
    return list(message.records)


def launch_bound(d: Device) -> None:  # Python overhead between small kernels
    for _ in range(20):
        d.launch(0.1 * MS, host_cost=0.5 * MS)


def gpu_bound(d: Device) -> None:  # big kernels queued fast: the host runs ahead
    for _ in range(20):
        d.launch(1.0 * MS, host_cost=0.05 * MS)


def gpu_bound_with_item(d: Device) -> None:  # `loss.item()` at the end of each step
    gpu_bound(d)
    d.blocking(0.0)


def gpu_bound_unpinned_copy(d: Device) -> None:  # a synchronous H2D copy opens the step
    d.blocking(0.5 * MS)
    gpu_bound(d)


CASES = {
    # (work, data wait, expected device_caught_up from the second step on)
    "launch-bound": (launch_bound, 1 * MS, True),
    "gpu-bound": (gpu_bound, 1 * MS, False),
    "gpu-bound, sync copy at start": (gpu_bound_unpinned_copy, 1 * MS, False),
    "gpu-bound, .item() at end": (gpu_bound_with_item, 1 * MS, True),
    # Busy when the host finished the step; it caught up during the wait (device idle)
    "input-bound": (gpu_bound, 40 * MS, False),
    "input-bound, launch-bound": (launch_bound, 40 * MS, True),
}


@pytest.mark.parametrize(("work", "wait", "expected"), CASES.values(), ids=CASES.keys())
def test_caught_up_says_whether_the_device_had_work_queued_at_the_step_boundary(
    monkeypatch: pytest.MonkeyPatch, work: Callable[[Device], None], wait: float, expected: bool
) -> None:
    device = Device()
    records = run_steps(monkeypatch, device, 30, wait, work)
    assert len(records) == 30
    assert records[0].device_idle_s is None  # no earlier end event to measure from
    assert all(r.device_s is not None and r.device_idle_s is not None for r in records[1:])
    assert {r.device_caught_up for r in records[5:]} == {expected}


def test_event_spans_match_the_simulated_device(monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device()
    records = run_steps(monkeypatch, device, 10, 40 * MS, gpu_bound)
    steady = records[5:]
    for r in steady:
        # 20 kernels of 1 ms, the first launched 0.05 ms after the device reached start
        assert r.device_s == pytest.approx(20.05 * MS, rel=1e-6)
        # The device finished its 20 ms during the 40 ms wait... minus the 19 ms it was
        # still behind when the host finished queuing (20 x 1 ms - 20 x 0.05 ms).
        # (and the first kernel of the step started 0.05 ms after the start event).
        assert r.device_idle_s == pytest.approx(40 * MS - 19.05 * MS, rel=1e-6)
        assert r.wait_s == pytest.approx(40 * MS)


def test_gpu_bound_device_never_idles_at_the_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    records = run_steps(monkeypatch, Device(), 20, 1 * MS, gpu_bound)
    assert all(r.device_idle_s == 0.0 for r in records[5:])


def test_incomplete_events_hold_records_back_without_blocking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUTOP_DISABLE", "1")
    device = Device()
    p = Probe(name="sim")
    p._timing_checks = 3
    p._timer = CudaTimer(fake_torch(device))
    for _ in range(3):
        t0 = device.now
        p._open_step(t0, device.now, 1)
        gpu_bound(device)
        p._close_step(device.now)
    state = _DrainState()
    assert p._drain(state, 0.0, force=False) is None  # device still busy
    assert len(state.pending) == 3 and device.syncs == 0
    device.host(1.0)
    batch = p._drain(state, 0.0, force=False)
    assert batch is not None and [w.index for w in batch.rows] == [0, 1, 2]


CAUGHT_UP = [
    # (host gap, device idle, previous period, expected)
    (0.010, None, 0.1, None),  # no device timing
    (0.010, 0.5, None, None),  # first step: no previous step
    (-1.0, 0.5, 0.1, None),  # no wait measured (probe.step)
    (0.010, 0.0, 0.1, False),  # the device was busy through the whole wait
    (0.010, 0.010, 0.1, True),  # idle exactly as long as the wait: nothing was queued
    (0.010, 0.001, 0.1, True),  # 9 ms behind a 100 ms step: its last kernel
    (0.010, 0.001, 0.05, False),  # 9 ms behind a 50 ms step: had queued work
    (0.001, 0.00095, 0.0001, True),  # 50 us: within timer and record noise
    (0.0, 0.0, 0.1, False),
]


@pytest.mark.parametrize(("gap", "idle", "period", "expected"), CAUGHT_UP)
def test_caught_up_rule(
    gap: float, idle: float | None, period: float | None, expected: bool | None
) -> None:
    assert caught_up_at_start(gap, idle, period) is expected


DEVICES = [
    # (kind, logical index, torch uuid, environment, expected)
    ("cuda", 1, None, {}, DeviceRef("cuda", 1, None)),
    ("cuda", 1, None, {"CUDA_VISIBLE_DEVICES": "4,5,6"}, DeviceRef("cuda", 5, None)),
    ("cuda", 0, None, {"CUDA_VISIBLE_DEVICES": " 3 "}, DeviceRef("cuda", 3, None)),
    ("cuda", 2, None, {"CUDA_VISIBLE_DEVICES": "4,5"}, DeviceRef("cuda", None, None)),
    ("cuda", 1, None, {"CUDA_VISIBLE_DEVICES": "4,x,6"}, DeviceRef("cuda", None, None)),
    ("cuda", 0, None, {"CUDA_VISIBLE_DEVICES": ""}, DeviceRef("cuda", None, None)),
    (
        "cuda",
        0,
        "GPU-1234-abcd",
        {"CUDA_VISIBLE_DEVICES": "GPU-1234"},
        DeviceRef("cuda", None, "GPU-1234-abcd"),
    ),
    (
        "cuda",
        1,
        None,
        {"CUDA_VISIBLE_DEVICES": "GPU-aa,MIG-bb"},
        DeviceRef("cuda", None, "MIG-bb"),
    ),
    ("cuda", 0, "GPU-zz", {"CUDA_VISIBLE_DEVICES": "GPU-aa"}, DeviceRef("cuda", None, "GPU-aa")),
    ("hpu", 0, None, {"HABANA_VISIBLE_MODULES": "6,7"}, DeviceRef("hpu", 6, None)),
    ("hpu", 0, None, {"CUDA_VISIBLE_DEVICES": "3"}, DeviceRef("hpu", 0, None)),
    ("hpu", None, None, {}, DeviceRef("hpu", None, None)),
]


@pytest.mark.parametrize(("kind", "index", "uuid", "env", "expected"), DEVICES)
def test_device_ref_maps_the_logical_index_to_the_physical_device(
    kind: str, index: int | None, uuid: str | None, env: dict[str, str], expected: DeviceRef
) -> None:
    assert device_ref(kind, index, uuid, env) == expected
