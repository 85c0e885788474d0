"""``probe.watch(loader)``: the loader itself, with every pass over it timed.

A ``Watched`` object is what the user (or a framework) iterates instead of the loader.
It must be invisible to the training: each ``iter()`` is a new pass (an epoch), ``len()``
and every attribute are the loader's, errors from the loader keep their own type and
traceback, and it pickles as the loader plus options. Only the loop itself is timed: its
first steps in Python (they settle the timing method and the counts), the rest of the pass
by a chain of C iterators (probe/stamps.py) while no other loop is open, which hands its
batches to the training directly when their counts are known in advance.
"""

from __future__ import annotations

import copy
import functools
import logging
import pickle
import sys
import time
from _thread import RLock, get_ident, start_new_thread
from collections.abc import Callable, Generator, Iterable, Iterator
from ctypes import c_ulong, py_object, pythonapi
from itertools import chain, repeat
from operator import length_hint
from signal import SIGINT, default_int_handler, getsignal, pthread_kill
from threading import main_thread
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from gputop_dl.probe import loader
from gputop_dl.probe.core import HeldPass, as_count
from gputop_dl.probe.stack import ITERABLE_CHECK_FRAMES, code_in, fetch_code
from gputop_dl.probe.stamps import Segment, fetches

if TYPE_CHECKING:
    from gputop_dl.probe.core import Probe
    from gputop_dl.probe.messages import LoaderInfo

log = logging.getLogger("gputop.probe")

T = TypeVar("T")
Samples = int | Callable[[Any], int] | None

# Probe._open while a step opened by the loop below is running: its times and count stay
# in the loop's locals. probe.step(samples) replaces it with a tuple carrying the count.
OPENED_IN_WATCH: tuple[float, float, None, None] = (0.0, 0.0, None, None)
UNCOUNTED: Any = object()  # a batch the C-timed loop's own lines could not count
STALE_KEPT = 8  # C stretches kept after they ended in a fetch: threads fetching at once
# Loop.how for a pass a second thread took part in: the rest of it is not timed.
# (its own way to leave, not "marked:": the script marked nothing)
SHARED_HOW = "shared"
# Loop.how for a pass whose iterator iter() made with no batch asked of it yet (for
# LEFT_FETCH_S: the training does something else first), or let go of so.
NOT_ITERATED = "not-iterated"

_pytree_registered = False
_warned: set[str] = set()

CALLBACKS = (
    "gputop_dl.probe.integrations.lightning.GputopCallback (Lightning) or "
    "gputop_dl.probe.integrations.transformers.GputopCallback (HF Trainer)"
)


class _Pass(chain[T]):
    """A pass as the training iterates it: ``chain``'s own C ``next`` a step (a subclass
    that defines no ``__next__`` keeps it), and the ``close()`` a generator has, which
    code that stops a loader's iterator early calls (torchdata's resume, ``closing()``).
    """

    __slots__ = ("__weakref__", "loader", "stretches", "turns")
    stretches: Generator[Iterable[T], None, None]
    turns: _Turns  # holds what a thread may be inside while the pass is held
    loader: Iterable[T]  # what the pass iterates

    def __len__(self) -> int:
        """The loader's iterator's length, as ``len(iter(loader))`` is (a torch
        DataLoader's iterator has one: a progress bar's total; TypeError as its). Before
        the pass's first batch made that iterator, a torch DataLoader's own length over a
        map-style dataset, which its iterator's is; any other's is unknown then."""
        iterator = self.turns.iterator
        if iterator is not None:
            return len(iterator)
        if loader.is_torch_loader(type(self.loader)) and loader.map_style(self.loader):
            return len(self.loader)  # type: ignore[arg-type]
        raise TypeError(
            f"a pass over {type(self.loader).__name__!r} has no len() before its first batch"
        )

    def __bool__(self) -> bool:
        """True, as an iterator is, or its loader's iterator's truth (one with a length:
        false when empty); ``bool()`` would otherwise take ``__len__``'s TypeError."""
        iterator = self.turns.iterator
        if iterator is not None:
            return bool(iterator)
        try:
            return len(self) > 0
        except TypeError:
            return True

    def __getattr__(self, name: str) -> Any:
        """The loader's iterator's own attributes (a DataLoader iterator's
        ``_num_yielded``), as on ``iter(loader)``. Only for names the pass lacks."""
        # (Its own slots unset, before _pass set them: no recursion through self.turns.)
        own = name.startswith("__") or name in _Pass.__slots__
        iterator = None if own else self.turns.iterator
        if iterator is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(iterator, name)

    def __length_hint__(self) -> int:
        """The loader's iterator's hint, as ``operator.length_hint(iter(loader))``."""
        iterator = self.turns.iterator
        return 0 if iterator is None else length_hint(iterator)

    def close(self) -> None:
        """Leave the pass as a ``break`` does, and close the loader's iterator as
        ``iter(loader).close()`` does (a generator's cleanup runs, a reader's file is
        closed); the next ``next()`` ends the pass."""
        self.leave()
        close = getattr(self.turns.iterator, "close", None)
        if callable(close):
            close()

    def leave(self) -> None:
        """Leave the pass as a ``break`` does; the loader's iterator stays as it is."""
        self.turns.closed_by_call = True  # a Ctrl-C in the probe's lines is raised here
        self.stretches.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # chain's own would copy (copy.copy) or pickle a pass that shares this one's
        # loader iterator and state; a generator refuses, and so does this.
        raise TypeError(f"cannot pickle or copy a pass over {type(self).__name__!r}")


class _Turns:
    """Who iterates a pass. The chain asks for each stretch through :func:`_next_stretch`:
    the thread that iterates the pass (its owner) gets the timed ones. A thread that asks
    while no other is fetching takes the pass over (one thread after another, as an
    executor's do); one that asks while another is fetching (a thread-safe loader shared
    by two threads at once) gets the loader's own iterator for the rest of the pass,
    untimed, for every thread. Before, a second thread made the chain free the C stretch
    the first was fetching in (a segmentation fault), or ended the pass early for both.

    What a thread may still be inside when the chain lets go of it (a stretch that ended
    in a fetch, the loader's iterator once shared) is kept while the pass is held."""

    __slots__ = (
        "closed_by_call",
        "current",
        "ended",
        "iterator",
        "kept",
        "lock",
        "owner",
        "rest",
        "segment",
        "stale",
        "stopped",
    )

    def __init__(self) -> None:
        self.lock = RLock()  # held by the owner inside the generator
        # the thread that iterates the pass; the loader's iterator once iter() made it;
        # the C-timed stretch the chain iterates, while it does, and its segment; the
        # loader's iterator for every thread, once shared
        self.owner: int | None = None
        self.iterator: Any = None
        self.current: Any = None
        self.segment: Segment | None = None
        self.rest: Any = None
        self.ended: list[bool] = []  # [True]: the shared iterator ran out
        self.kept: tuple[Any, ...] = ()  # what the shared pass's threads may be in
        self.stale: tuple[Any, ...] = ()  # C stretches that ended in a fetch (STALE_KEPT)
        self.closed_by_call = False  # close() called, not a finalizer's close
        # The StopIteration the loader's iter() raised: a generator cannot raise it
        # (PEP 479 makes it a RuntimeError), so the pass's maker does.
        self.stopped: StopIteration | None = None


def _while_closing(interrupt: KeyboardInterrupt, closing: bool) -> bool:
    """Whether a Ctrl-C came as the generator was being closed: in its GeneratorExit
    handler (``closing``), or raised while that exception was handled."""
    return closing or isinstance(interrupt.__context__, GeneratorExit)


def _interrupt_again(interrupt: KeyboardInterrupt) -> None:
    """A Ctrl-C that landed in the probe's lines while a pass was let go of, where a
    finalizer prints any exception and drops it (the training went on): delivered to the
    main thread again, from another thread, so that it comes in the training's own code
    a few milliseconds later (from this thread it came at once, inside the finalizer)."""
    start_new_thread(_to_main_again, (type(interrupt),))


def _to_main_again(kind: type[KeyboardInterrupt]) -> None:
    ident = main_thread().ident
    handler = getsignal(SIGINT)
    # (A Ctrl-C came through a handler of Python's: never SIG_DFL's kill here.)
    if ident is None or not callable(handler):
        return
    if handler is default_int_handler:
        # SIGINT sent again: a blocking wait is interrupted as by the first
        # (interrupt_main() only flags the main thread: a wait went on to its end).
        pthread_kill(ident, SIGINT)
    else:
        # The training's own handler ran for this Ctrl-C already; called again, one that
        # counts them ("twice to quit at once") read one as two. Only its exception is
        # raised again, at the main thread's next instruction (after a blocking wait).
        pythonapi.PyThreadState_SetAsyncExc(c_ulong(ident), py_object(kind))


def _next_stretch(turns: _Turns, stretches: Generator[Iterable[T], None, None]) -> Iterable[T]:
    """The pass's next stretch for the chain (see _Turns); StopIteration after the last.
    (Not ``iter(callable, sentinel)``, which ends by clearing its sentinel: a thread
    still inside the call then compares its result with NULL, a crash.)"""
    if turns.owner == get_ident() and turns.rest is None:
        return _timed(turns, stretches)
    return _asked_by_another(turns, stretches)


def _timed(turns: _Turns, stretches: Generator[Iterable[T], None, None]) -> Iterable[T]:
    """The owner's next timed stretch, the lock held while the generator runs."""
    # `with`, not acquire() and try: a Ctrl-C that came between those two left the
    # lock held, and a thread that asked next waited for it forever. Once a stretch.
    with turns.lock:
        stretch = next(stretches)  # StopIteration: the pass is over
    if turns.rest is not None:  # shared meanwhile: the generator is done
        stretches.close()
    return stretch


def _asked_by_another(turns: _Turns, stretches: Generator[Iterable[T], None, None]) -> Iterable[T]:
    """A thread other than the owner asks for the next stretch (or the first ever asks)."""
    lock = turns.lock
    if turns.rest is None and lock.acquire(blocking=False):
        try:
            if turns.rest is None:
                segment = turns.segment
                # Another thread is inside a fetch of the C stretch (this one found no
                # token at its gate): not a hand-over.
                fetching = segment is not None and segment.fetch_raised()
                if turns.owner is None or not fetching:
                    turns.owner = get_ident()  # the pass taken over
                    return _timed(turns, stretches)
                _share(turns)
                stretches.close()  # its steps so far published; the loop marked as left
        finally:
            lock.release()
    elif turns.rest is None:
        # The owner is inside the generator (a fetch timed in Python): shared at once,
        # without waiting for it (a loader whose threads fetch in lockstep waited
        # forever); the owner closes the generator when its fetch returns.
        _share(turns)
    if turns.ended or turns.rest is None:
        raise StopIteration  # the shared iterator ran out (or iter() failed)
    return cast("Iterable[T]", turns.rest)


def _share(turns: _Turns) -> None:
    """The rest of the pass is the loader's own iterator, for every thread, untimed."""
    if turns.iterator is None:
        return  # iter() failed in the owner's thread: nothing to share
    # It ends with a mark: the chain asks again for every thread that finds it out.
    turns.rest = chain(fetches(turns.iterator), map(_ran_out, repeat(turns.ended, 1)))
    # The other thread may be inside the stretch the chain just let go of, or in the
    # loader's iterator: none of them is freed while the pass is held.
    turns.kept += (turns.current, turns.iterator, turns.rest)
    _warn_once(
        "shared",
        "gputop probe: two threads iterate a watched pass at once; the rest of that pass "
        "is iterated as the loader's own iterator, not timed",
    )


def _ran_out(ended: list[bool]) -> Any:
    """The end of a shared pass's loader iterator: the pass is over for every thread."""
    ended.append(True)
    raise StopIteration


class Watched(Generic[T]):
    """The wrapped ``iterable`` as the training sees it; passes over it are timed."""

    _gputop_iterable: Iterable[T]
    _gputop_samples: Samples
    _gputop_data_path: str | None

    def __init__(
        self,
        probe: Probe,
        iterable: Iterable[T],
        *,
        samples: Samples = None,
        data_path: str | None = None,
    ) -> None:
        if isinstance(iterable, Watched):  # wrapping twice must not time steps twice
            samples = iterable._gputop_samples if samples is None else samples
            data_path = data_path or iterable._gputop_data_path
            iterable = iterable._gputop_iterable
        self._gputop_probe = probe
        self._gputop_iterable = iterable
        self._gputop_samples = samples
        self._gputop_data_path = data_path
        # What its counter learned of its batches' structure (loader.counting): the
        # C-timed loop counts batches that fit it in its own frame.
        self._gputop_learned: loader.Learned = [None]
        self._gputop_count = _counter(samples, self._gputop_learned)
        self._gputop_info: LoaderInfo | None = None  # the loader's settings, read on the first pass
        self._gputop_framework: str | None = None
        _register_pytree()
        if "transformers.trainer" in sys.modules:
            _fit_hf_resume()

    # ------------------------------------------------------------------ transparency
    def __getattr__(self, name: str) -> Any:
        # Only called for names not found on the Watched itself: batch_size, dataset,
        # sampler, set_epoch, state_dict, ... are the loader's. The guard keeps copy and
        # unpickling (which look up attributes before __init__ ran) from recursing.
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self._gputop_iterable, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The training's settings reach the loader (`loader.epoch = e` before a pass: a
        # loader that shuffles by it gave every epoch the same order when watched).
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._gputop_iterable, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN:
            object.__delattr__(self, name)
        else:
            delattr(self._gputop_iterable, name)

    def __len__(self) -> int:
        return len(self._gputop_iterable)  # type: ignore[arg-type]  # TypeError, as the loader's

    def __bool__(self) -> bool:
        return bool(self._gputop_iterable)  # (not len(): a generator is true, and has none)

    def __reduce__(self) -> tuple[Any, ...]:
        # Spawned workers, ddp_spawn: the loader plus options; the other side re-attaches
        # to its own default probe (or gets the bare loader when the probe is off there).
        # A samples= pickle cannot take (a lambda, as the README's) is left behind: the
        # other side counts batches itself, where the loader alone pickled.
        samples = self._gputop_samples
        if samples is not None and not isinstance(samples, int):
            try:
                pickle.dumps(samples)
            except Exception:
                samples = None
        return (_rewatch, (self._gputop_iterable, samples, self._gputop_data_path))

    def __copy__(self) -> Watched[T]:
        """A watched shallow copy of the loader, as ``copy.copy(loader)`` is (the
        reduction's would share the loader: a setting made on the copy reached it)."""
        return self._rewatched(copy.copy(self._gputop_iterable))

    def __deepcopy__(self, memo: dict[int, Any]) -> Watched[T]:
        """A watched deep copy of the loader; ``samples=`` kept, as deepcopy keeps a
        function (the reduction drops one pickle cannot take)."""
        return self._rewatched(copy.deepcopy(self._gputop_iterable, memo))

    def _rewatched(self, iterable: Iterable[T]) -> Watched[T]:
        return watched(
            self._gputop_probe,
            iterable,
            samples=self._gputop_samples,
            data_path=self._gputop_data_path,
        )

    def __repr__(self) -> str:
        return f"gputop watch({self._gputop_iterable!r})"

    @property
    def wrapped(self) -> Iterable[T]:
        """The loader this object times."""
        return self._gputop_iterable

    # ------------------------------------------------------------------ the loop
    def __iter__(self) -> Iterator[T]:
        # Who asks (iter() itself has no frame): a framework's check that a loader is
        # iterable calls a DataLoader's iter() never, any other's always.
        try:
            checking = code_in(sys._getframe(1).f_code, ITERABLE_CHECK_FRAMES)
        except ValueError:  # asked from C with no Python frame (a thread's C target)
            checking = False
        return self._pass(
            iter, eager=not (checking and loader.is_torch_loader(type(self._gputop_iterable)))
        )

    def _pass(self, start: Callable[[Any], Iterator[T]], eager: bool = True) -> Iterator[T]:
        """A pass over the loader, its iterator made by ``start`` (``iter``; a watched
        iterator's next() takes the iterator as it is) now, as the training asks for the
        pass (a DataLoader's workers prefetch while the training does what comes before
        its first next(); iter()'s exception is raised by iter()), or, not ``eager``, at
        its first batch: an iterator made only to check the loader is iterable, whose
        iter() would draw a DataLoader's seed from torch's generator (every epoch's
        shuffle changed) and fork its workers for nothing."""
        probe = self._gputop_probe
        if not probe.enabled or _forked():
            return start(self._gputop_iterable)
        # The pass is a chain of stretches (see _stretches): the batches of a C-timed one
        # reach the training with no Python frame between (a generator that passed them
        # on with `yield from` cost the training thread 0.15-0.24 us a step more at
        # ~100 us steps: bench/probe_overhead.py, docs/measurements.md).
        turns = _Turns()
        stretches = self._stretches(turns, start)
        each = map(_next_stretch, repeat(turns), repeat(stretches))
        timed = cast("_Pass[T]", _Pass.from_iterable(each))  # typeshed: a chain
        timed.stretches = stretches
        timed.turns = turns
        timed.loader = self._gputop_iterable
        if eager:
            # Up to the loader's iter() made (an empty first stretch), or returned at
            # once when iter() raised StopIteration, which is raised here.
            next(stretches, None)
            if turns.stopped is not None:
                raise turns.stopped  # (outside the handler: chained as iter()'s would be)
        return timed

    def _stretches(
        self, turns: _Turns, start: Callable[[Any], Iterator[T]] = iter
    ) -> Generator[Iterable[T], None, None]:
        """One pass, as stretches of batches for ``chain``: each Python-timed step (a
        pass's first, or every one while CUDA events time the device) a stretch of one
        batch, then C-timed segments (probe/stamps.py) while this loop is alone. The
        chain asks for the next stretch when the training asks for the batch after a
        stretch's last: a one-batch stretch's step ends where this frame resumes.

        A loader's exception reaches the training as a stretch that raises it, and the
        pass goes on if the training asks again, as the loader's own iterator would (a
        loop that skips a bad batch); the fetch that raised is no step."""
        probe = self._gputop_probe
        how = "exhausted"
        segment: Segment | None = None  # the C-timed segment under way
        # How the last fetch raised, until the training asks again (a counting stretch,
        # a generator of its own, notes it here too).
        raised: list[str] = []
        held = HeldPass(raised)  # the publisher's view of this pass (a raise left pending)
        perf = time.perf_counter
        # A pass's first step waits from here: iter() of a DataLoader starts its workers
        # (a fork each, then their init), which is the loop's wait for data too.
        t0 = perf()
        # An outermost pass is entered before iter(), which may take long (workers
        # forked, a sampler's __iter__ run by a DataLoader with workers): a viewer shows
        # that time as the pass's start, not as "outside the training loop", and a hang
        # there as one; a loader that cannot start leaves it at once. A loop inside
        # another's step is entered after: one that cannot start leaves that pass alone.
        instance = loader.unwrap(self._gputop_iterable)[0]
        key = loader.identity(instance)
        early = probe._leave_pending() == 0
        try:
            if early:
                probe._loop_entered(None, self._gputop_framework, key, instance, held)
            iterator = start(self._gputop_iterable)
        except BaseException as exc:  # (a Ctrl-C inside _loop_entered: none left open)
            probe._loop_left(f"exception:{type(exc).__name__}", held)
            if isinstance(exc, StopIteration):
                turns.stopped = exc  # raised by _pass, out of this generator
                return
            raise
        # Let go of (a `break`, the pass dropped): a Ctrl-C landing in these lines then
        # is the training's, and a finalizer would print it and drop it (the training
        # went on). It is delivered to the main thread again, where it came.
        closing = False
        try:
            try:
                made = perf() - t0  # iter()'s own time: in the first step's wait
                turns.iterator = iterator
                held.fetcher = fetch_code(iterator)
                if early:  # until the first next(), the publisher may see it not iterated
                    held.raised_at = time.monotonic()
                    raised.append(NOT_ITERATED)
                yield ()  # an empty stretch: the chain asks for the next at its first next()
                if early:
                    raised.clear()
                    probe._rejoined(held)
                    # The thread that iterates (iter() may have been called on another):
                    # a stall's stack is taken of it.
                    probe._train_thread = get_ident()
                t0 = perf() - made
                info = self._pass_info(iterator)
                if early:
                    probe._loop_described(info, key)
                else:
                    probe._loop_entered(info, self._gputop_framework, key, instance, held)
                pids_late = info is not None and not info.worker_pids and bool(info.num_workers)
                count = self._gputop_count
                open_step = probe._open_step
                close_step = probe._close_step
                append = probe._steps.append
                # Steps whose count is known without looking at the batch (batch_plan):
                # those before position `known` hold `full` samples, the one at `known` (the
                # pass's last) `last`. The first batch is counted all the same: if it
                # disagrees, every batch is counted.
                plan = self._plan()
                full = last = 0
                known = -1
                # The probe's own counter (loader.counting) never raises, so the C-timed
                # stretches call it bare; a user's samples= function stays in this loop,
                # where its errors are caught.
                own_counter = self._gputop_samples is None
                # The loader's batch position: batches passed on, and fetches that raised.
                position = 0
                checked = False  # the first batch's count held against the plan
                stretch: Iterator[Any] | None
                batch: Any
                while True:  # Python-timed steps, then C-timed ones while this loop is alone
                    while True:
                        try:
                            batch = next(iterator)
                        except StopIteration:
                            return  # exhausted
                        except BaseException as exc:  # the loader's: the training's to handle
                            held.raised_at = time.monotonic()  # before the publisher sees it
                            raised.append(f"exception:{type(exc).__name__}")
                            stretch = _raising(exc)
                        else:
                            stretch = None
                        if stretch is not None:
                            position += 1  # (a torch DataLoader's sampler moved past the batch)
                            yield stretch
                            stretch = None
                            raised.clear()  # asked again: the pass goes on
                            probe._rejoined(held)
                            t0 = perf()
                            continue
                        t1 = perf()
                        n: int | None
                        if position < known:
                            n = full
                        elif position == known:
                            n = last
                        else:
                            try:
                                n = count(batch)
                            except Exception:  # a user's counting function must not stop training
                                n = None
                            if not checked and plan is not None and n in (None, plan[0]):
                                full, known, last = plan
                                n = full if position < known else last
                            checked = True
                        # Host timing settled (no CUDA events): _open_step and _close_step
                        # inlined, the step's times kept here, nothing allocated but the record
                        # (two thirds of this loop's cost; bench/probe_overhead.py).
                        fast = probe._host_only
                        if fast:
                            probe._open = OPENED_IN_WATCH
                        else:
                            open_step(t0, t1, n)
                        if pids_late:  # generator loaders start their workers on the first next()
                            pids_late = False
                            _late_pids(probe, info, iterator)
                        yield (batch,)
                        t_next = perf()
                        batch = None  # not held through the next fetch (the loop may drop it)
                        opened = probe._open
                        if opened is not None:  # else a nested watched loop closed it
                            if not fast:
                                close_step(t_next)
                            else:
                                if opened is not OPENED_IN_WATCH:  # probe.step(samples) said
                                    n = opened[2]
                                probe._open = None
                                index = probe._index
                                append((index, t0, t1, t_next, n, None, None))
                                probe._index = index + 1
                        t0 = t_next
                        position += 1
                        # Timing and counts settled (the rest of the plan, or our own counter):
                        # the rest of the pass runs in C (probe/stamps.py).
                        counts_settled = position <= known or (known < 0 and own_counter)
                        alone = probe._passes == 1 and probe.enabled  # no other loop's steps
                        if fast and counts_settled and alone and not pids_late:
                            break
                    del batch  # the frame lives as long as the pass: it must not keep this batch
                    settled_plan = plan if known >= 0 else None  # None: each batch counted
                    while probe._passes == 1 and probe.enabled:  # a loop entered inside seals it
                        segment = Segment(probe._index, position, settled_plan)
                        probe._begin_segment(segment)
                        if segment.counts is None:  # counts from the plan: the chain is all
                            turns.current = segment.timed(iterator)
                        else:
                            turns.current = self._counted(segment, iterator, held)
                        turns.segment = segment
                        yield turns.current
                        if segment.in_fetch():
                            # Another thread may be inside it, its fetch under way (or the
                            # fetch raised: odd for good). One thread is in one at most, the
                            # newest: the last few are kept (one a raise grew without end).
                            turns.stale = (*turns.stale[1 - STALE_KEPT :], turns.current)
                        turns.current = turns.segment = None
                        position += len(segment.stamps) // 2  # the batches it passed on
                        ended, segment = segment, None
                        in_fetch = probe._end_segment(ended)  # its last fetch did not return
                        if raised or ended.fetch_raised():
                            raised.clear()  # it raised, and the training asked again
                            probe._rejoined(held)
                            position += 1  # the batch that raised
                            break  # on in Python: the fetch after the one that raised
                        if in_fetch:
                            return  # exhausted (the fetch found the loader empty)
                    t0 = perf()  # on in Python: after a fetch that raised, or inside another loop
            except GeneratorExit:
                closing = True
                # The chain was let go of: the loop left by `break`, or after the loader
                # raised (the training did not ask again). In a C-timed stretch its exception
                # went to the training past this frame: a counting stretch saw its type; a
                # plan's chain only left the fetch begun (an odd count of readings).
                if turns.rest is not None:
                    how = SHARED_HOW
                elif raised:
                    how = raised[0]
                elif segment is not None and segment.in_fetch():
                    how = "exception"
                else:
                    how = "break"
                raise
            except BaseException as exc:  # the probe's own, which the training must not see
                how = f"exception:{type(exc).__name__}"
                raise
            finally:
                probe._loop_left(how, held, segment)
        except KeyboardInterrupt as exc:
            if not _while_closing(exc, closing) or turns.closed_by_call:
                raise  # (close()'s caller gets it, as a generator's)
            _interrupt_again(exc)

    def _counted(self, segment: Segment, iterator: Iterator[T], held: HeldPass) -> Iterator[T]:
        """A C-timed segment's batches, each counted here, in this frame, the way its
        loader's batches took so far (a tuple or list of arrays, or an array): no call a
        step (~500 instructions); any other batch, or one whose count raises, by the
        probe's counter, which never raises (bench/probe_instructions.py). (The counter's
        own fast way, loader.counting, is the same lines; it stays for the Python-timed
        steps.) An exception of the loader's is noted in ``held`` as it passes."""
        assert segment.counts is not None
        add_count = segment.counts.append
        count = self._gputop_count
        uncounted = UNCOUNTED  # a local: read twice a step
        item: Any
        outer, in_first, inner, by_len = loader.quick_way(self._gputop_learned)
        closing = False
        try:
            for item in segment.timed(iterator):
                n = uncounted
                try:
                    if type(item) is outer:
                        array: Any = item[0] if in_first else item
                        if type(array) is inner:
                            if by_len:
                                n = len(array)
                            else:
                                shape = array.shape
                                n = int(shape[0]) if len(shape) else None
                except Exception:
                    pass  # 0-d, a shape None or that raises: the counter says
                add_count(count(item) if n is uncounted else n)
                try:
                    yield item
                except GeneratorExit:  # the pass let go of (not the loader's)
                    closing = True
                    raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and _while_closing(exc, closing):
                _interrupt_again(exc)  # the training's (see _stretches)
                return
            if closing:
                raise
            held.raised_at = time.monotonic()  # before the publisher sees the raise
            held.raised.append(f"exception:{type(exc).__name__}")
            raise

    def _plan(self) -> tuple[int, int, int] | None:
        """The pass's counts known before it starts (see loader.batch_plan): a fixed
        ``samples=``, or torch's own batching."""
        samples = self._gputop_samples
        if isinstance(samples, int) and not isinstance(samples, bool):
            return None if as_count(samples) is None else (samples, sys.maxsize, samples)
        if samples is not None:  # the user's function decides, batch by batch
            return None
        return loader.batch_plan(self._gputop_iterable)

    def _pass_info(self, iterator: Any) -> LoaderInfo | None:
        """This pass's LoaderInfo: the settings (read once) plus this epoch's worker pids."""
        try:
            if self._gputop_info is None:
                self._gputop_info = loader.describe(self._gputop_iterable, self._gputop_data_path)
                self._gputop_framework = loader.framework(self._gputop_iterable)
                _check_sharding(self._gputop_iterable, self._gputop_framework)
            pids = loader.worker_pids(iterator, self._gputop_iterable)
            return loader.with_pids(self._gputop_info, pids)
        except Exception:  # describing is best effort; the loop must run regardless
            return self._gputop_info


class WatchedIterator(Watched[T]):
    """An iterator watched (a generator, ``iter(loader)``): ``next()`` on it works, as on
    the iterator, through the pass it is in; ``iter()`` of it starts a pass as for any
    watched loader (the iterator's own ``iter()`` says where that one begins), and the
    pass before it is left as by a ``break``. A watched iterator raised "not an
    iterator" at ``next()``."""

    _gputop_current: Iterator[T] | None = None

    def __iter__(self) -> Iterator[T]:
        current = self._gputop_current
        if current is not None:
            self._gputop_current = None
            cast("_Pass[T]", current).leave()  # as by a break: one pass open at once
        # Not kept here: the pass's frame holds this object, and a kept pass would wait
        # for the collector to end when the loop lets go of it.
        return super().__iter__()

    def __next__(self) -> T:
        current = self._gputop_current
        if current is None:  # the pass next() goes through lives as long as this object
            current = self._gputop_current = self._pass(_as_it_is)  # as next() on it: no iter()
        try:
            return next(current)
        except StopIteration:
            # A next() after the iterator's StopIteration is its own to answer, in a new
            # pass: a generator's ends again; a stream that ends each epoch so goes on
            # (DALI's iterators reset themselves), which the ended pass cut off for good.
            self._gputop_current = None
            raise


def _as_it_is(iterator: Iterator[T]) -> Iterator[T]:
    return iterator


def watched(probe: Probe, iterable: Iterable[T], **options: Any) -> Watched[T]:
    """``probe.watch``'s wrapper: an iterator's can be asked ``next()`` as it can."""
    inner = iterable._gputop_iterable if isinstance(iterable, Watched) else iterable
    kind = WatchedIterator if hasattr(type(inner), "__next__") else Watched
    return kind(probe, iterable, **options)


_OWN = frozenset(
    {
        "_gputop_probe",
        "_gputop_iterable",
        "_gputop_samples",
        "_gputop_data_path",
        "_gputop_learned",
        "_gputop_count",
        "_gputop_info",
        "_gputop_framework",
        "_gputop_current",
    }
)


def _raising(exc: BaseException) -> Iterator[Any]:
    """A stretch that hands the training the loader's exception as it was raised (its own
    type and traceback, not chained: raised from a frame that handles nothing)."""
    yield from ()
    context, suppressed = exc.__context__, exc.__suppress_context__
    try:
        raise exc
    except BaseException:
        # `raise` made what the training is handling (a next() inside its `except`)
        # the exception's context, in place of the loader's own: put back.
        exc.__context__, exc.__suppress_context__ = context, suppressed
        raise
    finally:
        # The traceback holds this frame: with the exception in it, a cycle that kept the
        # training's and the loader's frames (and the pass) until a garbage collection.
        del exc, context


def _counter(samples: Samples, learned: loader.Learned) -> Callable[[Any], int | None]:
    if callable(samples):
        fn = samples
        return lambda batch: as_count(fn(batch))
    if isinstance(samples, int) and not isinstance(samples, bool):
        fixed = as_count(samples)
        return lambda _batch: fixed
    return loader.sample_counter(learned)


def _late_pids(probe: Probe, info: LoaderInfo | None, iterator: Any) -> None:
    """Publish worker pids that only exist once a generator loader has started."""
    try:
        pids = loader.worker_pids(iterator, None)
        if pids and info is not None and probe._loader_info == info:  # (not an inner loop's)
            probe._loader_info = loader.with_pids(info, pids)
            probe._hello_dirty.set()
    except Exception:
        return


def _forked() -> bool:
    from gputop_dl.probe import core

    return core._forked_child


def _rewatch(iterable: Any, samples: Samples, data_path: str | None) -> Any:
    from gputop_dl import probe

    return probe.watch(iterable, samples=samples, data_path=data_path)


def _flatten(w: Watched[Any]) -> tuple[list[Any], Any]:
    if _needs_distributed_sampler(w._gputop_iterable):
        # Lightning will re-create this loader with a DistributedSampler. Hand it the loader
        # so each rank keeps its shard; what Lightning then iterates is not this object.
        _warn_once(
            "lightning-ddp",
            "gputop: Lightning re-creates the watched DataLoader with a DistributedSampler "
            "for %d ranks; probe.watch() leaves that to Lightning, so the training is "
            "unchanged but its steps are not timed. Pass the plain loader and add "
            "gputop_dl.probe.integrations.lightning.GputopCallback() to Trainer(callbacks=...).",
            _world_size(),
        )
        return [w._gputop_iterable], (
            "inner",
            w._gputop_probe,
            w._gputop_samples,
            w._gputop_data_path,
            type(w._gputop_iterable),
        )
    # No children: tree walkers (Lightning's CombinedLoader) keep the Watched as one leaf
    # and iterate it, so its passes are timed.
    return [], ("self", w)


def _unflatten(children: Iterable[Any], context: Any) -> Any:
    if context[0] == "self":
        return context[1]
    _, probe, samples, data_path, loader_type = context
    (inner,) = children
    if type(inner) is not loader_type:
        # Lightning also unflattens each *batch* with the loaders' spec: a batch is
        # returned as the bare loader would have returned it, never wrapped.
        return inner
    return Watched(probe, inner, samples=samples, data_path=data_path)


_hf_resume_fitted = False


def _fit_hf_resume() -> None:
    """The HF Trainer resumes mid-epoch through accelerate's ``skip_first_batches``, which
    rebuilds accelerate's own loaders as such and any other as a plain DataLoader: a
    watched one lost the shard's one-batch prefetch and device placement, and the resumed
    epoch drew its random numbers at other moments (the training changed). The Trainer's
    name for it is wrapped, once: a watched loader is skipped as its loader is, and the
    result watched again. Nothing else is touched."""
    global _hf_resume_fitted
    trainer = sys.modules.get("transformers.trainer")
    original = getattr(trainer, "skip_first_batches", None)
    if _hf_resume_fitted or original is None:
        return
    _hf_resume_fitted = True

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, Watched):
            return watched(
                dataloader._gputop_probe,
                original(dataloader._gputop_iterable, num_batches),
                samples=dataloader._gputop_samples,
                data_path=dataloader._gputop_data_path,
            )
        return original(dataloader, num_batches)

    functools.update_wrapper(skip_first_batches, original)
    trainer.skip_first_batches = skip_first_batches  # type: ignore[union-attr]


def _register_pytree() -> None:
    """Let Lightning see a Watched as one loader, or reach the DataLoader inside.

    Lightning flattens ``train_dataloaders`` with torch's pytree and re-creates each
    DataLoader it finds that needs a DistributedSampler. Under DDP a Watched must hand it
    the loader (or every rank would read the whole dataset); otherwise it stays a leaf.
    """
    global _pytree_registered
    if _pytree_registered or "torch" not in sys.modules:
        return
    _pytree_registered = True
    try:
        from torch.utils import _pytree

        _pytree.register_pytree_node(
            Watched, _flatten, _unflatten, serialized_type_name="gputop_dl.probe.watch.Watched"
        )
    except Exception as exc:  # a private torch API: without it only DDP sharding warns
        log.debug("gputop probe: no pytree registration: %s", exc)


def _world_size() -> int:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        return 1
    return 1


def _needs_distributed_sampler(iterable: Any) -> bool:
    return _world_size() > 1 and loader.is_sharded(iterable) is False


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _check_sharding(iterable: Any, framework: str | None) -> None:
    """Say once, clearly, when the wrapped loader is not sharded though ranks are running.

    Frameworks that shard by type (``accelerator.prepare``) do not recognise a loader they
    receive already watched; the training would then read the whole dataset on every rank.
    The probe cannot fix that without changing the training, so it only says so.
    """
    if framework == "lightning" or not _needs_distributed_sampler(iterable):
        return
    _warn_once(
        "sharding",
        "gputop: the watched loader has no DistributedSampler while %d ranks run, so every "
        "rank reads the whole dataset. If a framework was to shard it (accelerator.prepare, a "
        "Trainer), it did not recognise the wrapped loader: watch the loader it returns "
        "(probe.watch(accelerator.prepare(loader))) or use %s. gputop does not change your "
        "training.",
        _world_size(),
        CALLBACKS,
    )
