"""The node's busiest processes (any user's), for the viewer's process table.

The contention verdict blames "other processes"; this is where the user sees which.
One pass over ``/proc`` per sample through psutil's ``process_iter``, which keeps its
``Process`` objects between calls, so ``cpu_percent`` is the share over the sampling
interval without sleeping.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import psutil

from gputop_dl.probe.samples import TopProcess

TOP_BY_CPU = 10
TOP_BY_MEMORY = 3  # the biggest resident sets also show, even when idle (memory pressure)
_ATTRS = ["pid", "ppid", "name", "cpu_percent", "memory_info"]


def busiest(
    processes: Iterable[TopProcess], by_cpu: int = TOP_BY_CPU, by_memory: int = TOP_BY_MEMORY
) -> tuple[TopProcess, ...]:
    """The ``by_cpu`` busiest processes, then the ``by_memory`` largest not among them;
    CPU-hungry first. A process without a CPU figure yet ranks only by memory."""
    processes = list(processes)
    timed = [p for p in processes if p.cpu_pct is not None]
    top = heapq.nlargest(by_cpu, timed, key=lambda p: (p.cpu_pct, p.rss_bytes or 0))
    chosen = {p.pid for p in top}
    rest = [p for p in processes if p.pid not in chosen]
    top += heapq.nlargest(by_memory, rest, key=lambda p: p.rss_bytes or 0)
    return tuple(top)


class TopCollector:
    """``sample()`` once per sampling interval; the first call has no CPU figures (None)."""

    def __init__(self, by_cpu: int = TOP_BY_CPU, by_memory: int = TOP_BY_MEMORY) -> None:
        self.by_cpu = by_cpu
        self.by_memory = by_memory
        self._seen: set[int] = set()  # pids seen last time: their cpu_percent has a baseline

    def sample(self) -> tuple[TopProcess, ...]:
        records = []
        seen = set()
        for proc in psutil.process_iter(_ATTRS):
            info = proc.info
            pid = info["pid"]
            seen.add(pid)
            cpu = info["cpu_percent"]  # None when access was denied
            memory = info["memory_info"]
            records.append(
                TopProcess(
                    pid=pid,
                    ppid=info["ppid"],
                    name=info["name"] or "?",
                    cpu_pct=cpu if pid in self._seen else None,  # psutil says 0.0 at first
                    rss_bytes=memory.rss if memory is not None else None,
                )
            )
        self._seen = seen
        return busiest(records, self.by_cpu, self.by_memory)
