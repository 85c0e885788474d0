"""``probe.watch(loader)`` as the training sees it, where an audit that ran each loader
bare and watched side by side found them apart: attributes set on the loader, truth,
batches kept alive after the loop let go of them.

Real probes, real torch DataLoaders with worker processes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gputop_dl import probe
from gputop_dl.probe import stamps

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_probe_left_behind")


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stamps, "CHUNK_STEPS", 7)  # a pass of 60 crosses several


@pytest.fixture
def p() -> Iterator[probe.Probe]:
    live = probe.Probe(name="transparent", system_interval_s=0)
    assert live.enabled, live.error
    yield live
    live.close()


class EpochLoader:
    """Shuffles by ``self.epoch``, which the training sets before each pass."""

    def __init__(self) -> None:
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        order = list(range(8))
        np.random.default_rng(self.epoch).shuffle(order)
        return iter(order)


def test_attributes_set_on_the_loader_reach_it(p: probe.Probe) -> None:
    """`loader.epoch = e` stayed on the wrapper: every epoch had the same order."""
    orders = {}
    for wrap in (lambda x: x, p.watch):
        loader: Any = wrap(EpochLoader())
        orders[wrap] = []
        for epoch in range(3):
            loader.epoch = epoch
            orders[wrap].append(list(loader))
        del loader.epoch
        assert not hasattr(loader, "epoch")
    bare, watched = orders.values()
    assert watched == bare and len({tuple(o) for o in watched}) == 3


def test_truth_is_the_loaders_and_a_pass_is_true_as_an_iterator(p: probe.Probe) -> None:
    """bool() took __len__: a generator's raised TypeError, as did a pass's before its
    first batch (a pass has a len() since the iterator's of a DataLoader has one)."""
    assert bool(p.watch(x for x in range(3))) is True
    assert bool(p.watch([])) is False and bool(p.watch([1])) is True
    assert bool(iter(p.watch([1, 2]))) is True
    assert bool(iter(p.watch(x for x in range(3)))) is True
    empty = DataLoader(TensorDataset(torch.zeros(0, 2)), batch_size=2)
    assert bool(iter(p.watch(empty))) is bool(iter(empty)) is False


class Batch:
    """A batch that can say when it died."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.array = np.zeros((4, 1))

    def __len__(self) -> int:
        return 4


class Tracked:
    """Each fetch notes whether the batch before it is still alive: a loop that drops
    its batch has none then."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.alive_at_fetch: list[bool] = []

    def __iter__(self) -> Iterator[Batch]:
        last: Callable[[], Batch | None] = lambda: None  # noqa: E731
        for i in range(self.n):
            self.alive_at_fetch.append(last() is not None)
            batch = Batch(i)
            last = weakref.ref(batch)
            yield batch
            del batch


def four(batch: Any) -> int:
    return 4


def test_a_batch_the_loop_dropped_is_not_kept_through_the_next_python_timed_fetch(
    p: probe.Probe,
) -> None:
    """The Python-timed loop (a pass's first steps; every step under CUDA events) kept
    the last batch until the next came: a device batch the loop had let go of stayed in
    memory through the fetch. (The C-timed steps' zip tuple holds it, as a bare loop's
    variable would without the `del`: stamps.Segment.timed.)"""
    tracked = Tracked(60)
    for batch in p.watch(tracked, samples=four):  # a user's function: timed in Python
        del batch
    assert tracked.alive_at_fetch == [False] * 60


def test_finding_a_wrappers_workers_keeps_none_of_its_batches(p: probe.Probe) -> None:
    """accelerate's DataLoaderShard iterates the DataLoader in a generator, among whose
    locals the probe finds the workers. Reading ``gi_frame.f_locals`` stored a copy of
    them in the frame (Python 3.11): its first two batches stayed until the pass ended
    (on the device, where accelerate puts them)."""
    accelerate = pytest.importorskip("accelerate.data_loader")
    loader = accelerate.DataLoaderShard(
        TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2
    )
    seen: list[weakref.ref[Any]] = []
    alive_after: list[int] = []
    for i, (x,) in enumerate(p.watch(loader)):
        seen.append(weakref.ref(x))
        del x
        alive_after.append(sum(r() is not None for r in seen[:-1]))
        if i == 10:
            break
    assert p._loader_info is not None and len(p._loader_info.worker_pids) == 2
    assert alive_after == [0] * 11


class OwnIterator:
    """A loader that is its own iterator: ``iter()`` starts it again."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __iter__(self) -> OwnIterator:
        self.i = 0
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i


def numbers(n: int) -> Iterator[int]:
    yield from range(n)


@pytest.mark.parametrize(
    "make", [lambda: numbers(10), lambda: OwnIterator(10)], ids=["generator", "own"]
)
def test_next_on_a_watched_iterator_is_the_iterators(
    p: probe.Probe, make: Callable[[], Any]
) -> None:
    """An iterator watched raised "not an iterator" at next() (a step loop that asks
    ``next(batches)``)."""
    runs = []
    for wrap in (lambda x: x, p.watch):
        it: Any = wrap(make())
        first = [next(it), next(it)]
        rest = list(it)  # iter(): a generator goes on, a loader of its own starts again
        runs.append((first, rest, next(it, "end")))
    assert runs[0] == runs[1]
    assert p._passes == 0 and p._loop_exit == "exhausted"


def test_a_watched_iterator_times_the_steps_next_asks_for(p: probe.Probe) -> None:
    it: Any = p.watch(numbers(3000))
    assert sum(next(it) for _ in range(2500)) == sum(range(2500))
    assert p._passes == 1 and p._index_now() >= 2490  # timed, C-timed after the first
    assert list(it) == list(range(2500, 3000))  # the pass next() was in, left as a break
    assert p._passes == 0


def test_a_watched_loader_is_still_no_iterator(p: probe.Probe) -> None:
    with pytest.raises(TypeError, match="not an iterator"):
        next(p.watch([1, 2]))  # type: ignore[call-overload]  # as next([1, 2])
