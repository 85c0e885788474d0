"""Back from an evaluation outside the loop, and once a run ended: what the header and the
banner say (a new-user audit: "0.00 samples/s" then a ramp, "cause pending" after every
evaluation, "+17327 %", and "Last verdict: Outside the training loop" once it ended)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fakes_tui import (
    HOST,
    SOURCE_ID,
    T0,
    bye,
    hello,
    live_run,
    received,
    step_records,
    steps_events,
)

from gputop_dl.probe.messages import Loop
from gputop_dl.tui.analysis.steps import step_stats
from gputop_dl.tui.analysis.thresholds import CARRY_S
from gputop_dl.tui.analyzer import (
    CARRIED,
    Verdict,
    VerdictTracker,
    _headroom,
    carry_over,
    ended_verdict,
)
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.state.model import SAMPLES_UNIT, ThroughputPoint
from gputop_dl.tui.state.run import loop_rate

FEW = Verdict(
    "input-bound",
    "warning",
    0.8,
    "Input-bound (data wait 99 % of step): 2 loader workers at 1 % CPU: the loading waits",
    cause="few-workers",
    evidence=("data wait 99 % of step time",),
    headroom="with the advice: at most ≈ 148 samples/s, +50 %",
    conditions=("input-bound/few-workers",),
)
PENDING = replace(
    FEW,
    headline="Input-bound (data wait 99 % of step): cause pending (waiting for host samples)",
    cause="unknown",
    evidence=("cause pending: waiting for host samples since the loop resumed (…)",),
    headroom=None,
    conditions=("input-bound/unknown",),
)
ONE_SAMPLE = replace(PENDING, evidence=("only 1 host sample so far, 2 needed for a cause",))
NOTHING = replace(
    PENDING,
    evidence=("nothing gputop measures explains the wait: the loader is not CPU-bound",),
)
OUTSIDE = Verdict("outside-loop", "info", 1.0, "Outside the training loop for 25 s (evaluation?)")
STALLED = Verdict("stalled", "critical", 0.9, "Stalled: no step for 47 s")
COMPUTE = Verdict("compute-bound", "ok", 0.9, "Compute-bound", conditions=("compute-bound",))


def _point(end: float, rate: float) -> ThroughputPoint:
    return ThroughputPoint(end, rate, rate / 16, 0.99, 0.5)


# 1. samples/s now: the time outside the loop is no time of the loop's.
@pytest.mark.parametrize(
    ("points", "outside", "expected"),
    [
        # in the loop all along: the last 5 s
        ([_point(0.5 * i, 100.0) for i in range(1, 21)], [], 100.0),
        # back from 25 s outside, no new step yet: the last in-loop rate, not 0
        (
            [_point(0.5 * i, 100.0) for i in range(1, 11)]
            + [_point(5.0 + 0.5 * i, 0.0) for i in range(1, 51)],
            [(5.0, 30.0)],
            100.0,
        ),
        # one new second in: 4 s before it and 1 s after, no ramp from 0
        (
            [_point(0.5 * i, 100.0) for i in range(1, 11)]
            + [_point(5.0 + 0.5 * i, 0.0) for i in range(1, 51)]
            + [_point(30.5, 90.0), _point(31.0, 90.0)],
            [(5.0, 30.0)],
            98.0,
        ),
        # a stall inside the loop is time without progress: it still counts
        (
            [_point(0.5 * i, 100.0) for i in range(1, 6)]
            + [_point(3.0 + 0.5 * i, 0.0) for i in range(5)],
            [],
            50.0,
        ),
        # nothing known
        ([], [], None),
    ],
)
def test_rate_now_leaves_out_the_time_outside_the_loop(
    points: list[ThroughputPoint], outside: list[tuple[float, float]], expected: float | None
) -> None:
    rate = loop_rate(reversed(points), SAMPLES_UNIT, outside, 5.0)
    if expected is None:
        assert rate is None
    else:
        assert rate == pytest.approx(expected, rel=0.01)


# 2. Back in the loop, the cause judged before it stands until news.
@pytest.mark.parametrize(
    ("verdict", "judged", "carried"),
    [
        (PENDING, FEW, True),  # host samples since the resume pending
        (ONE_SAMPLE, FEW, True),  # one so far
        (NOTHING, FEW, False),  # news: nothing measured explains it
        (COMPUTE, FEW, False),  # news: another kind
        (replace(FEW, cause="disk"), FEW, False),  # news: another cause
        (PENDING, PENDING, False),  # nothing to carry
    ],
)
def test_carry_over(verdict: Verdict, judged: Verdict, carried: bool) -> None:
    out = carry_over(verdict, judged)
    assert (out is not None) == carried
    if out is not None:
        assert out.cause == judged.cause and out.evidence[0] == CARRIED
        assert out.headroom == judged.headroom


def test_tracker_keeps_the_cause_across_an_evaluation() -> None:
    tracker = VerdictTracker()
    tracker.update(FEW, 0.0)
    assert tracker.update(OUTSIDE, 5.0).kind == "outside-loop"
    assert tracker.basis is not None and tracker.basis.cause == "few-workers"
    for t in (30.0, 31.0, 32.0, 33.0):  # back in, host samples pending
        shown = tracker.update(PENDING, t)
        assert shown.cause == "few-workers" and shown.since == 0.0, (t, shown)
    assert tracker.update(FEW, 34.0).evidence == FEW.evidence  # news: fresh figures
    # Long after the resume, missing samples are news: shown after the usual 2 s.
    tracker.update(OUTSIDE, 40.0)
    late = 41.0 + CARRY_S
    tracker.update(PENDING, 41.0)
    assert tracker.update(PENDING, late).cause == "few-workers"
    assert tracker.update(PENDING, late + 3.0).cause == "unknown"


# 3. No absurd headroom.
def test_headroom_far_beyond_the_rate_is_withheld_with_why() -> None:
    from fakes_tui import step_records as records

    stats = step_stats(list(records(T0, 3.0, samples_per_s=100.0, wait_share=0.995)))
    text = _headroom(stats, "the data wait", 0.995)
    assert text is not None and "%" in text and "no figure" in text and "+" not in text
    stats = step_stats(list(records(T0, 3.0, samples_per_s=100.0, wait_share=0.3)))
    text = _headroom(stats, "the data wait", 0.3)
    assert text is not None and "+43 %" in text


# 4. An ended run shows its bottleneck.
@pytest.mark.parametrize(
    ("shown", "judged", "expected"),
    [
        (OUTSIDE, FEW, "few-workers"),  # ended after its last evaluation
        (replace(OUTSIDE, kind="starting-pass"), FEW, "few-workers"),
        (STALLED, FEW, None),  # a hang is how it ended: it stays
        (FEW, FEW, "few-workers"),
        (OUTSIDE, None, None),  # never judged in the loop
    ],
)
def test_ended_verdict(shown: Verdict, judged: Verdict | None, expected: str | None) -> None:
    out = ended_verdict(shown, judged)
    assert out is not None
    assert out.cause == expected
    if shown.kind == "outside-loop" and judged is not None:
        assert out.kind == judged.kind and shown.headline in out.evidence[0]


# Through the viewer: an evaluation of 25 s between epochs, then the end.
def test_viewer_back_from_an_evaluation_and_at_the_end() -> None:
    now = T0 + 60.0
    state = ViewerState(HOST, pid_alive=False)
    state.apply_all(live_run(now))
    for t in (now - 3.0, now - 2.0, now - 1.0, now):
        state.tick(t)
    before = state.selected
    assert before is not None and before.verdict is not None and before.rate_now is not None
    assert before.verdict.kind == "input-bound" and before.verdict.cause != "unknown"
    state.apply(received(Loop(SOURCE_ID, "outside", now + 0.1, 5_000, "exhausted"), now + 0.1))
    for t in range(5, 26, 5):
        state.apply(received(hello(started=T0), now + t - 0.5))
        state.tick(now + t)
    assert state.selected is not None and state.selected.verdict is not None
    assert state.selected.verdict.kind == "outside-loop"
    back = now + 25.0
    state.apply(received(Loop(SOURCE_ID, "in-loop", back, 5_000), back))
    state.tick(back + 0.1)  # re-entered, no step yet
    run = state.selected
    assert run is not None and run.rate_now == pytest.approx(before.rate_now, rel=0.05), (
        run.rate_now
    )
    new = step_records(back, 2.0, samples_per_s=100.0, wait_share=0.7, first_index=10_000)
    state.apply_all(steps_events(new))
    for t in (back + 1.0, back + 2.0):
        state.tick(t)
        run = state.selected
        assert run is not None and run.verdict is not None
        assert run.rate_now is not None and run.rate_now > 80.0, run.rate_now
        assert run.verdict.cause == before.verdict.cause, run.verdict.headline
        assert "no viewer" not in " ".join(run.verdict.evidence)
    # A last evaluation, then the run exits: its bottleneck, not "Outside the loop".
    state.apply(received(Loop(SOURCE_ID, "outside", back + 2.1, 5_100, "exhausted"), back + 2.1))
    state.apply(received(hello(started=T0), back + 5.0))
    state.tick(back + 5.0)
    state.apply(received(bye(), back + 6.0))
    state.tick(back + 6.5)
    run = state.selected
    assert run is not None and run.connection.state == "exited" and run.verdict is not None
    assert run.verdict.kind == "input-bound" and run.verdict.cause == before.verdict.cause


@pytest.mark.parametrize(
    "told_by",
    [
        "loop message",
        # The probe sends its two newest loop changes a flush: a hello sent with them
        # says "in-loop" before the Loop message is taken (a real recording: "samples/s
        # now" read 3, 14, 25, 45 over the 5 s after a 25 s evaluation, the rate 97).
        "hello, then loop message",
        "hello alone",  # a viewer that missed the Loop message
    ],
)
def test_the_time_outside_is_taken_out_of_the_rate_whichever_message_tells_the_return(
    told_by: str,
) -> None:
    now = T0 + 60.0
    state = ViewerState(HOST, pid_alive=False)
    state.apply_all(live_run(now))
    state.tick(now)
    before = state.selected
    assert before is not None and before.rate_now is not None
    left = now + 0.1
    state.apply(received(Loop(SOURCE_ID, "outside", left, 5_000, "exhausted"), left))
    state.apply(
        received(
            replace(hello(started=T0), loop="outside", loop_since=left, loop_exit="exhausted"),
            now + 5.0,
        )
    )
    state.tick(now + 5.0)
    back = now + 25.0
    if told_by != "loop message":
        state.apply(received(replace(hello(started=T0), loop="in-loop", loop_since=back), back))
    if told_by != "hello alone":
        state.apply(received(Loop(SOURCE_ID, "in-loop", back, 5_000), back))
    new = step_records(back, 1.0, samples_per_s=100.0, wait_share=0.7, first_index=10_000)
    state.apply_all(steps_events(new))
    state.tick(back + 1.0)
    run = state.selected
    assert run is not None and run.rate_now is not None
    # The rates before (85) and since (100) the evaluation, not 20 (the 25 s counted).
    assert run.rate_now == pytest.approx(before.rate_now, rel=0.25), run.rate_now
