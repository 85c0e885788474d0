"""Why the training loop waits for data: the best-supported cause, or "unknown" said plainly.

The rules are tried in order; the first one whose evidence holds wins:

1. memory        sustained swap-in (everything else is slowed by it)
2. worker-restarts / pass-start
                 the starts of passes cost most of the wait (the probe's pass starts;
                 tui/analysis/passes.py): workers started again each epoch, a costly iter()
3. cpu-quota     the container's CPU quota throttles the loader
4. disk          the data disk is busy (>= DISK_BUSY_ENTER)
5. network-storage  the dataset is on a network filesystem and the loader is not CPU-bound
6. disk          the loading processes are mostly off-CPU while the node reads
7. few-workers / cpu-workers / cpu-contention
                 num_workers == 0, the loader's processes are CPU-bound, its workers wait
                 (mostly off-CPU, no reads of theirs) with cores idle, or the CPU is full
8. disk          weaker: I/O pressure or iowait while the loader is not CPU-bound
9. unknown       with a sentence saying what was measured or what is missing

The disk rules (4, 6, 8) rest on the node's reads. Where the loading processes' own reads
are known (ProcessSample.read_bps) and small beside them, the reads are another
process's: those rules stand aside and the others decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import LoaderInfo
from gputop_dl.tui.analysis import fmt, knobs
from gputop_dl.tui.analysis.host import HostStats, is_network_fs
from gputop_dl.tui.analysis.passes import LoaderStarts, PassStarts
from gputop_dl.tui.analysis.thresholds import (
    CPU_FULL_ENTER_SHARE,
    CPU_QUOTA_ENTER_PCT,
    CPU_QUOTA_EXIT_PCT,
    DISK_BUSY_ENTER,
    DISK_BUSY_EXIT,
    DISK_BUSY_SOME,
    DISK_READ_ACTIVE_BPS,
    FREE_CORES_FOR_WORKERS,
    FULL_LOADER_CPU_ENTER_PCT,
    FULL_LOADER_CPU_EXIT_PCT,
    HOST_CPU_FULL_FREE_CORES,
    HOST_SAMPLES_DUE_S,
    IO_PRESSURE_HIGH_PCT,
    IO_PRESSURE_SOME_PCT,
    IOWAIT_HIGH_CORES,
    IOWAIT_SOME_CORES,
    LOADER_BLOCKED_CPU_PCT,
    LOADER_OWN_READS_LOW_BPS,
    LOADER_OWN_READS_LOW_SHARE,
    MIN_SYSTEMS,
    MIN_WORKER_CORES,
    NET_RX_HIGH_BPS,
    NO_IDLE_CORE,
    OTHER_NAMED_MIN_PCT,
    OTHERS_CPU_SHARE,
    OTHERS_CPU_SHARE_BAND,
    PASS_LOADER_SHARE,
    PASS_START_SHARE,
    PROCESS_SATURATED_PCT,
    SWAP_IN_ENTER_BPS,
    SWAP_IN_EXIT_BPS,
    SYSTEM_WINDOW_S,
    WRITES_OVER_READS,
)

NO_HOST_SAMPLES = (
    "no host samples: run `gputop agent` on this node or let local rank 0 sample the host"
)
# Host samples are on their way (the run's probe samples the node, or the run is young):
# the cause waits for them.
PENDING = "cause pending"
FEW_SAMPLES = "only"  # "only 1 host sample so far, 2 needed for a cause"
# The node's reads are the disk rules' evidence. Where the samples carry no reads per
# process (ProcessSample.read_bps None: an older probe, not Linux), another process's
# reads may stand in for the loader's: said so.
READS_WHOSE = (
    "whose reads these are is unknown: the node samples carry no reads per process, and "
    "another process may be reading (iotop -o or pidstat -d 1 shows whose)"
)
MEASURE_LOADER_ALONE = (
    "measure the loader alone (iterate the DataLoader without the model): its rate is the "
    "upper bound of the training rate"
)


@dataclass(frozen=True)
class Cause:
    name: str  # "few-workers", "cpu-workers", "disk", "memory", "network-storage", ...
    confidence: float  # 0..1, in the cause (the input-bound share is measured, not guessed)
    summary: str  # completes the headline: "Input-bound: <summary>"
    evidence: tuple[str, ...]
    advice: tuple[str, ...]
    # CPU cores the loading uses now and would have with the advice (None: not measured,
    # or the advice buys no CPU, e.g. a faster disk): with the throughput they bound the
    # headroom by the measured CPU cost per sample.
    loader_cores_now: float | None = None
    loader_cores_after: float | None = None
    # Loading that waits rather than computes (a sleep, a remote store): the loaders that
    # would wait side by side with the advice. Each keeps today's pace, so the headroom is
    # that many times it, not a CPU cost.
    waiting_loaders_after: int | None = None
    # The loaders that wait today: 0, the main process, which loads in the data wait only
    # (its pace: throughput / wait share); n workers, which load all the time the loop
    # waits for them (each: throughput / n).
    waiting_loaders_now: int = 0
    # What the advice buys when it is not all of the data wait (the waits at pass starts
    # only): the rate and the rate without those waits, over the steps they were judged on.
    starts: PassStarts | None = None


@dataclass(frozen=True)
class Context:
    host: HostStats
    loader: LoaderInfo | None
    previous_cause: str | None  # cause of the verdict shown now (hysteresis)
    framework: str | None = None  # hello.framework: whose knob the advice names
    wait_share: float | None = None  # the loop's data wait / step time (main loads then)
    samples_expected: bool = False  # the run samples its node (hello.host_sampler)
    passes: PassStarts | None = None  # what the starts of passes cost
    # Seconds since the host figures' stretch began (the run's first step, or its re-entry
    # into the loop, else its process's start); None: unknown.
    run_age_s: float | None = None
    resumed: bool = False  # that stretch began at a re-entry into the loop or after a hang
    # A viewer receives the run now (its probe samples once a second); None: not known.
    watched: bool | None = None

    @property
    def enough_host(self) -> bool:
        return self.host.n_host_samples >= MIN_SYSTEMS

    @property
    def young(self) -> bool:
        """The run (or its stretch of the loop) began too recently for host samples of it."""
        return self.run_age_s is not None and self.run_age_s < HOST_SAMPLES_DUE_S

    @property
    def samples_pending(self) -> bool:
        """Host samples of the loop are on their way: the run's probe samples its node, or
        the run is young (another sampler's may not have come yet)."""
        return self.samples_expected or self.young

    @property
    def configured(self) -> int | None:
        """num_workers as the probe read it from the loader; None: unknown."""
        return self.loader.num_workers if self.loader is not None else None

    @property
    def workers(self) -> int | None:
        return workers_of(self.loader, self.host)

    @property
    def loader_cores(self) -> float | None:
        """CPU cores spent loading now: the workers', or with no workers the main process's
        CPU during the data wait (it loads then), at most: its CPU over the step and the
        wait's share of the step, the smaller (a step off-CPU -- a device sync, a sleep --
        leaves all its CPU to the loading; a step that computes, the wait's share)."""
        h = self.host
        if self.workers == 0:
            if h.main_cpu_pct is None or self.wait_share is None:
                return None
            return min(h.main_cpu_pct / 100.0, self.wait_share)
        return h.worker_cpu_cores

    @property
    def main_wait_cpu_least(self) -> float | None:
        """With num_workers=0, the least CPU the main process spent while the loop waited
        (percent of a core): what is left of its CPU over the step once the rest of the
        step had a core."""
        cpu, share = self.host.main_cpu_pct, self.wait_share
        if cpu is None or share is None or share <= 0:
            return None
        return max(0.0, min(100.0, (cpu - 100.0 * (1.0 - share)) / share))

    @property
    def main_wait_cpu_pct(self) -> float | None:
        """With num_workers=0, the most CPU the main process can have spent while the loop
        waited (percent of a core): all of its CPU over the step, spent in the wait. Its
        CPU over the whole step understates it when the step itself is off-CPU: 29 % of a
        core over a step of which the wait is 30 % may be a core busy loading."""
        cpu, share = self.host.main_cpu_pct, self.wait_share
        if cpu is None:
            return None
        if share is None or share <= 0:
            return cpu
        return min(100.0, cpu / share)

    @property
    def loader_cpu_bound(self) -> bool:
        """The processes that load batches are CPU-saturated."""
        h = self.host
        if self.workers == 0:
            return h.main_cpu_pct is not None and h.main_cpu_pct >= PROCESS_SATURATED_PCT
        count, saturated = h.worker_count, h.saturated_workers
        return bool(count) and saturated is not None and count is not None and saturated >= count

    @property
    def loader_cpu_pct(self) -> float | None:
        """CPU of the process(es) that load batches: main with num_workers=0 (at most, in
        the wait: main_wait_cpu_pct), else the workers' mean."""
        return self.main_wait_cpu_pct if self.workers == 0 else self.host.worker_cpu_pct

    @property
    def disk_waited(self) -> bool:
        """Signs that the loading waits on the disk, not only that the node reads: the
        data disk DISK_BUSY_SOME busy, or iowait, or I/O pressure."""
        h = self.host
        return (
            (h.disk_busy_pct is not None and h.disk_busy_pct >= DISK_BUSY_SOME)
            or (h.io_some_pct is not None and h.io_some_pct >= IO_PRESSURE_SOME_PCT)
            or (h.iowait_cores is not None and h.iowait_cores >= IOWAIT_SOME_CORES)
        )

    @property
    def io_active(self) -> bool:
        """Some sign that the node reads (weaker figures than the disk rule's)."""
        h = self.host
        return (
            (h.io_some_pct is not None and h.io_some_pct >= IO_PRESSURE_SOME_PCT)
            or (h.iowait_cores is not None and h.iowait_cores >= IOWAIT_SOME_CORES)
            or (h.disk_read_bps is not None and h.disk_read_bps >= DISK_READ_ACTIVE_BPS)
        )

    @property
    def reads_elsewhere(self) -> bool:
        """The loading processes' own reads are known and small beside the node's: what
        the node reads is another process's, not what the loader waits on. Not for a
        dataset on a network filesystem: its reads may not be counted per process (a FUSE
        daemon reads for the loader), and the network rule judges it."""
        return own_reads_small(self.host) and not is_network_fs(self.host.data_fs_type)

    @property
    def loader_io_active(self) -> bool:
        """The node reads, and the reads may be the loader's (not known to be others')."""
        return self.io_active and not self.reads_elsewhere


# Causes that say the cores are full: once shown, the median of the samples holds them.
CPU_FULL_CAUSES = frozenset({"cpu-contention", "cpu-workers"})


def cpu_full(ctx: Context, below: float) -> bool:
    """Fewer than ``below`` idle core-equivalents among the cores this run may use
    (cores_full), held by the median alone once a full-CPU cause is shown."""
    return cores_full(ctx.host, below, ctx.previous_cause in CPU_FULL_CAUSES)


def cores_full(h: HostStats, below: float, shown: bool) -> bool:
    """Fewer than ``below`` idle core-equivalents among the cores this run may use: by the
    median of the window's host samples, and (unless ``shown``: a verdict that says the
    cores are full is shown already) in CPU_FULL_ENTER_SHARE of them. A burst of another
    process's (a run starting beside this one) fills the cores in a few samples: it is
    no contention to act on."""
    if h.free_cores is None or h.free_cores >= below:
        return False
    if shown or not h.free_cores_seen:
        return True
    full = sum(1 for free in h.free_cores_seen if free < below)
    return full >= CPU_FULL_ENTER_SHARE * len(h.free_cores_seen)


def own_reads_small(h: HostStats) -> bool:
    """The loading processes read from storage under LOADER_OWN_READS_LOW_BPS and under
    LOADER_OWN_READS_LOW_SHARE of what the node reads (any share when that is unknown);
    False when their reads are not reported."""
    own = h.loader_read_bps
    if own is None or own >= LOADER_OWN_READS_LOW_BPS:
        return False
    return h.disk_read_bps is None or own <= LOADER_OWN_READS_LOW_SHARE * h.disk_read_bps


def reads_line(ctx: Context) -> str | None:
    """Whose the node's reads are, from the loading processes' own reads; None when
    those are not reported."""
    h = ctx.host
    own = h.loader_read_bps
    if own is None:
        return None
    if ctx.reads_elsewhere:
        if h.disk_read_bps is None:
            return f"the training's loading processes read {fmt.bps(own)}: another process's reads"
        return (
            f"the node reads {fmt.bps(h.disk_read_bps)}, the training's loading processes "
            f"{fmt.bps(own)}: another process's reads"
        )
    of = f" of the node's {fmt.bps(h.disk_read_bps)}" if h.disk_read_bps is not None else ""
    return f"the training's loading processes (main and workers) read {fmt.bps(own)}{of}"


def workers_of(loader: LoaderInfo | None, host: HostStats) -> int | None:
    """num_workers as the probe read it from the loader, else the worker processes seen."""
    if loader is not None and loader.num_workers is not None:
        return loader.num_workers
    return host.worker_count


def find_on_cores(h: HostStats) -> str:
    """Advice where the node-wide process table cannot say what runs on the cores this
    run may use (its affinity leaves part of the node out)."""
    return (
        f"find what runs on the {h.n_cores} cores it may use (taskset -cp PID lists a "
        "process's cores): ps -eo pid,psr,pcpu,comm --sort=-pcpu (psr: the core), then "
        "move or renice it"
    )


def suggest_workers(
    current: int,
    free_cores: float | None,
    usable: float | None = None,
    worker_cores: float | None = None,
) -> tuple[int, int]:
    """A num_workers range to try, bounded by the idle cores and by the cores this process
    may use (its affinity and quota).

    ``worker_cores``: what one worker uses, measured, where the workers wait rather than
    compute (a remote store, a sleep: well under a core each). Those bounds are then on
    the workers' CPU, not their count: a worker asleep holds no core, and 1 worker at
    3 % of a core on 2 cores was told "num_workers=2" where 3-5 overlap more waits. None:
    a core each (CPU-bound, or not measured).

    At most +4 from zero (or doubling from more): the loader's need is unknown, and every
    worker costs RAM; the user raises further if the wait persists.
    """
    step_cap = max(4, current)
    cost = 1.0 if worker_cores is None else max(worker_cores, MIN_WORKER_CORES)
    if free_cores is None:
        lo, hi = max(2, current + 1), current + step_cap
    else:
        # Half an idle core is worth a worker; moving the loading off the main process
        # (from 0 workers) frees the main process's own time.
        room = max(1, round(free_cores / cost))
        lo, hi = current + min(2, room), current + min(room, step_cap)
    if usable is not None:
        cap = max(current + 1, int(usable / cost))
        lo, hi = min(lo, cap), min(hi, cap)
    return lo, hi


def cores_text(h: HostStats) -> str:
    """Idle cores among those this process may use, the same figure everywhere."""
    if h.free_cores is None:
        return "idle cores unknown"
    if h.usable_cores is not None:
        text = f"{fmt.cores_of(h.free_cores, h.usable_cores)} idle"
    else:
        text = f"{fmt.cores(h.free_cores)} idle"
    if h.idlest_core is not None and 0 < h.free_cores < 2:  # where the idle time is
        text += f", core {h.idlest_core[0]} {fmt.pct_value(h.idlest_core[1])} idle"
    return text


def _scope_text(h: HostStats) -> str:
    parts = []
    if h.node_cores is not None and h.n_cores is not None and h.node_cores != h.n_cores:
        parts.append(f"affinity {h.n_cores} of the node's {h.node_cores}")
    if h.quota_cores is not None:
        parts.append(f"quota {fmt.cores(h.quota_cores)}")
    return f" ({'; '.join(parts)})" if parts else ""


def cpu_lines(h: HostStats) -> list[str]:
    """The cores this process may use and its main process's CPU, as evidence lines."""
    lines: list[str] = []
    if h.free_cores is not None:
        pinned = f", {h.pinned_cores:.0f} pinned" if h.pinned_cores is not None else ""
        lines.append(f"CPU: {cores_text(h)}{pinned}{_scope_text(h)}")
    if h.main_cpu_pct is not None:
        lines.append(f"main process {fmt.pct_value(h.main_cpu_pct)} CPU (of one core)")
    return lines


def host_evidence(ctx: Context) -> list[str]:
    """The host figures that bear on input-bound causes, as short lines."""
    h = ctx.host
    lines = cpu_lines(h)
    if h.worker_count:
        sat = (
            f", {h.saturated_workers} saturated (≥ 90 % of a core)"
            if h.saturated_workers is not None
            else ""
        )
        mean = f", mean {fmt.pct_value(h.worker_cpu_pct)}" if h.worker_cpu_pct is not None else ""
        noun = "loader worker" if h.worker_count == 1 else "loader workers"
        lines.append(f"{h.worker_count} {noun}{sat}{mean}")
    if h.disk_busy_pct is not None or h.disk_read_bps is not None:
        figures = []
        if h.disk_read_bps is not None:
            figures.append(f"{fmt.bps(h.disk_read_bps)} read")
        if h.disk_busy_pct is not None:
            figures.append(f"{fmt.pct_value(h.disk_busy_pct)} busy")
        which = " (data device unknown: busiest disk)" if h.data_disk_guessed else ""
        lines.append(f"disk {h.data_disk}{which}: {', '.join(figures)}")
    whose = reads_line(ctx)
    if whose is not None and (ctx.io_active or h.disk_read_bps):
        lines.append(whose)
    if h.iowait_cores is not None and h.iowait_cores >= 0.1:
        lines.append(f"iowait {fmt.cores(h.iowait_cores)}")
    if h.io_some_pct is not None and h.io_some_pct >= 1.0:
        lines.append(f"I/O pressure {fmt.pct_value(h.io_some_pct)} (PSI some, avg10)")
    if h.swap_in_bps is not None and h.swap_in_bps > 0:
        lines.append(f"swap-in {fmt.bps(h.swap_in_bps)}")
    if h.throttled_pct is not None and h.throttled_pct > 0:
        lines.append(_quota_line(h))
    if is_network_fs(h.data_fs_type):
        rx = f"; network receive {fmt.bps(h.net_rx_bps)}" if h.net_rx_bps is not None else ""
        lines.append(f"dataset on {h.data_fs_type}{rx}")
    return lines


def _quota_line(h: HostStats) -> str:
    quota = f" (quota {fmt.cores(h.quota_cores)})" if h.quota_cores is not None else ""
    return f"container throttled in {fmt.pct_value(h.throttled_pct or 0.0)} of CPU periods{quota}"


def _merge(first: list[str], rest: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(first + rest))


def _pass_start(ctx: Context) -> Cause | None:
    """Most of the wait is what the starts of passes cost beyond a first batch's making
    (the probe says which steps began one; tui/analysis/passes.py): each epoch waits for
    its loader to start. With workers not kept between passes that start is theirs: a
    fork and an init each, every epoch (a training loader's, an evaluation loader's)."""
    passes = ctx.passes
    if passes is None or passes.share < PASS_START_SHARE:
        return None
    lines = _pass_lines(passes)
    # Workers forked again at every pass: not kept (persistent_workers=False), or kept by
    # a DataLoader that is itself built again for each pass (the probe's `rebuilt`).
    restarting = [
        starts
        for starts in passes.loaders
        if starts.loader is not None
        and starts.loader.num_workers
        and (starts.loader.persistent_workers is False or starts.rebuilt)
    ]
    # The advice fits when the loaders whose workers start again cost most of it.
    if sum(starts.share for starts in restarting) >= passes.share / 2:
        rebuilt = [starts for starts in restarting if starts.rebuilt]
        dropped = [
            starts
            for starts in restarting
            if starts.loader is not None and starts.loader.persistent_workers is False
        ]
        whose = "the loaders'" if len(restarting) > 1 else "the loader's"
        why = []
        if dropped:
            why.append("persistent_workers=False")
        if rebuilt:
            why.append("a new DataLoader every pass")
        evidence = [*lines]
        if dropped:
            evidence.append(
                f"{_said(dropped, passes, 'persistent_workers=False')}: every pass (epoch) "
                "forks the workers again and waits for their first batches"
            )
        if rebuilt:
            evidence.append(
                f"{_said(rebuilt, passes, 'a new DataLoader object at every pass')}: its "
                "workers are the new object's, forked again at every pass whatever "
                "persistent_workers says"
            )
        advice = []
        if rebuilt:
            advice.append(
                "build the DataLoader once, outside the epoch loop: persistent_workers=True "
                "keeps the workers only across the passes of one DataLoader"
            )
        if dropped:
            advice.append(
                f"{knobs.knob(ctx.framework, 'persistent_workers', 'True')}: the workers "
                "start once, not at every pass"
            )
        advice.append(
            "make a worker's start cheaper (worker_init_fn, a dataset that opens files or "
            "loads an index when a worker starts)"
        )
        return Cause(
            "worker-restarts",
            0.85,
            f"{whose} workers start again at every pass ({', '.join(why)})",
            _merge(evidence, host_evidence(ctx)),
            tuple(advice),
            starts=passes,
        )
    advice = [
        "what the loader does before a pass's first batch runs at every pass (files "
        "opened, an index loaded or shuffled, a generator's set-up): do it once, outside "
        "the loop",
    ]
    if any(starts.loader is not None and starts.loader.num_workers for starts in passes.loaders):
        advice.append(
            "its workers: the first batches of a pass are not prefetched during the previous "
            "one; more passes of fewer steps make this worse"
        )
    return Cause(
        "pass-start",
        0.7,
        "each pass waits for its loader to start",
        _merge(lines, host_evidence(ctx)),
        tuple(advice),
        starts=passes,
    )


def _said(which: list[LoaderStarts], passes: PassStarts, fact: str) -> str:
    """``fact`` of ``which`` loaders: of the one loader with its workers, or naming them."""
    if len(passes.loaders) == 1:
        info = which[0].loader
        workers = info.num_workers if info is not None else None
        return f"num_workers={workers}, {fact}"
    if len(which) == len(passes.loaders) and not passes.partial:
        return f"{fact} on {'both loaders' if len(which) == 2 else 'every loader'}"
    names = dict.fromkeys(_short_name(starts, passes) for starts in which)
    return f"{fact} on {' and '.join(names)}"


def _pass_lines(passes: PassStarts) -> list[str]:
    """One line for one loader; for more, the whole share, then each loader's starts
    (those that cost a tenth of the wait or more, two at most)."""

    def waited(starts: LoaderStarts) -> str:
        n = starts.passes
        anyway = f"a batch takes {fmt.dur(starts.batch_wait_s)} anyway"
        if starts.recalled:  # the probe's waits of passes begun before the steps held
            n = starts.recalled
            which = "the last pass" if n == 1 else f"the median of the last {n} passes"
            return f"waited {fmt.dur(starts.first_wait_s)} ({which}; {anyway})"
        which = "the last pass" if n == 1 else f"the last {n} passes"
        return (
            f"waited {fmt.dur(starts.first_wait_s)}{' on average' if n > 1 else ''} over "
            f"{which} (a batch takes {fmt.dur(starts.batch_wait_s)} anyway)"
        )

    # A loader not judged (its passes no longer than iter()'s prefetch): the share is of
    # the others' passes' wait.
    whose = " of its passes" if passes.partial else ""
    if len(passes.loaders) == 1:
        starts = passes.loaders[0]
        since = "it" if starts.passes == 1 else "the first"
        over = (
            f"over a whole pass ({starts.pass_steps:,} steps)"
            if passes.whole and starts.pass_steps
            else f"since {since} began"
        )
        return [
            f"the first batch of a pass {waited(starts)}: {fmt.pct(passes.share)} of the data "
            f"wait{whose} {over}"
        ]
    over = (
        "over whole passes"
        if passes.whole
        else f"since the first of the last {passes.passes} passes began"
    )
    whose = " of the passes judged" if passes.partial else ""
    lines = [f"the starts of passes cost {fmt.pct(passes.share)} of the data wait{whose} {over}"]
    for starts in passes.loaders[:2]:
        if starts.share >= PASS_LOADER_SHARE:
            length = f", passes of {starts.pass_steps} steps" if starts.pass_steps else ""
            lines.append(
                f"{_loader_name(starts.loader)}{length}: the first batch of a pass "
                f"{waited(starts)}: {fmt.pct(starts.share)} of the data wait"
            )
    return lines


def _short_name(starts: LoaderStarts, passes: PassStarts) -> str:
    """A loader by its passes' length (what tells a training's from an evaluation's), or
    by its settings where another loader's passes are as long."""
    alike = sum(1 for other in passes.loaders if other.pass_steps == starts.pass_steps)
    if starts.pass_steps and alike == 1:
        return f"the loader of {starts.pass_steps}-step passes"
    return _loader_name(starts.loader)


def _loader_name(info: LoaderInfo | None) -> str:
    """A loader as its settings say (the probe does not know the variable's name)."""
    if info is None:
        return "a loader"
    kind = info.kind.rsplit(".", 1)[-1]
    settings = [
        f"{name}={value}"
        for name, value in (("batch_size", info.batch_size), ("num_workers", info.num_workers))
        if value is not None
    ]
    return f"{kind}({', '.join(settings)})"


def _memory(ctx: Context) -> Cause | None:
    h = ctx.host
    limit = SWAP_IN_EXIT_BPS if ctx.previous_cause == "memory" else SWAP_IN_ENTER_BPS
    if not ctx.enough_host or h.swap_in_bps is None or h.swap_in_bps < limit:
        return None
    line = f"swap-in {fmt.bps(h.swap_in_bps)} (median of {h.n_host_samples} samples)"
    if h.memory_some_pct is not None:
        line += f", memory pressure {fmt.pct_value(h.memory_some_pct)}"
    return Cause(
        "memory",
        0.85,
        "the host is swapping",
        _merge([line], host_evidence(ctx)),
        (
            "cut host memory: fewer workers or a smaller prefetch_factor (each worker holds "
            "its own copy of the dataset object and its prefetched batches)",
            "memory-map the data instead of loading it whole (numpy.memmap, Arrow, LMDB)",
            "or run on a machine with more RAM",
        ),
    )


def _cpu_quota(ctx: Context) -> Cause | None:
    h = ctx.host
    limit = CPU_QUOTA_EXIT_PCT if ctx.previous_cause == "cpu-quota" else CPU_QUOTA_ENTER_PCT
    if not ctx.enough_host or h.throttled_pct is None or h.throttled_pct < limit:
        return None
    now = f" (now {fmt.cores(h.quota_cores)})" if h.quota_cores is not None else ""
    return Cause(
        "cpu-quota",
        0.8,
        "the container's CPU quota starves the loader",
        _merge([_quota_line(h)], host_evidence(ctx)),
        (
            f"raise the container's CPU limit{now}: docker --cpus, Kubernetes resources.limits.cpu",
            "size num_workers to the quota, not to the host's core count: "
            + knobs.knob(ctx.framework, "num_workers", f"≤ {_quota_workers(h)}"),
        ),
    )


def _quota_workers(h: HostStats) -> int:
    """Workers that fit the quota beside the main process."""
    quota = h.quota_cores if h.quota_cores is not None else h.usable_cores
    return max(1, int(quota or 2) - 1)


def _disk_advice(ctx: Context) -> tuple[str, ...]:
    advice = [
        "copy the dataset to a local NVMe disk, or cache it in RAM (/dev/shm, tmpfs)",
        "pack small files into shards (WebDataset, TFRecord, LMDB): fewer, larger reads",
    ]
    if ctx.workers is not None and ctx.workers <= 1:
        lo, hi = suggest_workers(ctx.workers, ctx.host.free_cores, ctx.host.usable_cores)
        advice.append(
            f"{knobs.knob(ctx.framework, 'num_workers', fmt.worker_range(lo, hi))}: more "
            f"workers keep more reads in flight ({_now(ctx)})"
        )
    return tuple(advice)


def _now(ctx: Context) -> str:
    """The current num_workers, or what is known instead of it."""
    if ctx.configured is not None:
        return f"now {ctx.configured}"
    seen = ctx.host.worker_count
    workers = f"{seen} worker processes seen; " if seen is not None else ""
    return workers + knobs.setting(ctx.loader, "num_workers")


def _disk_busy(ctx: Context) -> Cause | None:
    h = ctx.host
    limit = DISK_BUSY_EXIT if ctx.previous_cause == "disk" else DISK_BUSY_ENTER
    if not ctx.enough_host or is_network_fs(h.data_fs_type):
        return None
    if h.disk_busy_pct is None or h.disk_busy_pct < limit:
        return None
    # A guessed device or CPU-bound loaders at the same time weaken the case.
    confidence = 0.85 if not h.data_disk_guessed and not ctx.loader_cpu_bound else 0.6
    read, written = h.disk_read_bps or 0.0, h.disk_write_bps or 0.0
    if written > WRITES_OVER_READS * read:
        # Busy with writes (an fsync per sample, logs, checkpoints on the data disk): not
        # the dataset's reads, and copying the dataset elsewhere would change nothing.
        return Cause(
            "disk",
            confidence,
            f"disk {h.data_disk} is busy with writes, not the dataset's reads",
            _merge(
                [f"disk {h.data_disk}: {fmt.bps(written)} written, {fmt.bps(read)} read"],
                host_evidence(ctx),
            ),
            (
                "find what writes to it (iotop -o, pidstat -d 1): a sync per sample, logs, "
                "checkpoints or caches written where the data is read",
                "write less often or elsewhere: batch the writes, no fsync per item, "
                "checkpoints and logs to another disk",
            ),
        )
    if ctx.reads_elsewhere:
        return None  # busy with another process's reads: not what the loader waits on
    return Cause(
        "disk",
        confidence,
        f"reads from disk {h.data_disk} are the limit",
        tuple(host_evidence(ctx)),
        _disk_advice(ctx),
    )


def _network(ctx: Context) -> Cause | None:
    h = ctx.host
    if not is_network_fs(h.data_fs_type) or ctx.loader_cpu_bound:
        return None
    busy_link = h.net_rx_bps is not None and h.net_rx_bps >= NET_RX_HIGH_BPS
    return Cause(
        "network-storage",
        0.8 if busy_link else 0.55,
        f"the dataset is read over the network ({h.data_fs_type})",
        tuple(host_evidence(ctx)),
        (
            "copy the dataset to a local disk (or RAM) before training",
            "if it must stay remote: pack files into shards (fewer round trips) and raise "
            "num_workers / prefetch_factor to keep more requests in flight",
        ),
    )


def _blocked_loader(ctx: Context) -> Cause | None:
    """The loader's processes are mostly off-CPU while the loop waits for them, and the
    node reads: the reads are what they wait for. With num_workers=0 the main process's
    CPU in the wait is known within bounds only (main_wait_cpu_least .. _pct): blocked
    when even the most is low, or when the least is and the disk is busy with it."""
    cpu = ctx.loader_cpu_pct
    if not ctx.enough_host or cpu is None:
        return None
    if not ctx.loader_io_active or is_network_fs(ctx.host.data_fs_type):
        return None  # no reads, or another process's: the loader waits on something else
    bound = "at most"
    if cpu >= LOADER_BLOCKED_CPU_PCT:
        least = ctx.main_wait_cpu_least if ctx.workers == 0 else None
        if least is None or least >= LOADER_BLOCKED_CPU_PCT or not ctx.disk_waited:
            return None
        cpu, bound = least, "perhaps only"  # its step may have had the rest of its CPU
    who = "the main process" if ctx.workers == 0 else "the loader workers"
    share = fmt.pct_value(cpu)
    if ctx.workers == 0:  # it loads the batches itself (num_workers=0)
        line = (
            f"the main process loads the batches itself and uses {bound} {share} of a core "
            "while the loop waits for them: it is mostly off-CPU while the node reads"
        )
    else:
        line = (
            f"the loader workers use only {share} of a core while the loop waits for them: "
            "they are mostly off-CPU while the node reads"
        )
    return Cause(
        "disk",
        0.65,
        f"{who} {'waits' if ctx.workers == 0 else 'wait'} on reads",
        _merge([line], [*host_evidence(ctx), *_whose(ctx)]),
        _disk_advice(ctx),
    )


def _whose(ctx: Context) -> list[str]:
    """READS_WHOSE where the samples do not say whose the reads are (host_evidence says
    it where they do)."""
    return [READS_WHOSE] if ctx.host.loader_read_bps is None else []


def _reads_little(ctx: Context) -> str:
    """How the node's reads bear on a loader that waits: none to speak of, or another
    process's."""
    if ctx.io_active and ctx.reads_elsewhere:
        return "and what the node reads is another process's"
    return "and the node reads little"


def _workers_advice(
    ctx: Context, current: int, worker_cores: float | None = None
) -> tuple[tuple[str, ...], float | None, int]:
    """The advice, the CPU cores the loading would then have (for the headroom), and the
    most workers it advises (``worker_cores``: see suggest_workers)."""
    h = ctx.host
    lo, hi = suggest_workers(current, h.free_cores, h.usable_cores, worker_cores)
    knob = knobs.knob(ctx.framework, "num_workers", fmt.worker_range(lo, hi))
    loader = ctx.loader
    if loader is not None and loader.num_workers is None and not knobs.is_dataloader(loader):
        # A generator, a list: no num_workers to set. Batches made in parallel need a
        # DataLoader (an IterableDataset for a stream) around what makes them.
        advice = [
            f"load in parallel: make the batches in a torch {knob} (an IterableDataset "
            f"for a stream) instead of the {loader.kind}, which loads one at a time in "
            f"the main process ({cores_text(h)})"
        ]
    else:
        advice = [f"set {knob} ({_now(ctx)}; {cores_text(h)})"]
    affinity = affinity_advice(h)
    if affinity is not None and (h.free_cores is None or h.free_cores < FREE_CORES_FOR_WORKERS):
        advice.append(affinity)  # the idle cores are outside it: the workers need them
    if loader is not None and loader.persistent_workers is False:
        persistent = knobs.knob(ctx.framework, "persistent_workers", "True")
        if current == 0:
            # Alone, with num_workers=0, torch refuses it (ValueError): a companion only.
            advice.append(
                f"with the workers, {persistent} too: they are then not restarted every epoch"
            )
        else:
            advice.append(f"{persistent}: workers are not restarted every epoch")
    if loader is not None and loader.prefetch_factor is not None and loader.prefetch_factor < 4:
        advice.append(
            f"{knobs.knob(ctx.framework, 'prefetch_factor', '4')} (now "
            f"{loader.prefetch_factor}) absorbs slow batches"
        )
    # The workers can at most use the idle cores plus what the loading uses now, and
    # at most one core each.
    after: float | None = None
    if h.free_cores is not None and ctx.loader_cores is not None:
        after = min(float(hi), ctx.loader_cores + h.free_cores)
    return tuple(advice), after, hi


def _cpu(ctx: Context) -> Cause | None:
    h = ctx.host
    workers = ctx.workers
    if workers == 0:
        if not ctx.enough_host and (h.latest_age_s is not None or ctx.samples_pending):
            # Host samples are on their way (or the run is too young to tell): whether the
            # main process computes or waits on reads decides between this and the disk
            # (no first blame to take back).
            return None
        pinned = h.main_cpu_pct is not None and h.main_cpu_pct >= PROCESS_SATURATED_PCT
        if ctx.configured == 0:
            line = "num_workers=0: the main process loads every batch itself, between steps"
            summary = "the main process loads the data itself (num_workers=0)"
        else:
            line = (
                "no DataLoader worker process seen: the main process loads every batch "
                f"itself; {knobs.setting(ctx.loader, 'num_workers')}"
            )
            summary = "the main process loads the data itself (no worker process seen)"
        lines = [line]
        cpu = ctx.loader_cpu_pct
        full = ctx.enough_host and cpu_full(ctx, NO_IDLE_CORE)
        if full and (cpu is None or _loading_computes(ctx, cpu)):
            # A worker would load on a core that is not there: none of the cores this
            # process may use is idle, and others take them, or it may use one only. (A
            # multi-threaded step that fills the cores between waits leaves them idle
            # while the main process loads: a worker overlaps the two.)
            contention = _contention(ctx)
            if contention is not None:
                return contention
            if h.usable_cores is not None and h.usable_cores <= 1.0:
                return _cpu_workers(
                    ctx, 0.7, f"the main process loads every batch itself with {cores_text(h)}"
                )
        # On full cores the line between the two holds the cause shown (_loading_computes).
        waiting = (
            ctx.enough_host
            and cpu is not None
            and (not _loading_computes(ctx, cpu) if full else cpu < LOADER_BLOCKED_CPU_PCT)
        )
        # No core idle by the figure the evidence gives ("0 of 8 cores idle"): a process
        # off-CPU may wait for a core as well as on its loading.
        no_core = h.free_cores is not None and h.free_cores < NO_IDLE_CORE
        if waiting and no_core:
            lines.append(
                f"the main process uses at most {fmt.pct_value(cpu or 0.0)} of a core while "
                f"the loop waits for its batches, {_reads_little(ctx)}; but none of the cores "
                "it may use is idle, so it may wait for a core as much as on the loading "
                "itself (a remote store, a lock, a sleep)"
            )
        elif waiting:
            # Off-CPU and no reads (else _blocked_loader said disk): it waits on
            # something else, and more loaders wait in parallel just as well.
            # (Its CPU figure is host_evidence's "main process" line.)
            lines.append(
                f"the main process is mostly off-CPU (under {LOADER_BLOCKED_CPU_PCT:.0f} % of "
                f"a core) while the loop waits for its batches, {_reads_little(ctx)}: the "
                "loading waits (a remote store, a lock, a sleep) rather than computes; workers "
                "overlap the waits"
            )
        advice, after, most = _workers_advice(ctx, 0)
        if waiting:  # its pace is a wait's, not a CPU cost: workers wait side by side
            return Cause(
                "few-workers",
                0.5 if no_core else 0.75,  # (no core idle: a wait or a core's, unknown)
                summary,
                _merge(lines, host_evidence(ctx)),
                _no_core_advice(ctx, advice) if no_core else advice,
                waiting_loaders_after=most,
            )
        return Cause(
            "few-workers",
            0.9 if pinned else 0.75,
            summary,
            _merge(lines, host_evidence(ctx)),
            advice,
            ctx.loader_cores,
            after,
        )
    if workers is None:
        # No process figures: the loader's CPU is not known (nor the main process's, from
        # the same samples), and a loader without workers is the case above.
        return None
    if ctx.loader_cpu_bound:
        if h.free_cores is not None and not cpu_full(ctx, FREE_CORES_FOR_WORKERS):
            advice, after, _ = _workers_advice(ctx, workers)
            return Cause(
                "few-workers",
                0.85,
                f"all {h.worker_count} loader workers are CPU-bound while {cores_text(h)}",
                tuple(host_evidence(ctx)),
                advice,
                ctx.loader_cores,
                after,
            )
        return _cpu_workers(ctx, 0.85, f"every loader worker is CPU-bound with {cores_text(h)}")
    if ctx.enough_host and cpu_full(ctx, HOST_CPU_FULL_FREE_CORES):
        return _contention(ctx) or _cpu_workers(ctx, 0.7, f"{_cores_full(h)} are full")
    return _waiting_workers(ctx, workers)


def _loading_computes(ctx: Context, cpu: float) -> bool:
    """With num_workers=0 on cores none of which is idle: the main process's loading
    computes (``cpu``: its most in the wait, percent of a core), so the full CPU is the
    cause, rather than that it may wait. LOADER_BLOCKED_CPU_PCT is the line; the cause
    shown moves it (FULL_LOADER_CPU_EXIT_PCT / _ENTER_PCT): a main process starved by
    others hovers near it, and the cause flipped between the two every few samples."""
    line = LOADER_BLOCKED_CPU_PCT
    if ctx.previous_cause in CPU_FULL_CAUSES:
        line = FULL_LOADER_CPU_EXIT_PCT
    elif ctx.previous_cause == "few-workers":
        line = FULL_LOADER_CPU_ENTER_PCT
    return cpu >= line


def _no_core_advice(ctx: Context, advice: tuple[str, ...]) -> tuple[str, ...]:
    """Workers advised where none of the cores is idle: what they buy if the loading
    waits, and that one which computes needs a core freed first ("workers overlap the
    waits" read as if cores were idle)."""
    contention = _contention(ctx)
    free = (
        contention.advice[0]
        if contention is not None
        else "find what takes them (top -o %CPU) and stop, move or renice it"
    )
    return (
        "if the loading waits (a remote store, a lock, a sleep), a worker overlaps the "
        f"waits on little CPU: {advice[0]}",
        f"if it computes, a worker needs a core of its own and none is idle: {free}",
        *advice[1:],
    )


def _waiting_workers(ctx: Context, workers: int) -> Cause | None:
    """The workers are mostly off-CPU while the loop waits for them, the node reads little
    or another process's reads (else _blocked_loader said disk) and cores are idle: the
    loading waits (a remote store, a lock, a sleep) rather than computes, and more workers
    overlap more waits. (Only the CPU-saturated workers were told to grow: one worker at
    3 % of a core, the loop waiting 60 % of each step, read "cause unknown".)"""
    h = ctx.host
    cpu = h.worker_cpu_pct
    if not ctx.enough_host or not h.worker_count or cpu is None or ctx.loader_io_active:
        return None
    if cpu >= LOADER_BLOCKED_CPU_PCT or h.free_cores is None:
        return None
    if cpu_full(ctx, HOST_CPU_FULL_FREE_CORES):  # no core for another one (said above)
        return None
    count = h.worker_count
    noun = "worker" if count == 1 else "workers"
    each = "" if count == 1 else " each on average"
    line = (
        f"{count} loader {noun} at {fmt.pct_value(cpu)} of a core{each} while the loop "
        f"waits for its batches, {_reads_little(ctx)}: the loading waits (a remote "
        "store, a lock, a sleep) rather than computes; more workers overlap the waits"
    )
    # Each of them uses `cpu` of a core: so many more fit the idle cores (not one a core).
    advice, _, most = _workers_advice(ctx, workers, cpu / 100.0)
    advice = (f"more workers overlap the waits: {advice[0]}", *advice[1:])
    return Cause(
        "few-workers",
        0.7,
        f"{count} loader {noun} at {fmt.pct_value(cpu)} CPU: the loading waits, not computes",
        _merge([line], host_evidence(ctx)),
        advice,
        waiting_loaders_after=most,
        waiting_loaders_now=workers,
    )


def _cores_full(h: HostStats) -> str:
    """What is full: the host's cores, or the ones this run may use when its CPU affinity
    leaves some of the node out."""
    if narrowed(h):
        return f"the {h.n_cores} cores this run may use (its CPU affinity)"
    return "the host's CPU cores"


def narrowed(h: HostStats) -> bool:
    """The run's CPU affinity leaves part of the node out."""
    return h.n_cores is not None and h.node_cores is not None and h.n_cores < h.node_cores


def affinity_advice(h: HostStats) -> str | None:
    if not narrowed(h):
        return None
    return (
        f"let it use more of the node's cores: its CPU affinity allows {h.n_cores} of "
        f"{h.node_cores} (taskset -c, the container's cpuset, Slurm's --cpus-per-task)"
    )


def _contention(ctx: Context) -> Cause | None:
    """The CPU is full, but mostly with processes that are not this training run's."""
    h = ctx.host
    if h.n_cores is None or h.free_cores is None or h.training_cpu_cores is None:
        return None
    busy = h.n_cores - h.free_cores
    share = OTHERS_CPU_SHARE
    if ctx.previous_cause == "cpu-contention":
        share += OTHERS_CPU_SHARE_BAND
    elif ctx.previous_cause == "cpu-workers":
        share -= OTHERS_CPU_SHARE_BAND
    if busy <= 0 or h.training_cpu_cores >= share * busy:
        return None
    # The table is the node's busiest ten: it shows no process's cores, so where the
    # affinity leaves part of the node out, others on it are not named as on these cores.
    narrow = narrowed(h)
    others = None if narrow else h.others
    if others is not None and not any(cpu >= OTHER_NAMED_MIN_PCT for _, cpu in others):
        # Busy cores that no listed process takes belong to processes too short-lived
        # to be sampled (workers started every epoch), not to "others at 0 %".
        return None
    line = (
        f"the training processes use {h.training_cpu_cores:.1f} of the {busy:.1f} busy "
        "cores: other processes take the rest"
    )
    if narrow:
        lines = [line, "the node's process table does not say which processes run on its cores"]
        find = find_on_cores(h)
    elif others:
        top = ", ".join(f"{name} {fmt.pct_value(cpu)}" for name, cpu in others[:3])
        lines = [line, f"top other consumers: {top}"]
        find = f"stop, move or renice the other CPU consumers: {top}"
    else:
        missing = (
            "the node sample has no process table"
            if h.others is None
            else "the process table shows no other process using CPU"
        )
        lines = [line, missing]
        find = "find the other CPU consumers (top -o %CPU) and stop, move or renice them"
    affinity = affinity_advice(h)
    return Cause(
        "cpu-contention",
        0.7,
        f"{_cores_full(h)} are full with other processes",
        _merge(lines, host_evidence(ctx)),
        (find, affinity or "or give the job dedicated cores (taskset, a CPU-pinned container)"),
    )


def _cpu_workers(ctx: Context, confidence: float, summary: str) -> Cause:
    advice = []
    loader = ctx.loader
    if loader is not None and loader.persistent_workers is False and ctx.workers:
        advice.append(
            f"{knobs.knob(ctx.framework, 'persistent_workers', 'True')}: its workers are "
            "started again every epoch, and each start costs CPU"
        )
    affinity = affinity_advice(ctx.host)
    if affinity is not None:
        advice.append(affinity)
    advice += [
        "make decode/augmentation cheaper: smaller stored images, decode at reduced size, "
        "fewer or simpler transforms, pre-process once offline",
        "move augmentation to the GPU (NVIDIA DALI, torchvision.transforms.v2 on tensors)",
    ]
    if affinity is None:
        advice.append("or give the job more CPU cores")
    return Cause(
        "cpu-workers",
        confidence,
        f"CPU-bound preprocessing: {summary}",
        tuple(host_evidence(ctx)),
        tuple(advice),
    )


def _io_wait(ctx: Context) -> Cause | None:
    h = ctx.host
    if not ctx.enough_host or ctx.loader_cpu_bound or ctx.reads_elsewhere:
        return None  # (the node's I/O is another process's: not what the loader waits on)
    pressure = h.io_some_pct is not None and h.io_some_pct >= IO_PRESSURE_HIGH_PCT
    iowait = h.iowait_cores is not None and h.iowait_cores >= IOWAIT_HIGH_CORES
    if not (pressure or iowait):
        return None
    return Cause(
        "disk",
        0.6,
        "the loader waits on I/O (iowait / I/O pressure high, loader not CPU-bound)",
        _merge(host_evidence(ctx), _whose(ctx)),
        _disk_advice(ctx),
    )


def _missing(ctx: Context) -> str:
    """What keeps the cause unknown, in a sentence."""
    h = ctx.host
    if h.n_host_samples == 0:
        if h.latest_age_s is not None and h.latest_age_s > SYSTEM_WINDOW_S and h.n_samples == 0:
            return f"no host sample for {fmt.dur(h.latest_age_s)}: is the node sampler running?"
        if ctx.samples_pending:
            return _pending(ctx)
        return NO_HOST_SAMPLES
    if h.n_host_samples < MIN_SYSTEMS:
        return (
            f"{FEW_SAMPLES} {h.n_host_samples} host sample so far, {MIN_SYSTEMS} needed for a cause"
        )
    return (
        "nothing gputop measures explains the wait: the loader is not CPU-bound, "
        "the disk is not busy, no swap"
    )


def _pending(ctx: Context) -> str:
    """Why no host sample is held yet, when they are on their way."""
    what = "host samples since the loop resumed" if ctx.resumed else "the run's first host samples"
    if ctx.samples_expected:
        # What the viewer knows: it is connected (then the probe samples once a second
        # for it), or it cannot tell (a recording's reader): never "no viewer" beside one.
        rate = (
            "once a second while a viewer is connected, as one is now"
            if ctx.watched
            else "once a second while a viewer is connected, every 5 s otherwise"
        )
        before = "the evaluation's" if ctx.resumed else "the start-up's"
        began = "resumed" if ctx.resumed else "began"
        why = (
            f"its probe samples the node {rate}; a sample begun before the loop {began} is {before}"
        )
    else:
        age = fmt.dur(ctx.run_age_s) if ctx.run_age_s is not None else "moments"
        began = "resumed" if ctx.resumed else "began"
        why = f"the loop {began} {age} ago"
    return f"{PENDING}: waiting for {what} ({why})"


def awaits_samples(evidence: Sequence[str]) -> bool:
    """Whether an unknown cause's evidence says only that host samples of the loop are
    pending or too few yet (not that none come, nor that nothing measured explains it)."""
    return any(
        line.startswith(PENDING + ":")
        or (line.startswith(FEW_SAMPLES + " ") and "host sample so far" in line)
        for line in evidence
    )


def _unknown(ctx: Context) -> Cause:
    missing = _missing(ctx)
    head, _, rest = missing.partition(": ")
    # "cause pending (waiting for the run's first host samples)"; else the reason's head.
    summary = f"{PENDING} ({rest.split(' (')[0]})" if head == PENDING else f"cause unknown ({head})"
    return Cause(
        "unknown",
        1.0,
        summary,
        _merge([missing], host_evidence(ctx)),
        (MEASURE_LOADER_ALONE,),
    )


RULES: tuple[Callable[[Context], Cause | None], ...] = (
    _memory,
    _pass_start,
    _cpu_quota,
    _disk_busy,
    _network,
    _blocked_loader,
    _cpu,
    _io_wait,
)


def input_cause(
    host: HostStats,
    loader: LoaderInfo | None,
    previous_cause: str | None,
    framework: str | None = None,
    wait_share: float | None = None,
    samples_expected: bool = False,
    passes: PassStarts | None = None,
    run_age_s: float | None = None,
    resumed: bool = False,
    watched: bool | None = None,
) -> Cause:
    ctx = Context(
        host,
        loader,
        previous_cause,
        framework,
        wait_share,
        samples_expected,
        passes,
        run_age_s,
        resumed,
        watched,
    )
    for rule in RULES:
        cause = rule(ctx)
        if cause is not None:
            return cause
    return _unknown(ctx)
