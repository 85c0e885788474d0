"""Three viewer defects a new user met, each tested as the user met it:

- on a small terminal (a 40x10 tmux pane) the verdict, the run and a line saying what is
  hidden and how to see it (before: the banner alone, the header scrolled away, nothing
  said what was below);
- a replayed recording says "replay" (its speed, paused, ended), never "● live";
- when the run shown ends and a new run starts under another name, the viewer shows the
  new run, unless the user picked the shown one by hand (then a notice names the new one).

The app is fed by a FakeSource, the clock frozen, as in tests/test_app.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from fakes_tui import (
    HOST,
    LONG_INPUT_BOUND,
    SOURCE_ID,
    T0,
    FakeSource,
    bye,
    hello,
    live_run,
    received,
    step_records,
    steps_events,
)
from rich.text import Text
from textual.pilot import Pilot

from gputop_dl.tui import state as tui_state
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.record.bar import time_line
from gputop_dl.tui.record.reader import load_timeline
from gputop_dl.tui.record.replay import ReplayClock
from gputop_dl.tui.record.replay_app import ReplayApp
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.state.model import NewRuns
from gputop_dl.tui.state.roster import Heard, successors
from gputop_dl.tui.widgets.banner import fit_rows
from gputop_dl.tui.widgets.base import Panel
from gputop_dl.tui.widgets.fold import Scroll, more_text
from gputop_dl.tui.widgets.header import ReplayMark, new_runs_text, replay_text
from tests.recordings import fault_run, write_events
from tests.test_app import FrozenClock, make_app, screen_cells

NOW = T0 + 60.0
X = "\u00d7"  # the times sign: "replay x2" on screen, with this sign for the x


async def settle(pilot: Pilot[None]) -> None:
    """Let the refresh, the fitting of the banner and panels and the hint go through."""
    for _ in range(6):
        await pilot.pause()


async def feed(pilot: Pilot[None], source: FakeSource, events: Iterable[SourceEvent]) -> None:
    """Push a batch and let the refresh and the fitting go through (test_app's feed only
    pauses once)."""
    source.push(list(events))
    await pilot.pause()
    app = pilot.app
    assert isinstance(app, GputopApp)
    app.refresh_view()
    await settle(pilot)


def screen_rows(app: GputopApp) -> list[str]:
    """The terminal's rows as plain text (what the user reads)."""
    return ["".join(ch for ch, _ in row) for row in screen_cells(app)]


def flat(text: str) -> str:
    """Words only: wrapped lines, indents and the banner's left bar fold away."""
    return " ".join(text.replace("▌", " ").split())


@pytest.fixture
def long_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The analyzer's longest wording, as in the snapshots."""
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: LONG_INPUT_BOUND)


# =============================================================== 1. small terminals

MORE_TEXTS = [
    # Nothing hidden: the scroll hint it always was (80x24 and up are unchanged).
    (["Disk", "Network"], [], "down", 78, "↓ Disk, Network below: PgDn or ↓ to scroll"),
    ([], [], "down", 78, "↓ more below: PgDn or ↓ to scroll"),
    ([], [], "up", 78, "↑ more above: PgUp or ↑ to scroll"),
    # 40x10: nothing fits under the verdict: counted, and how to see them.
    (
        [],
        ["graph", "Accelerators", f"CPU {X}2", "Memory", "Disk", "Network"],
        "",
        38,
        "↓ 6 panels hidden: enlarge terminal",
    ),
    # ... the same with room for the names
    ([], ["graph", f"CPU {X}2"], "", 78, f"↓ graph, CPU {X}2 hidden: enlarge the terminal"),
    # 60x15: the panels scroll, the graph has no row
    (
        [f"CPU {X}2", "Memory", "Disk"],
        ["graph"],
        "down",
        58,
        "↓ 3 panels below: PgDn · graph hidden: enlarge terminal",
    ),
    (
        ["Memory", "Disk", "Network"],
        ["graph"],
        "down",
        78,
        "↓ Memory, Disk, Network below: PgDn · graph hidden: enlarge the terminal",
    ),
    # the last panel's own rows below (the process table after `t`), then its end
    ([], ["graph"], "down", 58, "↓ more below: PgDn · graph hidden: enlarge the terminal"),
    ([], ["graph"], "up", 58, "↑ more above: PgUp · graph hidden: enlarge the terminal"),
    # the panels fit in the rows left: only the graph is missing
    ([], ["graph"], "", 58, "↓ graph hidden: enlarge the terminal"),
    # Narrower than any form: the shortest (the widget cuts it)
    ([], ["graph", "CPU"], "", 10, "↓ 2 hidden: enlarge terminal"),
]


@pytest.mark.parametrize(("below", "hidden", "scroll", "width", "expected"), MORE_TEXTS)
def test_the_hint_names_what_is_below_and_hidden_in_the_width(
    below: list[str], hidden: list[str], scroll: Scroll, width: int, expected: str
) -> None:
    text = more_text(below, hidden, scroll=scroll, width=width)
    assert text == expected
    assert len(text) <= width or width == 10


def _lines(*texts: str) -> list[Text]:
    return [Text(t) for t in texts]


FIT_ROWS = [
    # (groups as (priority, lines), rows) -> lines shown
    ([(0, ["h1", "h2"]), (2, ["a1", "a2"]), (3, ["g1"])], None, ["h1", "h2", "a1", "a2", "g1"]),
    ([(0, ["h1", "h2"]), (2, ["a1", "a2"]), (3, ["g1"])], 5, ["h1", "h2", "a1", "a2", "g1"]),
    # the headroom goes first; the last line says more was there
    ([(0, ["h1", "h2"]), (2, ["a1", "a2"]), (3, ["g1"])], 4, ["h1", "h2", "a1", "a2…"]),
    # the advice is cut rather than left out for something of lower priority
    ([(0, ["h1", "h2"]), (2, ["a1", "a2"]), (3, ["g1"])], 3, ["h1", "h2", "a1…"]),
    # screen order kept, priority decides: the second advice (4) goes before the gain (3)
    ([(0, ["h"]), (2, ["a"]), (4, ["b"]), (3, ["g"])], 3, ["h", "a", "g…"]),
    # never less than the headline's first line
    ([(0, ["h1", "h2"]), (2, ["a"])], 0, ["h1…"]),
]


@pytest.mark.parametrize(("groups", "rows", "expected"), FIT_ROWS)
def test_a_capped_banner_keeps_the_verdict_first(
    groups: list[tuple[int, list[str]]], rows: int | None, expected: list[str]
) -> None:
    built = [(priority, _lines(*lines)) for priority, lines in groups]
    assert [line.plain for line in fit_rows(built, rows, width=40)] == expected


SMALL = [(40, 10), (60, 15), (80, 14), (120, 12)]


@pytest.mark.usefixtures("long_verdict")
@pytest.mark.parametrize("size", SMALL, ids=[f"{w}x{h}" for w, h in SMALL])
async def test_a_small_terminal_shows_the_run_the_verdict_and_what_is_hidden(
    size: tuple[int, int],
) -> None:
    # Before: at 40x10 the rows showed the banner only (the header scrolled off, no
    # line under it); at 60x15 the panels were pushed off the screen, unnamed.
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot, source, live_run(NOW))
        rows = screen_rows(app)
        assert len(rows) == size[1]
        assert app.screen.max_scroll_y == 0  # everything placed fits: nothing scrolled away
        assert "● live" in rows[0] and "resnet50" in rows[0]  # the run, on the first row
        # the verdict right under it
        assert flat(LONG_INPUT_BOUND.headline)[:30] in flat(" ".join(rows[1:3]))
        hint = rows[-2].strip()  # over the footer
        assert hint.startswith(("↓", "↑")) and "hidden: enlarge" in hint
        assert not app.graph.display  # no room for its smallest form: hidden, and said


@pytest.mark.usefixtures("long_verdict")
async def test_at_40x10_the_advice_follows_the_verdict_and_the_panels_are_counted() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(40, 10)) as pilot:
        await feed(pilot, source, live_run(NOW))
        rows = screen_rows(app)
        shown = flat("\n".join(rows))
        assert flat(LONG_INPUT_BOUND.headline) in shown  # the whole headline
        assert flat(LONG_INPUT_BOUND.advice[0])[:30] in shown  # the first advice begins
        assert rows[-2].strip() == "↓ 6 panels hidden: enlarge terminal"
        assert not app.panels.display
        assert rows[-1].lstrip().startswith("tab")  # the footer stays


@pytest.mark.usefixtures("long_verdict")
async def test_on_a_cramped_screen_the_panels_still_scroll_under_the_verdict() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(80, 14)) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert app.panels.display and not app.graph.display
        hint = screen_rows(app)[-2].strip()
        assert hint.startswith("↓ ") and "below: PgDn" in hint
        await pilot.press("pagedown")
        await settle(pilot)
        assert app.panels.scroll_y > 0
        assert "hidden: enlarge" in screen_rows(app)[-2]


@pytest.mark.usefixtures("long_verdict")
async def test_the_process_table_on_a_cramped_screen_says_its_rows_go_on() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(60, 15)) as pilot:
        await feed(pilot, source, live_run(NOW))
        await pilot.press("t")  # scrolled to the table, whose rows go on below
        await settle(pilot)
        assert app.top_table.display
        assert app.panels.scroll_y < app.panels.max_scroll_y
        hint = screen_rows(app)[-2].strip()
        assert hint.startswith("↓ more below: PgDn") and "graph hidden" in hint
        app.panels.scroll_end(animate=False)
        await settle(pilot)
        assert screen_rows(app)[-2].strip().startswith("↑ more above: PgUp")


@pytest.mark.usefixtures("long_verdict")
async def test_resizing_to_a_small_pane_and_back_gives_the_full_screen_again() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, live_run(NOW))
        before = screen_rows(app)
        for size in [(40, 10), (60, 15), (200, 50), (40, 10), (80, 24)]:
            await pilot.resize_terminal(*size)
            await settle(pilot)
            app.refresh_view()
            await settle(pilot)
            rows = screen_rows(app)
            assert "● live" in rows[0], size
            assert app.screen.max_scroll_y == 0, size
        assert app.graph.display and app.panels.display and not app.more.display
        assert screen_rows(app) == before


class TappedSource(FakeSource):
    """A source that can be recorded (``r``), as the live ZmqSource."""

    raw_tap = None


@pytest.mark.usefixtures("long_verdict")
async def test_recording_at_80x24_counts_its_row_and_names_what_is_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the "● REC" row was not counted: the screen overflowed by a row, the
    # Network panel went out of sight, and nothing said so.
    monkeypatch.setenv("GPUTOP_RECORD_DIR", str(tmp_path))
    source = TappedSource()
    app = GputopApp(source, local_host=HOST, clock=FrozenClock(NOW))
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert not app.more.display  # all fits, as the snapshot of 80x24 shows
        await pilot.press("r")
        app.refresh_view()
        await settle(pilot)
        assert app.record_bar.display and app.screen.max_scroll_y == 0
        rows = screen_rows(app)
        assert "● REC" in rows[1]
        assert rows[-2].strip() == "↓ Network below: PgDn or ↓ to scroll"
        await pilot.press("r")  # stopped: the row goes, the panels have it back
        app.refresh_view()
        await settle(pilot)
        assert not app.record_bar.display and not app.more.display


@pytest.mark.usefixtures("long_verdict")
async def test_a_replay_at_80x24_counts_its_time_line_and_names_what_is_below(
    tmp_path: Path,
) -> None:
    # The time line's row counts as the REC row does (above): whatever the panels
    # cannot show is named, nothing is pushed out of reach.
    app = replay_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await replayed(pilot, app)
        assert app.screen.max_scroll_y == 0  # nothing out of reach below the footer
        assert app.record_bar.display and app.graph.display
        rows = screen_rows(app)
        hint = rows[-2] if app.more.display else ""
        for panel in app.panels.query(Panel):
            title = str(panel.border_title or "").split(" ·")[0]
            if panel.display and title:  # on screen, or named as below the fold
                assert any(title in row for row in rows[:-2]) or title in hint, title


# ====================================================================== 2. replay


async def replayed(pilot: Pilot[None], app: ReplayApp) -> None:
    """Wait until the replay source handed over what the clock reached, then redraw."""
    for _ in range(200):
        if app.replayer.applied:
            break
        await pilot.pause(0.02)
    app.refresh_view()
    await settle(pilot)


def replay_app(tmp_path: Path, clock: ReplayClock | None = None) -> ReplayApp:
    path = tmp_path / "fault.gtrec"
    write_events(path, fault_run())
    timeline = load_timeline(path)
    if clock is None:
        clock = ReplayClock(timeline.start, timeline.end, monotonic=Wall())
        clock.seek(timeline.start + 30.0)
    return ReplayApp(timeline, refresh_hz=0, clock=clock)


class Wall:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("mark", "expected"),
    [
        (ReplayMark(1, False, False), f"▶ replay {X}1"),
        (ReplayMark(60, False, False), f"▶ replay {X}60"),
        (ReplayMark(5, True, False), "⏸ replay paused"),
        (ReplayMark(5, True, True), "■ replay ended"),
        (ReplayMark(5, False, True), "■ replay ended"),
    ],
)
def test_the_replay_words(mark: ReplayMark, expected: str) -> None:
    assert replay_text(mark) == expected


def test_the_time_line_at_the_end_of_the_recording_is_not_playing() -> None:
    assert time_line(1060.0, 1000.0, 1060.0, 5, False, 80).plain.startswith(f"■ {X}5")
    assert time_line(1030.0, 1000.0, 1060.0, 5, False, 80).plain.startswith(f"▶ {X}5")
    assert time_line(1060.0, 1000.0, 1060.0, 5, True, 80).plain.startswith(f"⏸ {X}5")


async def test_a_replay_says_replay_never_live(tmp_path: Path) -> None:
    # Before: "● live" in the header of a recording a week old.
    wall = Wall()
    path = tmp_path / "fault.gtrec"
    write_events(path, fault_run())
    timeline = load_timeline(path)
    clock = ReplayClock(timeline.start, timeline.end, monotonic=wall)
    clock.seek(timeline.start + 30.0)
    app = ReplayApp(timeline, refresh_hz=0, clock=clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await replayed(pilot, app)

        def header() -> str:
            return screen_rows(app)[0]

        assert app.state.selected is not None
        assert app.state.selected.connection.state == "live"  # as recorded, that moment
        assert f"▶ replay {X}1" in header() and "resnet50" in header()
        assert "live" not in header()
        await pilot.press("plus")
        await settle(pilot)
        assert f"▶ replay {X}2" in header()
        await pilot.press("space")
        await settle(pilot)
        assert clock.paused and "⏸ replay paused" in header()
        assert "⏸ PAUSED" not in header()  # one pause, the replay's
        await pilot.press("p")  # the live viewer's pause key plays and pauses it too
        await settle(pilot)
        assert not clock.paused and f"▶ replay {X}2" in header()
        wall.now += 1000.0  # past the end of the recording
        app.refresh_view()
        await settle(pilot)
        assert "■ replay ended" in header() and "live" not in header()
        await pilot.press("p")
        await settle(pilot)
        assert clock.paused and "replay" in header() and "live" not in header()


async def test_a_small_replay_still_says_replay(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(40, 10)) as pilot:
        await replayed(pilot, app)
        rows = screen_rows(app)
        assert rows[0].strip().startswith(f"▶ replay {X}1")
        assert rows[1].strip().startswith(f"▶ {X}1")  # the time line: where in the recording
        assert "hidden: enlarge" in rows[-2]
        assert app.screen.max_scroll_y == 0


# ============================================================ 3. following new runs


def heard(
    key: str, first: float, last: float, *, ended: bool = False, rank: int | None = None
) -> Heard:
    return Heard(key, rank, ended, first, last)


SUCCESSORS = [
    # (shown, runs in switcher order) -> successors, best first
    pytest.param(heard("a", 0, 50), [heard("b", 60, 70)], [], id="shown-still-running"),
    pytest.param(heard("a", 0, 50, ended=True), [heard("b", 60, 70)], ["b"], id="restarted"),
    pytest.param(
        heard("a", 0, 50, ended=True), [heard("b", 10, 70)], [], id="was-there-while-it-ran"
    ),
    pytest.param(
        heard("a", 0, 50, ended=True), [heard("b", 60, 70, ended=True)], [], id="new-one-ended"
    ),
    pytest.param(
        heard("a", 0, 50, ended=True),
        [heard("c", 60, 70, rank=1), heard("b", 61, 70, rank=0), heard("d", 62, 70, rank=2)],
        ["b", "c", "d"],
        id="a-job-rank-0-first",
    ),
    pytest.param(
        heard("a", 0, 50, ended=True),
        [heard("x", 20, 70), heard("b", 60, 70), heard("c", 60, 70)],
        ["b", "c"],
        id="two-at-once-switcher-order",
    ),
    # a remote run is lost 6 s after its last message: a restart in between still counts
    pytest.param(heard("a", 0, 50, ended=True), [heard("b", 52, 70)], ["b"], id="lost-then"),
]


@pytest.mark.parametrize(("shown", "runs", "expected"), SUCCESSORS)
def test_which_runs_take_over_from_the_one_shown(
    shown: Heard, runs: list[Heard], expected: list[str]
) -> None:
    assert successors(shown, [shown, *runs]) == expected


@pytest.mark.parametrize(
    ("news", "expected"),
    [
        (
            NewRuns((1, "train-a"), ((2, "train-b"),), True),
            "train-a ended: showing train-b (press 1 for train-a)",
        ),
        (
            NewRuns((1, "train-a"), ((2, "b · r0"), (3, "b · r1")), True),
            "train-a ended: showing b · r0, the first of 2 new runs (press 1 for train-a)",
        ),
        (NewRuns((1, "train-a"), ((2, "train-b"),), False), "train-b started: press 2 to show it"),
        (
            NewRuns((1, "a"), ((12, "b"), (13, "c")), False),
            "2 runs started (b, …): tab to it for b",
        ),
    ],
)
def test_the_notice_of_new_runs(news: NewRuns, expected: str) -> None:
    assert new_runs_text(news) == expected


B_ID = f"{HOST}:5151"
C_ID = f"{HOST}:5252"


def new_run(
    name: str, source_id: str, start: float, end: float, rank: int | None = 0
) -> list[SourceEvent]:
    """A run first heard at ``start`` that steps until ``end``."""
    pid = int(source_id.rpartition(":")[2])
    events: list[SourceEvent] = [
        received(hello(source_id, name=name, rank=rank, started=start, pid=pid), start)
    ]
    events += steps_events(step_records(start, end - start), source_id)
    return events


def header_row(app: GputopApp) -> str:
    return screen_rows(app)[0]


def notices(app: GputopApp) -> list[str]:
    return [notice.message for notice in app._notifications]


async def test_a_new_run_after_the_shown_one_ended_is_shown_by_itself() -> None:
    # Before: the ended run stayed on screen until it left the switcher a minute later.
    app, source, clock = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, [*live_run(NOW - 10), received(bye(), NOW - 9)])
        assert "■ exited" in header_row(app)
        clock.now = NOW
        await feed(pilot, source, new_run("train-b", B_ID, NOW - 5, NOW - 0.1))
        run = app.state.selected
        assert run is not None and run.name == "train-b"
        assert "● live" in header_row(app) and "train-b" in header_row(app)
        assert notices(app) == ["resnet50 ended: showing train-b (press 1 for resnet50)"]
        # told once; the user goes back to the ended run: it stays (picked by hand)
        await pilot.press("1")
        app.refresh_view()
        await settle(pilot)
        assert app.state.selected is not None and app.state.selected.name == "resnet50"
        assert len(notices(app)) == 1


async def test_a_run_picked_by_hand_stays_and_the_new_run_is_announced() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, live_run(NOW - 10))
        await pilot.press("1")  # the user's choice
        await feed(pilot, source, [received(bye(), NOW - 9)])
        clock.now = NOW
        await feed(pilot, source, new_run("train-b", B_ID, NOW - 5, NOW - 0.1))
        assert app.state.selected is not None and app.state.selected.name == "resnet50"
        assert "■ exited" in header_row(app)
        assert "2 train-b" in screen_rows(app)[1]  # in the switcher
        assert notices(app) == ["train-b started: press 2 to show it"]
        app.refresh_view()
        await settle(pilot)
        assert len(notices(app)) == 1  # once
        await pilot.press("2")
        assert app.state.selected is not None and app.state.selected.name == "train-b"


async def test_a_run_that_was_already_there_does_not_take_over() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        events = live_run(NOW - 10)
        events += live_run(NOW - 10, source_id=B_ID, name="other")
        await feed(pilot, source, events)
        assert app.state.selected is not None and app.state.selected.name == "other"
        # "other" is first by name; end it: resnet50 ran beside it, the user saw both
        await feed(pilot, source, [received(bye(B_ID), NOW - 9)])
        assert app.state.selected is not None and app.state.selected.name == "other"
        assert not notices(app)


async def test_two_runs_at_once_the_first_is_shown_the_notice_counts_them() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, [*live_run(NOW - 10), received(bye(), NOW - 9)])
        clock.now = NOW
        events = new_run("job-b", C_ID, NOW - 5, NOW - 0.1, rank=1)
        events += new_run("job-b", B_ID, NOW - 4.9, NOW - 0.1, rank=0)
        events.sort(key=lambda e: e.received if isinstance(e, Received) else 0.0)
        await feed(pilot, source, events)
        run = app.state.selected
        assert run is not None and (run.name, run.rank) == ("job-b", 0)
        (notice,) = notices(app)
        assert notice.startswith("resnet50 ended: showing job-b") and "first of 2" in notice


async def test_a_run_back_under_the_same_name_keeps_its_place_without_a_notice() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, [*live_run(NOW - 10), received(bye(), NOW - 9)])
        clock.now = NOW
        await feed(pilot, source, new_run("resnet50", B_ID, NOW - 5, NOW - 0.1))
        run = app.state.selected
        assert run is not None and run.key == B_ID and run.connection.state == "live"
        assert len(app.state.runs) == 1  # it took the ended one's slot
        assert not notices(app)


def test_the_run_shown_is_held_when_a_new_run_takes_a_lower_slot() -> None:
    # Before: a new run given slot 0 (freed by a run that left) took the screen from a
    # run still running, since "not picked" meant "the first slot".
    fresh = ViewerState(HOST)
    fresh.apply_all(live_run(NOW, source_id=B_ID, name="old"))
    fresh.apply_all(live_run(NOW, name="resnet50"))
    fresh.tick(NOW)
    assert fresh.selected is not None and fresh.selected.name == "old"
    fresh.apply(received(bye(B_ID), NOW + 1))
    fresh.tick(NOW + 1)
    assert fresh.follow_new_runs() is None  # resnet50 ran beside it: no news
    fresh.tick(NOW + 62)  # "old" left: its slot 0 is free, resnet50 shows
    assert fresh.follow_new_runs() is None
    assert fresh.selected is not None and fresh.selected.name == "resnet50"
    fresh.apply_all(new_run("aaa", C_ID, NOW + 63, NOW + 64))
    fresh.tick(NOW + 64.5)
    assert [r.name for r in fresh.runs] == ["aaa", "resnet50"]  # slot 0: the new one
    assert fresh.follow_new_runs() is None
    assert fresh.selected is not None and fresh.selected.name == "resnet50"  # not stolen


async def test_paused_the_screen_stays_and_follows_when_resumed() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot, source, [*live_run(NOW - 10), received(bye(), NOW - 9)])
        await pilot.press("p")
        clock.now = NOW
        await feed(pilot, source, new_run("train-b", B_ID, NOW - 5, NOW - 0.1))
        assert app.state.selected is not None and app.state.selected.name == "resnet50"
        assert not notices(app)
        await pilot.press("p")
        await settle(pilot)
        assert app.state.selected is not None and app.state.selected.name == "train-b"
        assert len(notices(app)) == 1


def test_a_run_refused_as_incompatible_is_followed_too() -> None:
    from fakes_tui import incompatible

    state = ViewerState(HOST)
    state.apply(incompatible(NOW - 10, hint=SOURCE_ID))
    state.tick(NOW - 9)
    assert state.selected is not None and state.selected.connection.state == "incompatible"
    state.apply_all(new_run("train-b", B_ID, NOW - 5, NOW - 0.1))
    state.tick(NOW)
    news = state.follow_new_runs()
    assert news is not None and news.switched
    assert state.selected is not None and state.selected.name == "train-b"


async def test_with_no_run_and_no_host_sampled_the_banner_says_so() -> None:
    """`gputop --no-local` with no probe: nothing samples a node. The banner read "No
    training run attached: showing." (a new user's audit, 2026-12-07)."""
    app = GputopApp(FakeSource(), local_host=HOST, clock=FrozenClock(NOW))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        shown = flat("\n".join(screen_rows(app)))
        assert "No training run attached, and no node sampled yet." in shown, shown
        assert "showing." not in shown
