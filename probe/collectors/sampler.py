"""One node sampler: runs the collectors on its own thread and assembles SystemSamples.

Used by the probe (local rank 0 samples the host; other ranks only their own process and
device), by ``gputop agent`` and by the viewer when nothing else samples its host. Each
collector degrades on its own: a slow or broken source costs only its own fields.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from gputop_dl.probe.samples import TOP_EVERY, SourceStatus, SystemSample

# A walk reads every process's /proc/<pid>/stat: ~15 us of CPU a process, 1 ms on a
# container of 60 processes but 15-25 ms on a node of 1,000 (bench/sampler_cost.py),
# and a 128-core node has that many kernel threads alone. So walks are spaced to cost
# the training process at most this share of a core, on top of TOP_EVERY.
TOP_CPU_SHARE = 0.001
MAX_SAMPLES_BETWEEN_WALKS = 1e9  # a pace near zero must not overflow the count


def samples_between_walks(walk_cpu_s: float, pace_s: float) -> int:
    """Samples from one walk of /proc to the next: TOP_EVERY, or more when the last
    walk took ``walk_cpu_s`` of CPU and samples come every ``pace_s``."""
    if not (pace_s > 0 and math.isfinite(pace_s) and walk_cpu_s > 0):
        return TOP_EVERY  # also NaN: no spacing to be had from it
    budget = TOP_CPU_SHARE * pace_s  # the CPU a sample may spend on walks
    samples = walk_cpu_s / budget if budget > 0 else math.inf
    return max(TOP_EVERY, math.ceil(min(samples, MAX_SAMPLES_BETWEEN_WALKS)))


class NodeSampler:
    def __init__(
        self,
        *,
        main_pid: int | None,
        interval_s: float = 1.0,
        host: bool = True,
        data_path: str | None = None,
        accelerators: bool = True,
        worker_pids: Callable[[], Collection[int]] | None = None,
    ) -> None:
        """``worker_pids``: the DataLoader worker pids the probe published (None: the
        sampler has no loader to ask -- agents -- and shows no child as a worker)."""
        from gputop_dl.probe.collectors.host import HostCollector
        from gputop_dl.probe.collectors.processes import ProcessCollector

        self.interval_s = interval_s
        self._pace = interval_s  # the period now (see pace)
        self.taken = 0  # samples the thread took, the priming one included
        self._wake = threading.Event()
        self.hostname = socket.gethostname()
        self._host = host
        self._main_pid = main_pid
        self._host_collector = HostCollector(data_path=data_path) if host else None
        self._training_pids: set[int] = {main_pid} if main_pid is not None else set()
        self._nvml: Any = None
        self._hlsmi: Any = None
        self._own_gpu: int | str | None = None
        if accelerators:
            from gputop_dl.probe.collectors.nvml import (
                NvmlCollector,
                NvmlWorker,
                physical_gpu_index,
            )

            if not host:
                self._own_gpu = physical_gpu_index(
                    _env_int("LOCAL_RANK"), os.environ.get("CUDA_VISIBLE_DEVICES")
                )
            collector = NvmlCollector(training_pids=lambda: self._training_pids, only=self._own_gpu)
            self._nvml = NvmlWorker(collector)
            if host:  # hl-smi is node-wide and costly: once per node
                from gputop_dl.probe.collectors.hlsmi import HlSmiCollector

                self._hlsmi = HlSmiCollector(interval_s=max(1.0, interval_s))
        # The node's busiest processes (the process table, cpu-contention): a walk of
        # /proc runs every few samples (samples_between_walks) and is repeated between.
        self._top: Any = None
        if host:
            from gputop_dl.probe.collectors.top import TopCollector

            self._top = TopCollector()
        self._top_last: Any = None
        self._top_time: float | None = None  # the sample time of the walk it came from
        self._top_countdown = 0
        self._proc_collector = (
            ProcessCollector(main_pid, exclude=self._tool_pids, worker_pids=worker_pids)
            if main_pid is not None
            else None
        )
        # Set from the training thread, resolved here: existence checks and the
        # partition scan must never run on the training thread.
        self._pending_data_path: str | None = None
        self._data_path_set = False
        self._out: deque[SystemSample] = deque(maxlen=4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: float | None = None

    def _tool_pids(self) -> set[int]:
        return self._hlsmi.child_pids() if self._hlsmi is not None else set()

    def set_data_path(self, path: str | None) -> None:
        """Hand over a dataset path; cheap (a store), checked on the sampler thread."""
        self._pending_data_path = path
        self._data_path_set = True

    def _apply_data_path(self) -> None:
        if not self._data_path_set:
            return
        self._data_path_set = False
        path = self._pending_data_path
        if self._host_collector is None:
            return
        if path is not None and not os.path.exists(path):
            return  # a name the dataset carries that is not a file here: nothing to watch
        self._host_collector.set_data_path(path)

    def start(self, thread: bool = True) -> None:
        """Start hl-smi's reader and, unless the caller samples itself, our own thread."""
        if self._hlsmi is not None:
            self._hlsmi.start()
        if not thread:
            return
        self._thread = threading.Thread(target=self._run, name="gputop-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Prime the delta-based collectors so the first published sample has rates.
        with contextlib.suppress(Exception):
            self.sample()
        self.taken += 1
        while True:
            self._wake.wait(self._pace)
            self._wake.clear()
            if self._stop.is_set():
                return
            with contextlib.suppress(Exception):  # a collector bug must not end sampling
                self._out.append(self.sample())
            self.taken += 1

    def pace(self, interval_s: float) -> None:
        """Sample every ``interval_s`` from now on (callable from any thread). A faster
        pace than the current one takes a sample, the process table included, at once:
        a viewer that just attached gets the node as it is now."""
        faster = interval_s < self._pace
        self._pace = interval_s
        if faster:
            self._top_countdown = 0
            self._wake.set()

    def take(self) -> list[SystemSample]:
        """Samples produced since the last call (called from the publisher thread)."""
        out = []
        while self._out:
            out.append(self._out.popleft())
        return out

    def sample(self) -> SystemSample:
        """Take one sample now, on the calling thread."""
        now = time.time()
        interval = None if self._last is None else now - self._last
        self._last = now
        statuses: list[SourceStatus] = []
        fields: dict[str, Any] = {}
        self._apply_data_path()
        if self._host_collector is not None:
            reading = self._host_collector.sample()
            fields.update(
                cpu=reading.cpu,
                memory=reading.memory,
                disks=reading.disks,
                nets=reading.nets,
                pressure=reading.pressure,
                cgroup=reading.cgroup,
                data_device=reading.data_device,
                data_fs_type=reading.data_fs_type,
            )
            statuses.extend(reading.statuses)
        if self._proc_collector is not None:
            procs = self._proc_collector.sample()
            fields["processes"] = procs
            if procs is not None:
                self._training_pids = {p.pid for p in procs.processes}
        if self._top is not None:
            if self._top_countdown <= 0:
                cpu = time.thread_time()
                self._top_last, self._top_time = self._top.sample(), now
                self._top_countdown = samples_between_walks(time.thread_time() - cpu, self._pace)
            self._top_countdown -= 1
            fields["top"], fields["top_time"] = self._top_last, self._top_time
        if self._nvml is not None:
            gpus, status = self._nvml.sample()
            fields["gpus"] = gpus  # a rank's own GPU only: the collector reads no other
            statuses.append(status)
        if self._hlsmi is not None:
            hpus, status = self._hlsmi.latest()
            fields["hpus"] = hpus
            statuses.append(status)
        return SystemSample(
            time=now,
            host=self.hostname,
            interval_s=interval,
            host_sampled=self._host,
            statuses=tuple(statuses),
            **fields,
        )

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for collector in (self._hlsmi, self._nvml):
            if collector is not None:
                with contextlib.suppress(Exception):
                    collector.close()


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
