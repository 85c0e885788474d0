"""What a recorder leaves out: the repeats of a probe's history replays.

Every subscription a probe sees (another viewer attaching, one re-subscribing) makes it
send its recent history to every subscriber (docs/protocol.md, "History on attach"): the
steps of the last 120 s and its last 60 node samples, again. A viewer de-duplicates them
as they come (by step index); a recording kept them, and grew by a replay each time any
viewer attached to a probe it recorded. A message is left out when everything in it is
recorded already; a replay that brings steps or samples the recorder missed live (a full
queue) is kept, and fills the gap. The last ``steps`` message of a replay holds the
steps not sent live yet (the probe holds them back while a replay is due): it is
recorded with only those, encoded again (the same values: the decoder's rows, the same
base time, counters), unless it is of a later protocol version than this reader's,
whose fields this encoder would drop.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from gputop_dl.probe.messages import Hello, Steps, System
from gputop_dl.probe.protocol import (
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    ProtocolError,
    StepRows,
    decode,
    encode_steps,
    topic,
)

Span = tuple[int, int]  # step indices first..last, both included

MAX_SOURCES = 1024  # publishers remembered; the first heard from is forgotten first
MAX_SPANS = 64  # index spans kept per publisher (more only where steps were missed)
SAMPLE_TIMES = 256  # node sample times kept per publisher (a replay repeats 60)
# Only these carry what a replay repeats in bulk (a hello tells the run's state: kept).
_TOPICS = frozenset({topic("hello"), topic("steps"), topic("system")})


class _Version(msgspec.Struct):
    v: tuple[int, int]


_version = msgspec.msgpack.Decoder(_Version)


def _encoded_by_us(payload: bytes) -> bool:
    """Whether a message's every field is one this reader decodes (its version is not
    later than ours): then encoding it again loses nothing."""
    try:
        major, minor = _version.decode(payload).v
    except msgspec.MsgspecError:
        return False
    return major == PROTOCOL_MAJOR and minor <= PROTOCOL_MINOR


def spans_of(indices: Iterable[int]) -> list[Span]:
    """The indices as sorted, disjoint spans of consecutive ones."""
    spans: list[Span] = []
    for index in sorted(set(indices)):
        if spans and index == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], index)
        else:
            spans.append((index, index))
    return spans


class Spans:
    """Step indices seen, as sorted disjoint spans; at most ``limit``, the lowest go
    first (a replay repeats only the recent past)."""

    def __init__(self, limit: int = MAX_SPANS) -> None:
        self.limit = limit
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    @property
    def spans(self) -> list[Span]:
        return list(zip(self._firsts, self._lasts, strict=True))

    def has(self, index: int) -> bool:
        at = bisect_right(self._firsts, index) - 1
        return at >= 0 and self._lasts[at] >= index

    def covers(self, spans: Sequence[Span]) -> bool:
        """Whether every index of ``spans`` is among those seen."""
        for first, last in spans:
            at = bisect_right(self._firsts, first) - 1
            if at < 0 or self._lasts[at] < last:
                return False
        return True

    def add(self, spans: Sequence[Span]) -> None:
        merged: list[list[int]] = []
        for first, last in sorted([*self.spans, *spans]):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        merged = merged[-self.limit :]
        self._firsts = [first for first, _ in merged]
        self._lasts = [last for _, last in merged]


@dataclass
class _Seen:
    """What one publisher's recorded messages held."""

    started: float | None = None  # its hello's: another means a new process (pid reused)
    steps: Spans = field(default_factory=Spans)
    sample_times: set[float] = field(default_factory=set)
    sample_order: deque[float] = field(default_factory=deque)

    def sample_seen(self, time: float) -> bool:
        """Whether a node sample taken at ``time`` was recorded; remembers it if not."""
        if time in self.sample_times:
            return True
        self.sample_times.add(time)
        self.sample_order.append(time)
        if len(self.sample_order) > SAMPLE_TIMES:
            self.sample_times.discard(self.sample_order.popleft())
        return False


class Repeats:
    """Tells what of a message a recorder has recorded already (:meth:`news`). For one
    thread: the source's, which calls the recorder's tap."""

    def __init__(self) -> None:
        self._sources: dict[str, _Seen] = {}

    def _of(self, source_id: str) -> _Seen:
        seen = self._sources.get(source_id)
        if seen is None:
            if len(self._sources) >= MAX_SOURCES:
                del self._sources[next(iter(self._sources))]
            seen = self._sources[source_id] = _Seen()
        return seen

    def news(self, frames: list[bytes]) -> list[bytes] | None:
        """The frames to record for the message in ``frames``: themselves, a ``steps``
        message cut to the steps not recorded yet, or None when it repeats only what
        was recorded. What is returned is taken as recorded."""
        if not frames or bytes(frames[0]) not in _TOPICS:
            return frames
        try:
            message = decode(frames)
        except ProtocolError:
            return frames  # recorded as it came: a replay shows the reader's own verdict
        if isinstance(message, Hello):
            seen = self._of(message.source_id)
            if seen.started is not None and seen.started != message.started:
                self._sources[message.source_id] = seen = _Seen()  # another process
            seen.started = message.started
            return frames
        if isinstance(message, Steps):
            return self._steps(frames, message)
        if isinstance(message, System):
            return None if self._of(message.source_id).sample_seen(message.sample.time) else frames
        return frames

    def _steps(self, frames: list[bytes], message: Steps) -> list[bytes] | None:
        records = message.records
        # As decode makes them: the wire rows, none read yet (the source decodes its own).
        assert isinstance(records, StepRows) and records.rows is not None
        rows = records.rows
        spans = spans_of(row.index for row in rows)
        if not spans:
            return frames  # its counters (sent, dropped) are news
        steps = self._of(message.source_id).steps
        if steps.covers(spans):
            return None
        fresh = [row for row in rows if not steps.has(row.index)]
        steps.add(spans)
        if len(fresh) == len(rows) or not _encoded_by_us(frames[1]):
            return frames
        return encode_steps(
            message.source_id,
            records.base,
            fresh,
            message.sent,
            message.dropped,
            message.dropped_steps,
        )
