"""The viewer under a flood: the UI thread's inbox stays bounded, the excess is counted and
shown, and ``q`` still quits (Pilot, a source thread pushing ~100,000 events a second).

The 0.5 s answer to ``q`` in a real terminal is measured by bench/soak.py (tmux); here
a generous bound only tells a hang from an answer.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fakes_tui import (
    HOST,
    SOURCE_ID,
    T0,
    FakeSource,
    hello,
    received,
    step_records,
    system_sample,
)

from gputop_dl.probe.core import HISTORY_MAX_STEPS, HISTORY_SYSTEMS, RECORDS_PER_MESSAGE
from gputop_dl.probe.messages import Steps, System
from gputop_dl.tui.app import INBOX_MAX, REPLAY_STEPS, GputopApp
from gputop_dl.tui.events import Emit, SourceEvent

EVENTS_PER_S = 100_000
BATCH = 1_000
HANG_S = 20.0  # far above any answer: only a hang gets here


class FloodSource:
    """A Source whose thread emits BATCH events every BATCH / EVENTS_PER_S seconds until
    stopped: steps of one run, and system samples of 30,000 cores."""

    def __init__(self, events: list[SourceEvent]) -> None:
        self.events = events
        self.emitted = 0
        self.biggest_inbox = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.app: GputopApp | None = None

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(target=self._run, args=(emit,), daemon=True)
        self._thread.start()

    def _run(self, emit: Emit) -> None:
        period = BATCH / EVENTS_PER_S
        i = 0
        while not self._stop.is_set():
            batch = [self.events[(i + k) % len(self.events)] for k in range(BATCH)]
            i += BATCH
            emit(batch)
            self.emitted += len(batch)
            if self.app is not None:
                self.biggest_inbox = max(self.biggest_inbox, self.app._inbox_weight)
            time.sleep(period)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def flood_events() -> list[SourceEvent]:
    now = T0 + 60.0
    records = step_records(T0, 60.0, samples_per_s=2000.0, batch=25)
    steps: list[SourceEvent] = [
        received(Steps(SOURCE_ID, records[i : i + 4], i, 0), now) for i in range(0, 400, 4)
    ]
    big = system_sample(now, core_count=30_000)
    return [received(hello(), now), *steps, received(System(SOURCE_ID, big), now)]


async def test_q_quits_under_a_flood_and_the_inbox_stays_bounded() -> None:
    source = FloodSource(flood_events())
    app = GputopApp(source, local_host=HOST, refresh_hz=2.0, clock=lambda: T0 + 60.0)
    source.app = app
    async with app.run_test(size=(200, 50)) as pilot:
        while source.emitted < 2 * EVENTS_PER_S // 10:  # the flood is on
            await asyncio.sleep(0.05)
        await pilot.pause()
        assert app.state.runs, "the flooding run is shown"
        # A UI thread busy for a second (a slow terminal, a big redraw): a fast machine
        # keeps up with the flood otherwise, and nothing would need dropping. Blocking,
        # on purpose: this coroutine runs on the UI thread.
        time.sleep(1.0)
        await pilot.pause()
        await asyncio.wait_for(pilot.press("q"), HANG_S)
        await asyncio.wait_for(pilot.pause(), HANG_S)
    assert app.return_code == 0
    assert source._stop.is_set(), "quitting stopped the source"
    # Bounded: at most twice the cap waited (urgent events may use the second half).
    assert source.biggest_inbox <= 2 * INBOX_MAX
    # That second brought ~100,000 events, 2.5x the inbox: the excess was dropped.
    assert app.events_dropped > 0, "a flood the UI thread cannot take is cut"
    assert any("viewer overloaded" in e.text for e in app.state.errors)


async def test_a_trickle_is_never_dropped() -> None:
    app = GputopApp(FakeSource(), local_host=HOST, refresh_hz=2.0, clock=lambda: T0 + 60.0)
    async with app.run_test(size=(80, 24)) as pilot:
        events = flood_events()
        for _ in range(3):
            app._emit(events)
            await pilot.pause()
            app.refresh_view()
        assert app.events_dropped == 0
        assert app.events_applied == 3 * len(events)
        await pilot.press("q")


def replay_events() -> list[SourceEvent]:
    """What a probe sends a viewer that attaches: a hello, its last HISTORY_MAX_STEPS
    steps in messages of RECORDS_PER_MESSAGE, its last HISTORY_SYSTEMS node samples."""
    now = T0 + 600.0
    records = step_records(now - 200.0, 200.0, samples_per_s=2500.0, batch=25)
    assert len(records) >= HISTORY_MAX_STEPS
    records = records[-HISTORY_MAX_STEPS:]
    steps: list[SourceEvent] = [
        received(Steps(SOURCE_ID, records[i : i + RECORDS_PER_MESSAGE], i, 0), now)
        for i in range(0, len(records), RECORDS_PER_MESSAGE)
    ]
    systems: list[SourceEvent] = [
        received(System(SOURCE_ID, system_sample(now - n)), now) for n in range(HISTORY_SYSTEMS)
    ]
    return [received(hello(), now), *steps, *systems]


def test_the_inbox_holds_a_probes_replay_whole() -> None:
    assert REPLAY_STEPS == HISTORY_MAX_STEPS  # the app does not import the probe's core


@pytest.mark.parametrize("refresh_hz", [10.0, 2.0, 1.0])
async def test_a_late_viewers_replay_is_taken_whole_at_any_refresh(refresh_hz: float) -> None:
    """A viewer attaching to a run that has been going a while gets its history at once:
    all of it waits for the next refresh, none is dropped as a flood."""
    app = GputopApp(FakeSource(), local_host=HOST, refresh_hz=refresh_hz, clock=lambda: T0 + 600.0)
    async with app.run_test(size=(120, 40)) as pilot:
        events = replay_events()  # no await until applied: no timer tick in between
        app._emit(events)
        assert app._inbox_dropped == 0
        app.refresh_view()
        assert app.events_dropped == 0
        assert app.events_applied == len(events)
        assert not any("viewer overloaded" in e.text for e in app.state.errors)
        await pilot.press("q")
