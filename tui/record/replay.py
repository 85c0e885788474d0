"""Replay a recording: a :class:`~tui.events.Source` on the recorded clock, and the
headless replayer that ``snapshot`` and ``export`` use.

Nothing downstream knows it is not live: the recorded frames are decoded as live
(``reader.decode_entry``), applied to the same ViewerState, and judged by the same
analyzer, at the same tick rate *in recorded time* as the live viewer (TICK_S), whatever
the replay speed. Seeking back rebuilds the state from the start of the recording.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from gputop_dl.probe.messages import Hello
from gputop_dl.tui.events import Emit, SourceEvent, ThreadSource
from gputop_dl.tui.record.reader import Timeline
from gputop_dl.tui.state import ViewerState

# The state is ticked this often, as a live viewer at --refresh 2: a stall or a verdict
# change is dated to the half second (verdicts are computed about once a second at 1 or 2).
TICK_S = 0.5
# A quick replay (snapshot of a long recording) ticks every COARSE_TICK_S up to FINE_S
# before the moment asked for, then every TICK_S: the verdict at that moment comes from
# the same analyzer over the same window (30 s) and hysteresis as live; only the times
# of earlier changes (a verdict's "since") are as coarse as COARSE_TICK_S.
COARSE_TICK_S = 60.0
FINE_S = 120.0
POLL_S = 0.05  # the replay source hands over what is due this often (wall time)
SPEEDS = (1, 2, 5, 10, 20, 30, 60)


class ReplayClock:
    """Recorded time that runs at ``speed`` times wall time from ``position``, stops at the
    end of the recording, and can be paused or moved. Thread-safe."""

    def __init__(
        self, start: float, end: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.start, self.end = start, max(start, end)
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._position = start
        self._since = monotonic()
        self.speed = 1
        self.paused = False

    def now(self) -> float:
        with self._lock:
            return self._now()

    def _now(self) -> float:
        if self.paused:
            return self._position
        elapsed = (self._monotonic() - self._since) * self.speed
        return min(self.end, self._position + elapsed)

    def _rebase(self, position: float) -> None:
        self._position = min(self.end, max(self.start, position))
        self._since = self._monotonic()

    def seek(self, position: float) -> float:
        with self._lock:
            self._rebase(position)
            return self._position

    def set_paused(self, paused: bool) -> None:
        with self._lock:
            self._rebase(self._now())
            self.paused = paused

    def set_speed(self, speed: int) -> None:
        with self._lock:
            self._rebase(self._now())
            self.speed = speed

    def faster(self, step: int = 1) -> int:
        """The next speed in SPEEDS up (``step`` > 0) or down."""
        index = SPEEDS.index(self.speed) if self.speed in SPEEDS else 0
        self.set_speed(SPEEDS[min(len(SPEEDS) - 1, max(0, index + step))])
        return self.speed


def recorder_sampler(host: str) -> Callable[[Hello], bool]:
    """Whether an agent's hello is the recorder's own node sampler (tui.source's, recorded
    with the rest), not an agent. Live, the viewer knows its sampler by its own pid; the
    recorder's was another process's. It samples the recorder's ``host`` as a process of
    its own, and its hello does not claim the node's host sampling, which every ``gputop
    agent`` (a probe sampling its node) does: a recorded agent still reads as one."""

    def own(hello: Hello) -> bool:
        return (
            hello.host == host
            and not hello.host_sampler
            and hello.source_id == f"{hello.host}:{hello.pid}"
        )

    return own


def event_time(event: SourceEvent) -> float | None:
    return getattr(event, "received", None)


class Replayer:
    """A ViewerState fed a timeline's events in order, ticked every TICK_S of recorded
    time in between (as the live app's refresh ticks it): the replay's single path."""

    def __init__(
        self,
        timeline: Timeline,
        *,
        history_s: float = 300.0,
        on_tick: Callable[[ViewerState, float], None] | None = None,
    ) -> None:
        self.timeline = timeline
        self.history_s = history_s
        self.on_tick = on_tick  # sees the state after each tick (the exports' verdicts)
        self.reset()

    def reset(self) -> None:
        # No pid check: the recorded runs' pids mean nothing now; the recorder's own node
        # sampler is the recording's, not this process's.
        host = self.timeline.header.host
        self.state = ViewerState(
            host, self.history_s, pid_alive=None, own_sampler=recorder_sampler(host)
        )
        self.applied = 0  # events of the timeline applied: always a prefix
        self.ticked: float | None = None  # recorded time of the last tick

    def feed(self, events: Sequence[SourceEvent], every: float = TICK_S) -> None:
        """Apply the timeline's next ``events``, ticking each ``every`` s of their times."""
        state = self.state
        for event in events:
            at = event_time(event)
            if at is not None:
                self._tick_until(at, every, inclusive=False)
            roster = state.roster
            state.apply(event)
            if (
                at is not None
                and state.roster != roster
                and (self.ticked is None or self.ticked < at)
            ):
                self.ticked = at  # a run appeared or changed: the live app redraws at once
                self._tick(at)
        self.applied += len(events)

    def _tick_until(self, t: float, every: float, *, inclusive: bool) -> None:
        if self.ticked is None:  # the first tick comes with the first source (see feed)
            if not inclusive:
                return
            self.ticked = t - every
        while self.ticked + every < t or (inclusive and self.ticked + every <= t):
            self.ticked += every
            self._tick(self.ticked)

    def tick(self, t: float) -> None:
        """Tick the state at ``t`` (after the TICK_S ticks before it)."""
        self._tick_until(t, TICK_S, inclusive=True)
        if self.ticked is None or self.ticked < t:
            self.ticked = t
            self._tick(t)

    def _tick(self, t: float) -> None:
        self.state.tick(t)
        if self.on_tick is not None:
            self.on_tick(self.state, t)

    def advance_to(self, t: float, *, quick: bool = False) -> None:
        """The state as of recorded time ``t``; rebuilt from the start when ``t`` is
        before where it is. ``quick``: coarse ticks until FINE_S before ``t``."""
        if self.ticked is not None and t < self.ticked:
            self.reset()
        timeline = self.timeline
        upto = timeline.index_after(t)
        if quick:
            fine = min(upto, max(self.applied, timeline.index_after(t - FINE_S)))
            self.feed(timeline.events[self.applied : fine], COARSE_TICK_S)
        if upto > self.applied:
            self.feed(timeline.events[self.applied : upto])
        self.tick(t)


class ReplaySource(ThreadSource):
    """Hands the app the timeline's events as the replay clock reaches them."""

    thread_name = "gputop-replay"

    def __init__(self, timeline: Timeline, clock: ReplayClock | None = None) -> None:
        super().__init__()
        self.timeline = timeline
        self.clock = clock or ReplayClock(timeline.start, timeline.end)
        self.lock = threading.Lock()  # held while emitting, so seek is atomic with it
        self._next = 0

    def _run(self, emit: Emit) -> None:
        while not self._stop.is_set():
            with self.lock:
                upto = self.timeline.index_after(self.clock.now())
                if upto > self._next:
                    batch: list[SourceEvent] = list(self.timeline.events[self._next : upto])
                    self._next = upto
                    emit(batch)
            self._stop.wait(POLL_S)

    def seek(self, position: float) -> float:
        """Move the clock; the next events emitted are those after ``position`` (returned,
        clamped to the recording). Call it holding ``lock``, and rebuild the state up to
        ``position`` before letting go: nothing is emitted in between."""
        position = self.clock.seek(position)
        self._next = self.timeline.index_after(position)
        return position


def replay_state(timeline: Timeline, at: float | None = None, *, quick: bool = True) -> Replayer:
    """The replayer advanced to ``at`` (default: the end of the recording)."""
    replayer = Replayer(timeline)
    replayer.advance_to(timeline.end if at is None else at, quick=quick)
    return replayer
