"""A watched pass the training leaves without the probe seeing it leave, and loaders that
are their own iterators.

* The loader raised and the training went elsewhere, not asking for the next batch,
  while something keeps the pass (a notebook keeps the traceback; a script keeps the
  iterator in a variable). The probe says the loop was left ("outside", how), not a fetch
  that hangs ("stalled", critical), a new pass is the outermost one (C-timed, its start
  listed), and asking the old pass again enters it again.
* A loader whose ``__iter__`` restarts it and returns itself (FastTensorDataLoader's
  pattern) gives each pass its batches once: the probe's C iterators must not call
  ``iter()`` on it again.

Real probes on real sockets, real threads, a real torch DataLoader.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gputop_dl import probe
from gputop_dl.probe import core
from gputop_dl.probe.stack import fetch_code, fetch_under_way
from gputop_dl.probe.stamps import fetches
from tests.conftest import SMALL_CHUNK
from tests.test_probe import attached

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_probe_left_behind", "small_segments")

CHUNK = SMALL_CHUNK  # a pass of 60 steps crosses several segments


class OwnIterator:
    """A loader that is its own iterator: ``__iter__`` starts the pass again and returns
    itself (FastTensorDataLoader's pattern). Batch ``bad`` (1-based) raises KeyError
    once per pass; asked again, the pass goes on. ``slow``: batch that takes that long."""

    def __init__(self, n: int, bad: int = -1, slow: tuple[int, float] = (-1, 0.0)) -> None:
        self.n, self.bad, self.slow = n, bad, slow
        self.i = 0
        self.iters = 0

    def __iter__(self) -> OwnIterator:
        self.iters += 1
        self.i = 0
        return self

    def __next__(self) -> np.ndarray:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        if self.i == self.bad:
            raise KeyError(f"bad batch {self.i}")
        if self.i == self.slow[0]:
            time.sleep(self.slow[1])
        return np.full((4, 1), self.i)


def firsts(batches: Iterator[np.ndarray]) -> list[int]:
    return [int(b[0, 0]) for b in batches]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# ------------------------------------------------------------ loaders that restart in iter()
@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
@pytest.mark.parametrize("n", [3, 10, 60])
def test_a_loader_that_is_its_own_iterator_gives_each_pass_its_batches_once(
    p: probe.Probe, samples: int | None, n: int
) -> None:
    """Each C-timed segment's zip called iter() on the loader's iterator: a pass of 10
    gave 14 batches, one of 60 never ended."""
    own = OwnIterator(n)
    watched = p.watch(own, samples=samples)
    for _ in range(2):
        got = firsts(b for b, _ in zip(watched, range(10 * n), strict=False))
        assert got == list(range(1, n + 1))
    assert own.iters == 2


def test_fetches_keeps_iter_from_an_iterator_in_python_and_passes_c_ones_on() -> None:
    own = iter(OwnIterator(5))
    assert [int(b[0, 0]) for (b,) in zip(fetches(own), strict=False)] == [1, 2, 3, 4, 5]
    assert own.iters == 1
    for c_iterator in (iter([1, 2]), (x for x in range(2)), map(int, "12")):
        assert fetches(c_iterator) is c_iterator


# ------------------------------------------------------------------ a fetch that raised
class BadSample(Dataset[Any]):
    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        return torch.zeros(2)


def counted_by_user(batch: Any) -> int:
    return 4


# (label, the watched pass, the loop's exit once left, batches before the raise)
PASSES: dict[str, tuple[Callable[[probe.Probe], Any], str, int]] = {
    # a torch DataLoader: counts from its plan, steps in C, no frame sees the raise
    "dataloader": (
        lambda p: p.watch(DataLoader(BadSample(4 * 60, 4 * 30), batch_size=4)),
        "exception",
        30,
    ),
    "plan": (lambda p: p.watch(OwnIterator(60, bad=31), samples=4), "exception", 30),
    "counted": (lambda p: p.watch(OwnIterator(60, bad=31)), "exception:KeyError", 30),
    "python-timed": (
        lambda p: p.watch(OwnIterator(60, bad=31), samples=counted_by_user),
        "exception:KeyError",
        30,
    ),
}


def raise_and_keep(p: probe.Probe, which: str) -> tuple[Iterator[Any], int]:
    """Iterates the pass until its loader raises; returns the pass, kept (as a notebook
    keeps it through the traceback), and the batches it gave."""
    make, _, before = PASSES[which]
    it = iter(make(p))
    seen = 0
    with pytest.raises((KeyError, ValueError)):
        for _ in it:
            seen += 1
    assert seen == before
    return it, seen


@pytest.mark.parametrize("which", list(PASSES))
def test_a_pass_whose_fetch_raised_is_left_not_stalled(p: probe.Probe, which: str) -> None:
    how = PASSES[which][1]
    reader = attached(p)
    it, _ = raise_and_keep(p, which)
    assert p._loop == "in-loop"  # the probe cannot know yet: the training may ask again
    raised_at = time.time()
    assert wait_for(lambda: p._loop == "outside", 3 * core.LEFT_FETCH_S + 2)
    assert (p._loop_exit, p._passes) == (how, 0)
    assert p._loop_since is not None and p._loop_since <= raised_at + 0.1
    sent = lambda: [(m["state"], m["how"]) for m in reader.of_kind("loop")]  # noqa: E731
    assert wait_for(lambda: (reader.pump(0.1) or True) and sent()[-1:] == [("outside", how)], 5)
    del it
    gc.collect()
    assert (p._loop, p._passes) == ("outside", 0)  # dropped later: nothing changes
    reader.close()


@pytest.mark.parametrize("which", ["plan", "counted", "python-timed"])
def test_asking_a_left_pass_again_enters_it_again(p: probe.Probe, which: str) -> None:
    reader = attached(p)
    it, seen = raise_and_keep(p, which)
    assert wait_for(lambda: p._loop == "outside", 3 * core.LEFT_FETCH_S + 2)
    states: list[tuple[str, int]] = []
    for _ in it:  # the loader goes on after its bad batch
        states.append((p._loop, p._passes))
        seen += 1
    assert seen == 59  # every batch but the bad one, each once
    assert set(states) == {("in-loop", 1)}
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exhausted", 0)
    p.close()
    reader.pump(1.0)
    steps = reader.steps()
    assert [r["index"] for r in steps] == list(range(59))
    states_sent = [m["state"] for m in reader.of_kind("loop")]
    assert states_sent[-3:] == ["outside", "in-loop", "outside"]
    reader.close()


def test_a_new_pass_beside_a_left_one_is_the_outermost(p: probe.Probe) -> None:
    """A notebook's cell run again after the loader raised: before, the kept pass made
    the new one a loop inside it, timed in Python, its start not listed, and the loop
    "in-loop" for good once it ended (a stall, critical, 10 s later)."""
    it, _ = raise_and_keep(p, "dataloader")
    assert wait_for(lambda: p._loop == "outside", 3 * core.LEFT_FETCH_S + 2)
    during: list[tuple[int, bool]] = []
    for _ in p.watch(OwnIterator(40), samples=4):
        during.append((p._passes, p._segment is not None))
    assert {passes for passes, _ in during} == {1}
    assert any(timed_in_c for _, timed_in_c in during)
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exhausted", 0)
    starts = [kept.starts for kept in p._pass_starts.values()]
    assert [list(s) for s in starts] == [[0], [30]]
    del it
    gc.collect()  # the kept pass let go of at last: the new pass's state stays
    assert (p._loop, p._loop_exit, p._passes, p._segment) == ("outside", "exhausted", 0, None)


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
def test_a_slow_fetch_stays_in_the_loop(p: probe.Probe, samples: int | None) -> None:
    """A fetch that takes 3 LEFT_FETCH_S has its loader's frame on the stack: in the loop."""
    seconds = 3 * core.LEFT_FETCH_S + 0.5
    own = OwnIterator(40, slow=(30, seconds))
    states: list[str] = []
    stop = threading.Event()

    def watch_state() -> None:
        while not stop.is_set():
            states.append(p._loop)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_state)
    got = 0
    for i, _ in enumerate(p.watch(own, samples=samples)):
        if i == 20:
            watcher.start()
        got += 1
    stop.set()
    watcher.join()
    assert got == 40
    assert len(states) >= seconds / 0.05 / 2 and set(states) == {"in-loop"}


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
def test_a_generator_loaders_slow_fetch_stays_in_the_loop(
    p: probe.Probe, samples: int | None
) -> None:
    def slow() -> Iterator[np.ndarray]:
        for i in range(30):
            if i == 20:
                time.sleep(3 * core.LEFT_FETCH_S + 0.5)
            yield np.zeros((4, 1))

    left: list[str] = []
    for i, _ in enumerate(p.watch(slow(), samples=samples)):
        if p._loop != "in-loop":
            left.append(p._loop)
        if i == 19:
            start = time.monotonic()
    assert time.monotonic() - start >= 3 * core.LEFT_FETCH_S
    assert left == []  # the publisher found the generator's frame on the stack
    assert p._loop == "outside" and p._loop_exit == "exhausted"


# ------------------------------------------------------------------------- stack helpers
def test_fetch_code_is_the_code_a_fetch_runs() -> None:
    def gen() -> Iterator[int]:
        yield 1

    g = gen()
    assert fetch_code(g) is g.gi_code
    assert fetch_code(OwnIterator(1)) is OwnIterator.__next__.__code__
    assert fetch_code(iter([1])) is None
    assert fetch_code(map(int, "1")) is None

    class Proxy:  # a wrapt-style decorator: forwards __code__, retries around the call
        def __init__(self, fn: Callable[..., Any]) -> None:
            self.fn, self.__code__ = fn, fn.__code__

        def __get__(self, obj: Any, kind: Any = None) -> Any:
            return lambda: self.fn(obj)

    class Proxied(OwnIterator):
        __next__ = Proxy(OwnIterator.__next__)  # type: ignore[assignment]

    assert fetch_code(Proxied(1)) is None  # off the function's frame while it retries


def test_fetch_under_way_reads_the_threads_stack() -> None:
    inside = threading.Event()
    release = threading.Event()

    class Blocking:
        def __next__(self) -> int:
            inside.set()
            release.wait(10)
            return 1

    code = Blocking.__next__.__code__
    t = threading.Thread(target=lambda: next(Blocking()))  # type: ignore[call-overload]
    t.start()
    assert inside.wait(10)
    try:
        assert fetch_under_way(code) is True  # on another thread: a pool's may fetch
        assert fetch_under_way(fetch_code.__code__) is False
    finally:
        release.set()
        t.join()


def test_the_stall_rule_and_the_left_rule_never_overlap() -> None:
    """A fetch is judged left long before a viewer says "stalled": the stall's stack is
    taken from a loop still in it."""
    from gputop_dl.probe.stack import STALL_MIN_S

    assert 3 * core.LEFT_FETCH_S < STALL_MIN_S


# ------------------------------------------------------------- found by a hostile review
def test_a_pass_left_inside_another_leaves_the_loop_in_it_and_no_index_twice(
    p: probe.Probe,
) -> None:
    """An auxiliary loader's pass entered before the training's raises once, and the step
    after takes longer than LEFT_FETCH_S: declared left, it made the loop "outside" while
    the training ran, and asked again it took the indices of the training pass's C-timed
    steps (598 steps published, 301 indices)."""
    reader = attached(p)
    aux = iter(p.watch(OwnIterator(10**6, bad=3), samples=2))
    next(aux)  # entered first: the training's pass runs inside it
    states: set[tuple[str, int]] = set()
    for _ in p.watch(OwnIterator(120), samples=4):
        try:
            next(aux)
        except KeyError:
            time.sleep(2 * core.LEFT_FETCH_S + 0.5)  # a slow step after the skip
            assert p._passes == 1  # the aux pass was declared left: the training is alone
            continue
        states.add((p._loop, p._passes))
    assert states == {("in-loop", 2)}
    del aux
    p.close()
    reader.pump(1.0)
    indices = [r["index"] for r in reader.steps()]
    assert len(indices) == len(set(indices)) == indices[-1] + 1
    assert [m["state"] for m in reader.of_kind("loop")][-1] == "outside"
    reader.close()


def test_passes_that_raised_are_left_as_the_next_is_entered(p: probe.Probe) -> None:
    """Three failed cells, each run within LEFT_FETCH_S of the last: each new pass is the
    outermost (before, each was a loop inside the last, until the publisher saw them)."""
    kept = []
    for _ in range(3):
        it = iter(p.watch(OwnIterator(20, bad=5), samples=counted_by_user))
        with pytest.raises(KeyError):
            for _ in it:
                assert p._passes == 1
        kept.append(it)
    assert p._passes == 1  # the last one's raise: left once the publisher sees it
    assert wait_for(lambda: p._passes == 0, core.LEFT_FETCH_S + 2)
    assert (p._loop, p._loop_exit) == ("outside", "exception:KeyError")
    during = {p._passes for _ in p.watch(OwnIterator(30), samples=4)}
    assert during == {1} and (p._loop, p._loop_exit) == ("outside", "exhausted")


def test_a_slow_fetch_on_a_pool_thread_stays_in_the_loop(p: probe.Probe) -> None:
    """Batches fetched by a pool's threads, one of them slow: the fetch's frame is on a
    thread other than the one that last stepped."""
    from concurrent.futures import ThreadPoolExecutor

    it = iter(p.watch(OwnIterator(40, slow=(30, 3 * core.LEFT_FETCH_S + 0.5)), samples=4))
    pools = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    states = set()
    try:
        for k in range(40):
            next_batch = pools[k % 2].submit(next, it)
            while not next_batch.done():
                states.add(p._loop)
                time.sleep(0.05)
            next_batch.result()
    finally:
        for pool in pools:
            pool.shutdown()
    assert states == {"in-loop"}


def test_a_left_pass_finalized_under_the_loop_lock_does_not_deadlock(p: probe.Probe) -> None:
    """A collection that an allocation under the lock starts may finalize a dead pass,
    whose end takes the lock again on the same thread."""
    it, _ = raise_and_keep(p, "counted")
    assert wait_for(lambda: p._loop == "outside", 3 * core.LEFT_FETCH_S + 2)
    done = threading.Event()

    def finalize_holding_the_lock() -> None:
        nonlocal it
        with p._loop_lock:
            del it  # the pass's generator ends here, on this thread
            gc.collect()
        done.set()

    worker = threading.Thread(target=finalize_holding_the_lock, daemon=True)
    worker.start()
    assert done.wait(10), "deadlock: the pass's end waited for a lock its thread held"


class WrappedIter:
    """A class-based decorator on ``__iter__`` (wrapt, ``deprecated``): not a function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __get__(self, obj: Any, kind: Any = None) -> Callable[[], Any]:
        return lambda: self.fn(obj)


class DecoratedOwnIterator(OwnIterator):
    __iter__ = WrappedIter(OwnIterator.__iter__)  # type: ignore[assignment]


@pytest.mark.parametrize("samples", [4, None], ids=["plan", "counted"])
def test_an_iter_wrapped_by_a_decorator_object_is_not_called_again(
    p: probe.Probe, samples: int | None
) -> None:
    own = DecoratedOwnIterator(10)
    got = firsts(b for b, _ in zip(p.watch(own, samples=samples), range(100), strict=False))
    assert got == list(range(1, 11)) and own.iters == 1


def test_a_pass_left_during_probe_outside_stays_left(p: probe.Probe) -> None:
    it = iter(p.watch(OwnIterator(50, bad=20), samples=4))
    with pytest.raises(KeyError):
        for _ in it:
            pass
    with p.outside("saving a checkpoint after the error"):
        assert wait_for(lambda: p._passes == 0, 3 * core.LEFT_FETCH_S + 2)
    assert p._loop == "outside"  # not "in-loop" with no pass open: a stall, 10 s later
    del it


def test_probe_step_after_a_left_pass_records_its_steps(p: probe.Probe) -> None:
    reader = attached(p)
    it, seen = raise_and_keep(p, "plan")
    assert wait_for(lambda: p._loop == "outside", 3 * core.LEFT_FETCH_S + 2)
    for _ in range(21):  # a loop timed by hand after it: 20 steps
        p.step(4)
    p.close()
    reader.pump(1.0)
    assert [r["index"] for r in reader.steps()] == list(range(seen + 20))
    del it
    reader.close()


# ------------------------------------------------ iter() made, no batch asked for yet
def test_an_iterator_made_and_not_asked_is_outside_the_loop_until_its_first_batch(
    p: probe.Probe,
) -> None:
    """iter() of a watched loader makes its iterator at once (as the loader's own does);
    a script that does its setup before the first next() is outside the loop meanwhile,
    not in a fetch that hangs, and that setup is in no step's wait."""
    reader = attached(p)
    batches = iter(p.watch(DataLoader(torch.arange(40.0), batch_size=4, num_workers=1)))
    assert p._loop == "in-loop"  # iter() is the pass's start (workers forked)
    assert wait_for(lambda: p._loop == "outside")  # within LEFT_FETCH_S
    assert (p._loop_exit, p._passes) == ("not-iterated", 0)
    time.sleep(0.5)  # more setup
    assert len(list(batches)) == 10
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exhausted", 0)
    p.close()
    reader.pump(1.0)
    reader.close()
    steps = reader.steps()
    assert [s["index"] for s in steps] == list(range(10))
    assert steps[0]["wait_s"] < 0.5, steps[0]  # its fetch and iter(): not the 1.5 s setup
    hows = [loop["how"] for loop in reader.of_kind("loop")]
    assert hows[-3:] == ["not-iterated", None, "exhausted"], hows


def test_an_iterator_let_go_of_unused_leaves_the_loop(p: probe.Probe) -> None:
    iter(p.watch(DataLoader(torch.arange(8.0), batch_size=4)))
    gc.collect()
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "not-iterated", 0)


def test_an_iterator_made_first_leaves_the_next_pass_the_outermost(p: probe.Probe) -> None:
    """A script that makes its evaluation loader's iterator before the training loop
    (one batch of it every few steps): the training pass is the outermost (C-timed),
    not a loop inside the evaluation's, which is entered inside it at its first batch."""
    evaluation = iter(p.watch(list(range(100, 110))))
    seen = []
    for i, _ in enumerate(p.watch(np.arange(60.0).reshape(60, 1), samples=1)):
        if i == 5:
            assert p._segment is not None and p._passes == 1  # C-timed: the only pass
        if i % 20 == 19:
            seen.append(next(evaluation))
            assert p._passes == 2
    assert seen == [100, 101, 102]
    assert (p._passes, p._loop) == (1, "in-loop")  # the evaluation's pass stays open
    del evaluation
    gc.collect()
    assert (p._passes, p._loop) == (0, "outside")


def test_the_thread_that_iterates_a_pass_made_on_another_is_the_training_thread(
    p: probe.Probe,
) -> None:
    """iter() of a watched loader enters its pass at once, on the thread that calls it:
    a pass made on the main thread and iterated on another took its stall's stack of the
    main thread (found "not in the loader": its own work hanging, not a pass's start)."""
    batches = iter(p.watch(list(range(5))))
    assert p._train_thread == threading.get_ident()
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.extend(batches))
    worker.start()
    worker.join()
    assert seen == [0, 1, 2, 3, 4] and p._train_thread == worker.ident
