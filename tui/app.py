"""The gputop viewer: a Textual app fed by a :class:`~tui.events.Source`.

Threads: the source calls ``emit`` on its own thread; ``emit`` only posts a message.
The state changes in that message's handler (the UI thread); a timer at ``refresh_hz``
recomputes time-dependent state and redraws the panels. ``clock`` is the only time the
app reads, so tests and snapshots freeze it.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.driver import Driver
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Footer, Static

from gputop_dl.probe.messages import Steps, System
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.events import BadInput, Received, Source, SourceEvent
from gputop_dl.tui.record.bar import RecordBar
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.widgets.accelerators import AcceleratorsPanel
from gputop_dl.tui.widgets.banner import Banner
from gputop_dl.tui.widgets.base import Panel
from gputop_dl.tui.widgets.cpu import CpuPanel
from gputop_dl.tui.widgets.disk import DiskPanel
from gputop_dl.tui.widgets.fold import Scroll, more_text
from gputop_dl.tui.widgets.header import HeaderBar, new_runs_text
from gputop_dl.tui.widgets.memory import MemoryPanel
from gputop_dl.tui.widgets.network import NetworkPanel
from gputop_dl.tui.widgets.processes import ProcessTable
from gputop_dl.tui.widgets.rankboard import RankBoard, job_line
from gputop_dl.tui.widgets.status import StatusLine
from gputop_dl.tui.widgets.throughput import ThroughputGraph

WIDE_COLUMNS = 120  # from this width the panels sit side by side
TALL_ROWS = 44  # from this height the panels show their full forms, below it compact ones
MIN_GRAPH_NARROW = 4  # the graph's rows on a short screen: its rule, two rows, the split
MIN_GRAPH_WIDE = 6  # (two rules with a border)
MIN_PANEL_ROWS = 3
FOOTER_ROWS = 1
HINT_ROWS = 1  # the row under the panels that names what is out of sight (#more)
# A terminal too small for the verdict, the graph's smallest form and MIN_PANEL_ROWS
# (a 40x10 tmux pane) is *cramped*: the graph goes, the panels keep what the verdict
# leaves (from this many rows, else they go too), and #more says what went.
CRAMPED_PANEL_ROWS = 2
NOTICE_S = 8.0  # how long the notice of a new run stays (a glance away and back)
# What may wait for the UI thread, in step records (any other event counts 1): a
# probe's replay to a late viewer whole (REPLAY_STEPS and its node samples), and
# what a refresh period of 1 s brings from 64 runs of 600 steps/s. Applying a full inbox
# takes well under a refresh period, so a key press is never queued behind a backlog:
# past this, routine steps and samples are dropped (and counted, shown as an error);
# anything else may use twice the room before it is dropped too.
REPLAY_STEPS = 20_000  # probe.core.HISTORY_MAX_STEPS (not imported: the probe's machinery)
INBOX_MAX = 2 * REPLAY_STEPS


class SourceEvents(Message):
    """Events are waiting in the app's inbox: apply them now (posted from the source's
    thread only when they should not wait for the next refresh)."""


def _urgent(event: SourceEvent) -> bool:
    """Worth a wake-up of the UI thread: anything but routine steps and samples."""
    return not (isinstance(event, Received) and isinstance(event.message, Steps | System))


def _weight(event: SourceEvent) -> int:
    """What applying ``event`` costs the UI thread, in step records."""
    if isinstance(event, Received) and isinstance(event.message, Steps):
        return max(1, len(event.message.records))
    return 1


def _tune_gc() -> None:
    """Fewer collections for a long-running viewer (a real terminal, not under test).

    What start-up built lives as long as the app: frozen, out of the collector's sight,
    each full collection has far fewer objects to go through. Each refresh allocates
    many short-lived objects: collecting the youngest generation every 10,000
    allocations instead of 700 runs the collector (and its older generations) far less
    often, for a few more objects held between collections."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def _short_title(panel: Panel) -> str:
    """A panel's title without its details ("Memory · 23.5 GiB" -> "Memory")."""
    return str(panel.border_title or "").split(" ·")[0]


def screenshot_dir() -> Path:
    """Where ``s`` saves: $GPUTOP_SCREENSHOT_DIR, else $XDG_DATA_HOME/gputop/screenshots
    (~/.local/share/gputop/screenshots), never the current directory (a repository)."""
    if os.environ.get("GPUTOP_SCREENSHOT_DIR"):
        return Path(os.environ["GPUTOP_SCREENSHOT_DIR"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(data) / "gputop" / "screenshots"


class GputopApp(App[None]):
    """``source`` feeds the app; ``local_host`` is this machine's name (the host shown
    when no run is selected); ``clock`` returns Unix seconds."""

    CSS_PATH = "app.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_ROWS, "-tall")]
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # as in top and htop
        Binding("p", "toggle_pause", "Pause"),
        Binding("tab", "next_run", "Next run", priority=True),
        Binding("shift+tab", "previous_run", "Prev run", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("s", "save_screenshot", "Screenshot"),
        Binding("t", "toggle_processes", "Top procs"),
        Binding("j", "rank_board", "Ranks", show=False),  # the banner says so for a job
        Binding("r", "toggle_record", "Record", show=False),
        Binding("pagedown", "scroll_panels(1)", "Scroll", show=False),
        Binding("pageup", "scroll_panels(-1)", "Scroll", show=False),
        *(Binding(str(n), f"select_run({n})", f"Run {n}", show=False) for n in range(1, 10)),
    ]

    def __init__(
        self,
        source: Source,
        *,
        local_host: str,
        refresh_hz: float = 1.0,  # cli.DEFAULT_REFRESH_HZ
        clock: Callable[[], float] = time.time,
        history_s: float = 300.0,
    ) -> None:
        # NO_COLOR (no-color.org): Textual's own answer is grey 24-bit colour; native ANSI
        # mode makes it drop colour altogether.
        super().__init__(ansi_color=True if "NO_COLOR" in os.environ else None)
        self.source = source
        self.local_host = local_host
        self.refresh_hz = refresh_hz
        self.clock = clock
        self.state = ViewerState(local_host, history_s=history_s)
        self.paused = False
        self.events_applied = 0
        self._timer: Timer | None = None
        self._source_started = False
        # Events from the source's thread, applied on the UI thread.
        self._inbox: list[SourceEvent] = []
        self._inbox_weight = 0  # step records (and other events) waiting, <= 2 * INBOX_MAX
        self._inbox_dropped = 0  # events dropped since the inbox was last taken
        self.events_dropped = 0  # in all
        self._inbox_lock = threading.Lock()
        self._wake_posted = False
        self._wake_for_any = True  # until a run shows: every batch is news
        # The panels, kept by reference: a timer may fire while the screen is torn down.
        self.header = HeaderBar(id="header")
        # A source that samples no node says what it does instead (ZmqSource.waiting_for).
        self.header.waiting = tuple(getattr(source, "waiting_for", tuple)())
        self.status = StatusLine(id="status")
        self.record_bar = RecordBar(id="record-bar")  # `r`: the recording in progress
        self.banner = Banner(id="banner")
        self.graph = ThroughputGraph(id="throughput")
        self.accelerators = AcceleratorsPanel(id="accelerators")
        self.cpu = CpuPanel(id="cpu")
        self.memory = MemoryPanel(id="memory")
        self.disk = DiskPanel(id="disk")
        self.network = NetworkPanel(id="network")
        self.top_table = ProcessTable(id="top")
        self.panels = VerticalScroll(id="panels")
        self.more = Static(id="more")  # says what is below the fold, and how to get there
        self.top_toggled = False  # `t` flips the default (shown on a tall or wide screen)
        self._panels_room: int | None = None  # rows the panels may take (short screens)
        self._cramped = False  # the graph (and maybe the panels) have no room: hidden
        self._hint_rows = HINT_ROWS
        self._more_text = ""

    def get_driver_class(self) -> type[Driver]:
        """Textual's own driver, guarded against end of input and exit signals."""
        if sys.platform == "win32":
            return super().get_driver_class()
        from gputop_dl.tui.driver import GuardedDriver

        return GuardedDriver

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.status
        yield self.record_bar
        yield self.banner
        yield self.graph
        with self.panels:
            yield self.accelerators
            yield self.cpu
            yield self.memory
            yield self.disk
            yield self.network
            yield self.top_table
        yield self.more
        yield Footer()

    def on_mount(self) -> None:
        self.more.display = False
        # after the layout that the scroll or the growth comes with
        self.watch(self.panels, "scroll_y", self._update_more_later, init=False)
        self.watch(self.panels, "virtual_size", self._fit_panels_later, init=False)
        self.refresh_view()
        if self.refresh_hz > 0:
            self._timer = self.set_interval(1.0 / self.refresh_hz, self.refresh_view)
        self.source.start(self._emit)
        self._source_started = True
        if not self.is_headless:
            self.call_after_refresh(_tune_gc)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_panels)

    def on_unmount(self) -> None:
        self._stop_source()

    def _stop_source(self) -> None:
        if self._source_started:
            self._source_started = False
            self.source.stop()
            self.record_bar.stop_recording()  # after the source: nothing more to write

    # ---------------------------------------------------------------- data in

    def _emit(self, events: list[SourceEvent]) -> None:
        """Called by the source, on any thread: hand the batch to the UI thread.

        Routine steps and samples wait in the inbox for the next refresh (the screen
        changes only then: waking the UI thread for each batch costs CPU for nothing);
        a new run, a hello, a problem, or anything before the first run wakes it.
        The inbox is bounded (INBOX_MAX): under a flood the excess is dropped here, on the
        source's thread, so the UI thread never has more than tens of milliseconds of
        work to apply at once."""
        wake = self._wake_for_any or any(_urgent(event) for event in events)
        with self._inbox_lock:
            weight = self._inbox_weight
            for event in events:
                cost = _weight(event)
                room = INBOX_MAX if not _urgent(event) else 2 * INBOX_MAX
                if weight + cost > room:
                    self._inbox_dropped += 1
                    continue
                weight += cost
                self._inbox.append(event)
            self._inbox_weight = weight
            wake = wake and not self._wake_posted
            if wake:
                self._wake_posted = True
        if wake:
            self.post_message(SourceEvents())

    def _take_inbox(self) -> list[SourceEvent]:
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
            dropped, self._inbox_dropped = self._inbox_dropped, 0
            self._inbox_weight = 0
            self._wake_posted = False
        if dropped:
            self.events_dropped += dropped
            text = f"viewer overloaded: {dropped} messages dropped (more arrive than it can show)"
            events.append(BadInput(text, self.clock()))
        return events

    def _apply_inbox(self) -> bool:
        """Apply what the source sent; True when a run appeared, changed or went."""
        events = self._take_inbox()
        if not events:
            return False
        roster = self.state.roster
        self.state.apply_all(events)
        self.events_applied += len(events)
        return self.state.roster != roster

    @on(SourceEvents)
    def _apply_events(self, message: SourceEvents) -> None:
        if self._apply_inbox():
            self.refresh_view()  # show a new run at once, not at the next tick

    # ---------------------------------------------------------------- data out

    def _screens_gone(self) -> bool:
        """True once the app is shutting down: Textual removes its screens before it stops
        its timers and callbacks, and a refresh then would raise ScreenStackError (a
        traceback on quit, or an exit code of 1)."""
        return not self.screen_stack

    def refresh_view(self) -> None:
        """Apply what arrived, recompute time-dependent state and, unless paused, redraw
        the panels (each only if what it shows changed)."""
        if self._screens_gone():
            return
        self._apply_inbox()
        self.state.tick(self.clock())
        self._wake_for_any = not self.state.has_probe or self.refresh_hz <= 0
        if not self.paused:  # paused: the screen (and what it shows) stays as it was
            self._follow_new_runs()
            self._show()

    def _follow_new_runs(self) -> None:
        """A run that started after the shown one ended takes its place (unless the user
        picked the shown one), and a notice says so, with the key back."""
        news = self.state.follow_new_runs()
        if news is not None:
            self.notify(new_runs_text(news), title="New run", timeout=NOTICE_S)

    def _show(self) -> None:
        state = self.state
        now = self.clock()
        run = state.selected
        host = state.display_host()
        system = state.host_system()
        self.header.show(run, state.runs, state.selected_index, host)
        self.status.show(state.errors, state.error_count, run, now, state.link_summary())
        job = state.job_of()
        shown_job = job if job is not None and len(job.ranks) > 1 else None
        job_text = f"{job_line(shown_job)}   (j: rank board)" if shown_job is not None else None
        self.banner.show(run, host, now, job_text, agent_only=state.agent_only_hosts())
        if isinstance(self.screen, RankBoard):
            self.screen.show(job)
        self.graph.show(run, state.throughput())
        self.accelerators.show(system)
        self.cpu.show(
            system.cpu if system else None,
            state.training_processes(),
            system.cgroup if system else None,
        )
        self.memory.show(
            system.memory if system else None,
            system.pressure if system else None,
            system.cgroup if system else None,
            system.statuses if system else (),
        )
        loader = run.loader if run is not None else None
        self.disk.show(
            system.disks if system else (),
            system.data_device if system else None,
            system.data_fs_type if system else None,
            loader.dataset_path if loader is not None else None,
        )
        self.network.show(system.nets if system else ())
        self._show_top(system)
        self.call_after_refresh(self._fit_panels)
        self.sub_title = run.label if run is not None else host or ""

    def _show_top(self, system: SystemSample | None) -> None:
        roomy = self.screen.has_class("-tall") or self.screen.has_class("-wide")
        reported = system is not None and system.top is not None
        shown = (roomy and reported) != self.top_toggled  # by default: where there is room
        self.top_table.set_display(shown)
        if shown:
            run = self.state.selected
            self.top_table.show(
                system,
                self.state.training_processes(),
                run.pid if run is not None else None,
                frozenset(r.pid for r in self.state.runs if r.pid is not None),
            )

    def _fit_panels(self) -> None:
        """On a short screen the panels get what the verdict and the graph's smallest
        form leave, and scroll beyond that (a container of automatic height would
        instead push the bottom panels off the screen, out of the scroll's reach). A
        row under them says what is below the fold whenever they scroll.

        On a cramped one (see CRAMPED_PANEL_ROWS) the verdict comes first: the banner
        keeps every row but the hint's, the graph goes, the panels keep what is left
        (or go), and the hint says what is hidden and that a larger terminal shows it."""
        if self._screens_gone():
            return
        fixed = self._fixed_rows()
        if self.banner.set_max_rows(max(1, self.size.height - fixed - HINT_ROWS)):
            self.call_after_refresh(self._fit_panels)  # once the banner has its new height
            return
        room, scrolls, cramped = self._panels_fit(fixed)
        panels_fit = room is not None and room >= CRAMPED_PANEL_ROWS
        self._set_cramped(cramped, panels_fit)
        # Without the panels, the hint takes the rows they leave, its words at the bottom
        # (over the footer, where it always is) rather than a blank row under it.
        hint_rows = HINT_ROWS + (room or 0) if cramped and not panels_fit else HINT_ROWS
        self._set_hint_rows(hint_rows)
        if room != self._panels_room:
            self._panels_room = room
            self.panels.styles.max_height = room
        if scrolls != self.more.display:
            self.more.display = scrolls
        self._update_more()

    def _panels_fit(self, fixed: int) -> tuple[int | None, bool, bool]:
        """The rows the panels may take (None: the rest of a tall screen), whether the
        hint's row shows, and whether the screen is cramped (no room for the graph)."""
        if not self.screen.has_class("-short"):
            return None, self.panels.max_scroll_y > 0, False  # the panels take the rest (1fr)
        used = fixed + (self.banner.outer_size.height if self.banner.display else 0)
        graph = MIN_GRAPH_WIDE if self.screen.has_class("-wide") else MIN_GRAPH_NARROW
        room = self.size.height - used - graph
        if room < MIN_PANEL_ROWS:  # cramped: the graph goes, the hint says so
            return self.size.height - used - HINT_ROWS, True, True
        scrolls = self.panels.virtual_size.height > room
        return room - HINT_ROWS if scrolls else room, scrolls, False

    def _fixed_rows(self) -> int:
        """Rows that always show: the header, the problems line, the time line of a
        recording or a replay, the footer."""
        above = (self.header, self.status, self.record_bar)
        return sum(w.outer_size.height for w in above if w.display) + FOOTER_ROWS

    def _set_cramped(self, cramped: bool, panels_fit: bool) -> None:
        """Hide the graph on a cramped screen, and the panels when too few rows are left."""
        self._cramped = cramped
        self.graph.set_display(not cramped)
        panels = not cramped or panels_fit
        if panels != self.panels.display:
            self.panels.display = panels

    def _set_hint_rows(self, rows: int) -> None:
        if rows != self._hint_rows:
            self._hint_rows = rows
            self.more.styles.height = max(1, rows)

    def _update_more_later(self) -> None:
        self.call_after_refresh(self._update_more)

    def _fit_panels_later(self) -> None:
        self.call_after_refresh(self._fit_panels)

    def _update_more(self) -> None:
        """Name the panels whose titles are below the fold, and those hidden."""
        if self._screens_gone() or not self.more.display:
            return
        panels = self.panels
        titles = [(panel, _short_title(panel)) for panel in panels.query(Panel) if panel.display]
        hidden = ["graph"] if self._cramped else []  # its title names its unit, not it
        below: list[str] = []
        scroll: Scroll = ""
        if not panels.display:
            hidden += [title for _panel, title in titles]
        else:
            bottom = panels.scroll_y + panels.scrollable_content_region.height
            below = [title for panel, title in titles if panel.virtual_region.y >= bottom]
            if below or panels.scroll_y < panels.max_scroll_y:
                scroll = "down"
            elif panels.max_scroll_y > 0 or not hidden:
                scroll = "up"  # at the end (the hint shows only when they scroll)
        width = max(1, self.more.content_size.width or self.size.width - 2)
        text = more_text(below, hidden, scroll=scroll, width=width)
        if text != self._more_text:  # an update repaints, even with the same text
            self._more_text = text
            self.more.update(text)

    # ---------------------------------------------------------------- actions

    def action_toggle_processes(self) -> None:
        self.top_toggled = not self.top_toggled
        self._show_top(self.state.host_system())
        self.call_after_refresh(self._fit_panels)
        if self.top_table.display:
            self.call_after_refresh(self.panels.scroll_to_widget, self.top_table, top=True)

    def action_rank_board(self) -> None:
        """Show the ranks of the selected run's job (``j`` again or escape: back)."""
        if isinstance(self.screen, RankBoard):
            self.pop_screen()
            return
        board = RankBoard()
        self.push_screen(board)
        board.show(self.state.job_of())

    def action_scroll_panels(self, pages: int) -> None:
        if pages > 0:
            self.panels.scroll_page_down()
        else:
            self.panels.scroll_page_up()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.header.set_paused(self.paused)
        if not self.paused:
            self.refresh_view()

    def _switched(self) -> None:
        """Show the newly selected run at once, even while paused (the user asked)."""
        self.state.tick(self.clock())
        self._show()

    def action_next_run(self) -> None:
        self.state.select_next()
        self._switched()

    def action_previous_run(self) -> None:
        self.state.select_previous()
        self._switched()

    def action_select_run(self, number: int) -> None:
        if self.state.select(number - 1):
            self._switched()
        else:
            self.notify(f"No run {number}", severity="warning", timeout=2)

    def action_help(self) -> None:
        from gputop_dl.tui.widgets.help import HelpScreen  # Markdown: imported when first needed

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_save_screenshot(self) -> None:
        stamp = datetime.fromtimestamp(self.clock(), tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
        folder = screenshot_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = self.save_screenshot(filename=f"gputop-{stamp}.svg", path=str(folder))
        except OSError as exc:
            self.notify(f"Screenshot not saved: {exc}", severity="error", timeout=6)
            return
        self.notify(f"Screenshot saved: {Path(path).resolve()}", timeout=4)

    def action_toggle_record(self) -> None:
        from gputop_dl.tui.record.live import toggle_recording

        toggle_recording(self)

    async def action_quit(self) -> None:
        self._stop_source()
        self.exit()
