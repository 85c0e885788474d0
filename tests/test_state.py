"""The viewer state, without Textual: connection states, throughput math, bounds, runs."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import psutil
import pytest
from fakes_tui import (
    ENDPOINT,
    HOST,
    PID,
    SOURCE_ID,
    T0,
    agent_only,
    bye,
    connecting,
    hello,
    incompatible,
    live_run,
    received,
    step_records,
    steps_events,
    system_sample,
    systems_events,
)

import gputop_dl.tui.state as state_module
import gputop_dl.tui.state.hosts as hosts_module
import gputop_dl.tui.state.run as run_module
import gputop_dl.tui.state.viewer as viewer_module
from gputop_dl.probe.discovery import left_running
from gputop_dl.probe.messages import Bye, Hello, LoaderInfo, Loop, StepRecord, Steps, System
from gputop_dl.probe.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR, decode, encode
from gputop_dl.probe.samples import CpuCore, CpuSample, DiskSample, TopProcess
from gputop_dl.tui.analysis.thresholds import INPUT_WARN_ENTER, INPUT_WARN_EXIT
from gputop_dl.tui.analyzer import Verdict, Window, analyze
from gputop_dl.tui.cli import DEFAULT_REFRESH_HZ
from gputop_dl.tui.events import BadInput, EndpointState, Received
from gputop_dl.tui.state import (
    GONE_TEXT,
    INSTRUMENT_HINT,
    LOST,
    SAMPLES_UNIT,
    STEPS_UNIT,
    ViewerState,
    clean_text,
)
from gputop_dl.tui.state.clean import MAX_CORES, clean_sample, clean_step, evolve
from gputop_dl.tui.state.roster import Who, labels, next_slots
from gputop_dl.tui.state.viewer import (
    GONE_QUIET_S,
    MAX_SOURCES,
    REMOVE_AFTER_S,
)

NOW = T0 + 60.0


def steady(
    state: ViewerState,
    start: float = T0,
    duration_s: float = 20.0,
    source_id: str = SOURCE_ID,
    **kwargs: object,
) -> tuple[StepRecord, ...]:
    """Feed a hello and steady steps: 100 samples/s, 25 per step, 70 % data wait."""
    state.apply(received(hello(source_id, started=start), start))
    records = step_records(start, duration_s, **kwargs)  # type: ignore[arg-type]
    state.apply_all(steps_events(records, source_id))
    return records


# ---------------------------------------------------------------- connection states


def test_connecting_placeholder_until_the_run_speaks() -> None:
    state = ViewerState(HOST)
    state.apply(connecting(ENDPOINT, "resnet50"))
    state.tick(T0)
    (run,) = state.runs
    assert run.is_placeholder
    assert run.connection.state == "connecting"
    assert run.endpoint == ENDPOINT
    assert not state.has_probe

    steady(state, duration_s=2.0)
    state.tick(T0 + 2.0)
    assert [r.name for r in state.runs] == ["resnet50"]
    assert not state.runs[0].is_placeholder
    assert state.has_probe


@pytest.mark.parametrize("name", ["a\tb", "zw\u200bx", "red\x1b[31m", "rtl\u202eon"])
@pytest.mark.parametrize("pid", [PID, None], ids=["by-pid", "by-name"])
def test_a_discovered_run_whose_name_is_cleaned_leaves_no_ghost_placeholder(
    name: str, pid: int | None
) -> None:
    """The viewer shows a name cleaned of control and format characters; its endpoint's
    record has it raw. Compared raw, the endpoint stayed "connecting" beside its run."""
    state = ViewerState(HOST)
    state.apply(EndpointState(ENDPOINT, "connecting", "", name, pid))
    state.apply(Received(hello(name=name), T0))
    state.tick(T0 + 1.0)
    assert [r.is_placeholder for r in state.runs] == [False]


def test_unnamed_endpoint_placeholder_disappears_once_any_run_exists() -> None:
    state = ViewerState(HOST)
    state.apply(connecting(ENDPOINT, None))
    state.tick(T0)
    assert state.runs[0].name == ENDPOINT
    steady(state, duration_s=1.0)
    state.tick(T0 + 1.0)
    assert [r.is_placeholder for r in state.runs] == [False]


def test_endpoint_error_and_detach() -> None:
    state = ViewerState(HOST)
    state.tick(T0)
    state.apply(EndpointState("tcp://bad:1", "error", "Invalid argument", None))
    state.tick(T0 + 1)
    (run,) = state.runs
    assert run.connection.state == "error"
    assert "Invalid argument" in run.connection.text
    assert "tcp://bad:1" in state.errors[-1].text
    state.apply(EndpointState("tcp://bad:1", "detached", "process ended", None))
    state.tick(T0 + 2)
    assert state.runs == ()


def test_live_then_stale_with_age() -> None:
    state = ViewerState(HOST)
    records = steady(state)
    last = records[-1].end_time + 0.01  # when the last Steps message arrived
    state.tick(last + 1.0)
    assert state.selected is not None
    assert state.selected.connection.state == "live"
    state.tick(last + 12.5)
    connection = state.selected.connection
    assert connection.state == "stale"
    assert connection.age_s == pytest.approx(12.5)
    assert connection.text == "stale: no message for 12s"


def test_stale_needs_more_than_three_seconds() -> None:
    state = ViewerState(HOST)
    records = steady(state)
    last = records[-1].end_time + 0.01
    state.tick(last + 3.0)
    assert state.selected is not None and state.selected.connection.state == "live"
    state.tick(last + 3.1)
    assert state.selected.connection.state == "stale"


def test_exited_with_reason() -> None:
    state = ViewerState(HOST)
    steady(state)
    state.apply(received(bye(reason="KeyboardInterrupt", steps=2400), T0 + 21))
    state.tick(T0 + 30)
    run = state.selected
    assert run is not None
    assert run.connection.state == "exited"
    assert run.connection.text == "exited: KeyboardInterrupt after 2,400 steps"
    assert run.connection.age_s == pytest.approx(9.0)


def test_a_new_hello_after_bye_is_a_restart() -> None:
    state = ViewerState(HOST)
    steady(state)
    state.apply(received(bye(), T0 + 21))
    state.apply(received(hello(started=T0 + 22), T0 + 22))
    state.tick(T0 + 22.5)
    assert state.selected is not None and state.selected.connection.state == "live"


def test_incompatible_shows_both_versions_and_lists_the_error() -> None:
    state = ViewerState(HOST)
    newer = (PROTOCOL_MAJOR + 1, 3)
    event = incompatible(T0, theirs=newer)
    state.apply(event)
    state.tick(T0 + 1)
    run = state.selected
    assert run is not None
    assert run.key == SOURCE_ID
    assert run.connection.state == "incompatible"
    assert f"{PROTOCOL_MAJOR + 1}.3" in run.connection.text
    assert f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}" in run.connection.text
    assert run.theirs == newer
    assert event.text in state.errors[-1].text
    assert state.errors[-1].source == SOURCE_ID
    assert "upgrade this gputop" in state_module.upgrade_advice(newer)
    assert "training environment" in state_module.upgrade_advice((0, 9))


def test_publishers_are_counted_by_kind() -> None:
    """What the exporter's gputop_exporter_sources reports: a run, an agent and a peer
    it cannot read are three kinds, not one count that reads as three runs."""
    state = ViewerState(HOST)
    assert state.source_kinds() == {"run": 0, "node": 0, "incompatible": 0}
    state.apply(received(hello(), T0))
    state.apply_all(agent_only(T0 + 1, host="node2"))
    state.apply(incompatible(T0 + 2, hint="node3:77"))
    assert state.source_kinds() == {"run": 1, "node": 1, "incompatible": 1}
    state.apply(received(bye(), T0 + 3))
    assert state.source_kinds()["run"] == 1  # ended, kept while it is shown


def test_incompatible_peer_without_a_source_hint_still_shows() -> None:
    state = ViewerState(HOST)
    state.apply(incompatible(T0, theirs=(PROTOCOL_MAJOR + 2, 0), hint=None))
    state.tick(T0)
    (run,) = state.runs
    assert run.connection.state == "incompatible"
    assert f"{PROTOCOL_MAJOR + 2}.0" in run.name


def test_valid_message_clears_incompatible() -> None:
    state = ViewerState(HOST)
    state.apply(incompatible(T0))
    state.apply(received(hello(), T0 + 1))
    state.tick(T0 + 1)
    assert state.selected is not None and state.selected.connection.state == "live"


def test_bad_input_is_listed_without_creating_a_run() -> None:
    state = ViewerState(HOST)
    state.apply(BadInput("malformed message ignored: not msgpack", T0, None, None))
    state.apply(BadInput("malformed message ignored: bad field", T0 + 1, None, "h:1"))
    state.tick(T0 + 2)
    assert state.runs == ()
    assert [e.text for e in state.errors] == [
        "malformed message ignored: not msgpack",
        "h:1: malformed message ignored: bad field",
    ]
    assert state.error_count == 2


def test_errors_are_bounded_but_counted() -> None:
    state = ViewerState(HOST)
    for i in range(state_module.MAX_ERRORS + 5):
        state.apply(BadInput(f"bad {i}", T0 + i))
    assert len(state.errors) == state_module.MAX_ERRORS
    assert state.errors[-1].text == f"bad {state_module.MAX_ERRORS + 4}"
    assert state.error_count == state_module.MAX_ERRORS + 5


# ---------------------------------------------------------------- throughput


def test_the_average_is_over_the_training_loops_time_not_an_evaluations() -> None:
    """20 s of steps at 100 samples/s, 25 s outside the loop, 20 s more: the average was
    over the wall time since the first step (frozen during the evaluation, then 62), and
    "now" read as a speed-up against it. (The rows' path sums the same time:
    test_ingest_rows.)"""
    state = ViewerState(HOST)
    first = step_records(T0, 20.0)
    second = step_records(T0 + 45.0, 20.0, first_index=len(first))
    state.apply(received(hello(started=T0), T0))
    state.apply_all([*steps_events(first), *steps_events(second)])
    state.tick(T0 + 65.05)
    run = state.selected
    assert run is not None and run.rate_avg == pytest.approx(100.0, rel=0.01)


def test_a_step_longer_than_the_history_counts_whole_in_the_average() -> None:
    """A first step of 900 s (compiling), then 100 s at 100 samples/s: the buckets keep
    the part of the long step inside the 300 s history; the average counts all of it."""
    state = ViewerState(HOST)
    state.apply(received(hello(started=T0), T0))
    first = StepRecord(index=0, end_time=T0 + 900.0, period_s=900.0, wait_s=None, samples=25)
    rest = step_records(T0 + 900.0, 100.0, first_index=1)
    state.apply_all(steps_events((first, *rest)))
    state.tick(T0 + 1000.05)
    run = state.selected
    assert run is not None
    assert run.rate_avg == pytest.approx(25 * (1 + len(rest)) / 1000.0, rel=0.01)


def test_steady_throughput_and_wait_share() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=20.0)
    state.tick(T0 + 20.05)
    run = state.selected
    assert run is not None
    assert run.unit == SAMPLES_UNIT
    assert run.rate_now == pytest.approx(100.0)
    assert run.rate_avg == pytest.approx(100.0)
    assert run.wait_share_now == pytest.approx(0.7)
    assert run.device_busy_now == pytest.approx(0.27)
    assert run.step_count == 80
    points = state.throughput()
    assert len(points) == 40  # 20 s of half-second buckets, all closed by the last step
    assert all(p.samples_per_s == pytest.approx(100.0) for p in points)
    assert all(p.wait_share == pytest.approx(0.7) for p in points)
    assert [p.end for p in points[:2]] == [T0 + 0.5, T0 + 1.0]


def test_slow_steps_are_spread_over_the_time_they_took() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=20.0, samples_per_s=12.5)  # 25 samples every 2 s
    state.tick(T0 + 20.05)
    points = state.throughput()
    assert len(points) >= 38
    assert all(p.samples_per_s == pytest.approx(12.5) for p in points)
    assert state.selected is not None and state.selected.rate_now == pytest.approx(12.5)


def test_steps_per_second_when_the_probe_has_no_batch_size() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=10.0, batch=None, wait_share=None)
    state.tick(T0 + 10.05)
    run = state.selected
    assert run is not None
    assert run.unit == STEPS_UNIT
    assert run.rate_now == pytest.approx(4.0)
    assert run.wait_share_now is None
    assert state.throughput()[-1].rate(STEPS_UNIT) == pytest.approx(4.0)


def test_time_between_records_is_time_without_progress() -> None:
    state = ViewerState(HOST)
    first = step_records(T0 + 0.25, 5.0)  # starts mid-bucket: the first point is still 100
    second = step_records(T0 + 8.0, 5.0, first_index=100)
    state.apply_all(steps_events(first + second))
    state.tick(T0 + 13.05)
    points = state.throughput()
    assert points[0].samples_per_s == pytest.approx(100.0)
    gap = [p for p in points if T0 + 5.5 < p.end <= T0 + 8.0]
    assert len(gap) == 5 and all(p.samples_per_s == 0.0 for p in gap)
    assert all(p.wait_share is None and not p.pending for p in gap)
    edge = next(p for p in points if p.end == T0 + 5.5)  # half covered by the first run
    assert edge.samples_per_s == pytest.approx(50.0)
    assert state.selected is not None
    assert state.selected.step_count == 120  # the index counts, not the records seen


def test_a_stall_shows_as_pending_zero_points_and_lowers_the_rate() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=10.0)
    for t in range(11, 21):  # the process lives on (hello every second), no step ends
        state.apply(received(hello(), T0 + t))
    state.tick(T0 + 20.0)
    points = state.throughput()
    pending = [p for p in points if p.pending]
    assert len(pending) >= 15
    assert all(p.samples_per_s == 0.0 for p in pending[1:])
    assert state.selected is not None and state.selected.rate_now == pytest.approx(0.0)
    assert state.selected.rate_avg == pytest.approx(100.0)


def test_no_stall_for_an_ordinary_pause_between_steps() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=10.0)
    state.tick(T0 + 10.6)  # 0.6 s after the last step: less than a second
    assert not any(p.pending for p in state.throughput())


def test_no_stall_while_the_newest_steps_are_still_on_their_way() -> None:
    """At a refresh the newest step a viewer holds can be as old as the probe's flush
    period (0.5 s from 100 steps/s) and the viewer's gather (half its refresh) make it,
    and a tick comes late: no zero points for that (a review measured 0.81 s against the
    real demo, where the threshold was 1 s)."""
    from gputop_dl.probe.core import BATCH_FLUSH_S
    from gputop_dl.tui.cli import DEFAULT_REFRESH_HZ
    from gputop_dl.tui.source import gather_for

    state = ViewerState(HOST)
    steady(state, duration_s=10.0)
    late_tick = 0.25
    state.tick(T0 + 10.0 + BATCH_FLUSH_S + gather_for(DEFAULT_REFRESH_HZ) + late_tick)
    assert not any(p.pending for p in state.throughput())
    state.tick(T0 + 12.0)  # two seconds without a step: shown
    assert any(p.pending for p in state.throughput())


def test_out_of_order_records_are_ignored() -> None:
    state = ViewerState(HOST)
    records = step_records(T0, 5.0)
    state.apply_all(steps_events(records))
    state.apply(received(Steps(SOURCE_ID, records[:5], 99, 0), T0 + 6))
    state.tick(T0 + 6)
    assert state.selected is not None
    assert state.selected.rate_avg == pytest.approx(100.0)
    assert len(state.steps()) == len(records)


def test_lost_messages_count_only_since_the_viewer_attached() -> None:
    state = ViewerState(HOST)
    records = step_records(T0, 2.0)
    state.apply(received(Steps(SOURCE_ID, records[:4], 10, 40, 3), T0 + 1.0))
    state.apply(received(Steps(SOURCE_ID, records[4:], 11, 45, 7), T0 + 2.0))
    state.tick(T0 + 2.0)
    run = state.selected
    assert run is not None
    assert (run.lost_messages, run.lost_steps) == (5, 4)


# ---------------------------------------------------------------- bounds


def test_ring_buffers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "MAX_STEP_RECORDS", 50)
    state = ViewerState(HOST, history_s=10.0)
    steady(state, duration_s=60.0)
    state.apply_all(systems_events(T0, T0 + 100, with_processes=False))
    state.tick(T0 + 60.05)
    assert len(state.throughput()) == 20  # 10 s of half-second points
    assert state.throughput()[-1].end == pytest.approx(T0 + 60.0)
    assert len(state.steps()) == 50
    assert len(state.host_history(HOST)) == 60  # at least a minute of samples is kept
    assert state.host_system() is not None
    assert state.host_system().time == T0 + 100  # type: ignore[union-attr]
    assert state.selected is not None and state.selected.rate_avg == pytest.approx(100.0)


def test_histories_cover_their_time_not_a_count_of_samples() -> None:
    """A source sampling every 5 s kept 300 samples (25 minutes, growing all along):
    histories are bounded in time as well as in count."""
    state = ViewerState(HOST, history_s=300.0)
    every_second = systems_events(T0, T0 + 3000, with_processes=False)
    state.apply_all(every_second[::5])
    history = state.host_history(HOST)
    assert history[-1].time - history[0].time <= 300.0
    assert len(history) == 61
    source = next(iter(state._sources.values()))
    assert source.systems[-1].time - source.systems[0].time <= run_module.OWN_SAMPLES_S


def test_old_step_records_are_dropped_but_the_totals_kept() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=200.0)
    state.tick(T0 + 200.05)
    steps = state.steps()
    assert steps[0].end_time >= T0 + 200.0 - run_module.STEP_KEEP_S
    assert state.selected is not None
    assert state.selected.step_count == 800
    assert state.selected.rate_avg == pytest.approx(100.0)


def test_a_very_long_step_does_not_blow_up_the_buckets() -> None:
    state = ViewerState(HOST, history_s=10.0)
    record = StepRecord(0, T0 + 3600.0, 3600.0, 0.0, 32)
    state.apply(received(Steps(SOURCE_ID, (record,), 0, 0), T0 + 3600.0))
    state.tick(T0 + 3600.0)
    assert len(state.throughput()) <= 20


# ---------------------------------------------------------------- runs


def three_runs(state: ViewerState) -> None:
    for source_id, rank in (("b:2", 2), ("a:0", 0), ("c:1", 1)):
        state.apply(received(hello(source_id, rank=rank, host=source_id[0]), T0))


def test_runs_are_ordered_by_name_and_rank_and_switch() -> None:
    state = ViewerState(HOST)
    three_runs(state)
    state.tick(T0)
    assert [r.rank for r in state.runs] == [0, 1, 2]
    assert [r.label for r in state.runs] == ["resnet50 · r0", "resnet50 · r1", "resnet50 · r2"]
    assert state.selected_index == 0
    state.select_next()
    assert state.selected is not None and state.selected.rank == 1
    state.select_next()
    state.select_next()
    assert state.selected.rank == 0  # wraps around
    state.select_previous()
    assert state.selected.rank == 2
    assert state.select(1)
    assert state.selected.rank == 1
    assert not state.select(8)
    assert state.selected.rank == 1


def test_a_new_run_takes_a_new_slot_and_renumbers_nothing() -> None:
    state = ViewerState(HOST)
    three_runs(state)
    state.tick(T0)
    state.select(1)
    before = [(r.key, r.slot) for r in state.runs]
    state.apply(received(hello("z:9", name="alexnet", rank=0), T0 + 1))
    state.tick(T0 + 1)
    assert state.selected is not None
    assert (state.selected.name, state.selected.rank) == ("resnet50", 1)
    assert state.selected_index == 1
    assert [(r.key, r.slot) for r in state.runs][:3] == before
    assert (state.runs[3].key, state.runs[3].slot) == ("z:9", 3)


def capture_windows(monkeypatch: pytest.MonkeyPatch, verdict: Verdict) -> list[Window]:
    """The windows the state hands the analyzer from now on (which answers ``verdict``)."""
    windows: list[Window] = []

    def fake_analyze(window: Window, previous: Verdict | None = None) -> Verdict:
        windows.append(window)
        return verdict

    monkeypatch.setattr(state_module, "analyze", fake_analyze)
    return windows


def test_the_window_says_when_the_run_s_first_step_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The analyzer is told where the loop began: host samples before it saw start-up."""
    windows = capture_windows(monkeypatch, Verdict("ok", "ok", 1.0, "ok"))
    start = NOW - 10.0  # the process started; its first step starts 4 s later
    first_step = start + 4.0
    state = ViewerState(HOST)
    events = [received(hello(started=start), start)]
    events += systems_events(start + 1.0, NOW - 0.5)
    events += steps_events(step_records(first_step, NOW - first_step - 0.05))
    events.sort(key=lambda e: e.received if isinstance(e, Received) else 0.0)
    state.apply_all(events)
    state.tick(NOW)
    (window,) = windows
    assert window.run_from == pytest.approx(first_step)


def test_panels_follow_the_selected_run_host() -> None:
    state = ViewerState("viewer-host")
    state.apply_all(live_run(NOW, source_id="node-a:1", host="node-a", rank=0))
    state.apply_all(live_run(NOW, source_id="node-b:1", host="node-b", rank=1))
    state.tick(NOW)
    assert state.display_host() == "node-a"
    state.select_next()
    assert state.display_host() == "node-b"
    assert state.host_system() is not None
    assert state.host_system().host == "node-b"  # type: ignore[union-attr]


def test_run_appears_from_steps_before_its_hello() -> None:
    state = ViewerState(HOST)
    state.apply_all(steps_events(step_records(T0, 2.0)))
    state.tick(T0 + 2)
    assert state.selected is not None
    assert state.selected.name == SOURCE_ID
    assert state.selected.host == HOST  # from the source id
    state.apply(received(hello(), T0 + 2.5))
    state.tick(T0 + 2.5)
    assert state.selected.name == "resnet50"
    assert state.selected.world_size == 8
    assert state.selected.uptime_s == pytest.approx(2.5)


# ---------------------------------------------------------------- hosts without a probe


def test_agent_only_is_a_plain_top() -> None:
    state = ViewerState(HOST)
    state.apply_all(agent_only(NOW))
    state.tick(NOW)
    assert state.runs == ()
    assert not state.has_probe
    assert state.selected is None
    assert state.display_host() == HOST
    system = state.host_system()
    assert system is not None and len(system.gpus) == 8
    assert state.training_processes() is None
    assert "probe.watch(loader)" in INSTRUMENT_HINT


def test_an_agent_defers_to_a_probe_sampling_the_same_host() -> None:
    state = ViewerState(HOST)
    state.apply_all(agent_only(T0 + 10))  # host samples up to T0 + 9.5
    state.apply(received(hello(), T0 + 10))
    probe_sample = system_sample(T0 + 10.2)
    state.apply(received(System(SOURCE_ID, probe_sample), T0 + 10.3))
    agent_sample = evolve(system_sample(T0 + 10.5, with_processes=False), host=HOST)
    state.apply(received(System(f"{HOST}:999", agent_sample), T0 + 10.6))
    state.tick(T0 + 10.7)
    assert state.host_system() is probe_sample
    # Once the probe has been quiet for a while the agent's samples count again.
    later = system_sample(T0 + 20, with_processes=False)
    state.apply(received(System(f"{HOST}:999", later), T0 + 20))
    assert state.host_system() is later


def test_training_processes_come_from_the_selected_run() -> None:
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW, workers=6))
    state.tick(NOW)
    processes = state.training_processes()
    assert processes is not None and processes.worker_count == 6


# ---------------------------------------------------------------- analyzer


def test_analyzer_gets_a_window_per_live_run(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = Verdict("input-bound", "warning", 0.9, "Input-bound", cause="few-workers")
    windows = capture_windows(monkeypatch, verdict)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.tick(NOW)
    (window,) = windows
    assert window.now == NOW
    assert window.hello is not None and window.hello.name == "resnet50"
    assert window.steps and window.steps[0].end_time >= NOW - run_module.ANALYSIS_WINDOW_S
    assert window.steps[-1].end_time <= NOW
    assert window.systems and all(s.time >= NOW - 30 for s in window.systems)
    assert state.selected is not None and state.selected.verdict is not None
    assert state.selected.verdict.kind == "input-bound"
    # Not analyzed again once the run has exited: the last verdict stays.
    state.apply(received(bye(), NOW + 0.5))
    state.tick(NOW + 1)
    assert len(windows) == 1
    assert state.selected.verdict.kind == "input-bound"


def test_a_rank_without_host_sampling_gets_host_samples_with_its_own_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows: list[Window] = []

    def record(window: Window, previous: Verdict | None = None) -> Verdict:
        windows.append(window)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))  # rank 0 samples the host, with 4 workers
    rank1 = "gpu-node-07:5001"
    state.apply(received(hello(rank1, rank=1, pid=5001, host_sampler=False), NOW - 5))
    own = evolve(system_sample(NOW - 1, workers=2), host_sampled=False, cpu=None, gpus=())
    state.apply(received(System(rank1, own), NOW - 0.9))
    state.apply_all(steps_events(step_records(NOW - 5, 4.9), rank1))
    state.tick(NOW)
    rank1_window = next(w for w in windows if w.hello is not None and w.hello.rank == 1)
    assert rank1_window.systems
    assert all(s.host_sampled and s.cpu is not None for s in rank1_window.systems)
    assert all(s.processes is not None for s in rank1_window.systems)
    assert {s.processes.worker_count for s in rank1_window.systems} == {2}  # type: ignore[union-attr]


def test_an_analyzer_failure_is_shown_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(window: Window, previous: Verdict | None = None) -> Verdict:
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(state_module, "analyze", broken)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.tick(NOW)
    state.tick(NOW + 0.5)
    assert state.selected is not None and state.selected.verdict is not None
    assert state.selected.verdict.kind == "error"
    assert "ZeroDivisionError" in state.errors[-1].text
    assert state.error_count == 1  # the same failure is listed once


def test_a_run_first_seen_stale_is_judged_as_of_its_last_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nows: list[float] = []

    def record(window: Window, previous: Verdict | None = None) -> Verdict:
        nows.append(window.now)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    state = ViewerState(HOST)
    records = steady(state)
    state.tick(records[-1].end_time + 30)
    assert nows == [pytest.approx(records[-1].end_time + 0.01, abs=1e-6)]


def test_hello_only_updates_uptime_from_started() -> None:
    state = ViewerState(HOST)
    state.apply(received(Hello(SOURCE_ID, "probe", "tiny", HOST, 1, T0, "0.1.0"), T0 + 5))
    state.tick(T0 + 65)
    run = state.selected
    assert run is not None
    assert run.uptime_s == pytest.approx(65.0)
    assert run.rank is None
    assert run.label == "tiny"


# ---------------------------------------------------------------- verdicts over time


def _hanging(state: ViewerState, last: float, until: float, source_id: str = SOURCE_ID) -> None:
    """A hung training loop: no step, but the probe's own threads go on publishing its
    hello and a node sample every second."""
    at = last + 1.0
    while at <= until:
        state.apply(received(hello(source_id, started=T0), at))
        state.apply(received(System(source_id, system_sample(at)), at + 0.02))
        at += 1.0


def test_a_hang_longer_than_the_analysis_window_shows_as_stalled() -> None:
    state = ViewerState(HOST)
    records = steady(state, duration_s=20.0, samples_per_s=125.0)  # 0.2 s steps
    assert records[-1].period_s == pytest.approx(0.2)
    last = records[-1].end_time
    _hanging(state, last, last + 90.0)
    state.tick(last + 90.0)  # no step for 90 s: none in the last 30 s
    run = state.selected
    assert run is not None and run.connection.state == "live"
    assert run.verdict is not None
    assert run.verdict.kind == "stalled", run.verdict.headline
    assert "no step for 90 s; typical step 200 ms" in run.verdict.headline


def test_the_analyzer_always_gets_the_last_steps_however_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows: list[Window] = []

    def record(window: Window, previous: Verdict | None = None) -> Verdict:
        windows.append(window)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    state = ViewerState(HOST)
    records = steady(state, duration_s=20.0)
    last = records[-1].end_time
    _hanging(state, last, last + 600.0)
    state.tick(last + 600.0)
    (window,) = windows
    assert list(window.steps) == list(records[-run_module.MIN_WINDOW_STEPS :])


def test_a_viewer_attached_during_a_hang_sees_it_in_the_hello() -> None:
    state = ViewerState(HOST)
    last = T0 + 100.0
    progress = evolve(hello(started=T0), step_count=500, last_step_end=last, typical_period_s=0.2)
    for at in (last + 86.0, last + 88.0):
        state.apply(received(progress, at))
        state.apply(received(System(SOURCE_ID, system_sample(at)), at + 0.02))
    state.tick(last + 90.0)
    run = state.selected
    assert run is not None and run.verdict is not None
    assert run.verdict.kind == "stalled", run.verdict.headline


def _feed_and_watch(
    state: ViewerState,
    blocks: list[tuple[float, float]],
    *,
    skew: float = 0.0,
    source_id: str = SOURCE_ID,
) -> list[tuple[float, Verdict | None]]:
    """Feed steps in half-second slices, one (duration, wait share) block after the
    other, a node sample a second, ticking at each slice. Times in the probe's clock are
    ``skew`` ahead of the viewer's. Returns (viewer time, shown verdict) per tick."""
    state.apply(received(hello(source_id, started=T0 + skew), T0))
    shown: list[tuple[float, Verdict | None]] = []
    start, index = T0, 0
    for duration, share in blocks:
        records = step_records(start + skew, duration, wait_share=share, first_index=index)
        index = records[-1].index + 1
        at = start
        while at < start + duration - 1e-9:
            at += 0.5
            batch = [r for r in records if at - 0.5 < r.end_time - skew <= at]
            if batch:
                state.apply(received(Steps(source_id, tuple(batch), 0, 0), at + 0.01))
            if abs(at - round(at)) < 1e-9:
                sample = system_sample(at + skew)
                state.apply(received(System(source_id, sample), at + 0.02))
            state.tick(at + 0.02)
            run = state.selected
            shown.append((at, run.verdict if run is not None else None))
        start += duration
    return shown


def test_a_share_oscillating_around_a_threshold_keeps_its_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The data wait swings between 24 % and 17 %: around the 20 % entry threshold of a
    # warning, above its 15 % exit threshold. Once shown, the warning must stay.
    assert INPUT_WARN_EXIT < 0.17 < INPUT_WARN_ENTER < 0.24
    raw: list[Verdict] = []
    real_analyze = state_module.analyze

    def spy(window: Window, previous: Verdict | None = None) -> Verdict:
        raw.append(analyze(window))  # what the analyzer says without hysteresis
        return real_analyze(window, previous=previous)

    monkeypatch.setattr(state_module, "analyze", spy)
    state = ViewerState(HOST)
    shown = _feed_and_watch(state, [(10.0, 0.24), (10.0, 0.17)] * 3)
    kinds = [(v.kind, v.severity) for _, v in shown if v is not None]
    first = kinds.index(("input-bound", "warning"))
    assert first < 20  # shown within the first block
    assert set(kinds[first:]) == {("input-bound", "warning")}
    # Without the previous verdict the 17 % blocks read as a milder verdict: the test
    # does cross the threshold.
    assert ("input-bound", "info") in {(v.kind, v.severity) for v in raw}


@pytest.mark.parametrize("skew", [120.0, -120.0])
def test_a_probe_with_a_skewed_clock_is_stalled_only_when_its_steps_stop(skew: float) -> None:
    state = ViewerState(HOST)
    shown = _feed_and_watch(state, [(20.0, 0.7)], skew=skew)
    assert all(v is None or v.kind != "stalled" for _, v in shown)
    run = state.selected
    assert run is not None and run.verdict is not None
    assert run.verdict.kind == "input-bound"
    uptime = run.uptime_s
    # The loop hangs; the probe goes on sending its hello and samples.
    last = T0 + 20.0
    for at in range(1, 41):
        state.apply(received(hello(started=T0 + skew), last + at))
        state.apply(received(System(SOURCE_ID, system_sample(last + at + skew)), last + at))
        state.tick(last + at + 0.02)
        run = state.selected
        assert run is not None and run.verdict is not None
        if at <= 5:  # short of the 10 s minimum of a stall
            assert run.verdict.kind != "stalled"
    assert run.verdict.kind == "stalled", run.verdict.headline
    assert "no step for 40 s" in run.verdict.headline
    assert uptime == pytest.approx(20.0, abs=0.6)  # it started 20 s ago, in its own clock


# ---------------------------------------------------------------- wire values made safe


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("resnet50", "resnet50"),
        ("train.py · r1", "train.py · r1"),
        ("\x1b]0;pwned\x07name", "]0;pwnedname"),  # OSC: retitle the terminal
        ("\x1b[2J\x1b[Hx", "[2J[Hx"),  # clear the screen, home the cursor
        ("a\nb\tc\rd", "a b c d"),  # no extra lines in a one-line header
        ("\u202eevil", "evil"),  # right-to-left override reorders the line
        ("zero\u200bwidth", "zerowidth"),
        ("\x00\x07\x08\x7f", ""),
        ("\x9b31m", "31m"),  # C1 CSI
        ("日本語 ok", "日本語 ok"),
        ("x" * 500, "x" * 199 + "…"),
    ],
)
def test_wire_strings_lose_their_control_characters(raw: str, shown: str) -> None:
    assert clean_text(raw) == shown


GOOD = StepRecord(index=3, end_time=T0, period_s=0.1, wait_s=0.05, samples=32, device_s=0.04)


@pytest.mark.parametrize(
    ("changes", "kept"),
    [
        ({}, True),
        ({"end_time": math.inf}, False),
        ({"end_time": math.nan}, False),
        ({"end_time": 1e308}, False),
        ({"end_time": T0 + 2 * 86_400}, False),  # a clock more than a day off
        ({"end_time": T0 - 3_600}, True),  # an hour off: a skewed clock, kept
        ({"period_s": -0.1}, False),
        ({"period_s": math.nan}, False),
        ({"wait_s": -0.01}, False),
        ({"wait_s": 0.5}, False),  # waiting longer than the whole step
        ({"wait_s": 0.1005}, True),  # rounding: cut to the period
        ({"device_s": -1.0}, False),  # "device idles 10000 % of each step"
        ({"device_idle_s": -1.0}, False),
        ({"samples": -5}, False),
        ({"index": -1}, False),
        ({"phases": (("forward", -1.0),)}, False),
        ({"wait_s": None, "device_s": None, "samples": None}, True),
    ],
)
def test_step_records_with_impossible_values_are_dropped(
    changes: dict[str, object], kept: bool
) -> None:
    record = evolve(GOOD, **changes)  # type: ignore[arg-type]
    cleaned = clean_step(record, T0)
    assert (cleaned is not None) == kept
    if cleaned is not None and cleaned.wait_s is not None:
        assert cleaned.wait_s <= cleaned.period_s


def test_hostile_sample_sizes_are_clamped_and_strings_cleaned() -> None:
    sample = system_sample(T0)
    many = CpuSample(tuple(CpuCore(i, 1.0, 1.0, 0.0, 0.0, 98.0) for i in range(30_000)), None)
    disks = tuple(DiskSample(f"sd\x1b[2J{i}", 1.0, 1.0, 1.0, 1.0, 1.0) for i in range(5_000))
    cleaned = clean_sample(evolve(sample, cpu=many, disks=disks, host="node\x1b]0;x\x07"), T0)
    assert cleaned is not None and cleaned.cpu is not None
    assert len(cleaned.cpu.cores) == MAX_CORES
    assert len(cleaned.disks) <= 64 and all(d.device.isprintable() for d in cleaned.disks)
    assert cleaned.host.isprintable()
    assert clean_sample(sample, T0) is sample  # a sane sample is not copied
    # Any user on the node names their processes: `prctl(PR_SET_NAME)` takes 15 bytes.
    top = (TopProcess(7, 1, "\x1b[2J\x1b[H", 99.0, 1), TopProcess(8, 1, "\x1b]0;pwned\x07", 1.0, 1))
    cleaned = clean_sample(evolve(sample, top=top * 200), T0)
    assert cleaned is not None and cleaned.top is not None
    assert [p.name for p in cleaned.top[:2]] == ["[2J[H", "]0;pwned"]
    assert len(cleaned.top) == 256
    # When the table was read: from the viewer's day, and not after its sample.
    for top_time, kept in ((T0 - 300.0, True), (1.0, False), (T0 + 5.0, False), (T0, True)):
        cleaned = clean_sample(evolve(sample, top_time=top_time), T0)
        assert cleaned is not None and (cleaned.top_time == top_time) == kept
    assert clean_sample(evolve(sample, time=1e308), T0) is None
    assert clean_sample(evolve(sample, interval_s=-1.0), T0) is None


def test_a_lost_accelerators_error_text_is_cleaned() -> None:
    """A lost GPU's or HPU's row shows its error, a string from the wire: an escape in it
    reached the terminal (clear the screen, retitle it, a C1 CSI, a bidi override)."""
    sample = system_sample(T0, lost=(1,), hpu_count=2)
    evil = "x\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eZ" + "y" * 1000
    gpus = list(sample.gpus)
    gpus[1] = evolve(gpus[1], error=evil)
    hpus = tuple(evolve(h, state="lost", error=evil) for h in sample.hpus)
    cleaned = clean_sample(evolve(sample, gpus=tuple(gpus), hpus=hpus), T0)
    assert cleaned is not None
    errors = [d.error for d in cleaned.gpus if d.error is not None]
    errors += [d.error for d in cleaned.hpus if d.error is not None]
    assert len(errors) == 3
    assert all(e.isprintable() and len(e) <= 200 and e.startswith("x[2J]0;pwned") for e in errors)


def test_a_sample_from_year_3e300_is_dropped_and_counted_not_a_crash() -> None:
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.apply(received(System(SOURCE_ID, evolve(system_sample(NOW), time=1e308)), NOW))
    bad_steps = (evolve(GOOD, index=10_000, end_time=NOW, device_s=-5.0),)
    state.apply(received(Steps(SOURCE_ID, bad_steps, 999, 0), NOW))
    state.tick(NOW + 0.5)
    assert state.selected is not None and state.selected.connection.state == "live"
    texts = [e.text for e in state.errors]
    assert any("system samples with impossible values" in t for t in texts)
    assert any("step records with impossible values" in t for t in texts)
    assert state.error_count >= 2
    assert state.selected.last_step_index != 10_000


def test_escape_sequences_in_names_never_reach_the_summary() -> None:
    state = ViewerState(HOST)
    evil = evolve(hello(), name="\x1b]0;owned\x07\x1b[2Jrun", host="h\x1b[31m")
    state.apply(received(evil, T0))
    state.apply(received(Bye(SOURCE_ID, "crash\x1b[2J\nnow", 5), T0 + 1))
    state.apply(BadInput("bad \x1b[2J thing", T0 + 1, None, "x\x1b[1m:1"))
    state.tick(T0 + 1)
    run = state.selected
    assert run is not None
    for text in (run.name, run.label, run.host or "", run.connection.text):
        assert text.isprintable(), text
    assert all(e.text.isprintable() for e in state.errors)


# ---------------------------------------------------------------- probe facts in the window


def _windows(monkeypatch: pytest.MonkeyPatch) -> list[Window]:
    windows: list[Window] = []

    def record(window: Window, previous: Verdict | None = None) -> Verdict:
        windows.append(window)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    return windows


def test_loop_messages_update_the_hello_the_analyzer_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows = _windows(monkeypatch)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.apply(received(Loop(SOURCE_ID, "outside", NOW - 0.2, 5_000, "exhausted"), NOW - 0.1))
    state.tick(NOW)
    hello_seen = windows[-1].hello
    assert hello_seen is not None
    assert (hello_seen.loop, hello_seen.loop_since, hello_seen.loop_exit) == (
        "outside",
        NOW - 0.2,
        "exhausted",
    )
    assert state.selected is not None and state.selected.loop == "outside"
    # A later hello that says "in-loop" since after the Loop message wins.
    newer = evolve(hello(started=NOW - 60), loop="in-loop", loop_since=NOW + 0.5)
    state.apply(received(newer, NOW + 0.6))
    state.tick(NOW + 1.0)
    assert windows[-1].hello is not None and windows[-1].hello.loop == "in-loop"


def test_replayed_history_is_not_counted_twice() -> None:
    state = ViewerState(HOST)
    records = steady(state, duration_s=20.0)
    state.tick(T0 + 20.1)
    before = state.selected
    # A new subscriber triggers the probe's replay of its last 120 s: same indices again.
    state.apply_all(steps_events(records, latency_s=0.5))
    state.tick(T0 + 20.1)
    after = state.selected
    assert before is not None and after is not None
    assert after.step_count == before.step_count == len(records)
    assert after.last_step_index == records[-1].index
    assert after.rate_avg == before.rate_avg
    assert len(state.steps()) == len(records)


@pytest.mark.parametrize("wire", [False, True], ids=["records", "wire rows"])
def test_a_replay_that_live_steps_overtook_is_taken_whole(wire: bool) -> None:
    """A viewer attaching through a relay (or in the instant the probe hears of it) can
    get a live step before the replay of the probe's history: the replay must not be
    dropped as older, or the graph stays empty and the verdict waits for new steps."""
    state = ViewerState(HOST)
    state.apply(received(hello(started=T0), T0 + 20.0))
    records = step_records(T0, 20.0)  # 80 steps of 0.25 s, 100 samples/s
    live, replay = records[-3:], steps_events(records, latency_s=0.05, flush_s=2.0)
    events = [*steps_events(live, latency_s=0.01), *replay]
    if wire:  # as decoded from the wire: rows, not StepRecords
        events = [
            Received(decode(encode(event.message)), event.received)
            for event in events
            if isinstance(event, Received)
        ]
    state.apply_all(events)
    state.tick(T0 + 20.1)
    run = state.selected
    assert run is not None
    assert run.step_count == len(records) and run.last_step_index == records[-1].index
    assert [r.index for r in state.steps()] == [r.index for r in records]
    assert run.rate_avg is not None and run.rate_avg == pytest.approx(100.0, rel=0.02)
    points = state.throughput()
    assert points and points[0].end <= T0 + 1.0  # the graph reaches back to the start


def test_a_replay_of_steps_held_and_trimmed_changes_nothing() -> None:
    """A run followed for minutes (its old steps trimmed) that sees another viewer's
    replay of older steps keeps what it has: nothing is forgotten, nothing counted twice."""
    state = ViewerState(HOST)
    records = steady(state, duration_s=100.0)  # older steps trimmed from the log
    state.tick(T0 + 100.1)
    before = state.selected
    held = state.steps()
    assert before is not None and len(held) < len(records)
    state.apply_all(steps_events(records[-200:], latency_s=0.5))  # begins before the held
    state.tick(T0 + 100.1)
    after = state.selected
    assert after is not None
    assert after.step_count == before.step_count and after.rate_avg == before.rate_avg
    assert state.steps() == held


def test_each_rank_is_judged_on_its_own_node(monkeypatch: pytest.MonkeyPatch) -> None:
    windows = _windows(monkeypatch)
    state = ViewerState("viewer-host")
    state.apply_all(live_run(NOW, source_id="node1:100", host="node1"))
    state.apply_all(live_run(NOW, source_id="node2:200", host="node2", rank=8, core_count=8))
    rank9 = "node2:201"
    state.apply(received(hello(rank9, rank=9, pid=201, host="node2", host_sampler=False), NOW - 5))
    state.apply_all(steps_events(step_records(NOW - 5, 4.9), rank9))
    state.tick(NOW)
    by_rank = {w.hello.rank: w for w in windows if w.hello is not None}
    assert {s.host for s in by_rank[0].systems} == {"node1"}
    assert {s.host for s in by_rank[8].systems} == {"node2"}
    assert {s.host for s in by_rank[9].systems} == {"node2"}  # its node's sampler, not node1's
    assert all(s.cpu is not None and len(s.cpu.cores) == 8 for s in by_rank[9].systems)


# ---------------------------------------------------------------- ends


class Pids:
    """The pid check, at its boundary: which pids exist, and how often it was asked."""

    def __init__(self) -> None:
        self.alive: set[int] = set()
        self.asked = 0

    def __call__(self, pid: int, started: float | None) -> bool:
        self.asked += 1
        return pid in self.alive


def test_a_killed_local_run_shows_as_gone_within_three_seconds() -> None:
    pids = Pids()
    pids.alive.add(4242)
    state = ViewerState(HOST, pid_alive=pids)
    state.apply_all(live_run(NOW))
    state.tick(NOW)
    assert state.selected is not None and state.selected.connection.state == "live"
    assert state.selected.rate_now is not None
    pids.alive.clear()  # kill -9: no bye
    for at in (NOW + 0.5, NOW + 1.0, NOW + 1.5, NOW + 2.0, NOW + 2.5):
        state.tick(at)
    assert state.selected.connection.state == "exited"
    assert state.selected.connection.text == GONE_TEXT
    assert pids.asked <= 4  # at most once a second
    # gone: no rate "now" (its last points are from before it stopped), the average stays
    assert state.selected.rate_now is None and state.selected.rate_avg is not None


class Leftovers:
    """The leftover-workers check, at its boundary: which of the pids asked run still."""

    def __init__(self, running: set[int]) -> None:
        self.running = running
        self.asked: list[tuple[int, ...]] = []

    def __call__(self, pids: Sequence[int], started: float) -> tuple[int, ...]:
        self.asked.append(tuple(pids))
        return tuple(p for p in pids if p in self.running)


@pytest.mark.parametrize("end", ["killed", "bye"])
def test_an_ended_runs_orphaned_workers_are_named_until_gone(end: str) -> None:
    """A training killed while its workers ran worker_init_fn (torch's worker watches its
    parent only after it) leaves them running for good: the run's state names them and
    how to end them, until they are gone; a run whose workers went with it says nothing."""
    pids = Pids()
    pids.alive.add(4242)
    running = {5001, 5002}
    leftovers = Leftovers(running)
    state = ViewerState(HOST, pid_alive=pids, left_running=leftovers)
    state.apply_all(live_run(NOW))
    info = LoaderInfo("torch.DataLoader", num_workers=3, worker_pids=(5001, 5002, 5003))
    state.apply(received(replace(hello(started=NOW - 60, pid=4242), loader=info), NOW))
    state.tick(NOW)
    assert leftovers.asked == []  # not while it runs
    if end == "killed":
        pids.alive.clear()
    else:
        state.apply(received(bye(reason="signal SIGTERM"), NOW + 0.1))
    for at in (NOW + 0.5, NOW + 1.0, NOW + 1.5, NOW + 2.0, NOW + 2.5):
        state.tick(at)
    assert state.selected is not None and state.selected.connection.state == "exited"
    text = state.selected.connection.text
    assert text.endswith("; 2 of its DataLoader workers still running, orphaned: kill 5001 5002")
    running.clear()  # the user killed them
    for at in (NOW + 3.0, NOW + 3.5, NOW + 4.0, NOW + 5.0, NOW + 6.0):
        state.tick(at)
    assert "DataLoader" not in state.selected.connection.text
    assert leftovers.asked[-1] == (5001, 5002, 5003) and len(leftovers.asked) <= 8
    asked = len(leftovers.asked)
    state.tick(NOW + 10.0)
    assert len(leftovers.asked) == asked  # none left: not asked again


def test_left_running_finds_a_killed_parents_worker_and_nothing_else() -> None:
    """The real check: a worker forked by a parent killed with SIGKILL is found; a process
    older than the run (a reused pid), a zombie and a pid that does not exist are not."""
    started = time.time()
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while zombie_status(zombie.pid) != "zombie" and time.monotonic() < deadline:
            time.sleep(0.05)
        found = left_running([worker, 1, zombie.pid, 2**22 + 12345], started)
        assert found == (worker,), (found, worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        zombie.wait()
    deadline = time.monotonic() + 5
    while left_running([worker], started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_running([worker], started) == ()


def zombie_status(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None


@pytest.mark.parametrize("late", [0.05, 0.2])
@pytest.mark.parametrize("killed_after", [0.0, 0.25, 0.45])  # its last flush, 0.5 s apart
@pytest.mark.parametrize("phase", [0.0, 0.3, 0.6, 0.9])
def test_at_the_default_refresh_a_late_tick_does_not_skip_the_pid_check(
    killed_after: float, phase: float, late: float
) -> None:
    """The app's timer ticks once a second (cli.DEFAULT_REFRESH_HZ) on a fixed schedule:
    a tick now and then ``late``, so the next one comes that much early. Each tick still
    checks the pid: a check skipped there put the verdict 2 s after the run went quiet,
    ~3 s after a kill."""
    period = 1.0 / DEFAULT_REFRESH_HZ
    pids = Pids()
    pids.alive.add(4242)
    state = ViewerState(HOST, pid_alive=pids)
    events = live_run(NOW)
    state.apply_all(events)
    last = max(e.received for e in events if isinstance(e, Received))
    killed = last + killed_after
    gone_at = None
    for n in range(8):
        at = NOW - 3.0 + phase + n * period + (late if n % 2 else 0.0)
        if at >= killed:
            pids.alive.clear()
        state.tick(at)
        assert state.selected is not None
        if at >= killed and state.selected.connection.text == GONE_TEXT:
            gone_at = at
            break
    assert gone_at is not None
    # quiet for GONE_QUIET_S, then the next tick: within a period and its lateness
    assert gone_at - last <= GONE_QUIET_S + period + late


def test_a_gone_run_that_speaks_again_is_live() -> None:
    pids = Pids()
    state = ViewerState(HOST, pid_alive=pids)  # its pid is not visible from here
    state.apply_all(live_run(NOW))
    state.tick(NOW + 2.0)
    assert state.selected is not None and state.selected.connection.text == GONE_TEXT
    state.apply_all(steps_events(step_records(NOW + 2.0, 0.3, first_index=9_000)))
    state.tick(NOW + 2.4)
    assert state.selected.connection.state == "live"


@pytest.mark.parametrize(
    ("host", "silent_s", "expected"),
    [
        ("elsewhere", 2.0, "live"),
        ("elsewhere", 4.0, "stale"),
        ("elsewhere", 7.0, LOST),  # three hello periods
        (HOST, 7.0, "stale"),  # local: the pid says whether it is gone
    ],
)
def test_a_silent_remote_run_is_lost(host: str, silent_s: float, expected: str) -> None:
    state = ViewerState(HOST, pid_alive=None)
    state.apply_all(live_run(NOW, host=host))
    state.tick(NOW + silent_s)
    assert state.selected is not None
    assert state.selected.connection.state == expected
    assert (state.selected.rate_now is None) == (expected == LOST)


def test_bye_stays_exited_and_ended_runs_leave_after_a_minute_for_the_recent_list() -> None:
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.apply_all(live_run(NOW, source_id="elsewhere:7", host="elsewhere", name="bert"))
    state.apply(received(bye(), NOW + 0.1))
    state.tick(NOW + 30.0)
    assert {r.name: r.connection.state for r in state.runs} == {"resnet50": "exited", "bert": LOST}
    state.tick(NOW + 0.1 + REMOVE_AFTER_S + 1.0)
    assert [r.name for r in state.runs] == ["bert"]  # lost later: still fading
    assert [r.name for r in state.recent] == ["resnet50"]
    state.tick(NOW + 2 * REMOVE_AFTER_S)
    assert state.runs == ()
    assert [r.name for r in state.recent] == ["resnet50", "bert"]


def test_a_restarted_run_takes_over_the_slot_and_selection_of_the_dead_one() -> None:
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW, source_id=f"{HOST}:1", name="a"))
    state.apply_all(live_run(NOW, source_id=f"{HOST}:2", name="b"))
    state.apply_all(live_run(NOW, source_id=f"{HOST}:3", name="c"))
    state.tick(NOW)
    assert state.select(1) and state.selected is not None and state.selected.name == "b"
    state.apply(received(bye(f"{HOST}:2", reason="exception: OOM"), NOW + 1))
    state.tick(NOW + 2)
    state.apply_all(live_run(NOW + 20, source_id=f"{HOST}:9", name="b", duration_s=10))
    state.tick(NOW + 20)
    assert [(r.key, r.slot) for r in state.runs] == [
        (f"{HOST}:1", 0),
        (f"{HOST}:9", 1),
        (f"{HOST}:3", 2),
    ]
    assert state.selected is not None and state.selected.key == f"{HOST}:9"
    assert [r.key for r in state.recent] == [f"{HOST}:2"]


def test_the_same_source_id_started_again_is_a_fresh_run_in_the_same_slot() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=10.0)
    state.tick(T0 + 10)
    slot = state.runs[0].slot
    state.apply(received(hello(started=T0 + 100), T0 + 100))  # pid reused (containers: pid 1)
    state.apply_all(steps_events(step_records(T0 + 100, 2.0)))
    state.tick(T0 + 102.1)
    run = state.runs[0]
    assert (run.slot, run.step_count) == (slot, len(step_records(T0 + 100, 2.0)))


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([("a", "h", None, 1)], ["a"]),
        ([("a", "h", None, 1), ("b", "h", None, 2)], ["a", "b"]),
        ([("t", "h", 0, 1), ("t", "h", 1, 2)], ["t · r0", "t · r1"]),
        ([("t", "h", None, 1), ("t", "h", None, 2)], ["t · 1", "t · 2"]),
        ([("t", "h", 0, 1), ("t", "h", 0, 2)], ["t · r0 · 1", "t · r0 · 2"]),
        ([("t", "h1", 0, 1), ("t", "h2", 0, 1)], ["t · r0 · h1:1", "t · r0 · h2:1"]),
        ([("t", "h", 0, 1), ("t", "h", 0, 2), ("u", "h", 0, 3)], ["t · r0 · 1", "t · r0 · 2", "u"]),
    ],
)
def test_colliding_names_are_told_apart(
    runs: list[tuple[str, str, int | None, int]], expected: list[str]
) -> None:
    who = [Who(f"k{i}", name, host, rank, pid) for i, (name, host, rank, pid) in enumerate(runs)]
    names = labels(who)
    assert [names[w.key] for w in who] == expected


@pytest.mark.parametrize(
    ("taken", "count", "slots"),
    [((), 2, [0, 1]), ((0, 1, 2), 1, [3]), ((0, 2), 2, [1, 3]), ((5,), 1, [0])],
)
def test_new_runs_fill_the_lowest_free_slots(
    taken: tuple[int, ...], count: int, slots: list[int]
) -> None:
    assert next_slots(taken, count) == slots


# ---------------------------------------------------------------- bounds


def test_fifty_thousand_source_ids_stay_bounded() -> None:
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.tick(NOW)
    state.apply_all(live_run(NOW, source_id="other:1", host="other", name="quiet"))
    for i in range(50_000):
        at = NOW + i * 0.001  # 50 s of new ids, 1,000 a second
        state.apply(received(hello(f"flood:{i}", name=f"f{i}", host="flood"), at))
        if i % 1_000 == 0:  # the real run keeps talking
            state.apply(received(hello(started=NOW - 60), at))
        if i % 5_000 == 0:
            state.tick(at)
    state.tick(NOW + 50.0)
    assert state.source_count <= MAX_SOURCES
    assert len(state.runs) <= MAX_SOURCES
    assert state.error_count > 0  # the flood is visible
    assert any(r.key == SOURCE_ID for r in state.runs)  # a run that talks survives
    assert not any(r.key == "other:1" for r in state.runs)  # a silent one made room


def test_unknown_major_publishers_do_not_add_a_permanent_run_each() -> None:
    state = ViewerState(HOST)
    for i in range(1_000):
        state.apply(incompatible(T0 + i * 0.01, hint=f"peer:{i}"))
    state.tick(T0 + 10)
    assert 0 < len(state.runs) <= MAX_SOURCES
    state.tick(T0 + 10 + REMOVE_AFTER_S + 1)
    assert state.runs == ()


def test_many_fast_runs_share_a_total_step_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(viewer_module, "MAX_TOTAL_STEP_RECORDS", 16_000)
    state = ViewerState(HOST)
    records = step_records(T0, 10.0, samples_per_s=5_000)  # 2,000 steps
    for n in range(16):
        sid = f"{HOST}:{1000 + n}"
        state.apply(received(hello(sid, pid=1000 + n, rank=n), T0))
        state.apply_all(steps_events(records, sid))
    state.tick(T0 + 10.1)
    total = sum(len(state.steps(run.key)) for run in state.runs)
    assert total <= 16_000
    assert all(len(state.steps(run.key)) == 1_000 for run in state.runs)


def test_a_huge_steps_message_is_cut_to_what_a_run_keeps() -> None:
    state = ViewerState(HOST)
    records = step_records(T0, 60.0, samples_per_s=5_000)  # 12,000 records
    state.apply(received(Steps(SOURCE_ID, records, 0, 0), T0 + 60.0))
    state.tick(T0 + 60.1)
    assert len(state.steps()) <= run_module.MAX_STEP_RECORDS
    assert state.selected is not None and state.selected.last_step_index == records[-1].index


def test_a_tick_judges_the_shown_run_and_only_a_few_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows = _windows(monkeypatch)
    state = ViewerState(HOST)
    for n in range(64):
        sid = f"{HOST}:{2000 + n}"
        state.apply(received(hello(sid, pid=2000 + n, rank=n), T0))
        state.apply_all(steps_events(step_records(T0, 10.0), sid))
    state.tick(T0 + 10.0)
    assert len(windows) == 64  # each run once, for its first verdict
    state.select(40)
    for k in range(1, 9):
        for n in range(64):  # all still talking
            state.apply(received(hello(f"{HOST}:{2000 + n}", pid=2000 + n, rank=n), T0 + 10 + k))
        before = len(windows)
        state.tick(T0 + 10.0 + k)
        judged = windows[before:]
        assert 1 <= len(judged) <= viewer_module.OTHERS_PER_TICK + 1
        assert any(w.hello is not None and w.hello.rank == 40 for w in judged)


def test_a_publisher_inventing_host_names_cannot_grow_the_hosts() -> None:
    state = ViewerState(HOST)
    state.apply(received(hello(), T0))
    for i in range(2_000):
        sample = evolve(system_sample(T0 + i * 0.01), host=f"node-{i}")
        state.apply(received(System(SOURCE_ID, sample), T0 + i * 0.01))
    assert len(state.hosts) <= hosts_module.MAX_HOSTS
    assert "node-1999" in state.hosts


def test_outside_the_loop_no_rate_now_and_no_stall_points() -> None:
    """An evaluation outside the loop: the header showed the loop's last rate ("1,907
    samples/s" beside "outside the training loop"), and zero points dragged the rate
    after it. Outside, no rate now and no pending points; back in, the loop's own."""
    now = T0 + 60.0
    state = ViewerState(HOST, pid_alive=False)
    state.apply_all(live_run(now))
    state.tick(now)
    assert state.selected is not None and state.selected.rate_now is not None
    state.apply(received(Loop(SOURCE_ID, "outside", now + 0.1, 5_000, "exhausted"), now + 0.1))
    for t in (now + 5.0, now + 20.0):
        state.apply(received(hello(), t - 0.5))  # the probe's hello every 2 s: live
        state.tick(t)
        run = state.selected
        assert run is not None and run.rate_now is None, run
        assert run.connection.state == "live"
        assert state._sources[SOURCE_ID].pending == ()
    # The same silence inside the loop is a stall: its zero points are drawn.
    state.apply(received(Loop(SOURCE_ID, "in-loop", now + 21.0, 5_000), now + 21.0))
    state.apply(received(hello(), now + 39.5))
    state.tick(now + 40.0)
    assert state._sources[SOURCE_ID].pending != ()
