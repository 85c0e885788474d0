"""The viewer state, without Textual: connection states, throughput math, bounds, runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fakes_tui import (
    ENDPOINT,
    HOST,
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

import tui.state as state_module
from probe.messages import Hello, StepRecord, Steps, System
from probe.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR
from tui.analyzer import Verdict, Window
from tui.events import BadInput, EndpointState
from tui.state import INSTRUMENT_HINT, SAMPLES_UNIT, STEPS_UNIT, ViewerState

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
    event = incompatible(T0, theirs=(2, 3))
    state.apply(event)
    state.tick(T0 + 1)
    run = state.selected
    assert run is not None
    assert run.key == SOURCE_ID
    assert run.connection.state == "incompatible"
    assert "2.3" in run.connection.text
    assert f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}" in run.connection.text
    assert run.theirs == (2, 3)
    assert event.text in state.errors[-1].text
    assert state.errors[-1].source == SOURCE_ID
    assert "upgrade this gputop" in state_module.upgrade_advice((2, 3))
    assert "training environment" in state_module.upgrade_advice((0, 9))


def test_incompatible_peer_without_a_source_hint_still_shows() -> None:
    state = ViewerState(HOST)
    state.apply(incompatible(T0, theirs=(3, 0), hint=None))
    state.tick(T0)
    (run,) = state.runs
    assert run.connection.state == "incompatible"
    assert "3.0" in run.name


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
    monkeypatch.setattr(state_module, "MAX_STEP_RECORDS", 50)
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


def test_old_step_records_are_dropped_but_the_totals_kept() -> None:
    state = ViewerState(HOST)
    steady(state, duration_s=200.0)
    state.tick(T0 + 200.05)
    steps = state.steps()
    assert steps[0].end_time >= T0 + 200.0 - state_module.STEP_KEEP_S
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
    assert [r.label for r in state.runs] == ["resnet50 r0", "resnet50 r1", "resnet50 r2"]
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


def test_selection_follows_the_run_when_a_new_one_sorts_before_it() -> None:
    state = ViewerState(HOST)
    three_runs(state)
    state.tick(T0)
    state.select(1)
    state.apply(received(hello("z:9", name="alexnet", rank=0), T0 + 1))
    state.tick(T0 + 1)
    assert state.selected is not None
    assert (state.selected.name, state.selected.rank) == ("resnet50", 1)
    assert state.selected_index == 2


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
    agent_sample = replace(system_sample(T0 + 10.5, with_processes=False), host=HOST)
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
    windows: list[Window] = []

    def fake_analyze(window: Window) -> Verdict:
        windows.append(window)
        return Verdict("input-bound", "warning", 0.9, "Input-bound", cause="few-workers")

    monkeypatch.setattr(state_module, "analyze", fake_analyze)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))
    state.tick(NOW)
    (window,) = windows
    assert window.now == NOW
    assert window.hello is not None and window.hello.name == "resnet50"
    assert window.steps and window.steps[0].end_time >= NOW - state_module.ANALYSIS_WINDOW_S
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

    def record(window: Window) -> Verdict:
        windows.append(window)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    state = ViewerState(HOST)
    state.apply_all(live_run(NOW))  # rank 0 samples the host, with 4 workers
    rank1 = "gpu-node-07:5001"
    state.apply(received(hello(rank1, rank=1, pid=5001, host_sampler=False), NOW - 5))
    own = replace(system_sample(NOW - 1, workers=2), host_sampled=False, cpu=None, gpus=())
    state.apply(received(System(rank1, own), NOW - 0.9))
    state.apply_all(steps_events(step_records(NOW - 5, 4.9), rank1))
    state.tick(NOW)
    rank1_window = next(w for w in windows if w.hello is not None and w.hello.rank == 1)
    assert rank1_window.systems
    assert all(s.host_sampled and s.cpu is not None for s in rank1_window.systems)
    assert all(s.processes is not None for s in rank1_window.systems)
    assert {s.processes.worker_count for s in rank1_window.systems} == {2}  # type: ignore[union-attr]


def test_an_analyzer_failure_is_shown_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(window: Window) -> Verdict:
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

    def record(window: Window) -> Verdict:
        nows.append(window.now)
        return Verdict("x", "ok", 1.0, "x")

    monkeypatch.setattr(state_module, "analyze", record)
    state = ViewerState(HOST)
    records = steady(state)
    state.tick(records[-1].end_time + 30)
    assert nows == [pytest.approx(records[-1].end_time + 0.01)]


def test_hello_only_updates_uptime_from_started() -> None:
    state = ViewerState(HOST)
    state.apply(received(Hello(SOURCE_ID, "probe", "tiny", HOST, 1, T0, "0.1.0"), T0 + 5))
    state.tick(T0 + 65)
    run = state.selected
    assert run is not None
    assert run.uptime_s == pytest.approx(65.0)
    assert run.rank is None
    assert run.label == "tiny"
