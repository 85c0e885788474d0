"""The node's busiest processes (any user's), for the viewer's process table.

The contention verdict blames "other processes"; this is where the user sees which.
One read of ``/proc/<pid>/stat`` per process and sample (name, parent, CPU times,
resident set): psutil's ``process_iter`` costs ten times as much (25 ms of CPU a sample
for 100 processes), too much for a sampler that runs beside the training every second.
Linux only: elsewhere ``sample`` returns None (not reported).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Iterable

from gputop_dl.probe.collectors import procfs
from gputop_dl.probe.samples import TopProcess

TOP_BY_CPU = 10
TOP_BY_MEMORY = 3  # the biggest resident sets also show, even when idle (memory pressure)
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def parse_stat(text: str) -> tuple[str, int, float, int, int] | None:
    """``/proc/<pid>/stat`` as (name, ppid, CPU seconds, resident bytes, start time in
    ticks); None when malformed. The name sits in parentheses and may itself hold
    spaces and parentheses: everything up to the last ")" is the name."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = text[close_at + 2 :].split(None, 22)  # the first 22 are read: split no more
    try:
        ppid = int(fields[1])
        cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
        return text[open_at + 1 : close_at], ppid, cpu_s, int(fields[21]) * _PAGE, int(fields[19])
    except (IndexError, ValueError):
        return None


# A process as TopProcess's fields (pid, ppid, name, CPU percent, resident bytes): a walk
# of /proc makes one per process and keeps ~13, so only those become TopProcess (a
# frozen dataclass costs 1.5-3 us to make, a tenth of the walk's cost a process).
Row = tuple[int, int | None, str, float | None, int | None]


def busiest(
    rows: Iterable[Row], by_cpu: int = TOP_BY_CPU, by_memory: int = TOP_BY_MEMORY
) -> tuple[TopProcess, ...]:
    """The ``by_cpu`` busiest processes, then the ``by_memory`` largest not among them;
    CPU-hungry first. A process without a CPU figure yet ranks only by memory."""
    rows = list(rows)
    timed = [r for r in rows if r[3] is not None]
    top = heapq.nlargest(by_cpu, timed, key=lambda r: (r[3], r[4] or 0))
    chosen = {r[0] for r in top}
    rest = [r for r in rows if r[0] not in chosen]
    top += heapq.nlargest(by_memory, rest, key=lambda r: r[4] or 0)
    return tuple(TopProcess(*r) for r in top)


class TopCollector:
    """``sample()`` once per sampling interval. A process's CPU share is over the time
    since the previous sample; a process not seen then (or the first time) has None."""

    def __init__(
        self,
        by_cpu: int = TOP_BY_CPU,
        by_memory: int = TOP_BY_MEMORY,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.by_cpu = by_cpu
        self.by_memory = by_memory
        self.proc_root = proc_root
        self.clock = clock
        # (pid, start time) -> CPU seconds at the last sample: a reused pid starts over
        self._last: dict[tuple[int, int], float] = {}
        self._last_at: float | None = None

    def sample(self) -> tuple[TopProcess, ...] | None:
        try:
            entries = procfs.list_dir(self.proc_root)
        except OSError:
            return None  # no /proc: not Linux, not reported
        now = self.clock()
        elapsed = now - self._last_at if self._last_at is not None else None
        seen: dict[tuple[int, int], float] = {}
        records: list[Row] = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                text = procfs.read_text(f"{self.proc_root}/{entry}/stat", single=True)
            except OSError:
                continue  # gone meanwhile
            parsed = parse_stat(text)
            if parsed is None:
                continue
            name, ppid, cpu_s, rss, started = parsed
            key = (int(entry), started)
            seen[key] = cpu_s
            before = self._last.get(key)
            cpu_pct = None
            if before is not None and elapsed:
                cpu_pct = max(0.0, 100.0 * (cpu_s - before) / elapsed)
            records.append((key[0], ppid, name, cpu_pct, rss))
        self._last, self._last_at = seen, now
        return busiest(records, self.by_cpu, self.by_memory)
