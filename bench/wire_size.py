"""Bytes per step record on the wire (protocol 2: a msgpack array of integers per record,
times in microseconds, the end after the message's base time), for the record shapes a
training produces, what a 2 000-record steps message weighs, and the CPU a reader spends
decoding it into float-seconds records (median and spread of repeats).

    python bench/wire_size.py
"""

from __future__ import annotations

import statistics
import time

import msgspec

from gputop_dl.probe.messages import StepRecord, Steps
from gputop_dl.probe.protocol import decode, encode, wire_rows

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


def main() -> None:
    print("bytes per step record, 100 ms into its message (goal <= 40)")
    for name, record in SHAPES.items():
        # the message's first step ended 100 ms earlier (one flush): a typical offset
        first = StepRecord(record.index - 8, record.end_time - 0.1, 0.0123, None, None)
        _base, rows = wire_rows((first, record))
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
        frames = encode(Steps("node-1:12345", records, 10, 0))
        size = len(frames[1])
        costs = []
        for _ in range(REPEATS):
            c0 = time.process_time()
            decode(frames)
            costs.append((time.process_time() - c0) / n * 1e6)
        q = statistics.quantiles(costs, n=4)
        print(
            f"  {n} x {name:<28} {size / 1024:6.1f} KiB ({size / n:.1f} B/step);"
            f" decode {statistics.median(costs):.3f} us/step (IQR {q[0]:.3f}..{q[2]:.3f})"
        )


if __name__ == "__main__":
    main()
