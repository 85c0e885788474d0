"""Screenshots of the real app, compared with the accepted ones in ``__snapshots__``.

A live, input-bound run with 8 fake GPUs at 80x24 (the smallest supported terminal) and
200x50. The clock is frozen and the data deterministic, so the screens are too. The
verdict is a fixed one: these snapshots test the screen, ``tests/test_analyzer*`` the
analysis, and a change of wording there should not fail here.
Update after an intended change: ``pytest tests/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fakes_tui import HOST, T0, FakeSource, live_run
from textual.pilot import Pilot

from gputop_dl.tui import state as tui_state
from gputop_dl.tui.analyzer import Verdict, Window
from gputop_dl.tui.app import GputopApp

NOW = T0 + 60.0

SnapCompare = Callable[..., bool]

INPUT_BOUND = Verdict(
    kind="input-bound",
    severity="warning",
    confidence=0.85,
    headline="Input-bound: steps wait for data 70 % of the time; all 4 workers are CPU-bound",
    cause="few-workers",
    evidence=(
        "data wait 70 % of step time (223 ms of 319 ms per step)",
        "4 of 4 DataLoader workers at ≥ 90 % of a core; 54.9 cores idle",
    ),
    advice=("raise DataLoader num_workers from 4 to 8",),
    headroom="without the data wait: ≈ 261 samples/s, +233 %",
)


@pytest.fixture(autouse=True)
def fixed_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
        return INPUT_BOUND

    monkeypatch.setattr(tui_state, "analyze", analyze)


def live_app() -> tuple[GputopApp, Callable[[Pilot[None]], object]]:
    source = FakeSource()
    app = GputopApp(source, local_host=HOST, clock=lambda: NOW)

    async def feed(pilot: Pilot[None]) -> None:
        source.push(live_run(NOW))
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()

    return app, feed


def test_live_input_bound_80x24(snap_compare: SnapCompare) -> None:
    app, feed = live_app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=feed)


def test_live_input_bound_200x50(snap_compare: SnapCompare) -> None:
    app, feed = live_app()
    assert snap_compare(app, terminal_size=(200, 50), run_before=feed)
