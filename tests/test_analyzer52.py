"""Three analyzer defects, as tables of windows: a probe whose training loop has not
started is set up, not "warming up: 0 of 5 steps"; a burst of another process's CPU does
not starve a run that computes on the host; with num_workers=0 on full cores the cause
holds while the main process's CPU hovers near the line between "the loading waits"
and "the cores are full", and the advice says what a worker buys with no core idle."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gputop_dl.probe.messages import Hello
from gputop_dl.probe.samples import CpuSample, TopProcess
from gputop_dl.tui.analyzer import (
    ENDED_STATES,
    IMMEDIATE_KINDS,
    Verdict,
    VerdictTracker,
    Window,
    analyze,
)
from gputop_dl.tui.state.clean import evolve as replace
from gputop_dl.tui.widgets.banner import TIMED_KINDS
from tests.test_analyzer import T0, cores, hello, make_steps, processes, system

# --- 1. before the training loop ------------------------------------------------------------

SET_UP = "Setting up: the training loop has not started yet"
PROBE_UP = "probe started 5.1 s ago; no watched loop entered yet, no step (data or model set-up)"

SETTING_UP: dict[str, tuple[float | None, tuple[str, ...]]] = {
    "no node sample yet": (None, (PROBE_UP,)),
    # `gputop demo` making its 256 JPEGs: the CPU says it works
    "the main process makes its data": (97.0, (PROBE_UP, "main process 97 % CPU (busy)")),
    "the main process waits (a download?)": (3.0, (PROBE_UP, "main process 3 % CPU (mostly idle)")),
}


@pytest.mark.parametrize(("main_cpu", "evidence"), SETTING_UP.values(), ids=SETTING_UP.keys())
def test_a_probe_before_its_loop_says_it_sets_up(
    main_cpu: float | None, evidence: tuple[str, ...]
) -> None:
    """It read "Warming up: 0 of 5 steps needed… • no step yet, probe started 5.1 s ago"
    while the demo made its dataset: no step was on its way. The kind stays warming-up:
    shown and left at once, no bottleneck of a run that ends there, no second duration
    beside it in the banner."""
    now = T0 + 5.1
    h = replace(hello(0), started=T0, loop="not-started", loop_since=None)
    sys = (
        [] if main_cpu is None else [system(now - 1 + i, procs=processes(main_cpu)) for i in (0, 1)]
    )
    v = analyze(Window(now=now, steps=(), systems=sys, hello=h))
    assert (v.kind, v.severity, v.headline, v.evidence) == ("warming-up", "info", SET_UP, evidence)
    assert v.kind in IMMEDIATE_KINDS and v.kind in ENDED_STATES and v.kind in TIMED_KINDS
    # The loop entered, no step yet: that is warming up, as before.
    entered = replace(h, loop="in-loop", loop_since=now - 1)
    warming = analyze(Window(now=now, steps=(), systems=sys, hello=entered))
    assert warming.headline.startswith("Warming up: 0 of 5 steps"), warming


# --- 2. starved of CPU: full cores in 3/4 of the samples to enter -------------------------------

HOG = (
    TopProcess(100, 1, "python", 48.0, 1 << 30),
    TopProcess(300, 1, "hog.py", 52.0, 1 << 20),
)


def host_run(
    full: Sequence[bool], busy: CpuSample, idle: CpuSample, h: Hello, main: float = 48.0
) -> Window:
    """Steps of a run computing on the host (a 1 % data wait), its main process at
    ``main`` % of a core, a node sample a second, its cores ``busy`` where ``full`` says so."""
    steps = make_steps(wait=0.001)
    now = steps[-1].end_time + 0.05
    n = len(full)
    sys = [
        system(now - (n - 1 - i), cpu=busy if f else idle, procs=processes(main), top=HOG)
        for i, f in enumerate(full)
    ]
    return Window(now=now, steps=steps, systems=sys, hello=h)


NARROWED = replace(hello(0), cpu_affinity=(0, 1))  # 2 of the node's 8 cores

BURSTS: dict[str, tuple[tuple[bool, ...], CpuSample, CpuSample, Hello]] = {
    "3 of 5 samples full (the median full)": (
        (False, True, True, True, False),
        cores(2, busy=100),
        cores(2, busy=5),
        hello(0),
    ),
    "2 of 3 samples full": ((True, False, True), cores(2, busy=100), cores(2, busy=5), hello(0)),
    "its 2 cores of 8 full in 3 of 5 samples": (
        (True, True, False, True, False),
        cores(8, busy=5, pinned=2),
        cores(8, busy=5),
        NARROWED,
    ),
}


@pytest.mark.parametrize(("full", "busy", "idle", "h"), BURSTS.values(), ids=BURSTS.keys())
def test_a_burst_of_another_process_does_not_starve_a_run_on_the_host(
    full: tuple[bool, ...], busy: CpuSample, idle: CpuSample, h: Hello
) -> None:
    """ "Compute-bound, and starved of CPU" came from the median of the free cores alone:
    a few seconds of another process's CPU showed it. As causes.cpu_full: full in 3/4
    of the samples to enter; once shown, the median holds it."""
    burst = host_run(full, busy, idle, h)
    v = analyze(burst)
    assert (v.kind, v.severity, v.cause) == ("compute-bound", "ok", None), v
    sustained = analyze(host_run([True] * len(full), busy, idle, h))
    assert (sustained.severity, sustained.cause) == ("warning", "cpu-contention"), sustained
    held = analyze(burst, previous=sustained)
    assert held.headline.startswith("Compute-bound, and starved of CPU"), held


@pytest.mark.parametrize(
    ("main", "starved_before", "starved_after"),
    [
        (55.0, False, True),  # under the line: said
        (65.0, False, False),  # over it, not said before: not said
        (65.0, True, True),  # said, hovering over 60 %: held (it went ok and back)
        (75.0, True, False),  # past the exit: released
    ],
)
def test_starved_of_cpu_holds_while_the_main_process_hovers_near_the_line(
    main: float, starved_before: bool, starved_after: bool
) -> None:
    full = [True] * 5
    previous = analyze(host_run(full, cores(2, busy=100), cores(2, busy=5), hello(0)))
    assert previous.headline.startswith("Compute-bound, and starved of CPU"), previous
    v = analyze(
        host_run(full, cores(2, busy=100), cores(2, busy=5), hello(0), main=main),
        previous=previous if starved_before else None,
    )
    assert v.headline.startswith("Compute-bound, and starved of CPU") == starved_after, v


# --- 3. num_workers=0 on full cores ---------------------------------------------------------

WAIT = 0.06  # 60 % of a 100 ms step: the main process's CPU in the wait is its CPU / 0.6
HOGS = (TopProcess(300, 1, "hog.py", 750.0, 1 << 20),)


def full_host(
    in_wait_pct: float,
    now: float | None = None,
    top: tuple[TopProcess, ...] | None = HOGS,
    n: int = 8,
) -> Window:
    """num_workers=0, ``n`` cores none idle, the main process at ``in_wait_pct`` of a
    core at most in the wait, the node reading nothing."""
    start = T0 if now is None else now - 0.05 - 39 * 0.1
    steps = make_steps(wait=WAIT, start=start)
    t = steps[-1].end_time + 0.05
    sys = [
        system(
            t - (4 - i),
            cpu=cores(n, busy=100),
            procs=processes(in_wait_pct * WAIT / 0.1),
            disk_read=0.0,
            top=top,
        )
        for i in range(5)
    ]
    return Window(now=t, steps=steps, systems=sys, hello=hello(0))


def shown(cause: str) -> Verdict:
    return Verdict(
        "input-bound",
        "warning",
        0.9,
        "Input-bound",
        cause=cause,
        conditions=(f"input-bound/{cause}",),
    )


QUIET = (TopProcess(300, 1, "sshd", 5.0, 1 << 20),)  # no other process to name

# (shown cause; a figure near the line, where it holds, and the fresh judgement there;
# a figure past the other threshold, where it gives way, and to what; the node: its
# cores and the other processes)
HOLDS: dict[str, tuple[str, float, str, float, str, int, tuple[TopProcess, ...]]] = {
    "cpu-contention holds down to 50 %": (
        "cpu-contention",
        55.0,
        "few-workers",
        45.0,
        "few-workers",
        8,
        HOGS,
    ),
    "few-workers holds up to 70 %": (
        "few-workers",
        65.0,
        "cpu-contention",
        75.0,
        "cpu-contention",
        8,
        HOGS,
    ),
    "cpu-workers on its one core holds down to 50 %": (
        "cpu-workers",
        55.0,
        "few-workers",
        45.0,
        "few-workers",
        1,
        QUIET,
    ),
}


@pytest.mark.parametrize(
    ("previous", "near", "fresh", "past", "then", "n", "top"), HOLDS.values(), ids=HOLDS.keys()
)
def test_the_cause_holds_while_the_main_process_hovers_near_the_line(
    previous: str,
    near: float,
    fresh: str,
    past: float,
    then: str,
    n: int,
    top: tuple[TopProcess, ...],
) -> None:
    """A main process starved by others on full cores, near 60 % of a core in the wait,
    flipped between few-workers and cpu-contention: the shown cause holds within the
    band (50-70 %), a fresh judgement keeps the line itself (60 %)."""
    assert analyze(full_host(near, top=top, n=n), previous=shown(previous)).cause == previous
    assert analyze(full_host(near, top=top, n=n)).cause == fresh
    assert analyze(full_host(past, top=top, n=n), previous=shown(previous)).cause == then


@pytest.mark.parametrize("first", [55.0, 65.0])
def test_the_shown_cause_does_not_flip_as_the_figure_swings(first: float) -> None:
    """Four seconds at 55 %, four at 65 %, three times over (a tracker at 1 Hz): it
    showed the other cause after each swing."""
    other = 120.0 - first
    tracker = VerdictTracker()
    causes = []
    for k in range(24):
        figure = first if (k // 4) % 2 == 0 else other
        causes.append(tracker.analyze(full_host(figure, now=T0 + k)).cause)
    assert set(causes) == {causes[0]}, causes
    assert causes[0] == ("few-workers" if first < 60 else "cpu-contention")


NO_CORE_ADVICE: dict[str, tuple[tuple[TopProcess, ...] | None, str]] = {
    "others named": (
        HOGS,
        "stop, move or renice the other CPU consumers: hog.py (pid 300) 750 %",
    ),
    "no process table": (
        None,
        "find the other CPU consumers (top -o %CPU) and stop, move or renice them",
    ),
    "no other process over 10 %": (
        (TopProcess(300, 1, "sshd", 5.0, 1 << 20),),
        "find what takes them (top -o %CPU) and stop, move or renice it",
    ),
}


@pytest.mark.parametrize(("top", "free"), NO_CORE_ADVICE.values(), ids=NO_CORE_ADVICE.keys())
def test_with_no_core_idle_the_advice_says_what_a_worker_buys(
    top: tuple[TopProcess, ...] | None, free: str
) -> None:
    """0 of 8 cores idle, the main process at most 50 % of a core in the wait: it read
    "the loading waits (…) rather than computes; workers overlap the waits" and "set
    DataLoader(num_workers=1)" as if a core were free. Off-CPU there may be waiting
    for a core: a worker helps if the loading waits; one that computes needs a core."""
    v = analyze(full_host(50.0, top=top))
    assert v.cause == "few-workers", v
    assert not any("rather than computes" in e for e in v.evidence), v.evidence
    assert (
        "the main process uses at most 50 % of a core while the loop waits for its batches, "
        "and the node reads little; but none of the cores it may use is idle, so it may wait "
        "for a core as much as on the loading itself (a remote store, a lock, a sleep)"
    ) in v.evidence, v.evidence
    assert v.advice[:2] == (
        "if the loading waits (a remote store, a lock, a sleep), a worker overlaps the waits "
        "on little CPU: set DataLoader(num_workers=1) (now 0; 0 of 8 cores idle)",
        f"if it computes, a worker needs a core of its own and none is idle: {free}",
    ), v.advice
