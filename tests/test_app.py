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
    LONG_INPUT_BOUND,
    SOURCE_ID,
    STALLED,
    T0,
    FakeSource,
    agent_only,
    bye,
    cgroup_sample,
    connecting,
    cores,
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
from rich.text import Text
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import Markdown

from gputop_dl.probe.messages import System
from gputop_dl.probe.samples import (
    ABSENT,
    FAILING,
    STARTING,
    GpuSample,
    ProcessSample,
    SourceStatus,
    TopProcess,
    TrainingProcesses,
)
from gputop_dl.tui import state as tui_state
from gputop_dl.tui.analyzer import Verdict
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.events import BadInput, Received, SourceEvent
from gputop_dl.tui.format import TIMES
from gputop_dl.tui.state import INSTRUMENT_HINT
from gputop_dl.tui.widgets.accelerators import AcceleratorsPanel, field_errors
from gputop_dl.tui.widgets.banner import Banner
from gputop_dl.tui.widgets.base import Panel
from gputop_dl.tui.widgets.cpu import CpuPanel
from gputop_dl.tui.widgets.disk import DiskPanel
from gputop_dl.tui.widgets.header import STATE_GLYPHS, HeaderBar
from gputop_dl.tui.widgets.help import HelpScreen
from gputop_dl.tui.widgets.memory import MemoryPanel
from gputop_dl.tui.widgets.network import NetworkPanel
from gputop_dl.tui.widgets.processes import role_of, table_title
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


async def test_a_refresh_after_the_screens_are_gone_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Textual removes the app's screens before it stops its timers: a refresh tick or a
    wake-up in between raised ScreenStackError, a traceback on quit (a CI run caught it;
    1 exit in 40 at a 500 Hz refresh, none in 200 since). Here that moment is made to
    last: ``screen`` raises as Textual's does then, and the screen stack is empty."""
    from textual.app import ScreenStackError

    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        shown = text(app.banner)

        def no_screen(self: GputopApp) -> None:
            raise ScreenStackError("No screens on stack")

        with monkeypatch.context() as m:
            m.setattr(GputopApp, "screen", property(no_screen))
            m.setattr(GputopApp, "screen_stack", property(lambda self: []))
            source.push([received(bye(), NOW)])  # something to apply: it waits, unapplied
            app.refresh_view()
            app._fit_panels()
            app._update_more()
        assert text(app.banner) == shown  # nothing was redrawn meanwhile
        app.refresh_view()  # the screens back: what waited is applied now
        await pilot.pause()
        assert app.state.selected is not None
        assert app.state.selected.connection.state == "exited"


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
        # A probe that registered itself is instrumented: the hint is for silent endpoints
        # (tests/test_screen_wording52.py).
        assert INSTRUMENT_HINT not in banner
        assert "no training run" in text(app.query_one(ThroughputGraph))


async def test_live_run_fills_every_panel() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW))
        header = text(app.query_one(HeaderBar))
        for part in ("● live", "resnet50 rank 0/8", "samples/s", "avg", "236 steps", "up 1m00s"):
            assert part in header
        graph = text(app.query_one(ThroughputGraph))
        assert "wait now 70 %" in graph
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
        assert "DataLoader: 4 workers, all saturated (98%, 97%, 96%, 95%)" in cpu_text
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
        await feed(pilot, source, [incompatible(NOW - 1, theirs=(3, 0))])
        header = text(app.query_one(HeaderBar))
        assert "✖ incompatible: probe speaks protocol 3.0, gputop 2.0" in header
        banner = app.query_one(Banner)
        assert banner.has_class("-critical")
        banner_text = text(banner)
        assert "3.0" in banner_text and "2.0" in banner_text
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
        assert "node gpu-node-07: no training run (agent only)." in banner  # issue 9
        assert "from gputop_dl import probe; for batch in probe.watch(loader): ..." in banner
        assert str(app.query_one(CpuPanel).border_title).startswith(f"CPU {TIMES}64")
        assert "DataLoader" not in text(app.query_one(CpuPanel))
        assert "30% m 73%" in text(app.query_one(AcceleratorsPanel))  # the compact grid


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
        # every state the header can show, with its glyph ("error" is an endpoint's)
        for state, glyph in STATE_GLYPHS.items():
            if state != "error":
                assert f"`{glyph} {state}`" in markdown.source, state
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
        SourceStatus("hl-smi", False, "hl-smi not installed", ABSENT),
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


@pytest.mark.parametrize(
    ("message", "state", "line"),
    [
        ("hl-smi not installed", ABSENT, "no Gaudi: hl-smi not installed"),
        ("hl-smi is not on this node", ABSENT, "no Gaudi: hl-smi is not on this node"),
        ("hl-smi not installed", FAILING, "⚠ hl-smi: hl-smi not installed"),
        ("waiting for hl-smi", STARTING, "hl-smi: waiting for hl-smi"),
        ("hl-smi timed out after 2 s", "", "⚠ hl-smi: hl-smi timed out after 2 s"),
    ],
)
async def test_a_sources_state_not_its_words_decides_its_line(
    message: str, state: str, line: str
) -> None:
    """Absent, starting or failing is the collector's fact on the wire (SourceStatus.state);
    the panel reads no meaning into the message's words."""
    statuses = (SourceStatus("nvml", True), SourceStatus("hl-smi", False, message, state))
    sample = replace(system_sample(NOW - 0.5), statuses=statuses)
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(
            pilot, source, [received(hello(), NOW - 1), received(System(SOURCE_ID, sample), NOW)]
        )
        assert text(app.query_one(AcceleratorsPanel)).splitlines()[-1] == line


async def test_gaudi_hpus_without_nvidia() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=(80, 50)) as pilot:  # narrow and tall: the full forms
        await feed(pilot, source, live_run(NOW, gpu_count=0, hpu_count=8))
        panel = app.query_one(AcceleratorsPanel)
        assert str(panel.border_title).startswith(f"HPU {TIMES}8 HL-225")
        rows = text(panel).splitlines()
        assert len(rows) == 5  # two HPUs a row, then the missing NVIDIA line
        assert "70.5/96.0G" in rows[0] and "41%" in rows[0]
        assert rows[-1] == "no NVIDIA GPU: NVML library not found"


# ---------------------------------------------------------------- layout


SIZES = [(80, 24), (120, 36), (200, 50)]
SMALL_NODE = {"core_count": 2, "gpu_count": 0}  # the demo's: two cores, no accelerator


def screen_text(app: GputopApp) -> list[str]:
    """The terminal's rows as plain text."""
    return ["".join(ch for ch, _ in row) for row in screen_cells(app)]


def flat(text: str) -> str:
    """Words only: wrapped lines, their indents and the banner's left bar fold away."""
    return " ".join(text.replace("▌", " ").split())


async def settle(pilot: Pilot[None]) -> None:
    """Let a scroll, the fitting of the panels and the hint they bring go through."""
    for _ in range(4):
        await pilot.pause()


def panel_titles(app: GputopApp) -> list[str]:
    return [str(p.border_title) for p in app.query(Panel) if p.display and p.border_title]


STALLED_WITH_STACK = Verdict(
    kind="stalled",
    severity="critical",
    confidence=1.0,
    headline="Stalled: no step for 28 s; typical step 74 ms",
    evidence=(
        "last step 70 ended 28 s ago; stall threshold 10 s (max of 5x typical step, 10 s)",
        "main process 0 % CPU, 2 workers 0 % CPU in all: nearly idle, so blocked",
        "training thread (MainThread) stack after 10 s without a step, innermost first:",
        "  at /usr/lib/python3.11/threading.py:320 in wait(): waiter.acquire()",
        "  at /usr/lib/python3.11/threading.py:622 in wait(): signaled = self._cond.wait()",
        "  at /usr/lib/python3.11/queue.py:171 in get(): self.not_empty.wait()",
        "  your code: /home/u/train.py:315 in _train(): batch = queue.get()",
    ),
    advice=("native frames too (C extensions, NCCL, CUDA): py-spy dump --native --pid 4776",),
)


@pytest.mark.parametrize("size", [(160, 45), WIDE])
async def test_a_stalled_runs_banner_shows_where_it_waits(
    size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's heading came without its frames (the banner took three evidence
    lines, the third the heading): the innermost frame and the user's are shown."""
    verdict = STALLED_WITH_STACK
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: verdict)
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot, source, live_run(NOW))
        shown = flat("\n".join(screen_text(app)[: app.banner.region.bottom]))
        assert "stack after 10 s without a step, innermost first:" in shown
        assert "at /usr/lib/python3.11/threading.py:320 in wait(): waiter.acquire()" in shown
        assert "your code: /home/u/train.py:315 in _train(): batch = queue.get()" in shown
        assert "queue.py:171" not in shown  # two frames at most: the banner stays short


@pytest.mark.parametrize("node", [{}, SMALL_NODE], ids=["64-core-8-gpu", "2-core"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_whole_verdict_and_every_panel_title_are_on_screen(
    size: tuple[int, int], node: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: at 80 and 120 columns the advice ended "...the worker o…", and at 80x24
    # the Disk and Network panels were below the fold.
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: LONG_INPUT_BOUND)
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot, source, live_run(NOW, **node))  # type: ignore[arg-type]
        await pilot.pause()
        rows = screen_text(app)
        shown = flat("\n".join(rows))
        assert flat(LONG_INPUT_BOUND.headline) in shown
        assert flat(LONG_INPUT_BOUND.advice[0]) in shown
        assert flat(LONG_INPUT_BOUND.headroom or "") in shown
        assert "…" not in "".join(rows[: app.banner.region.bottom])
        titles = panel_titles(app)
        assert {"Throughput", "CPU", "Memory", "Disk", "Network"} <= {
            t.split(" ")[0] for t in titles
        }
        for title in titles:
            assert title in "\n".join(rows), title
        assert not app.more.display  # nothing below the fold: no hint


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_stall_advice_with_its_command_is_on_screen(
    size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: "py-spy dump --pid N" showed only from 200 columns on.
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: STALLED)
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot, source, live_run(NOW))
        shown = flat("\n".join(screen_text(app)))
        assert flat(STALLED.headline) in shown
        assert "otherwise see where it hangs: py-spy dump --pid 4242" in shown


async def test_panels_below_the_fold_are_named_and_reached_with_page_down() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert not app.top_table.display  # no room at 80x24: the table waits for `t`
        await pilot.press("t")
        await pilot.pause()
        assert app.top_table.display
        app.panels.scroll_home(animate=False)
        await settle(pilot)
        rows = screen_text(app)
        assert app.more.display
        hint = rows[-2].strip()
        assert hint.startswith("↓ ") and hint.endswith(" below: PgDn or ↓ to scroll")
        for title in panel_titles(app):  # a panel whose title is out of sight is named
            if not any(title in row for row in rows):
                assert title.split(" ·")[0] in hint
        assert not any("+5 more" in row for row in rows)
        await pilot.press("pagedown")
        await settle(pilot)
        rows = screen_text(app)
        assert any("+5 more (a taller terminal shows all)" in row for row in rows)
        assert rows[-2].strip() == "↑ more above: PgUp or ↑ to scroll"


MAIN, WORKER, COMPILER, LATE, RANK1 = 4242, 4301, 7300, 7400, 4243


@pytest.mark.parametrize(
    ("process", "expected"),
    [
        (TopProcess(MAIN, 1, "python", 90.0, 1), "main"),
        (TopProcess(WORKER, MAIN, "pt_data_worker", 90.0, 1), "worker"),
        # a child the probe did not publish as a loader worker: g++, a tokenizer pool
        (TopProcess(COMPILER, MAIN, "cc1plus", 90.0, 1), "child"),
        # not in the training tree: gputop's own hl-smi loop (or one not sampled yet)
        (TopProcess(LATE, MAIN, "hl-smi", 1.0, 1), ""),
        (TopProcess(RANK1, 1, "python", 60.0, 1), "training"),
        (TopProcess(RANK1 + 1, RANK1, "pt_data_worker", 60.0, 1), "training"),
        (TopProcess(9100, 1, "ffmpeg", 300.0, 1), ""),
    ],
)
def test_the_process_table_marks_what_the_sampler_reported(
    process: TopProcess, expected: str
) -> None:
    roles = {MAIN: "main", WORKER: "worker", COMPILER: "other"}
    assert role_of(process, MAIN, roles, {MAIN, RANK1}) == expected  # every run's pid


async def test_the_cpu_panel_counts_the_other_children() -> None:
    app, _source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        # Paused: the refresh timer must not show its own (empty) state over this one
        # between the show and the read (it did, 1 run in 7).
        app.paused = True
        for others, said in ((1, "1 other child "), (2, "2 other children ")):
            tree = TrainingProcesses(
                (
                    ProcessSample(MAIN, "main", "python", 80.0, 1),
                    *(
                        ProcessSample(COMPILER + i, "other", "cc1plus", 10.0, 1)
                        for i in range(others)
                    ),
                ),
                0,
                0,
            )
            app.cpu.show(cores(8), tree, None)
            await pilot.pause()
            assert said in text(app.cpu), text(app.cpu)


async def test_the_process_table_marks_the_training_and_names_the_others() -> None:
    events = sorted(
        live_run(NOW) + live_run(NOW, source_id=f"{HOST}:4243", rank=1),
        key=lambda e: e.received if isinstance(e, Received) else 0.0,
    )
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, events)
        assert app.top_table.display  # shown without asking where there is room
        rows = [" ".join(row.split()) for row in text(app.top_table).splitlines()]
        assert rows[0].split() == ["pid", "cpu", "memory", "name"]
        assert rows[1].split() == ["9100", "310%", "1.20", "GiB", "ffmpeg"]  # not ours
        assert "◆ worker pt_data_worker" in rows[2] and rows[2].split()[0] == "4301"
        main = next(r for r in rows if r.split()[0] == "4242")
        assert "◆ main" in main and main.endswith("python")
        other = next(r for r in rows if r.split()[0] == "4243")
        assert "◆ training python" in other  # rank 1 on the same node
        assert "n/a" in next(r for r in rows if "jupyter-lab" in r)  # no CPU figure yet
        await pilot.press("t")
        await pilot.pause()
        assert not app.top_table.display


@pytest.mark.parametrize(
    ("age_s", "interval_s", "says"),
    [
        (None, 1.0, "over ~5.0s"),  # no time given (a sampler before 2026-11-27)
        (0.0, 1.0, "over ~5.0s"),  # read in this sample: over the 5 samples before
        (4.0, 1.0, "over ~5.0s"),  # the usual spacing: every 5 samples
        (6.0, 1.0, "read 6.0s ago"),
        (6.0, None, "read 6.0s ago"),
        (None, None, "CPU % of one core"),  # no pace known: no span said
        (200.0, 1.0, "read 3m20s ago"),  # a node of thousands of processes
        (8.0, 2.0, "over ~10s"),  # `gputop agent --interval 2`: every 10 s as usual
        (12.0, 2.0, "read 12s ago"),
        (6.0, 0.1, "read 6.0s ago"),  # a fast sampler: 6 s is old all the same
        (12.0, float("inf"), "read 12s ago"),
        (-30.0, 1.0, "over ~5.0s"),  # a table "read" after its sample: not said
        (float("nan"), 1.0, "over ~5.0s"),
    ],
)
def test_the_process_tables_title_says_when_an_old_table_was_read(
    age_s: float | None, interval_s: float | None, says: str
) -> None:
    assert table_title(age_s, interval_s).endswith(says)


async def test_a_process_table_read_long_before_its_sample_says_so_on_screen() -> None:
    events = live_run(NOW)
    last = max(
        (e for e in events if isinstance(e, Received) and isinstance(e.message, System)),
        key=lambda e: e.received,
    )
    assert isinstance(last.message, System)
    sample = last.message.sample
    old = replace(sample, time=sample.time + 1.0, top_time=sample.time - 95.0)
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, events)
        assert str(app.top_table.border_title).endswith("CPU % of one core over ~5.0s")
        await feed(pilot, source, [Received(System(SOURCE_ID, old), last.received + 1.0)])
        assert str(app.top_table.border_title).endswith("read 1m36s ago")


async def test_compact_panels_keep_one_line_a_device() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW))
        assert app.screen.has_class("-short")
        gpus = text(app.accelerators).splitlines()
        assert len(gpus) == 2 and gpus[0].startswith("0 ") and "m 73%" in gpus[0]
        cpu = text(app.cpu).splitlines()
        assert len(cpu) == 2  # workers, then all cores in one bar and the busiest by number
        assert cpu[1].startswith("all ") and "busiest: #3 96%" in cpu[1]
        assert text(app.memory).count("\n") == 0
        disk = text(app.disk).splitlines()
        assert disk == ["nvme0n1 ◆ read 412 MB/s · write 1.50 MB/s · busy 47% · +1 quiet"]
        assert text(app.network).splitlines() == [
            "eth0    rx  1.20 MB/s   tx   400 kB/s · idle: ib0"
        ]


async def test_sixteen_accelerators_on_80x24_name_their_kind_and_what_is_below() -> None:
    app, source, _ = make_app()
    async with app.run_test(size=NARROW) as pilot:
        await feed(pilot, source, live_run(NOW, hpu_count=8))
        await settle(pilot)
        cells = text(app.accelerators).splitlines()
        assert [row.split()[0] for row in cells] == ["G0", "G4", "H0", "H4"]
        assert all(row.count("% m ") == 4 and row.endswith("%") for row in cells)
        rows = screen_text(app)
        assert not any(row.startswith("─Network") for row in rows)
        assert rows[-2].strip() == "↓ Network below: PgDn or ↓ to scroll"


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


async def test_a_changed_line_repaints_its_whole_row_border_and_padding_included() -> None:
    """A panel refreshes the rows of the lines that changed, across its whole width:
    Textual crops every line it renders again to the dirty region, and a region as wide
    as the content alone made it crop each changed line (a fifth of what they cost)."""
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, live_run(NOW))
        panel = app.cpu
        width = panel.content_size.width
        lines = [line.copy() for line in panel.lines(width)]
        assert len(lines) > 3
        regions: list[Region] = []
        refresh = panel.refresh

        def spying(*dirty: Region, **kwargs: bool) -> Panel:
            regions.extend(dirty)
            return refresh(*dirty, **kwargs)

        panel.refresh = spying  # type: ignore[method-assign]
        changed = [line.copy() for line in lines]
        changed[2] = Text("a line that changed")
        panel.build = lambda width: [line.copy() for line in changed]  # type: ignore[method-assign]
        panel._shown = object()
        panel.changed()
        offset = panel.content_offset
        assert offset.x > 0  # a border and padding on the left
        assert [region.translate(offset) for region in regions] == [
            Region(0, offset.y + 2, panel.outer_size.width, 1)
        ]
        assert panel._styles_cache.is_dirty(offset.y + 2)
        await pilot.pause()
        rows = ["".join(char for char, _ in row) for row in screen_cells(app)]
        assert "a line that changed" in rows[panel.region.y + offset.y + 2]


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


# ---------------------------------------------------------------- accelerators in trouble


def last_system(events: list[SourceEvent]) -> Received:
    return max(
        (e for e in events if isinstance(e, Received) and isinstance(e.message, System)),
        key=lambda e: e.received,
    )


def stale_hpus(
    events: list[SourceEvent], state: str = "stale", error: str = "stale: no update for 12 s"
) -> Received:
    """hl-smi stopped updating: its rows marked stale, its status says why."""
    last = last_system(events)
    assert isinstance(last.message, System)
    sample = last.message.sample
    hpus = tuple(replace(h, state=state, error=error) for h in sample.hpus)
    message = "hl-smi data stale: no update for 12 s (hl-smi timed out after 2 s)"
    statuses = tuple(
        SourceStatus("hl-smi", False, message, FAILING) if s.source == "hl-smi" else s
        for s in sample.statuses
    )
    fresh = replace(sample, time=sample.time + 1.0, hpus=hpus, statuses=statuses)
    return Received(System(SOURCE_ID, fresh), last.received + 1.0)


@pytest.mark.parametrize("size", [NARROW, WIDE])
async def test_stale_gaudi_figures_are_not_shown_as_live(size: tuple[int, int]) -> None:
    """hl-smi that stopped printing: its last figures are seconds old. On the small
    screen too the panel says so (it showed them as live, the problem nowhere), and the
    source's line does not read "no Gaudi" above eight Gaudi rows."""
    events = live_run(NOW, gpu_count=0, hpu_count=8)
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(pilot, source, [*events, stale_hpus(events)])
        shown = text(app.accelerators)
        assert "⚠ hl-smi: hl-smi data stale: no update for 12 s" in shown, shown
        assert "no Gaudi" not in shown
        assert "70.5/96.0G" not in shown and " 41%" not in shown  # no old figure as live
        assert shown.count("stale") >= 8


@pytest.mark.parametrize(
    ("state", "error", "as_live"),
    [
        ("stale", "no update for 12 s", False),  # the state decides, whatever the words
        ("ok", "stale: a word from the device", True),  # words alone change nothing
    ],
)
async def test_the_sample_state_decides_whether_figures_are_stale(
    state: str, error: str, as_live: bool
) -> None:
    events = live_run(NOW, gpu_count=0, hpu_count=2)
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(pilot, source, [*events, stale_hpus(events, state, error)])
        shown = text(app.accelerators)
        assert ("70.5/96.0" in shown) == as_live, shown
        assert shown.count(error) >= 2, shown  # each row says what is wrong


def test_a_failed_nvml_call_is_not_n_a() -> None:
    """n/a is a field the GPU lacks (NotSupported); a call that failed says so."""
    error = (
        "nvmlDeviceGetUtilizationRates: Unknown Error;"
        " nvmlDeviceGetTemperature: Insufficient Permissions"
    )
    assert field_errors(error) == "util: Unknown Error, temp: Insufficient Permissions"
    assert field_errors("stale: no update for 12 s") == "stale: no update for 12 s"
    assert field_errors(None) is None and field_errors("") is None


async def test_a_gpu_whose_calls_fail_says_which_and_why() -> None:
    events = live_run(NOW)
    last = last_system(events)
    assert isinstance(last.message, System)
    sample = last.message.sample
    error = "nvmlDeviceGetUtilizationRates: Unknown Error"
    gpus = tuple(replace(g, util_pct=None, error=error) if g.index == 2 else g for g in sample.gpus)
    broken = replace(sample, time=sample.time + 1.0, gpus=gpus)
    app, source, _ = make_app()
    async with app.run_test(size=WIDE) as pilot:
        await feed(
            pilot, source, [*events, Received(System(SOURCE_ID, broken), last.received + 1.0)]
        )
        (row,) = [r for r in text(app.accelerators).splitlines() if r.startswith("2 ")]
        assert "⚠ util: Unknown Error" in row, row


@pytest.mark.parametrize("size", [NARROW, WIDE])
async def test_a_hung_nvml_is_not_no_nvidia_gpu(size: tuple[int, int]) -> None:
    """Eight GPUs behind a stuck driver call: "⚠ NVML: not answering", never the words
    of a node without GPUs."""
    events = live_run(NOW, gpu_count=0)
    last = last_system(events)
    assert isinstance(last.message, System)
    sample = last.message.sample
    hung = "NVML not answering: a driver call has not returned for 12 s"
    statuses = tuple(
        SourceStatus("nvml", False, hung, FAILING) if s.source == "nvml" else s
        for s in sample.statuses
    )
    fresh = replace(sample, time=sample.time + 1.0, statuses=statuses)
    app, source, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await feed(
            pilot, source, [*events, Received(System(SOURCE_ID, fresh), last.received + 1.0)]
        )
        shown = text(app.accelerators)
        assert f"⚠ NVML: {hung}" in shown, shown
        assert "no NVIDIA GPU" not in shown


WORKER_RESTARTS = Verdict(
    kind="input-bound",
    severity="warning",
    confidence=0.85,
    headline="Input-bound (data wait 72 % of step): the loader's workers start again at every"
    " pass (persistent_workers=False)",
    evidence=(
        "data wait 72 % of step time (69 ms of 101 ms per step, last 32 steps, 3.2 s)",
        "throughput 318 samples/s (9.9 steps/s)",
        "the first batch of a pass waited 526 ms on average over the last 15 passes",
        "num_workers=2, persistent_workers=False: every pass (epoch) forks the workers again",
    ),
    advice=("DataLoader(persistent_workers=True): the workers start once, not at every pass",),
    headroom="without those waits: at most ≈ 1129 samples/s, +231 %",
    lead=2,
)


async def test_a_short_screen_shows_the_causes_own_evidence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Room for one line of evidence: the cause's own, not the wait share the headline
    already gives ("data wait 72 %" twice, the first batch's 526 ms nowhere)."""
    monkeypatch.setattr(tui_state, "analyze", lambda window, previous=None: WORKER_RESTARTS)
    app, source, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(pilot, source, live_run(NOW))
        shown = flat("\n".join(screen_text(app)[: app.banner.region.bottom]))
        assert "the first batch of a pass waited 526 ms" in shown, shown
        assert "69 ms of 101 ms per step" not in shown, shown
