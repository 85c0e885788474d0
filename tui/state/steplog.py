"""A run's recent step records, kept as the messages brought them.

Each chunk is the accepted part of one message: a decoded message's ``StepRows`` (wire
rows, made StepRecords only when something reads them) or a list of StepRecords. The
viewer takes in every step but reads few (the analyzer's window, an export): keeping the
chunks saves converting the others. Reads see one sequence of StepRecords, oldest first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice

from gputop_dl.probe.messages import StepRecord
from gputop_dl.probe.protocol import StepRows


def _end_at(chunk: Sequence[StepRecord], position: int) -> float:
    if type(chunk) is StepRows:
        return chunk.end_at(position)
    return chunk[position].end_time


class StepLog:
    """At most ``maxlen`` records (the oldest go first), in chunks; ``len``, truth,
    iteration both ways and ``popleft`` as a deque of StepRecords has them."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._chunks: deque[Sequence[StepRecord]] = deque()
        self._skip = 0  # records of the first chunk already dropped
        self._len = 0
        # The end of the oldest record, or earlier (popleft leaves it behind); inf: none.
        # drop_before need not be called while it is recent.
        self.oldest_end = math.inf

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def extend(self, chunk: Sequence[StepRecord], count: int) -> None:
        """Append ``chunk`` of ``count`` records (kept, not copied: it must not change),
        dropping the oldest records beyond ``maxlen``."""
        if not count:
            return
        self._chunks.append(chunk)
        self._len += count
        if self._len > self.maxlen:
            self.drop_oldest(self._len - self.maxlen)
        elif self._len == count:
            self.oldest_end = _end_at(chunk, 0)

    def popleft(self) -> None:
        """Drop the oldest record (without making a StepRecord of it). Called in a loop
        by whoever trims many runs: ``oldest_end`` is left as it is (only records that
        ended later remain)."""
        if not self._len:
            raise IndexError("pop from an empty StepLog")
        self._len -= 1
        self._skip += 1
        if self._skip == len(self._chunks[0]):
            self._chunks.popleft()
            self._skip = 0

    def drop_before(self, end: float, keep: int) -> None:
        """Drop the records that ended before ``end``, but never the newest ``keep``."""
        chunks = self._chunks
        self.oldest_end = _end_at(chunks[0], self._skip) if chunks else math.inf
        while self._len > keep and self.oldest_end < end:
            first = chunks[0]
            whole = len(first) - self._skip
            if self._len - whole >= keep and _end_at(first, len(first) - 1) < end:
                self.drop_oldest(whole)  # the whole chunk: one step
            else:
                self.drop_oldest(1)

    def drop_oldest(self, count: int) -> None:
        """Drop the ``count`` oldest records (at most all of them), a chunk at a time."""
        count = min(count, self._len)
        chunks = self._chunks
        self._len -= count
        while count:
            left = len(chunks[0]) - self._skip
            if count < left:
                self._skip += count
                break
            chunks.popleft()
            self._skip = 0
            count -= left
        self.oldest_end = _end_at(chunks[0], self._skip) if chunks else math.inf

    def periods(self, count: int) -> list[float]:
        """The periods (seconds) of the newest ``count`` records, newest first, read from
        the rows of chunks nobody has read as records."""
        periods: list[float] = []
        for position, chunk in enumerate(reversed(self._chunks)):
            skip = self._skip if position == len(self._chunks) - 1 else 0
            want = count - len(periods)
            if type(chunk) is StepRows:
                periods.extend(reversed(chunk.periods(max(skip, len(chunk) - want))))
            else:
                records = chunk[max(skip, len(chunk) - want) :]
                periods.extend(record.period_s for record in reversed(records))
            if len(periods) >= count:
                break
        return periods

    def __iter__(self) -> Iterator[StepRecord]:
        skip = self._skip
        for chunk in list(self._chunks):
            yield from islice(chunk, skip, None) if skip else chunk
            skip = 0

    def __reversed__(self) -> Iterator[StepRecord]:
        chunks = list(self._chunks)
        for position in range(len(chunks) - 1, -1, -1):
            chunk = chunks[position]
            records = chunk.records() if type(chunk) is StepRows else chunk
            stop = self._skip if position == 0 else 0
            for i in range(len(records) - 1, stop - 1, -1):
                yield records[i]
