"""Figures over the recent node samples: CPU cores, loader processes, disk, swap, network.

Every figure is a median over the samples of the last SYSTEM_WINDOW_S (one odd sample
must not decide a verdict) and None when no sample reported it -- never a made-up zero.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gputop_dl.probe.samples import DiskSample, SystemSample
from gputop_dl.tui.analysis.thresholds import (
    CORE_PINNED_PCT,
    NETWORK_FS_PREFIXES,
    PROCESS_SATURATED_PCT,
    SYSTEM_WINDOW_S,
)


@dataclass(frozen=True)
class HostStats:
    host: str | None
    n_samples: int  # samples of this host in the window (any rank)
    n_host_samples: int  # of those, samples with host-wide figures (the node's sampler)
    latest_age_s: float | None  # age of the newest sample of this host, window or not
    n_cores: int | None
    free_cores: float | None  # idle + iowait core-equivalents (capped by a CPU quota)
    pinned_cores: float | None  # cores at >= CORE_PINNED_PCT busy
    iowait_cores: float | None
    main_cpu_pct: float | None  # the busiest "main" training process, percent of a core
    worker_count: int | None  # worker processes seen (None: no process figures)
    saturated_workers: int | None
    worker_cpu_pct: float | None  # mean over workers, percent of one core
    training_cpu_cores: float | None  # all training processes together
    data_disk: str | None
    data_disk_guessed: bool  # data device unknown: the busiest disk stands in
    disk_read_bps: float | None
    disk_busy_pct: float | None
    swap_in_bps: float | None
    io_some_pct: float | None
    memory_some_pct: float | None
    throttled_pct: float | None  # cgroup periods throttled
    quota_cores: float | None
    data_fs_type: str | None
    net_rx_bps: float | None  # all interfaces but loopback


def is_network_fs(fs_type: str | None) -> bool:
    return fs_type is not None and fs_type.lower().startswith(NETWORK_FS_PREFIXES)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _per_sample(
    samples: Sequence[SystemSample], fn: Callable[[SystemSample], float | None]
) -> float | None:
    return _median([fn(s) for s in samples])


def _free_cores(s: SystemSample) -> float | None:
    if s.cpu is None or not s.cpu.cores:
        return None
    busy = [c.busy_pct for c in s.cpu.cores]
    if any(b is None for b in busy):
        return None
    return sum(100.0 - (b or 0.0) for b in busy) / 100.0


def _pinned_cores(s: SystemSample) -> float | None:
    if s.cpu is None or not s.cpu.cores:
        return None
    busy = [c.busy_pct for c in s.cpu.cores]
    return float(sum(1 for b in busy if b is not None and b >= CORE_PINNED_PCT))


def _iowait_cores(s: SystemSample) -> float | None:
    if s.cpu is None or not s.cpu.cores:
        return None
    waits = [c.iowait_pct for c in s.cpu.cores if c.iowait_pct is not None]
    return sum(waits) / 100.0 if waits else None


def _process_cpu(s: SystemSample, role: str) -> list[float]:
    if s.processes is None:
        return []
    return [p.cpu_pct for p in s.processes.processes if p.role == role and p.cpu_pct is not None]


def _main_cpu(s: SystemSample) -> float | None:
    mains = _process_cpu(s, "main")
    return max(mains) if mains else None


def _worker_cpu(s: SystemSample) -> float | None:
    workers = _process_cpu(s, "worker")
    return sum(workers) / len(workers) if workers else None


def _training_cores(s: SystemSample) -> float | None:
    if s.processes is None:
        return None
    known = [p.cpu_pct for p in s.processes.processes if p.cpu_pct is not None]
    return sum(known) / 100.0 if known else None


def _saturated(s: SystemSample) -> float | None:
    if s.processes is None:
        return None
    if s.processes.worker_count == 0:
        return 0.0
    # Recount from the CPU figures when present, so the threshold is ours to name.
    workers = _process_cpu(s, "worker")
    if workers:
        return float(sum(1 for w in workers if w >= PROCESS_SATURATED_PCT))
    return float(s.processes.saturated_workers)


def _matches(disk: str, device: str) -> bool:
    """``nvme0n1`` holds ``nvme0n1p2``; ``sda`` holds ``sda1``."""
    return disk == device or device.startswith(disk) or disk.startswith(device)


def _data_disks(samples: Sequence[SystemSample]) -> tuple[str | None, bool]:
    """The disk holding the dataset, or (when unknown) the busiest one, flagged guessed."""
    device = next((s.data_device for s in reversed(samples) if s.data_device), None)
    if device is not None:
        names = [d.device for s in samples for d in s.disks if _matches(d.device, device)]
        if names:
            # The whole-disk entry when both disk and partition are listed.
            return min(names, key=len), False
        return device, False
    busiest: tuple[float, str] | None = None
    for s in samples:
        for d in s.disks:
            if d.busy_pct is not None and (busiest is None or d.busy_pct > busiest[0]):
                busiest = (d.busy_pct, d.device)
    return (busiest[1], True) if busiest else (None, True)


def _disk(s: SystemSample, name: str | None) -> DiskSample | None:
    if name is None:
        return None
    return next((d for d in s.disks if d.device == name), None)


def _net_rx(s: SystemSample) -> float | None:
    rx = [n.rx_bps for n in s.nets if n.interface != "lo" and n.rx_bps is not None]
    return sum(rx) if rx else None


def _cap_by_quota(free: float | None, quota: float | None, used: float | None) -> float | None:
    """In a container the host's idle cores are not ours: the quota bounds what is free."""
    if free is None or quota is None:
        return free
    left = max(0.0, quota - (used or 0.0))
    return min(free, left)


def select_samples(
    systems: Sequence[SystemSample], host: str | None, now: float
) -> tuple[str | None, list[SystemSample], float | None]:
    """This run's host: its samples of the last SYSTEM_WINDOW_S, and the newest one's age."""
    if not systems:
        return host, [], None
    mine = [s for s in systems if s.host == host] if host else []
    if not mine:
        # Hello unknown or named differently: follow the newest sample's host.
        host = systems[-1].host
        mine = [s for s in systems if s.host == host]
    newest = max(s.time for s in mine)
    return host, [s for s in mine if s.time >= now - SYSTEM_WINDOW_S], now - newest


def host_stats(systems: Sequence[SystemSample], host: str | None, now: float) -> HostStats:
    host, samples, age = select_samples(systems, host, now)
    sampled = [s for s in samples if s.host_sampled]
    disk, guessed = _data_disks(sampled)
    swaps = [s.memory.swap_in_bps for s in sampled if s.memory]
    cores = [len(s.cpu.cores) for s in sampled if s.cpu and s.cpu.cores]
    quota = next(
        (s.cgroup.cpu_quota_cores for s in reversed(sampled) if s.cgroup), None
    )  # newest quota: limits change rarely and the newest is the one in force
    training = _per_sample(samples, _training_cores)
    workers = [s.processes.worker_count for s in samples if s.processes is not None]
    saturated = _per_sample(samples, _saturated)
    return HostStats(
        host=host,
        n_samples=len(samples),
        n_host_samples=len(sampled),
        latest_age_s=age,
        n_cores=max(cores) if cores else None,
        free_cores=_cap_by_quota(_per_sample(sampled, _free_cores), quota, training),
        pinned_cores=_per_sample(sampled, _pinned_cores),
        iowait_cores=_per_sample(sampled, _iowait_cores),
        main_cpu_pct=_per_sample(samples, _main_cpu),
        worker_count=workers[-1] if workers else None,
        saturated_workers=round(saturated) if saturated is not None else None,
        worker_cpu_pct=_per_sample(samples, _worker_cpu),
        training_cpu_cores=training,
        data_disk=disk,
        data_disk_guessed=guessed,
        disk_read_bps=_per_sample(sampled, lambda s: _read_bps(s, disk)),
        disk_busy_pct=_per_sample(sampled, lambda s: _busy_pct(s, disk)),
        swap_in_bps=_median(swaps),
        io_some_pct=_per_sample(sampled, lambda s: s.pressure.io_some if s.pressure else None),
        memory_some_pct=_per_sample(
            sampled, lambda s: s.pressure.memory_some if s.pressure else None
        ),
        throttled_pct=_per_sample(sampled, lambda s: s.cgroup.throttled_pct if s.cgroup else None),
        quota_cores=quota,
        data_fs_type=next((s.data_fs_type for s in reversed(samples) if s.data_fs_type), None),
        net_rx_bps=_per_sample(sampled, _net_rx),
    )


def _read_bps(s: SystemSample, disk: str | None) -> float | None:
    d = _disk(s, disk)
    return d.read_bps if d else None


def _busy_pct(s: SystemSample, disk: str | None) -> float | None:
    d = _disk(s, disk)
    return d.busy_pct if d else None
