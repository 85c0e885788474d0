"""The app driven by Pilot, fed by a FakeSource, one test per state the screen can be in.

Assertions read the text the panels render (``Panel.build`` at the panel's real width),
so they check what a user would read, not only that nothing crashed.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from fakes_tui import (
    HOST,
    SOURCE_ID,
    T0,
    FakeSource,
    agent_only,
    bye,
    cgroup_sample,
    connecting,
    hello,
    incompatible,
    live_run,
    received,
    step_records,
    steps_events,
    system_sample,
)
from rich.console import Console
from rich.segment import Segment
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import Markdown

from gputop_dl.probe.messages import System
from gputop_dl.probe.samples import GpuSample, SourceStatus
from gputop_dl.tui import state as tui_state
from gputop_dl.tui.analyzer import Verdict
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.events import BadInput, Received, SourceEvent
from gputop_dl.tui.format import TIMES
from gputop_dl.tui.state import INSTRUMENT_HINT
from gputop_dl.tui.widgets.accelerators import AcceleratorsPanel
from gputop_dl.tui.widgets.banner import Banner
from gputop_dl.tui.widgets.base import Panel
from gputop_dl.tui.widgets.cpu import CpuPanel
from gputop_dl.tui.widgets.disk import DiskPanel
from gputop_dl.tui.widgets.header import HeaderBar
from gputop_dl.tui.widgets.help import HelpScreen
from gputop_dl.tui.widgets.memory import MemoryPanel
from gputop_dl.tui.widgets.network import NetworkPanel
from gputop_dl.tui.widgets.status import StatusLine
from gputop_dl.tui.widgets.throughput import ThroughputGraph

NOW = T0 + 60.0
NARROW = (80, 24)
WIDE = (200, 50)


class FrozenClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_app(now: float = NOW) -> tuple[GputopApp, FakeSource, FrozenClock]:
    source = FakeSource()
    clock = FrozenClock(now)
    return GputopApp(source, local_host=HOST, clock=clock), source, clock


async def feed(pilot: Pilot[None], source: FakeSource, events: Iterable[SourceEvent]) -> None:
    """Push a batch, let the app handle it, redraw."""
    source.push(list(events))
    await pilot.pause()
    app = pilot.app
    assert isinstance(app, GputopApp)
    app.refresh_view()
    await pilot.pause()


def text(panel: Panel) -> str:
    """What the panel shows, as plain text, at its current width."""
    width = panel.content_size.width or 78
    return "\n".join(line.plain for line in panel.build(width))


# ---------------------------------------------------------------- lifecycle


async def test_source_is_started_on_mount_and_stopped_on_exit() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        assert source.started
        assert not source.stopped
    assert source.stopped


async def test_q_quits_and_stops_the_source() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert source.stopped
    assert app.return_code == 0


async def test_events_emitted_from_another_thread_are_applied() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        thread = threading.Thread(target=source.push, args=(live_run(NOW),))
        thread.start()
        thread.join()
        for _ in range(20):
            await pilot.pause(0.05)
            if app.events_applied:
                break
        app.refresh_view()
        await pilot.pause()
        assert "resnet50" in text(app.query_one(HeaderBar))


# ---------------------------------------------------------------- states


async def test_connecting() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, [connecting()])
        header = text(app.query_one(HeaderBar))
        assert "◌ connecting" in header
        assert "resnet50" in header
        banner = text(app.query_one(Banner))
        assert "nothing received yet" in banner
        assert INSTRUMENT_HINT in banner
        assert "no training run" in text(app.query_one(ThroughputGraph))


async def test_live_run_fills_every_panel() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW))
        header = text(app.query_one(HeaderBar))
        for part in ("● live", "resnet50 rank 0/8", "samples/s", "avg", "step 236", "up 1m00s"):
            assert part in header
        graph = text(app.query_one(ThroughputGraph))
        assert "wait 70 %" in graph
        assert "compute 30 %" in graph
        assert "device busy 27 %" in graph
        assert "█" in graph
        accelerators = app.query_one(AcceleratorsPanel)
        assert f"GPU {TIMES}8 H100 80GB HBM3" in str(accelerators.border_title)
        gpus = text(accelerators)
        assert all(f"\n{i} " in "\n" + gpus for i in range(8))
        assert "/700W" in gpus and "°C" in gpus and "MHz" in gpus and "PCIe" in gpus
        assert "no Gaudi: hl-smi not installed" in gpus
        cpu = app.query_one(CpuPanel)
        assert str(cpu.border_title).startswith(f"CPU {TIMES}64")
        cpu_text = text(cpu)
        assert "DataLoader 4 workers" in cpu_text and "98%" in cpu_text
        assert "63 " in cpu_text  # the 64th core fits
        assert "iowait" in cpu_text
        memory = text(app.query_one(MemoryPanel))
        assert "RAM" in memory and "96.4 GiB" in memory and "avail 401 GiB" in memory
        assert app.query_one(MemoryPanel).border_title == "Memory · 512 GiB"
        assert "swap" in memory and "out 4.10 kB/s" in memory
        assert "pressure cpu 3 % io 12 % mem 0 %" in memory
        disk = text(app.query_one(DiskPanel))
        assert "nvme0n1 ◆" in disk and "412 MB/s" in disk and "47%" in disk
        assert "◆ data /data/imagenet/train on nvme0n1 (ext4)" in disk
        network = text(app.query_one(NetworkPanel))
        assert "eth0" in network and "1.20 MB/s" in network and "idle: ib0" in network
        assert not app.query_one(StatusLine).display


async def test_stale_shows_the_age() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert "● live" in text(app.query_one(HeaderBar))
        clock.now = NOW + 12.0
        app.refresh_view()
        await pilot.pause()
        assert "◐ stale: no message for 12s" in text(app.query_one(HeaderBar))
        assert app.query_one(Banner).has_class("-warning")


async def test_exited_shows_the_reason() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, [*live_run(NOW - 5), received(bye(), NOW - 4)])
        header = text(app.query_one(HeaderBar))
        assert "■ exited: finished after 2,400 steps (4.0s ago)" in header
        banner = app.query_one(Banner)
        assert banner.has_class("-muted")
        assert "exited" in text(banner)


async def test_incompatible_shows_both_versions() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, [incompatible(NOW - 1, theirs=(2, 0))])
        header = text(app.query_one(HeaderBar))
        assert "✖ incompatible: probe speaks protocol 2.0, gputop 1.0" in header
        banner = app.query_one(Banner)
        assert banner.has_class("-critical")
        banner_text = text(banner)
        assert "2.0" in banner_text and "1.0" in banner_text
        assert "pip install -U gputop-dl" in banner_text
        # The banner says it; the problems line does not repeat it.
        assert not app.query_one(StatusLine).display


async def test_bad_input_shows_in_the_status_line() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        await feed(pilot, source, [BadInput("malformed message ignored: not msgpack", NOW - 2)])
        status = app.query_one(StatusLine)
        assert status.display
        assert "malformed message ignored: not msgpack (2.0s ago)" in text(status)


async def test_several_runs_switched_by_keys() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        events = live_run(NOW, rank=0)
        events += live_run(NOW, source_id=f"{HOST}:4243", rank=1)
        events += live_run(NOW, source_id="gpu-node-08:5000", rank=2, host="gpu-node-08")
        await feed(pilot, source, events)
        header = app.query_one(HeaderBar)
        assert "rank 0/8" in text(header)
        assert "runs ● 1 r0  ● 2 r1  ● 3 r2" in text(header)
        await pilot.press("tab")
        assert "rank 1/8" in text(header)
        await pilot.press("3")
        assert "rank 2/8" in text(header)
        assert app.state.display_host() == "gpu-node-08"
        await pilot.press("shift+tab")
        assert "rank 1/8" in text(header)
        await pilot.press("tab", "tab")
        assert "rank 0/8" in text(header)  # wraps
        await pilot.press("9")  # no such run: stays
        assert "rank 0/8" in text(header)


async def test_no_probe_is_a_top_with_the_instrument_hint() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, agent_only(NOW))
        assert "○ no training run" in text(app.query_one(HeaderBar))
        banner = text(app.query_one(Banner))
        assert "No training run attached: showing gpu-node-07." in banner
        assert "from gputop_dl import probe; for batch in probe.watch(loader): ..." in banner
        assert str(app.query_one(CpuPanel).border_title).startswith(f"CPU {TIMES}64")
        assert "DataLoader" not in text(app.query_one(CpuPanel))
        assert "58.0/79.6G" in text(app.query_one(AcceleratorsPanel))


async def test_pause_freezes_the_display_but_keeps_receiving() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        await pilot.press("p")
        header = app.query_one(HeaderBar)
        assert "⏸ PAUSED" in text(header)
        await feed(pilot, source, [received(bye(), NOW)])
        assert "● live" in text(header)  # frozen
        assert app.state.selected is not None
        assert app.state.selected.connection.state == "exited"  # but received
        await pilot.press("p")
        assert "PAUSED" not in text(header)
        assert "■ exited" in text(header)


async def test_help_screen_explains_panels_and_verdicts() -> None:
    app, _source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        markdown = app.screen.query_one(Markdown)
        assert "input-bound" in markdown.source
        assert "iowait" in markdown.source
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_s_saves_a_screenshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTOP_SCREENSHOT_DIR", str(tmp_path))  # not the current directory
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        await pilot.press("s")
        await pilot.pause()
        files = list(tmp_path.glob("gputop-*.svg"))
        assert [f.name for f in files] == ["gputop-20231114-221420.svg"]
        assert "resnet50" in files[0].read_text(encoding="utf-8")
        assert any(str(files[0]) in n.message for n in app._notifications)


async def test_lost_gpu_unreported_values_and_missing_sources() -> None:
    sample = system_sample(NOW - 0.5, lost=(3,))
    gpus = list(sample.gpus)
    gpus[5] = GpuSample(5, gpus[0].name, None, throttle_reasons=("hw_thermal",))
    statuses = (
        SourceStatus("nvml", True),
        SourceStatus("hl-smi", False, "hl-smi not installed"),
        SourceStatus("pressure", False, "kernel without PSI"),
    )
    sample = replace(
        sample, gpus=tuple(gpus), cgroup=cgroup_sample(), statuses=statuses, pressure=None
    )
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(
            pilot, source, [received(hello(), NOW - 1), received(System(SOURCE_ID, sample), NOW)]
        )
        gpus_text = text(app.query_one(AcceleratorsPanel)).splitlines()
        assert gpus_text[3] == "3 lost: GPU has fallen off the bus"
        assert "mem n/a" in gpus_text[5] and "temp n/a" in gpus_text[5]
        assert "power n/a" in gpus_text[5] and "⚠ thermal" in gpus_text[5]
        assert gpus_text[-1] == "no Gaudi: hl-smi not installed"
        cpu = text(app.query_one(CpuPanel))
        assert "quota 8 cores, throttled 12 %" in cpu
        memory = text(app.query_one(MemoryPanel))
        assert "cgroup mem 41.5/64.0 GiB" in memory
        assert "no pressure: kernel without PSI" in memory


async def test_gaudi_hpus_without_nvidia() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW, gpu_count=0, hpu_count=8))
        panel = app.query_one(AcceleratorsPanel)
        assert str(panel.border_title).startswith(f"HPU {TIMES}8 HL-225")
        rows = text(panel).splitlines()
        assert len(rows) == 5  # two HPUs a row, then the missing NVIDIA line
        assert "70.5/96.0G" in rows[0] and "41%" in rows[0]
        assert rows[-1] == "no NVIDIA GPU: NVML library not found"


# ---------------------------------------------------------------- layout


async def test_80x24_keeps_header_banner_and_graph_in_view() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert app.screen.has_class("-narrow")
        header = app.query_one(HeaderBar).region
        banner = app.query_one(Banner).region
        graph = app.query_one(ThroughputGraph).region
        panels = app.query_one("#panels").region
        assert header.y == 0 and header.height == 1
        assert 3 <= banner.height <= 4
        assert graph.y == banner.bottom and graph.height == 6
        assert panels.y == graph.bottom and panels.height >= 10
        # Eight GPUs share four rows, so the accelerators fit above the fold.
        accelerators = app.query_one(AcceleratorsPanel)
        assert len(text(accelerators).splitlines()) == 5
        assert accelerators.region.bottom <= 23


async def test_wide_terminal_puts_panels_side_by_side() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert app.screen.has_class("-wide")
        accelerators = app.query_one(AcceleratorsPanel).region
        cpu = app.query_one(CpuPanel).region
        assert accelerators.x == 0 and cpu.x >= 90 and cpu.y == accelerators.y
        # One GPU a row with every field when there is room.
        assert len(text(app.query_one(AcceleratorsPanel)).splitlines()) == 9
        network = app.query_one(NetworkPanel).region
        assert network.bottom <= 49


# ---------------------------------------------------------------- cost of a refresh


def screen_cells(app: GputopApp) -> list[list[tuple[str, str]]]:
    """What the terminal shows: (character, style) per cell."""
    console = Console(
        width=app.size.width,
        height=app.size.height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    rows = []
    for line in Segment.split_lines(console._record_buffer):
        rows.append([(ch, str(s.style)) for s in line if not s.control for ch in s.text])
    return rows


FIXED_VERDICT = Verdict("input-bound", "warning", 0.85, "Input-bound", cause="few-workers")


@pytest.mark.parametrize("size", [NARROW, (120, 40)])
async def test_updates_draw_what_a_fresh_screen_draws(
    size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Panels repaint only the lines that changed: after many updates the screen must be
    # what a fresh app shows for the same state.
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: FIXED_VERDICT)
    events = sorted(
        live_run(NOW - 5) + live_run(NOW - 5, source_id=f"{HOST}:4243", rank=1),
        key=lambda e: e.received if isinstance(e, Received) else 0.0,
    )
    app, source, clock = make_app(NOW - 30)
    async with app.run_test(size=size) as pilot:
        sent = 0
        for step in range(60):  # 30 s of half-second refreshes; the last 5 s stalled
            clock.now = NOW - 30 + 0.5 * (step + 1)
            batch = [e for e in events[sent:] if e.received <= clock.now]
            sent += len(batch)
            if batch:
                source.push(batch)
                await pilot.pause()
            app.refresh_view()
            await pilot.pause()
            if step == 20:
                await pilot.press("tab")
            if step == 40:
                await pilot.press("tab")
        seen = screen_cells(app)
    fresh, fresh_source, _ = make_app(NOW)
    async with fresh.run_test(size=size) as pilot:
        await feed(pilot, fresh_source, events)
        assert screen_cells(fresh) == seen


def count_refreshes(panel: Panel, calls: list[str]) -> None:
    refresh = panel.refresh

    def counting(*regions: Region, **kwargs: bool) -> Panel:
        calls.append(type(panel).__name__)
        return refresh(*regions, **kwargs)

    panel.refresh = counting  # type: ignore[method-assign]


async def test_a_refresh_with_nothing_new_repaints_nothing() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW))
        panels = [app.header, app.banner, app.graph, app.accelerators, app.cpu]
        panels += [app.memory, app.disk, app.network]
        repaints: list[str] = []
        for panel in panels:
            count_refreshes(panel, repaints)
        app.refresh_view()  # the clock is frozen and nothing arrived
        await pilot.pause()
        assert repaints == []


async def test_routine_data_waits_for_the_refresh_a_new_run_does_not() -> None:
    app, source, clock = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert app._timer is not None
        app._timer.pause()  # refreshes are made by hand here
        applied = app.events_applied
        later = step_records(NOW, 1.0, first_index=1000)
        source.push(steps_events(later))
        await pilot.pause()
        assert app.events_applied == applied  # steps wait in the inbox ...
        clock.now = NOW + 1.0
        app.refresh_view()
        assert app.events_applied > applied  # ... for the next refresh
        # A new run is shown at once, without waiting for the refresh.
        source.push([received(hello(f"{HOST}:4243", rank=1, pid=4243), NOW + 1.0)])
        await pilot.pause()
        await pilot.pause()
        assert "runs ● 1 r0" in text(app.header) and "2 r1" in text(app.header)
