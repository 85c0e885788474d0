"""What the accelerator collectors cost per sample: CPU ms and wall ms.

Run: ``.venv/bin/python bench/accel_cost.py``

* NVML: 8 fake GPUs (tests/fakes/fake_nvml.py at the pynvml function boundary). The fake's
  Python calls stand in for the binding's ctypes calls; real NVML queries cost
  microseconds each, except ``nvmlDeviceGetPcieThroughput`` which samples the bus for
  ~20 ms. The fake models that with a 20 ms sleep (wall time, no CPU -- the real ctypes
  call also releases the GIL while the driver waits). Three figures: without PCIe, with
  PCIe on every sample (2 calls x 8 GPUs = 16 x 20 ms), and the default ``pcie_every=5``
  with refreshes staggered over devices.
* hl-smi: parsing one 8-device sample (real format, produced by the fake hl-smi) into
  HpuSamples, and the collector thread's CPU per sample while it reads a loop child. The
  cost of the hl-smi process itself (tens to hundreds of ms per call on real hardware)
  is not ours to measure here: the fake is a Python script.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop_dl.probe.collectors.hlsmi import (  # noqa: E402
    QUERY_FIELDS,
    HlSmiCollector,
    hpu_sample_from_row,
    parse_hlsmi_csv,
)
from gputop_dl.probe.collectors.nvml import NvmlCollector  # noqa: E402
from tests.fakes.fake_nvml import FakeNvml  # noqa: E402

FAKE_HLSMI = ROOT / "tests" / "fakes" / "hl-smi"


def per_call(fn: Callable[[], object], n: int) -> tuple[float, float, float]:
    """Mean CPU ms, mean wall ms and max wall ms over ``n`` calls of ``fn()``."""
    walls: list[float] = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    return cpu / n * 1e3, statistics.fmean(walls) * 1e3, max(walls) * 1e3


def row(label: str, cpu_ms: float, wall_ms: float, max_ms: float | None = None) -> None:
    extra = f"   max wall {max_ms:8.3f} ms" if max_ms is not None else ""
    print(f"  {label:<52} CPU {cpu_ms:8.3f} ms   wall {wall_ms:8.3f} ms{extra}")


def bench_nvml() -> None:
    print("NVML, 8 fake GPUs, per sample():")
    fake = FakeNvml(8)
    fake.gpus[0].processes = [(os.getpid(), 2 << 30)]
    with fake.installed():
        col = NvmlCollector(pcie_every=0, training_pids=lambda: {os.getpid()})
        col.sample()  # lazy init outside the measurement
        cpu, wall, top = per_call(col.sample, 2000)
        row("without PCIe (pcie_every=0)", cpu, wall, top)
        col.close()

        fake.pcie_latency_s = 0.020
        col = NvmlCollector(pcie_every=1, training_pids=lambda: {os.getpid()})
        col.sample()
        cpu, wall, top = per_call(col.sample, 5)
        row("with PCIe every sample (16 calls x 20 ms)", cpu, wall, top)
        col.close()

        col = NvmlCollector(pcie_every=5, training_pids=lambda: {os.getpid()})
        col.sample()
        cpu, wall, top = per_call(col.sample, 50)
        row("default pcie_every=5, staggered over devices", cpu, wall, top)
        col.close()


def bench_hlsmi() -> None:
    print("hl-smi, 8 devices (HL-225):")
    text = subprocess.run(
        [str(FAKE_HLSMI), "-Q", ",".join(QUERY_FIELDS), "-f", "csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def parse() -> None:
        samples = [hpu_sample_from_row(r) for r in parse_hlsmi_csv(text, QUERY_FIELDS)]
        assert len(samples) == 8

    cpu, wall, top = per_call(parse, 5000)
    row("parse one 8-row sample into HpuSamples", cpu, wall, top)

    # Collector thread CPU while reading a loop child (main thread sleeps meanwhile).
    env_path = f"{FAKE_HLSMI.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PATH"] = env_path
    col = HlSmiCollector(interval_s=0.2, timeout_s=2.0)
    col.min_loop_s = 0.2  # 5 samples/s so a short run gives a stable figure
    col.start()
    while not col.latest()[1].ok:
        time.sleep(0.01)
    seconds = 3.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    col.close()
    n = wall / 0.2
    print(f"  collector thread CPU per loop sample (excl. hl-smi itself): {cpu / n * 1e3:.3f} ms")
    t0 = time.perf_counter()
    for _ in range(1000):
        col.latest()
    print(f"  latest(): {(time.perf_counter() - t0) / 1000 * 1e6:.1f} us per call")


if __name__ == "__main__":
    bench_nvml()
    bench_hlsmi()
