"""Device time per step from CUDA events, without ever synchronizing the device.

Two events per step are recorded on the current stream from the training thread (a few
microseconds each): ``start`` when a batch arrives, ``end`` when the loop asks for the
next one. The publisher thread later polls ``Event.query()`` and, once both are done,
reads ``elapsed_time``. Nothing here blocks: an event that never completes is given up.

* ``device_s``      = elapsed(start_k, end_k): the device's span of step k;
* ``device_idle_s`` = elapsed(end_{k-1}, start_k): the device time that passed while the
  host waited for batch k. Near zero when the device still had queued work, equal to the
  data wait when the device sat idle.
"""

from __future__ import annotations

import sys
from typing import Any


class CudaTimer:
    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def record(self) -> Any:
        """Record a new event on the current stream (asynchronous, a few microseconds)."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def ready(*events: Any) -> bool:
        return all(e is None or e.query() for e in events)

    @staticmethod
    def elapsed_s(first: Any, second: Any) -> float | None:
        if first is None or second is None:
            return None
        return float(first.elapsed_time(second)) / 1000.0


def detect() -> tuple[CudaTimer | None, str, str | None]:
    """(timer, timing, note). Uses torch only if the training already imported it and
    already initialised CUDA: the probe must not create a CUDA context of its own."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "host", "torch not imported: step times are host-side"
    try:
        if hasattr(torch, "hpu") and _hpu_available(torch):
            return None, "host", "HPU: no device timing source; step times are host-side"
        if not torch.cuda.is_available():
            return None, "host", "no CUDA device: step times are host-side"
        if not torch.cuda.is_initialized():
            return None, "host", "CUDA not initialised yet: step times are host-side"
        return CudaTimer(torch), "cuda-events", None
    except Exception as exc:  # a broken CUDA install must not reach the training loop
        return None, "host", f"CUDA events unavailable: {exc}"


def _hpu_available(torch: Any) -> bool:
    try:
        return bool(torch.hpu.is_available())
    except Exception:
        return False
