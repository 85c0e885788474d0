"""The rank board (key ``j``) in the real app, fed a 512-rank job by a fake source."""

from __future__ import annotations

from fakes_tui import FakeSource
from msgspec.structs import replace
from textual.pilot import Pilot

from gputop_dl.probe.messages import Hello, Steps, System
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.widgets.banner import Banner
from gputop_dl.tui.widgets.rankboard import COLUMN_KEYS, RankBoard
from tests.test_jobs import T0, hello, host_sample, steps

NOW = T0 + 10.1
STRAGGLER = 300


def job_events(ranks: int, straggler: int | None = STRAGGLER) -> list[SourceEvent]:
    events: list[SourceEvent] = []
    for r in range(ranks):
        h: Hello = hello(r, world=ranks, host=f"node{r // 8:02d}")
        wait = 0.03 if r == straggler else 0.005
        events.append(Received(h, T0 + 1))
        records = tuple(steps(n=60, wait=wait, end=T0 + 10))
        events.append(Received(Steps(h.source_id, records, 0, 0), T0 + 10))
        if r % 8 == 0:
            for back in (2, 1, 0):
                sample = host_sample(h.host, T0 + 10 - back)
                events.append(Received(System(h.source_id, sample), T0 + 10))
    return events


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_app() -> tuple[GputopApp, FakeSource]:
    source = FakeSource()
    return GputopApp(source, local_host="viewer", clock=Clock(NOW), refresh_hz=0), source


async def settle(pilot: Pilot[None], seconds: float = 2.5) -> None:
    """Refresh twice a second for ``seconds``: a new job verdict shows once it held 2 s."""
    app = pilot.app
    assert isinstance(app, GputopApp) and isinstance(app.clock, Clock)
    for _ in range(round(seconds / 0.5)):
        app.clock.now += 0.5
        app.refresh_view()
    await pilot.pause()


async def fill(pilot: Pilot[None], source: FakeSource, events: list[SourceEvent]) -> None:
    """In batches the app's inbox takes whole (it drops steps beyond INBOX_MAX records)."""
    app = pilot.app
    assert isinstance(app, GputopApp)
    for start in range(0, len(events), 500):
        source.push(events[start : start + 500])
        await pilot.pause()
        app.refresh_view()
    await pilot.pause()
    assert app.events_dropped == 0


def board_order(board: RankBoard) -> list[str]:
    table = board.table
    return [
        table.coordinate_to_cell_key((i, 0)).row_key.value or "" for i in range(table.row_count)
    ]


async def test_board_shows_every_rank_and_highlights_the_straggler() -> None:
    app, source = make_app()
    async with app.run_test(size=(160, 40)) as pilot:
        await fill(pilot, source, job_events(512))
        await settle(pilot)
        banner = "\n".join(line.plain for line in app.banner.build(150))
        assert "◆ job torchrun:j1: 512 of 512 ranks on 64 hosts · rank 300 on node37" in banner
        assert "(j: rank board)" in banner
        await pilot.press("j")
        await pilot.pause()
        board = app.screen
        assert isinstance(board, RankBoard)
        assert board.table.row_count == 512
        assert "rank 300 on node37 is" in str(board.verdict_line.render())
        straggler_key = "node37:400"
        assert board._rows[straggler_key].slow
        cells = board.table.get_row(straggler_key)
        slow_style = board.table.get_component_rich_style("rankboard--slow")
        assert cells[0].style == slow_style and cells[0].plain == "300 (0)"
        other = board.table.get_row("node00:100")
        assert other[0].style != slow_style
        # Sorted by rank first; "o" cycles to host, step, samples/s, data wait, own time
        assert board_order(board)[:3] == ["node00:100", "node00:101", "node00:102"]
        for _ in range(COLUMN_KEYS.index("wait")):
            await pilot.press("o")
        await pilot.press("r")
        await pilot.pause()
        assert board.sort_column == "wait" and board.sort_reverse
        assert board_order(board)[0] == straggler_key
        assert "data wait ▼" in str(board.table.columns[board.table.ordered_columns[4].key].label)
        await pilot.press("j")
        await pilot.pause()
        assert not isinstance(app.screen, RankBoard)


async def test_a_refresh_updates_cells_in_place() -> None:
    app, source = make_app()
    async with app.run_test(size=(160, 40)) as pilot:
        await fill(pilot, source, job_events(16, straggler=None))
        await pilot.press("j")
        await pilot.pause()
        board = app.screen
        assert isinstance(board, RankBoard)
        assert board.table.row_count == 16
        assert not any(row.slow for row in board._rows.values())
        before = board.table.get_row("node01:109")
        # six seconds later rank 9 waits for data, and a process of another job arrives
        events: list[SourceEvent] = []
        for r in range(16):
            h = hello(r, world=16, host=f"node{r // 8:02d}")
            later = [
                replace(record, index=record.index + 60)
                for record in steps(n=60, wait=0.04 if r == 9 else 0.005, end=T0 + 16)
            ]
            events.append(Received(Steps(h.source_id, tuple(later), 1, 0), T0 + 16))
        events.append(Received(hello(0, job="torchrun:other", world=2, host="node99"), T0 + 16))
        assert isinstance(app.clock, Clock)
        app.clock.now = T0 + 16.1
        await fill(pilot, source, events)
        await settle(pilot)
        assert board.table.row_count == 16  # the other job's rank is not on this board
        after = board.table.get_row("node01:109")
        assert after[COLUMN_KEYS.index("wait")].plain != before[COLUMN_KEYS.index("wait")].plain
        assert board._rows["node01:109"].slow


async def test_banner_is_quiet_for_a_run_outside_a_job() -> None:
    app, source = make_app()
    async with app.run_test(size=(160, 40)) as pilot:
        await fill(pilot, source, job_events(1, straggler=None))
        assert app.banner.job_text is None  # a job of one rank: nothing to compare
        await pilot.press("j")
        await pilot.pause()
        board = app.screen
        assert isinstance(board, RankBoard)
        assert board.table.row_count == 1
        assert isinstance(app.query_one(Banner), Banner)
