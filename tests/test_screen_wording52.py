"""Three readability defects of the screen an audit found, each tested as a user meets it:

- the DataLoader workers' line read "2 workers, 0 at ≥90 % of a core (1 1 %)": now the
  count in words and each worker's share, "2 workers, none saturated (1%, 1%)";
- a verdict whose headline says how long it has lasted showed a second duration beside
  it: "Outside the training loop for 30 s: evaluation   for 28s";
- while the demo made its data, and in any script's first seconds, the banner asked "Not
  instrumented yet?" of a script that is: its probe starts at its first probe.watch(),
  after its imports. The demo's probe now starts before the data is made, and the hint
  waits (never for an endpoint a probe registered itself).

The app is fed by a FakeSource, the clock frozen, as in tests/test_app.py; the demo test
runs the real demo training and reads its messages with the protocol's own reader.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fakes_tui import (
    PID,
    SOURCE_ID,
    T0,
    WORKER_PIDS,
    agent_only,
    connecting,
    hello,
    live_run,
    received,
    system_sample,
    systems_events,
)
from textual.pilot import Pilot

from gputop_dl.probe.messages import System
from gputop_dl.probe.samples import ProcessSample, TrainingProcesses
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.state import INSTRUMENT_HINT
from gputop_dl.tui.widgets.banner import HINT_AFTER_S, Banner
from gputop_dl.tui.widgets.cpu import CpuPanel, saturation_words
from gputop_dl.tui.widgets.help import HELP_TEXT
from tests.test_app import WIDE, FrozenClock, feed, make_app, screen_cells, text
from tests.wire_reader import WireReader

NOW = T0 + 60.0
TRAIN = (sys.executable, "-m", "gputop_dl.tui.demo.train")


def screen(app: GputopApp) -> str:
    """The terminal's rows as plain text (what the user reads)."""
    return "\n".join("".join(ch for ch, _ in row) for row in screen_cells(app))


# ---------------------------------------------------------------- the workers' line


@pytest.mark.parametrize(
    ("count", "saturated", "words"),
    [
        (2, 0, "none saturated"),
        (4, 1, "1 saturated"),
        (4, 3, "3 saturated"),
        (4, 4, "all saturated"),
        (2, 2, "all saturated"),
        (1, 0, "not saturated"),
        (1, 1, "saturated"),
    ],
)
def test_saturation_in_words(count: int, saturated: int, words: str) -> None:
    assert saturation_words(count, saturated) == words


def with_workers(shares: tuple[float | None, ...]) -> TrainingProcesses:
    """The main process at 87 % and a worker per share (None: its first sample)."""
    procs = [ProcessSample(PID, "main", "python", 87.0, 10**9)]
    procs += [
        ProcessSample(WORKER_PIDS[0] + i, "worker", "pt_data_worker", share, 10**9)
        for i, share in enumerate(shares)
    ]
    saturated = sum(1 for share in shares if share is not None and share >= 90.0)  # the probe's
    return TrainingProcesses(tuple(procs), saturated, len(shares))


@pytest.mark.parametrize(
    ("shares", "line"),
    [
        # the audit's: two idle workers read "2 workers, 0 at ≥90 % of a core (1 1 %)"
        ((1.0, 1.0), "DataLoader: 2 workers, none saturated (1%, 1%) · main process 87%"),
        (
            (98.0, 97.0, 96.0, 95.0),
            "DataLoader: 4 workers, all saturated (98%, 97%, 96%, 95%) · main process 87%",
        ),
        ((12.0, 97.0, 40.0), "DataLoader: 3 workers, 1 saturated (97%, 40%, 12%)"),
        ((5.0,), "DataLoader: 1 worker, not saturated (5%) · main process 87%"),
        # new workers (each pass without persistent_workers): no share measured yet; it
        # read "0 at ≥90 % of a core (n/a n/a %)"
        ((None, None), "DataLoader: 2 workers, CPU not measured yet · main process 87%"),
    ],
)
async def test_the_workers_line_reads_at_a_glance(
    shares: tuple[float | None, ...], line: str
) -> None:
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        sample = replace(system_sample(NOW - 0.3), processes=with_workers(shares))
        await feed(
            pilot, source, [*live_run(NOW - 0.5), received(System(SOURCE_ID, sample), NOW - 0.2)]
        )
        shown = screen(app)
        assert line in shown, text(app.query_one(CpuPanel))
        assert " at ≥90 % of a core" not in shown


async def workers_line(shares: tuple[float | None, ...]) -> str:
    """The line the app's CPU panel writes for these workers, on a line long enough."""
    app, _, _ = make_app()
    async with app.run_test(size=WIDE):
        panel = app.query_one(CpuPanel)
        panel.show(None, with_workers(shares), None)
        return panel.build(400)[0].plain


async def test_more_workers_than_listed_are_counted() -> None:
    line = await workers_line(tuple(50.0 + i for i in range(18)))
    listed = ", ".join(f"{67 - i}%" for i in range(16))
    assert line.startswith(f"DataLoader: 18 workers, none saturated ({listed} +2 more)"), line


async def test_the_help_shows_the_workers_line_as_the_panel_writes_it() -> None:
    for shares in ((98.0, 97.0, 96.0, 95.0), (5.0, 3.0)):
        line = await workers_line(shares)
        said = line.removeprefix("DataLoader: ").partition(" · ")[0]
        assert f"`{said}`" in HELP_TEXT, said


# ---------------------------------------------------------------- one duration


DURATIONS = re.compile(r"\bfor \d")


def headline_row(app: GputopApp) -> str:
    return next(row for row in screen(app).splitlines() if row.startswith("▌"))


async def test_a_verdict_that_says_how_long_shows_no_second_duration() -> None:
    """The run leaves its loop for an evaluation: the headline counts the time outside,
    and the banner's "for 28s" (the time the verdict has been shown) is gone; a verdict
    whose headline gives no duration keeps it."""
    app, source, clock = make_app(NOW - 30)
    left = replace(
        hello(started=NOW - 90),
        loop="outside",
        loop_since=NOW - 30,
        loop_exit="marked:evaluation",
        step_count=200,
    )
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW - 30, duration_s=60))
        clock.now = NOW - 25
        await feed(pilot, source, systems_events(NOW - 29.9, NOW - 25.5))
        assert re.search(r"Input-bound .* for 5\.0s · confidence", headline_row(app))
        await feed(pilot, source, [received(left, NOW - 25.2)])
        for now in (NOW - 20, NOW):
            clock.now = now
            await feed(pilot, source, systems_events(now - 4.9, now - 0.5))
        row = headline_row(app)
        assert "Outside the training loop for 30 s: evaluation" in row, row
        assert len(DURATIONS.findall(row)) == 1, row


async def test_a_stall_shows_one_duration() -> None:
    app, source, clock = make_app(NOW - 30)
    in_loop = replace(hello(started=NOW - 90), loop="in-loop", loop_since=NOW - 90, step_count=200)
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW - 30, duration_s=60))
        for now in range(int(NOW) - 28, int(NOW) + 1, 2):
            clock.now = float(now)
            await feed(
                pilot, source, [*systems_events(now - 1.9, now - 0.5), received(in_loop, now - 0.4)]
            )
        row = headline_row(app)
        assert "Stalled: no step for 30 s" in row, row
        assert len(DURATIONS.findall(row)) == 1, row


# ---------------------------------------------------------------- "Not instrumented yet?"


async def after(pilot: Pilot[None], clock: FrozenClock, seconds: float) -> None:
    clock.now += seconds
    app = pilot.app
    assert isinstance(app, GputopApp)
    app.refresh_view()
    await pilot.pause()


async def test_an_endpoint_silent_so_far_gets_the_hint_only_after_a_while() -> None:
    """`gputop ipc://...` (the demo's own viewer): nothing received is also a script still
    importing torch; the hint comes once that would be long over."""
    app, source, clock = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, [connecting(name=None)])
        banner = text(app.query_one(Banner))
        assert "nothing received yet" in banner
        assert INSTRUMENT_HINT not in banner and "Not instrumented" not in banner
        await after(pilot, clock, HINT_AFTER_S - 1)
        assert INSTRUMENT_HINT not in text(app.query_one(Banner))
        await after(pilot, clock, 1)
        banner = text(app.query_one(Banner))
        assert "nothing received yet" in banner
        assert f"Not instrumented yet? {INSTRUMENT_HINT}" in banner


async def test_an_endpoint_a_probe_registered_never_gets_the_hint() -> None:
    """Its discovery record names it: the probe is there, only silent so far."""
    app, source, clock = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, [connecting(name="resnet50")])
        await after(pilot, clock, 60)
        banner = text(app.query_one(Banner))
        assert "resnet50 at tcp://127.0.0.1:5555: nothing received yet" in banner
        assert INSTRUMENT_HINT not in banner


async def test_nothing_heard_yet_gets_the_hint_only_after_a_while() -> None:
    """The viewer's first moments (the demo's first frame): no endpoint, no node yet. A
    node heard of with no run on it gets the hint at once."""
    app, source, clock = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await after(pilot, clock, 0)
        banner = text(app.query_one(Banner))
        assert "No training run attached, and no node sampled yet." in banner
        assert INSTRUMENT_HINT not in banner
        await after(pilot, clock, HINT_AFTER_S)
        assert f"Instrument a script: {INSTRUMENT_HINT}" in text(app.query_one(Banner))
    app, source, clock = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, agent_only(NOW))
        banner = text(app.query_one(Banner))
        assert "no training run (agent only)" in banner
        assert f"Instrument a script: {INSTRUMENT_HINT}" in banner


@pytest.mark.e2e
def test_the_demo_probe_speaks_while_the_demo_makes_its_data(runtime_dir: Path) -> None:
    """The demo's training publishes before its data is made (256 JPEGs: seconds), its
    loop not started: the viewer shows the run, not "nothing received yet" and the hint.
    Before, its probe started at probe.watch(), once all the data was made."""
    pytest.importorskip("torch")
    data = runtime_dir / "data"
    endpoint = f"ipc://{runtime_dir}/demo.sock"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": "demo input-bound"}
    reader = WireReader(endpoint)
    child = subprocess.Popen(
        [*TRAIN, "--scenario", "input-bound", "--duration", "60", "--data-dir", str(data)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        hellos: list[dict[str, object]] = []
        while not hellos:
            assert time.monotonic() < deadline and child.poll() is None, "no hello"
            hellos = [m["body"] for m in reader.pump(0.1, until="hello") if m["kind"] == "hello"]
        made = len(list((data / "jpeg512").glob("*.jpg")))
        assert made < 256, f"the first hello came once all the data was made ({made})"
        assert hellos[0]["loop"] == "not-started"
        assert hellos[0]["step_count"] == 0
    finally:
        reader.close()
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
