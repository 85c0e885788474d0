"""A faithful stand-in for the slice of ``torch.cuda`` the probe uses: events on one
stream of a simulated device, with the real API's semantics.

The device runs queued work in order: an item queued at host time ``h`` starts at
``max(h, device free)``. ``Event.record()`` queues a marker that completes when the
device reaches it; ``query()`` says whether it has by the current host time (never
blocks); ``elapsed_time(end)`` is in milliseconds between two *completed* events and
raises like torch ("device not ready") otherwise. ``synchronize`` exists because the real
API has it, and counts its calls: the probe must never make one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class Device:
    now: float = 0.0  # host clock, seconds
    free_at: float = 0.0  # when the device finishes everything queued so far
    busy_s: float = 0.0  # total kernel time executed
    syncs: int = 0
    records: int = 0
    launches: list[tuple[float, float]] = field(default_factory=list)

    def host(self, seconds: float) -> None:
        """The host spends ``seconds`` (Python, data wait) without queuing anything."""
        self.now += seconds

    def launch(self, seconds: float, host_cost: float = 0.0) -> None:
        """The host queues a kernel of ``seconds`` of device time (asynchronous)."""
        self.now += host_cost
        start = max(self.now, self.free_at)
        self.free_at = start + seconds
        self.busy_s += seconds
        self.launches.append((start, self.free_at))

    def blocking(self, seconds: float) -> None:
        """A synchronous operation (non-pinned copy, ``.item()``): the host waits until
        the device has done everything queued, then this."""
        self.launch(seconds)
        self.now = max(self.now, self.free_at)


class Event:
    def __init__(self, device: Device, enable_timing: bool = False) -> None:
        self._device = device
        self._timing = enable_timing
        self._done_at: float | None = None

    def record(self, stream: Any = None) -> None:
        d = self._device
        d.records += 1
        self._done_at = max(d.now, d.free_at)

    def query(self) -> bool:
        return self._done_at is not None and self._done_at <= self._device.now

    def synchronize(self) -> None:
        self._device.syncs += 1
        if self._done_at is not None:
            self._device.now = max(self._device.now, self._done_at)

    def elapsed_time(self, end: Event) -> float:
        if not self._timing or not end._timing:
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        assert self._done_at is not None and end._done_at is not None
        return (end._done_at - self._done_at) * 1000.0


def fake_torch(device: Device) -> Any:
    """A module-like object exposing ``torch.cuda.Event`` bound to ``device``."""

    def make_event(enable_timing: bool = False, **_: Any) -> Event:
        return Event(device, enable_timing)

    def synchronize(*_: Any) -> None:
        device.syncs += 1
        device.now = max(device.now, device.free_at)

    cuda = SimpleNamespace(Event=make_event, synchronize=synchronize)
    return SimpleNamespace(cuda=cuda)
