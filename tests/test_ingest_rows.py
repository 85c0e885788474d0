"""The viewer's hot path for decoded steps gives what the general path gives.

A decoded ``steps`` message carries its wire rows (``StepRows``); a Run checks and buckets
plausible rows in one pass (``Throughput.add_rows``) and keeps them unconverted. The same
records handed over as plain StepRecords take the general path (``new_steps`` + ``add``).
Each case feeds both and compares everything a reader can see; the hot path must also be
the one taken for plain input, and must leave nothing behind when it hands a message on.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe import protocol
from gputop_dl.probe.messages import StepRecord, Steps
from gputop_dl.probe.protocol import StepRows, decode, encode, encode_steps
from gputop_dl.tui.state import run as run_module
from gputop_dl.tui.state.run import Run
from gputop_dl.tui.state.throughput import BUCKET_S

SID = "host:1"
T0 = math.floor(1_700_000_000.0 / BUCKET_S) * BUCKET_S  # on a bucket boundary


def rec(
    index: int,
    end: float,
    period: float,
    wait: float | None = None,
    samples: int | None = 8,
    device: float | None = None,
    *,
    idle: float | None = None,
    phases: tuple[tuple[str, float], ...] = (),
) -> StepRecord:
    return StepRecord(index, end, period, wait, samples, device, idle, phases)


def steady(
    first: int, count: int, period: float, *, start: float = T0, **kw: Any
) -> list[StepRecord]:
    return [rec(first + i, start + (i + 1) * period, period, **kw) for i in range(count)]


def flushes(records: list[StepRecord], size: int) -> list[list[StepRecord]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


STEADY = steady(0, 600, 1 / 150, wait=0.002, device=0.004, idle=0.001)
# Each case: the messages a probe sends, as records (µs-exact after the round trip).
CASES: dict[str, list[list[StepRecord]]] = {
    "steady, 15 a message": flushes(STEADY, 15),
    "steady, one a message": flushes(STEADY[:80], 1),
    "steady, 400 a message": flushes(STEADY, 400),
    "no wait, no device, no batch size": flushes(steady(0, 200, 0.01, samples=None), 10),
    "device longer than the period": flushes(steady(0, 100, 0.01, device=0.05), 10),
    "steps across bucket boundaries": flushes(steady(0, 60, 0.13, wait=0.05), 4),
    "steps longer than a bucket": flushes(steady(0, 20, 1.7, wait=0.5, device=1.0), 3),
    "a step ending on a boundary": [[rec(0, T0 + 0.25, 0.25), rec(1, T0 + 0.5, 0.25)]],
    "a replay of what is here": [STEADY[:30], STEADY[:30], STEADY[30:45]],
    "a replay overlapping new steps": [STEADY[:30], STEADY[15:45]],
    "indices going backwards": [STEADY[:10], [STEADY[12], STEADY[11], STEADY[13]]],
    "ends going backwards": [
        STEADY[:10],
        [rec(10, T0 + 1.0, 0.01), rec(11, T0 + 0.9, 0.01), rec(12, T0 + 1.1, 0.01)],
    ],
    "a wait a hair over the period": [
        STEADY[:10],
        [rec(10, T0 + 0.2, 0.01, wait=0.0105), *steady(11, 5, 0.01, start=T0 + 0.2)],
    ],
    "a wait far over the period": [STEADY[:10], [rec(10, T0 + 0.2, 0.01, wait=0.5)]],
    "a period of two days": [STEADY[:10], [rec(10, T0 + 0.2, 172_800.0), rec(11, T0 + 0.3, 0.1)]],
    "a device idle of two days": [STEADY[:10], [rec(10, T0 + 0.2, 0.1, idle=172_800.0)]],
    "two billion samples": [STEADY[:10], [rec(10, T0 + 0.2, 0.1, samples=2_000_000_000)]],
    "zero periods": [[rec(i, T0 + 0.01 * i, 0.0 if i % 3 == 0 else 0.01) for i in range(1, 60)]],
    "some report a wait, some do not": [
        [rec(i, T0 + 0.01 * i, 0.01, wait=0.003 if i % 2 else None) for i in range(1, 60)]
    ],
    "some report device time, some do not": [
        [
            rec(i, T0 + 0.01 * i, 0.01, wait=0.003, device=0.02 if i % 3 else None)
            for i in range(1, 60)
        ]
    ],
    "no wait or device time across buckets": flushes(steady(0, 40, 0.13, samples=None), 7),
    "phases": [
        STEADY[:10],
        [rec(10, T0 + 0.2, 0.1, phases=(("forward", 0.04), ("backward", 0.05)))],
        STEADY[31:40],
    ],
    "a step longer than the history": [
        STEADY[:20],
        [rec(20, T0 + 300.0, 290.0, wait=1.0), rec(21, T0 + 300.01, 0.01)],
    ],
    "a late step before finished buckets": [
        steady(0, 300, 0.01),
        [rec(300, T0 + 3.02, 2.5)],
    ],
    "a gap of a minute": [STEADY[:30], steady(30, 30, 0.01, start=T0 + 60.0)],
}


def general(message: Steps) -> Steps:
    """The same message with plain StepRecords: the general path."""
    return Steps(message.source_id, tuple(message.records), message.sent, message.dropped)


def feed(run: Run, batches: list[list[StepRecord]], *, hot: bool) -> list[int]:
    invalid = []
    for number, batch in enumerate(batches):
        message = decode(encode(Steps(SID, tuple(batch), number, 0)))
        assert isinstance(message, Steps)
        received = max(r.end_time for r in batch) + 0.05
        invalid.append(run.add_steps(message if hot else general(message), received))
    return invalid


def seen(run: Run) -> dict[str, Any]:
    throughput = run.throughput
    return {
        "steps": tuple(run.steps),
        "total_steps": run.total_steps,
        "total_samples": run.total_samples,
        "samples_known": run.samples_known,
        "last_index": run.last_index,
        "first_start": run.first_start,
        "last_end": throughput.last_end,
        # (a spread step's parts sum to end - start, its period to within a microsecond)
        "covered_total_ms": round(throughput.covered_total_s * 1000),
        "points": [
            (p.end, p.samples_per_s, p.steps_per_s, p.wait_share, p.device_share, p.covered_s)
            for p in throughput.points
        ],
        "open": {
            index: (b.samples, b.steps, b.covered_s, b.wait_s, b.wait_covered_s, b.device_s)
            for index, b in sorted(throughput._open.items())
        },
        "periods": run.steps.periods(20),
    }


def same(got: Any, expected: Any) -> None:
    """Equal, floats within a few ulps (the paths sum in other units and orders)."""
    if isinstance(expected, float) and isinstance(got, float):
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            same(got[key], expected[key])
    elif isinstance(expected, list | tuple) and not isinstance(expected, StepRecord):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            same(g, e)
    else:
        assert got == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_hot_path_sees_what_the_general_path_sees(name: str) -> None:
    hot, plain = Run(SID, 60.0), Run(SID, 60.0)
    hot_invalid = feed(hot, CASES[name], hot=True)
    plain_invalid = feed(plain, CASES[name], hot=False)
    assert hot_invalid == plain_invalid
    for run in (hot, plain):
        run.throughput.finish_until(T0 + 400.0)  # every bucket a point
    same(seen(hot), seen(plain))


def test_impossible_values_are_dropped_alone_and_counted() -> None:
    run = Run(SID, 60.0)
    invalid = feed(run, CASES["a period of two days"], hot=True)
    assert invalid == [0, 1]
    assert [r.index for r in run.steps][-2:] == [9, 11]


@pytest.mark.parametrize(
    "name", ["steady, 15 a message", "steps across bucket boundaries", "steps longer than a bucket"]
)
def test_plain_messages_take_the_hot_path_and_make_no_records(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []
    real = protocol._records_from_rows

    def counting(base: float, rows: Any) -> tuple[StepRecord, ...]:
        made.append(len(rows))
        return real(base, rows)

    monkeypatch.setattr(protocol, "_records_from_rows", counting)
    general_path = run_module.new_steps
    monkeypatch.setattr(run_module, "new_steps", lambda *a: pytest.fail("general path taken"))
    run = Run(SID, 60.0)
    assert feed(run, CASES[name], hot=True) == [0] * len(CASES[name])
    assert made == []  # nothing read a record yet
    assert run.steps.periods(3)  # the newest periods, from the rows
    assert made == []
    monkeypatch.setattr(run_module, "new_steps", general_path)
    newest = run.recent_steps(-math.inf, at_most=5)
    sent = [r.index for batch in CASES[name] for r in batch]
    assert [r.index for r in newest] == sent[-5:]
    assert sum(made) < run.total_steps  # only the chunks read were converted


IRREGULAR = {
    "replayed index": [STEADY[5]],
    "index going backwards": [STEADY[12], STEADY[11]],
    "end going backwards": [rec(12, T0 + 0.2, 0.01), rec(13, T0 + 0.19, 0.01)],
    "wait over the period": [rec(12, T0 + 0.2, 0.01, wait=0.02)],
    "wait over the period of a step across buckets": [rec(12, T0 + 0.6, 0.3, wait=0.31)],
    "zero period": [rec(12, T0 + 0.2, 0.0)],
    "a day ahead of the viewer": [rec(12, T0 + 90_000.0, 0.01)],
    "longer than the history": [rec(12, T0 + 100.0, 99.0)],
    "last row irregular": [*STEADY[12:20], rec(20, T0 + 0.05, 0.01)],
}


@pytest.mark.parametrize("name", sorted(IRREGULAR))
def test_an_irregular_row_hands_the_message_on_untouched(name: str) -> None:
    run = Run(SID, 60.0)
    feed(run, [STEADY[:12]], hot=True)
    before = seen(run)
    rows = decode(encode(Steps(SID, tuple(IRREGULAR[name]), 1, 0)))
    assert isinstance(rows, Steps) and isinstance(rows.records, StepRows)
    received = T0 + 0.5
    assert (
        run.throughput.add_rows(rows.records.base, rows.records.rows, received, run.last_index)
        is None
    )
    same(seen(run), before)


def test_a_plausible_message_is_flagged_and_an_implausible_one_still_decodes() -> None:
    rows = [(1, 0, 10_000, 2_000, 8, None, None, (), None)]
    message = decode(encode_steps(SID, T0, rows, 0, 0, 0))
    assert isinstance(message, Steps) and isinstance(message.records, StepRows)
    assert message.records.plausible
    for field, value in ((2, 86_400_000_001), (3, 86_400_000_001), (4, 1_000_000_001)):
        row = list(rows[0])
        row[field] = value
        if field == 3:
            row[2] = 90_000_000_000
        odd = decode(encode_steps(SID, T0, [tuple(row)], 0, 0, 0))
        assert isinstance(odd, Steps) and isinstance(odd.records, StepRows)
        assert not odd.records.plausible
        assert odd.records[0].index == 1


def test_step_rows_equal_the_records_they_stand_for() -> None:
    records = tuple(steady(0, 3, 0.01, wait=0.002))  # whole microseconds: exact round trip
    message = decode(encode(Steps(SID, records, 0, 0)))
    assert isinstance(message, Steps)
    assert message.records == records and records == message.records
    assert message == Steps(SID, records, 0, 0)
    assert message.records[1:] == records[1:]
    assert list(reversed(message.records)) == list(reversed(records))
    assert message.records.end_at(2) == records[2].end_time
    assert message.records != records[:2]


LIMIT_US = 86_400 * 1_000_000
micros = st.sampled_from([0, 1, 6_667, 10_000, 499_999, 500_000, LIMIT_US, LIMIT_US + 1])
row = st.tuples(
    st.integers(0, 40),  # index: repeats and goes backwards now and then
    st.integers(0, 3_000_000) | st.sampled_from([0, 10**12]),  # end after base
    micros | st.integers(0, 2_000_000),  # period
    st.none() | micros | st.integers(0, 2_000_000),  # wait
    st.none() | st.sampled_from([0, 8, 1_000_000_000, 1_000_000_001]),  # samples
    st.none() | micros,  # device
    st.none() | micros,  # device idle
    st.just([]) | st.just([["forward", 3_000]]) | st.just([["x", LIMIT_US + 1]]),
    st.none() | st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(st.lists(row, min_size=1, max_size=12), min_size=1, max_size=6))
def test_any_rows_take_either_path_to_the_same_state(messages: list[list[tuple[Any, ...]]]) -> None:
    """Whatever rows arrive (sorted or not, replayed, at and over every limit), the hot
    path and the general path keep, count and bucket the same."""
    hot, plain = Run(SID, 60.0), Run(SID, 60.0)
    for number, rows in enumerate(messages):
        frames = encode_steps(SID, T0, rows, number, 0, 0)
        received = T0 + 2.0
        decoded, twin = decode(frames), decode(frames)
        assert isinstance(decoded, Steps) and isinstance(twin, Steps)
        assert hot.add_steps(decoded, received) == plain.add_steps(general(twin), received)
    for run in (hot, plain):
        run.throughput.finish_until(T0 + 400.0)
    same(seen(hot), seen(plain))
    kept = list(hot.steps)
    assert [r.index for r in kept] == sorted({r.index for r in kept})  # new ones only
    assert all(0 < r.period_s <= 86_400 or r.period_s == 0 for r in kept)
    assert all(r.wait_s is None or r.wait_s <= r.period_s for r in kept)
