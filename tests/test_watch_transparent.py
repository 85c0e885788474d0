"""``probe.watch(loader)`` as the training sees it, where an audit that ran each loader
bare and watched side by side found them apart: attributes set on the loader, truth,
batches kept alive after the loop let go of them.

Real probes, real torch DataLoaders with worker processes.
"""

from __future__ import annotations

import _thread
import copy
import operator
import pickle
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gputop_dl import probe

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_probe_left_behind", "small_segments")


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


class Recorded:
    """An iterable whose ``iter()`` is seen: the pass's work starts there (a DataLoader
    forks its workers, which prefetch while the training does what comes before its
    first ``next()``; it draws its seed from torch's generator)."""

    def __init__(self, fail: bool = False) -> None:
        self.made = 0
        self.fail = fail

    def __iter__(self) -> Iterator[int]:
        self.made += 1
        if self.fail:
            raise OSError("no such shard")
        return iter(range(5))


def test_iter_of_a_watched_loader_makes_its_iterator_at_once(p: probe.Probe) -> None:
    """iter() of a watched loader waited for the first next() to call the loader's: a
    DataLoader's workers started late (the first batch after a second of setup took
    326 ms where the bare loader's was ready), and iter()'s exception came at next()."""
    for wrap in (lambda x: x, p.watch):
        loader = Recorded()
        it = iter(wrap(loader))
        assert loader.made == 1
        assert list(it) == [0, 1, 2, 3, 4] and loader.made == 1
        with pytest.raises(OSError, match="no such shard"):
            iter(wrap(Recorded(fail=True)))
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exception:OSError", 0)


def test_lightnings_check_that_a_loader_is_iterable_is_what_it_is_for_the_loader(
    p: probe.Probe,
) -> None:
    """Lightning calls iter() on a loader that is no DataLoader (a watched one is none)
    only to check it is iterable, and drops the iterator; on a DataLoader it calls
    nothing. A watched DataLoader's iter() there would draw its seed from torch's
    generator (every epoch's shuffle changed) and fork its workers for nothing: it waits
    for a first batch. Any other loader's iter() runs, as it does bare."""
    pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from lightning.pytorch.trainer.connectors.data_connector import (
        _check_dataloader_iterable,
        _DataLoaderSource,
    )
    from lightning.pytorch.trainer.states import TrainerFn

    def check(loader: Any) -> None:
        _check_dataloader_iterable(loader, _DataLoaderSource(None, ""), TrainerFn.FITTING)

    shuffled = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, shuffle=True)
    for wrap in (lambda x: x, p.watch):
        before = torch.get_rng_state()
        check(wrap(shuffled))
        assert torch.equal(torch.get_rng_state(), before)
        other = Recorded()
        check(wrap(other))
        assert other.made == 1
    iter(shuffled)
    assert not torch.equal(torch.get_rng_state(), before)  # what a DataLoader's iter() does


class Stream(torch.utils.data.IterableDataset[int]):  # type: ignore[misc]
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def length(make: Callable[[], Any]) -> Any:
    """``len(make())``, or the TypeError's text."""
    try:
        return len(make())
    except TypeError as exc:
        return str(exc)


@pytest.mark.parametrize("dataset", [range(10), Stream()], ids=["map-style", "iterable"])
def test_a_passs_length_before_its_first_batch_is_its_iterators(
    p: probe.Probe, dataset: Any
) -> None:
    bare = DataLoader(dataset, batch_size=4)
    assert length(lambda: iter(p.watch(bare))) == length(lambda: iter(bare))
    assert length(lambda: iter(p.watch([1, 2]))) == length(lambda: iter([1, 2]))  # TypeError


class EpochStream:
    """An iterator that ends each epoch with StopIteration and then goes on, as DALI's
    iterators reset themselves."""

    def __init__(self) -> None:
        self.i = 0

    def __iter__(self) -> EpochStream:
        return self

    def __next__(self) -> int:
        self.i += 1
        if self.i % 4 == 0 or self.i > 12:
            raise StopIteration
        return self.i


def test_next_after_an_epochs_stop_iteration_goes_on_as_the_iterators(p: probe.Probe) -> None:
    """next() after the iterator's StopIteration asked the ended pass: every epoch after
    the first was empty (a training of one epoch)."""
    runs = []
    for it in (EpochStream(), p.watch(EpochStream())):
        epochs: list[list[int]] = [[]]
        for _ in range(16):
            try:
                epochs[-1].append(next(it))
            except StopIteration:
                epochs.append([])
        runs.append(epochs)
    assert runs[1] == runs[0] and runs[0][:3] == [[1, 2, 3], [5, 6, 7], [9, 10, 11]]


class Shards:
    """Its iter() asks an exhausted source for the next shard: StopIteration."""

    def __iter__(self) -> Iterator[int]:
        return iter([next(iter(()))])


def test_a_stop_iteration_from_the_loaders_iter_is_raised_as_it_is(p: probe.Probe) -> None:
    """iter() ran in the probe's generator, which made it "RuntimeError: generator raised
    StopIteration"."""
    for loader in (Shards(), p.watch(Shards())):
        with pytest.raises(StopIteration):
            iter(loader)
    assert (p._passes, p._loop) == (0, "outside")
    assert list(p.watch(range(3))) == [0, 1, 2]


def test_close_of_a_pass_closes_the_loaders_iterator_as_its_own_close_does(
    p: probe.Probe,
) -> None:
    cleaned: list[str] = []

    class Reader:
        def __iter__(self) -> Iterator[int]:
            try:
                yield from range(100)
            finally:
                cleaned.append("closed")

    for loader in (Reader(), p.watch(Reader())):
        it = iter(loader)
        assert next(it) == 0
        it.close()  # type: ignore[attr-defined]
        assert cleaned.pop() == "closed" and next(it, "ended") == "ended"
    # A break leaves the loader's iterator to the collector, as a bare loop does.
    watched = p.watch(numbers(10))
    assert next(watched) == 0
    for n in watched:
        if n == 3:
            break
    assert next(watched) == 4  # the generator goes on: only the pass was left


def test_a_pass_has_its_loader_iterators_surface(p: probe.Probe) -> None:
    loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=4)
    bare, watched = iter(loader), iter(p.watch(loader))
    assert watched._num_yielded == bare._num_yielded == 0  # type: ignore[attr-defined]
    assert operator.length_hint(watched) == operator.length_hint(bare) == 3
    assert weakref.ref(watched)() is watched
    next(watched)
    assert watched._num_yielded == 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no_such"):
        watched.no_such  # type: ignore[attr-defined]  # noqa: B018


def test_the_thread_a_c_callable_runs_may_iterate_a_watched_loader(p: probe.Probe) -> None:
    """iter() asked from C, with no Python frame above it, raised "call stack is not deep
    enough" and the thread died."""
    out: list[int] = []
    _thread.start_new_thread(out.extend, (p.watch(range(3)),))  # no Python frame at all
    deadline = time.monotonic() + 10
    while len(out) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out == [0, 1, 2]


def test_copy_and_pickle_of_a_watched_loader_are_the_loaders(p: probe.Probe) -> None:
    """copy.copy shared the loader (a setting on the copy reached the original); a
    samples= lambda (the README's) made pickling fail where the loader alone pickled."""
    original: Any = p.watch(EpochLoader(), samples=lambda batch: 1)
    duplicate = copy.copy(original)
    duplicate.epoch = 5
    assert original.epoch == 0 and duplicate.epoch == 5
    assert list(duplicate) == list(EpochLoader.__iter__(duplicate.wrapped))
    back = pickle.loads(pickle.dumps(original))
    assert list(back) == list(original) and back.wrapped.epoch == 0
    deep = copy.deepcopy(original)  # keeps the lambda, as copy keeps a function
    assert deep._gputop_samples is original._gputop_samples
    assert deep.wrapped is not original.wrapped and list(deep) == list(original)


def test_a_loaders_exception_keeps_its_own_context(p: probe.Probe) -> None:
    """next() asked inside the training's `except` (a retry): the loader's exception had
    the training's as its context, in place of the loader's own."""

    def shards() -> Iterator[int]:
        yield 1
        try:
            raise KeyError("shard-7")
        except KeyError:
            raise ValueError("bad batch")  # noqa: B904  (its context: the KeyError)

    chains = []
    for loader in (shards(), p.watch(shards())):
        it = iter(loader)
        next(it)
        try:
            raise TimeoutError("step timed out")
        except TimeoutError:
            with pytest.raises(ValueError) as raised:
                next(it)
        chain, exc = [], raised.value
        while exc is not None:
            chain.append(repr(exc))
            exc = exc.__context__
        chains.append(chain)
    assert chains[1] == chains[0]
    assert chains[0] == [
        "ValueError('bad batch')",
        "KeyError('shard-7')",
        "TimeoutError('step timed out')",
    ]


class Counting:
    """A loader with attributes named as a wrapper might name its own."""

    def __init__(self) -> None:
        self._count, self._info, self._samples, self._probe = 7, {"source": "s3"}, [1, 2], "p"

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._count))


def test_a_loaders_private_attributes_are_its_own_through_the_wrapper(p: probe.Probe) -> None:
    """`loader._count` read the wrapper's counter, and setting it broke the loop
    ("'int' object is not callable")."""
    for loader in (Counting(), p.watch(Counting())):
        got: Any = loader
        assert (got._count, got._info, got._samples, got._probe) == (
            7,
            {"source": "s3"},
            [1, 2],
            "p",
        )
        got._count = 3
        assert list(got) == [0, 1, 2]
