"""Frozen sample records: what collectors measure and what travels on the wire.

Every field that a source did not report is ``None`` -- never a made-up zero.
Units are part of the field name or documented here and in ``docs/protocol.md``:
bytes, bytes per second, percent (0-100), watts, degrees Celsius, MHz, seconds.
Samples carry plain values only (no handles, no psutil/NVML objects), so they can be
encoded, compared in tests and handed between threads freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta

# Bounds a reader enforces while decoding (``docs/protocol.md``, "Limits"): a value
# outside them makes the whole message invalid, so no NaN, infinity or year-3000 time
# ever reaches the viewer's arithmetic. Collectors never produce values outside them.
MAX_STR = 4096
MAX_ITEMS = 100_000
Str = Annotated[str, Meta(max_length=MAX_STR)]
Time = Annotated[float, Meta(ge=0.0, le=1e10)]  # Unix seconds, up to the year 2286
Seconds = Annotated[float, Meta(ge=0.0, le=1e7)]  # a duration, up to ~115 days
Num = Annotated[float, Meta(ge=-1e18, le=1e18)]  # any other reading: finite
MAX_COUNT = 2**63 - 1
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
T = TypeVar("T")
Seq = Annotated[tuple[T, ...], Meta(max_length=MAX_ITEMS)]


@dataclass(frozen=True)
class SourceStatus:
    """Health of one data source ("psutil", "nvml", "hl-smi", "pressure", "cgroup").

    ``ok`` is False when the source gave nothing; ``message`` says why in words a user
    can act on ("NVML library not found", "hl-smi timed out after 2 s"); ``state`` what
    that means, as the collector knows it (a viewer does not read it from the words):
    ABSENT, STARTING or FAILING; "" when ``ok`` says all.
    """

    source: Str
    ok: bool
    message: Str = ""
    state: Str = ""


# SourceStatus.state (an accelerator source's): the node has none of its devices, or
# nothing to read them with (no library, driver or tool): not a fault to warn about ...
ABSENT = "absent"
STARTING = "starting"  # ... not read yet ...
FAILING = "failing"  # ... or it could not read devices that may be there (a hung driver)


class CpuCore(msgspec.Struct, frozen=True, gc=False):
    """One logical core over the last sampling interval, percent of that core's time.

    A msgspec Struct, not a dataclass like the other samples: a node sample carries one
    per core (64 and more), and a viewer decodes a Struct ~3x faster. On the wire it is
    the same map of the same fields. Not tracked by the garbage collector: numbers only.
    """

    index: Count
    user_pct: Num | None  # user + nice
    system_pct: Num | None  # system + irq + softirq
    iowait_pct: Num | None
    steal_pct: Num | None
    idle_pct: Num | None

    @property
    def busy_pct(self) -> float | None:
        """Everything that is neither idle nor iowait."""
        if self.idle_pct is None:
            return None
        return max(0.0, 100.0 - self.idle_pct - (self.iowait_pct or 0.0))


@dataclass(frozen=True)
class CpuSample:
    cores: Seq[CpuCore]
    load_avg: tuple[Num, Num, Num] | None  # 1, 5, 15 min


@dataclass(frozen=True)
class MemorySample:
    total_bytes: Count | None
    used_bytes: Count | None
    available_bytes: Count | None
    cached_bytes: Count | None
    swap_total_bytes: Count | None
    swap_used_bytes: Count | None
    swap_in_bps: Num | None  # bytes/s swapped in over the interval
    swap_out_bps: Num | None


@dataclass(frozen=True)
class DiskSample:
    device: Str  # kernel name, e.g. "nvme0n1", "sda"
    read_bps: Num | None
    write_bps: Num | None
    read_iops: Num | None
    write_iops: Num | None
    busy_pct: Num | None  # share of the interval with I/O in flight


@dataclass(frozen=True)
class NetSample:
    interface: Str
    rx_bps: Num | None
    tx_bps: Num | None


@dataclass(frozen=True)
class PressureSample:
    """Linux PSI ``avg10`` values in percent; None where the kernel lacks PSI."""

    cpu_some: Num | None
    io_some: Num | None
    io_full: Num | None
    memory_some: Num | None
    memory_full: Num | None


@dataclass(frozen=True)
class CgroupSample:
    """Container limits (cgroup v2 or v1); None where no limit is set."""

    cpu_quota_cores: Num | None  # quota / period, e.g. 2.0 = two cores
    nr_periods: Count | None  # cumulative counters from cpu.stat
    nr_throttled: Count | None
    throttled_usec: Count | None
    throttled_pct: Num | None  # share of periods throttled over the last interval
    memory_limit_bytes: Count | None
    memory_used_bytes: Count | None


@dataclass(frozen=True)
class ProcessSample:
    pid: Count
    role: Str  # "main" (the training process) or "worker" (a child, e.g. DataLoader worker)
    name: Str
    cpu_pct: Num | None  # percent of one core; 100 = one core saturated
    rss_bytes: Count | None
    # Bytes/s the process read from storage since its previous sample (``read_bytes`` of
    # /proc/<pid>/io: what reached the disk, not page-cache hits); None: unreadable, not
    # Linux, or the first sample of that pid. What tells the training's reads from another
    # process's on a node both read.
    read_bps: Num | None = None


@dataclass(frozen=True)
class TrainingProcesses:
    processes: Seq[ProcessSample]
    saturated_workers: Count  # workers at >= 90 % of one core
    worker_count: Count


@dataclass(frozen=True)
class GpuSample:
    """One NVIDIA GPU as NVML reports it. ``state`` is "ok" or "lost"."""

    index: Count
    name: Str | None
    uuid: Str | None
    state: Str = "ok"
    error: Str | None = None
    util_pct: Num | None = None
    mem_util_pct: Num | None = None
    mem_used_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    power_w: Num | None = None
    power_limit_w: Num | None = None
    temperature_c: Num | None = None
    sm_clock_mhz: Num | None = None
    mem_clock_mhz: Num | None = None
    pcie_rx_bps: Num | None = None  # NVML reports KB/s; converted to bytes/s
    pcie_tx_bps: Num | None = None
    throttle_reasons: Seq[Str] | None = None  # e.g. ("sw_power_cap", "hw_thermal")
    training_mem_bytes: Count | None = None  # memory held by the watched training processes


@dataclass(frozen=True)
class HpuSample:
    """One Intel Gaudi HPU as ``hl-smi`` reports it. ``state`` is "ok", "lost", or "stale"
    when hl-smi stopped updating: the figures are its last ones, seconds old."""

    index: Count
    name: Str | None
    uuid: Str | None
    state: Str = "ok"
    error: Str | None = None
    util_pct: Num | None = None
    mem_used_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    power_w: Num | None = None
    power_max_w: Num | None = None
    temperature_c: Num | None = None


# A node sampler reads the process table (``SystemSample.top``) every TOP_EVERY samples
# at least, more seldom where walking /proc is dear: its CPU figures cover that span.
TOP_EVERY = 5


@dataclass(frozen=True)
class TopProcess:
    """One of the node's top CPU consumers over the last interval (any user's process)."""

    pid: Count
    ppid: Count | None
    name: Str
    cpu_pct: Num | None  # percent of one core over the interval; 100 = one core saturated
    rss_bytes: Count | None


@dataclass(frozen=True)
class SystemSample:
    """Everything one node sampler saw at one instant (``time`` is Unix seconds).

    ``host_sampled`` is False for a rank that is not its node's host sampler: then the
    host-wide fields are None and only its own processes and devices are reported.
    """

    time: Time
    host: Str
    interval_s: Seconds | None
    host_sampled: bool = True
    cpu: CpuSample | None = None
    memory: MemorySample | None = None
    disks: Seq[DiskSample] = ()
    nets: Seq[NetSample] = ()
    pressure: PressureSample | None = None
    cgroup: CgroupSample | None = None
    processes: TrainingProcesses | None = None
    gpus: Seq[GpuSample] = ()
    hpus: Seq[HpuSample] = ()
    statuses: Seq[SourceStatus] = ()
    data_device: Str | None = None  # block device holding the dataset path, if known
    data_fs_type: Str | None = None  # filesystem type of the dataset path ("nfs4", "ext4")
    top: Seq[TopProcess] | None = None  # the busiest processes; None: not sampled
    # When ``top`` was read (Unix seconds): a walk of /proc is spaced by its cost, so on a
    # node of many processes the table repeated in later samples is older than they are.
    top_time: Time | None = None
