"""The publisher's drained steps: one batch per drain, kept as recent history, and cut
into ``steps`` messages for the wire (live, and replayed to a late subscriber).

A batch holds its steps as the wire carries them (docs/protocol.md, ``steps``): wire rows
(integer microseconds after ``base``) or runs (the training thread's clock readings,
nanoseconds counting from ``clock_ns`` at ``base``, packed), each in index order. A drain's
batch holds runs for the steps the training thread timed in C and rows for the rest (a
pass's first steps, timed in Python); the two never share an index, so its steps in
index order are its :func:`parts`. A batch is cut, kept and sent as lists and bytes:
nothing here looks at each step (but the last few periods, and a row's index where rows
and runs mix).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import floordiv, sub

from gputop_dl.probe.protocol import (
    MICROS,
    NS_PER_US,
    READING_BYTES,
    HostRow,
    HostRun,
    last_reading,
    reading_us,
    unpack_readings,
)


@dataclass(frozen=True, slots=True)
class Batch:
    """The steps of one drain, in index order."""

    base: float  # Unix time the rows' ends and the runs' readings count from
    rows: list[HostRow] = field(default_factory=list)
    runs: list[HostRun] = field(default_factory=list)
    clock_ns: int = 0  # the training thread's clock (the runs' readings) at ``base``

    @property
    def steps(self) -> int:
        return len(self.rows) + sum(len(run.samples) for run in self.runs)

    @property
    def _ends_in_run(self) -> bool:
        """Whether its last step is a run's (else a row's)."""
        if not self.runs:
            return False
        return not self.rows or _run_last(self.runs[-1]) > self.rows[-1].index

    @property
    def last_index(self) -> int:
        if self._ends_in_run:
            return _run_last(self.runs[-1])
        return self.rows[-1].index

    @property
    def last_end(self) -> float:
        """The Unix time its last step ended, rounded as the wire rounds it."""
        if self._ends_in_run:
            last = last_reading(self.runs[-1].readings)
            return self.base + reading_us(last, self.clock_ns) / MICROS
        return self.base + self.rows[-1].end_us / MICROS

    def periods_us(self, at_most: int) -> list[int]:
        """The periods of its last ``at_most`` steps (or fewer) in index order, whole
        microseconds (for the typical period: a run's are not rounded reading by reading,
        as the wire's). Rows and runs alike: a short pass's first step, a row, is slower
        than the rest."""
        tail: list[list[int]] = []
        left = at_most
        for part in reversed(list(parts(self))):
            if left <= 0:
                break
            if isinstance(part, HostRun):
                # odd: from a start on
                packed = part.readings[-(2 * left + 1) * READING_BYTES :]
                readings = unpack_readings(packed)
                spans = map(sub, readings[2::2], readings[0:-1:2])
                periods = list(map(floordiv, spans, repeat(NS_PER_US)))
            else:
                periods = [row.period_us for row in part[-left:]]
            tail.append(periods)
            left -= len(periods)
        return [period for periods in reversed(tail) for period in periods]

    def without_first(self, count: int) -> Batch:
        """The drained batch less its first ``count`` steps in index order (fewer than it
        holds)."""
        rows: list[HostRow] = []
        runs: list[HostRun] = []
        for part in parts(self):
            if isinstance(part, HostRun):
                steps = len(part.samples)
                if count >= steps:
                    count -= steps
                    continue
                if count:
                    readings = part.readings[2 * count * READING_BYTES :]
                    part = HostRun(part.first + count, readings, part.samples[count:])
                    count = 0
                runs.append(part)
            else:
                rows += part[count:]
                count = max(0, count - len(part))
        return Batch(self.base, rows, runs, self.clock_ns)


def _run_last(run: HostRun) -> int:
    return run.first + len(run.samples) - 1


def parts(batch: Batch) -> Iterator[HostRun | list[HostRow]]:
    """The batch's steps in index order: its runs, and its rows in lists of those
    between two runs (rows and runs never share an index: a run holds consecutive
    steps)."""
    rows, runs = batch.rows, batch.runs
    if not runs:
        if rows:
            yield rows
        return
    if not rows:
        yield from runs
        return
    taken = 0
    for run in runs:
        upto = taken
        while upto < len(rows) and rows[upto].index < run.first:
            upto += 1
        if upto > taken:
            yield rows[taken:upto]
            taken = upto
        yield run
    if taken < len(rows):
        yield rows[taken:]


def trim(history: deque[Batch], kept: int, horizon: float, at_most: int, at_least: int = 0) -> int:
    """Drop batches that ended before ``horizon`` (Unix time), unless that would leave
    fewer than ``at_least`` steps, then the oldest steps past ``at_most``; return the
    steps left."""
    while history:
        oldest = history[0]
        steps = oldest.steps
        if oldest.last_end < horizon and kept - steps >= at_least:
            history.popleft()
            kept -= steps
        elif kept > at_most:
            excess = kept - at_most
            if excess >= steps:
                history.popleft()
                kept -= steps
            else:
                history[0] = oldest.without_first(excess)
                kept -= excess
        else:
            break
    return kept


def messages(batches: Iterable[Batch], per_message: int) -> Iterator[Batch]:
    """``batches`` (in index order) as the bodies of ``steps`` messages: consecutive
    batches of one base merged, at most ``per_message`` steps in each (a run is never
    cut: one longer than that goes alone), cut in index order, so each message's steps
    come after the last one's, and a reader's de-duplication by index keeps them all."""
    message = Batch(math.nan)  # NaN equals no base: the first batch starts a message
    steps = 0
    for batch in batches:
        if batch.base != message.base:
            if steps:
                yield message
            message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
        for part in parts(batch):
            if isinstance(part, HostRun):
                if steps and steps + len(part.samples) > per_message:
                    yield message
                    message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
                message.runs.append(part)
                steps += len(part.samples)
                continue
            taken = 0
            while taken < len(part):
                if steps >= per_message:
                    yield message
                    message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
                rows = part[taken : taken + per_message - steps]
                message.rows.extend(rows)
                steps += len(rows)
                taken += len(rows)
    if steps:
        yield message
