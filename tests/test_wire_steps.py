"""Step records as the publisher sends them: integer microseconds after a base time,
history kept per drained batch, replays byte-identical to the originals."""

from __future__ import annotations

import time
from collections import deque

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe import core
from gputop_dl.probe.core import _DrainState
from gputop_dl.probe.history import Batch, messages, parts, trim
from gputop_dl.probe.messages import Steps
from gputop_dl.probe.protocol import (
    HostRun,
    WireRow,
    decode,
    encode_steps,
    pack_readings,
    unpack_readings,
)
from tests.test_probe import attached, tcp_probe

US = 1_000_000


def row(index: int, end_us: int) -> WireRow:
    return WireRow(index, end_us, 1000, 100, 32)


@pytest.mark.parametrize(
    ("first_end", "expected_base"),
    [
        (100.0, 100.0),  # the first drain sets the base
        (100.5, 100.0),  # later ends count from it
        (100.0 + core.BASE_EPOCH_S, 100.0),  # up to an hour
        (100.0 + core.BASE_EPOCH_S + 1.0, 100.0 + core.BASE_EPOCH_S + 1.0),  # then anew
    ],
)
def test_the_base_is_kept_for_an_hour(first_end: float, expected_base: float) -> None:
    st = _DrainState()
    st.base_for(100.0)
    assert st.base_for(first_end) == expected_base


def test_a_base_never_lies_after_an_end() -> None:
    st = _DrainState()
    st.base_for(100.0)
    assert st.base_for(99.0) == 99.0  # offsets on the wire are >= 0


def run(first: int, ends_us: list[int], count: int | None = 32) -> HostRun:
    """A run of steps ending ``ends_us`` after its clock's zero, each 1000 us long."""
    readings = [ends_us[0] * 1000 - 1_000_000]
    for end in ends_us:
        readings += [end * 1000 - 500_000, end * 1000]
    return HostRun(first, pack_readings(readings), [count] * len(ends_us))


@pytest.mark.parametrize(
    ("batches", "horizon", "max_rows", "left"),
    [
        # (base, [end offsets in s]) per batch; rows left per batch after trimming
        ([(0.0, [1.0, 2.0]), (10.0, [1.0])], 0.0, 10, [2, 1]),  # nothing old
        ([(0.0, [1.0, 2.0]), (10.0, [1.0])], 5.0, 10, [1]),  # a batch ended before horizon
        ([(0.0, [1.0, 6.0]), (10.0, [1.0])], 5.0, 10, [2, 1]),  # partly new: kept whole
        ([(0.0, [1.0, 2.0, 3.0]), (10.0, [1.0, 2.0])], 0.0, 4, [2, 2]),  # over the count
        ([(0.0, [1.0]), (10.0, [1.0, 2.0, 3.0])], 0.0, 2, [2]),  # a whole batch and more
    ],
)
@pytest.mark.parametrize("held_as", ["rows", "runs", "mixed"])
def test_history_trims_by_age_then_by_count(
    batches: list[tuple[float, list[float]]],
    horizon: float,
    max_rows: int,
    left: list[int],
    held_as: str,
) -> None:
    history: deque[Batch] = deque()
    index = 0
    end_of: dict[int, int] = {}  # step index -> its end, us
    for base, ends in batches:
        ends_us = [round(end * US) for end in ends]
        end_of.update(enumerate(ends_us, start=index))
        rest = [run(index + 1, ends_us[1:])] if len(ends_us) > 1 else []
        if held_as == "runs":  # the first step a run of its own: a trim may drop runs and cut one
            history.append(Batch(base, runs=[run(index, ends_us[:1]), *rest]))
        elif held_as == "mixed":  # a pass's first step as a row, the rest as a run (a drain)
            history.append(Batch(base, [row(index, ends_us[0])], rest))
        else:
            history.append(Batch(base, [row(index + i, end) for i, end in enumerate(ends_us)]))
        index += len(ends)
    kept = trim(history, index, horizon, max_rows)
    assert [batch.steps for batch in history] == left
    assert kept == sum(left)
    if history:  # the newest steps stay, the oldest go
        assert history[-1].last_index == index - 1
        assert history[-1].last_end == history[-1].base + end_of[index - 1] / US
        first = min([r.first for r in history[0].runs] + [r.index for r in history[0].rows])
        assert first == index - kept
    for kept_run in (r for batch in history for r in batch.runs):  # cut: still whole steps
        readings = unpack_readings(kept_run.readings)
        assert len(readings) == 2 * len(kept_run.samples) + 1
        ends = readings[2::2].tolist()
        assert ends == [end_of[kept_run.first + i] * 1000 for i in range(len(ends))]


@pytest.mark.parametrize(
    ("batches", "at_least", "left"),
    [
        # Every batch older than the horizon (slow steps): the newest kept, at least.
        ([(0.0, [1.0]), (1.0, [1.0]), (2.0, [1.0])], 2, [1, 1]),
        ([(0.0, [1.0]), (1.0, [1.0]), (2.0, [1.0])], 5, [1, 1, 1]),  # all there are
        ([(0.0, [1.0, 2.0]), (1.0, [1.0, 2.0])], 3, [2, 2]),  # whole batches
        ([(0.0, [1.0, 2.0]), (1.0, [1.0, 2.0])], 2, [2]),
        ([(0.0, [1.0]), (1.0, [1.0])], 0, []),  # none asked: by age alone
    ],
)
def test_history_keeps_at_least_the_newest_steps_however_old(
    batches: list[tuple[float, list[float]]], at_least: int, left: list[int]
) -> None:
    """A run of 5-minute steps: 120 s of history would hold none of them, and a viewer
    attaching would wait for five more steps before its first verdict."""
    history: deque[Batch] = deque()
    index = 0
    for base, ends in batches:
        history.append(Batch(base, [row(index + i, round(end * US)) for i, end in enumerate(ends)]))
        index += len(ends)
    kept = trim(history, index, 1e9, 100, at_least)
    assert [batch.steps for batch in history] == left
    assert kept == sum(left)
    if history:
        assert history[-1].last_index == index - 1


def test_replay_groups_batches_by_base_without_touching_a_row() -> None:
    history = deque([Batch(5.0, [row(0, 0)]), Batch(5.0, [row(1, 10)]), Batch(9.0, [row(2, 0)])])
    assert list(messages(history, 2000)) == [
        Batch(5.0, [row(0, 0), row(1, 10)]),
        Batch(9.0, [row(2, 0)]),
    ]
    assert history[0].rows == [row(0, 0)]  # the stored batch itself is not extended


def test_replay_messages_hold_at_most_so_many_steps_each_after_the_last() -> None:
    history = [
        Batch(5.0, [row(0, 0), row(1, 10)]),
        Batch(5.0, runs=[run(2, [20, 30, 40]), run(5, [50])]),
        Batch(5.0, [row(6, 60), row(7, 70), row(8, 80)]),
    ]
    out = list(messages(history, 3))
    indices = [
        sorted(
            [r.index for r in m.rows] + [s.first + i for s in m.runs for i in range(len(s.samples))]
        )
        for m in out
    ]
    assert indices == [[0, 1], [2, 3, 4], [5, 6, 7], [8]]
    assert all(m.steps <= 3 for m in out)


def _indices(batch: Batch) -> list[int]:
    """Its steps' indices in the order a message cut from it carries them."""
    return [r.index for r in batch.rows] + [
        s.first + i for s in batch.runs for i in range(len(s.samples))
    ]


# Two short passes in one drain: each pass's first step timed in Python (a row), the
# rest in C (a run); rows 0 and 4, runs 1-3 and 5-6.
MIXED = Batch(5.0, [row(0, 0), row(4, 40)], [run(1, [10, 20, 30]), run(5, [50, 60])])


@pytest.mark.parametrize(
    ("per_message", "expected"),
    [
        (2000, [[0, 1, 2, 3, 4, 5, 6]]),
        (4, [[0, 1, 2, 3], [4, 5, 6]]),
        (3, [[0], [1, 2, 3], [4, 5, 6]]),  # a run is never cut: it goes alone
        (1, [[0], [1, 2, 3], [4], [5, 6]]),
    ],
)
def test_a_drain_of_rows_and_runs_is_cut_into_messages_in_index_order(
    per_message: int, expected: list[list[int]]
) -> None:
    # The viewer keeps only steps newer than the newest it holds: a message of later
    # steps sent before an earlier row would lose that row.
    out = list(messages([MIXED], per_message))
    assert [sorted(_indices(m)) for m in out] == expected
    flat = [i for m in out for i in sorted(_indices(m))]
    assert flat == sorted(flat)


@pytest.mark.parametrize(
    ("count", "indices"),
    [
        (0, [0, 1, 2, 3, 4, 5, 6]),
        (1, [1, 2, 3, 4, 5, 6]),
        (2, [2, 3, 4, 5, 6]),
        (4, [4, 5, 6]),
        (5, [5, 6]),
        (6, [6]),
    ],
)
def test_a_mixed_batch_loses_its_oldest_steps_first(count: int, indices: list[int]) -> None:
    cut = MIXED.without_first(count)
    assert sorted(_indices(cut)) == indices
    assert cut.steps == len(indices)
    assert cut.last_index == 6
    assert cut.last_end == MIXED.last_end == 5.0 + 60 / US


def test_a_mixed_batch_ends_with_whichever_holds_its_last_step_and_tells_its_periods() -> None:
    ends_in_row = Batch(5.0, [row(0, 0), row(4, 40)], [run(1, [10, 20, 30])])
    assert (ends_in_row.last_index, ends_in_row.last_end) == (4, 5.0 + 40 / US)
    # The typical period is the median of the last few steps in index order, rows and
    # runs alike (a run's first period here is 1,000 us, the others 10): the periods of
    # the part that ends it alone were mostly each short pass's slow first step.
    assert ends_in_row.periods_us(30) == [1_000, 1_000, 10, 10, 1_000]
    assert MIXED.last_index == 6
    assert MIXED.periods_us(30) == [1_000, 1_000, 10, 10, 1_000, 1_000, 10]
    assert MIXED.periods_us(3) == [1_000, 1_000, 10]
    assert MIXED.periods_us(1) == [10]


def test_the_publishers_records_are_at_most_40_bytes_and_decode_to_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUTOP_DISABLE", "1")  # no publisher thread: we drain by hand
    p = core.Probe(name="rows")
    # Raw steps as the training thread queues them: 12 ms steps, 2 ms data waits.
    t = 1000.0
    for i in range(9):
        p._steps.append((123_456 + i, t, t + 0.002, t + 0.012, 256, None, None))
        t += 0.012
    p._index = 123_465  # as the training thread leaves it: past every step it queued
    batch = p._drain(_DrainState(), 1_700_000_000.0, force=False)
    assert batch is not None and not batch.runs
    assert all(len(msgspec.msgpack.encode(r)) <= 40 for r in batch.rows)
    message = decode(encode_steps("h:1", batch.base, batch.rows, 0, 0, 0))
    assert isinstance(message, Steps)
    last = message.records[-1]
    assert last.index == 123_464
    assert last.end_time == pytest.approx(1_700_001_000.0 + 9 * 0.012, abs=1e-6)
    assert last.period_s == pytest.approx(0.012, abs=1e-6)
    assert last.wait_s == pytest.approx(0.002, abs=1e-6)


def test_replayed_records_are_identical_to_the_originals() -> None:
    p = tcp_probe("identical", system_interval_s=0)
    first = attached(p)
    for _ in p.watch(range(300)):
        time.sleep(0.0005)
    time.sleep(0.4)  # several flushes: several batches in the history
    second = attached(p)  # its subscription replays the history to both
    first.pump(1.0)
    p.close()
    first.close()
    second.close()
    copies: dict[int, list[dict[str, object]]] = {}
    for record in first.steps():
        copies.setdefault(int(record["index"]), []).append(record)  # type: ignore[call-overload]
    assert set(copies) == set(range(300))
    assert any(len(c) > 1 for c in copies.values())  # the replay did arrive
    for same in copies.values():
        assert all(c == same[0] for c in same)  # end_time too: exact, not approximately


@pytest.mark.parametrize(
    ("batch", "at_most", "periods"),
    [
        (Batch(0.0, [row(0, 10), row(1, 20), row(2, 30)]), 2, [1000, 1000]),  # rows' own
        # a run of steps ending at 2, 5, 9 ms (readings: start, arrival, end, ...)
        (Batch(0.0, runs=[run(0, [2_000, 5_000, 9_000])]), 2, [3_000, 4_000]),
        (Batch(0.0, runs=[run(0, [2_000, 5_000, 9_000])]), 30, [1_000, 3_000, 4_000]),
        (
            Batch(0.0, runs=[HostRun(0, pack_readings([400, 600, 2_399]), [1])], clock_ns=100),
            30,
            [1],
        ),
    ],
)
def test_a_batch_tells_its_last_periods(batch: Batch, at_most: int, periods: list[int]) -> None:
    assert batch.periods_us(at_most) == periods


# Property checks of the history against a flat list of step indices (from a review of
# the change that let a drain hold rows and runs): batches of rows and runs in any
# order, with gaps in the indices, of one base or two.
def _flat_run(first: int, steps: int) -> HostRun:
    readings = []
    for k in range(steps):
        readings += [(first + k) * 10_000, (first + k) * 10_000 + 1_000]
    readings.append((first + steps) * 10_000)
    return HostRun(first, pack_readings(readings), [1] * steps)


def _in_order(batch: Batch) -> list[int]:
    out: list[int] = []
    for part in parts(batch):
        if isinstance(part, HostRun):
            out += range(part.first, part.first + len(part.samples))
        else:
            out += [r.index for r in part]
    return out


_PIECES = st.lists(
    st.tuples(st.sampled_from(["row", "run"]), st.integers(1, 6), st.integers(0, 2)),
    min_size=1,
    max_size=6,
)


def _batches(
    specs: list[list[tuple[str, int, int]]], bases: list[float]
) -> tuple[list[Batch], list[int]]:
    batches, flat, index = [], [], 0
    for spec, base in zip(specs, bases, strict=True):
        rows: list[WireRow] = []
        runs: list[HostRun] = []
        for kind, steps, gap in spec:
            index += gap
            if kind == "row":
                rows += [row(index + k, (index + k) * 10 + 5) for k in range(steps)]
            else:
                runs.append(_flat_run(index, steps))
            flat += range(index, index + steps)
            index += steps
        batches.append(Batch(base, rows, runs, 0))
    return batches, flat


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=5), st.data(), st.integers(1, 12))
def test_messages_cut_any_batches_in_index_order_losing_nothing(
    specs: list[list[tuple[str, int, int]]], data: st.DataObject, per_message: int
) -> None:
    bases = data.draw(
        st.lists(st.sampled_from([1.0, 2.0]), min_size=len(specs), max_size=len(specs))
    )
    batches, flat = _batches(specs, bases)
    got: list[int] = []
    for message in messages(batches, per_message):
        indices = _in_order(message)
        assert indices == sorted(set(indices))
        assert not got or indices[0] > got[-1]  # each message after the last one
        assert message.steps <= per_message or (len(message.runs) == 1 and not message.rows)
        got += indices
    assert got == flat


@settings(max_examples=300, deadline=None)
@given(_PIECES, st.data())
def test_a_batch_less_its_first_steps_keeps_the_rest_whole(
    spec: list[tuple[str, int, int]], data: st.DataObject
) -> None:
    (batch,), flat = _batches([spec], [1.0])
    count = data.draw(st.integers(0, len(flat) - 1))
    cut = batch.without_first(count)
    assert _in_order(cut) == flat[count:]
    assert cut.steps == len(flat) - count
    assert (cut.last_index, cut.last_end) == (batch.last_index, batch.last_end)
    for run_ in cut.runs:
        readings = unpack_readings(run_.readings)
        assert len(readings) == 2 * len(run_.samples) + 1
        assert readings[0] == run_.first * 10_000


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=5), st.integers(1, 30))
def test_a_trimmed_history_keeps_exactly_the_newest_steps(
    specs: list[list[tuple[str, int, int]]], at_most: int
) -> None:
    batches, flat = _batches(specs, [1.0] * len(specs))
    history = deque(batches)
    kept = trim(history, len(flat), -1e18, at_most)
    got = [i for batch in history for i in _in_order(batch)]
    assert kept == len(got) == min(at_most, len(flat))
    assert got == flat[len(flat) - kept :]
