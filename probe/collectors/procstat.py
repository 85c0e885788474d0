"""The node-wide counters psutil reads on Linux, parsed from one read of each file.

psutil opens ``/proc/stat``, ``/proc/meminfo`` (twice), ``/proc/vmstat``,
``/proc/diskstats`` and ``/proc/net/dev`` through Python file objects: each read lets
go of the GIL six or seven times, which a Python-bound training thread pays for in
context switches (see procfs.py). The host collector reads these files with
:func:`procfs.read_text` and parses them here, with psutil's own meanings (its
``_pslinux.py``, 7.x): the same figures, field for field. Elsewhere it uses psutil.
"""

from __future__ import annotations

from typing import NamedTuple

# /proc/stat's per-core columns, in order (kernels since 2.6.33 have all ten)
CPU_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size


class Memory(NamedTuple):
    total: int
    available: int
    used: int  # psutil 7: total - available
    cached: int | None  # Cached + SReclaimable, as psutil; None where not reported
    swap_total: int
    swap_used: int


class DiskCounters(NamedTuple):
    read_count: int
    write_count: int
    read_bytes: int
    write_bytes: int
    busy_time: int  # ms


class NetCounters(NamedTuple):
    bytes_recv: int
    bytes_sent: int


def parse_cpu_times(text: str) -> tuple[tuple[str, ...], list[tuple[int, ...]]]:
    """Per-core cumulative ticks from ``/proc/stat``: (field names, one row a core, in
    the file's order, as psutil's ``cpu_times(percpu=True)``; ticks, not seconds: the
    collector only takes shares of their deltas)."""
    rows = []
    width = len(CPU_FIELDS)
    for line in text.splitlines():
        if line.startswith("cpu") and not line.startswith("cpu "):
            rows.append(tuple(int(x) for x in line.split()[1 : width + 1]))
    width = min((len(r) for r in rows), default=0)
    return CPU_FIELDS[:width], [r[:width] for r in rows]


def parse_meminfo(text: str) -> Memory | None:
    """``/proc/meminfo`` as psutil's ``virtual_memory`` and ``swap_memory`` read it; None
    without MemAvailable (kernels before 3.14: psutil estimates it, so the caller asks
    psutil)."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if value:
            kb[name] = int(value[0])
    try:
        total, free, available = kb["MemTotal"], kb["MemFree"], kb["MemAvailable"]
        swap_total, swap_free = kb["SwapTotal"], kb["SwapFree"]
    except KeyError:
        return None
    if available == 0:
        return None  # psutil estimates it then, too
    if available > total:  # a container's distorted figures: psutil takes MemFree
        available = free
    return Memory(
        total=total * 1024,
        available=available * 1024,
        used=(total - available) * 1024,
        cached=(kb["Cached"] + kb.get("SReclaimable", 0)) * 1024 if "Cached" in kb else None,
        swap_total=swap_total * 1024,
        swap_used=(swap_total - swap_free) * 1024,
    )


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    """``/proc/diskstats`` by device, as psutil's ``disk_io_counters(perdisk=True)``
    (every layout psutil knows; a line of another is skipped, where psutil raises)."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        n = len(f)
        if n == 14 or n >= 18:
            name, reads, rsect, writes, wsect, busy = f[2], f[3], f[5], f[7], f[9], f[12]
        elif n == 15:
            name, reads, rsect, writes, wsect, busy = f[3], f[2], f[5], f[7], f[9], f[12]
        elif n == 7:  # a partition on kernels 2.6.x
            name, reads, rsect, writes, wsect, busy = f[2], f[3], f[4], f[5], f[6], "0"
        else:
            continue
        try:
            out[name] = DiskCounters(
                int(reads), int(writes), int(rsect) * SECTOR, int(wsect) * SECTOR, int(busy)
            )
        except ValueError:
            continue  # one odd line costs that device, not the panel
    return out


def parse_net_dev(text: str) -> dict[str, NetCounters]:
    """``/proc/net/dev`` by interface, as psutil's ``net_io_counters(pernic=True)``."""
    out = {}
    for line in text.splitlines()[2:]:
        colon = line.rfind(":")
        if colon <= 0:
            continue
        fields = line[colon + 1 :].split()
        if len(fields) < 9 or not (fields[0].isdigit() and fields[8].isdigit()):
            continue
        out[line[:colon].strip()] = NetCounters(int(fields[0]), int(fields[8]))
    return out
