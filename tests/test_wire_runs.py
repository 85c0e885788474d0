"""Step runs on the wire (docs/protocol.md, "StepRun"): the C-timed steps as the
training thread's clock readings; a reader makes the same records a probe's rows give."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gputop_dl.probe.core import RECORDS_PER_MESSAGE
from gputop_dl.probe.messages import Steps
from gputop_dl.probe.protocol import (
    MAX_RUNS,
    PROTOCOL_MAJOR,
    HostRow,
    HostRun,
    MalformedMessage,
    ProtocolError,
    StepRows,
    decode,
    encode_steps,
    pack_readings,
    unpack_readings,
)
from gputop_dl.probe.stamps import Segment
from tests.test_probe import attached, tcp_probe
from tests.wire_reader import WireReader

CLOCK = 5_000_000_123_456  # a perf_counter_ns reading at the message's base_time
BASE = 1_700_000_000.0


def segment(plan: tuple[int, int, int] | None, readings: list[int]) -> Segment:
    s = Segment(40, 0, plan)
    s.stamps.extend(readings)
    if s.counts is not None:
        s.counts.extend([8, None, 7][i % 3] for i in range((len(readings) - 1) // 2))
    return s


READINGS = [CLOCK + 300 + 1_000_499 * i + (i % 2) * 2_000 for i in range(13)]  # 6 steps


@pytest.mark.parametrize(
    "plan",
    [
        None,  # counted one by one
        (32, 100, 32),  # all full
        (32, 43, 5),  # the plan's short last batch inside
        (32, 41, 9),  # past the plan after it: unknown
    ],
)
def test_a_run_reads_as_the_rows_the_probe_would_have_sent(
    plan: tuple[int, int, int] | None,
) -> None:
    rows = segment(plan, READINGS).rows(CLOCK, 6)
    run = segment(plan, READINGS).run(6)
    as_rows = decode(encode_steps("h:1", BASE, rows, 0, 0, 0))
    as_run = decode(encode_steps("h:1", BASE, [], 0, 0, 0, [run], CLOCK))
    assert isinstance(as_run, Steps) and isinstance(as_rows, Steps)
    assert list(as_run.records) == list(as_rows.records)
    assert [r.index for r in as_run.records] == list(range(40, 46))


def test_a_probes_message_never_holds_more_runs_than_a_reader_takes() -> None:
    # Each run holds a step at least, and a probe's message at most so many steps.
    assert RECORDS_PER_MESSAGE <= MAX_RUNS


def test_a_run_costs_seventeen_bytes_a_step() -> None:
    # 6 steps: two 8-byte readings and a 1-byte count each
    run = segment((32, 100, 32), READINGS).run(6)
    one = HostRun(0, pack_readings([CLOCK] * 3), [1])
    empty = len(encode_steps("h:1", BASE, [], 0, 0, 0, [one], CLOCK)[1])
    size = len(encode_steps("h:1", BASE, [], 0, 0, 0, [run], CLOCK)[1])
    per_step = (size - empty) / 5
    assert per_step <= 17


@pytest.mark.parametrize(
    "readings",
    [
        [0, 1, 2],
        [CLOCK, CLOCK + 1, CLOCK + 2],
        [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1],  # every digit count up to int64's
    ],
)
def test_the_training_threads_readings_are_the_wire_bytes_of_signed_8_byte_readings(
    readings: list[int],
) -> None:
    # The training thread appends to an array of unsigned 8-byte integers (the cheapest
    # append); the wire's readings are signed 8-byte little-endian: the same bytes for
    # any reading a clock gives (never negative), sent without a copy to another type.
    s = Segment(0, 0, None)
    for reading in readings:
        s.stamps.append(reading)
    assert s.stamps.itemsize == 8
    assert pack_readings(s.stamps) == b"".join(
        r.to_bytes(8, "little", signed=True) for r in readings
    )
    assert list(unpack_readings(pack_readings(s.stamps))) == readings


def test_records_and_runs_of_one_message_are_read_in_index_order() -> None:
    # A pass's Python-timed first steps as rows, the rest as a run, and a later row.
    run = HostRun(2, pack_readings([CLOCK + i * 1_000_000 for i in range(5)]), [4, 4])
    rows = [HostRow(0, 0, 900, 100, 4), HostRow(1, 1, 1, 0, 4), HostRow(4, 6000, 1000, 0, 4)]
    message = decode(encode_steps("h:1", BASE, rows, 0, 0, 0, [run], CLOCK))
    assert isinstance(message, Steps)
    assert [r.index for r in message.records] == [0, 1, 2, 3, 4]
    assert message.records[2].end_time == pytest.approx(BASE + 0.002, abs=1e-6)
    assert message.records[3].period_s == pytest.approx(0.002, abs=1e-6)  # 2 readings a step


DAY_NS = 86_400 * 10**9


@pytest.mark.parametrize(
    ("readings", "samples", "plausible"),
    [
        ([CLOCK, CLOCK, CLOCK + 1_000], [10**9], True),  # at the limits
        ([CLOCK, CLOCK, CLOCK + DAY_NS], [None], True),
        ([CLOCK, CLOCK, CLOCK + 2 * DAY_NS], [1], False),  # a two-day step
        ([CLOCK, CLOCK, CLOCK + 1_000], [10**9 + 1], False),  # over a billion samples
    ],
)
def test_an_implausible_run_is_read_but_left_to_the_viewers_general_path(
    readings: list[int], samples: list[int | None], plausible: bool
) -> None:
    run = HostRun(0, pack_readings(readings), samples)
    message = decode(encode_steps("h:1", BASE, [], 0, 0, 0, [run], CLOCK))
    assert isinstance(message, Steps) and isinstance(message.records, StepRows)
    assert message.records.plausible is plausible
    assert message.records[0].samples == samples[0]


def runs_payload(runs: list[Any], records: list[Any] | None = None, **body: Any) -> list[bytes]:
    data = {
        "v": [PROTOCOL_MAJOR, 0],
        "kind": "steps",
        "body": {
            "source_id": "a",
            "base_time": BASE,
            "records": records or [],
            "sent": 0,
            "dropped": 0,
            "clock_ns": CLOCK,
            "runs": runs,
        }
        | body,
    }
    return [b"gputop.steps", msgpack.packb(data)]


P = pack_readings
R = [CLOCK, CLOCK + 10, CLOCK + 1_000]  # one step
MALFORMED_RUNS = {
    "a reading short": runs_payload([[0, P(R[:2]), [1]]]),
    "a reading more": runs_payload([[0, P([*R, CLOCK + 2_000]), [1]]]),
    "a byte more": runs_payload([[0, P(R) + b"\0", [1]]]),
    "no steps": runs_payload([[0, P(R[:1]), []]]),
    "readings go back": runs_payload([[0, P([CLOCK, CLOCK + 9_000, CLOCK + 5_000]), [1]]]),
    "an arrival after the next start": runs_payload(
        [[0, P([CLOCK, CLOCK + 9_000, CLOCK + 5_000, CLOCK + 9_500, CLOCK + 12_000]), [1, 1]]]
    ),
    "a negative reading": runs_payload([[0, P([-1, 0, 10]), [1]]]),
    "all readings negative": runs_payload([[0, P([-30, -20, -10]), [1]]], clock_ns=0),
    "a reading past 2^63 (negative as int64)": runs_payload([[0, P(R)[:16] + b"\xff" * 8, [1]]]),
    "readings as integers, not bytes": runs_payload([[0, R, [1]]]),
    "readings as a string": runs_payload([[0, "x" * 24, [1]]]),
    "a negative count": runs_payload([[0, P(R), [-1]]]),
    "a negative index": runs_payload([[-1, P(R), [1]]]),
    "an end before base": runs_payload([[0, P(R), [1]]], clock_ns=CLOCK + 2_000),
    "an end after 1e13 us": runs_payload(
        [[0, P([CLOCK, CLOCK, CLOCK + 2 * 10**16]), [1]]], base_time=1.0
    ),
    "an end after the year 2286": runs_payload([[0, P(R), [1]]], base_time=1e10),
    "run as a map": runs_payload([{"first": 0, "readings": P(R), "samples": [1]}]),
    "too many steps with the records": runs_payload(
        [[0, P([CLOCK] * 20_001), [None] * 10_000]], records=[[10**6, 0, 1, 0, None]] * 10_001
    ),
    "a negative clock": runs_payload([[0, P(R), [1]]], clock_ns=-1),
    "more runs than a probe sends": runs_payload([[i, P(R), [1]] for i in range(MAX_RUNS + 1)]),
}


@pytest.mark.parametrize("frames", MALFORMED_RUNS.values(), ids=MALFORMED_RUNS.keys())
def test_a_malformed_run_is_a_typed_error(frames: list[bytes]) -> None:
    with pytest.raises(MalformedMessage):
        decode(frames)


readings = st.binary(max_size=80) | st.lists(
    st.integers(-5, 2**63 - 1), min_size=0, max_size=9
).map(pack_readings)
counts = st.lists(st.none() | st.integers(-2, 2**40), min_size=0, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(-1, 2**63), readings, counts), max_size=3),
    clock=st.integers(-1, 2**64 - 1),
)
# Found by a fresh CI run: runs out of order decoded to records out of order.
@example(runs=[(1, bytes(24), [None]), (0, bytes(24), [None])], clock=0)
@example(runs=[(0, bytes(40), [None, None]), (1, bytes(24), [None])], clock=0)  # overlapping
def test_fuzz_runs_only_raise_protocol_errors(
    runs: list[tuple[int, bytes, list[int | None]]], clock: int
) -> None:
    frames = runs_payload([list(run) for run in runs], clock_ns=clock)
    with contextlib.suppress(ProtocolError):
        message = decode(frames)
        assert isinstance(message, Steps)
        indices = [r.index for r in message.records]
        assert indices == sorted(indices)  # runs may overlap: the viewer's state decides
        assert all(r.period_s >= 0 and (r.wait_s or 0) >= 0 for r in message.records)


def test_a_reader_written_from_the_protocol_page_reads_a_run_as_gputop_does() -> None:
    run = segment((32, 43, 5), READINGS).run(6)
    frames = encode_steps("h:1", BASE, [], 0, 0, 0, [run], CLOCK)
    body = msgspec.msgpack.decode(frames[1])["body"]
    theirs = WireReader.run_steps(body["runs"][0], body["base_time"], body["clock_ns"])
    ours = decode(frames).records  # type: ignore[union-attr]
    assert [t["index"] for t in theirs] == [r.index for r in ours]
    assert [t["end_time"] for t in theirs] == [r.end_time for r in ours]
    assert [t["period_s"] for t in theirs] == [r.period_s for r in ours]
    assert [t["wait_s"] for t in theirs] == [r.wait_s for r in ours]
    assert [t["samples"] for t in theirs] == [r.samples for r in ours]


def test_a_settled_watch_loop_reaches_the_wire_as_runs_every_step_once() -> None:
    # 3,000 steps of ~0.2 ms in lists of known counts: the pass's first steps are timed in
    # Python (rows), the rest in C; a drain of C-timed steps alone sends runs.
    p = tcp_probe("runs", system_interval_s=0)
    reader = attached(p)
    batches = [[0.0] * 16] * 3_000
    for _ in p.watch(batches, samples=16):
        time.sleep(0.0002)
    time.sleep(0.6)
    late = attached(p)  # its hello tells the progress: made of the runs
    reader.pump(1.0)
    p.close()
    reader.close()
    late.close()
    hello = late.of_kind("hello")[0]
    assert hello["step_count"] == 3_000
    assert 0.0002 <= hello["typical_period_s"] < 0.01
    raw_runs = [b["runs"] for b in reader.of_kind("steps") if b.get("runs")]
    assert raw_runs  # the probe sent runs, not only rows
    assert all(len(r[1]) == 8 * (2 * len(r[2]) + 1) for runs in raw_runs for r in runs)
    steps = {int(r["index"]): r for r in reader.steps()}
    assert set(steps) == set(range(3_000))  # each once after de-duplication, none lost
    assert all(r["samples"] == 16 for r in steps.values())
    periods = [float(r["period_s"]) for r in steps.values()]
    assert 0.0002 <= statistics.median(periods) < 0.01
    ends = [float(steps[i]["end_time"]) for i in range(3_000)]
    assert ends == sorted(ends)
    assert abs(ends[-1] - time.time()) < 5.0  # on the Unix clock, not the probe's own
    assert hello["last_step_end"] == pytest.approx(ends[-1], abs=2e-6)


def test_short_passes_reach_the_wire_as_runs_with_each_passs_first_step_a_record() -> None:
    # 60 passes of 50 steps (the epochs of a small dataset): each pass's first step is
    # timed in Python, the rest in C. A flush that holds a pass's start sends that step
    # as a record beside the runs; it used to turn every step of the flush into a record
    # (~0.5 us a step more for the publisher: bench/short_passes.py).
    p = tcp_probe("short passes", system_interval_s=0)
    reader = attached(p)
    passes, steps = 60, 50
    loader = p.watch([[0.0] * 8] * steps, samples=8)
    for _ in range(passes):
        for _ in loader:
            time.sleep(0.0002)
    time.sleep(0.6)
    reader.pump(1.0)
    p.close()
    reader.close()
    bodies = reader.of_kind("steps")
    run_steps = [sum(len(r[2]) for r in b.get("runs", [])) for b in bodies]
    records = [len(b["records"]) - n for b, n in zip(bodies, run_steps, strict=True)]
    in_runs = {r[0] + j for b in bodies for r in b.get("runs", []) for j in range(len(r[2]))}
    as_records = {int(r["index"]) for b in bodies for r in b["records"]} - in_runs
    # The first step of each pass; in the first pass, the first 4 (the probe looks for
    # CUDA timing at its first 3 steps: probe.core.Probe._check_timing).
    assert as_records == {0, 1, 2, 3} | set(range(0, passes * steps, steps))
    assert sum(records) == len(as_records)
    assert sum(run_steps) == passes * steps - len(as_records)
    assert any(r and n for r, n in zip(records, run_steps, strict=True))  # both in one
    indices = [[int(r["index"]) for r in b["records"]] for b in bodies]
    assert [i for message in indices for i in message] == list(range(passes * steps))
    ends = [float(r["end_time"]) for b in bodies for r in b["records"]]
    assert ends == sorted(ends)
    assert {r["samples"] for b in bodies for r in b["records"]} == {8}


def test_the_typical_period_of_short_passes_is_their_steps_not_their_first_steps() -> None:
    # Passes of 3 steps: the first 1 ms (timed in Python: a record), the other two 20 ms
    # (C-timed: a run); the median period is 20 ms. A flush during a pass's second step
    # ends with that pass's first step: the typical period was taken from the records
    # alone there (~1 ms, so a stall's threshold 20x too short), and from the last run's
    # one complete step otherwise.
    p = tcp_probe("typical", system_interval_s=0)
    reader = attached(p)
    loader = p.watch(list(range(3)), samples=1)
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        for i in loader:
            time.sleep(0.001 if i == 0 else 0.02)
    reader.pump(0.8)  # flushed
    late = attached(p)  # its hello carries the typical period
    p.close()
    reader.close()
    late.close()
    periods = [float(r["period_s"]) for r in reader.steps()]
    assert 0.02 <= statistics.median(periods) < 0.04
    typical = late.of_kind("hello")[0]["typical_period_s"]
    assert typical == pytest.approx(statistics.median(periods), rel=0.3)
