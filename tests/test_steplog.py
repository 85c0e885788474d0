"""StepLog reads as the deque of StepRecords it replaces, whatever its chunks are."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe.messages import StepRecord, Steps
from gputop_dl.probe.protocol import StepRows, decode, encode
from gputop_dl.tui.state.steplog import StepLog

T0 = 1_700_000_000.0


def chunk(first: int, count: int, as_rows: bool) -> tuple[list[StepRecord], object]:
    """``count`` records from index ``first`` (10 ms apart, whole microseconds), and the
    chunk a Run keeps for them: a decoded message's StepRows or a list."""
    records = [
        StepRecord(i, T0 + 0.01 * (i + 1), 0.01 + 0.001 * (i % 3), 0.002, 8)
        for i in range(first, first + count)
    ]
    if not as_rows:
        return records, list(records)
    frames = encode(Steps("h:1", tuple(records), 0, 0))
    message, twin = decode(frames), decode(frames)  # the twin is read, the log's is not
    assert isinstance(message, Steps) and isinstance(message.records, StepRows)
    assert isinstance(twin, Steps)
    return list(twin.records), message.records


Op = tuple[str, int, bool]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 30), st.booleans()),
        st.tuples(st.just("popleft"), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("drop_oldest"), st.integers(0, 40), st.booleans()),
        st.tuples(st.just("drop_before"), st.integers(0, 400), st.booleans()),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, maxlen=st.integers(5, 120), keep=st.integers(0, 20))
def test_a_step_log_reads_as_a_deque(ops: list[Op], maxlen: int, keep: int) -> None:
    log = StepLog(maxlen)
    model: deque[StepRecord] = deque(maxlen=maxlen)
    index = 0
    for op, number, as_rows in ops:
        if op == "extend":
            records, kept = chunk(index, number, as_rows)
            index += number
            log.extend(kept, number)  # type: ignore[arg-type]
            model.extend(records)
        elif op == "popleft":
            for _ in range(min(number, len(model))):
                log.popleft()
                model.popleft()
        elif op == "drop_oldest":
            log.drop_oldest(number)
            for _ in range(min(number, len(model))):
                model.popleft()
        else:
            end = T0 + 0.01 * number
            log.drop_before(end, keep)
            while len(model) > keep and model[0].end_time < end:
                model.popleft()
        assert len(log) == len(model) and bool(log) == bool(model)
        assert list(log) == list(model)
        assert list(reversed(log)) == list(reversed(model))
        oldest = model[0].end_time if model else float("inf")
        # Never later than the oldest record (popleft leaves it behind); exact once
        # drop_before looked.
        assert log.oldest_end <= oldest
        if op == "drop_before":
            assert log.oldest_end == oldest
        periods = [r.period_s for r in reversed(model)][:7]
        assert log.periods(7) == periods


def test_popleft_on_an_empty_log_raises_as_a_deque_does() -> None:
    log = StepLog(3)
    try:
        log.popleft()
    except IndexError:
        return
    raise AssertionError("no IndexError")
