"""watch's C-timed fast path (probe/stamps.py): every step published once, exactly as the
Python loop would have, whatever the loop does (a break, an exception, a loop inside it,
probe.step, phases, a publisher that stops draining).

Real probes on real sockets, read by the doc-only wire reader; segments made small so
that a pass crosses many of them.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from gputop_dl import probe
from gputop_dl.probe import core, stamps
from gputop_dl.probe.loader import infer_samples
from gputop_dl.probe.protocol import HostRow
from gputop_dl.probe.stamps import Segment
from gputop_dl.probe.watch import STALE_KEPT
from tests.conftest import SMALL_CHUNK
from tests.test_probe import BATCHES, attached, tcp_probe
from tests.wire_reader import WireReader

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_probe_left_behind", "small_segments")

CHUNK = SMALL_CHUNK  # a pass of 100 steps crosses 14 segments


def published(p: probe.Probe, reader: WireReader) -> list[dict[str, Any]]:
    p.close()
    reader.pump(1.0)
    reader.close()
    return reader.steps()


def batches(n: int, size: int = 8) -> list[np.ndarray]:
    return [np.full((size, 1), i) for i in range(n)]


def loader(n_samples: int, batch: int) -> DataLoader[Any]:
    xs = torch.arange(n_samples, dtype=torch.float32).unsqueeze(1)
    return DataLoader(TensorDataset(xs), batch_size=batch)


# --------------------------------------------------------------- rows, a pure function
def segment(
    stamps_us: list[int],
    *,
    plan: tuple[int, int, int] | None = None,
    counts: list[int | None] | None = None,
    position: int = 0,
    first: int = 0,
) -> Segment:
    seg = Segment(first, position, plan)
    seg.stamps.extend(t * 1000 for t in stamps_us)
    if counts is not None:
        assert seg.counts is not None
        seg.counts.extend(counts)
    return seg


@pytest.mark.parametrize(
    ("seg", "upto", "rows"),
    [
        # readings t0, t1 per step; a step's end is the next t0: (index, end, period, wait, n)
        (segment([0, 2, 10, 13, 30], counts=[4, 5]), 2, [(0, 10, 10, 2, 4), (1, 30, 20, 3, 5)]),
        # only complete steps: the third step has no end yet
        (
            segment([0, 2, 10, 13, 30, 31], counts=[4, 5, 6]),
            2,
            [(0, 10, 10, 2, 4), (1, 30, 20, 3, 5)],
        ),
        # a plan: `full` before position `known`, `last` at it, None past it
        (
            segment([0, 1, 2, 3, 4, 5, 6, 7, 8], plan=(32, 2, 5), position=0),
            4,
            [(0, 2, 2, 1, 32), (1, 4, 2, 1, 32), (2, 6, 2, 1, 5), (3, 8, 2, 1, None)],
        ),
        # the plan's last batch in a later segment; indices from the segment's first
        (
            segment([0, 1, 2, 3, 4], plan=(32, 99, 5), position=40, first=1000),
            2,
            [(1000, 2, 2, 1, 32), (1001, 4, 2, 1, 32)],
        ),
        # a segment wholly past the plan
        (segment([0, 1, 2], plan=(32, 3, 5), position=10), 1, [(0, 2, 2, 1, None)]),
    ],
)
def test_segment_rows_are_the_wire_rows_of_its_complete_steps(
    seg: Segment, upto: int, rows: list[tuple[Any, ...]]
) -> None:
    assert seg.complete() == upto
    assert seg.rows(0, upto) == [HostRow(*row) for row in rows]
    assert seg.taken == upto
    assert seg.rows(0, upto) == []  # taken: never published twice


def test_segment_rows_round_each_reading_once_to_the_microsecond() -> None:
    seg = segment([], counts=[1, 1])
    seg.stamps.extend([1_000_499, 1_000_500, 1_002_501, 1_003_499, 1_004_500])
    # base 1 ms: the readings round (half up) to 0, 1, 3, 3 and 5 us after it
    assert seg.rows(1_000_000, 2) == [HostRow(0, 3, 3, 1, 1), HostRow(1, 5, 2, 0, 1)]


# --------------------------------------------------------------- the loop, end to end
def test_a_long_pass_is_published_once_per_step_in_order_with_its_counts(p: probe.Probe) -> None:
    reader = attached(p)
    data = batches(100)
    seen = []
    in_segment = 0
    for batch in p.watch(data):
        seen.append(int(batch[0, 0]))
        in_segment += p._segment is not None
    rows = published(p, reader)
    assert seen == list(range(100))  # every batch, in order, to the training
    assert in_segment >= 90  # the fast path ran (the first steps settle the timing)
    assert [r["index"] for r in rows] == list(range(100))
    assert {r["samples"] for r in rows} == {8}
    ends = [r["end_time"] for r in rows]
    assert ends == sorted(ends)
    assert all(0 <= r["wait_s"] <= r["period_s"] for r in rows)
    assert reader.of_kind("steps")[-1]["dropped_steps"] == 0


def test_a_dataloaders_plan_gives_the_last_short_batch_its_count(p: probe.Probe) -> None:
    reader = attached(p)
    for _ in range(2):  # two passes: the second starts in Python again
        for _ in p.watch(loader(4 * 60 + 3, 4)):
            pass
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(122))
    counts = [r["samples"] for r in rows]
    assert counts == ([4] * 60 + [3]) * 2


def test_a_break_drops_the_open_step_and_the_next_pass_goes_on_counting(p: probe.Probe) -> None:
    reader = attached(p)
    watched = p.watch(batches(100))
    for i, _ in enumerate(watched):
        if i == 50:
            break
    assert p._segment is None and p._index == 50  # step 50 was left open: dropped
    assert len(list(watched)) == 100
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(150))


class FailingLoader:
    """40 batches, then a KeyError, each pass."""

    def __iter__(self) -> Iterator[np.ndarray]:
        yield from batches(40)
        raise KeyError("shard 7 missing")


def test_a_loader_exception_in_the_fast_path_keeps_its_type_and_the_steps_before(
    p: probe.Probe,
) -> None:
    reader = attached(p)
    seen = 0
    with pytest.raises(KeyError, match="shard 7") as info:
        for _ in p.watch(FailingLoader()):
            seen += 1
    assert seen == 40
    assert info.value.__context__ is None
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(40))
    loops = reader.of_kind("loop")
    assert loops[-1]["how"] == "exception:KeyError"


def test_a_loader_exception_in_a_plans_chain_is_an_exception_not_a_break(
    p: probe.Probe,
) -> None:
    """Counts from the plan: the batches pass from the C chain to the training with no
    frame of the probe's between, so the loader's exception passes it by. The fetch it
    left begun (an odd count of readings) tells it from a break; its type is unseen."""

    # A break at the same place is a break.
    for i, _ in enumerate(p.watch(FailingLoader(), samples=4)):
        if i == 38:
            break
    assert (p._loop, p._loop_exit, p._segment) == ("outside", "break", None)
    reader = attached(p)
    seen = 0
    with pytest.raises(KeyError, match="shard 7") as info:
        for _ in p.watch(FailingLoader(), samples=4):
            seen += 1
    assert seen == 40
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "__iter__"
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(38 + 40))
    assert {r["samples"] for r in rows} == {4}
    assert reader.of_kind("loop")[-1]["how"] == "exception"


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
@pytest.mark.parametrize("taken", [1, 30], ids=["python-timed", "c-timed"])
def test_closing_the_iterator_leaves_the_pass_as_a_break(
    p: probe.Probe, samples: int | None, taken: int
) -> None:
    """A pass's iterator closed early (torchdata's resume, contextlib.closing): the loop
    is left as by a break, the iterator ends, the next pass starts clean."""
    reader = attached(p)
    watched = p.watch(batches(60), samples=samples)
    it = iter(watched)
    for _ in range(taken):
        next(it)
    assert p._loop == "in-loop"
    it.close()  # type: ignore[attr-defined]
    assert (p._loop, p._loop_exit, p._segment, p._passes) == ("outside", "break", None, 0)
    with pytest.raises(StopIteration):
        next(it)
    assert len(list(watched)) == 60
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(taken - 1 + 60))  # the open step dropped


class SkippingLoader:
    """A loader whose iterator raises at the given batches and goes on after them, as a
    torch DataLoader does when a sample raises: a training may skip the bad batch. Each
    fetch takes FETCH_S, so a step's data wait is known."""

    FETCH_S = 0.003

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.Cursor(self)

    class Cursor:
        def __init__(self, loader: SkippingLoader) -> None:
            self.loader, self.at = loader, 0

        def __iter__(self) -> SkippingLoader.Cursor:
            return self

        def __next__(self) -> np.ndarray:
            at = self.at
            if at >= self.loader.n:
                raise StopIteration
            self.at += 1
            time.sleep(SkippingLoader.FETCH_S)
            if at in self.loader.bad:
                raise KeyError(f"bad sample {at}")
            return np.full((4, 1), at)


def skip_bad(iterable: Any) -> tuple[list[int], int]:
    """The loop that skips a bad batch: the batches it got, and the errors it skipped."""
    got, errors = [], 0
    it = iter(iterable)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return got, errors
        except KeyError:
            errors += 1
            continue
        got.append(int(batch[0, 0]))


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
@pytest.mark.parametrize(
    "bad", [{1}, {10}, {CHUNK + 2, 2 * CHUNK + 2}, {10, 11}], ids=["python", "c", "edge", "two"]
)
def test_a_loader_error_the_training_skips_changes_nothing(
    p: probe.Probe, samples: int | None, bad: set[int]
) -> None:
    """The loader raises and the training asks again: it gets every other batch, as from
    the bare loader (the probe once ended the pass there, or at the segment's end, and
    read the next steps' clock pairs shifted by one: a wait of the compute's length)."""
    bare = skip_bad(SkippingLoader(40, bad))
    assert bare == ([i for i in range(40) if i not in bad], len(bad))
    reader = attached(p)
    assert skip_bad(p.watch(SkippingLoader(40, bad), samples=samples)) == bare
    assert (p._loop, p._loop_exit) == ("outside", "exhausted")
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(40 - len(bad)))  # a failed fetch: no step
    assert {r["samples"] for r in rows} == {4}
    # Each step waited for its fetch (a shifted pair would read the loop's own time).
    assert min(r["wait_s"] for r in rows) >= 0.8 * SkippingLoader.FETCH_S, rows


def test_a_skipped_loader_error_holds_nothing_after_the_loop(p: probe.Probe) -> None:
    """The stretch that raised the loader's error kept it in its frame, which the error's
    traceback holds: a cycle that kept the pass (still "in-loop", the next epoch timed as a
    nested loop) and the loader's iterator until a garbage collection."""
    import gc

    loader = SkippingLoader(10, {1})
    gc.disable()
    try:
        it = iter(p.watch(loader))
        assert int(next(it)[0, 0]) == 0
        with pytest.raises(KeyError):
            next(it)  # a Python-timed step's fetch
        assert int(next(it)[0, 0]) == 2
        cursor = weakref.ref(it.stretches.gi_frame.f_locals["iterator"])  # type: ignore[attr-defined]
        del it  # the training lets go (a break)
        assert (p._loop, p._loop_exit, p._passes) == ("outside", "break", 0)
        assert cursor() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
def test_skipped_loader_errors_keep_a_bounded_number_of_stretches(
    p: probe.Probe, samples: int | None
) -> None:
    """A C-timed stretch that ended in a fetch is kept while the pass is held (another
    thread may be inside it: tests/test_watch_threads.py); a fetch that raised leaves it
    so for good, and a loader that raises every 20th batch grew the pass by one stretch
    (its readings with it) each time. The last few are kept."""
    bad = set(range(15, 2000, 20))
    SkippingLoader.FETCH_S, fetch = 0.0, SkippingLoader.FETCH_S
    try:
        loader = SkippingLoader(2000, bad)
        it = iter(p.watch(loader, samples=samples))
        got, errors = [], 0
        while True:
            try:
                got.append(int(next(it)[0, 0]))
            except StopIteration:
                break
            except KeyError:
                errors += 1
                assert len(it.turns.stale) <= STALE_KEPT  # type: ignore[attr-defined]
        assert errors == len(bad) and len(got) == 2000 - len(bad)
        assert 1 <= len(it.turns.stale) <= STALE_KEPT  # type: ignore[attr-defined]
    finally:
        SkippingLoader.FETCH_S = fetch


def test_a_skipped_bad_sample_keeps_the_plans_last_count(p: probe.Probe) -> None:
    """torch's sampler moves past a batch whose sample raised: the plan's position of the
    short last batch counts it (the probe had counted only the batches it passed on, and
    published the last one as full)."""

    class Samples(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return 162

        def __getitem__(self, i: int) -> Any:
            if i in (20, 101):
                raise KeyError(f"bad sample {i}")
            return torch.zeros(1)

    reader = attached(p)
    got, errors = skip_bad(p.watch(DataLoader(Samples(), batch_size=4)))
    assert errors == 2 and len(got) == 41 - 2
    rows = published(p, reader)
    assert [r["samples"] for r in rows] == [4] * 38 + [2]


def test_a_generator_exit_the_loader_raises_is_its_error(p: probe.Probe) -> None:
    """Only the pass's own close() is not the loader's: a GeneratorExit from the loader
    in a counting segment is an error the training may skip."""

    class Odd:
        def __init__(self) -> None:
            self.at = 0

        def __iter__(self) -> Odd:
            return self

        def __next__(self) -> np.ndarray:
            self.at += 1
            if self.at > 30:
                raise StopIteration
            if self.at == 13:
                raise GeneratorExit("from the loader")
            return np.zeros((4, 1))

    got, errors = [], 0
    it = iter(p.watch(Odd()))
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            break
        except GeneratorExit:
            errors += 1
    assert (len(got), errors) == (29, 1)
    assert (p._loop, p._loop_exit) == ("outside", "exhausted")


def test_an_evaluation_loop_inside_the_training_loop_leaves_it_in_the_loop(
    p: probe.Probe,
) -> None:
    """The evaluation's pass ended: the training loop goes on, in the loop (it was told
    "outside" for the rest of the epoch, which a viewer shows as a verdict)."""
    outer, inner = p.watch(batches(60)), p.watch(batches(5, size=2))
    states = []
    for i, _ in enumerate(outer):
        if i == 20:
            assert sum(1 for _ in inner) == 5
        if i in (21, 50):
            states.append((p._loop, p._passes))
    assert states == [("in-loop", 1)] * 2
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exhausted", 0)


def test_a_loader_error_inside_a_fetch_that_ran_a_loop_is_an_exception(p: probe.Probe) -> None:
    """A watched loop run inside the outer loop's fetch seals the outer segment; the fetch
    then raises: the loop was left on an exception, not by a break."""
    inner = p.watch(batches(2))

    def outer() -> Iterator[np.ndarray]:
        for k in range(20):
            assert sum(1 for _ in inner) == 2
            if k == 10:
                raise KeyError("shard 7 missing")
            yield np.full((8, 1), k)

    with pytest.raises(KeyError):
        for _ in p.watch(outer(), samples=8):
            pass
    assert (p._loop, p._loop_exit) == ("outside", "exception")


def test_a_pass_cannot_be_copied_or_pickled(p: probe.Probe) -> None:
    """A copy would share the loader's iterator and the pass's state (chain's own copy):
    refused, as for a generator."""
    import copy
    import pickle

    it = iter(p.watch(batches(20), samples=8))
    next(it)
    with pytest.raises(TypeError, match="cannot pickle or copy"):
        copy.copy(it)
    with pytest.raises(TypeError, match="cannot pickle or copy"):
        pickle.dumps(it)
    assert len(list(it)) == 19


def test_a_loop_inside_a_fast_loop_seals_it_and_both_go_on(p: probe.Probe) -> None:
    reader = attached(p)
    outer, inner = p.watch(batches(60)), p.watch(batches(5, size=2))
    seen = []
    for i, batch in enumerate(outer):
        seen.append(int(batch[0, 0]))
        if i in (20, 40):  # an evaluation inside the training loop, also watched
            assert sum(1 for _ in inner) == 5
    assert seen == list(range(60))
    rows = published(p, reader)
    indices = [r["index"] for r in rows]
    assert indices == sorted(set(indices))  # each index once, in order
    # the two outer steps an inner loop ran in are dropped, as in the Python loop
    assert [r["samples"] for r in rows].count(8) == 60 - 2
    assert [r["samples"] for r in rows].count(2) == 10


def test_step_samples_and_phases_inside_the_fast_path_go_to_their_own_step(
    p: probe.Probe,
) -> None:
    reader = attached(p)
    for i, _ in enumerate(p.watch(batches(50))):
        with p.phase("forward"):
            time.sleep(0.0002)
        if i % 2:
            p.step(samples=3)
    rows = published(p, reader)
    assert [r["samples"] for r in rows] == [8, 3] * 25
    assert all(dict(r["phases"]).get("forward", 0) >= 150e-6 for r in rows), rows[:3]


def test_a_batch_whose_count_raises_is_counted_as_unknown_not_raised(p: probe.Probe) -> None:
    class Odd:
        @property
        def shape(self) -> tuple[int, ...]:
            raise RuntimeError("lazy tensor not materialised")

    reader = attached(p)
    data: list[Any] = [*batches(30), Odd(), *batches(30)]
    assert sum(1 for _ in p.watch(data)) == 61
    rows = published(p, reader)
    assert len(rows) == 61
    assert rows[30]["samples"] is None and rows[31]["samples"] == 8


def test_every_kind_of_batch_reaches_the_loop_itself_in_order_with_its_count(
    p: probe.Probe,
) -> None:
    # The counter passes each batch on: a batch that is None, a repeated object, an
    # unhashable or empty container, or a dict must come through as itself, once, and be
    # counted as the Python-timed steps count it.
    same = np.zeros((3, 2))
    data: list[Any] = [
        *batches(10),  # the first steps settle the timing; the rest are C-timed
        None,
        same,
        same,
        [np.zeros((5, 1)), "label"],
        [],
        {"x": np.zeros((6, 1))},
        {},
        np.float64(1.0),
        np.zeros(()),
        (np.zeros((7, 1)),),
        *batches(10),
    ]
    reader = attached(p)
    seen, timed_in_c = [], []
    for batch in p.watch(data):
        seen.append(batch)
        timed_in_c.append(p._segment is not None)
    assert len(seen) == len(data) and all(a is b for a, b in zip(seen, data, strict=True))
    assert all(timed_in_c[10:20])
    counts = [r["samples"] for r in published(p, reader)]
    assert counts == [8] * 10 + [None, 3, 3, 5, None, 6, None, None, None, 7] + [8] * 10


@pytest.mark.parametrize("teacher", range(len(BATCHES)))
def test_batches_counted_in_the_loops_own_frame_get_infer_samples_answer(
    p: probe.Probe, teacher: int
) -> None:
    # The C-timed loop counts each batch in watch's frame the way the loader's batches
    # took so far (learned from them), and any other batch by the probe's counter: every
    # kind of batch after every kind learned must still be counted as infer_samples says.
    # Before each batch, enough of the teacher's that a segment starts with its way.
    data: list[Any] = [x for other in BATCHES for x in [*[BATCHES[teacher]] * 3 * CHUNK, other]]
    reader = attached(p)
    seen, timed_in_c = [], []
    for batch in p.watch(data):
        seen.append(batch)
        timed_in_c.append(p._segment is not None)
    assert all(a is b for a, b in zip(seen, data, strict=True))
    assert all(timed_in_c[CHUNK:])
    counts = [r["samples"] for r in published(p, reader)]
    assert counts == [infer_samples(batch) for batch in data]


def stall_publisher(p: probe.Probe, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Stop ``p``'s publisher draining; the function returned lets it drain again."""
    stalled = threading.Event()
    stalled.set()
    drain = type(p)._drain

    def maybe_drain(self: probe.Probe, *args: Any, **kwargs: Any) -> Any:
        return None if stalled.is_set() else drain(self, *args, **kwargs)  # None: nothing came

    monkeypatch.setattr(type(p), "_drain", maybe_drain)
    return stalled.clear


def steps_held(p: probe.Probe) -> int:
    held = p._segments
    return held[-1].first + held[-1].complete() - held[0].first if held else 0


def test_a_publisher_that_stops_draining_bounds_the_memory_and_counts_the_loss(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = attached(p)
    resume = stall_publisher(p, monkeypatch)
    bound = 10 * CHUNK
    monkeypatch.setattr(core, "MAX_BUFFERED_STEPS", bound)
    steps = 60 * CHUNK
    for _ in p.watch(batches(steps, size=1)):
        pass
    # The oldest segments went, not the memory: what is held is within a segment of the
    # bound, and no ended segment keeps its gate.
    assert bound - CHUNK < steps_held(p) < bound + CHUNK
    assert not any(segment.gate for segment in p._segments)
    held = steps_held(p)
    resume()
    rows = published(p, reader)
    indices = [r["index"] for r in rows]
    python_timed = [i for i in indices if i < 5]  # the pass's start, before the fast path
    assert python_timed == list(range(len(python_timed)))
    tail = indices[len(python_timed) :]
    assert tail == list(range(steps - len(tail), steps)) and len(tail) == held
    assert reader.of_kind("steps")[-1]["dropped_steps"] == steps - len(indices)


def test_short_passes_while_the_publisher_is_late_lose_no_step(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass makes at least one segment: 150 passes of 20 steps make 450 segments before
    # the publisher drains again. Held by their count (48, sized for 1,024-step
    # segments), the oldest were dropped; held by their steps, none is.
    reader = attached(p)
    resume = stall_publisher(p, monkeypatch)
    passes, steps = 150, 20
    loader = p.watch(batches(steps, size=3))
    for _ in range(passes):
        for _ in loader:
            pass
    assert len(p._segments) > 48
    resume()
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(passes * steps))
    assert {r["samples"] for r in rows} == {3}
    assert reader.of_kind("steps")[-1]["dropped_steps"] == 0


def test_segments_dropped_while_the_publisher_drains_are_each_published_or_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both threads pop from the segments held: the training thread the oldest past the
    # bound, the publisher those it has finished. With a bound of 3 segments' steps and
    # the publisher draining as fast as it can, every step is sent once or counted lost.
    monkeypatch.setattr(core, "MAX_BUFFERED_STEPS", 3 * CHUNK)
    live = tcp_probe("segments-race", system_interval_s=0, flush_interval_s=0.003)
    assert live.enabled, live.error
    reader = attached(live)  # closed with the probe by published()
    steps = 30_000  # 1.5 s: the publisher, idle at first, wakes within 0.5 s
    loader = live.watch(batches(500, size=2))
    for _ in range(steps // 500):
        for _ in loader:
            busy_until = time.perf_counter() + 50e-6  # a step's work: the publisher drains
            while time.perf_counter() < busy_until:
                pass
    rows = published(live, reader)
    indices = [r["index"] for r in rows]
    assert indices == sorted(set(indices)) and indices[-1] == steps - 1
    messages = reader.of_kind("steps")
    dropped = messages[-1]["dropped_steps"]
    assert len(messages) >= 10 and dropped > 0  # both threads popped, drain after drain
    assert len(indices) + dropped == steps


def test_segments_without_steps_are_bounded_by_their_count(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Passes of one batch: Python-timed, then a segment that finds the loader empty. Their
    # steps never reach the steps bound; the segments' count is bounded instead.
    reader = attached(p)
    resume = stall_publisher(p, monkeypatch)
    monkeypatch.setattr(core, "MAX_SEGMENTS", 10)
    loader = p.watch(batches(1))
    passes = 500
    for _ in range(passes):
        for _ in loader:
            pass
    assert len(p._segments) == 10
    assert all(segment.steps == 0 for segment in p._segments)
    resume()
    assert [r["index"] for r in published(p, reader)] == list(range(passes))
    # Two loop messages a pass filled the socket's queue and the steps were lost: only
    # the newest changes of a flush are sent, and the last says where the loop is.
    loops = reader.of_kind("loop")
    assert len(loops) <= 20
    assert (loops[-1]["state"], loops[-1]["step_index"]) == ("outside", passes)


def test_a_step_queued_while_a_drain_reads_is_never_sent_after_a_later_one(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The publisher pops the Python-timed steps, then reads the segments. A pass's first
    # step queued between the two, with the segment after it begun and a step done, went
    # out in the next drain, after that later step: a viewer drops it as older.
    drain = type(p)._drain
    stall_publisher(p, monkeypatch)  # this test drains by hand, at chosen moments
    loop = iter(p.watch(batches(20)))
    next(loop)  # step 0 open: Python-timed
    spans = type(p)._segment_spans

    def training_moves_meanwhile(self: probe.Probe, *args: Any) -> Any:
        # The first drain: the pass's Python-timed steps queued, a segment with a step.
        while p._segment is None or p._segment.complete() < 1:
            next(loop)
        return spans(self, *args)

    monkeypatch.setattr(type(p), "_segment_spans", training_moves_meanwhile)
    state = core._DrainState()
    drained = [drain(p, state, 0.0, force=False) for _ in range(2)]
    indices = [
        index
        for batch in drained
        if batch is not None
        for index in [row.index for row in batch.rows]
        + [run.first + i for run in batch.runs for i in range(len(run.samples))]
    ]
    assert indices == list(range(p._index_now())) and state.dropped_steps == 0
    for _ in loop:
        pass


def test_a_segment_begun_past_the_bound_lets_go_of_the_oldest_unpublished(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The publisher stalled for two passes: the training thread lets go of the oldest
    # segments itself, published or not, and the publisher then sends what is left.
    reader = attached(p)
    monkeypatch.setattr(core, "MAX_SEGMENTS", 3)
    stalled = threading.Event()
    real_spans = core.Probe._segment_spans

    def stalls(self: core.Probe, limit: int) -> list[tuple[Segment, int]]:
        stalled.wait(30)
        return real_spans(self, limit)

    monkeypatch.setattr(core.Probe, "_segment_spans", stalls)
    for _ in p.watch(batches(10 * CHUNK)):
        pass
    assert len(p._segments) <= 3
    stalled.set()
    for _ in p.watch(batches(2 * CHUNK)):
        pass
    assert len(p._segments) <= 3
    indices = [r["index"] for r in published(p, reader)]
    assert indices == sorted(set(indices)) and indices[-1] == 12 * CHUNK - 1
    assert len(indices) < 12 * CHUNK  # the oldest let go of, unpublished


class LetGoMeanwhile(deque[Segment]):
    """The segments held, where the training thread lets go of the oldest just after
    the publisher looked at it (deque operations are atomic, a sequence of two is not)."""

    def __getitem__(self, i: Any) -> Any:
        oldest = super().__getitem__(i)
        if i == 0 and len(self) == 2:
            self.popleft()
        return oldest


def test_the_publisher_lets_go_only_of_the_segment_it_found_finished() -> None:
    # No lock between the two threads (one taken without waiting leaked on a Ctrl-C):
    # the publisher removes what it found finished by identity; the oldest popped
    # instead would have been the open segment, its steps never sent.
    done, running = Segment(0, 0, (4, 10**6, 4)), Segment(5, 5, (4, 10**6, 4))
    done.steps = done.taken = 5
    held = SimpleNamespace(_segments=LetGoMeanwhile([done, running]))
    assert core.Probe._segment_spans(cast(core.Probe, held), 10**6) == []
    assert list(held._segments) == [running]


def test_a_loader_that_cannot_start_inside_a_timed_pass_leaves_that_pass_alone(
    p: probe.Probe,
) -> None:
    class Broken:
        def __iter__(self) -> Iterator[Any]:
            raise RuntimeError("cannot open the shards")

    reader = attached(p)
    broken = p.watch(Broken())
    seen = 0
    for i, _ in enumerate(p.watch(batches(40))):
        seen += 1
        if i == 20:
            timed_in_c = p._segment
            assert timed_in_c is not None
            with pytest.raises(RuntimeError, match="shards"):
                for _ in broken:
                    pass
            # A pass never entered is never left: the outer one is still the only one,
            # C-timed in the same segment, and no one is told it left its loop.
            assert p._passes == 1 and p._segment is timed_in_c
            assert p._loop == "in-loop"
    assert seen == 40
    rows = published(p, reader)
    assert [r["index"] for r in rows] == list(range(40))
    assert [m["state"] for m in reader.of_kind("loop")] == ["in-loop", "outside"]


def test_two_loops_stepped_in_turn_never_share_an_index(p: probe.Probe) -> None:
    reader = attached(p)
    first, second = p.watch(batches(60)), p.watch(batches(60, size=2))
    it = iter(first)
    for _ in range(30):  # the first loop alone long enough to be C-timed
        next(it)
    assert p._segment is not None
    pairs = list(zip(it, second, strict=False))  # then both, step by step
    assert len(pairs) == 30
    rows = published(p, reader)
    indices = [r["index"] for r in rows]
    assert indices == sorted(set(indices)), "two steps published under one index"
    assert 29 <= len(indices) <= 90


def test_the_publishers_rows_are_not_tracked_by_the_collector_and_keep_five_fields() -> None:
    import gc

    import msgspec

    seg = segment([0, 2, 10, 13, 30], counts=[4, None])
    rows = seg.rows(0, 2)
    # Tens of thousands a second: tracked, their allocations set off collections that
    # cost the publisher 0.13-0.16 us a step (bench/probe_overhead.py).
    assert not any(gc.is_tracked(row) for row in rows)
    # An unknown count is sent as nil: viewers need the first five fields of every row.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(rows[1])) == [1, 30, 20, 3, None]


def test_an_iterator_that_copies_itself_is_never_read_twice(p: probe.Probe) -> None:
    class Cursor:
        """An iterator with __copy__ (an independent cursor), C-timed like any other: the
        counter must not copy it (itertools.tee would) and so fetch every batch twice."""

        fetched = 0

        def __init__(self, start: int = 0) -> None:
            self.at = start

        def __iter__(self) -> Cursor:
            return self

        def __next__(self) -> np.ndarray:
            if self.at >= 40:
                raise StopIteration
            Cursor.fetched += 1
            self.at += 1
            return np.zeros((4, 1))

        def __copy__(self) -> Cursor:
            return Cursor(self.at)

    class Loader:
        def __iter__(self) -> Cursor:
            return Cursor()

    reader = attached(p)
    assert sum(1 for _ in p.watch(Loader())) == 40
    assert Cursor.fetched == 40
    rows = published(p, reader)
    assert [r["samples"] for r in rows] == [4] * 40


def test_a_settled_pass_keeps_no_object_per_clock_reading(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Readings are 8-byte integers in an array (training thread) and bytes (history), not
    # int objects: on a core shared with other work, the allocator the training thread
    # shares with the publisher made each drain's list of ints cost it ~0.6 ms.
    monkeypatch.setattr(stamps, "CHUNK_STEPS", 1024)
    steps = [1.0] * 20_000
    for _ in p.watch(steps[:100], samples=1):  # the first pass's imports and objects
        pass
    time.sleep(0.3)
    before = sys.getallocatedblocks()
    for i, _ in enumerate(p.watch(steps, samples=1)):
        if i == 10:  # the pass's Python-timed first steps drained: the rest go as runs
            time.sleep(0.6)
    time.sleep(0.6)  # drained into the history (its 20,000 steps all kept)
    grown = sys.getallocatedblocks() - before
    assert grown < 4_000, f"{grown} blocks kept for 40,001 readings"


def test_a_counted_pass_holds_no_batch_the_loop_has_moved_past(
    p: probe.Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stamps, "CHUNK_STEPS", 1024)
    # A batch can be large (pinned host memory, or already on the device): counting it
    # must not keep it alive. itertools.tee, which counted C-timed batches before, held
    # every batch until 57 had passed (its buffer's block): up to 56 batches more.
    alive: set[int] = set()

    class Batch:
        shape = (8, 1)

    def tracked() -> Iterator[Batch]:
        for i in range(300):
            batch = Batch()
            alive.add(i)
            weakref.finalize(batch, alive.discard, i)
            yield batch

    reader = attached(p)
    most = 0
    for batch in p.watch(tracked()):
        most = max(most, len(alive))
        del batch
    assert most == 1, f"{most} batches alive at once"  # only the one in hand
    assert [r["samples"] for r in published(p, reader)] == [8] * 300


START_S = 0.3  # SlowStart: what each pass's iter() takes


class SlowStart:
    """A loader that takes START_S to start every pass (a DataLoader forking its workers,
    a dataset opening its shards), then gives ``n`` batches."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[np.ndarray]:
        time.sleep(START_S)
        return iter(batches(self.n))


def test_a_pass_start_is_the_first_steps_wait_and_the_hello_names_it(p: probe.Probe) -> None:
    """The first step of a pass waits from the pass's start, iter() included (a
    DataLoader's workers are forked there: that time was in no step), and the hello
    names the steps that began a pass of the training loop (whose loader it describes),
    not those of an evaluation loop run inside one of its steps."""
    reader = attached(p)
    train, val = p.watch(SlowStart(30)), p.watch(SlowStart(2))
    for _ in range(3):
        for i, _ in enumerate(train):
            if i == 12:
                for _ in val:  # an evaluation inside a step
                    pass
    rows = published(p, reader)
    (listed,) = p.hello().passes  # the training's loader's only
    starts = listed.starts
    assert len(starts) == 3 and starts[0] == 0, starts
    # Each start's wait, as its first step's published wait (to the microsecond).
    waits = {r["index"]: r["wait_s"] for r in rows}
    assert len(listed.waits) == 3 and all(w is not None for w in listed.waits), listed
    for index, wait in zip(starts, listed.waits, strict=True):
        assert wait is not None and abs(wait - waits[index]) < 2e-6, (index, wait, waits[index])
    slow = [r["index"] for r in rows if r["wait_s"] >= 0.9 * START_S]
    assert slow[0::2] == list(starts), (slow, starts)  # and each evaluation's first step
    assert len(slow) == 6 and not set(slow[1::2]) & set(starts), slow
    for r in rows:
        if r["index"] in starts:
            assert r["period_s"] >= r["wait_s"] >= 0.9 * START_S, r
