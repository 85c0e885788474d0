"""A run's throughput as half-second points: each step is spread over the time it took."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import StepRecord
from gputop_dl.probe.protocol import MICROS, WireStep
from gputop_dl.tui.state.clean import MAX_SKEW_S
from gputop_dl.tui.state.model import ThroughputPoint

BUCKET_S = 0.5  # one throughput point per half second of the run's clock
_US = float(MICROS)


@dataclass(slots=True)
class _Bucket:
    samples: float = 0.0
    steps: float = 0.0
    covered_s: float = 0.0
    wait_s: float = 0.0
    wait_covered_s: float = 0.0
    device_s: float = 0.0
    device_covered_s: float = 0.0


class Throughput:
    """Turns step records into half-second points, spreading each step over its period."""

    def __init__(self, max_points: int) -> None:
        self.points: deque[ThroughputPoint] = deque(maxlen=max_points)
        self._max_points = max_points
        self._open: dict[int, _Bucket] = {}
        self._last_final: int | None = None  # index of the newest finished bucket
        self._finished_any = False
        self.last_end: float | None = None
        # Seconds of the steps taken, their whole periods (a step longer than the horizon
        # too, which its buckets keep only a part of): the training loop's own time (steps
        # follow each other inside a pass; the time outside it is in none).
        self.covered_total_s = 0.0
        # The earliest end for which finish_until closes a bucket: the end of the bucket
        # after the newest finished one. Before it, a call does nothing (callers skip it).
        self.close_at = -math.inf
        # The bucket the newest rows of add_rows fell in: most of the next message's rows
        # fall in it too, and need not look for theirs.
        self._newest: int | None = None

    def add(self, records: Sequence[StepRecord]) -> None:
        """Spread each record (validated: finite, non-negative durations, newer than the
        last) over the buckets its period covers. The viewer's hot path: consecutive
        steps inside one bucket (the usual case) are summed in locals and written to
        the bucket once, by the first branch of the loop, with as few operations as
        a step can take."""
        horizon = self._max_points * BUCKET_S
        low = -math.inf if self._last_final is None else (self._last_final + 1) * BUCKET_S
        last_end = -math.inf if self.last_end is None else self.last_end
        floor = math.floor
        current = None  # index of the bucket summed in the locals below
        # Its bounds: a step with lo <= start < end <= hi falls in it alone, whole (lo is
        # past every finished bucket, and a step inside one bucket is within the horizon).
        lo, hi = math.inf, -math.inf  # no bucket yet: nothing falls in it
        samples = steps = covered = wait_s = wait_cov = device_s = device_cov = 0.0
        whole_periods = 0.0
        for record in records:
            end = record.end_time
            period = record.period_s
            whole_periods += period
            start = end - period
            if lo <= start < end <= hi:
                last_end = end  # validated: the records are oldest first
                samples += record.samples or 0
                steps += 1.0
                # The whole step is in the bucket: its period is the time covered (not
                # end - start, which rounding makes differ from it in the last bits).
                covered += period
                # The wait and the device time are spread over the step like the
                # samples: at half-second resolution their share is what matters.
                if (wait := record.wait_s) is not None:  # validated: wait <= period
                    wait_cov += period
                    wait_s += wait
                if (device := record.device_s) is not None:
                    device_cov += period
                    device_s += device if device < period else period
                continue
            whole = True
            if period >= horizon:
                start, whole = end - horizon, False
            if start < low:
                start, whole = low, False  # never reopen a finished bucket
            if end <= start:
                continue  # also every zero period: below, period > 0
            if end > last_end:
                last_end = end
            first, last = floor(start / BUCKET_S), floor(end / BUCKET_S)
            if last > first and end == last * BUCKET_S:
                last -= 1  # a step ending exactly on a boundary belongs to the bucket before
            if first != last:
                samples_of = record.samples or 0
                self._spread(
                    start, end, first, last, period, samples_of, record.wait_s, record.device_s
                )
                continue
            if first != current:
                if current is not None:
                    self._put(
                        current, samples, steps, covered, wait_s, wait_cov, device_s, device_cov
                    )
                current = first
                lo, hi = first * BUCKET_S, (first + 1) * BUCKET_S
                samples = steps = covered = wait_s = wait_cov = device_s = device_cov = 0.0
            # A step cut by the horizon or by a finished bucket: only its part after
            # ``start`` counts, and its wait and device time in proportion.
            cover = period if whole else end - start
            samples += record.samples or 0
            steps += 1.0
            covered += cover
            if (wait := record.wait_s) is not None:
                wait_cov += cover
                wait_s += wait if whole else wait * cover / period
            if (device := record.device_s) is not None:
                device_cov += cover
                device = device if device < period else period
                device_s += device if whole else device * cover / period
        if current is not None:
            self._put(current, samples, steps, covered, wait_s, wait_cov, device_s, device_cov)
        self.covered_total_s += whole_periods
        if last_end != -math.inf:
            self.last_end = last_end

    def add_rows(
        self, base: float, rows: Sequence[WireStep], received: float, last_index: int | None
    ) -> float | None:
        """The viewer's hot path: a decoded message's plausible rows (microseconds after
        ``base``; the decoder checked each duration and sample count against the limits
        of ``clean``) checked for order, clock and wait as ``clean.new_steps`` checks
        records and spread as :meth:`add` spreads them, in one pass, without making a
        StepRecord of any. Returns the samples the rows carry (None counted as 0); or
        None, with nothing changed, when a row is not a plain new one (replayed, out of
        order, too far from the viewer's clock, waiting longer than its period, without a
        period, cut by the horizon or by a finished bucket): the caller then takes the
        general path (new_steps, add) for the whole message."""
        us = _US
        horizon = self._max_points * BUCKET_S * us
        low = -math.inf if self._last_final is None else (self._last_final + 1) * BUCKET_S
        # Times in microseconds after base. Comparisons are strict: a row at a limit
        # takes the general path, which decides it.
        prev_end = (received - MAX_SKEW_S - base) * us
        if self.last_end is not None and (self.last_end - base) * us > prev_end:
            prev_end = (self.last_end - base) * us
        prev_index = -1 if last_index is None else last_index
        floor = math.floor
        # Written to the buckets once every row passed (a row may still send the whole
        # message to the general path): the sums of each bucket, the steps over several.
        puts: list[tuple[int, int, int, float, float, float, float, float]] = []
        spreads: list[tuple[float, float, int, int, float, int, float | None, float | None]]
        spreads = []
        current = self._newest  # the bucket summed in the locals below, as in add()
        if current is not None and (self._last_final is None or current > self._last_final):
            lo, hi = (current * BUCKET_S - base) * us, ((current + 1) * BUCKET_S - base) * us
        else:
            current, lo, hi = None, math.inf, -math.inf
        # Counts in ints (an int added to a float takes Python's slow path). Each row adds
        # its period to ``covered``, and to ``no_wait``/``no_device`` when it lacks that
        # time: the covered time of the waits is ``covered - no_wait`` (sums of whole
        # microseconds are exact), one addition a row fewer than a sum of its own.
        samples = steps = 0
        covered = wait_s = no_wait = device_s = no_device = 0.0
        for row in rows:
            index, end, period = row.index, row.end_us, row.period_us
            # A row is checked before anything it changes leaves the loop: a failed check
            # returns None, and the locals go with it.
            if not (index > prev_index and end > prev_end):
                return None
            prev_index, prev_end = index, end
            start = end - period
            if not lo <= start < end <= hi:
                if period >= horizon or period <= 0.0:
                    return None  # add() cuts the first, leaves the second out of last_end
                start_s, end_s = base + start / us, base + end / us
                if start_s < low:
                    return None
                first, last = floor(start_s / BUCKET_S), floor(end_s / BUCKET_S)
                if last > first and end_s == last * BUCKET_S:
                    last -= 1
                if first != last:
                    wait, device = row.wait_us, row.device_us
                    if wait is not None and wait > period:
                        return None
                    spread = (
                        start_s,
                        end_s,
                        first,
                        last,
                        period / us,
                        row.samples or 0,
                        None if wait is None else wait / us,
                        None if device is None else device / us,
                    )
                    spreads.append(spread)
                    continue
                if steps and current is not None:
                    puts.append(
                        (current, samples, steps, covered, wait_s, no_wait, device_s, no_device)
                    )
                current = first
                lo, hi = (first * BUCKET_S - base) * us, ((first + 1) * BUCKET_S - base) * us
                samples = steps = 0
                covered = wait_s = no_wait = device_s = no_device = 0.0
            wait = row.wait_us
            if wait is None:
                no_wait += period
            elif wait <= period:
                wait_s += wait
            else:
                return None
            device = row.device_us
            if device is None:
                no_device += period
            else:
                device_s += device if device < period else period
            samples += row.samples or 0
            steps += 1
            covered += period
        if not rows or prev_end > (received + MAX_SKEW_S - base) * us:
            return None if rows else 0  # the newest row too far ahead of the viewer
        if steps and current is not None:
            puts.append((current, samples, steps, covered, wait_s, no_wait, device_s, no_device))
        total = 0
        whole = 0.0  # the rows' periods, microseconds
        buckets = self._open
        # Per bucket the times summed, and the period of its steps without a wait / without
        # a device time (the part the wait and device shares do not cover).
        for index, samples, steps, covered, wait_s, no_wait, device_s, no_device in puts:
            total += samples
            bucket = buckets.get(index)
            if bucket is None:
                bucket = buckets[index] = _Bucket()
            bucket.samples += samples
            bucket.steps += steps
            bucket.covered_s += covered / us
            whole += covered
            bucket.wait_s += wait_s / us
            bucket.wait_covered_s += (covered - no_wait) / us
            bucket.device_s += device_s / us
            bucket.device_covered_s += (covered - no_device) / us
        for part in spreads:
            total += part[5]
            whole += part[4] * us
            self._spread(*part)
        self.covered_total_s += whole / us
        end_s = base + prev_end / us
        if self.last_end is None or end_s > self.last_end:
            self.last_end = end_s
        self._newest = current
        return total

    def _put(
        self,
        index: int,
        samples: float,
        steps: float,
        covered: float,
        wait_s: float,
        wait_covered: float,
        device_s: float,
        device_covered: float,
    ) -> None:
        bucket = self._open.get(index)
        if bucket is None:
            bucket = self._open[index] = _Bucket()
        bucket.samples += samples
        bucket.steps += steps
        bucket.covered_s += covered
        bucket.wait_s += wait_s
        bucket.wait_covered_s += wait_covered
        bucket.device_s += device_s
        bucket.device_covered_s += device_covered

    def _spread(
        self,
        start: float,
        end: float,
        first: int,
        last: int,
        period: float,
        samples: float,
        wait: float | None,
        device: float | None,
    ) -> None:
        """A step over several buckets: each gets the part of it that fell in it."""
        span = end - start
        wait_fraction = min(1.0, wait / period) if wait is not None and period > 0 else 0.0
        device_fraction = min(1.0, device / period) if device is not None and period > 0 else 0.0
        buckets = self._open
        for index in range(first, last + 1):
            # The overlap of [start, end] with the bucket (conditionals: no builtin calls).
            lo, hi = index * BUCKET_S, (index + 1) * BUCKET_S
            cover = (end if end < hi else hi) - (start if start > lo else lo)
            if cover <= 0.0:
                continue
            bucket = buckets.get(index)
            if bucket is None:
                bucket = buckets[index] = _Bucket()
            share = cover / span
            bucket.samples += samples * share
            bucket.steps += share
            bucket.covered_s += cover
            if wait is not None:
                bucket.wait_covered_s += cover
                bucket.wait_s += wait_fraction * cover
            if device is not None:
                bucket.device_covered_s += cover
                bucket.device_s += device_fraction * cover

    def finish_until(self, end: float) -> None:
        """Close every bucket that ends at or before ``end``: no later step can add to it."""
        if self._last_final is None:
            if not self._open:
                return
            self._last_final = min(self._open) - 1
            self.close_at = (self._last_final + 2) * BUCKET_S
        final = math.floor(end / BUCKET_S) - 1
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
        self.close_at = (final + 2) * BUCKET_S

    @staticmethod
    def _point(
        index: int, bucket: _Bucket | None, *, whole: bool = True, pending: bool = False
    ) -> ThroughputPoint:
        end = (index + 1) * BUCKET_S
        if bucket is None or bucket.covered_s <= 0.0:
            return ThroughputPoint(end, 0.0, 0.0, None, BUCKET_S, pending=pending)
        covered = BUCKET_S if whole or pending else bucket.covered_s
        wait_share = bucket.wait_s / bucket.wait_covered_s if bucket.wait_covered_s > 0 else None
        device_share = (
            bucket.device_s / bucket.device_covered_s if bucket.device_covered_s > 0 else None
        )
        return ThroughputPoint(
            end,
            bucket.samples / covered,
            bucket.steps / covered,
            wait_share,
            covered,
            pending=pending,
            device_share=device_share,
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
