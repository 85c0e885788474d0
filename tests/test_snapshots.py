"""Screenshots of the real app, compared with the accepted ones in ``__snapshots__``.

A live, input-bound run at the three sizes a user tries (80x24, the smallest supported
terminal; 120x36; 200x50), on the demo's node (two cores, no accelerator) and on a
simulated 64-core, 8-GPU node. The clock is frozen and the data deterministic, so the
screens are too. The verdict is a fixed one, in the analyzer's longest wording: these
snapshots test the screen (wrapping, compact panels, the process table),
``tests/test_analyzer*`` the analysis, and a change of wording there should not fail here.
Update after an intended change: ``pytest tests/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fakes_tui import HOST, LONG_INPUT_BOUND, T0, FakeSource, live_run
from textual.pilot import Pilot

from gputop_dl.tui import state as tui_state
from gputop_dl.tui.analyzer import Verdict, Window
from gputop_dl.tui.app import GputopApp

NOW = T0 + 60.0
BIG_NODE: dict[str, int] = {}  # the fakes' default: 64 cores, 8 H100s
DEMO_NODE = {"core_count": 2, "gpu_count": 0}

SnapCompare = Callable[..., bool]


@pytest.fixture(autouse=True)
def fixed_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
        return LONG_INPUT_BOUND

    monkeypatch.setattr(tui_state, "analyze", analyze)


def live_app(node: dict[str, int]) -> tuple[GputopApp, Callable[[Pilot[None]], object]]:
    source = FakeSource()
    app = GputopApp(source, local_host=HOST, clock=lambda: NOW)

    async def feed(pilot: Pilot[None]) -> None:
        source.push(live_run(NOW, **node))  # type: ignore[arg-type]
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        await pilot.pause()  # the panels' height is fitted after the first refresh

    return app, feed


@pytest.mark.parametrize(
    "size", [(80, 24), (120, 36), (200, 50)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("node", [BIG_NODE, DEMO_NODE], ids=["64-core-8-gpu", "2-core"])
def test_live_input_bound(
    snap_compare: SnapCompare, node: dict[str, int], size: tuple[int, int]
) -> None:
    app, feed = live_app(node)
    assert snap_compare(app, terminal_size=size, run_before=feed)


def test_process_table_at_80x24(snap_compare: SnapCompare) -> None:
    app, feed = live_app(BIG_NODE)

    async def feed_and_show_processes(pilot: Pilot[None]) -> None:
        await feed(pilot)  # type: ignore[misc]
        await pilot.press("t")
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=feed_and_show_processes)
