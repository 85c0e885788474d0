"""The probe that lives in the training process.

The training thread only takes timestamps and appends a tuple to a deque (well under a
microsecond per step). Everything else -- building records, msgspec encoding, zmq sends,
history replay to late subscribers, host sampling -- runs on background daemon threads,
and every failure is turned into a (rate-limited) warning and a degraded probe: nothing
here may raise into, block or slow the loop.

One probe per process: ``Probe(...)`` while a live probe exists returns that probe (with
a warning when settings differ), so ``Probe(name=...)`` followed by ``probe.watch(...)``
publishes one run, and two probes never fight over one socket.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import statistics
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from itertools import repeat
from operator import attrgetter, call
from types import CodeType
from typing import Any, NamedTuple, TypeVar

from gputop_dl.probe import discovery, jobenv
from gputop_dl.probe import stack as stacks
from gputop_dl.probe.device_timing import CudaTimer, detect, device_ref, own_device
from gputop_dl.probe.history import Batch
from gputop_dl.probe.history import messages as history_messages
from gputop_dl.probe.history import trim as trim_history
from gputop_dl.probe.messages import (
    CRASHED,
    MARKED,
    Bye,
    DeviceRef,
    Hello,
    LoaderInfo,
    LoaderPasses,
    Loop,
    System,
)
from gputop_dl.probe.protocol import MICROS, HostRow, WireRow, encode, encode_steps
from gputop_dl.probe.samples import MAX_COUNT, MAX_STR
from gputop_dl.probe.stamps import Segment
from gputop_dl.probe.version import __version__

log = logging.getLogger("gputop.probe")

T = TypeVar("T")
ENV_LISTEN = "GPUTOP_LISTEN"
ENV_NAME = "GPUTOP_NAME"
ENV_DISABLE = "GPUTOP_DISABLE"
ENV_DATA_PATH = "GPUTOP_DATA_PATH"
ENV_INSECURE = "GPUTOP_INSECURE"  # "1": may listen where the network can read the stream
# Steps buffered for the publisher thread (~ minutes of fast steps if it stalls); past
# this the oldest are dropped, and counted from the gap in step indices.
MAX_BUFFERED_STEPS = 50_000
# C-timed segments held for the publisher (bounded by their steps too): an ended one
# weighs ~0.4 KB and 24 bytes a step, and a pass of one batch makes one with no step.
MAX_SEGMENTS = 4_096
# While steps come the publisher sends them every FLUSH_S: a step reaches a viewer within
# ~0.2 s. From BATCH_STEPS_PER_S on, every BATCH_FLUSH_S instead (half the viewer's
# default refresh period): each message then carries 2.5x the steps, and a viewer pays
# ~20 us per message whatever its size (the publisher, a wake-up), while a step of 10 ms
# or less is no later on screen by more than a fraction of a refresh. Not longer: fewer,
# larger drains cost the training loop more (docs/measurements.md). See flush_period().
FLUSH_S = 0.2
BATCH_FLUSH_S = 0.5
BATCH_STEPS_PER_S = 100.0
IDLE_FLUSH_S = 0.5  # publisher period while no step arrives (agents, evaluation, hangs)
HELLO_EVERY_S = 2.0  # late subscribers learn who we are within this time
# The node's period while no viewer is connected: its samples then only fill the history
# a viewer gets on attach (60 of them: 5 min), and each costs ~2 ms of the training
# process's CPU. A viewer connecting gets one at once, and one a second after.
UNWATCHED_SAMPLE_S = 5.0
DEVICE_EVENT_TIMEOUT_S = 5.0
# History for subscribers that attach late (docs/protocol.md, "History on attach").
HISTORY_S = 120.0
HISTORY_MAX_STEPS = 20_000
# ... and at least this many steps, however old: a viewer attaching to a run of 5-minute
# steps gets a typical step (tui analyzer's MIN_STEPS) at once, not after 25 minutes.
HISTORY_MIN_STEPS = 5
HISTORY_SYSTEMS = 60
BASE_EPOCH_S = 3600.0  # wire rows' ends count from one base this long (< 2^32 us)
RECORDS_PER_MESSAGE = 2_000  # ~80 KB per steps message, far below every limit
REPLAY_MIN_INTERVAL_S = 0.5  # a subscription bomb costs at most 2 replays a second
HELLO_MIN_INTERVAL_S = 0.1  # and at most 10 extra hellos a second
# Loop changes sent a flush, the newest (a pass entered and left): a loop of passes of a
# batch or two made two messages a step, which filled the socket's queue (SEND_QUEUE)
# before the steps; a viewer keeps only the newest (docs/protocol.md, `loop`).
LOOP_MESSAGES_PER_FLUSH = 2
# Messages a history replay sends in one burst, to every subscriber: a hello, the steps,
# the node samples, a stall's stack. The socket queues a whole one per subscriber, plus a
# few seconds of live messages (with room for less, a fast run lost most of its replayed
# steps); a subscriber that stops reading holds about a replay's worth (~1 MB) here.
REPLAY_MESSAGES = 1 + -(-HISTORY_MAX_STEPS // RECORDS_PER_MESSAGE) + HISTORY_SYSTEMS + 1
SEND_QUEUE = REPLAY_MESSAGES + 56  # 128: ~10 s of a probe's live messages besides
PERIODS_KEPT = 30
PASS_STARTS_KEPT = 16  # LoaderPasses.starts: more than a viewer's step window holds
PASS_START_LOADERS = 8  # loaders whose pass starts are kept (a training's, an evaluation's)
MAX_PHASES = 64  # named phases per step on the wire (docs/protocol.md, "Limits")
OTHER_PHASES = "(other phases)"  # the sum of a step's phases past the 63 longest
WARN_EVERY_S = 60.0  # a persistent publisher error is logged once a minute, not per flush
# device_caught_up: the device reached the end-of-step event within this lag of the host
# recording it (docs/protocol.md, "device_caught_up"; core.caught_up_at_start).
CAUGHT_UP_TOLERANCE_S = 100e-6
# A fetch of the outermost pass that has not returned for this long is looked at (at most
# once per this period): one whose loader raised, where the training went on elsewhere
# without asking again, is the loop left. A notebook keeps the traceback, and with it the
# pass, after the cell failed; a script's `except` may log and do other work.
LEFT_FETCH_S = 1.0
CAUGHT_UP_TOLERANCE_FRACTION = 0.10


def flush_period(steps_per_s: float) -> float:
    """The publisher's wait before its next flush, after steps came at ``steps_per_s``
    (benches that simulate probes send as this says). Not batched when a batch would hold
    over a quarter of the step buffer (a tight loop of tiny steps): the buffer must never
    fill between two flushes."""
    if BATCH_STEPS_PER_S <= steps_per_s <= MAX_BUFFERED_STEPS / 4 / BATCH_FLUSH_S:
        return BATCH_FLUSH_S
    return FLUSH_S


# Forked children (DataLoader workers) must never touch the parent's sockets or threads.
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)

# (index, t0, t1, t_next, samples, ev_start, ev_end): what the training thread appends
_Raw = tuple[int, float, float, float, Any, Any, Any]
# A step record in its wire form (StepRecord field order): durations in integer
# microseconds, the end in microseconds after its batch's base time. Host-timed rows are
# protocol.HostRow (5 fields), rows with device times or phases protocol.WireRow (9).
_Wire = HostRow
_US = float(MICROS)
_row_index = attrgetter("index")


class Phase:
    """Context manager timing one named part of a step (``with probe.phase("forward")``)."""

    __slots__ = ("_name", "_probe", "_t0")

    def __init__(self, probe: Probe, name: str) -> None:
        self._probe = probe
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> Phase:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        # Logged against the open step's index; the publisher thread sums them per step.
        p = self._probe
        p._phase_log.append((p._index_now(), self._name, time.perf_counter() - self._t0))


MARK_MAX = 64  # characters of what the script named


class Outside:
    """Context manager: the script says no step is expected for a while (``with
    probe.outside("evaluation")``): viewers show "outside the training loop", not a
    stall. For loops timed with :meth:`Probe.step`, which no ``watch`` can tell this of,
    and inside a watched loop's step (an evaluation every N batches): that step's period
    then leaves the time outside out, as the time between two ``probe.step`` steps is
    in no step. Counted as the step's own work, a 10 s evaluation made a data-bound run
    read "compute-bound" and its average rate a quarter of what it was."""

    __slots__ = ("_declared", "_previous", "_probe", "_step", "_t0", "_what")

    def __init__(self, probe: Probe, what: str) -> None:
        self._probe = probe
        self._what = str(what)[:MARK_MAX]
        self._previous: str | None = None
        self._declared = 0
        self._step = -1  # the watched step it was entered in (-1: none)
        self._t0 = 0.0

    def __enter__(self) -> Outside:
        p = self._probe
        if p.enabled:
            self._previous = p._loop
            self._declared = p._declared_left
            # Inside a watched pass's step (its body: the batch delivered, the next not
            # asked for): the time outside is taken out of that step's period.
            self._step = p._index_now() if p._passes and self._previous == "in-loop" else -1
            self._t0 = time.perf_counter()
            p._mark_loop("outside", MARKED + self._what)
        return self

    def __exit__(self, *exc: object) -> None:
        p = self._probe
        if p._declared_left != self._declared and not p._passes:
            return  # its pass was left meanwhile (the loader raised): no loop to go back to
        if p.enabled and self._previous != "outside":  # nested: the outer one goes on
            if self._step >= 0 and p._index_now() == self._step:  # still that step
                p._outside_log.append((self._step, time.perf_counter() - self._t0))
            p._mark_loop("in-loop", None)
            if p._last_mark is not None and p._open is None and p._segment is None:
                # probe.step's next step starts here, not at the mark before: the time
                # outside is in no step (nor in the run's rate, nor in its graph).
                p._last_mark = time.perf_counter()


# Loop.how for a framework's loop the training thread left without its end hook (the
# HF Trainer has none for an exception): an exception, its type unseen.
FRAMEWORK_EXCEPTION = "framework-exception"


class HeldPass:
    """A watched pass, for the publisher: did its loader's last fetch raise, with the
    training gone elsewhere without asking again? Then the pass is left: the loop is
    shown as left ("it ended with ValueError") if no other pass is open, not as a fetch
    that hangs ("stalled", critical) for as long as something keeps the pass, and a new
    pass is not taken for a loop inside it.

    ``left`` changes under ``Probe._loop_lock`` only."""

    __slots__ = ("fetcher", "left", "raised", "raised_at")

    def __init__(self, raised: list[str]) -> None:
        # On the training thread's stack while a fetch of the pass's loader runs
        # (stack.fetch_code); None: a C iterator, whose fetch shows no frame of its own:
        # a fetch the clock never saw return is then never judged left.
        self.fetcher: CodeType | None = None
        # The watch loop's: how its last fetch raised, until asked again; or, from iter()
        # to the first next(), that no batch was asked for yet (watch.NOT_ITERATED).
        self.raised = raised
        self.raised_at = 0.0  # time.monotonic() of that raise
        self.left = False  # the publisher saw the pass left


_current: Probe | None = None
_current_lock = threading.Lock()
_access_warned: set[str] = set()  # endpoints whose exposure was already warned about


def current() -> Probe | None:
    """This process's live probe, if one was created and not closed."""
    p = _current
    if p is None or p._closed or p.pid != os.getpid():
        return None
    return p


class Probe:
    """Measures steps and publishes them over ZeroMQ; one per process.

    ``name``: run name shown by gputop (default: $GPUTOP_NAME or the script name).
    ``listen``: endpoint to bind (default: $GPUTOP_LISTEN, else a private ipc socket).
    ``sample_host``: run the node sampler here (default: only on local rank 0).
    ``insecure``: allow ``listen`` on a wildcard or non-loopback address, readable by
    anyone who can reach it (default: $GPUTOP_INSECURE=1); refused otherwise.

    Creating a second ``Probe`` while one is live returns the live one (a warning says
    which settings were ignored); after :meth:`close` a new one can be created.
    """

    _initialized = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Probe:
        global _current
        with _current_lock:
            existing = current()
            if existing is not None:
                if args or kwargs:
                    log.warning(
                        "gputop probe: this process already has a probe (%r on %s);"
                        " reusing it, the new settings are ignored",
                        existing.name,
                        existing.endpoint,
                    )
                return existing
            created = super().__new__(cls)
            _current = created
            return created

    def __init__(
        self,
        name: str | None = None,
        listen: str | None = None,
        *,
        sample_host: bool | None = None,
        system_interval_s: float = 1.0,
        flush_interval_s: float | None = None,  # None: flush_period(); else a fixed period
        data_path: str | None = None,
        role: str = "probe",
        insecure: bool | None = None,
    ) -> None:
        if self._initialized:  # __new__ returned the live probe
            return
        self._initialized = True
        self.role = role  # "agent": no training loop here, only node samples
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.source_id = f"{self.host}:{self.pid}"
        self.name = name or os.environ.get(ENV_NAME) or _script_name()
        self.started = time.time()
        # A forked child (a DataLoader worker) never publishes: it would be one more "run".
        self.enabled = not os.environ.get(ENV_DISABLE) and not _forked_child
        self.error: str | None = None
        self.endpoint: str | None = None
        self._listen = listen or os.environ.get(ENV_LISTEN)
        # May bind where the network can read the stream (default: $GPUTOP_INSECURE).
        self._insecure = _env_flag(ENV_INSECURE) if insecure is None else insecure
        self._flush_interval_s = flush_interval_s
        self._system_interval_s = system_interval_s
        self._data_path = data_path or os.environ.get(ENV_DATA_PATH)
        self._local_rank = _env_int("LOCAL_RANK")
        self._sample_host = (self._local_rank in (None, 0)) if sample_host is None else sample_host

        # Training-thread state. Only the training thread writes these.
        self._steps: deque[_Raw] = deque(maxlen=MAX_BUFFERED_STEPS)
        self._index = 0  # the next step's (while a segment runs: see _index_now)
        # The watch loop's C-timed steps (probe/stamps.py): the running segment, and
        # those the publisher has not finished with, at most MAX_BUFFERED_STEPS steps
        # (and MAX_SEGMENTS) before the running one's: what a stalled publisher has not
        # drained is dropped, oldest segment first, counted from the index gap. Bounded
        # by steps, not segments: a loop of short passes makes one segment a pass.
        self._segment: Segment | None = None
        # Loops entered and not yet left: only a loop that is alone is C-timed, so that
        # no other loop's steps take indices while a segment counts them.
        self._passes = 0
        # Guards _passes and _open_passes against the publisher, which may declare a
        # pass left (HeldPass); taken once a pass, never a step. Reentrant: a pass
        # finalized by a collection that an allocation under it starts leaves there.
        self._loop_lock = threading.RLock()
        self._open_passes: list[HeldPass] = []  # the watched passes entered, not left
        self._declared_left = 0  # passes declared left, not by their loop (Outside reads it)
        # Both threads let go of segments without a lock (see _drop_oldest_segments).
        self._segments: deque[Segment] = deque()
        # probe.step(samples) inside a segment: (step index, count) for the publisher.
        self._count_fixes: deque[tuple[int, int | None]] = deque(maxlen=MAX_BUFFERED_STEPS)
        # (step, seconds) a watched step spent in probe.outside: out of its period
        self._outside_log: deque[tuple[int, float]] = deque(maxlen=MAX_BUFFERED_STEPS)
        self._open: tuple[float, float, Any, Any] | None = None  # t0, t1, samples, ev_start
        self._phase_log: deque[tuple[int, str, float]] = deque(maxlen=MAX_BUFFERED_STEPS)
        self._last_mark: float | None = None
        self._timer: CudaTimer | None = None
        self._timing = "host"
        self._timing_note: str | None = "no steps yet"
        self._timing_checks = 0
        # Timing settled as host-side: a step is one tuple and one append (watch inlines
        # _open_step/_close_step while this is set).
        self._host_only = False
        self._device_index: tuple[str, int | None, str | None] | None = None  # kind, idx, uuid
        self._loader_info: LoaderInfo | None = None
        self._framework: str | None = None
        self._loop = "not-started"
        self._loop_since: float | None = None
        self._loop_exit: str | None = None
        # Loop events for the publisher: (state, unix time, step index, how).
        self._loop_events: deque[tuple[str, float, int, str | None]] = deque(maxlen=1000)
        # The first step's index of each of the last passes of each loader iterated by the
        # outermost watched loop, and the loader's description (Hello.passes), by
        # loader.identity, the loader used the longest ago first: a viewer tells the
        # waits a pass's start costs from the rest, each loader's with its settings.
        self._pass_starts: OrderedDict[Hashable, _Listed] = OrderedDict()
        self._starts_horizon = 0  # every start from here on is listed (_note_pass_start)
        # Those starts' indices for the publisher, which notes each one's first step's
        # wait when it drains that step (LoaderPasses.waits): no work a step here.
        self._starts_due: deque[int] = deque(maxlen=PASS_STARTS_KEPT * PASS_START_LOADERS)
        self._train_thread: int | None = None  # whose stack a stall takes (probe/stack.py)
        # The framework's training loop a hook-timed loop runs in (stack.loop_code): the
        # publisher sees it left when the training thread is no longer in it.
        self._loop_code: tuple[CodeType, int] | None = None  # and the thread running it
        self._loop_code_seen = 0.0  # time.monotonic() the publisher last looked
        # (rank, local rank, world size) from a framework callback; see _set_ranks.
        self._framework_ranks: tuple[int | None, int | None, int | None] = (None, None, None)

        # Publisher-thread state: facts gathered off the training thread.
        self._awaiting_starts: set[int] = set()  # starts whose first step is not drained
        # The outermost pass's fetch that has not returned: its segment, its readings'
        # count, and when it was first (or last) seen so (_check_left_fetch).
        self._fetch_seen: tuple[Segment, int, float] | None = None
        self._start_waits: dict[int, float] = {}  # a start's index -> its first step's wait
        self._affinity: tuple[int, ...] = ()
        self._quota: float | None = None
        self._device: DeviceRef | None = None
        self._warned_at: dict[str, float] = {}

        self._hello_dirty = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._sampler: Any = None
        self._publisher: Any = None
        self._bye_reason = "exit"
        if self.enabled:
            self._start()
        if not self.enabled:
            self._release()

    # ----------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        from gputop_dl.probe.transport import (  # zmq stays out of import time
            Publisher,
            TransportError,
            listen_policy,
        )

        try:
            endpoint = self._listen or discovery.ipc_endpoint(self.pid)
            refusal, warning = listen_policy(
                endpoint, insecure=self._insecure, opt_in=f"set {ENV_INSECURE}=1"
            )
            if refusal is not None:
                self._degrade(refusal)
                return
            self._publisher = Publisher(endpoint, send_hwm=SEND_QUEUE)
            self.endpoint = self._publisher.endpoint
            # Once bound: "listening on" before "cannot listen" (a port in use) read as
            # both at once.
            if warning is not None and endpoint not in _access_warned:
                _access_warned.add(endpoint)  # once per endpoint and process
                log.warning("gputop probe: %s", warning)
        except (TransportError, discovery.DiscoveryError, OSError) as exc:
            self._degrade(f"{exc}")
            return
        try:
            discovery.register(
                discovery.Record(
                    endpoint=self.endpoint,
                    pid=self.pid,
                    host=self.host,
                    name=self.name,
                    role=self.role,
                    started=self.started,
                )
            )
        except (OSError, discovery.DiscoveryError) as exc:
            log.warning(
                "gputop probe: not discoverable (%s); connect with gputop %s", exc, self.endpoint
            )
        if self._system_interval_s > 0:
            self._sampler = _make_sampler(self)
        # Imported here, not on the publisher's thread: a module that makes dataclasses
        # runs exec(), which in CPython 3.11 clears the mark that the main thread is
        # ending on Ctrl-C, and a script stopped in the probe's first ~0.1 s then exited
        # with status 1, not by SIGINT (a shell loop over runs went on to the next).
        import gputop_dl.probe.collectors.cgroup  # noqa: F401

        self._thread = threading.Thread(target=self._run, name="gputop-publisher", daemon=True)
        self._thread.start()

    def _degrade(self, reason: str) -> None:
        self.enabled = False
        self.error = reason
        log.warning("gputop probe disabled: %s. Training continues unmonitored.", reason)

    def _release(self) -> None:
        """Stop being the process's probe, so that a new ``Probe()`` can be created."""
        global _current
        with _current_lock:
            if _current is self:
                _current = None

    def close(self, reason: str = "closed") -> None:
        """Flush, say goodbye and release the socket. Safe to call twice or never."""
        if self._closed or _forked_child or os.getpid() != self.pid:
            return
        self._closed = True
        self.enabled = False
        self._bye_reason = reason
        self._stop.set()
        if self._publisher is not None:
            self._publisher.wake()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                self._sampler.close()
        discovery.unregister(self.pid)
        self._release()

    def worker_pids(self) -> frozenset[int]:
        """PIDs of the DataLoader workers of the current pass (empty: none or unknown)."""
        info = self._loader_info
        return frozenset(info.worker_pids) if info is not None else frozenset()

    # ----------------------------------------------------------------- hot path
    def watch(
        self,
        iterable: Iterable[T],
        *,
        samples: int | Callable[[T], int] | None = None,
        data_path: str | None = None,
    ) -> Iterable[T]:
        """``iterable`` as the training sees it, each pass over it timed (see watch.py).

        Without a working probe (disabled, forked child) it is ``iterable`` itself.
        """
        if not self.enabled or _forked_child:
            return iterable
        from gputop_dl.probe.watch import watched

        return watched(self, iterable, samples=samples, data_path=data_path or self._data_path)

    def _loop_entered(
        self,
        info: LoaderInfo | None,
        framework: str | None,
        loader_key: Hashable = None,
        instance: object = None,
        held: HeldPass | None = None,
    ) -> None:
        """Training thread, once per pass: store and flag (no I/O, never raises).
        ``loader_key``: what its loader is (``loader.identity``): its passes' starts are
        listed together, a training loader's apart from an evaluation loader's;
        ``instance``: the loader object (``loader.unwrap``), to tell one built again;
        ``held``: the pass, which the publisher may see left if it is the outermost."""
        now = time.time()
        self._train_thread = threading.get_ident()
        with self._loop_lock:
            self._passes += 1
            if held is not None:
                self._open_passes.append(held)
        self._seal_running_segment()  # a loop inside a C-timed one: its open step is dropped
        if self._passes == 1:
            # Not a loop inside another's step (an evaluation run in a training step):
            # the hello describes this pass's loader and lists its loader's pass starts.
            self._note_pass_start(loader_key, info, instance)
            self._describe_loader(info)
        if framework is not None and framework != self._framework:
            self._framework = framework
            self._hello_dirty.set()
        self._mark_loop("in-loop", None, now)

    def _leave_pending(self) -> int:
        """Training thread, before a watched pass is entered: a pass whose last fetch
        raised, or whose iterator iter() made with no batch asked of it yet, is left now
        (the publisher would say so within LEFT_FETCH_S): the training is evidently
        elsewhere, and the new pass is no loop inside it. Asked again, it is entered
        again (``_rejoined``). Returns the passes open now."""
        if not self._open_passes:
            return self._passes
        with self._loop_lock:
            for held in list(self._open_passes):
                if held.raised and not held.left:
                    self._left(held)
            return self._passes

    def _left(self, held: HeldPass) -> None:
        """``held`` is left (under ``_loop_lock``): no longer an open pass."""
        held.left = True
        self._open_passes.remove(held)
        self._passes = max(0, self._passes - 1)
        self._declared_left += 1

    def _loop_described(self, info: LoaderInfo | None, loader_key: Hashable) -> None:
        """Training thread: the pass entered with no description (``watch`` enters before
        ``iter(loader)``, which may take long: workers forked, a sampler's ``__iter__``)
        is described as ``iter()`` made it (its worker pids)."""
        if self._passes != 1 or info is None:
            return
        kept = self._pass_starts.get(loader_key)
        if kept is not None:
            self._pass_starts[loader_key] = kept._replace(info=_without_pids(info))
        self._describe_loader(info)

    def _describe_loader(self, info: LoaderInfo | None) -> None:
        # The loop's state goes out as a Loop message (which viewers apply to the hello
        # they hold); a new hello only for what else changed: the loader (each epoch's
        # worker pids) or the framework. A hello a pass cost the publisher ~0.25 ms each
        # for loops of short passes (bench/short_passes.py).
        if info is not None and info != self._loader_info:
            self._loader_info = info
            if info.dataset_path and self._sampler is not None:
                self._sampler.set_data_path(info.dataset_path)  # checked off-thread
            self._hello_dirty.set()

    def _note_pass_start(
        self, loader_key: Hashable, info: LoaderInfo | None, instance: object = None
    ) -> None:
        """Training thread, once per outermost pass. Every list holds every start from a
        common horizon on: a start one loader's full list lets go of, or an evicted
        loader's, takes the older starts of the others with it (or a viewer would count
        the forgotten passes' steps as the previous listed pass's, its start as any other
        wait). The hello reads these lists on the publisher's thread: each change is one
        operation in C (move_to_end, an item set), never a key missing meanwhile."""
        known = self._pass_starts
        first = self._index_now()
        horizon = self._starts_horizon
        kept = known.get(loader_key)
        if kept is None:
            if len(known) >= PASS_START_LOADERS:
                evicted = known.popitem(last=False)[1].starts  # the loader unused the longest
                if evicted:
                    horizon = max(horizon, evicted[-1] + 1)
            starts: deque[int] = deque(maxlen=PASS_STARTS_KEPT)
        else:
            starts = kept.starts
        for other in known.values():
            if other.starts and other.starts[-1] == first:  # an empty pass: this step is this one's
                other.starts.pop()
        if not starts or starts[-1] != first:  # (after an empty pass)
            if len(starts) == starts.maxlen:
                horizon = max(horizon, starts[0] + 1)
            starts.append(first)
            self._starts_due.append(first)
        if horizon != self._starts_horizon:
            self._starts_horizon = horizon
            for other in known.values():
                while other.starts and other.starts[0] < horizon:
                    other.starts.popleft()
        # Entered before iter() (watch): described after it; until then its last pass's
        # description stands (a viewer judges its starts with it meanwhile).
        info = _without_pids(info) if info is not None or kept is None else kept.info
        # A DataLoader built again for each pass (persistent_workers=True then keeps its
        # workers for nothing): the last pass's object is not this one.
        rebuilt = kept is not None and kept.last is not None and kept.last() is not instance
        try:
            last = weakref.ref(instance) if instance is not None else None
        except TypeError:  # an object without weak references: not told
            last = None
        if kept is not None:
            known.move_to_end(loader_key)  # the loaders in use stay
        known[loader_key] = _Listed(starts, info, last, rebuilt)

    def _loop_left(
        self, how: str, held: HeldPass | None = None, segment: Segment | None = None
    ) -> None:
        """Training thread: the loop ended ("exhausted", "break", "exception:<Type>").
        A step left open (``break``, an exception) is dropped, not guessed. ``held`` and
        ``segment``: the pass and its running C-timed segment, if any."""
        now = time.time()
        if held is None:
            self._loop_code = None  # a framework's loop (HookTimer) ended as it says
        with self._loop_lock:
            if held is not None and held.left:
                # Counted as left when the publisher saw it (its fetch raised): another
                # pass may run now, and its state is not this one's to change.
                if segment is not None and self._segment is segment:
                    self._end_segment(segment, close=False)
                return
            if held is not None:
                if held not in self._open_passes:
                    return  # never entered (it stopped before, a Ctrl-C even): none to leave
                self._open_passes.remove(held)
            self._passes = max(0, self._passes - 1)
        self._open = None
        if self._segment is not None:  # break or an exception inside a C-timed pass
            self._end_segment(self._segment, close=False)
        if self._passes:
            # A loop inside another ended (an evaluation inside the training loop): the
            # training loop goes on; "outside" here told viewers it had left, for the rest
            # of the epoch.
            self._mark_loop("in-loop", None, now)
        else:
            self._mark_loop("outside", how, now)

    def _rejoined(self, held: HeldPass) -> None:
        """Training thread: it asked for the next batch after a fetch that raised. If the
        publisher had declared the pass left meanwhile, it is entered again."""
        with self._loop_lock:
            if not held.left:
                return
            held.left = False
            self._passes += 1
            self._open_passes.append(held)
            # (its own segment ended before it asked): another pass's, as for a loop
            # entered inside a C-timed one
            self._seal_running_segment()
            self._mark_loop("in-loop", None)

    def _seal_running_segment(self) -> None:
        """Training thread: a pass entered inside another's C-timed segment. That
        segment's chain stops before its next clock reading, its open step dropped."""
        outer = self._segment
        if outer is not None:
            outer.gate.clear()
            self._end_segment(outer, close=False)

    def _index_now(self) -> int:
        """The open (or next) step's index, also while a segment times the loop."""
        segment = self._segment
        return self._index if segment is None else segment.first + segment.complete()

    def _begin_segment(self, segment: Segment) -> None:
        self._segment = segment
        self._drop_oldest_segments(segment.first)
        self._segments.append(segment)

    def _drop_oldest_segments(self, first: int) -> None:
        """Training thread: let go of the oldest segments held, unpublished or not, until
        those left and one starting at step ``first`` fit the bounds.

        No lock: a deque's popleft and remove are atomic under the GIL, and the publisher
        removes only the segment it found finished, by identity (a lock taken here
        without waiting leaked when a Ctrl-C came between its acquire and its try: the
        publisher then waited for it forever)."""
        held = self._segments
        try:
            while len(held) >= MAX_SEGMENTS or first - held[0].first >= MAX_BUFFERED_STEPS:
                held.popleft()
        except IndexError:  # none left, or the publisher let go of the last meanwhile
            pass

    def _end_segment(self, segment: Segment, *, close: bool = True) -> bool:
        """Training thread: ``segment``'s chain stopped. True: it found the loader empty.

        An even count of readings means the chain stopped before a step's end was read
        (its gate ran out): with ``close`` that end is read now, else the step is dropped.
        """
        exhausted = segment.in_fetch()
        if segment.steps is not None:  # sealed by a nested loop, which set the index
            return exhausted
        if close and not exhausted:
            segment.stamps.append(time.perf_counter_ns())
        segment.steps = segment.complete()
        segment.gate.clear()  # its chain has stopped: 8 KB it need not hold while it waits
        self._index = segment.first + segment.steps
        if self._segment is segment:
            self._segment = None
        return exhausted

    def _open_step(self, t0: float, t1: float, n: int | None) -> None:
        if self._timing_checks < 3:
            self._check_timing()
        self._open = (t0, t1, n, None if self._timer is None else self._record_event())

    def _record_event(self) -> Any:
        try:
            return self._timer.record()  # type: ignore[union-attr]
        except Exception as exc:  # a CUDA error must surface in the training, not here
            self._timer, self._timing = None, "host"
            self._timing_note = f"CUDA events failed ({exc}): step times are host-side"
            self._timing_checks = 3  # do not try again
            self._host_only = True
            self._hello_dirty.set()
            return None

    def _close_step(self, t_next: float) -> None:
        # The hot path: one unpack, one append (profiled; see bench/probe_overhead.py).
        # Phases, overflow and everything else are the publisher thread's business.
        t0, t1, n, ev_start = self._open  # type: ignore[misc]
        self._open = None
        self._steps.append(
            (
                self._index,
                t0,
                t1,
                t_next,
                n,
                ev_start,
                None if self._timer is None else self._record_event(),
            )
        )
        self._index += 1

    def step(self, samples: int | None = None) -> None:
        """Mark the end of a step for loops that do not use :meth:`watch`.

        Inside a ``watch`` loop it only overrides the sample count of the current step.
        """
        if not self.enabled or _forked_child:
            return
        opened = self._open
        if opened is not None:
            self._open = (opened[0], opened[1], as_count(samples), opened[3])
            return
        segment = self._segment
        if segment is not None:
            if self._passes:
                self._count_fixes.append((self._index_now(), as_count(samples)))
                return
            self._end_segment(segment, close=False)  # its pass was declared left
        now = time.perf_counter()
        if self._last_mark is not None:
            if self._timing_checks < 3:
                self._check_timing()
            # t1 < 0 says "no data-wait measurement" for explicitly marked steps
            self._steps.append(
                (self._index, self._last_mark, -1.0, now, as_count(samples), None, None)
            )
            self._index += 1
        elif self._loop == "not-started":
            # The first mark of a loop that probe.step() times: its loop has begun (the
            # step it ends is step 0, unrecorded). Without it a viewer read the script as
            # still setting up through its first recorded step, and could not say a
            # first step that never ends is one ("no step for 45 s in the training loop").
            self._mark_loop("in-loop", None)
        self._last_mark = now

    def phase(self, name: str) -> Phase:
        return Phase(self, name)

    def outside(self, what: str = "evaluation") -> Outside:
        return Outside(self, what)

    def _mark_loop(self, state: str, how: str | None, now: float | None = None) -> None:
        """Training thread: the loop's state changed (a watched pass entered or left,
        or the script's probe.outside), published as a Loop message. Never raises."""
        now = time.time() if now is None else now
        self._loop, self._loop_since, self._loop_exit = state, now, how
        self._loop_events.append((state, now, self._index_now(), how))

    def _log_phase(self, name: str, seconds: float) -> None:
        """A phase of the open step timed elsewhere (framework hooks), logged as
        ``with probe.phase(name)`` logs it. Training thread; one append."""
        self._phase_log.append((self._index_now(), name, seconds))

    def _set_ranks(self, rank: int | None, local_rank: int | None, world: int | None) -> None:
        """Ranks a framework knows (its Trainer): used in the hello where the launcher's
        environment and the process group do not say. A store + flag."""
        ranks = (as_count(rank), as_count(local_rank), as_count(world))
        if ranks != self._framework_ranks:
            self._framework_ranks = ranks
            self._hello_dirty.set()

    def _check_timing(self) -> None:
        self._timing_checks += 1
        self._train_thread = threading.get_ident()  # first steps only: the stepping thread
        timer, timing, note = detect()
        # The current device is per host thread in CUDA: read it here, on the training
        # thread (first 3 steps only; no device work); mapped on the publisher thread.
        with contextlib.suppress(Exception):
            self._device_index = own_device(timing)
        if (timing, note) != (self._timing, self._timing_note):
            self._timer, self._timing, self._timing_note = timer, timing, note
            self._hello_dirty.set()
        self._host_only = self._timing_checks >= 3 and self._timer is None

    # ----------------------------------------------------------- publisher thread
    def hello(self, progress: tuple[int, float | None, float | None] = (0, None, None)) -> Hello:
        """``progress``: (steps published, last step's end time, median recent period)."""
        torch = sys.modules.get("torch")
        ident = jobenv.current(self.host)  # re-read: Lightning sets its world after we start
        fw_rank, fw_local, fw_world = self._framework_ranks
        return Hello(
            source_id=self.source_id,
            role=self.role,
            name=self.name,
            host=self.host,
            pid=self.pid,
            started=self.started,
            probe_version=__version__,
            rank=ident.rank if ident.rank is not None else fw_rank,
            local_rank=ident.local_rank if ident.local_rank is not None else fw_local,
            world_size=ident.world_size if ident.world_size is not None else fw_world,
            torch_version=_torch_version(torch),
            devices=_device_names(torch) if self._timing == "cuda-events" else (),
            timing=self._timing,
            timing_note=self._timing_note,
            loader=self._loader_info,
            host_sampler=self._sample_host,
            step_count=progress[0],
            last_step_end=progress[1],
            typical_period_s=progress[2],
            loop=self._loop,
            loop_since=self._loop_since,
            loop_exit=self._loop_exit,
            framework=self._framework,
            cpu_affinity=self._affinity,
            cpu_quota_cores=self._quota,
            device=self._device,
            job=ident.job,
            passes=self._loader_passes(),
        )

    def _loader_passes(self) -> tuple[LoaderPasses, ...]:
        """Publisher thread: each loader's pass starts and their first steps' waits."""
        # list() and tuple() copy in C, holding the GIL: the training thread adds starts
        # while this runs.
        listed = [
            (tuple(entry.starts), entry.info, entry.rebuilt)
            for entry in list(self._pass_starts.values())
        ]
        waits = self._start_waits
        if len(waits) > 2 * PASS_STARTS_KEPT * PASS_START_LOADERS:  # forget unlisted ones
            kept = {i for starts, *_ in listed for i in starts}
            for index in [i for i in waits if i not in kept]:
                del waits[index]
        return tuple(
            LoaderPasses(info, starts, tuple(waits.get(i) for i in starts), rebuilt)
            for starts, info, rebuilt in listed
        )

    def _gather_facts(self) -> None:
        """Publisher thread: the process's own limits and device (filesystem reads)."""
        with contextlib.suppress(Exception):
            self._affinity = tuple(sorted(os.sched_getaffinity(0)))
        with contextlib.suppress(Exception):
            from gputop_dl.probe.collectors.cgroup import CgroupReader

            sample, _status = CgroupReader().read()
            self._quota = sample.cpu_quota_cores if sample is not None else None
        self._refresh_device()

    def _refresh_device(self) -> None:
        seen = self._device_index
        if seen is not None:
            with contextlib.suppress(Exception):
                self._device = device_ref(*seen, dict(os.environ))

    def _warn(self, key: str, text: str, *args: object) -> None:
        """Log at most once per WARN_EVERY_S per kind of problem."""
        now = time.monotonic()
        last = self._warned_at.get(key)
        if last is None or now - last >= WARN_EVERY_S:
            self._warned_at[key] = now
            log.warning(text, *args)

    def _run(self) -> None:
        pub = self._publisher
        assert pub is not None
        counters = [0, 0]  # sent, dropped
        wall_offset = time.time() - time.perf_counter()
        drain = _DrainState()
        history: deque[Batch] = deque()  # one batch per drain
        kept = 0  # steps in history
        systems: deque[list[bytes]] = deque(maxlen=HISTORY_SYSTEMS)
        last_hello = last_extra_hello = 0.0
        last_replay = -REPLAY_MIN_INTERVAL_S
        replay_due = False
        published = 0
        last_end: float | None = None
        periods: deque[int] = deque(maxlen=PERIODS_KEPT)  # the typical step period, us
        period = FLUSH_S  # the publisher's next wait (see flush_period)
        last_flush = time.monotonic()
        stall_watch = stacks.StallWatch()
        stack_frames: list[bytes] | None = None  # the current stall's stack, for replays
        sample_every = self._system_interval_s
        unwatched_every = _unwatched_pace(sample_every)
        self._gather_facts()

        def send(frames: list[bytes]) -> None:
            if pub.send(frames):
                counters[0] += 1
            else:
                counters[1] += 1

        def send_message(message: Any) -> None:
            try:
                # A run name, a path, an exception type: strings from the user's side,
                # cut here to what viewers accept, for every message built from our state.
                frames = encode(_fit_strings(message))
            except Exception as exc:  # serialization error: report, keep going
                self._warn("encode", "gputop probe: cannot encode a %s: %s", type(message), exc)
                counters[1] += 1
                return
            send(frames)

        def steps_frames(batches: Iterable[Batch]) -> list[list[bytes]]:
            sent, dropped = counters  # each message counts those before it as sent
            return [
                encode_steps(
                    self.source_id,
                    m.base,
                    m.rows,
                    sent + i,
                    dropped,
                    drain.dropped_steps,
                    m.runs,
                    m.clock_ns,
                )
                for i, m in enumerate(history_messages(batches, RECORDS_PER_MESSAGE))
            ]

        def send_steps(batches: Iterable[Batch]) -> None:
            for frames in steps_frames(batches):
                send(frames)

        def send_hello() -> None:
            typical = statistics.median(periods) / _US if periods else None
            send_message(self.hello((published, last_end, typical)))

        while True:
            # Each wake-up costs tens of microseconds of CPU: poll slower while idle. A
            # new subscriber or close() wakes the thread at once.
            subscribed = pub.wait(period)
            stopping = self._stop.is_set()
            try:
                now = time.monotonic()
                elapsed, last_flush = now - last_flush, now
                if subscribed:
                    replay_due = True
                    if now - last_extra_hello >= HELLO_MIN_INTERVAL_S:
                        last_extra_hello = now
                        self._hello_dirty.set()
                # Nobody connected: no step or hello is encoded for no one (a viewer that
                # attaches gets them all in the replay), and the node is sampled slower.
                watched = subscribed > 0 or pub.peers > 0
                if self._sampler is not None:
                    self._sampler.pace(sample_every if watched else unwatched_every)
                batch = self._drain(drain, wall_offset, force=stopping)
                steps = 0 if batch is None else batch.steps
                if not (steps or drain.pending or drain.held or self._steps):
                    period = IDLE_FLUSH_S
                elif self._flush_interval_s is not None:
                    period = self._flush_interval_s
                else:
                    period = flush_period(steps / max(elapsed, 1e-3))
                if batch is not None:
                    published += steps
                    last_end = batch.last_end
                    periods.extend(batch.periods_us(PERIODS_KEPT))
                    history.append(batch)
                    kept = trim_history(
                        history,
                        kept + steps,
                        time.time() - HISTORY_S,
                        HISTORY_MAX_STEPS,
                        HISTORY_MIN_STEPS,
                    )
                if watched and (self._hello_dirty.is_set() or now - last_hello >= HELLO_EVERY_S):
                    self._hello_dirty.clear()
                    if self._device is None:
                        self._refresh_device()
                    last_hello = now
                    send_hello()
                self._check_left_fetch(now)
                self._check_framework_left(now)
                events = self._loop_events
                for _ in range(len(events) - LOOP_MESSAGES_PER_FLUSH):
                    events.popleft()  # older changes, which viewers would only overwrite
                while events:
                    state, t, index, how = events.popleft()
                    send_message(Loop(self.source_id, state, t, index, how))
                # A new subscriber gets its history before any newer step: the viewer
                # takes only steps newer than the last it holds, so a live step ahead of
                # the replay would make it drop the replayed past. While a replay is due
                # the new steps wait in the history it sends; a subscriber admitted since
                # this wake-up began (a send admits them too) gets a hello, then the
                # replay, at once in the next one. The steps are encoded before that last
                # look, so that it comes just before the send.
                deferred = False
                if batch is not None:
                    stack_frames = None  # a step ended: the stall (if any) is over
                    # (With a replay due when stopping, the replay below sends it.)
                    if watched and not replay_due:
                        live = steps_frames((batch,))
                        if not stopping and pub.subscriptions():
                            replay_due = deferred = True
                            self._hello_dirty.set()
                            period = 0.0
                        else:
                            for frames in live:
                                send(frames)
                # A pass entered after an evaluation waits from its entry, not from the
                # last step before it (nor does the first step wait from before the loop).
                loop = self._loop  # once: the training thread may change it meanwhile
                entered = self._loop_since if loop == "in-loop" else None
                wall = time.time()
                since = last_end if entered is None else max(last_end or entered, entered)
                at = drain.next_index  # the step in progress
                stalled = stall_watch.due(wall, since, at, periods, loop != "outside")
                looked = stalled
                if stalled is None:
                    looked = stall_watch.peek_due(wall, since, at, periods, loop == "in-loop")
                if looked is not None and self._train_thread is not None:
                    segment = self._segment  # once: the training thread may change it
                    fetching = segment is not None and segment.in_fetch()
                    stack = stacks.take_stack(
                        self.source_id, self._train_thread, looked, at, fetching
                    )
                    # A look before a stall sends only a stack in a framework's evaluation
                    # or checkpoint code: a long step elsewhere is no news until a stall.
                    if stalled is not None or (
                        stack is not None and stacks.framework_away(stack) is not None
                    ):
                        stack_frames = encode(stack) if stack is not None else None
                        if stack_frames is not None:
                            send(stack_frames)
                if self._sampler is not None:
                    for sample in self._sampler.take():
                        try:
                            frames = encode(System(self.source_id, sample))
                        except Exception as exc:
                            self._warn("encode", "gputop probe: cannot encode a sample: %s", exc)
                            continue
                        systems.append(frames)
                        send(frames)
                if replay_due and (
                    stopping  # the last chance: a viewer that attached just before the end
                    or (now - last_replay >= REPLAY_MIN_INTERVAL_S and not deferred)
                ):
                    # History for whoever just attached (everyone else de-duplicates by
                    # step index); the hello above already went out.
                    # The steps first: the late viewer's graph and verdict are made of
                    # them (the samples fill in its node panels' history).
                    replay_due, last_replay = False, now
                    send_steps(history)
                    for frames in list(systems):
                        send(frames)
                    if stack_frames is not None:
                        send(stack_frames)  # a viewer attaching during a stall sees where
                if stopping:
                    send_message(Bye(self.source_id, self._bye_reason, self._index_now()))
                    break
            except Exception as exc:  # never let the thread die silently with a live loop
                self._warn("publisher", "gputop probe: publisher error: %s", exc)
                if stopping:
                    break
        # Give the I/O thread a moment to push the last frames out before closing.
        time.sleep(0.05)
        pub.close()

    def _check_left_fetch(self, now: float) -> None:
        """Publisher thread: a watched pass is left if its loader's last fetch raised and
        the training has not asked again for LEFT_FETCH_S: the watch loop saw the raise,
        or (the C-timed steps of a pass alone see none) a fetch the clock never saw
        return has no frame of the loader on any thread's stack. ``now``:
        time.monotonic()."""
        opened = list(self._open_passes)  # one C call: the training thread may change it
        for held in opened:
            first = held.raised[:1]  # (the training thread may clear it meanwhile)
            if first and not held.left and now - held.raised_at >= LEFT_FETCH_S:
                self._declare_left(held, first[0], now - held.raised_at)
        segment = self._segment
        if len(opened) != 1 or segment is None or not segment.in_fetch():
            self._fetch_seen = None
            return
        held = opened[0]
        fetcher = held.fetcher
        if fetcher is None or held.raised or held.left:
            self._fetch_seen = None
            return
        readings = len(segment.stamps)
        seen = self._fetch_seen
        if seen is None or seen[0] is not segment or seen[1] != readings:
            self._fetch_seen = (segment, readings, now)
            return
        if now - seen[2] < LEFT_FETCH_S:
            return
        self._fetch_seen = (segment, readings, now)  # looked at once per LEFT_FETCH_S
        if stacks.fetch_under_way(fetcher) is not False:
            return
        # The C-timed chain handed the exception on: its type unseen.
        since = (time.perf_counter_ns() - segment.stamps[-1]) / 1e9
        self._declare_left(held, "exception", since, (segment, readings))

    def _check_framework_left(self, now: float) -> None:
        """Publisher thread: a framework's hook-timed loop (one with no hook for an
        exception: the HF Trainer's) is left, FRAMEWORK_EXCEPTION, when the training thread no
        longer runs its loop's code. Looked at once per LEFT_FETCH_S. ``now``:
        time.monotonic()."""
        seen = self._loop_code  # (in its loop or away from it: an evaluation it runs)
        if seen is None or now - self._loop_code_seen < LEFT_FETCH_S:
            return
        self._loop_code_seen = now
        if stacks.runs_code(seen[1], seen[0]):
            return
        with self._loop_lock:
            if self._loop_code is not seen:
                return  # left or entered again meanwhile
            self._loop_code = None
            self._passes = max(0, self._passes - 1)
            if not self._passes:
                self._mark_loop("outside", FRAMEWORK_EXCEPTION)

    def _declare_left(
        self, held: HeldPass, how: str, since: float, fetch: tuple[Segment, int] | None = None
    ) -> None:
        """Publisher thread: ``held`` is left, ``since`` seconds ago, if it still is as
        seen: the training thread may have asked again meanwhile (once it takes the lock
        to rejoin, it finds the pass left and enters it again). ``fetch``: the segment
        and its count of readings, for a fetch the clock never saw return. The loop is
        left if no other pass is open (an evaluation's loop inside the training's
        leaves that one in it)."""
        with self._loop_lock:
            if held.left or held not in self._open_passes:
                return
            if fetch is None:
                if not held.raised:
                    return
            elif self._segment is not fetch[0] or len(fetch[0].stamps) != fetch[1]:
                return
            self._left(held)
            self._fetch_seen = None
            if not self._passes:
                self._mark_loop("outside", how, time.time() - max(0.0, since))

    def _drain(self, st: _DrainState, wall_offset: float, force: bool) -> Batch | None:
        """Turn what the training thread queued into wire steps (publisher thread): the
        C-timed steps as runs and the Python-timed ones (a pass's first) as rows beside
        them; everything as rows when phases, counts given by ``probe.step`` or CUDA
        events came."""
        # Only steps below this index are taken: all of them are queued by now (a step is
        # stored before the index passes it). Without it, a pass's first step queued as
        # rows are popped, and the segment after it read next, went out after later steps,
        # which a viewer drops as older (tests/test_watch_segments.py).
        limit = sys.maxsize if force else self._index_now()  # force: the last drain
        # The training thread appends meanwhile: pop (in a C loop), not iterate.
        raws = st.held + list(map(call, repeat(self._steps.popleft, len(self._steps))))
        st.held = []
        if raws and raws[-1][0] >= limit:  # queued after `limit` was read: next drain
            st.held = [raw for raw in raws if raw[0] >= limit]
            raws = raws[: len(raws) - len(st.held)]
        self._note_start_waits(raws)
        spans = self._segment_spans(limit)
        fixes = st.count_fixes
        for _ in range(len(self._count_fixes)):  # after the readings: a fix precedes its end
            index, n = self._count_fixes.popleft()
            fixes[index] = n
        outside = st.outside
        for _ in range(len(self._outside_log)):  # logged before its step's end, as a fix
            index, seconds = self._outside_log.popleft()
            outside[index] = outside.get(index, 0.0) + seconds
        log = self._phase_log
        phases = st.phases
        for _ in range(len(log)):  # after the steps: a step's phases are logged before it
            index, name, seconds = log.popleft()
            per_step = phases.setdefault(index, {})
            per_step[name] = per_step.get(name, 0.0) + seconds
        timer = self._timer
        if timer is None and not st.pending:
            if not raws and not spans:
                return None
            ends = [raws[0][3]] if raws else []
            ends += [segment.stamps[2 * segment.taken + 2] / 1e9 for segment, _ in spans]
            b = st.base_for(min(ends))
            base_ns = round(b * 1e9)
            if not (fixes or phases or outside):
                # The C-timed steps sent as the readings and counts they are; the others
                # (a pass's first steps) as rows beside them. Turning a drain's runs into
                # rows when it also held a pass's start cost the publisher ~0.5 us a step
                # more for loops of short passes (bench/short_passes.py).
                runs = [segment.run(upto) for segment, upto in spans]
                return self._drained(st, Batch(b + wall_offset, _host_rows(raws, b), runs, base_ns))
            rows: list[_Wire] = list(_host_rows(raws, b))
            if spans:
                rows = self._segment_rows(rows, spans, base_ns)
            if fixes:
                rows = _fixed(rows, fixes)
            if outside:
                rows = _without_outside(rows, outside)
            if phases:  # named phases (rare): such rows carry all nine fields
                rows = [
                    _with_phases(row, _phase_items(phases.pop(row.index, None))) for row in rows
                ]
            return self._drained(st, Batch(b + wall_offset, rows, clock_ns=base_ns))
        now = time.monotonic()
        pending = st.pending
        pending.extend((raw, now) for raw in raws)
        out: list[_Wire] = []
        b = st.base_for(pending[0][0][3]) if pending else 0.0
        while pending:
            raw, queued = pending[0]
            index, t0, t1, t_next, n, ev_start, ev_end = raw
            device_s = idle_s = caught_up = None
            if ev_end is not None and timer is not None:
                try:
                    done = timer.ready(st.ev_end, ev_start, ev_end)
                except Exception:
                    done = True
                if not done and not force and now - queued < DEVICE_EVENT_TIMEOUT_S:
                    break  # keep order: later steps wait for this one
                if done:
                    with contextlib.suppress(Exception):
                        device_s = _non_negative(timer.elapsed_s(ev_start, ev_end))
                        idle_s = _non_negative(timer.elapsed_s(st.ev_end, ev_start))
                        if t1 >= 0 and st.t_end is not None:
                            caught_up = caught_up_at_start(t1 - st.t_end, idle_s, st.period)
            pending.popleft()
            st.ev_end, st.t_end, st.period = ev_end, t_next, t_next - t0
            out.append(
                WireRow(
                    index,
                    _us(t_next - b),
                    _us(t_next - t0),
                    None if t1 < 0 else _us(t1 - t0),
                    n,
                    None if device_s is None else _us(device_s),
                    None if idle_s is None else _us(idle_s),
                    _phase_items(phases.pop(index, None)),
                    caught_up,
                )
            )
        base_ns = round(b * 1e9)
        if spans and not pending:  # CUDA events just failed: the rest is host-timed
            out = self._segment_rows(out, spans, base_ns)
        if fixes:
            out = _fixed(out, fixes)
        if outside:
            out = _without_outside(out, outside)
        return self._drained(st, Batch(b + wall_offset, out, clock_ns=base_ns))

    def _note_start_waits(self, raws: list[_Raw]) -> None:
        """Publisher thread: the data wait of the first step of each pass listed since the
        last drain, from its raw record (a pass's first step is always timed in Python,
        with its wait; a C-timed segment holds none)."""
        due, awaiting = self._starts_due, self._awaiting_starts
        for _ in range(len(due)):
            awaiting.add(due.popleft())
        if not awaiting or not raws:
            return
        for raw in raws:
            if raw[0] in awaiting:
                awaiting.discard(raw[0])
                if raw[2] >= 0:  # (probe.step records no wait)
                    self._start_waits[raw[0]] = max(0.0, raw[2] - raw[1])
        # A start drained past without its step (an empty pass's, steps dropped): none.
        newest = raws[-1][0]
        for index in [i for i in awaiting if i < newest]:
            awaiting.discard(index)

    @staticmethod
    def _drained(st: _DrainState, batch: Batch) -> Batch | None:
        """``batch`` (None if empty), once the drain state has counted it: the gaps in
        its indices (steps the full buffers dropped), and the phases and count fixes of
        steps before it, which will never be published (left open by a break)."""
        if not (batch.rows or batch.runs):
            return None
        last = batch.last_index
        st.dropped_steps += max(0, last + 1 - st.next_index - batch.steps)
        st.next_index = last + 1
        for pending in (st.count_fixes, st.phases, st.outside):
            for stale in [i for i in pending if i < st.next_index]:
                del pending[stale]
        return batch

    def _segment_spans(self, limit: int) -> list[tuple[Segment, int]]:
        """(segment, steps complete in it below step ``limit``) for segments with such
        steps not yet published; segments finished and published are let go."""
        segments = self._segments
        while True:  # the training thread may let go of the oldest too, at any moment
            try:
                oldest = segments[0]
            except IndexError:
                break
            if oldest.steps is None or oldest.taken < oldest.steps:
                break
            with contextlib.suppress(ValueError):  # gone already: the training thread's
                segments.remove(oldest)  # (identity: Segment has no __eq__)
        spans = []
        for segment in list(segments):  # a copy: the training thread appends meanwhile
            steps = segment.steps
            upto = min(segment.complete() if steps is None else steps, limit - segment.first)
            if upto > segment.taken:
                spans.append((segment, upto))
        return spans

    @staticmethod
    def _segment_rows(
        rows: list[_Wire], spans: list[tuple[Segment, int]], base_ns: int
    ) -> list[_Wire]:
        """``rows`` and the spans' rows, in step order."""
        merged = list(rows)
        for segment, upto in spans:
            merged += segment.rows(base_ns, upto)
        if rows:  # steps of a pass's Python-timed start and of segments: sort by index
            merged.sort(key=_row_index)
        return merged


@dataclass
class _DrainState:
    """What the publisher thread carries from one drain to the next."""

    pending: deque[tuple[_Raw, float]] = field(default_factory=deque)  # awaiting events
    held: list[_Raw] = field(default_factory=list)  # queued past a drain's limit: next one
    phases: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> name -> s
    next_index: int = 0
    dropped_steps: int = 0
    count_fixes: dict[int, int | None] = field(default_factory=dict)  # probe.step(samples)
    outside: dict[int, float] = field(default_factory=dict)  # step -> s in probe.outside
    ev_end: Any = None  # the last drained step's end event, its host time and period
    t_end: float | None = None
    period: float | None = None
    base: float | None = None  # perf_counter time the wire rows' ends count from

    def base_for(self, first_end: float) -> float:
        """The base for rows whose earliest end is ``first_end``: the same one for an hour,
        so that history replays merge batches without touching a row (and repeat them
        exactly), while offsets stay under 2^32 us (5 bytes on the wire)."""
        if self.base is None or not 0.0 <= first_end - self.base <= BASE_EPOCH_S:
            self.base = first_end
        return self.base


class _Listed(NamedTuple):
    """A loader's entry in Probe._pass_starts, replaced whole (one item set: the
    publisher thread reads the table meanwhile)."""

    starts: deque[int]
    info: LoaderInfo | None  # its description as of its last pass
    last: weakref.ref[Any] | None  # its last pass's loader object
    rebuilt: bool  # that object was not the pass's before


def _without_pids(info: LoaderInfo | None) -> LoaderInfo | None:
    """A loader's description for its pass starts: worker pids change every pass of
    workers not kept, and the hello's loader has the current ones."""
    if info is not None and info.worker_pids:
        return replace(info, worker_pids=())
    return info


def _host_rows(raws: list[_Raw], base: float) -> list[HostRow]:
    """Host-timed steps as wire rows: one comprehension over the raw tuples, nothing else
    per step. Times are perf_counter readings: durations >= 0, ends >= the first end
    (``base``), so trunc(x + 0.5) rounds (math.trunc: a third of round()'s or int()'s
    cost)."""
    trunc = math.trunc
    return [
        HostRow(
            i,
            trunc((tn - base) * _US + 0.5),
            trunc((tn - t0) * _US + 0.5),
            None if t1 < 0 else trunc((t1 - t0) * _US + 0.5),
            n,
        )
        for i, t0, t1, tn, n, _s, _e in raws
    ]


def _fixed(rows: list[_Wire], fixes: dict[int, int | None]) -> list[_Wire]:
    """``rows`` with the counts ``probe.step(samples)`` gave inside a C-timed loop."""
    for row in rows:  # made in this drain: nothing else holds them yet
        if row.index in fixes:
            row.samples = fixes.pop(row.index)
    return rows


def _without_outside(rows: list[_Wire], outside: dict[int, float]) -> list[_Wire]:
    """``rows`` whose steps spent time in ``probe.outside`` (an evaluation inside a
    watched step) with that time out of their period: the step starts that much later,
    after its data wait, and the time is in no step. Never below the step's data wait."""
    for row in rows:  # made in this drain: nothing else holds them yet
        seconds = outside.pop(row.index, None)
        if seconds is not None:
            row.period_us = max(row.wait_us or 0, row.period_us - _us(seconds))
    return rows


def _with_phases(row: HostRow, phases: tuple[tuple[str, int], ...]) -> WireRow:
    """A host-timed ``row`` carrying named phases (a row of all nine fields)."""
    return WireRow(
        row.index, row.end_us, row.period_us, row.wait_us, row.samples, None, None, phases
    )


def _us(seconds: float) -> int:
    """A non-negative duration in whole microseconds (the wire's unit)."""
    return math.trunc(seconds * _US + 0.5) if seconds > 0 else 0


def _fit_strings(value: T) -> T:
    """``value`` with every string in it clipped to the wire's MAX_STR (in dataclasses,
    tuples of strings), ``value`` itself when nothing is cut: a run name, a path or an
    error text the user's side made longer would make viewers refuse the whole message."""
    if isinstance(value, str):
        return value[:MAX_STR]  # type: ignore[return-value]
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        if all(len(v) <= MAX_STR for v in value):
            return value
        return tuple(v[:MAX_STR] for v in value)  # type: ignore[return-value]
    if is_dataclass(value) and not isinstance(value, type):
        cut = {f.name: _fit_strings(getattr(value, f.name)) for f in fields(value)}
        changed = {k: v for k, v in cut.items() if v is not getattr(value, k)}
        return replace(value, **changed) if changed else value
    return value


def _phase_items(per_step: dict[str, float] | None) -> tuple[tuple[str, int], ...]:
    """A step's phases as the wire carries them: names as strings clipped to MAX_STR, at most
    MAX_PHASES (the longest, the rest summed as one): past either limit viewers would
    refuse the whole message, and every step in it would be lost."""
    if not per_step:
        return ()
    items = list(per_step.items())
    if len(items) > MAX_PHASES:
        items.sort(key=lambda item: item[1], reverse=True)
        rest = sum(seconds for _, seconds in items[MAX_PHASES - 1 :])
        items[MAX_PHASES - 1 :] = [(OTHER_PHASES, rest)]
    return tuple([(str(name)[:MAX_STR], _us(s)) for name, s in items])


def caught_up_at_start(
    host_gap_s: float, device_idle_s: float | None, prev_period_s: float | None
) -> bool | None:
    """Was the device done with everything queued when the host finished the previous
    step (recorded its end event)?

    ``host_gap_s`` is the host time between recording the previous step's end event and
    this step's start event (the data wait), ``device_idle_s`` the device time between
    reaching them. Nothing is queued between the two, so the device reaches the start
    event at max(its arrival at the end event, the start's recording): the gap it shows
    is ``max(0, host_gap - lag)``, where ``lag`` is how far the device was behind the host
    at the end event. A positive gap therefore gives ``lag = host_gap - device_idle``
    exactly; a zero gap says the lag was at least the host gap. Caught up: a lag of at
    most 10 % of the previous step's period (the kernel still running when the host
    finishes a launch-bound step) or 0.1 ms (timer resolution, the cost of a record).
    """
    if device_idle_s is None or host_gap_s < 0 or prev_period_s is None:
        return None
    if device_idle_s <= 0.0:
        return False
    lag = host_gap_s - device_idle_s
    return lag <= max(CAUGHT_UP_TOLERANCE_S, CAUGHT_UP_TOLERANCE_FRACTION * prev_period_s)


# --------------------------------------------------------------------- helpers
@atexit.register
def _close_all() -> None:
    p = current()
    if p is not None:
        with contextlib.suppress(Exception):
            p.close(exit_reason())


CRASH_TEXT_MAX = 160  # characters of the exception's text in a bye's reason


def exit_reason() -> str:
    """The bye's reason at the interpreter's exit: "process exit", or "crashed (Type:
    text)" when an exception no one caught ended the main thread (the interpreter keeps
    it in ``sys.last_value`` for the exit handlers), "interrupted (Ctrl-C)" for that one.

    Not where ``sys.last_value`` may hold an error the process went on after: an
    interactive session (``sys.ps1``: the REPL, ``python -i``, IPython keeps a cell's
    there). A ``SystemExit`` is never kept there: ``sys.exit(1)`` is a process exit.
    The text of an exception whose ``str()`` raises is left out; this never raises."""
    error = getattr(sys, "last_value", None)
    if not isinstance(error, BaseException) or hasattr(sys, "ps1") or "IPython" in sys.modules:
        return "process exit"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    try:
        text = str(error)
    except Exception:
        text = ""
    text = text if len(text) <= CRASH_TEXT_MAX else text[: CRASH_TEXT_MAX - 1] + "…"
    name = type(error).__name__
    return f"{CRASHED} ({name}: {text})" if text else f"{CRASHED} ({name})"


def _make_sampler(probe: Probe) -> Any:
    """Start the node sampler; a failure here only costs the system panels."""
    try:
        from gputop_dl.probe.collectors.sampler import NodeSampler

        sampler = NodeSampler(
            main_pid=probe.pid if probe.role == "probe" else None,
            interval_s=probe._system_interval_s,
            host=probe._sample_host,
            data_path=probe._data_path,
            worker_pids=probe.worker_pids,
        )
        sampler.pace(_unwatched_pace(probe._system_interval_s))  # nobody is connected yet
        sampler.start()
        return sampler
    except Exception as exc:
        log.warning("gputop probe: no system samples: %s", exc)
        return None


def _unwatched_pace(interval_s: float) -> float:
    return max(interval_s, UNWATCHED_SAMPLE_S)


def _non_negative(value: float | None) -> float | None:
    return None if value is None else max(0.0, value)


def as_count(value: Any) -> int | None:
    """A count as the wire carries it (``Count``: 0 to 2**63 - 1), else None: a larger one
    would make every message holding it fail to encode, or be refused whole by viewers.
    For what the user states (``samples=``, ``probe.step``, ranks); counts read off an
    array's leading dimension (probe/loader.py) are int64 by construction."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _device_names(torch: Any) -> tuple[str, ...]:
    try:
        return tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:
        return ()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _script_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return os.path.basename(argv0) or "python"


def _torch_version(torch: Any) -> str | None:
    version = getattr(torch, "__version__", None) if torch is not None else None
    return str(version) if version is not None else None  # TorchVersion is a str subclass
