"""Replay: the recorded events decoded as live, the same state and analyzer on the
recorded clock, seeking, the viewer on a recording (pause, speed, seek, time line), and
``r`` in the live viewer writing a file that replays."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe.protocol import encode
from gputop_dl.probe.transport import Publisher
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.events import BadInput, Received
from gputop_dl.tui.record.format import is_recording
from gputop_dl.tui.record.reader import load_timeline
from gputop_dl.tui.record.replay import (
    SPEEDS,
    TICK_S,
    ReplayClock,
    Replayer,
    ReplaySource,
    replay_state,
)
from gputop_dl.tui.record.replay_app import SEEK_S, ReplayApp
from gputop_dl.tui.record.writer import RecordWriter
from gputop_dl.tui.snapshot import build_snapshot
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, step_records, steps_events
from tests.recordings import END, FAULT_AT, fault_run, write_events


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "fault.gtrec"
    write_events(path, fault_run())
    return path


def verdict_at(path: Path, at: float, *, quick: bool = True) -> tuple[str, str | None]:
    replayer = replay_state(load_timeline(path), at, quick=quick)
    verdict = replayer.state.runs[0].verdict
    assert verdict is not None
    return verdict.kind, verdict.cause


# ----------------------------------------------------------- the same path as live


def test_the_recorded_events_decode_to_what_was_sent(recording: Path) -> None:
    timeline = load_timeline(recording)
    assert timeline.events == fault_run()
    assert timeline.times == sorted(timeline.times)
    assert (timeline.start, timeline.end) == (fault_run()[0].received, fault_run()[-1].received)


def test_the_replayed_state_is_the_live_state(recording: Path) -> None:
    """Live: the app applies what arrived, ticks every TICK_S, and at once when a run
    appears; the replay must end in exactly the state such a live viewer would have."""
    live = ViewerState(HOST, pid_alive=None)
    events = fault_run()
    tick: float | None = None
    for event in events:
        assert isinstance(event, Received)
        while tick is not None and tick + TICK_S < event.received:
            tick += TICK_S
            live.tick(tick)
        roster = live.roster
        live.apply(event)
        if live.roster != roster:
            tick = event.received
            live.tick(tick)
    live.tick(END)
    replayed = replay_state(load_timeline(recording), END, quick=False).state
    assert build_snapshot(replayed) == build_snapshot(live)


@pytest.mark.parametrize("quick", [True, False])
def test_the_verdict_before_and_after_the_fault(recording: Path, quick: bool) -> None:
    assert verdict_at(recording, FAULT_AT - 1.0, quick=quick) == ("compute-bound", None)
    kind, _ = verdict_at(recording, END, quick=quick)
    assert kind == "input-bound"


def test_seeking_back_rebuilds_the_state_from_the_start(recording: Path) -> None:
    timeline = load_timeline(recording)
    replayer = Replayer(timeline)
    replayer.advance_to(END)
    late = replayer.state
    replayer.advance_to(FAULT_AT - 5.0)
    assert replayer.state is not late
    fresh = replay_state(timeline, FAULT_AT - 5.0, quick=False).state
    assert build_snapshot(replayer.state) == build_snapshot(fresh)
    replayer.advance_to(FAULT_AT + 30.0)  # forward again: from where it is
    fresh = replay_state(timeline, FAULT_AT + 30.0, quick=False).state
    assert build_snapshot(replayer.state) == build_snapshot(fresh)


def test_undecodable_frames_replay_as_the_live_source_reports_them(tmp_path: Path) -> None:
    path = tmp_path / "bad.gtrec"
    writer = RecordWriter(path, host=HOST)
    newer = encode(hello())
    newer[1] = newer[1].replace(b"\x92\x02\x00", b"\x92\x03\x00", 1)  # v: [3, 0]
    writer.add(newer, T0)
    writer.add([b"gputop.steps", b"\xc1"], T0 + 2)
    writer.add([b"gputop.steps", b"\xc1"], T0 + 2.1)  # the same error within 1 s: once
    writer.add(encode(hello()), T0 + 3)
    writer.close()
    events = load_timeline(path).events
    assert [type(e) for e in events] == [BadInput, BadInput, Received]
    first, second = events[0], events[1]
    assert isinstance(first, BadInput) and isinstance(second, BadInput)
    assert first.theirs == (3, 0) and first.source_hint == SOURCE_ID
    assert second.text.startswith("malformed message ignored")
    state = replay_state(load_timeline(path)).state
    assert state.errors


def test_a_clock_stepped_back_while_recording_does_not_replay_backwards(tmp_path: Path) -> None:
    records = step_records(T0, 20.0, samples_per_s=200.0, wait_share=0.1)
    events = steps_events(records)
    shuffled = events[:5] + [Received(e.message, e.received - 100.0) for e in events[5:8]]
    path = tmp_path / "jump.gtrec"
    write_events(path, [Received(hello(), T0), *shuffled, *events[8:]])
    timeline = load_timeline(path)
    assert timeline.times == sorted(timeline.times)
    assert replay_state(timeline).state.runs[0].step_count == len(records)


# ------------------------------------------------------------------ the clock


class Wall:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_replay_clock_speed_pause_seek_and_end() -> None:
    wall = Wall()
    clock = ReplayClock(1000.0, 1100.0, monotonic=wall)
    wall.now = 5.0
    assert clock.now() == 1005.0
    clock.set_speed(10)
    wall.now = 6.0
    assert clock.now() == 1015.0
    clock.set_paused(True)
    wall.now = 50.0
    assert clock.now() == 1015.0
    clock.set_paused(False)
    wall.now = 51.0
    assert clock.now() == 1025.0
    wall.now = 500.0
    assert clock.now() == 1100.0  # stops at the end
    assert clock.seek(900.0) == 1000.0 and clock.seek(5000.0) == 1100.0
    clock.set_speed(1)
    assert [clock.faster(1) for _ in range(len(SPEEDS) + 2)][-1] == 60
    assert [clock.faster(-1) for _ in range(len(SPEEDS) + 2)][-1] == 1


def test_the_source_hands_over_what_the_clock_reached(recording: Path) -> None:
    timeline = load_timeline(recording)
    wall = Wall()
    source = ReplaySource(timeline, ReplayClock(timeline.start, timeline.end, monotonic=wall))
    got: list[Any] = []
    lock = threading.Lock()

    def emit(batch: list[Any]) -> None:
        with lock:
            got.extend(batch)

    def count() -> int:
        with lock:
            return len(got)

    source.start(emit)
    try:
        wall.now = 30.0
        wait_for(lambda: count() == timeline.index_after(timeline.start + 30.0))
        with source.lock:
            source.seek(timeline.start + 100.0)
        wall.now = 31.0
        at_30 = timeline.index_after(timeline.start + 30.0)
        at_100 = timeline.index_after(timeline.start + 100.0)
        at_101 = timeline.index_after(timeline.start + 101.0)
        wait_for(lambda: count() == at_30 + at_101 - at_100)
    finally:
        source.stop()
    events = timeline.events
    assert got == events[:at_30] + events[at_100:at_101]  # the seek skipped 30 s .. 100 s


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ------------------------------------------------------------- the viewer on it


async def test_the_viewer_replays_with_pause_speed_seek_and_a_time_line(recording: Path) -> None:
    timeline = load_timeline(recording)
    wall = Wall()
    clock = ReplayClock(timeline.start, timeline.end, monotonic=wall)
    app = ReplayApp(timeline, refresh_hz=0, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("space")
        assert clock.paused
        await pilot.press("plus")
        await pilot.press("plus")
        assert clock.speed == SPEEDS[2]
        await pilot.press("minus")
        assert clock.speed == SPEEDS[1]
        bar = app.record_bar
        assert bar.display and "⏸" in str(bar.render()) and "\u00d72" in str(bar.render())
        # seek forward past the fault: the same verdict as a headless replay there
        for _ in range(int((FAULT_AT + 30.0 - timeline.start) // SEEK_S)):
            await pilot.press("right")
        await pilot.pause()
        position = clock.now()
        assert abs(position - (timeline.start + 90.0)) < 1e-6
        run = app.state.runs[0]
        assert run.verdict is not None and run.verdict.kind == "input-bound"
        assert "input-bound" in str(app.banner.render()).lower() or app.banner.display
        expected = replay_state(timeline, position, quick=False).state
        assert build_snapshot(app.state)["runs"] == build_snapshot(expected)["runs"]
        # back before the fault: rebuilt
        before = app.state
        for _ in range(5):
            await pilot.press("left")
        await pilot.pause()
        assert app.state is not before
        assert clock.now() == timeline.start + 40.0
        run = app.state.runs[0]
        assert run.verdict is not None and run.verdict.kind == "compute-bound"
        # play at x2 for 10 s of wall time: 20 s of recording go through the replayer
        await pilot.press("space")
        assert not clock.paused
        wall.now += 10.0
        expected_count = timeline.index_after(timeline.start + 60.0)
        deadline = time.monotonic() + 20
        while app.replayer.applied < expected_count and time.monotonic() < deadline:
            await pilot.pause(0.1)  # the source's thread hands them over
        app.refresh_view()
        await pilot.pause()
        assert clock.now() == timeline.start + 60.0
        assert app.replayer.applied == expected_count
        assert app.replayer.ticked == timeline.start + 60.0
        await pilot.press("r")  # a replay is not recorded again: said, no crash
        await pilot.pause()


# ----------------------------------------------------------- r in the live viewer


async def test_r_records_what_the_viewer_receives_and_the_file_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUTOP_RECORD_DIR", str(tmp_path / "recordings"))
    endpoint = f"ipc://{os.environ['GPUTOP_RUNTIME_DIR']}/live.sock"
    publisher = Publisher(endpoint)
    stop = threading.Event()

    def publish() -> None:
        index = 0
        while not stop.is_set():
            now = time.time()
            publisher.send(encode(hello(started=now - 100.0)))
            records = step_records(now - 0.5, 0.45, samples_per_s=200.0, first_index=index)
            index += len(records)
            for event in steps_events(records):
                assert isinstance(event, Received)
                publisher.send(encode(event.message))
            publisher.wait(0.5)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    source = ZmqSource([endpoint], discover=False, local_sampler=False)
    app = GputopApp(source, local_host=HOST)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            recorder = app.record_bar.recorder
            assert recorder is not None and app.record_bar.display
            path = recorder.writer.path
            assert path.parent == tmp_path / "recordings"
            assert "REC" in str(app.record_bar.render()) and path.name in str(
                app.record_bar.render()
            )
            deadline = time.monotonic() + 20
            while recorder.writer.frames < 10 and time.monotonic() < deadline:
                await pilot.pause(0.2)
            await pilot.press("r")
            await pilot.pause()
            assert app.record_bar.recorder is None and not app.record_bar.display
    finally:
        stop.set()
        thread.join(5)
        publisher.close()
    assert is_recording(str(path))
    timeline = load_timeline(path)
    assert timeline.header.origin == "viewer" and timeline.notes.count == 0
    state = replay_state(timeline).state
    assert [run.key for run in state.runs] == [SOURCE_ID]
    assert state.runs[0].step_count > 0


# ---------------------------------------------------------------------- the CLI


def test_snapshot_of_a_recording_at_a_moment_text_and_json(
    recording: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gputop_dl.tui.cli import main

    assert main(["snapshot", str(recording), "--at", "50s"]) == 0
    text = capsys.readouterr().out
    assert "verdict: compute-bound" in text and "resnet50" in text
    assert main(["snapshot", str(recording), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["runs"][0]["verdict"]["kind"] == "input-bound"
    assert snap["recording"]["at"] == snap["recording"]["end"] == load_timeline(recording).end
    assert main(["snapshot", str(recording), "--at", "-55s", "--json"]) == 0
    at = json.loads(capsys.readouterr().out)["recording"]["at"]
    assert at == pytest.approx(snap["recording"]["end"] - 55.0)
    assert main(["snapshot", str(recording), "--at", "soon"]) == 2
    assert "not a moment" in capsys.readouterr().err
    assert main(["snapshot", str(recording), "--at", "99999s", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["recording"]["at"] == snap["recording"]["end"]
    assert "--at 99999s is past the recording's end (it lasts" in out.err, out.err


def test_a_file_that_is_not_a_recording_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gputop_dl.tui.cli import main

    other = tmp_path / "train.py"
    other.write_text("print('hi')\n")
    assert main(["snapshot", str(other)]) == 1
    assert "not a gputop recording" in capsys.readouterr().err
    assert main([str(other)]) == 2  # no terminal here: said, with the headless command
    assert "gputop snapshot FILE" in capsys.readouterr().err


class TappedSource:
    """A source with a raw tap, as ZmqSource has: the test plays its thread."""

    def __init__(self) -> None:
        self.raw_tap: Any = None
        self.stopped = False

    def start(self, emit: Any) -> None:
        self.emit = emit

    def stop(self) -> None:
        self.stopped = True


async def test_quitting_while_recording_closes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUTOP_RECORD_DIR", str(tmp_path))
    source = TappedSource()
    app = GputopApp(source, local_host=HOST)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert source.raw_tap is not None
        source.raw_tap(encode(hello()), T0)  # buffered: less than a second old
        recorder = app.record_bar.recorder
        assert recorder is not None
        await pilot.press("q")
    assert source.stopped and recorder.writer.closed
    (path,) = tmp_path.glob("gputop-*.gtrec")
    assert [type(e) for e in load_timeline(path).events] == [Received]
