"""Device time per step from CUDA events, without ever synchronizing the device.

Two events per step are recorded on the current stream from the training thread (a few
microseconds each): ``start`` when a batch arrives, ``end`` when the loop asks for the
next one. The publisher thread later polls ``Event.query()`` and, once both are done,
reads ``elapsed_time``. Nothing here blocks: an event that never completes is given up.

* ``device_s``      = elapsed(start_k, end_k): the device's span of step k;
* ``device_idle_s`` = elapsed(end_{k-1}, start_k): the device time that passed while the
  host waited for batch k. Near zero when the device still had queued work, equal to the
  data wait when the device sat idle.
* ``device_caught_up`` compares that gap with the host's (``core.caught_up_at_start``):
  it tells whether the device had any work queued when the host finished a step.

This module also names the process's own device (:func:`own_device` on the training
thread, where CUDA's per-thread current device is the right one; :func:`device_ref`
maps it through ``CUDA_VISIBLE_DEVICES`` / ``HABANA_VISIBLE_MODULES``, a pure function).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from gputop_dl.probe.messages import DeviceRef


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


def own_device(timing: str) -> tuple[str, int | None, str | None] | None:
    """(kind, logical index, uuid) of the device the calling thread trains on, or None.

    Only asks a runtime the training already initialised (no CUDA context is created):
    ``current_device`` reads the calling thread's device, and the properties are cached
    by torch after the first call.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if timing == "cuda-events":
        index = int(torch.cuda.current_device())
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        return "cuda", index, _cuda_uuid(uuid)
    if hasattr(torch, "hpu") and _hpu_available(torch):
        return "hpu", int(torch.hpu.current_device()), None
    return None


def _cuda_uuid(uuid: Any) -> str | None:
    """torch prints a device UUID bare; NVML and CUDA_VISIBLE_DEVICES prefix ``GPU-``."""
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def device_ref(
    kind: str, index: int | None, uuid: str | None, environ: Mapping[str, str]
) -> DeviceRef:
    """Map a logical device index to the physical one a node sampler reports.

    CUDA: ``CUDA_VISIBLE_DEVICES`` lists indices or ``GPU-``/``MIG-`` UUIDs (CUDA stops
    at the first invalid entry); logical index i is its i-th entry. HPU:
    ``HABANA_VISIBLE_MODULES`` lists the module ids hl-smi reports. Unset: the logical
    index is the physical one. Anything that does not map gives ``index=None`` -- never a
    guess.
    """
    var = "CUDA_VISIBLE_DEVICES" if kind == "cuda" else "HABANA_VISIBLE_MODULES"
    visible = environ.get(var)
    if index is None:
        return DeviceRef(kind, None, uuid)
    if visible is None:
        return DeviceRef(kind, index, uuid)
    entries = []
    for raw in visible.split(","):
        entry = raw.strip()
        if entry.isdigit() or (kind == "cuda" and entry.startswith(("GPU-", "MIG-"))):
            entries.append(entry)
        else:
            break  # CUDA ignores everything from the first invalid entry on
    if not 0 <= index < len(entries):
        return DeviceRef(kind, None, uuid)
    entry = entries[index]
    if entry.isdigit():
        return DeviceRef(kind, int(entry), uuid)
    # A UUID (CUDA accepts a unique prefix) names the device; the full one from torch is
    # kept when it matches, a MIG instance's own UUID always.
    full = uuid if uuid is not None and uuid.startswith(entry) else entry
    return DeviceRef(kind, None, full)
