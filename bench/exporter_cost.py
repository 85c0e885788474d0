"""What ``gputop exporter`` costs with 64 runs attached: scrape latency and its own CPU.

A publisher process plays 64 training runs on 8 nodes over a real ZeroMQ socket (each run:
its steps at GPUTOP_BENCH_RATE steps/s, sent as the probe sends them (every 0.5 s at the
default 100 steps/s: probe.core.flush_period), a hello every 2 s; each node:
a sample a second with 64 cores, 8 GPUs, disks and NICs). The real ``gputop exporter``
CLI subscribes to it. Measured, over GPUTOP_BENCH_REPEATS fresh exporter processes:
- scrape latency: the time of a full ``GET /metrics`` (body read), 20 back-to-back;
- the exporter's whole-process CPU (all threads, /proc/PID/stat) while Prometheus scrapes
  it every 15 s (GPUTOP_BENCH_INTERVAL), over GPUTOP_BENCH_SCRAPES scrapes.
Median and spread are printed; nothing is asserted (a shared machine is noisy).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RUNS = int(os.environ.get("GPUTOP_BENCH_RUNS", "64"))
STEPS_PER_S = int(os.environ.get("GPUTOP_BENCH_RATE", "100"))
INTERVAL_S = float(os.environ.get("GPUTOP_BENCH_INTERVAL", "15"))
SCRAPES = int(os.environ.get("GPUTOP_BENCH_SCRAPES", "4"))
REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "3"))
BURST = 20  # back-to-back scrapes timed for the latency figure

PUBLISHER = """
import sys, time
from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.probe.samples import (CpuCore, CpuSample, DiskSample, GpuSample, MemorySample,
                                     NetSample, SystemSample)
from gputop_dl.probe.transport import Publisher

from gputop_dl.probe.core import flush_period
endpoint, runs, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
FLUSH_S = flush_period(rate)  # as the probe sends at this rate
pub = Publisher(endpoint)
start = time.time()
def hello(r):
    return encode(Hello(source_id=f"node{r // 8}:{1000 + r}", role="probe", name="bench",
                        host=f"node{r // 8}", pid=1000 + r, started=start, probe_version="0",
                        rank=r, world_size=runs, host_sampler=r % 8 == 0))
hellos = [hello(r) for r in range(runs)]
last = [-1] * runs
flushes = 0
next_at = time.time()
print("up", flush=True)
while True:
    next_at += FLUSH_S
    now = time.time()
    per = max(1, round(rate * FLUSH_S))
    for r in range(runs):
        if flushes % round(2 / FLUSH_S) == 0:  # a hello every 2 s
            pub.send(hellos[r])
        recs = tuple(StepRecord(index=last[r] + 1 + i, end_time=now - (per - 1 - i) / rate,
                                period_s=1 / rate, wait_s=0.3 / rate, samples=32)
                     for i in range(per))
        last[r] += per
        pub.send(encode(Steps(source_id=f"node{r // 8}:{1000 + r}", records=recs,
                              sent=flushes, dropped=0)))
    if flushes % round(1 / FLUSH_S) == 0:  # a node sample a second
        for node in range(max(1, runs // 8)):
            sample = SystemSample(
                time=now, host=f"node{node}", interval_s=1.0,
                cpu=CpuSample(tuple(CpuCore(c, 20.0, 5.0, 0.0, 0.0, 75.0) for c in range(64)),
                              (8.0, 8.0, 8.0)),
                memory=MemorySample(2**40, 2**39, 2**39, 2**38, 0, 0, 0.0, 0.0),
                disks=tuple(DiskSample(f"nvme{d}n1", 1e8, 1e6, 1e3, 10.0, 30.0) for d in range(4)),
                nets=tuple(NetSample(f"eth{n}", 1e9, 1e8) for n in range(2)),
                gpus=tuple(GpuSample(g, "H100", f"GPU-{node}-{g}", util_pct=90.0,
                                     mem_used_bytes=2**35, mem_total_bytes=2**36, power_w=500.0,
                                     power_limit_w=700.0, temperature_c=60.0)
                           for g in range(8)))
            pub.send(encode(System(source_id=f"node{node}:{1000 + 8 * node}", sample=sample)))
    flushes += 1
    time.sleep(max(0.0, next_at - time.time()))
"""


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> tuple[float, int, int]:
    """(seconds, bytes, run series) of one full scrape."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    elapsed = time.perf_counter() - t0
    runs = len(re.findall(rb"^gputop_run_info\{", body, re.MULTILINE))
    return elapsed, len(body), runs


def one_exporter(endpoint: str) -> tuple[list[float], float, int, int]:
    """(burst latencies, CPU % of one core at the scrape interval, bytes, runs seen)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputop_dl.tui.cli",
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--no-local",
            endpoint,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        found = re.search(r"serving (http://\S+)", proc.stdout.readline())
        assert found, "the exporter did not start"
        url = found.group(1)
        runs, deadline = 0, time.monotonic() + 30
        while runs < RUNS and time.monotonic() < deadline:  # every run attached
            time.sleep(1.0)
            _t, size, runs = scrape(url)
        time.sleep(3.0)  # verdicts past warming up
        latencies = [scrape(url)[0] for _ in range(BURST)]
        c0, w0 = cpu_seconds(proc.pid), time.monotonic()
        for _ in range(SCRAPES):
            time.sleep(INTERVAL_S)
            _t, size, runs = scrape(url)
        c1, w1 = cpu_seconds(proc.pid), time.monotonic()
        return latencies, 100 * (c1 - c0) / (w1 - w0), size, runs
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)


def spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"median {statistics.median(v):.1f} {unit} (min {min(v):.1f}, max {max(v):.1f})"


def main() -> None:
    print(
        f"exporter cost: {RUNS} runs x {STEPS_PER_S} steps/s on {max(1, RUNS // 8)} nodes, "
        f"scraped every {INTERVAL_S:g} s x {SCRAPES}, {REPEATS} exporter processes"
    )
    endpoint = free_endpoint()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "pub.py"
        script.write_text(PUBLISHER)
        pub = subprocess.Popen(
            [sys.executable, str(script), endpoint, str(RUNS), str(STEPS_PER_S)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert pub.stdout is not None and pub.stdout.readline() == "up\n"
            latencies: list[float] = []
            medians: list[float] = []
            cpus: list[float] = []
            for _ in range(REPEATS):
                burst, cpu, size, runs = one_exporter(endpoint)
                latencies += burst
                medians.append(statistics.median(burst))
                cpus.append(cpu)
                print(
                    f"  exporter: scrape {spread(burst, 'ms', 1e3)}, {size / 1024:.0f} KiB, "
                    f"{runs}/{RUNS} runs; CPU {cpu:.1f} % of one core"
                )
        finally:
            pub.kill()
            pub.wait()
    print(f"scrape latency, all {len(latencies)} scrapes: {spread(latencies, 'ms', 1e3)}")
    print(f"scrape latency, per-process medians: {spread(medians, 'ms', 1e3)}")
    print(f"exporter CPU at a {INTERVAL_S:g} s scrape interval: {spread(cpus, '% of one core')}")


if __name__ == "__main__":
    main()
