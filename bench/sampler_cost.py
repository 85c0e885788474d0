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

CALLS = 200
WORKERS = 4  # sleeping children standing in for DataLoader workers
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


# ----------------------------------------------------------------------------------------
# GPU part: to be added by the NVML engineer (8 fake GPUs). Add a ``gpu_cost()`` here that
# prints its rows with ``_row`` / ``measure`` and call it from ``main`` below.
# ----------------------------------------------------------------------------------------


def main() -> None:
    host_cost()
    # gpu_cost()  # <- GPU/NVML figures go here


if __name__ == "__main__":
    main()
