"""The probe's cost to the training thread on a core shared with other processes, each
round's children held to one common window.

``bench/probe_overhead.py`` runs a round's children at once on one CPU from one signal
to their own ends; the slowest (the probe) then runs alone for its last steps, with the
core to itself. Here every child loops until a deadline and reads its training thread's
CPU time and its step count at two instants inside that window, the same instants for
all, so all of them share the core for the whole measurement. The figure is the
training thread's CPU per step above the round's bare child (the publisher's own thread
is not in it: ``probe_overhead.py`` gives that part).

Children, each over a list of numpy batches with ADDITIONS additions of Python work a
step (1,200 by default, ~27 us here; 4,800 make the ~110 us step the goal was set with):
``bare``; ``floor`` (a generator that reads the clock around ``next()``); ``counted`` (a
probe's ``watch``, each batch counted); ``asleep`` (the same, its publisher never
waking once the steps have begun: what its drains cost the loop is ``counted`` less
this); ``known`` (``watch`` with ``samples=32``: no batch looked at); ``idle`` (a probe
created but not watching, the bare loop: what its threads cost the loop by being
there). No subscriber is attached: the publisher drains and keeps the steps but, since
2026-11-26, encodes and sends none while no peer is connected (the replay on attach
carries them; before, it sent them all the same and zmq dropped them). The probes run
without the node sampler (``system_interval_s=0``): ``probe_overhead.py`` and
``sampler_cost.py`` give its cost. Run: ``python bench/probe_window.py [rounds]
[additions]`` (``spread`` and the children's CPU as ``probe_overhead.py`` has them).
Figures (2026-11-26/27) are in docs/measurements.md.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.probe_overhead import ADDITIONS, STEP_AND_FLOOR, other_cpus, spread

KINDS = ("bare", "floor", "counted", "asleep", "known", "idle")
# The asleep child's publisher period once steps come: longer than any round.
ASLEEP_FLUSH_S = 1000.0
WINDOW = (0.7, 3.7, 4.4)  # seconds after the start: measure from, measure to, stop
LEAD_S = 4.0  # from launch to the start: every child has imported and built its loop

CHILD = (
    r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})  # before any thread starts: all inherit it
import numpy as np
from gputop_dl import probe

kind, start = sys.argv[1], float(sys.argv[2])
batches = [(np.zeros((32, 4)), np.zeros(32))] * 400_000

ADDITIONS = int(sys.argv[7])
"""
    + STEP_AND_FLOOR
    + r"""
p = None
if kind not in ("bare", "floor"):
    asleep = {"flush_interval_s": float(sys.argv[8])} if kind == "asleep" else {}
    p = probe.Probe(name="window", listen="tcp://127.0.0.1:*", system_interval_s=0, **asleep)
loop = {
    "bare": lambda: iter(batches),
    "floor": lambda: two_clock_reads(batches),
    "counted": lambda: p.watch(batches),
    "asleep": lambda: p.watch(batches),
    "known": lambda: p.watch(batches, samples=32),
    "idle": lambda: iter(batches),
}[kind]()

def timed(loop):
    perf, cpu = time.perf_counter, time.thread_time_ns
    since, until, stop = (start + float(s) for s in sys.argv[4:7])
    while perf() < start:
        time.sleep(0.001)
    steps = 0
    first = last = None
    for _ in loop:
        work()
        steps += 1
        if not steps & 31:  # every child reads the clock as often
            now = perf()
            if first is None and now >= since:
                first = (cpu(), steps)
            elif last is None and now >= until:
                last = (cpu(), steps)
            elif now >= stop:
                break
    return (last[0] - first[0]) / (last[1] - first[1]) / 1e3

print(timed(loop))
if p is not None:
    p.close()
"""
)


def round_of(cpu: int, seed: int, additions: int) -> dict[str, float]:
    """One round: every kind at once on ``cpu``, the training thread's us a step."""
    start = time.perf_counter() + LEAD_S  # CLOCK_MONOTONIC: one clock for every child
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    kinds = random.sample(KINDS, len(KINDS))
    running = {
        kind: subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                kind,
                str(start),
                str(cpu),
                *map(str, WINDOW),
                str(additions),
                str(ASLEEP_FLUSH_S),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for kind in kinds
    }
    out = {kind: child.communicate()[0].strip() for kind, child in running.items()}
    for kind, child in running.items():
        assert child.returncode == 0 and out[kind], f"the {kind} child failed"
    return {kind: float(line) for kind, line in out.items()}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    additions = int(sys.argv[2]) if len(sys.argv) > 2 else ADDITIONS
    shared = other_cpus()  # the children's CPU; on a one-CPU machine, that one
    cpu = shared[0] if shared is not None else next(iter(os.sched_getaffinity(0)))
    results = [round_of(cpu, random.randrange(2**32), additions) for _ in range(rounds)]
    bare = [r["bare"] for r in results]
    print(
        f"training thread's CPU a step above a bare child, {rounds} rounds of "
        f"{len(KINDS)} children at once on CPU {cpu}, held to one window "
        f"({WINDOW[1] - WINDOW[0]:.0f} s), {additions} additions a step; "
        f"bare step {statistics.median(bare):.1f} us"
    )
    for kind in KINDS[1:]:
        print(f"  {kind + ':':<9} {spread([r[kind] - r['bare'] for r in results])}")


if __name__ == "__main__":
    main()
