"""The training process and its descendants, with per-process CPU.

Only the pids the probe published as its loader's workers are "worker"s; every other
descendant (torch.compile's compile workers and g++, tokenizer pools, loggers) is
"other": counting those as DataLoader workers would blame the loader for the compiler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Collection

import psutil

from gputop_dl.probe.collectors import procfs
from gputop_dl.probe.collectors.cgroup import parse_keyed_ints
from gputop_dl.probe.collectors.top import TICKS, parse_stat
from gputop_dl.probe.samples import MAX_STR, ProcessSample, TrainingProcesses

SATURATED_PCT = 90.0  # a worker at >= 90 % of one core is taken as CPU-saturated
# Samples from one read of every thread's children file to the next. A training process
# has 50-150 threads (intra-op, NCCL, CUDA, pin-memory, loggers): ~14 us a thread, 1.5 ms
# a sample for 100 (bench/sampler_cost.py). Between two, only each process's main
# thread's file is read, and children other threads forked are taken from the last full
# read while their stat says the same process under the same parent (a new one shows
# up within this many samples).
FULL_SCAN_EVERY = 5
COMM_LEN = 15  # the kernel keeps this much of a process's name in /proc/<pid>/stat
# A process younger than this has no share over its life (see lifetime_share): its start
# is known to a clock tick (10 ms), 5 % of this.
MIN_LIFE_S = 0.2


def _children_files_supported(proc_root: str) -> bool:
    """``/proc/<pid>/task/<tid>/children`` needs CONFIG_PROC_CHILDREN (most distro kernels)."""
    pid = os.getpid()
    return os.path.exists(os.path.join(proc_root, str(pid), "task", str(pid), "children"))


def descendants_from_children_files(
    pid: int,
    proc_root: str = "/proc",
    parents: dict[int, int] | None = None,
    all_threads: bool = True,
) -> list[int]:
    """All descendants of ``pid`` by walking the per-thread ``children`` files.

    Why not psutil's ``children(recursive=True)``: that reads ``/proc/*/stat`` of every
    process on the node (a few ms on a busy 8-GPU node, once per rank per second); this
    reads only the files of the training tree. A child shows up under the thread that
    forked it, so every thread's file is read; with ``all_threads`` False only each
    process's main thread's (what forks DataLoader workers and subprocesses, almost
    always). ``parents`` (if given) is filled with each descendant's parent pid.
    """
    out: list[int] = []
    seen = {pid}
    stack = [pid]
    while stack:
        cur = stack.pop()
        task_dir = os.path.join(proc_root, str(cur), "task")
        if all_threads:
            try:
                tids = procfs.list_dir(task_dir)
            except OSError:
                continue  # exited meanwhile
        else:
            tids = [str(cur)]
        for tid in tids:
            try:
                text = procfs.read_text(os.path.join(task_dir, tid, "children"))
            except OSError:
                continue
            for word in text.split():
                child = int(word)
                if child not in seen:
                    seen.add(child)
                    if parents is not None:
                        parents[child] = cur
                    out.append(child)
                    stack.append(child)
    return out


def _role(pid: int, loader_workers: Collection[int], parents: dict[int, int]) -> str:
    """ "worker" for a published loader worker and its own children (a decoder it runs)."""
    for _ in range(8):  # the loader's tree is shallow; a pid cycle (reuse) must not hang
        if pid in loader_workers:
            return "worker"
        parent = parents.get(pid)
        if parent is None:
            return "other"
        pid = parent
    return "other"


def lifetime_share(cpu_s: float, started_ticks: int) -> float | None:
    """Percent of one core a process used since it started (``started_ticks``: its start
    after boot, /proc/<pid>/stat's clock ticks); None under MIN_LIFE_S old (the start's
    tick rounding is then a large part of the age) or with a start time past now (a
    time namespace's offset boot clock)."""
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / TICKS
    if age < MIN_LIFE_S:
        return None
    return 100.0 * cpu_s / age


class ProcessCollector:
    """Samples the main training process and all its descendants.

    ``cpu_pct`` is percent of one core (user + system time delta over wall time since
    this collector last saw that pid); ``None`` the first time a pid is seen. ``read_bps``
    likewise from the bytes the process read from storage (``read_bytes`` of
    /proc/<pid>/io); ``None`` also where that is unreadable.
    """

    def __init__(
        self,
        main_pid: int,
        *,
        proc_root: str = "/proc",
        exclude: Callable[[], Collection[int]] | None = None,
        worker_pids: Callable[[], Collection[int]] | None = None,
    ) -> None:
        self._main_pid = main_pid
        self._worker_pids = worker_pids
        # Children that are gputop's own tools (the hl-smi loop), not training workers.
        self._exclude = exclude
        self._proc_root = proc_root
        # Linux with children files: the tree from them, and each process from one read
        # of /proc/<pid>/stat holding the GIL, where psutil reads stat and statm through
        # file objects (procfs.py says why); psutil otherwise
        self._linux = _children_files_supported(proc_root)
        self._started: dict[int, int] = {}  # pid -> start time (ticks): a reused pid
        self._scans = 0  # of the tree; every FULL_SCAN_EVERY-th reads every thread's file
        self._tree: dict[int, int] = {}  # the last full scan's descendants -> parents
        self._kept: dict[int, int] = {}  # those taken from it into this sample -> parents
        self._main: psutil.Process | None
        try:
            self._main = psutil.Process(main_pid)
        except psutil.Error:
            self._main = None
        # Process objects are kept so psutil's identity (pid + create time) is stable.
        self._procs: dict[int, psutil.Process] = {}
        self._prev_cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu s, monotonic s)
        self._prev_read: dict[int, tuple[int, float]] = {}  # pid -> (read bytes, monotonic s)

    def _loader_workers(self) -> Collection[int]:
        if self._worker_pids is None:
            return ()
        try:
            return self._worker_pids()
        except Exception:  # the probe's state is read across threads: best effort
            return ()

    def _descendants(self, main: psutil.Process, parents: dict[int, int]) -> list[int]:
        if self._linux:
            full = self._scans % FULL_SCAN_EVERY == 0
            found = descendants_from_children_files(
                self._main_pid, self._proc_root, parents, all_threads=full
            )
            self._scans += 1
            if full:
                self._tree, self._kept = dict(parents), {}
                return found
            # Parents come before their children in the full scan's order: a chain of
            # them is taken whole. Each is checked by its own stat read (_one_from_stat).
            self._kept = {
                pid: parent
                for pid, parent in self._tree.items()
                if pid not in parents and (parent == self._main_pid or parent in parents)
            }
            parents.update(self._kept)
            found += self._kept
            return found
        out = []
        for child in main.children(recursive=True):
            out.append(child.pid)
            with contextlib.suppress(psutil.Error):
                parents[child.pid] = child.ppid()
        return out

    def _one(self, pid: int, role: str, now: float) -> ProcessSample:
        if self._linux:
            return self._one_from_stat(pid, role, now)
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._main if pid == self._main_pid and self._main else psutil.Process(pid)
            self._procs[pid] = proc
        with proc.oneshot():  # one read of /proc/<pid>/stat for times and name
            times = proc.cpu_times()
            # psutil lengthens a 15-character comm from argv[0], which a process may set to
            # anything (setproctitle): past the wire's limit the whole sample is refused.
            name = proc.name()[:MAX_STR]
            try:
                rss: int | None = proc.memory_info().rss
            except psutil.AccessDenied:
                rss = None
            read: int | None
            try:
                read = proc.io_counters().read_bytes  # Linux's /proc/<pid>/io read_bytes
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                read = None  # another user's, or no such counter here (macOS)
        return self._with_share(pid, role, name, times.user + times.system, rss, now, read)

    def _one_from_stat(self, pid: int, role: str, now: float) -> ProcessSample:
        try:
            parsed = parse_stat(procfs.read_text(f"{self._proc_root}/{pid}/stat", single=True))
        except OSError:
            parsed = None
        if parsed is None:
            raise psutil.NoSuchProcess(pid)
        name, ppid, cpu_s, rss, started = parsed
        kept = self._kept.get(pid)
        if kept is not None and (ppid != kept or self._started.get(pid) != started):
            # Not the child the last full scan found: it ended, and its pid went to
            # another process, or its own children went to init.
            raise psutil.NoSuchProcess(pid)
        if self._started.setdefault(pid, started) != started:  # the pid was reused
            if pid == self._main_pid:
                raise psutil.NoSuchProcess(pid)
            self._started[pid] = started
            self._prev_cpu.pop(pid, None)
            self._prev_read.pop(pid, None)
        if len(name) >= COMM_LEN:
            name = self._full_name(pid, name)
        read = self._read_bytes(pid)
        sample = self._with_share(pid, role, name[:MAX_STR], cpu_s, rss, now, read)
        if sample.cpu_pct is None and pid != self._main_pid:
            # First seen: its share over its life so far, a true figure over a shorter
            # interval. A DataLoader's workers start again each pass
            # (persistent_workers=False, torch's default): without it each pass's first
            # sample had no worker's CPU, and passes shorter than a sampling interval never
            # any ("cause unknown" for workers that wait). Not the main process: its life
            # holds its imports and set-up, which say nothing of its loop.
            share = lifetime_share(cpu_s, started)
            if share is not None:
                sample = dataclasses.replace(sample, cpu_pct=share)
        return sample

    def _read_bytes(self, pid: int) -> int | None:
        """``read_bytes`` of /proc/<pid>/io: bytes the process had fetched from storage
        (page-cache hits are not counted). The kernel makes the file at once (it takes the
        process's exec lock, not its memory lock): read with the GIL held. None where it
        cannot be read: a process of another user or not dumpable (EACCES), gone, or a
        kernel without task I/O accounting."""
        try:
            text = procfs.read_text(f"{self._proc_root}/{pid}/io", single=True)
        except (OSError, ValueError):
            return None
        return parse_keyed_ints(text).get("read_bytes:")  # its lines: "read_bytes: 4096"

    def _full_name(self, pid: int, comm: str) -> str:
        """A comm the kernel cut at 15 characters, lengthened from argv[0] as psutil's
        ``name()`` does. Read with the GIL released: /proc/<pid>/cmdline takes the
        process's memory lock, which a process stuck in reclaim may hold."""
        try:
            with open(f"{self._proc_root}/{pid}/cmdline", "rb") as f:
                argv0 = f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            return comm
        full = os.path.basename(argv0)
        return full if full.startswith(comm) else comm

    def _with_share(
        self,
        pid: int,
        role: str,
        name: str,
        cpu_s: float,
        rss: int | None,
        now: float,
        read: int | None = None,
    ) -> ProcessSample:
        """The sample, with its CPU share and read rate since this pid's previous one."""
        cpu_pct: float | None = None
        prev = self._prev_cpu.get(pid)
        if prev is not None:
            d_cpu, d_wall = cpu_s - prev[0], now - prev[1]
            if d_wall > 0 and d_cpu >= 0:  # negative: pid reused by another process
                cpu_pct = 100.0 * d_cpu / d_wall
        self._prev_cpu[pid] = (cpu_s, now)
        read_bps: float | None = None
        if read is None:
            self._prev_read.pop(pid, None)  # no figure to take the next one from
        else:
            last = self._prev_read.get(pid)
            if last is not None:
                d_read, d_wall = read - last[0], now - last[1]
                if d_wall > 0 and d_read >= 0:  # negative: pid reused by another process
                    read_bps = d_read / d_wall
            self._prev_read[pid] = (read, now)
        return ProcessSample(
            pid=pid, role=role, name=name, cpu_pct=cpu_pct, rss_bytes=rss, read_bps=read_bps
        )

    def sample(self) -> TrainingProcesses | None:
        """None once the main pid has vanished (or was reused by another process)."""
        main = self._main
        if main is None or not (self._linux or main.is_running()):  # Linux: in _one
            self._main = None
            return None
        parents: dict[int, int] = {}
        try:
            workers = self._descendants(main, parents)
        except psutil.Error:
            return None
        if self._exclude is not None:
            ours = set(self._exclude())
            workers = [w for w in workers if w not in ours]
        loader_workers = self._loader_workers()
        now = time.monotonic()
        samples: list[ProcessSample] = []
        roles = ((w, _role(w, loader_workers, parents)) for w in workers)
        for pid, role in [(self._main_pid, "main"), *roles]:
            try:
                samples.append(self._one(pid, role, now))
            except psutil.NoSuchProcess:
                if pid == self._main_pid:
                    self._main = None
                    return None
                continue  # a worker exited between listing and reading: just not shown
            except psutil.Error:
                continue  # e.g. AccessDenied on a child that changed user: skip it
        # Forget exited pids so memory stays bounded when workers are respawned each epoch.
        alive = {s.pid for s in samples}
        for pid in {*self._procs, *self._prev_cpu, *self._prev_read, *self._started} - alive:
            self._procs.pop(pid, None)
            self._prev_cpu.pop(pid, None)
            self._prev_read.pop(pid, None)
            self._started.pop(pid, None)
        worker_samples = [s for s in samples if s.role == "worker"]
        saturated = sum(
            1 for s in worker_samples if s.cpu_pct is not None and s.cpu_pct >= SATURATED_PCT
        )
        return TrainingProcesses(
            processes=tuple(samples),
            saturated_workers=saturated,
            worker_count=len(worker_samples),
        )
