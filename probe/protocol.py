"""Encode and decode gputop messages: msgpack in two ZeroMQ frames, via msgspec.

Frame 1 is the topic (``b"gputop.<kind>"``), frame 2 the msgpack payload
``{"v": [major, minor], "kind": str, "body": {...}}``. Decoding is total: every input
either becomes a typed message whose fields passed the limits in the message types
(lengths, finite numbers, ranges) or raises :class:`ProtocolError` -- never anything
else. Nothing is ever unpickled. See ``docs/protocol.md``.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import pairwise, repeat
from operator import attrgetter, floordiv, sub
from typing import Annotated, Any, overload

import msgspec

from gputop_dl.probe.messages import (
    MAX_RECORDS,
    Bye,
    Hello,
    Loop,
    Message,
    Stack,
    StepRecord,
    Steps,
    System,
)
from gputop_dl.probe.samples import Count, Str, Time

PROTOCOL_MAJOR = 2
PROTOCOL_MINOR = 0
TOPIC_PREFIX = b"gputop."
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_TOPIC_BYTES = 64

KINDS: dict[str, type[Any]] = {
    "hello": Hello,
    "steps": Steps,
    "system": System,
    "loop": Loop,
    "bye": Bye,
    "stack": Stack,
}
KIND_OF: dict[type[Any], str] = {cls: kind for kind, cls in KINDS.items()}
_VERSION = (PROTOCOL_MAJOR, PROTOCOL_MINOR)


class ProtocolError(Exception):
    """Input that is not a valid gputop message."""


class MalformedMessage(ProtocolError):
    pass


class UnknownKind(MalformedMessage):
    """A well-formed message of a kind this reader does not know (a newer minor version
    may add kinds): readers skip it silently."""


class IncompatibleVersion(ProtocolError):
    """A peer speaks a major protocol version this reader does not know."""

    def __init__(self, theirs: tuple[int, int], source_id: str | None = None) -> None:
        self.theirs = theirs
        self.source_id = source_id  # read opportunistically from the body, may be None
        super().__init__(
            f"incompatible protocol version {theirs[0]}.{theirs[1]}"
            f" (this gputop reads {PROTOCOL_MAJOR}.x, speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR})"
        )


_Short = Annotated[str, msgspec.Meta(max_length=64)]
_Version = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class _Envelope(msgspec.Struct):
    v: tuple[_Version, _Version]
    kind: _Short
    body: msgspec.Raw


class _SourceOnly(msgspec.Struct):
    source_id: Annotated[str, msgspec.Meta(max_length=255)] | None = None


# Step records on the wire (docs/protocol.md, "StepRecord"): integers, not floats. A
# msgpack float costs 9 bytes, a duration in microseconds 3 (under 65 ms) or 5; the end
# time is an offset from the message's `base_time`. The viewer's StepRecord keeps floats
# in seconds: StepRows converts when a record is first read.
MICROS = 1_000_000
TIME_MAX = 1e10  # the Unix-time range every reader enforces (probe.samples.Time)
# A duration: [0, 1e7] s. Read as a whole float: msgspec turns the msgpack integer into a
# float in C, and the viewer's ingest compares and sums these with floats, which Python
# does faster than an int with a float (its hot path). multiple_of keeps
# every fraction out (a writer sends integers; a whole float would be read the same).
_MAX_US = 1e13  # a step record's microseconds (an end after base_time, a duration)
_Micros = Annotated[float, msgspec.Meta(ge=0, le=_MAX_US, multiple_of=1)]
_MAX_OFFSET_S = 1e7
# A run's clock readings are nanoseconds; each is rounded to the nearest microsecond once
# (docs/protocol.md, "StepRun"): reading_us, and the same in C maps where many are.
NS_PER_US = 1000
_end_us = attrgetter("end_us")
_index = attrgetter("index")
_samples = attrgetter("samples")
_phases = attrgetter("phases")


# gc=False: a record holds numbers, strings and tuples of them (no cycles possible), so
# the collector need not track the many thousands a viewer decodes.
class WireStep(msgspec.Struct, array_like=True, frozen=True, gc=False):
    index: Count
    end_us: _Micros  # the step's end, microseconds after the message's base_time
    period_us: _Micros
    wait_us: _Micros | None
    samples: Count | None
    device_us: _Micros | None = None
    device_idle_us: _Micros | None = None
    phases: Annotated[tuple[tuple[Str, _Micros], ...], msgspec.Meta(max_length=64)] = ()
    device_caught_up: bool | None = None


class HostRow(msgspec.Struct, array_like=True, gc=False):
    """A host-timed step record as the probe encodes it: :class:`WireStep`'s first five
    fields (the rest take their defaults). Not tracked by the garbage collector (numbers,
    strings and tuples of them: no cycles): a fast run makes tens of thousands a second,
    and as tuples their allocations set off collections that cost the publisher 0.13-0.16
    us a step (bench/probe_overhead.py)."""

    index: int
    end_us: int
    period_us: int
    wait_us: int | None
    samples: int | None


class WireRow(HostRow, array_like=True, gc=False):
    """A step record with device times or phases: all of :class:`WireStep`'s fields."""

    device_us: int | None = None
    device_idle_us: int | None = None
    phases: tuple[tuple[str, int], ...] = ()
    device_caught_up: bool | None = None


class HostRun(msgspec.Struct, array_like=True, gc=False):
    """Steps the probe timed in a row (docs/protocol.md, "StepRun"): the clock readings
    as the training thread took them, in nanoseconds, packed (:func:`pack_readings`),
    and one count per step. The publisher copies the readings' bytes as they are: no
    object and no arithmetic per step."""

    first: int  # the index of its first step
    readings: bytes  # start, batch arrival of each step, then the last step's end
    samples: list[int | None]


# A run's readings on the wire: signed 64-bit little-endian integers, 8 bytes each.
READING_BYTES = 8
# The array type the training thread appends its clock readings to: 8-byte unsigned.
# perf_counter_ns() is never negative, and array's "L" stores an int by a plain loop over
# its digits, where "q" parses it with PyArg_Parse and _PyLong_AsByteArray: ~700
# instructions a reading more (callgrind, Python 3.11; bench/probe_instructions.py), 43 %
# of what the C-timed chain did a step. "L" is 8 bytes where longs are (Linux, macOS);
# "Q" elsewhere skips PyArg_Parse only.
READINGS_TYPECODE = "L" if array("L").itemsize == READING_BYTES else "Q"
_NATIVE_LE = sys.byteorder == "little"


def pack_readings(readings: array[int] | Iterable[int]) -> bytes:
    """Clock readings as a run's ``readings`` bytes (an array of 8-byte integers, the
    probe's ``READINGS_TYPECODE``, is copied once; non-negative readings are the same
    bytes signed or not)."""
    if not isinstance(readings, array) or readings.itemsize != READING_BYTES or not _NATIVE_LE:
        readings = array("q", readings)  # a copy, swapped in place
    if not _NATIVE_LE:
        readings.byteswap()
    return readings.tobytes()


def unpack_readings(packed: bytes) -> array[int]:
    """A run's ``readings`` bytes as integers (a length not a multiple of 8: ValueError)."""
    readings = array("q")
    readings.frombytes(packed)
    if not _NATIVE_LE:
        readings.byteswap()
    return readings


def last_reading(packed: bytes) -> int:
    """The last of a run's packed readings."""
    return int.from_bytes(packed[-READING_BYTES:], "little", signed=True)


# Runs in one message. A run costs a reader a few microseconds besides its steps, so a
# message of many one-step runs is a reader's dearest per byte: capped at what a probe
# can send (a message of at most RECORDS_PER_MESSAGE steps, each run at least one).
MAX_RUNS = 2_000


class WireRun(msgspec.Struct, array_like=True, frozen=True, gc=False):
    first: Count
    # Checked as a whole by the decoder: a multiple of 8 bytes, 2k + 1 readings for k
    # counts, never going back.
    readings: Annotated[
        bytes,
        msgspec.Meta(
            min_length=3 * READING_BYTES, max_length=(2 * MAX_RECORDS + 1) * READING_BYTES
        ),
    ]
    samples: Annotated[tuple[Count | None, ...], msgspec.Meta(min_length=1, max_length=MAX_RECORDS)]


class _WireSteps(msgspec.Struct):
    source_id: Str
    base_time: Time
    records: Annotated[tuple[WireStep, ...], msgspec.Meta(max_length=MAX_RECORDS)]
    sent: Count
    dropped: Count
    dropped_steps: Count = 0
    clock_ns: Count = 0  # the publisher's clock (runs' readings) at base_time
    runs: Annotated[tuple[WireRun, ...], msgspec.Meta(max_length=MAX_RUNS)] = ()


# Plausible rows: within the limits a viewer applies to each record (tui.state.clean):
# durations up to a day, at most 1e9 samples a step. Nearly every message's rows are;
# decoding against these first checks them in C, where the decoder checks the protocol's
# own limits anyway, so that the viewer need not look at these values again (the steps
# decoder falls back to the protocol's limits when a row is not plausible).
PLAUSIBLE_DURATION_S = 86_400.0
PLAUSIBLE_SAMPLES = 1_000_000_000
_PlausibleMicros = Annotated[
    float, msgspec.Meta(ge=0, le=PLAUSIBLE_DURATION_S * MICROS, multiple_of=1)
]
_PlausibleCount = Annotated[int, msgspec.Meta(ge=0, le=PLAUSIBLE_SAMPLES)]


class _PlausibleStep(WireStep, array_like=True, frozen=True, gc=False):
    period_us: _PlausibleMicros
    wait_us: _PlausibleMicros | None
    samples: _PlausibleCount | None
    device_us: _PlausibleMicros | None = None
    device_idle_us: _PlausibleMicros | None = None
    phases: Annotated[tuple[tuple[Str, _PlausibleMicros], ...], msgspec.Meta(max_length=64)] = ()


class _PlausibleSteps(_WireSteps):
    records: Annotated[tuple[_PlausibleStep, ...], msgspec.Meta(max_length=MAX_RECORDS)]


class _PlausibleStepsMessage(msgspec.Struct):
    """A whole ``steps`` payload, envelope and body decoded at once."""

    v: tuple[_Version, _Version]
    kind: _Short
    body: _PlausibleSteps


_encoder = msgspec.msgpack.Encoder()
_envelope = msgspec.msgpack.Decoder(_Envelope)
_source_only = msgspec.msgpack.Decoder(_SourceOnly)
_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
    kind: msgspec.msgpack.Decoder(_WireSteps if cls is Steps else cls)
    for kind, cls in KINDS.items()
}
_plausible_steps = msgspec.msgpack.Decoder(_PlausibleSteps)
_steps_decoder = _decoders["steps"]
_TOPICS = {kind: TOPIC_PREFIX + kind.encode() for kind in KINDS}
_STEPS_TOPIC = _TOPICS["steps"]
# Topic -> (kind, decoder of a whole payload of that kind: envelope and body in one pass).
# Decoding the envelope with a raw body first walks the body twice (skipped, then
# decoded): a 64-core node sample spent a sixth of its decode skipping itself.
_ONE_PASS: dict[bytes, tuple[str, msgspec.msgpack.Decoder[Any]]] = {
    _TOPICS[kind]: (
        kind,
        msgspec.msgpack.Decoder(
            _PlausibleStepsMessage
            if cls is Steps
            else msgspec.defstruct(
                f"_{cls.__name__}Message",
                [("v", tuple[_Version, _Version]), ("kind", _Short), ("body", cls)],
            )
        ),
    )
    for kind, cls in KINDS.items()
}


def topic(kind: str) -> bytes:
    return TOPIC_PREFIX + kind.encode()


def encode(message: Message) -> list[bytes]:
    """Return the frames for ``message``."""
    if type(message) is Steps:
        return _encode_steps_message(message)
    kind = KIND_OF[type(message)]
    return [_TOPICS[kind], _encoder.encode({"v": _VERSION, "kind": kind, "body": message})]


def micros(seconds: float) -> int:
    """A duration in whole microseconds, as step records carry it."""
    return round(seconds * MICROS)


def wire_rows(records: Sequence[StepRecord]) -> tuple[float, list[tuple[Any, ...]]]:
    """(base_time, wire rows) for ``records``: the rows :func:`encode_steps` takes."""
    if not records:
        return 0.0, []
    base = min(r.end_time for r in records)
    rows = [
        (
            r.index,
            micros(r.end_time - base),
            micros(r.period_s),
            None if r.wait_s is None else micros(r.wait_s),
            r.samples,
            None if r.device_s is None else micros(r.device_s),
            None if r.device_idle_s is None else micros(r.device_idle_s),
            tuple((name, micros(s)) for name, s in r.phases),
            r.device_caught_up,
        )
        for r in records
    ]
    return base, rows


def _encode_steps_message(message: Steps) -> list[bytes]:
    base, rows = wire_rows(message.records)
    return encode_steps(
        message.source_id, base, rows, message.sent, message.dropped, message.dropped_steps
    )


def encode_steps(
    source_id: str,
    base_time: float,
    records: Sequence[Any],
    sent: int,
    dropped: int,
    dropped_steps: int,
    runs: Sequence[HostRun] = (),
    clock_ns: int = 0,
) -> list[bytes]:
    """Frames of a ``steps`` message whose records are given in their wire form: arrays
    in StepRecord field order, times in integer microseconds, ends after ``base_time``
    (see :func:`wire_rows`), so the publisher never builds record objects; and ``runs``,
    whose readings count from ``clock_ns`` at ``base_time``."""
    body: dict[str, Any] = {
        "source_id": source_id,
        "base_time": base_time,
        "records": records,
        "sent": sent,
        "dropped": dropped,
        "dropped_steps": dropped_steps,
    }
    if runs:
        body["clock_ns"] = clock_ns
        body["runs"] = runs
    return [_TOPICS["steps"], _encoder.encode({"v": _VERSION, "kind": "steps", "body": body})]


def decode(frames: Sequence[bytes]) -> Message:
    """Decode the frames of one message or raise :class:`ProtocolError` (only)."""
    try:
        return _decode(frames)
    except ProtocolError:
        raise
    except Exception as exc:  # the decoder is total: nothing else may escape
        raise MalformedMessage(f"invalid message: {type(exc).__name__}: {exc}") from None


def _decode(frames: Sequence[bytes]) -> Message:
    if len(frames) != 2:
        raise MalformedMessage(f"expected 2 frames (topic, payload), got {len(frames)}")
    topic_frame, payload = bytes(frames[0]), frames[1]
    if len(topic_frame) > MAX_TOPIC_BYTES or not topic_frame.startswith(TOPIC_PREFIX):
        raise MalformedMessage(f"unknown topic {topic_frame[:40]!r}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedMessage(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    one_pass = _ONE_PASS.get(topic_frame)
    if one_pass is not None:
        # Nearly every message: envelope and body (steps: plausible rows) in one pass.
        # Anything else about it (another version, another kind, a step row beyond the
        # plausible limits, an error) is left to the general path below, which tells
        # what it is.
        kind, whole_decoder = one_pass
        try:
            whole = whole_decoder.decode(payload)
        except msgspec.MsgspecError:
            pass
        else:
            if whole.v[0] == PROTOCOL_MAJOR and whole.kind == kind:
                body = whole.body
                if topic_frame == _STEPS_TOPIC:
                    return _steps_from_wire(body, plausible=True)
                return body
    try:
        env = _envelope.decode(payload)
    except msgspec.MsgspecError as exc:
        raise MalformedMessage(f"not a gputop envelope: {exc}") from None
    if env.v[0] != PROTOCOL_MAJOR:
        try:
            sid = _source_only.decode(env.body).source_id
        except msgspec.MsgspecError:
            sid = None
        raise IncompatibleVersion(env.v, sid)
    decoder = _decoders.get(env.kind)
    if decoder is None:
        raise UnknownKind(f"unknown message kind {env.kind!r}")
    if topic_frame != _TOPICS[env.kind]:
        raise MalformedMessage(f"topic {topic_frame!r} does not match kind {env.kind!r}")
    if decoder is _steps_decoder:
        try:
            return _steps_from_wire(_plausible_steps.decode(env.body), plausible=True)
        except msgspec.ValidationError:
            pass  # a row beyond the plausible limits: the protocol's own decide
    try:
        message: Message = decoder.decode(env.body)
    except msgspec.MsgspecError as exc:
        raise MalformedMessage(f"{env.kind}: {exc}") from None
    if type(message) is _WireSteps:
        return _steps_from_wire(message, plausible=False)
    return message


def _steps_from_wire(wire: _WireSteps, *, plausible: bool) -> Steps:
    base, rows = wire.base_time, wire.records
    if wire.runs:
        if len(rows) + sum(map(len, map(_samples, wire.runs))) > MAX_RECORDS:
            raise MalformedMessage(f"steps: more than {MAX_RECORDS} steps in one message")
        run_rows, plausible_runs = _rows_of_runs(wire.clock_ns, wire.runs)
        plausible = plausible and plausible_runs
        # Each in index order: records and runs interleave only around a pass's first
        # steps (timed in Python by the probe), so merging by index is rare. Runs out of
        # order or overlapping (no probe sends them: a hostile peer may) are merged too.
        runs_in_order = all(a.first + len(a.samples) <= b.first for a, b in pairwise(wire.runs))
        merge = rows or not runs_in_order
        rows = tuple(sorted(rows + run_rows, key=_index) if merge else run_rows)
    # An offset is at most 1e7 s: only a base that close to the limit needs a look at each.
    if (
        base > TIME_MAX - _MAX_OFFSET_S
        and rows
        and base + max(map(_end_us, rows)) / MICROS > TIME_MAX
    ):
        raise MalformedMessage("steps: a record ends after the year 2286")
    records = StepRows(base, rows, plausible=plausible)
    return Steps(wire.source_id, records, wire.sent, wire.dropped, wire.dropped_steps)


def reading_us(reading: int, clock_ns: int) -> int:
    """A run's clock reading as whole microseconds after the message's base_time."""
    return (reading - clock_ns + NS_PER_US // 2) // NS_PER_US


def _rows_of_runs(clock_ns: int, runs: tuple[WireRun, ...]) -> tuple[tuple[WireStep, ...], bool]:
    """The runs' steps as the rows a probe would have sent (each reading rounded to the
    nearest microsecond once, durations differences of rounded readings), and whether
    all are plausible (durations and counts within the viewer's limits)."""
    rows: list[WireStep] = []
    plausible = True
    offset = clock_ns - NS_PER_US // 2  # as reading_us, in C maps
    for run in runs:
        samples = run.samples
        steps = len(samples)
        if len(run.readings) != (2 * steps + 1) * READING_BYTES:
            raise MalformedMessage(
                f"steps: a run of {steps} steps has {len(run.readings)} bytes of readings,"
                f" not {(2 * steps + 1) * READING_BYTES} (2k + 1 readings of 8 bytes)"
            )
        readings = unpack_readings(run.readings)
        if readings[0] < 0:
            raise MalformedMessage("steps: a run's clock reading is negative")
        us = list(map(floordiv, map(sub, readings, repeat(offset)), repeat(float(NS_PER_US))))
        # Rounding keeps their order: rounded readings that go back come from readings
        # that do. (An already sorted list sorts in one pass, as fast as any C check.)
        if us != sorted(us):
            raise MalformedMessage("steps: a run's clock readings go back")
        starts, ends = us[0:-1:2], us[2::2]
        if ends[0] < 0 or ends[-1] > _MAX_US:
            raise MalformedMessage("steps: a run's step ends outside [0, 1e13] us after base")
        periods = list(map(sub, ends, starts))
        if (
            max(periods) > PLAUSIBLE_DURATION_S * MICROS
            or max(filter(None, samples), default=0) > PLAUSIBLE_SAMPLES
        ):
            plausible = False
        first = run.first
        waits = map(sub, us[1::2], starts)
        rows += map(WireStep, range(first, first + steps), ends, periods, waits, samples)
    return tuple(rows), plausible


class StepRows(Sequence[StepRecord]):
    """The records of a decoded ``steps`` message as they came: wire rows, microseconds
    after ``base``, made StepRecords (seconds, Unix times) only when first read.

    A viewer takes in every step but reads few of them as records (the analyzer's window,
    an export): its ingest reads ``base`` and ``rows`` directly, so a record it never reads
    costs no conversion. ``plausible``: every row is within PLAUSIBLE_DURATION_S and
    PLAUSIBLE_SAMPLES (the decoder checked). Equal to any sequence of the same StepRecords.
    """

    __slots__ = ("_count", "_records", "base", "plausible", "rows")

    def __init__(self, base: float, rows: tuple[WireStep, ...], *, plausible: bool) -> None:
        self.base = base
        # None once the records are made: they say all, and the rows' memory goes.
        self.rows: tuple[WireStep, ...] | None = rows
        self.plausible = plausible
        self._count = len(rows)
        self._records: tuple[StepRecord, ...] | None = None

    def records(self) -> tuple[StepRecord, ...]:
        """The StepRecords, made once (the records are set before the rows go: a reader
        on another thread that finds no rows finds the records)."""
        records = self._records
        if records is None:
            rows = self.rows
            if rows is None:  # made meanwhile, on another thread
                assert self._records is not None
                return self._records
            records = self._records = _records_from_rows(self.base, rows)
            self.rows = None
        return records

    def end_at(self, position: int) -> float:
        """The Unix end time of one record, without making the others."""
        rows = self.rows
        if rows is None:
            return self.records()[position].end_time
        return self.base + rows[position].end_us / MICROS

    def periods(self, start: int) -> list[float]:
        """The periods (seconds) of the records from ``start`` on, without making them."""
        rows = self.rows
        if rows is None:
            return [record.period_s for record in self.records()[start:]]
        us = float(MICROS)
        return [row.period_us / us for row in rows[start:]]

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, position: int) -> StepRecord: ...

    @overload
    def __getitem__(self, position: slice) -> tuple[StepRecord, ...]: ...

    def __getitem__(self, position: int | slice) -> StepRecord | tuple[StepRecord, ...]:
        return self.records()[position]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self.records())

    def __reversed__(self) -> Iterator[StepRecord]:
        return reversed(self.records())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepRows):
            other = other.records()
        return isinstance(other, Sequence) and self.records() == tuple(other)

    def __hash__(self) -> int:
        return hash(self.records())

    def __repr__(self) -> str:
        return f"StepRows({self.records()!r})"


def _records_from_rows(base: float, rows: tuple[WireStep, ...]) -> tuple[StepRecord, ...]:
    """Seconds and Unix times again: the viewer's records are floats."""
    us = float(MICROS)
    sr = StepRecord
    # One comprehension, each field read once (the walrus names).
    records = [
        sr(
            r.index,
            base + r.end_us / us,
            r.period_us / us,
            None if (wait := r.wait_us) is None else wait / us,
            r.samples,
            None if (device := r.device_us) is None else device / us,
            None if (idle := r.device_idle_us) is None else idle / us,
            (),
            r.device_caught_up,
        )
        for r in rows
    ]
    # Phases are rare (only steps marked with probe.phase have them): one C pass over the
    # rows tells whether any record needs them, instead of a look at each in the loop.
    if any(map(_phases, rows)):
        records = [
            msgspec.structs.replace(
                record, phases=tuple([(name, v / us) for name, v in row.phases])
            )
            if row.phases
            else record
            for record, row in zip(records, rows, strict=True)
        ]
    return tuple(records)


__all__ = [
    "MAX_RUNS",
    "NS_PER_US",
    "PLAUSIBLE_DURATION_S",
    "PLAUSIBLE_SAMPLES",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "READINGS_TYPECODE",
    "READING_BYTES",
    "HostRow",
    "HostRun",
    "IncompatibleVersion",
    "MalformedMessage",
    "ProtocolError",
    "StepRows",
    "UnknownKind",
    "WireRow",
    "WireRun",
    "WireStep",
    "decode",
    "encode",
    "encode_steps",
    "last_reading",
    "micros",
    "pack_readings",
    "reading_us",
    "unpack_readings",
    "wire_rows",
]
