"""Steps timed with no Python per step: the watch loop's fast path and its wire runs.

Once a pass's timing and counts are settled (host clock, counts known or counted by the
probe's own counter), ``watch`` hands the loop to a chain of C iterators: per step they
read the clock, fetch the batch, read the clock again and append both readings (integer
nanoseconds) to an array of 8-byte integers, and the generator only passes each batch
on: no Python of the probe's runs between steps but the few lines that count a batch,
when the counts are not known in advance (figures in bench/probe_overhead.py,
bench/probe_instructions.py).

A :class:`Segment` is one run of that chain, at most CHUNK_STEPS steps: its readings
alternate ``t0, t1`` per step, and a step's end is the next step's ``t0``, so with
``len(stamps) == 2k + 1`` the first k steps are complete. The training thread only appends;
the publisher thread reads complete steps by position (never mutating the array) and
sends them as they are, a wire *run* (docs/protocol.md): the bytes of a slice of the
readings and a list of counts; or, when a drain sends rows anyway, as wire rows made
column by column.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from itertools import repeat, starmap
from operator import floordiv, itemgetter, length_hint, sub
from time import perf_counter_ns
from types import WrapperDescriptorType
from typing import Any

from gputop_dl.probe.protocol import (
    NS_PER_US,
    READINGS_TYPECODE,
    HostRow,
    HostRun,
    pack_readings,
)

# Steps per segment: the Python between two segments (a new list, a closing reading)
# costs ~0.01 us a step at this size; a segment nobody drains holds ~24 KB.
CHUNK_STEPS = 1024
_batch = itemgetter(3)  # (pull, gate, t0, batch, t1) -> batch
_TRIES = 2**62  # Segment.pulls: more than any segment tries


def fetches(iterator: Iterator[Any]) -> Iterator[Any]:
    """``iterator``'s items, for a C iterator that takes it (``zip``, ``chain``): those
    call ``iter()`` on what they are given once more, which a loop over the loader never
    does. An iterator whose ``__iter__`` is not C's own may do more there than return
    itself: a loader that is its own iterator restarts its pass (FastTensorDataLoader's
    pattern: each segment of a watched pass began it again, a pass of 3,000 batches
    never ended). Such an iterator's ``__next__`` is called directly instead (as the
    interpreter calls it: the type's), which costs a torch DataLoader's ~3 instructions
    a step (callgrind); one in C (a generator, a list's) is given as it is."""
    kind = type(iterator)
    if isinstance(getattr(kind, "__iter__", None), WrapperDescriptorType):
        return iterator
    return map(kind.__next__, repeat(iterator))


class Segment:
    """Up to CHUNK_STEPS steps of one pass, timed by :meth:`timed`.

    The training thread writes everything but ``taken``; the publisher reads ``stamps``
    and ``counts`` up to what ``complete()`` says, or ``steps`` once it is set.
    """

    __slots__ = (
        "counts",
        "first",
        "full",
        "gate",
        "known",
        "last",
        "position",
        "pulls",
        "stamps",
        "steps",
        "taken",
    )

    def __init__(self, first: int, position: int, plan: tuple[int, int, int] | None) -> None:
        self.first = first  # the step index of its first step
        self.position = position  # the batch position of its first step in the pass
        # The pass's counts known in advance (loader.batch_plan): `full` samples before
        # position `known`, `last` at it; None: `counts` holds one count per step.
        self.full, self.known, self.last = plan if plan is not None else (0, -1, 0)
        self.counts: list[int | None] | None = [] if plan is None else None
        # perf_counter_ns readings, t0 and t1 of each step, stored as 8-byte integers: an
        # int object kept per reading cost the training thread 0.3-0.8 us a step more on a
        # core shared with other work (bench/probe_overhead.py), 0.1 less alone. Unsigned
        # (protocol.READINGS_TYPECODE): the cheapest append of an int.
        # Never exported (no memoryview of it): appending must not fail.
        self.stamps = array(READINGS_TYPECODE)
        # The chain takes one token of this list per step, and each step's second
        # reading adds the next one: after a fetch that raised there is none, so a
        # training that asks again (a loader that skips a bad batch) stops the chain
        # before its next reading, and the pass goes on in Python (probe/watch.py).
        # Clearing it stops the chain too (a loop entered inside this one: Probe).
        self.gate: list[None] = [None]
        # One item a step tried, first in each try: the count that tells a loader found
        # empty from a fetch that raised (fetch_raised). Never runs out.
        self.pulls = repeat(None, _TRIES)
        self.steps: int | None = None  # set when it ended: its steps, all published
        self.taken = 0  # publisher thread: steps already turned into rows

    def complete(self) -> int:
        """Steps whose three readings are in (a step's end is the next one's start)."""
        return (len(self.stamps) - 1) // 2 if self.stamps else 0

    def in_fetch(self) -> bool:
        """A fetch begun and not returned (an odd count of readings): under way, or it
        found the loader empty, or it raised. Any thread."""
        return len(self.stamps) % 2 == 1

    def fetch_raised(self) -> bool:
        """Training thread, once the chain stopped: its last fetch raised and the
        training asked for a batch again. A loader found empty stops the chain in the
        same try; a fetch that raised leaves no token, and the next try stops at the
        gate."""
        tried = _TRIES - length_hint(self.pulls)
        return self.in_fetch() and tried == len(self.stamps) // 2 + 2

    def timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """``iterator``'s batches, each fetch between two clock readings. Without a plan
        the caller appends each batch's count to ``counts`` (watch counts in its own
        frame: a Python call a step from here cost ~500 instructions more, and counting
        in C through the learned types' slot functions more still:
        docs/measurements.md)."""
        append = self.stamps.append
        # At most CHUNK_STEPS first readings: the segment's bound, before a fetch.
        begin = map(append, starmap(perf_counter_ns, repeat((), CHUNK_STEPS)))
        end = map(self.gate.append, map(append, starmap(perf_counter_ns, repeat(()))))
        # The zip's tuple, which the next step reuses, holds the step's batch until the
        # next one is fetched, as a bare loop's variable does; a loop that drops its
        # batch (`del batch`) has it freed one fetch later. Passing it through a list
        # instead cost ~370 instructions a step (+20 %; callgrind), for one batch in
        # that case only. Nothing here keeps a batch the loop has moved past
        # (itertools.tee, which fed a counter beside the loop, kept up to 56).
        fetch = fetches(iterator)
        return map(_batch, zip(self.pulls, iter(self.gate), begin, fetch, end, strict=False))

    def run(self, upto: int) -> HostRun:
        """The steps ``taken`` to ``upto`` (complete ones) as a wire run: the readings'
        bytes and the counts as they are, no object and no arithmetic per step; marks
        them taken."""
        start = self.taken
        self.taken = upto
        # A slice (a copy), not a memoryview: while one is exported the training thread's
        # next append would raise.
        return HostRun(
            self.first + start,
            pack_readings(self.stamps[2 * start : 2 * upto + 1]),
            self._counts(start, upto),
        )

    def rows(self, base_ns: int, upto: int) -> list[HostRow]:
        """Wire rows (index, end, period, data wait, samples) of steps ``taken`` to
        ``upto`` (complete ones), ends in microseconds after ``base_ns``; marks them taken.
        For a drain that sends rows anyway (phases, counts given by ``probe.step``, CUDA
        events that failed).

        Every reading is rounded to a microsecond once and durations are differences of
        rounded readings, as a reader rounds a run's readings (protocol.reading_us).
        """
        start = self.taken
        self.taken = upto
        us = list(
            map(
                floordiv,
                map(sub, self.stamps[2 * start : 2 * upto + 1], repeat(base_ns - NS_PER_US // 2)),
                repeat(NS_PER_US),
            )
        )
        ends = us[2::2]
        starts = us[0:-1:2]
        counts = self._counts(start, upto)
        first = self.first + start
        return list(
            map(
                HostRow,
                range(first, first + len(ends)),
                ends,
                map(sub, ends, starts),
                map(sub, us[1::2], starts),
                counts,
            )
        )

    def _counts(self, start: int, upto: int) -> list[int | None]:
        """The counts of its steps ``start`` to ``upto``: counted, or from the plan."""
        if self.counts is not None:
            return self.counts[start:upto]
        counts: list[int | None] = [self.full] * (upto - start)
        last_at = self.known - (self.position + start)
        if 0 <= last_at < len(counts):
            counts[last_at] = self.last
            counts[last_at + 1 :] = [None] * (len(counts) - last_at - 1)  # past the plan
        elif last_at < 0:
            counts = [None] * len(counts)
        return counts
