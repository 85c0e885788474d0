"""Bytes per step record on the wire (protocol 2: a msgpack array of integers per record,
times in microseconds, the end after the message's base time), for the record shapes a
training produces, what a 2 000-record steps message weighs, and the CPU a reader spends
decoding it into float-seconds records (median and spread of repeats).

Host-timed records are the rows the probe itself builds (``Probe._drain``): they stop at
the last field that is set, as docs/protocol.md allows. The others come from
``wire_rows``, which writes every field. A settled ``watch`` loop's steps go as a run
(docs/protocol.md, "StepRun"): its clock readings and counts, made here as the fast
path's Segment makes them.

    python bench/wire_size.py
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import msgspec

from gputop_dl.probe.core import Probe, _DrainState
from gputop_dl.probe.messages import StepRecord
from gputop_dl.probe.protocol import decode, encode_steps, wire_rows
from gputop_dl.probe.stamps import Segment

REPEATS = 30

NOW = time.time()
SHAPES = {
    "host timing, watch()": StepRecord(123_456, NOW, 0.0123, 0.0021, 256),
    "host timing, probe.step()": StepRecord(123_456, NOW, 0.0123, None, 256),
    "CUDA events": StepRecord(123_456, NOW, 0.0123, 0.0021, 256, 0.0101, 0.0004, (), True),
    "CUDA events + h2d phase": StepRecord(
        123_456, NOW, 0.0123, 0.0021, 256, 0.0101, 0.0004, (("h2d", 0.0011),), False
    ),
}


def probe_rows(records: tuple[StepRecord, ...]) -> tuple[float, list[Any]]:
    """The probe's own rows for host-timed ``records`` (CUDA-timed ones: wire_rows)."""
    if records[-1].device_s is not None:
        return wire_rows(records)
    os.environ["GPUTOP_DISABLE"] = "1"  # no socket, no thread: only the drain is used
    p = Probe(name="wire-size")
    for r in records:  # perf_counter-like times: the end as given, the start a period before
        t0 = r.end_time - r.period_s
        t1 = -1.0 if r.wait_s is None else t0 + r.wait_s
        p._steps.append((r.index, t0, t1, r.end_time, r.samples, None, None))
    batch = p._drain(_DrainState(), 0.0, force=True)
    p.close()
    assert batch is not None
    return batch.base, list(batch.rows)


def main() -> None:
    print("bytes per step record, 100 ms into its message (goal <= 40)")
    for name, record in SHAPES.items():
        # the message's first step ended 100 ms earlier (one flush): a typical offset
        first = StepRecord(record.index - 8, record.end_time - 0.1, 0.0123, None, None)
        _base, rows = probe_rows((first, record))
        print(f"  {name:<28} {len(msgspec.msgpack.encode(rows[1])):>4} B")
    for name, record in SHAPES.items():
        n = 2_000
        records = tuple(
            StepRecord(
                record.index + i,
                record.end_time + i * record.period_s,
                *[getattr(record, f) for f in record.__struct_fields__[2:]],
            )
            for i in range(n)
        )
        base, rows = probe_rows(records)
        frames = encode_steps("node-1:12345", base, rows, 10, 0, 0)
        size = len(frames[1])
        costs = []
        for _ in range(REPEATS):
            c0 = time.process_time()
            decode(frames)
            costs.append((time.process_time() - c0) / n * 1e6)
        show(f"{n} x {name}", size, n, costs)
    # A run: 12.3 ms steps, 2.1 ms waits, 256 samples each from the DataLoader's plan.
    sizes = {}
    for n in (1, 2_000):
        segment = Segment(123_456, 0, (256, 10**9, 256))
        t = time.perf_counter_ns()
        for _ in range(n):
            segment.stamps.extend([t, t + 2_100_000])
            t += 12_300_000
        segment.stamps.append(t)
        first_end = segment.stamps[2]  # the base: the message's first end, as the probe's
        frames = encode_steps("node-1:12345", NOW, [], 10, 0, 0, [segment.run(n)], first_end)
        sizes[n] = len(frames[1])
    costs = []
    for _ in range(REPEATS):
        c0 = time.process_time()
        decode(frames)
        costs.append((time.process_time() - c0) / n * 1e6)
    print(f"  a run, per step after the first: {(sizes[n] - sizes[1]) / (n - 1):.1f} B")
    show(f"{n} x a run (watch, settled)", sizes[n], n, costs)


def show(name: str, size: int, n: int, costs: list[float]) -> None:
    q = statistics.quantiles(costs, n=4)
    print(
        f"  {name:<36} {size / 1024:6.1f} KiB ({size / n:.1f} B/step);"
        f" decode {statistics.median(costs):.3f} us/step (IQR {q[0]:.3f}..{q[2]:.3f})"
    )


if __name__ == "__main__":
    main()
