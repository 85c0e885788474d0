"""Frozen sample records: what collectors measure and what travels on the wire.

Every field that a source did not report is ``None`` -- never a made-up zero.
Units are part of the field name or documented here and in ``docs/protocol.md``:
bytes, bytes per second, percent (0-100), watts, degrees Celsius, MHz, seconds.
Samples carry plain values only (no handles, no psutil/NVML objects), so they can be
encoded, compared in tests and handed between threads freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceStatus:
    """Health of one data source ("psutil", "nvml", "hl-smi", "pressure", "cgroup").

    ``ok`` is False when the source gave nothing; ``message`` says why in words a user
    can act on ("NVML library not found", "hl-smi timed out after 2 s").
    """

    source: str
    ok: bool
    message: str = ""


@dataclass(frozen=True)
class CpuCore:
    """One logical core over the last sampling interval, percent of that core's time."""

    index: int
    user_pct: float | None  # user + nice
    system_pct: float | None  # system + irq + softirq
    iowait_pct: float | None
    steal_pct: float | None
    idle_pct: float | None

    @property
    def busy_pct(self) -> float | None:
        """Everything that is neither idle nor iowait."""
        if self.idle_pct is None:
            return None
        return max(0.0, 100.0 - self.idle_pct - (self.iowait_pct or 0.0))


@dataclass(frozen=True)
class CpuSample:
    cores: tuple[CpuCore, ...]
    load_avg: tuple[float, float, float] | None  # 1, 5, 15 min


@dataclass(frozen=True)
class MemorySample:
    total_bytes: int | None
    used_bytes: int | None
    available_bytes: int | None
    cached_bytes: int | None
    swap_total_bytes: int | None
    swap_used_bytes: int | None
    swap_in_bps: float | None  # bytes/s swapped in over the interval
    swap_out_bps: float | None


@dataclass(frozen=True)
class DiskSample:
    device: str  # kernel name, e.g. "nvme0n1", "sda"
    read_bps: float | None
    write_bps: float | None
    read_iops: float | None
    write_iops: float | None
    busy_pct: float | None  # share of the interval with I/O in flight


@dataclass(frozen=True)
class NetSample:
    interface: str
    rx_bps: float | None
    tx_bps: float | None


@dataclass(frozen=True)
class PressureSample:
    """Linux PSI ``avg10`` values in percent; None where the kernel lacks PSI."""

    cpu_some: float | None
    io_some: float | None
    io_full: float | None
    memory_some: float | None
    memory_full: float | None


@dataclass(frozen=True)
class CgroupSample:
    """Container limits (cgroup v2 or v1); None where no limit is set."""

    cpu_quota_cores: float | None  # quota / period, e.g. 2.0 = two cores
    nr_periods: int | None  # cumulative counters from cpu.stat
    nr_throttled: int | None
    throttled_usec: int | None
    throttled_pct: float | None  # share of periods throttled over the last interval
    memory_limit_bytes: int | None
    memory_used_bytes: int | None


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    role: str  # "main" (the training process) or "worker" (a child, e.g. DataLoader worker)
    name: str
    cpu_pct: float | None  # percent of one core; 100 = one core saturated
    rss_bytes: int | None


@dataclass(frozen=True)
class TrainingProcesses:
    processes: tuple[ProcessSample, ...]
    saturated_workers: int  # workers at >= 90 % of one core
    worker_count: int


@dataclass(frozen=True)
class GpuSample:
    """One NVIDIA GPU as NVML reports it. ``state`` is "ok" or "lost"."""

    index: int
    name: str | None
    uuid: str | None
    state: str = "ok"
    error: str | None = None
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pcie_rx_bps: float | None = None  # NVML reports KB/s; converted to bytes/s
    pcie_tx_bps: float | None = None
    throttle_reasons: tuple[str, ...] | None = None  # e.g. ("sw_power_cap", "hw_thermal")
    training_mem_bytes: int | None = None  # memory held by the watched training processes


@dataclass(frozen=True)
class HpuSample:
    """One Intel Gaudi HPU as ``hl-smi`` reports it. ``state`` is "ok" or "lost"."""

    index: int
    name: str | None
    uuid: str | None
    state: str = "ok"
    error: str | None = None
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_max_w: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class TopProcess:
    """One of the node's top CPU consumers over the last interval (any user's process)."""

    pid: int
    ppid: int | None
    name: str
    cpu_pct: float | None  # percent of one core over the interval; 100 = one core saturated
    rss_bytes: int | None


@dataclass(frozen=True)
class SystemSample:
    """Everything one node sampler saw at one instant (``time`` is Unix seconds).

    ``host_sampled`` is False for a rank that is not its node's host sampler: then the
    host-wide fields are None and only its own processes and devices are reported.
    """

    time: float
    host: str
    interval_s: float | None
    host_sampled: bool = True
    cpu: CpuSample | None = None
    memory: MemorySample | None = None
    disks: tuple[DiskSample, ...] = ()
    nets: tuple[NetSample, ...] = ()
    pressure: PressureSample | None = None
    cgroup: CgroupSample | None = None
    processes: TrainingProcesses | None = None
    gpus: tuple[GpuSample, ...] = ()
    hpus: tuple[HpuSample, ...] = ()
    statuses: tuple[SourceStatus, ...] = field(default_factory=tuple)
    data_device: str | None = None  # block device holding the dataset path, if known
    data_fs_type: str | None = None  # filesystem type of the dataset path ("nfs4", "ext4")
    top: tuple[TopProcess, ...] | None = None  # the busiest processes; None: not sampled
