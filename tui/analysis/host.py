"""Figures over the recent node samples: CPU cores, loader processes, disk, swap, network.

Every figure is a median over the samples of the last SYSTEM_WINDOW_S (one odd sample
must not decide a verdict) and None when no sample reported it -- never a made-up zero.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gputop_dl.probe.samples import CpuCore, DiskSample, ProcessSample, SystemSample
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
    n_cores: int | None  # cores this process may use: its affinity on the node's cores
    node_cores: int | None  # all cores of the node
    usable_cores: float | None  # n_cores, capped by the CPU quota
    free_cores: float | None  # idle + iowait core-equivalents among n_cores (quota-capped)
    idlest_core: tuple[int, float] | None  # (index, idle %) of the most idle usable core
    pinned_cores: float | None  # usable cores at >= CORE_PINNED_PCT busy
    iowait_cores: float | None
    main_cpu_pct: float | None  # the busiest "main" training process, percent of a core
    worker_count: int | None  # worker processes seen (None: no process figures)
    saturated_workers: int | None  # of those, at >= PROCESS_SATURATED_PCT
    worker_cpu_pct: float | None  # mean over workers, percent of one core
    worker_cpu_cores: float | None  # all workers together, in cores
    training_cpu_cores: float | None  # all training processes together
    others: tuple[tuple[str, float], ...] | None  # other processes' ("name (pid N)", CPU %),
    #   busiest first; None: the sample lists only the training's own processes
    data_disk: str | None
    data_disk_guessed: bool  # data device unknown: the busiest disk stands in
    disk_read_bps: float | None
    disk_write_bps: float | None
    disk_busy_pct: float | None
    # What the run's loading processes (its main process and DataLoader workers) read from
    # storage, bytes/s; None: no sample reported reads per process (an older probe, not
    # Linux, another user's). Beside disk_read_bps it tells whose the node's reads are.
    loader_read_bps: float | None
    swap_in_bps: float | None
    io_some_pct: float | None
    memory_some_pct: float | None
    throttled_pct: float | None  # cgroup periods throttled
    quota_cores: float | None
    data_fs_type: str | None
    net_rx_bps: float | None  # all interfaces but loopback
    # The idle core-equivalents of each host sample (quota-capped), oldest first: how
    # many of them show the CPU full, not only their median (a foreign burst of a few
    # seconds -- a process importing torch -- fills the cores in a few samples only).
    free_cores_seen: tuple[float, ...] = ()


def is_network_fs(fs_type: str | None) -> bool:
    return fs_type is not None and fs_type.lower().startswith(NETWORK_FS_PREFIXES)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _per_sample(
    samples: Sequence[SystemSample], fn: Callable[[SystemSample], float | None]
) -> float | None:
    return _median([fn(s) for s in samples])


@dataclass(frozen=True)
class Scope:
    """What of the node belongs to this run, from the probe's own facts (its hello)."""

    affinity: frozenset[int] = frozenset()  # cores it may run on; empty: unknown (all)
    quota_cores: float | None = None  # its cgroup CPU limit, when the probe reported one
    main_pid: int | None = None  # the training process (the rank) judged
    worker_pids: frozenset[int] | None = None  # its DataLoader workers; None: unknown, then
    #   the sampler's "worker" role stands in


def _cores(s: SystemSample, scope: Scope) -> list[CpuCore]:
    """The node's cores this process may run on (all of them when the affinity is unknown
    or names none of the sampled cores)."""
    if s.cpu is None:
        return []
    mine = [c for c in s.cpu.cores if c.index in scope.affinity]
    return mine or list(s.cpu.cores)


def _free_cores(s: SystemSample, scope: Scope) -> float | None:
    busy = [c.busy_pct for c in _cores(s, scope)]
    if not busy or any(b is None for b in busy):
        return None
    return sum(100.0 - (b or 0.0) for b in busy) / 100.0


def _pinned_cores(s: SystemSample, scope: Scope) -> float | None:
    busy = [c.busy_pct for c in _cores(s, scope)]
    if not busy:
        return None
    return float(sum(1 for b in busy if b is not None and b >= CORE_PINNED_PCT))


def _iowait_cores(s: SystemSample, scope: Scope) -> float | None:
    waits = [c.iowait_pct for c in _cores(s, scope) if c.iowait_pct is not None]
    return sum(waits) / 100.0 if waits else None


def _own(s: SystemSample) -> list[ProcessSample]:
    """The training's processes: main, workers and its "other" descendants (compilers,
    tokenizer pools, loggers)."""
    return list(s.processes.processes) if s.processes is not None else []


def _mains(s: SystemSample, scope: Scope) -> list[ProcessSample]:
    mains = [p for p in _own(s) if p.role == "main"]
    mine = [p for p in mains if p.pid == scope.main_pid]
    return mine or mains


def _workers(s: SystemSample, scope: Scope) -> list[ProcessSample]:
    """The DataLoader workers: the loader's own pids when the probe reported them (compiler
    or logger children are not workers), else the sampler's "worker" role. Also where
    none of the reported pids is in the sample: workers started again each epoch have
    new pids, which the sampler marks as it samples while the hello still lists the pass
    before's (a sample of them read "0 workers": the cause flipped to unknown at every
    epoch's turn)."""
    if scope.worker_pids is None:
        return [p for p in _own(s) if p.role == "worker"]
    mine = [p for p in _own(s) if p.pid in scope.worker_pids]
    if mine or not scope.worker_pids:  # (none reported: num_workers=0)
        return mine
    return [p for p in _own(s) if p.role == "worker"]


def _main_cpu(s: SystemSample, scope: Scope) -> float | None:
    known = [p.cpu_pct for p in _mains(s, scope) if p.cpu_pct is not None]
    return max(known) if known else None


def _worker_cpu(s: SystemSample, scope: Scope) -> float | None:
    known = [p.cpu_pct for p in _workers(s, scope) if p.cpu_pct is not None]
    return sum(known) / len(known) if known else None


def _worker_cores(s: SystemSample, scope: Scope) -> float | None:
    """All workers' CPU, in cores; None where no worker has a figure: between two passes'
    workers, or their first sample (a pid's CPU is known from its second), which is no
    "0 cores"."""
    known = [p.cpu_pct for p in _workers(s, scope) if p.cpu_pct is not None]
    return sum(known) / 100.0 if known else None


def _loader_reads(s: SystemSample, scope: Scope) -> float | None:
    """Bytes/s the loading processes read from storage: the main process and the workers
    (the loader's pids, and what the sampler marks "worker": a worker's own children, a
    decoder it runs); None when any of them has no figure (a pid's first sample: workers
    started again each epoch), where a sum of the others would read as "reads nothing"."""
    seen = {p.pid for p in _mains(s, scope)} | {p.pid for p in _workers(s, scope)}
    rates = [p.read_bps for p in _own(s) if p.pid in seen or p.role == "worker"]
    if not rates or any(rate is None for rate in rates):
        return None
    return sum(rate for rate in rates if rate is not None)


def _training_cores(s: SystemSample) -> tuple[float | None, bool]:
    """The training processes' CPU in cores, and whether every one of them had a figure
    (workers just started again have none yet: the sum is then a lower bound)."""
    own = _own(s)
    known = [p.cpu_pct for p in own if p.cpu_pct is not None]
    return (sum(known) / 100.0 if known else None), len(known) == len(own)


def _saturated(s: SystemSample, scope: Scope) -> float | None:
    """The share of the workers with a CPU figure that are saturated; None where none has
    one (no workers, or only just started: they must not read as "none saturated")."""
    known = [w.cpu_pct for w in _workers(s, scope) if w.cpu_pct is not None]
    if not known:
        return None
    return sum(1 for cpu in known if cpu >= PROCESS_SATURATED_PCT) / len(known)


def _others(samples: Sequence[SystemSample]) -> tuple[tuple[str, float], ...] | None:
    """The node's top CPU consumers that are not the training's, busiest first, from the
    newest sample with a process list (``SystemSample.top``); None: no sample has one."""
    for s in reversed(samples):
        # ``top`` is newer than some samplers: a sample without it has no process list.
        top = s.top
        if top is None:
            continue
        own = {p.pid for p in _own(s)}
        # A child of the training's is its own: the table may be older than the sample
        # (its walk is spaced by its cost) and list the workers of the pass before, gone
        # from the sample's processes since -- they read as "other consumers".
        others = [
            (f"{p.name} (pid {p.pid})", p.cpu_pct)
            for p in top
            if p.pid not in own and p.ppid not in own
        ]
        known = [(name, cpu) for name, cpu in others if cpu is not None]
        return tuple(sorted(known, key=lambda o: -o[1]))
    return None


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


def _usable(n_cores: int | None, quota: float | None) -> float | None:
    """The cores this process may use: its affinity, capped by its quota."""
    if n_cores is None:
        return quota
    return float(n_cores) if quota is None else min(float(n_cores), quota)


@dataclass(frozen=True)
class SampleFigures:
    """What one node sample says for one run's scope: computed once per sample, not at
    every analysis (a sample stays in the window for SYSTEM_WINDOW_S, a 64-core sample
    costs hundreds of property reads)."""

    node_cores: int | None  # None: the sample has no cores
    usable_cores: int | None
    free_cores: float | None
    idle: tuple[tuple[int, float], ...]  # (core, idle %) of each usable core with a figure
    pinned_cores: float | None
    iowait_cores: float | None
    training_cores: float | None
    training_complete: bool  # every training process had a CPU figure (else a lower bound)
    worker_count: int | None  # None: no process figures
    saturated_share: float | None  # of the workers with a CPU figure; None: none has one
    main_cpu_pct: float | None
    worker_cpu_pct: float | None
    worker_cpu_cores: float | None
    loader_read_bps: float | None
    net_rx_bps: float | None


def sample_figures(s: SystemSample, scope: Scope) -> SampleFigures:
    cores = _cores(s, scope)
    has_cores = s.cpu is not None and bool(s.cpu.cores)
    training, complete = _training_cores(s)
    return SampleFigures(
        node_cores=len(s.cpu.cores) if s.cpu is not None and has_cores else None,
        usable_cores=len(cores) if has_cores else None,
        free_cores=_free_cores(s, scope),
        idle=tuple((c.index, 100.0 - c.busy_pct) for c in cores if c.busy_pct is not None),
        pinned_cores=_pinned_cores(s, scope),
        iowait_cores=_iowait_cores(s, scope),
        training_cores=training,
        training_complete=complete,
        worker_count=len(_workers(s, scope)) if s.processes is not None else None,
        saturated_share=_saturated(s, scope),
        main_cpu_pct=_main_cpu(s, scope),
        worker_cpu_pct=_worker_cpu(s, scope),
        worker_cpu_cores=_worker_cores(s, scope),
        loader_read_bps=_loader_reads(s, scope),
        net_rx_bps=_net_rx(s),
    )


# Figures by sample identity and scope. Samples are immutable; each entry holds its
# sample, so the id cannot be reused while the entry lives. Bounded: emptied when full
# (64 ranks x 6 samples in their windows fit; a flush costs one recomputation each).
MAX_MEMO = 2048
_memo: dict[tuple[int, Scope], tuple[SystemSample, SampleFigures]] = {}


def figures_of(s: SystemSample, scope: Scope) -> SampleFigures:
    """:func:`sample_figures`, computed once per sample and scope."""
    key = (id(s), scope)
    hit = _memo.get(key)
    if hit is not None and hit[0] is s:
        return hit[1]
    figures = sample_figures(s, scope)
    if len(_memo) >= MAX_MEMO:
        _memo.clear()
    _memo[key] = (s, figures)
    return figures


def _idlest_of(figures: Sequence[SampleFigures]) -> tuple[int, float] | None:
    """The usable core with the most idle time (median over the samples)."""
    idle: dict[int, list[float]] = {}
    for f in figures:
        for index, value in f.idle:
            idle.setdefault(index, []).append(value)
    best: tuple[float, int] | None = None  # max() by (median, -index), inlined
    for index, values in idle.items():
        key = (_median_of(values), -index)
        if best is None or key > best:
            best = key
    return None if best is None else (-best[1], best[0])


def _median_of(values: list[float]) -> float:
    """statistics.median of a non-empty list, computed the same way without its checks
    (64 cores' medians every analysis)."""
    data = sorted(values)
    n = len(data)
    if n % 2:
        return data[n // 2]
    return (data[n // 2 - 1] + data[n // 2]) / 2


def select_samples(
    systems: Sequence[SystemSample], host: str | None, now: float, run_from: float | None = None
) -> tuple[str | None, list[SystemSample], float | None]:
    """This run's host: its samples of the last SYSTEM_WINDOW_S, and the newest one's age.

    With ``run_from`` (the run's first step), a sample whose interval began before it is
    left out of the figures: it saw the start-up (building the dataset, the model), not
    the loop — a disk-bound run's start-up is CPU-bound. It still counts for the age (the
    sampler runs)."""
    if not systems:
        return host, [], None
    mine = [s for s in systems if s.host == host] if host else []
    if not mine:
        # Hello unknown or named differently: follow the newest sample's host.
        host = systems[-1].host
        mine = [s for s in systems if s.host == host]
    newest = max(s.time for s in mine)
    since = now - SYSTEM_WINDOW_S
    if run_from is None:
        return host, [s for s in mine if s.time >= since], now - newest
    kept = [s for s in mine if s.time >= since and s.time - (s.interval_s or 0.0) >= run_from]
    return host, kept, now - newest


def host_stats(
    systems: Sequence[SystemSample],
    host: str | None,
    now: float,
    scope: Scope | None = None,
    run_from: float | None = None,
) -> HostStats:
    scope = scope or Scope()
    host, samples, age = select_samples(systems, host, now, run_from)
    sampled = [s for s in samples if s.host_sampled]
    every = [figures_of(s, scope) for s in samples]  # any sample of the host
    node = [f for s, f in zip(samples, every, strict=True) if s.host_sampled]  # host-wide
    disk, guessed = _data_disks(sampled)
    swaps = [s.memory.swap_in_bps for s in sampled if s.memory]
    node_cores = [f.node_cores for f in node if f.node_cores is not None]
    usable = [f.usable_cores for f in node if f.usable_cores is not None]
    # The probe's own quota first (its cgroup); else the newest the sampler saw.
    quota = scope.quota_cores
    if quota is None:
        quota = next((s.cgroup.cpu_quota_cores for s in reversed(sampled) if s.cgroup), None)
    workers = _worker_count_of(every)
    training = _training_of(every, workers)
    saturated = _median([f.saturated_share for f in every])
    n_cores = max(usable) if usable else None
    free = [_cap_by_quota(f.free_cores, quota, training) for f in node]
    return HostStats(
        host=host,
        n_samples=len(samples),
        n_host_samples=len(sampled),
        latest_age_s=age,
        n_cores=n_cores,
        node_cores=max(node_cores) if node_cores else None,
        usable_cores=_usable(n_cores, quota),
        free_cores=_cap_by_quota(_median([f.free_cores for f in node]), quota, training),
        idlest_core=_idlest_of(node),
        pinned_cores=_median([f.pinned_cores for f in node]),
        iowait_cores=_median([f.iowait_cores for f in node]),
        main_cpu_pct=_median([f.main_cpu_pct for f in every]),
        worker_count=workers,
        saturated_workers=round(saturated * workers)
        if saturated is not None and workers is not None
        else None,
        worker_cpu_pct=_median([f.worker_cpu_pct for f in every]),
        worker_cpu_cores=_median([f.worker_cpu_cores for f in every]),
        training_cpu_cores=training,
        others=_others(samples),
        data_disk=disk,
        data_disk_guessed=guessed,
        disk_read_bps=_per_sample(sampled, lambda s: _read_bps(s, disk)),
        disk_write_bps=_per_sample(sampled, lambda s: _write_bps(s, disk)),
        disk_busy_pct=_per_sample(sampled, lambda s: _busy_pct(s, disk)),
        loader_read_bps=_median([f.loader_read_bps for f in every]),
        swap_in_bps=_median(swaps),
        io_some_pct=_per_sample(sampled, lambda s: s.pressure.io_some if s.pressure else None),
        memory_some_pct=_per_sample(
            sampled, lambda s: s.pressure.memory_some if s.pressure else None
        ),
        throttled_pct=_per_sample(sampled, lambda s: s.cgroup.throttled_pct if s.cgroup else None),
        quota_cores=quota,
        data_fs_type=next((s.data_fs_type for s in reversed(samples) if s.data_fs_type), None),
        net_rx_bps=_median([f.net_rx_bps for f in node]),
        free_cores_seen=tuple(f for f in free if f is not None),
    )


def _training_of(figures: Sequence[SampleFigures], workers: int | None) -> float | None:
    """The training processes' CPU in cores: the median of the samples that list all of
    them (the loader's ``workers``) each with a figure. One between two passes' workers
    (gone, or just started: no figure yet) counts the main process alone, and "others
    take the rest" of the cores blamed a job sharing the node for the training's own
    workers; only where no sample is whole, their lower bounds."""
    whole = [
        f.training_cores
        for f in figures
        if f.training_complete and (f.worker_count or 0) >= (workers or 0)
    ]
    if all(v is None for v in whole):
        whole = [f.training_cores for f in figures]
    return _median(whole)


def _worker_count_of(figures: Sequence[SampleFigures]) -> int | None:
    """The worker processes of the newest sample that lists any: at a pass's end the
    workers not kept exit and the next pass's start again, and a sample in between
    lists none (the loader's count has not changed). 0 where no sample lists one; None
    without process figures."""
    counts = [f.worker_count for f in figures if f.worker_count is not None]
    return next((count for count in reversed(counts) if count), counts[-1] if counts else None)


def _read_bps(s: SystemSample, disk: str | None) -> float | None:
    d = _disk(s, disk)
    return d.read_bps if d else None


def _write_bps(s: SystemSample, disk: str | None) -> float | None:
    d = _disk(s, disk)
    return d.write_bps if d else None


def _busy_pct(s: SystemSample, disk: str | None) -> float | None:
    d = _disk(s, disk)
    return d.busy_pct if d else None
