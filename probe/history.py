"""The publisher's drained steps: one batch per drain, kept as recent history, and cut
into ``steps`` messages for the wire (live, and replayed to a late subscriber).

A batch holds its steps as the wire carries them (docs/protocol.md, ``steps``): wire rows
(integer microseconds after ``base``) or runs (the training thread's clock readings,
nanoseconds counting from ``clock_ns`` at ``base``, packed), in index order. A drain's
batch holds one or the other; a message's body, merged from several, may hold both. A
batch is cut, kept and sent as lists and bytes: nothing here looks at each step (but the
last few periods).
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
    def last_index(self) -> int:
        if self.runs:
            run = self.runs[-1]
            return run.first + len(run.samples) - 1
        return self.rows[-1].index

    @property
    def last_end(self) -> float:
        """The Unix time its last step ended, rounded as the wire rounds it."""
        if self.runs:
            last = last_reading(self.runs[-1].readings)
            return self.base + reading_us(last, self.clock_ns) / MICROS
        return self.base + self.rows[-1].end_us / MICROS

    def periods_us(self, at_most: int) -> list[int]:
        """The periods of its last ``at_most`` steps (or fewer), whole microseconds (for
        the typical period: a run's are not rounded reading by reading, as the wire's)."""
        if not self.runs:
            return [row.period_us for row in self.rows[-at_most:]]
        # odd: from a start on
        readings = unpack_readings(self.runs[-1].readings[-(2 * at_most + 1) * READING_BYTES :])
        spans = map(sub, readings[2::2], readings[0:-1:2])
        return list(map(floordiv, spans, repeat(NS_PER_US)))

    def without_first(self, count: int) -> Batch:
        """The drained batch less its first ``count`` steps (fewer than it holds)."""
        if not self.runs:
            return Batch(self.base, self.rows[count:], clock_ns=self.clock_ns)
        runs = list(self.runs)
        while count >= len(runs[0].samples):
            count -= len(runs.pop(0).samples)
        if count:
            run = runs[0]
            readings = run.readings[2 * count * READING_BYTES :]
            runs[0] = HostRun(run.first + count, readings, run.samples[count:])
        return Batch(self.base, runs=runs, clock_ns=self.clock_ns)


def trim(history: deque[Batch], kept: int, horizon: float, at_most: int) -> int:
    """Drop batches that ended before ``horizon`` (Unix time), then the oldest steps past
    ``at_most``; return the steps left."""
    while history:
        oldest = history[0]
        steps = oldest.steps
        if oldest.last_end < horizon:
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
    cut: one longer than that goes alone), so each message's steps come after the last
    one's, and a reader's de-duplication by index keeps them all."""
    message = Batch(math.nan)  # NaN equals no base: the first batch starts a message
    steps = 0
    for batch in batches:
        if batch.base != message.base:
            if steps:
                yield message
            message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
        for run in batch.runs:
            if steps and steps + len(run.samples) > per_message:
                yield message
                message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
            message.runs.append(run)
            steps += len(run.samples)
        rows = batch.rows
        taken = 0
        while taken < len(rows):
            if steps >= per_message:
                yield message
                message, steps = Batch(batch.base, clock_ns=batch.clock_ns), 0
            part = rows[taken : taken + per_message - steps]
            message.rows.extend(part)
            steps += len(part)
            taken += len(part)
    if steps:
        yield message
