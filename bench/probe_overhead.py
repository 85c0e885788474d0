"""Probe cost per step: ``probe.watch`` + publishing vs the same bare loop.

Both loops run over the same list of batches (a tuple holding a numpy array, so sample
inference does its usual work); a subscriber is attached, so every step is really
encoded and sent by the publisher thread. Figures: median of interleaved repeats.
Goal: <= 5 us per step.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from gputop_dl import probe
from gputop_dl.probe.transport import Subscriber

STEPS = 20_000
REPEATS = 15


def bare(batches: list[object]) -> float:
    t0 = time.perf_counter()
    for _ in batches:
        pass
    return time.perf_counter() - t0


def watched(p: probe.Probe, batches: list[object]) -> float:
    t0 = time.perf_counter()
    for _ in p.watch(batches):
        pass
    return time.perf_counter() - t0


def main() -> None:
    batches: list[object] = [(np.zeros((32, 3)), np.zeros(32))] * STEPS
    p = probe.Probe(name="bench", listen="tcp://127.0.0.1:*", system_interval_s=0)
    sub = Subscriber()
    sub.connect(p.endpoint or "")
    time.sleep(0.3)
    costs = []
    for _ in range(REPEATS):
        b = bare(batches)
        w = watched(p, batches)
        costs.append((w - b) / STEPS * 1e6)
        sub.receive(0.0, max_messages=100_000)  # keep the subscriber drained
    p.close()
    sub.close()
    print(
        f"probe cost per step: median {statistics.median(costs):.2f} us "
        f"(min {min(costs):.2f}, max {max(costs):.2f}; "
        f"{REPEATS} x {STEPS} steps, subscriber attached)"
    )


if __name__ == "__main__":
    main()
