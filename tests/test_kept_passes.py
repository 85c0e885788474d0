"""Loaders taking turns, judged over a whole cycle of their passes in the middle of a long
one: the viewer keeps the steps of the newest whole pass of each loader (an evaluation's,
which its step log drops a minute later) and the analyzer completes the cycle with them.

Before, in the middle of a training pass longer than the analyzer's window, a training
and an evaluation whose workers start again at every pass read the window's share ("8 %")
and "cause unknown": the evaluation's start, and its pass, were not among the steps."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise

import pytest
from fakes_tui import SOURCE_ID, received, steps_events
from fakes_tui import hello as probe_hello

import gputop_dl.tui.state as state_module
from gputop_dl.probe.messages import LoaderPasses, StepRecord, Steps
from gputop_dl.tui.analysis.passes import WholePass, passes_to_keep, whole_pass
from gputop_dl.tui.analyzer import Verdict, Window, analyze
from gputop_dl.tui.state import ViewerState
from tests.test_analysis_facts import TRAIN, VAL, cycles, text
from tests.test_analyzer import hello, processes, window

TRAIN_KEPT = replace(TRAIN, persistent_workers=True)
VAL_FORKED = replace(VAL, persistent_workers=False)


def listed(
    train: tuple[int, ...], val: tuple[int, ...], known: int, wait: float = 5.0
) -> tuple[LoaderPasses, ...]:
    """The hello's passes as of ``known`` steps: each loader's starts before it, with
    their first waits; the loader whose pass began last, last."""
    passes = []
    for info, starts in ((VAL_FORKED, val), (TRAIN_KEPT, train)):
        began = tuple(i for i in starts if i < known)[-16:]
        passes.append(LoaderPasses(info, began, (wait,) * len(began)))
    return tuple(sorted(passes, key=lambda p: p.starts[-1] if p.starts else -1))


def kept(
    steps: list[StepRecord], passes: tuple[LoaderPasses, ...], known: int
) -> tuple[WholePass, ...]:
    """What a viewer keeps as of ``known`` steps (all of them received)."""
    by_index = {s.index: s for s in steps}
    return tuple(
        whole
        for start, end in passes_to_keep(passes, known)
        if (whole := whole_pass([by_index[i] for i in range(start, end)], end)) is not None
    )


def verdict(
    steps: list[StepRecord],
    passes: tuple[LoaderPasses, ...],
    known: int,
    recent: list[StepRecord],
    whole: tuple[WholePass, ...] | None = None,
) -> Verdict:
    """The verdict over the steps ``recent``, the hello listing ``passes`` as of ``known``
    steps, with the passes a viewer keeps by then (or ``whole``)."""
    h = replace(hello(2, persistent=False), passes=passes, step_count=known)
    w = window(recent, h=h, now=recent[-1].end_time, procs=processes(30.0, [5.0] * 2))
    return analyze(replace(w, whole_passes=kept(steps, passes, known) if whole is None else whole))


WHERE = ["in the training pass", "at the evaluation's start", "in the evaluation", "after it"]


def turns_at(
    where: str,
    whole: Callable[[tuple[LoaderPasses, ...], tuple[WholePass, ...]], tuple[WholePass, ...]]
    | None = None,
) -> Verdict:
    """Cycles of a 1,000-step training pass (workers kept, 5 s start) and a 300-step
    evaluation (workers forked again, 5 s), 12 ms steps waiting 1 ms but each pass's
    first: the verdict over a window of 250 steps ``where`` in the fourth cycle, with the
    passes a viewer keeps (those ``whole`` picks of them, given the hello's passes)."""
    steps, train, val = cycles(5, 1000, 5.0, 300, 5.0)
    first = {
        "in the training pass": train[3] + 500,
        "at the evaluation's start": val[3] - 100,
        "in the evaluation": val[3] + 150,
        "after it": train[4] + 50,
    }[where]
    known = first + 250
    passes = listed(train, val, known)
    recent = [s for s in steps if s.index >= first][:250]
    kept_now = kept(steps, passes, known)
    return verdict(steps, passes, known, recent, whole(passes, kept_now) if whole else kept_now)


@pytest.mark.parametrize("where", WHERE)
def test_a_cycle_is_judged_with_the_passes_the_viewer_kept(where: str) -> None:
    """A cycle loses 42 % to waiting (11.3 s of 26.9 s). Wherever the window is, the
    headline is that share over whole passes, and the headroom the cycle's."""
    v = turns_at(where)
    share = re.search(r"data wait (\d+) % of the time over whole passes", v.headline)
    assert share is not None and 41 <= int(share.group(1)) <= 43, text(v)
    assert v.passes_share is not None and abs(v.passes_share - 11.298 / 26.898) < 0.01, v
    assert v.cause in ("worker-restarts", "pass-start"), text(v)
    # Both loaders' starts named; no loader's passes alone.
    assert "-step passes alone" not in (v.headroom or ""), v.headroom
    assert "(over whole passes: " in (v.headroom or ""), v.headroom
    assert sum(" steps: the first batch of a pass waited" in e for e in v.evidence) == 2, text(v)


@pytest.mark.parametrize("own", [False, True], ids=["none kept", "its own kept"])
@pytest.mark.parametrize("where", WHERE)
def test_without_the_other_passes_the_window_keeps_its_share(where: str, own: bool) -> None:
    """The same run where the viewer kept no pass, or only those of the loader running
    now (the other's longer than its step log, a viewer attached since): the cycle is
    not known, and one loader's passes are not the run's share (a window over them read
    33 % "over whole passes" in the training's, 60 % in the evaluation's). The cause,
    with the loader judged, stays, and a headroom from one loader's passes says whose
    they are (it read "+81 % (over whole passes)" for a cycle that would gain 45 %)."""

    def own_only(
        passes: tuple[LoaderPasses, ...], whole: tuple[WholePass, ...]
    ) -> tuple[WholePass, ...]:
        now = passes[-1].starts  # the loader whose pass began last
        mine = tuple(p for p in whole if own and p.first.index in now)
        assert bool(mine) == own
        return mine

    v = turns_at(where, own_only)
    assert "over whole passes" not in v.headline and "over the last" not in v.headline, text(v)
    assert v.passes_share is None, v
    if "without those waits" in (v.headroom or ""):  # one loader's passes: said so
        assert "-step passes alone: " in (v.headroom or ""), v.headroom


def test_a_kept_pass_is_its_first_step_and_its_other_steps_summed() -> None:
    """Exact sums of the other steps, whatever their pattern (a sample of every 4th step
    of an evaluation whose workers deliver in rounds, every second step waiting, read 27 %
    or 8 % by the steps' parity); a few lost steps stand for by the others."""
    steps, train, _ = cycles(2, 1000, 5.0, 300, 5.0)
    rounds = [
        StepRecord(s.index, s.end_time, s.period_s + 0.029, 0.03, s.samples) if s.index % 2 else s
        for s in steps
        if train[0] <= s.index < train[0] + 1000
    ]
    whole = whole_pass(rounds, train[0] + 1000)
    assert whole is not None and whole.first is rounds[0]
    assert (whole.length, whole.others) == (1000, 999)
    assert whole.wait_s == pytest.approx(sum(s.wait_s or 0.0 for s in rounds[1:]))
    assert whole.period_s == pytest.approx(sum(s.period_s for s in rounds[1:]))
    assert whole.samples == 32 * 999 and whole.idle_s is None
    assert whole.typical_wait_s == 0.03  # every second step waits 30 ms
    lost = [s for s in rounds if s.index % 100 != 50]  # 10 of 1,000 lost
    some = whole_pass(lost, train[0] + 1000)
    assert some is not None and some.scale == pytest.approx(999 / 989)
    assert whole_pass([s for s in rounds if s.index % 10 != 5], train[0] + 1000) is None
    assert whole_pass([], 10) is None


def test_only_loaders_taking_turns_have_passes_kept() -> None:
    one = (LoaderPasses(TRAIN, (10, 110, 210)),)
    assert passes_to_keep(one, 400) == []
    two = (LoaderPasses(VAL, (110, 330)), LoaderPasses(TRAIN, (10, 210, 430)))
    # The whole ones: the next start listed and counted.
    assert passes_to_keep(two, 431) == [(10, 110), (110, 210), (210, 330), (330, 430)]
    assert passes_to_keep(two, 430) == [(10, 110), (110, 210), (210, 330)]
    # Among the last 16 starts.
    val, train = tuple(range(5, 400, 20)), tuple(range(0, 400, 20))
    many = (LoaderPasses(VAL, val), LoaderPasses(TRAIN, train))
    last = sorted(val + train)[-16:]
    assert passes_to_keep(many, 400) == list(pairwise(last))
    # Where the analyzer's windows hold whole cycles (20 steps of 10 ms), none; of 1 s
    # steps (20 s), they do not.
    assert passes_to_keep(many, 400, 0.01) == []
    assert passes_to_keep(many, 400, 1.0) == list(pairwise(last))


# --- the viewer ---------------------------------------------------------------------------


def feed(
    state: ViewerState, steps: list[StepRecord], train: tuple[int, ...], val: tuple[int, ...]
) -> None:
    """The run's messages as a probe sends them: steps every 0.5 s, a hello every 2 s
    listing the starts of passes counted so far."""
    events = steps_events(steps, flush_s=0.5)
    next_hello = steps[0].end_time
    known = 0
    for event in events:
        records = getattr(event.message, "records", ())
        if records:
            known = records[-1].index + 1
        if event.received >= next_hello:
            h = replace(
                probe_hello(),
                loader=TRAIN_KEPT,
                passes=listed(train, val, known),
                step_count=known,
            )
            state.apply(received(h, event.received))
            next_hello = event.received + 2.0
        state.apply(event)


def test_the_viewer_judges_a_cycle_in_the_middle_of_a_training_pass_longer_than_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Training passes of 6,000 steps (83 s) and evaluations of 300 (8.9 s), each
    waiting 5 s for its workers: a cycle loses 17.7 % (16.3 s of 91.9 s). 65 s into a
    training pass the step log no longer holds the evaluation (it keeps a minute of
    steps); the viewer kept its pass, and the verdict is the cycle's."""
    steps, train, val = cycles(3, 6000, 5.0, 300, 5.0)
    at = train[2] + 5000
    state = ViewerState("vm")
    windows: list[tuple[Window, Verdict]] = []

    def record(w: Window, previous: Verdict | None = None) -> Verdict:
        verdict = analyze(w, previous)
        windows.append((w, verdict))
        return verdict

    monkeypatch.setattr(state_module, "analyze", record)
    upto = [s for s in steps if s.index <= at]
    feed(state, upto, train, val)
    state.tick(upto[-1].end_time + 0.1)
    w, v = windows[-1]
    assert w.steps[0].index > val[1], "the window holds no evaluation step"
    # The evaluation's pass; the training's are longer than the log: never whole there.
    assert [p.first.index for p in w.whole_passes] == [val[0], val[1]]
    share = re.search(r"data wait (\d+) % of the time over whole passes", v.headline)
    assert share is not None and 17 <= int(share.group(1)) <= 19, text(v)


def test_a_first_evaluation_after_a_training_pass_is_not_a_cycle() -> None:
    """The first evaluation of a run, after its first training pass: the cycle is not
    known yet (the evaluation's length, its next start). Its pass alone read "75 % of
    the time over the last pass" (+250 %) in a real run whose training pass lost 10 %."""
    steps, train, val = cycles(2, 1000, 5.0, 300, 5.0)
    first = val[0] - 50
    known = first + 150
    passes = listed(train, val, known)
    assert [p.first.index for p in kept(steps, passes, known)] == [train[0]]  # kept
    v = verdict(steps, passes, known, [s for s in steps if s.index >= first][:150])
    assert "over the last pass" not in v.headline and "over whole" not in v.headline, text(v)
    assert v.passes_share is None, v
    # Nor the headroom (it read "+385 % (over the last pass: 508 samples/s)" for a cycle
    # that would gain 59 %): the window's.
    assert "over the last pass" not in (v.headroom or ""), v.headroom


def test_a_late_viewer_keeps_the_passes_its_replay_brings() -> None:
    """A viewer attached 65 s into a training pass gets the probe's history at once: a
    hello, then 120 s of steps in messages of 2,000. Its log keeps a minute of steps, so
    the evaluation's (70 s old) are dropped as the replay comes; they are kept before."""
    steps, train, val = cycles(3, 6000, 5.0, 300, 5.0)
    at = train[2] + 5000
    now = steps[at].end_time + 0.1
    history = [s for s in steps[: at + 1] if s.end_time >= now - 120.0][-20_000:]
    state = ViewerState("vm")
    h = replace(
        probe_hello(), loader=TRAIN_KEPT, passes=listed(train, val, at + 1), step_count=at + 1
    )
    state.apply(received(h, now))
    for number, first in enumerate(range(0, len(history), 2_000)):
        chunk = tuple(history[first : first + 2_000])
        state.apply(received(Steps(SOURCE_ID, chunk, number, 0), now))
    (run,) = state._sources.values()
    assert run.steps and next(iter(run.steps)).index > val[1] + 300, "the log dropped them"
    assert [p.first.index for p in run.whole_passes] == [val[1]]
    assert run.whole_passes[0].others == 299


def sequence(
    passes: list[tuple[int, int, float]], period: float = 0.012, other_wait: float = 0.001
) -> tuple[list[StepRecord], list[list[int]]]:
    """Passes in the order given, (loader, steps, its first step's wait): their steps and
    each loader's starts (see test_analysis_facts.turns)."""
    steps: list[StepRecord] = []
    starts: list[list[int]] = [[] for _ in range(1 + max(p[0] for p in passes))]
    end, index = 1_700_000_000.0, 17
    for which, count, first in passes:
        starts[which].append(index)
        for i in range(count):
            wait = first if i == 0 else other_wait
            end += period + wait
            steps.append(StepRecord(index, end, period + wait, wait, 32))
            index += 1
    return steps, starts


@pytest.mark.parametrize("where", ["in the training pass", "over both evaluations", "after them"])
def test_a_loader_run_twice_a_cycle(where: str) -> None:
    """A training pass of 1,500 steps (5 s start) and the same evaluation loader run
    twice after it (150 steps, 4 s starts): a cycle loses 40.7 % (14.8 s of 36.4 s). It
    read "8 %, cause unknown" in the training pass (one evaluation pass kept), and "70 %
    of the time over whole passes", +205 %, over the two evaluations (a "cycle" of the
    evaluation loader's passes alone)."""
    steps, (train, val) = sequence([(0, 1500, 5.0), (1, 150, 4.0), (1, 150, 4.0)] * 4)
    first = {
        "in the training pass": train[3] + 700,
        "over both evaluations": val[4] - 20,
        "after them": train[3] + 30,
    }[where]
    known = first + 250
    passes = (
        LoaderPasses(VAL_FORKED, tuple(i for i in val if i < known), (4.0,) * 8),
        LoaderPasses(TRAIN_KEPT, tuple(i for i in train if i < known), (5.0,) * 4),
    )
    passes = (LoaderPasses(p.loader, p.starts, p.waits[: len(p.starts)]) for p in passes)  # type: ignore[assignment]
    passes = tuple(sorted(passes, key=lambda p: p.starts[-1]))
    v = verdict(steps, passes, known, [s for s in steps if s.index >= first][:250])
    assert v.passes_share is not None and abs(v.passes_share - 14.797 / 36.397) < 0.01, text(v)
    assert "41 % of the time over whole passes" in v.headline, text(v)


@pytest.mark.parametrize("lost", [0, 1], ids=["all received", "a step lost"])
def test_a_late_viewer_keeps_a_long_evaluation_its_replay_brings(lost: int) -> None:
    """Training passes of 6,000 steps and evaluations of 4,000 (48 s), 10 s starts; a
    viewer attached 49 s into a training pass. The log keeps 5,000 steps: the replay's
    later messages pushed the evaluation out before it was kept ("8 % of step: cause
    unknown"). And a step lost on the way (a message dropped) made no pass whole."""
    steps, train, val = cycles(3, 6000, 10.0, 4000, 10.0)
    at = train[2] + 3000  # 49 s into it: the evaluation began 111 s ago, 7,000 steps
    gone = val[1] + 1234 if lost else -1
    now = steps[at].end_time + 0.1
    history = [s for s in steps[: at + 1] if s.end_time >= now - 120.0 and s.index != gone]
    state = ViewerState("vm")
    h = replace(
        probe_hello(), loader=TRAIN_KEPT, passes=listed(train, val, at + 1, 10.0), step_count=at + 1
    )
    state.apply(received(h, now))
    for number, first in enumerate(range(0, len(history[-20_000:]), 2_000)):
        chunk = tuple(history[-20_000:][first : first + 2_000])
        state.apply(received(Steps(SOURCE_ID, chunk, number, 0), now))
    (run,) = state._sources.values()
    assert [p.first.index for p in run.whole_passes] == [val[1]]
    assert run.whole_passes[0].others == 3999 - lost


def judged_in(
    order: list[tuple[int, int, float]], cycles_run: int, at: tuple[int, int], steps_held: int
) -> Verdict:
    """A run of ``cycles_run`` cycles of passes ``order`` (loader, steps, first wait):
    the verdict over ``steps_held`` steps from the ``at[1]``-th step of the ``at[0]``-th
    pass, with the passes a viewer keeps by then."""
    steps, starts = sequence(order * cycles_run)
    every = sorted((i, which) for which, each in enumerate(starts) for i in each)
    first = every[at[0]][0] + at[1]
    known = first + steps_held
    infos = (TRAIN_KEPT, VAL_FORKED, replace(VAL, batch_size=4, persistent_workers=False))
    waits = {s.index: s.wait_s for s in steps}
    listed = []
    for which, each in enumerate(starts):
        began = tuple(i for i in each if i < known)[-16:]
        if began:
            listed.append(LoaderPasses(infos[which], began, tuple(waits[i] for i in began)))
    passes = tuple(sorted(listed, key=lambda p: p.starts[-1]))
    return verdict(steps, passes, known, [s for s in steps if s.index >= first][:steps_held])


def share_over_passes(v: Verdict) -> int | None:
    found = re.search(r"data wait (\d+) % of the time over whole passes", v.headline)
    return int(found.group(1)) if found else None


EVERY_THIRD = [(0, 1000, 5.0), (0, 1000, 5.0), (0, 1000, 5.0), (1, 600, 5.0)]


@pytest.mark.parametrize("which", [12, 13, 14, 16])
def test_an_evaluation_every_third_epoch(which: int) -> None:
    """Training passes of 1,000 steps and an evaluation of 600 every third one, 5 s
    starts: a cycle loses 35.3 %. In the middle of every training pass the current
    loader's own kept passes joined the cycle in place of its pass held: no verdict
    over passes at all ("8 %, cause unknown")."""
    v = judged_in(EVERY_THIRD, 5, (which, 500), 250)
    assert share_over_passes(v) == 35, text(v)


def test_a_loader_run_once_in_the_middle_is_left_behind() -> None:
    """A training and two evaluations ("A B B", 40.7 %) with a test pass once, between
    two cycles: once the order after it shows the cycle twice, the cycle again (it read
    70 % over the two evaluations alone, then nothing while the test pass was listed)."""
    order = [(0, 1500, 5.0), (1, 150, 4.0), (1, 150, 4.0)]
    v = judged_in(order * 2 + [(2, 50, 1.0)] + order * 2, 1, (12, 10), 250)
    assert share_over_passes(v) == 41, text(v)


@pytest.mark.parametrize("after", [0, 1, 2, 3, 10])
def test_a_pass_just_begun_does_not_move_the_share(after: int) -> None:
    """The window's last steps the first ones of a pass (its first alone counted
    unscaled: 74 % "over the last 2 passes" for 42 %); left out until it has steps
    enough."""
    steps, train, val = cycles(5, 1000, 5.0, 300, 5.0)
    known = val[3] + after + 1
    passes = listed(train, val, known)
    v = verdict(steps, passes, known, [s for s in steps if s.index < known][-250:])
    assert share_over_passes(v) == 42, text(v)


def test_a_late_viewer_of_slow_steps_keeps_the_passes_of_its_replay() -> None:
    """Training passes of 50 steps of 0.5 s and evaluations of 40 (2 s starts): a cycle
    of 90 steps, which a window of 300 steps would hold, but not its 30 s. A late
    viewer's first hello comes before any step: the step's length is the hello's, not
    unknown (it kept nothing, and read "compute-bound (data wait 2 %)")."""
    steps, (train, val) = sequence([(0, 50, 2.0), (1, 40, 2.0)] * 6, period=0.5)
    at = train[4] + 20
    now = steps[at - steps[0].index].end_time + 0.1
    history = [s for s in steps if s.index <= at and s.end_time >= now - 120.0]
    state = ViewerState("vm")
    h = replace(
        probe_hello(),
        loader=TRAIN_KEPT,
        passes=listed(tuple(train), tuple(val), at + 1, 2.0),
        step_count=at + 1,
        typical_period_s=0.5,
    )
    state.apply(received(h, now))
    state.apply(received(Steps(SOURCE_ID, tuple(history), 0, 0), now))
    (run,) = state._sources.values()
    assert [p.first.index for p in run.whole_passes][-2:] == [train[3], val[3]]
