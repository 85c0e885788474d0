"""The viewer on a recording: GputopApp fed by a ReplaySource on the recorded clock, with
keys to pause, change speed and seek, and a time line.

The events the source hands over go through the :class:`Replayer`, which ticks the state
every TICK_S of *recorded* time in between, so verdicts come out as they did live at
any speed. Seeking forward feeds the events in between the same way; seeking back
rebuilds the state from the start of the recording.
"""

from __future__ import annotations

from pathlib import Path

from textual.binding import Binding

from gputop_dl.tui import app as live_app
from gputop_dl.tui.app import GputopApp, SourceEvents
from gputop_dl.tui.events import SourceEvent
from gputop_dl.tui.record.reader import Timeline
from gputop_dl.tui.record.replay import ReplayClock, Replayer, ReplaySource
from gputop_dl.tui.widgets.header import ReplayMark

SEEK_S = 10.0


class ReplayApp(GputopApp):
    CSS_PATH = str(Path(live_app.__file__).with_name("app.tcss"))  # the live viewer's, not ours
    BINDINGS = [
        Binding("space", "replay_pause", "Play/pause", priority=True),
        Binding("plus,equals_sign", "replay_speed(1)", "Faster", key_display="+"),
        Binding("minus", "replay_speed(-1)", "Slower", key_display="-"),
        Binding("left", "replay_seek(-1)", "-10 s", key_display="←", priority=True),
        Binding("right", "replay_seek(1)", "+10 s", key_display="→", priority=True),
    ]

    def __init__(
        self,
        timeline: Timeline,
        *,
        refresh_hz: float = 2.0,
        title: str = "",
        clock: ReplayClock | None = None,
    ) -> None:
        self.timeline = timeline
        replay_source = ReplaySource(timeline, clock)
        self.replay_source = replay_source
        self.replayer = Replayer(timeline)
        super().__init__(
            replay_source,
            local_host=timeline.header.host,
            refresh_hz=refresh_hz,
            clock=replay_source.clock.now,
        )
        self.state = self.replayer.state
        if title:
            self.title = f"gputop · {title}"

    # ------------------------------------------------------------ events in order
    def _emit(self, events: list[SourceEvent]) -> None:
        """Every event, in order (the replayer relies on it): nothing is dropped, the
        replay clock paces the source, so a batch is what one POLL_S of recorded time
        at the current speed holds."""
        with self._inbox_lock:
            self._inbox.extend(events)
            wake = not self._wake_posted
            self._wake_posted = True
        if wake:
            self.post_message(SourceEvents())

    def _apply_inbox(self) -> bool:
        """Apply what the source handed over through the replayer (ticks in between)."""
        events: list[SourceEvent] = self._take_inbox()
        if not events:
            return False
        roster = self.state.roster
        self.replayer.feed(events)
        self.events_applied += len(events)
        return self.state.roster != roster

    def refresh_view(self) -> None:
        self._apply_inbox()
        self.replayer.tick(self.clock())  # the live app's tick, in recorded time
        super().refresh_view()  # nothing left to apply; ticks again at the same time
        self._show_time()

    def _show_time(self) -> None:
        clock = self.replay_source.clock
        now = clock.now()
        self.record_bar.show_replay(now, clock.start, clock.end, clock.speed, clock.paused)
        # The header says "replay" where a live viewer says "live" (the recorded runs
        # were live then, they are not now).
        self.header.set_replay(ReplayMark(clock.speed, clock.paused, now >= clock.end))

    # -------------------------------------------------------------------- actions
    def action_replay_pause(self) -> None:
        clock = self.replay_source.clock
        clock.set_paused(not clock.paused)
        self._show_time()

    def action_toggle_pause(self) -> None:
        """``p`` pauses the replay as space does: freezing the screen while the recording
        went on under it would skip what it froze over."""
        self.action_replay_pause()

    def action_replay_speed(self, step: int) -> None:
        self.replay_source.clock.faster(step)
        self._show_time()

    def action_replay_seek(self, direction: int) -> None:
        self.seek(self.replay_source.clock.now() + direction * SEEK_S)

    def seek(self, position: float) -> None:
        """Show the recording as of ``position`` (recorded Unix time)."""
        source, replayer = self.replay_source, self.replayer
        with source.lock:  # the source hands nothing over meanwhile
            position = source.seek(position)
            self._take_inbox()  # handed over before the seek: the replayer catches up
            replayer.advance_to(position, quick=True)  # back: a rebuild, coarse early on
            self.state = replayer.state  # a new one when it was rebuilt
        self.refresh_view()
