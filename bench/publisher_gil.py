"""The probe's publisher beside a busy training thread: how often it takes the GIL from it.

A child process runs a real probe (no node sampler: bench/sampler_cost.py measures that
one) watched by a subscriber in another process, and a loop of steps of pure Python
(ADDITIONS integer additions: 1,200 is ~30 us a step here, 4,800 the ~110 us step of the
1 us goal) over a list of numpy batches, for SECONDS. Every time the publisher thread
lets go of the GIL, the training thread takes it; taking it back waits the switch
interval (5 ms) and forces the training thread off: one voluntary context switch of the
training thread, and futex calls on both sides. Per child it prints the steps a second,
the training thread's voluntary context switches a second, and the publisher thread's
CPU a second and a step.

Two arms, alternated, ROUNDS each:

* ``held``: the probe as it ships: sends through libzmq's ``zmq_send`` with the GIL
  held (probe/transport.py, ``held_send``);
* ``pyzmq``: the same probe sending through pyzmq, which releases the GIL around each
  frame (``held_send`` switched off in the child).

    python bench/publisher_gil.py [rounds] [seconds] [additions ...]
"""

from __future__ import annotations

import statistics
import subprocess
import sys

ROUNDS = 4
SECONDS = 6.0
ADDITIONS = (1_200, 4_800)

CHILD = r"""
import os, subprocess, sys, threading, time
import numpy as np
from gputop_dl import probe
from gputop_dl.probe import transport

arm, seconds, additions = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if arm == "pyzmq":
    transport.held_send = lambda sock: None
p = probe.Probe(name="bench", listen="tcp://127.0.0.1:*", system_interval_s=0)
reader = subprocess.Popen([sys.executable, "-c", f'''
import zmq
s = zmq.Context().socket(zmq.SUB); s.connect("{p.endpoint}"); s.subscribe(b"")
while True: s.recv()
'''])
time.sleep(1.0)  # attached: the probe is watched

def cpu_ns(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])

def switches():
    with open("/proc/thread-self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt"))

def work():
    x = 0
    for i in range(additions):
        x += i
    return x

publisher = p._thread.native_id
batches = [(np.zeros((32, 3)), np.zeros(32))] * 2_000_000
n, stop = 0, time.monotonic() + seconds
c0, s0, w0, m0 = cpu_ns(publisher), switches(), time.monotonic(), time.thread_time()
for batch in p.watch(batches):
    work()
    n += 1
    if n % 500 == 0 and time.monotonic() > stop:
        break
wall = time.monotonic() - w0
print(n / wall, (switches() - s0) / wall, (cpu_ns(publisher) - c0) / 1e6 / wall,
      (cpu_ns(publisher) - c0) / 1e3 / n, (time.thread_time() - m0) * 1e6 / n)
reader.kill()
p.close()
"""


def spread(values: tuple[float, ...], fmt: str = "{:.2f}") -> str:
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} ({low}..{high})"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else SECONDS
    sizes = [int(a) for a in sys.argv[3:]] or list(ADDITIONS)
    for additions in sizes:
        got: dict[str, list[list[float]]] = {"held": [], "pyzmq": []}
        for _ in range(rounds):
            for arm in got:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, arm, str(seconds), str(additions)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got[arm].append([float(x) for x in out.stdout.split()])
        print(f"{additions} additions a step, {rounds} rounds of {seconds:g} s, median (min..max)")
        for arm, runs in got.items():
            rate, switched, ms_per_s, us_per_step, step_us = zip(*runs, strict=True)
            print(
                f"  {arm:6s} {spread(rate, '{:.0f}')} steps/s,"
                f" step {spread(step_us, '{:.1f}')} us;"
                f" training thread {spread(switched, '{:.1f}')} switches/s;"
                f" publisher {spread(ms_per_s)} ms/s = {spread(us_per_step, '{:.3f}')} us/step"
            )


if __name__ == "__main__":
    main()
