"""A run's throughput as half-second points: each step is spread over the time it took."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gputop_dl.probe.messages import StepRecord
from gputop_dl.tui.state.model import ThroughputPoint

BUCKET_S = 0.5  # one throughput point per half second of the run's clock


@dataclass
class _Bucket:
    samples: float = 0.0
    steps: float = 0.0
    covered_s: float = 0.0
    wait_s: float = 0.0
    wait_covered_s: float = 0.0


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


class Throughput:
    """Turns step records into half-second points, spreading each step over its period."""

    def __init__(self, max_points: int) -> None:
        self.points: deque[ThroughputPoint] = deque(maxlen=max_points)
        self._max_points = max_points
        self._open: dict[int, _Bucket] = {}
        self._last_final: int | None = None  # index of the newest finished bucket
        self._finished_any = False
        self.last_end: float | None = None

    def add(self, record: StepRecord) -> None:
        end = record.end_time
        period = max(0.0, record.period_s)
        start = max(end - period, end - self._max_points * BUCKET_S)
        if self._last_final is not None:  # never reopen a finished bucket
            start = max(start, (self._last_final + 1) * BUCKET_S)
        if end <= start:
            return
        span = end - start
        wait = record.wait_s
        # The wait is spread over the step like the samples: at half-second resolution
        # its share is what matters, not where inside the step it fell.
        wait_fraction = min(1.0, wait / period) if wait is not None and period > 0 else 0.0
        first, last = math.floor(start / BUCKET_S), math.floor(end / BUCKET_S)
        if last > first and end == last * BUCKET_S:
            last -= 1  # a step ending exactly on a boundary belongs to the bucket before
        for index in range(first, last + 1):
            lo, hi = index * BUCKET_S, (index + 1) * BUCKET_S
            cover = _overlap(start, end, lo, hi)
            if cover <= 0.0:
                continue
            bucket = self._open.setdefault(index, _Bucket())
            share = cover / span
            bucket.samples += (record.samples or 0) * share
            bucket.steps += share
            bucket.covered_s += cover
            if wait is not None:
                bucket.wait_covered_s += cover
                bucket.wait_s += wait_fraction * cover
        self.last_end = end if self.last_end is None else max(self.last_end, end)

    def finish_until(self, end: float) -> None:
        """Close every bucket that ends at or before ``end``: no later step can add to it."""
        final = math.floor(end / BUCKET_S) - 1
        if self._last_final is None:
            if not self._open:
                return
            self._last_final = min(self._open) - 1
        if final <= self._last_final:
            return
        first = max(self._last_final + 1, final - self._max_points + 1)
        for index in range(first, final + 1):
            # The run's first bucket may start mid-way: its rate is over the time the
            # steps cover. Later, time no step covers (an epoch boundary, a pause in
            # the loop) is time without progress: rates are over the whole bucket.
            bucket = self._open.pop(index, None)
            self.points.append(self._point(index, bucket, whole=self._finished_any))
            self._finished_any = True
        for index in [i for i in self._open if i <= final]:
            del self._open[index]
        self._last_final = final

    @staticmethod
    def _point(
        index: int, bucket: _Bucket | None, *, whole: bool = True, pending: bool = False
    ) -> ThroughputPoint:
        end = (index + 1) * BUCKET_S
        if bucket is None or bucket.covered_s <= 0.0:
            return ThroughputPoint(end, 0.0, 0.0, None, BUCKET_S, pending=pending)
        covered = BUCKET_S if whole or pending else bucket.covered_s
        wait_share = bucket.wait_s / bucket.wait_covered_s if bucket.wait_covered_s > 0 else None
        return ThroughputPoint(
            end,
            bucket.samples / covered,
            bucket.steps / covered,
            wait_share,
            covered,
            pending=pending,
        )

    def pending_points(self, now: float) -> tuple[ThroughputPoint, ...]:
        """Points from the last finished bucket up to ``now`` while no step ends (a stall)."""
        if self._last_final is None:
            return ()
        newest = math.floor(now / BUCKET_S) - 1
        first = max(self._last_final + 1, newest - self._max_points + 1)
        return tuple(
            self._point(index, self._open.get(index), pending=True)
            for index in range(first, newest + 1)
        )
