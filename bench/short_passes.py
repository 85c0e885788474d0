"""What the probe's background threads cost a step when a training loop is made of short
passes (the epochs of a small dataset, frequent short evaluations), against one long pass.

Each child runs a real probe (its node sampler on, as on local rank 0) watched by a
subscriber in another process, and a training loop of Python steps (ADDITIONS integer
additions, ~100 us here) over a list of batches with counts given, for SECONDS: either
passes of PASS_STEPS steps (``short``) or one pass (``long``). Every thread's CPU time is
read from /proc/self/task/*/schedstat, so the publisher thread, the node sampler, zmq's
I/O thread are each charged per step (the training thread's own cost is
``bench/probe_overhead.py``'s). The two kinds alternate, REPEATS times each; medians and
spreads are printed.

Each pass's first steps are timed in Python (rows), the rest in C (runs of clock
readings). Until 2026-11-27 a flush that held a pass's first step sent all its steps as
rows, which the publisher builds one by one: with passes of 200 steps at ~100 us, every
flush held one, and the publisher cost 0.5-1 us a step more than for one long pass.

Run: ``.venv/bin/python bench/short_passes.py [REPEATS]``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

REPEATS = 3
SECONDS = 8.0
ADDITIONS = 3_300
PASS_STEPS = 200  # CIFAR-10 in batches of 256 is ~196 steps an epoch
ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import glob, itertools, subprocess, sys, time
from gputop_dl import probe

kind, seconds = sys.argv[1], float(sys.argv[2])
additions, pass_steps = int(sys.argv[3]), int(sys.argv[4])
p = probe.Probe(name="short-passes", listen="tcp://127.0.0.1:*")
reader = subprocess.Popen([sys.executable, "-c", f'''
import time
from gputop_dl.probe.transport import Subscriber
s = Subscriber(); s.connect({p.endpoint!r})
end = time.monotonic() + {seconds} + 3
while time.monotonic() < end:
    s.receive(0.05, max_messages=100_000)
'''])
time.sleep(1.5)  # attached: the first hello and node sample sent


def cpu_ns() -> dict[int, int]:
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/schedstat") as f:
                out[int(task.rsplit("/", 1)[1])] = int(f.read().split()[0])
        except OSError:
            pass
    return out


def work() -> int:
    total = 0
    for i in range(additions):
        total += i
    return total


batch = ([0.0] * 32, [0] * 32)
loader = p.watch([batch] * pass_steps, samples=32)
endless = p.watch(itertools.repeat(batch), samples=32)
before, t0 = cpu_ns(), time.monotonic()
stop, steps = t0 + seconds, 0
if kind == "long":
    for _ in endless:
        work()
        steps += 1
        if steps % 200 == 0 and time.monotonic() > stop:
            break
else:
    while time.monotonic() < stop:
        for _ in loader:
            work()
            steps += 1
time.sleep(1.2)  # the last flush (every 0.5 s at these rates) is sent, and counted
after = cpu_ns()
p.close()
reader.wait()
main = __import__("threading").main_thread().native_id  # the training thread: its work
names = {p._thread.native_id: "publisher", p._sampler._thread.native_id: "sampler", main: None}
names[p._sampler._nvml._thread.native_id] = "sampler"  # its NVML reads, on their own thread
parts = {"publisher": 0, "sampler": 0, "zmq and others": 0}
for tid, ns in after.items():
    name = names.get(tid, "zmq and others")
    if name is not None:
        parts[name] += ns - before.get(tid, 0)
print(steps, *(parts[k] / steps / 1e3 for k in parts))
"""

PARTS = ("publisher", "node sampler", "zmq and others", "all three")


def child(kind: str) -> tuple[int, list[float]]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(SECONDS), str(ADDITIONS), str(PASS_STEPS)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "GPUTOP_DISABLE"},
    ).stdout.split()
    parts = [float(x) for x in out[1:]]
    return int(out[0]), [*parts, sum(parts)]


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else REPEATS
    runs: dict[str, list[tuple[int, list[float]]]] = {"long": [], "short": []}
    for _ in range(repeats):
        for kind in runs:
            runs[kind].append(child(kind))
    print(
        f"background threads' CPU a step, {ADDITIONS} additions a step, {repeats} x "
        f"{SECONDS:.0f} s each, alternated (median and range, us a step)"
    )
    for kind, results in runs.items():
        rate = statistics.median(steps for steps, _ in results) / SECONDS
        what = "one long pass" if kind == "long" else f"passes of {PASS_STEPS} steps"
        print(f"  {what} (~{rate:,.0f} steps/s):")
        for i, part in enumerate(PARTS):
            values = [parts[i] for _, parts in results]
            print(
                f"    {part:16s} {statistics.median(values):6.3f}"
                f"  ({min(values):.3f}..{max(values):.3f})"
            )


if __name__ == "__main__":
    main()
