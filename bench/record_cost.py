"""What a recording costs: bytes per step and per node sample, and the recorder's CPU.

1. Size: the real RecordWriter (zstd, a chunk a second) fed 10 minutes of steps alone
   (sent as the probe sends them, probe.core.flush_period: every 0.2 s at 10 steps/s,
   every 0.5 s at 1,000) and of node samples
   alone (a 64-core, 8-GPU node, tests/fakes_tui.system_sample; and this host's own
   samples from the real collectors, repeated with their times moved).
2. CPU: ``gputop record FILE ENDPOINT --no-local --duration 20`` as a subprocess while
   this process publishes 1,000 steps/s on a real ZeroMQ socket (a steps message of 500
   records every 0.5 s, as the probe sends them, a hello every 2 s, a node sample a
   second). The recorder's
   whole-process CPU (all threads and start-up, from getrusage of the child) per second
   of recording, beside a run with only the hello and samples (no steps).
Prints median and spread over the repeats.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputop_dl.probe.core import flush_period
from gputop_dl.probe.messages import StepRecord, Steps, System
from gputop_dl.probe.protocol import HostRun, encode, encode_steps, pack_readings
from gputop_dl.probe.transport import Publisher
from gputop_dl.tui.record.writer import RecordWriter
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, system_sample

REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "5"))
SIZE_SECONDS = 600
CPU_SECONDS = 20.0


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):8.2f}  (min {min(values):.2f}, "
        f"max {max(values):.2f}, {len(values)} runs)"
    )


def steps_bytes(folder: Path, steps_per_s: int, as_runs: bool = False) -> float:
    """Bytes per step of a recording of steps alone: records, or runs of nanosecond
    clock readings as a settled watch loop's probe sends them (their last digits as
    varied as a real clock's)."""
    path = folder / f"steps-{steps_per_s}-{as_runs}.gtrec"
    now = [0.0]
    writer = RecordWriter(path, host=HOST, clock=lambda: now[0])
    flush_s = flush_period(steps_per_s)  # as the probe sends at this rate
    per_flush = max(1, round(steps_per_s * flush_s))
    period = 1.0 / steps_per_s
    index = 0
    for flush in range(round(SIZE_SECONDS / flush_s)):
        now[0] = flush * flush_s
        records = []
        for _ in range(per_flush):
            end = T0 + index * period
            wait = period * (0.2 + 0.1 * ((index * 7919) % 13) / 13)  # varied, as real ones
            records.append(StepRecord(index, end, period * (1 + (index % 5) / 50), wait, 32))
            index += 1
        if as_runs:
            frames = encode_steps(SOURCE_ID, T0, [], flush, 0, 0, [as_run(records)], 0)
        else:
            frames = encode(Steps(SOURCE_ID, tuple(records), flush, 0))
        writer.add(frames, T0 + now[0])
        writer.tick()
    writer.close()
    size = path.stat().st_size
    path.unlink()
    return size / index


def as_run(records: list[StepRecord]) -> HostRun:
    """``records`` as a run of readings on a nanosecond clock that read 0 at T0."""

    def ns(t: float, i: int) -> int:
        return round((t - T0) * 1e9) + (i * 7_919_993) % 997

    first = records[0]
    readings = [ns(first.end_time - first.period_s, first.index)]
    for r in records:
        start = r.end_time - r.period_s
        readings += [ns(start + (r.wait_s or 0.0), r.index + 1), ns(r.end_time, r.index + 2)]
    return HostRun(first.index, pack_readings(readings), [r.samples for r in records])


def samples_bytes(folder: Path, real: bool) -> float:
    path = folder / f"samples-{real}.gtrec"
    now = [0.0]
    writer = RecordWriter(path, host=HOST, clock=lambda: now[0])
    taken = real_samples(10) if real else []
    for second in range(SIZE_SECONDS):
        now[0] = float(second)
        if real:
            sample = taken[second % len(taken)]
            sample = dataclasses.replace(sample, time=T0 + second)  # type: ignore[type-var]
        else:
            sample = system_sample(T0 + second)
        writer.add(encode(System(SOURCE_ID, sample)), T0 + second + 0.01)
        writer.tick()
    writer.close()
    size = path.stat().st_size
    path.unlink()
    return size / SIZE_SECONDS


def real_samples(count: int) -> list[object]:
    from gputop_dl.probe.collectors.sampler import NodeSampler

    sampler = NodeSampler(main_pid=None, interval_s=0.5, host=True)
    sampler.start(thread=False)
    out = []
    for _ in range(count):
        time.sleep(0.5)
        out.append(sampler.sample())
    sampler.close()
    return out


def publish(endpoint: str, stop: threading.Event, steps_per_s: int) -> None:
    publisher = Publisher(endpoint)
    index = 0
    next_flush = time.monotonic()
    flush = 0
    # As the probe sends at this rate; without steps, a wake-up every 0.5 s for the rest.
    flush_s = flush_period(steps_per_s) if steps_per_s else 0.5
    try:
        while not stop.is_set():
            now = time.time()
            records = []
            for _ in range(round(steps_per_s * flush_s)):
                records.append(StepRecord(index, now, 0.001, 0.0003, 32))
                index += 1
            if steps_per_s:
                publisher.send(encode(Steps(SOURCE_ID, tuple(records), flush, 0)))
            if flush % round(2 / flush_s) == 0:  # a hello every 2 s
                publisher.send(encode(hello(started=T0)))
            if flush % round(1 / flush_s) == 0:  # a node sample a second
                publisher.send(encode(System(SOURCE_ID, system_sample(now))))
            flush += 1
            next_flush += flush_s
            publisher.wait(max(0.0, next_flush - time.monotonic()))
    finally:
        publisher.close()


def recorder_cpu(folder: Path, steps_per_s: int, duration: float) -> tuple[float, int]:
    """CPU seconds of one ``gputop record`` run; the bytes it wrote."""
    endpoint = f"ipc://{folder}/bench.sock"
    stop = threading.Event()
    thread = threading.Thread(target=publish, args=(endpoint, stop, steps_per_s), daemon=True)
    thread.start()
    time.sleep(0.3)
    path = folder / f"cpu-{time.monotonic_ns()}.gtrec"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "gputop_dl", "record", str(path), endpoint, "--no-local"]
    subprocess.run([*cmd, "--duration", str(duration)], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stop.set()
    thread.join(5)
    size = sum(p.stat().st_size for p in folder.glob(path.name + "*"))
    for part in folder.glob(path.name + "*"):
        part.unlink()
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, size


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="gt-rec-"))
    os.chmod(folder, 0o700)
    print("size (zstd, a chunk a second):")
    for rate in (10, 1000):
        print(f"  steps at {rate:>5}/s        {steps_bytes(folder, rate):7.1f} bytes per step")
        runs = steps_bytes(folder, rate, as_runs=True)
        print(f"    the same as runs         {runs:7.1f} bytes per step")
    print(f"  node sample (64 cores, 8 GPUs)  {samples_bytes(folder, False):7.0f} bytes")
    print(f"  node sample (this host, real)   {samples_bytes(folder, True):7.0f} bytes")
    print(f"recorder CPU ({CPU_SECONDS:g} s runs, whole process incl. start-up):")
    busy, idle, extra, sizes = [], [], [], []
    for _ in range(REPEATS):
        cpu, size = recorder_cpu(folder, 1000, CPU_SECONDS)
        base, _ = recorder_cpu(folder, 0, CPU_SECONDS)
        busy.append(100 * cpu / CPU_SECONDS)
        idle.append(100 * base / CPU_SECONDS)
        extra.append(100 * (cpu - base) / CPU_SECONDS)
        sizes.append(size / CPU_SECONDS / 1e3)
    print(f"  whole run, 1,000 steps/s       {spread(busy)} % of a core")
    print(f"  whole run, nothing to record   {spread(idle)} % of a core")
    print(f"  the difference                 {spread(extra)} % of a core")
    print(f"  written                        {spread(sizes)} kB/s")


if __name__ == "__main__":
    main()
