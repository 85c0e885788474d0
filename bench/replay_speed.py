"""Replay of a 1-hour recording to a headless verdict (``gputop snapshot FILE``).

The recording is synthetic but shaped like a real one: a run at ~10 steps/s sent as the
probe sends it (a steps message every 0.2 s at this rate, probe.core.flush_period), a
hello every 2 s, and node samples at 1 Hz of a 64-core, 8-GPU node
(tests/fakes_tui.system_sample), written with the real RecordWriter (one chunk a second).
Each repeat reads the file, decodes every frame, and replays it
through the viewer state and analyzer to the verdict at its end; the figure is the whole
``gputop snapshot FILE`` process (wall and CPU, all threads, imports included), run as a
subprocess. Prints median and spread. Goal: <= 5 s.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputop_dl.probe.core import flush_period
from gputop_dl.probe.messages import StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.tui.record.writer import RecordWriter
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, system_sample

REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "5"))
SECONDS = int(os.environ.get("GPUTOP_BENCH_SECONDS", "3600"))
STEPS_PER_S = 10
# The records of one steps message, as the probe sends them at this rate (every 0.2 s).
PER_FLUSH = max(1, round(STEPS_PER_S * flush_period(STEPS_PER_S)))


def write_hour(path: Path) -> tuple[int, int]:
    """The recording; (steps, samples) in it."""
    now = [0.0]
    writer = RecordWriter(path, host=HOST, clock=lambda: now[0])
    index = sent = 0
    period = 1.0 / STEPS_PER_S
    for second in range(SECONDS):
        t = T0 + second
        now[0] = float(second)
        if second % 2 == 0:
            writer.add(encode(hello(started=T0)), t)
        wait = period * (0.1 if second < SECONDS * 0.6 else 0.6)  # a fault at 60 %
        records: list[StepRecord] = []
        for step in range(STEPS_PER_S):
            end = t + (step + 1) * period
            records.append(StepRecord(index, end, period, wait, 32, device_s=period - wait))
            index += 1
            if len(records) == PER_FLUSH:
                writer.add(encode(Steps(SOURCE_ID, tuple(records), sent, 0)), end + 0.005)
                records, sent = [], sent + 1
        writer.add(encode(System(SOURCE_ID, system_sample(t + 0.5))), t + 0.52)
        writer.tick()
    writer.close()
    return index, SECONDS


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="gputop-replay-"))
    path = folder / "hour.gtrec"
    steps, samples = write_hour(path)
    size = path.stat().st_size
    print(
        f"recording: {SECONDS / 3600:g} h, {steps} steps, {samples} node samples (64 cores, "
        f"8 GPUs), {size / 1e6:.1f} MB"
    )
    walls, cpus = [], []
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "gputop_dl", "snapshot", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    verdict = next(line for line in out.stdout.splitlines() if "verdict:" in line)
    print(f"verdict at the end: {verdict.strip()}")
    for name, values in (("wall", walls), ("CPU (all threads)", cpus)):
        print(
            f"  gputop snapshot FILE  {name:<18} median {statistics.median(values):6.2f} s"
            f"  (min {min(values):.2f}, max {max(values):.2f}, {REPEATS} runs)"
        )
    print("goal: <= 5 s")
    path.unlink()
    folder.rmdir()


if __name__ == "__main__":
    main()
