"""What one node sample costs the training process: CPU ms and wall ms per call.

Run: ``.venv/bin/python bench/sampler_cost.py``. Figures are medians (and p95) over
``CALLS`` calls. CPU time is ``time.process_time()`` -- what the probe takes away from
the training process -- and wall time is how long the sampler thread is busy.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Runnable as a plain script from the repo root or from bench/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputop_dl.probe.collectors.host import HostCollector, ProcessCollector
from gputop_dl.probe.collectors.processes import FULL_SCAN_EVERY
from gputop_dl.probe.collectors.sampler import NodeSampler, samples_between_walks
from gputop_dl.probe.collectors.top import TopCollector

CALLS = 200
WORKERS = 4  # sleeping children standing in for DataLoader workers
MORE_PROCESSES = 1_000  # a big node's kernel threads and daemons, as sleeping children
REPO = Path(__file__).resolve().parent.parent


def measure(fn: Callable[[], object], calls: int = CALLS) -> tuple[float, float, float]:
    """(median CPU ms, p95 CPU ms, median wall ms) of ``fn`` over ``calls`` calls."""
    fn()  # warm-up: first calls build caches (data device, mount table, Process objects)
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(calls):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    cpu.sort()
    return statistics.median(cpu), cpu[int(0.95 * (len(cpu) - 1))], statistics.median(wall)


def _row(label: str, figures: tuple[float, float, float]) -> None:
    med, p95, wall = figures
    print(f"  {label:<34} cpu {med:7.3f} ms (p95 {p95:7.3f})   wall {wall:7.3f} ms")


def host_cost() -> tuple[float, float, float]:
    """Print and return the host part: HostCollector + ProcessCollector per sample."""
    host = HostCollector(data_path=str(REPO))
    workers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        for _ in range(WORKERS)
    ]
    try:
        procs = ProcessCollector(os.getpid())

        def both() -> None:
            host.sample()
            procs.sample()

        print(f"host sampler ({os.cpu_count()} cpus, {WORKERS} worker processes, {CALLS} calls)")
        _row("HostCollector.sample()", measure(host.sample))
        _row("ProcessCollector.sample()", measure(procs.sample))
        total = measure(both)
        _row("host total (both)", total)
        return total
    finally:
        for w in workers:
            w.kill()
            w.wait()


def _switches() -> int:
    """This thread's voluntary context switches so far (Linux)."""
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def _thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def beside_training(seconds: float = 6.0, rounds: int = 4) -> None:
    """The probe's whole node sample (as on local rank 0), on the sampler's own thread
    once a second, while this thread runs Python steps on any CPU, as a training's main
    thread does. Each system call of the sampler lets go of the GIL, and taking it back
    forces the training thread off it: a context switch of the training thread, and CPU
    of both. Per sample: the training thread's voluntary context switches above the same
    time with the sampler paused, and the sampler thread's CPU."""
    sampler = NodeSampler(main_pid=os.getpid(), interval_s=1.0, host=True)
    sampler.pace(1e9)  # paused (after its first, priming sample) until measured
    sampler.start()
    time.sleep(0.5)
    assert sampler._thread is not None
    tid = sampler._thread.native_id
    assert tid is not None
    # NVML is read on a thread of its own (a blocked driver call costs the GPUs alone):
    # its CPU is the sample's too.
    nvml = getattr(sampler._nvml, "_thread", None)
    tids = [tid] + ([nvml.native_id] if nvml is not None and nvml.native_id else [])
    switches: dict[str, list[float]] = {"on": [], "off": []}
    cpu_ms: list[float] = []
    for _ in range(rounds):
        for mode in ("off", "on"):
            if mode == "on":
                sampler.pace(1.0)  # a sample at once, then one a second
            n0, s0, t0 = sampler.taken, _switches(), time.monotonic()
            c0 = sum(_thread_cpu_s(t) for t in tids)
            while time.monotonic() - t0 < seconds:
                x = 0
                for i in range(4_800):  # a step of Python work
                    x += i
            samples = max(1, sampler.taken - n0) if mode == "on" else seconds
            switches[mode].append((_switches() - s0) / samples)
            if mode == "on":
                cpu_ms.append((sum(_thread_cpu_s(t) for t in tids) - c0) / samples * 1e3)
            sampler.pace(1e9)
            time.sleep(1.2)  # the sample under way when paused lands outside the blocks
    sampler.close()
    base = statistics.median(switches["off"])
    print(f"node sampler beside a busy training thread ({rounds} x {seconds:.0f} s, 1 Hz)")
    print(
        f"  training thread's context switches a sample: "
        f"{statistics.median(switches['on']) - base:.1f} "
        f"({min(switches['on']) - base:.1f}..{max(switches['on']) - base:.1f}; "
        f"{base:.1f} a second without the sampler)"
    )
    print(
        f"  sampler's CPU a sample (its and NVML's thread): {statistics.median(cpu_ms):.2f} ms "
        f"({min(cpu_ms):.2f}..{max(cpu_ms):.2f})"
    )


def walk_cost(calls: int = 30) -> None:
    """The process table's walk of /proc (every process's stat file), here and with
    MORE_PROCESSES sleeping processes more: its CPU, and what it costs a second at the
    sampler's 1 Hz once its walks are spaced by that cost (samples_between_walks)."""
    print(f"walk of /proc for the process table ({calls} walks)")
    for extra in (0, MORE_PROCESSES):
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
        try:
            n = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
            walker = TopCollector()
            walker.sample()  # the first walk has no earlier one to figure CPU shares from
            walks = []
            for _ in range(calls):
                c0 = time.process_time()
                walker.sample()
                walks.append((time.process_time() - c0) * 1e3)
            cpu = statistics.median(walks)
            every = samples_between_walks(cpu / 1e3, 1.0)
            print(
                f"  {n:5d} processes: {cpu:6.2f} ms a walk ({min(walks):.2f}..{max(walks):.2f}),"
                f" {cpu / n * 1e3:5.1f} us a process; a walk every {every} samples:"
                f" {cpu / every:.2f} ms a second"
            )
        finally:
            for sleeper in sleepers:
                sleeper.kill()
            for sleeper in sleepers:
                sleeper.wait()


TREE = r"""
import subprocess, sys, threading, time
threads, workers = int(sys.argv[1]), int(sys.argv[2])
for _ in range(threads):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
worker = (
    "import threading, time\n"
    "for _ in range(10): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    "time.sleep(600)"
)
kids = [subprocess.Popen([sys.executable, "-c", worker]) for _ in range(workers)]
print("ready", flush=True)
time.sleep(600)
"""


def tree_cost(threads: int = 100, workers: int = 8, calls: int = 40) -> None:
    """The training tree's sample (ProcessCollector) of a process with ``threads``
    threads and ``workers`` children of 10 threads each, as a training process with its
    intra-op, NCCL and CUDA threads and its DataLoader workers: every thread's children
    file read (a full scan) against only main threads' (between full scans)."""
    tree = subprocess.Popen(
        [sys.executable, "-c", TREE, str(threads), str(workers)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert tree.stdout is not None
        tree.stdout.readline()
        collector = ProcessCollector(tree.pid)
        by_kind: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(calls * FULL_SCAN_EVERY):
            full = collector._scans % FULL_SCAN_EVERY == 0
            t0 = time.thread_time()
            collector.sample()
            by_kind[full].append((time.thread_time() - t0) * 1e3)
        full_ms, light_ms = (statistics.median(by_kind[k]) for k in (True, False))
        mean = (full_ms + (FULL_SCAN_EVERY - 1) * light_ms) / FULL_SCAN_EVERY
        print(
            f"training tree: {threads} threads and {workers} workers of 10: every thread's "
            f"children file {full_ms:.2f} ms, main threads' only {light_ms:.2f} ms; one full "
            f"scan in {FULL_SCAN_EVERY}: {mean:.2f} ms a sample"
        )
    finally:
        import psutil

        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()


def main() -> None:
    host_cost()
    tree_cost()
    walk_cost()
    beside_training()


if __name__ == "__main__":
    main()
