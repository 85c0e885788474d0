"""What limits a training run's throughput, from its recent steps and node samples.

``analyze(window)`` is a pure function: no I/O, no clock of its own (``window.now`` is the
time). It returns one primary :class:`Verdict` -- the condition that limits throughput, or
the most severe one -- and lists every other condition that holds in ``Verdict.notes``.
:class:`VerdictTracker` decides what the viewer shows, so the verdict does not flap:

    tracker = VerdictTracker()
    shown = tracker.analyze(window)          # = tracker.update(analyze(window, previous=
                                             #       tracker.shown), window.now)

Thresholds live in ``tui.analysis.thresholds``; ``docs/verdicts.md`` explains each verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gputop_dl.probe.messages import MARKED, Frame, Hello, LoaderInfo, Stack, StepRecord
from gputop_dl.probe.samples import SystemSample
from gputop_dl.probe.stack import framework_away
from gputop_dl.tui.analysis import fmt, knobs
from gputop_dl.tui.analysis.causes import (
    CPU_FULL_CAUSES,
    Cause,
    affinity_advice,
    awaits_samples,
    cores_full,
    cpu_lines,
    find_on_cores,
    input_cause,
    narrowed,
    workers_of,
)
from gputop_dl.tui.analysis.devices import DeviceState, device_states, own_device
from gputop_dl.tui.analysis.host import HostStats, Scope, host_stats
from gputop_dl.tui.analysis.passes import (
    PassStarts,
    WholePass,
    pass_start_costs,
    steady_starts,
)
from gputop_dl.tui.analysis.steps import (
    StepStats,
    agreeing_time,
    enough_steps,
    lost_share,
    prefetched_steps,
    step_stats,
    typical_period,
    usable_steps,
)
from gputop_dl.tui.analysis.stuck import (
    Ptrace,
    current,
    pyspy_advice,
    stack_evidence,
    where,
    workers_pyspy_advice,
)
from gputop_dl.tui.analysis.thresholds import (
    AWAY_LONG_FACTOR,
    AWAY_LONG_MIN_S,
    BATCH_HINT_MEM_MAX,
    BATCH_HINT_UTIL_PCT,
    BURSTY_RATIO,
    CARRY_S,
    CAUGHT_UP_ENTER,
    CAUGHT_UP_EXIT,
    CONFIDENT_S,
    CPU_QUOTA_ENTER_PCT,
    CPU_QUOTA_EXIT_PCT,
    FIRST_STEPS_STALL_S,
    GPU_MEM_FULL_ENTER,
    GPU_MEM_FULL_EXIT,
    H2D_ENTER,
    H2D_EXIT,
    HOST_CPU_FULL_FREE_CORES,
    INPUT_INFO_ENTER,
    INPUT_INFO_EXIT,
    INPUT_WARN_ENTER,
    INPUT_WARN_EXIT,
    LOW_GPU_UTIL_PCT,
    MAX_HEADROOM_FACTOR,
    MIN_SLOW_STEPS,
    MIN_STEPS,
    MIN_SYSTEMS,
    OTHER_NAMED_MIN_PCT,
    OUTSIDE_SHOW_S,
    OVERHEAD_MAX_UTIL_PCT,
    PASS_START_SHARE,
    PASS_START_STALL_FACTOR,
    PASS_START_STALL_STARTS,
    PCIE_RX_HIGH_BPS,
    PERSIST_S,
    PERSIST_UPDATES,
    PROCESS_SATURATED_PCT,
    SKIP_FIRST_STEPS,
    STABLE_WINDOW_S,
    STACK_GRACE_S,
    STALL_FACTOR,
    STALL_MIN_S,
    STALL_TYPICAL_STEPS,
    STARVED_EXIT_PCT,
    STARVED_MAIN_PCT,
    SWAP_IN_ENTER_BPS,
    SYSTEM_WINDOW_S,
    WARM_S,
)

SEVERITIES = ("ok", "info", "warning", "critical")
# Shown at once, and left at once: facts, not judgements that could flap.
IMMEDIATE_KINDS = frozenset({"stalled", "warming-up", "outside-loop", "starting-pass"})


@dataclass(frozen=True)
class Window:
    now: float  # Unix seconds
    steps: Sequence[StepRecord]  # this run's recent steps, oldest first
    systems: Sequence[SystemSample]  # this run's host samples, oldest first
    hello: Hello | None
    stack: Stack | None = None  # the newest stack the probe took in a stall
    ptrace: Ptrace | None = None  # could py-spy attach to the run from here (None: unknown)
    run_from: float | None = None  # the run's first step started (host samples before: start-up)
    # Whole passes the viewer kept where loaders take turns (passes.passes_to_keep): the
    # rest of a cycle whose other passes the steps do not hold.
    whole_passes: tuple[WholePass, ...] = ()
    # The median time outside the loop when it was left as it is now (a validation's)
    # and how many it is from: one that lasts much longer may hang (Run.usual_away).
    usual_away: tuple[float, int] | None = None
    # A viewer receives the run's messages now (True: its probe samples the node once a
    # second for it); None: not known (the probe samples every 5 s while none is).
    watched: bool | None = None


@dataclass(frozen=True)
class Verdict:
    kind: str  # "warming-up", "compute-bound", "input-bound", "stalled", ...
    severity: str  # "ok", "info", "warning", "critical"
    confidence: float  # 0..1
    headline: str
    cause: str | None = None  # input-bound cause: "few-workers", "disk", ... or "unknown"
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    headroom: str | None = None  # "without the data wait: ≈ 412 samples/s, +38 %"
    # Added fields (all optional for a consumer):
    notes: tuple[str, ...] = ()  # headlines of the other conditions that hold, worst first
    conditions: tuple[str, ...] = ()  # "kind" or "kind/cause" of every condition that held,
    #   primary first; analyze(previous=...) reads it to apply exit thresholds
    wait_share: float | None = None  # data wait / step time over the window (0..1)
    # The share the headline judged over passes instead (the starts of passes are most of
    # the wait): the data wait's, or the device's idle time's, over the passes judged.
    passes_share: float | None = None
    samples_per_s: float | None = None  # samples over the window / its time
    steps_per_s: float | None = None
    since: float | None = None  # set by VerdictTracker: when the shown kind/cause began
    # The evidence line a short screen shows: the cause's own first one (an input-bound
    # verdict's first line repeats the headline's wait share).
    lead: int = 0


# --- helpers ------------------------------------------------------------------------------


def _severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def _held(previous: Verdict | None, condition: str) -> bool:
    """Whether ``condition`` ("kind" or "kind/cause") held in the verdict shown before."""
    if previous is None:
        return False
    return any(c == condition or c.startswith(condition + "/") for c in previous.conditions)


def _time_confidence(seconds: float) -> float:
    """Consistent evidence in time: full after CONFIDENT_S seconds, whatever the step
    length (five 1 s steps weigh as much as fifty 0.1 s steps)."""
    return min(1.0, seconds / CONFIDENT_S)


def _share_confidence(ctx: _Ctx, agrees: Callable[[float], bool]) -> float:
    """Confidence from how long the data wait's share has agreed with the verdict."""

    def chunk_agrees(chunk: Sequence[StepRecord]) -> bool:
        share = lost_share(chunk)
        return share is not None and agrees(share)

    return _time_confidence(agreeing_time(ctx.steps, chunk_agrees))


def _margin(value: float, threshold: float, scale: float) -> float:
    """Far from its threshold a figure is trusted more: 0.6 at the threshold, 1.0 beyond
    ``scale``."""
    return 0.6 + 0.4 * min(1.0, abs(value - threshold) / scale)


def _rate(stats: StepStats) -> tuple[float, str]:
    if stats.samples_per_s is not None:
        return stats.samples_per_s, "samples/s"
    return stats.steps_per_s, "steps/s"


def _gain(rate: float, bound: float) -> str:
    """ "+43 %"; "no gain" where the bound is not above the rate now (not "+-0 %")."""
    change = (bound / rate - 1) * 100
    if not math.isfinite(change):  # a rate of steps too short to time
        return "gain unknown"
    pct = round(change)
    return f"+{pct} %" if pct > 0 else "no gain"


def beyond_bound(rate: float, ceiling: float) -> bool:
    """A ceiling over MAX_HEADROOM_FACTOR times the rate: the rest of the step is a sliver
    of it, and the figure ("+17327 %") says nothing a user can reach."""
    return ceiling > MAX_HEADROOM_FACTOR * rate


def _headroom(stats: StepStats, what: str, share: float) -> str | None:
    """Throughput if ``share`` of the step time went away, an upper bound: rate / (1 - share).
    Beyond MAX_HEADROOM_FACTOR times the rate the figure is withheld, with why: the step
    is nearly all ``what``, and what feeds it (the loader's own rate) is the bound."""
    if share <= 0 or share >= 1:
        return None
    rate, unit = _rate(stats)
    if rate <= 0:
        return None
    ceiling = rate / (1 - share)
    if beyond_bound(rate, ceiling):
        return (
            f"without {what}: no figure: the rest of the step is {fmt.pct(1 - share)} of it, "
            f"so its bound is over {MAX_HEADROOM_FACTOR:g}x today's rate and says nothing; "
            "what feeds the loop bounds it (measure the loader alone)"
        )
    return f"without {what}: at most ≈ {fmt.num(ceiling)} {unit}, {_gain(rate, ceiling)}"


def _any_wait(rate: float, ceiling: float) -> str:
    """The ceiling without any data wait beside an advice's bound: its figure, or that it
    is far beyond (beyond_bound)."""
    if beyond_bound(rate, ceiling):
        return f"without any data wait over {MAX_HEADROOM_FACTOR:g}x"
    return f"without any data wait ≈ {fmt.num(ceiling)}"


def _input_headroom(stats: StepStats, cause: Cause, share: float) -> str | None:
    """What the advice can buy: the loading's measured CPU cost per sample times the cores
    the advice gives it, and never more than the step without any data wait."""
    starts = cause.starts
    lengths = {each.pass_steps for each in starts.loaders} if starts is not None else set()
    if starts is not None and (starts.cycle or (len(lengths) == 1 and None not in lengths)):
        # Over the steps the starts were judged on (the window may hold more starts, or
        # fewer, than they do on average): its rate and its rate without those waits.
        # One loader's passes of several taking turns say so (not the run's rate); where
        # their length is not known either (a first evaluation), the window's headroom
        # (it read "+385 % (over the last pass)" for a cycle that would gain 59 %).
        unit = "samples/s" if starts.per_sample else "steps/s"
        if not starts.cycle:
            over = f"over the {lengths.pop():,}-step passes alone"
        else:
            over = _over_what(starts)
        return (
            f"without those waits: at most ≈ {fmt.num(starts.ceiling)} {unit}, "
            f"{_gain(starts.rate, starts.ceiling)} ({over}: {fmt.num(starts.rate)} {unit})"
        )
    plain = _headroom(stats, "the data wait", share)
    loaders, now_loaders = cause.waiting_loaders_after, cause.waiting_loaders_now
    if plain is not None and loaders is not None and loaders > max(1, now_loaders):
        # A main process that waits in the data wait delivers rate / share; n workers that
        # wait all the time the loop waits for them, rate / n each. n loaders, n times that.
        rate, unit = _rate(stats)
        ceiling = rate / (1 - share)
        pace = rate / now_loaders if now_loaders > 0 else rate / share
        bound = min(ceiling, loaders * pace)
        if bound < ceiling and not beyond_bound(rate, bound):
            return (
                f"with the advice: at most ≈ {fmt.num(bound)} {unit}, {_gain(rate, bound)} "
                f"({loaders} loaders waiting side by side, each at today's pace; "
                f"{_any_wait(rate, ceiling)})"
            )
        return plain
    now, after = cause.loader_cores_now, cause.loader_cores_after
    if plain is None or now is None or after is None or now <= 0:
        return plain
    rate, unit = _rate(stats)
    ceiling = rate / (1 - share)
    cost = now / rate  # CPU seconds of loading per sample (per step without batch sizes)
    bound = min(ceiling, after / cost)
    per = "sample" if unit == "samples/s" else "step"
    basis = f"loading {fmt.dur(cost)} CPU per {per}"
    if bound >= ceiling:
        if beyond_bound(rate, ceiling):
            return plain  # the figure withheld, with why
        return (
            f"without the data wait: at most ≈ {fmt.num(ceiling)} {unit}, "
            f"{_gain(rate, ceiling)} ({basis} keeps up on {fmt.cores(after)})"
        )
    if beyond_bound(rate, bound):
        return plain  # the advice's bound is as far beyond (a CPU cost near 0)
    return (
        f"with the advice: at most ≈ {fmt.num(bound)} {unit}, {_gain(rate, bound)} ({basis} "
        f"on {fmt.cores(after)}; {_any_wait(rate, ceiling)})"
    )


def _throughput_line(stats: StepStats) -> str:
    steps = f"{fmt.num(stats.steps_per_s)} steps/s"
    if stats.samples_per_s is None:
        return f"throughput {steps}"
    return f"throughput {fmt.num(stats.samples_per_s)} samples/s ({steps})"


def _window_text(stats: StepStats) -> str:
    trimmed = f", {stats.trimmed} outlier step left out" if stats.trimmed else ""
    return f"last {stats.n} steps, {fmt.dur(stats.span_s)}{trimmed}"


def _wait_lines(
    stats: StepStats, workers: int | None = None, starts: PassStarts | None = None
) -> list[str]:
    share = stats.wait_share or 0.0
    mean_wait = stats.mean_wait_s or 0.0
    lines = [
        f"data wait {fmt.pct(share)} of step time ({fmt.dur(mean_wait)} of "
        f"{fmt.dur(stats.mean_period_s)} per step, {_window_text(stats)})"
    ]
    if stats.idle_share is not None:
        lines.append(f"device idle while waiting: {fmt.pct(stats.idle_share)} of step time")
    median = stats.median_wait_s
    # Rounds of batches: workers each deliver one in turn. Without two of them, waits
    # that vary are the batches' own (their sizes, their items), not rounds.
    # Nor are waits at the starts of passes (said by the pass-start cause).
    rounds = workers is not None and workers >= 2
    if starts is not None and starts.share >= PASS_START_SHARE / 2:
        rounds = False
    if rounds and median is not None and mean_wait > 0 and median < BURSTY_RATIO * mean_wait:
        lines.append(
            f"waits come in bursts (median step waits {fmt.dur(median)}): batches arrive "
            "together, then the loop waits for the next round"
        )
    return lines


def _timing_note(hello: Hello | None) -> str:
    if hello is not None and hello.timing_note:
        return hello.timing_note
    return "no device timing"


def _lost_label(stats: StepStats) -> str:
    """What the input-bound share measures: device idle when timed, else the host's wait."""
    return "device idle waiting for data" if stats.idle_share is not None else "data wait"


def _has_device_timing(stats: StepStats) -> bool:
    return stats.device_busy_share is not None or stats.idle_share is not None


# --- warming up and stalls ------------------------------------------------------------------


def _progress(window: Window) -> tuple[float | None, int | None, float | None]:
    """(Unix time the newest step ended, its index, Unix time the watched loop was
    entered while the training is inside it): from the window's steps, or the progress
    the probe repeats in its hello (a viewer that attached during a hang has no steps).
    A stall or a slow start counts from the later of the step's end and the entry: a
    pass entered after an evaluation waits from there."""
    hello = window.hello
    end = max((s.end_time for s in window.steps), default=None)
    index = window.steps[-1].index if window.steps else None
    if hello is not None and hello.last_step_end is not None:
        end = hello.last_step_end if end is None else max(end, hello.last_step_end)
        if index is None or hello.step_count - 1 > index:
            index = hello.step_count - 1
    entered = hello.loop_since if hello is not None and hello.loop == "in-loop" else None
    return end, index, entered


def _warming_up(window: Window, steps: list[StepRecord]) -> Verdict:
    hello = window.hello
    if hello is not None and hello.loop == "not-started" and not (hello.step_count or window.steps):
        return _setting_up(window, hello)
    evidence: list[str] = []
    if window.steps:
        gap = window.now - max(s.end_time for s in window.steps)
        evidence.append(f"last step ended {fmt.dur(max(0.0, gap))} ago")
    elif window.hello is not None and window.hello.step_count == 0:
        evidence.append(
            f"no step yet, probe started {fmt.dur(window.now - window.hello.started)} ago"
        )
    slow = _slow_start(window, steps, evidence)
    if slow is not None:
        return slow
    if not window.steps and hello is not None and hello.step_count > 0:
        # Attached to a run under way: its replay of recent steps is on its way (it comes
        # within a second). Not "0 of 5 steps": the header already counts thousands.
        if hello.last_step_end is not None:
            gap = max(0.0, window.now - hello.last_step_end)
            evidence.append(f"its last step ended {fmt.dur(gap)} ago")
        return Verdict(
            "warming-up",
            "info",
            0.0,
            f"Waiting for the run's recent steps: {hello.step_count:,} steps so far,"
            " none received yet",
            evidence=tuple(evidence),
        )
    if SKIP_FIRST_STEPS and any(s.index < SKIP_FIRST_STEPS for s in window.steps):
        evidence.append("step 0 is not counted: it carries one-off start-up work")
    prefetched = prefetched_steps(window.hello.loader if window.hello else None)
    if prefetched and any(s.index <= prefetched for s in window.steps):
        evidence.append(
            f"nor steps 1-{prefetched}: they take the batches the workers prefetched "
            "during start-up"
        )
    return Verdict(
        "warming-up",
        "info",
        0.0,
        f"Warming up: {len(steps)} of {MIN_STEPS} steps needed for a verdict "
        f"(or {MIN_SLOW_STEPS} covering {fmt.dur(WARM_S)})",
        evidence=tuple(evidence),
    )


def _setting_up(window: Window, hello: Hello) -> Verdict:
    """The probe speaks, no step yet and no watched loop entered: the script makes its
    data or its model (`gputop demo` its dataset). Not "Warming up: 0 of 5 steps": no
    step is on its way yet. The kind stays "warming-up" (shown and left at once, no
    bottleneck of a run that ends there)."""
    evidence = [
        f"probe started {fmt.dur(max(0.0, window.now - hello.started))} ago; no watched "
        "loop entered yet, no step (data or model set-up)"
    ]
    cpu = _main_cpu_line(window)
    if cpu is not None:
        evidence.append(cpu)
    return Verdict(
        "warming-up",
        "info",
        0.0,
        "Setting up: the training loop has not started yet",
        evidence=tuple(evidence),
    )


def _slow_start(window: Window, steps: list[StepRecord], evidence: list[str]) -> Verdict | None:
    """In the loop, too few steps for a typical one, and none for FIRST_STEPS_STALL_S: a
    warning with where the training thread is. Not a stall: a first step may take
    minutes (torch.compile, NCCL setup), and a hang there looks the same."""
    hello = window.hello
    end, index, entered = _progress(window)
    if hello is None or entered is None:
        return None
    done = 0 if index is None else index + 1
    if done >= MIN_STEPS:
        # The probe knows a typical step (its rule): slow steps are judged as a stall
        # is, against it (usable steps leave out the prefetched ones: not the count).
        return None
    gap = window.now - (entered if end is None else max(end, entered))
    if gap <= FIRST_STEPS_STALL_S:
        return None
    evidence = [
        f"the loop was entered {fmt.dur(window.now - entered)} ago; "
        f"{done} of {MIN_STEPS} steps so far, none for {fmt.dur(gap)}",
        *evidence[1:],
    ]
    stack = current(window.stack, done - 1 if done else None)
    where, look = _where_it_waits(window, hello, stack)
    return Verdict(
        "warming-up",
        "warning",
        0.5,
        f"No step for {fmt.dur(gap)} in the training loop: a slow first step, or a hang "
        f"({done} of {MIN_STEPS} steps so far)",
        evidence=(*evidence, *where),
        advice=(
            "first steps can take minutes: torch.compile, NCCL or HCCL setup, cuDNN "
            "autotuning, DataLoader workers starting",
            look,
        ),
    )


def _where_it_waits(window: Window, hello: Hello, stack: Stack | None) -> tuple[list[str], str]:
    """Evidence of where a training with no step waits (its processes' CPU, the probe's
    stack of the training thread) and the advice to look further."""
    lines = []
    state = _process_state(window.systems, window.now, True)
    if state:
        lines.append(state)
    if stack is None:
        return lines, f"if it does not move, see where it waits: py-spy dump --pid {hello.pid}"
    return [*lines, *stack_evidence(stack)], pyspy_advice(hello.pid, hello.host, window.ptrace)


def _process_state(systems: Sequence[SystemSample], now: float, in_loop: bool) -> str | None:
    """What the training processes did in the newest recent sample, to tell hung from busy."""
    recent = [s for s in systems if s.processes is not None and s.time >= now - SYSTEM_WINDOW_S]
    sample = recent[-1] if recent else None
    if sample is None or sample.processes is None:
        return None
    main = [
        p.cpu_pct for p in sample.processes.processes if p.role == "main" and p.cpu_pct is not None
    ]
    workers = [
        p.cpu_pct
        for p in sample.processes.processes
        if p.role == "worker" and p.cpu_pct is not None
    ]
    if not main:
        return None
    text = f"main process {fmt.pct_value(max(main))} CPU"
    if workers:
        text += f", {len(workers)} workers {fmt.pct_value(sum(workers))} CPU in all"
    busy = max(main) >= PROCESS_SATURATED_PCT or sum(workers) >= PROCESS_SATURATED_PCT
    if not busy:
        return (
            text + ": nearly idle, so blocked (I/O, a lock, a collective waiting for another rank)"
        )
    if in_loop:  # the probe says the loop was not left: the time goes inside a step
        return text + ": busy inside a step (a very slow step, or stuck in Python code)"
    return text + ": busy outside the step loop (evaluation, checkpointing?)"


_LEFT_BY = {
    "exhausted": "the loader ran out",
    "break": "the loop broke off",
    # The loader raised where the probe's C-timed steps left it no frame to see the
    # exception's type (docs/protocol.md, loop_exit).
    "exception": "the loader raised an exception",
    # iter() of the watched loader ran, no batch asked of its iterator yet (the
    # script does something else between the two, or let go of the iterator)
    "not-iterated": "the loader's iterator was made, no batch asked of it",
    # the training thread left a framework's loop without its end (the HF Trainer has
    # no callback event for an exception)
    "framework-exception": "the framework's loop was left without its end: an exception",
    # a second thread asked the watched pass for batches while the first fetched: the
    # rest of the pass is the loader's own iterator, for both, untimed
    "shared": "two threads iterate one pass at once: the rest of it is not timed",
}


def _left_by(how: str) -> str:
    if how.startswith(MARKED):
        # probe.outside() in the script, or a framework callback's (Lightning's
        # validation, the HF Trainer's evaluation or checkpoint inside an epoch)
        return f"marked as left: probe.outside({how.removeprefix(MARKED)!r})"
    return _LEFT_BY.get(how, how)


def _main_cpu_line(window: Window) -> str | None:
    """The main training process's CPU in the newest recent node sample."""
    recent = [
        s
        for s in window.systems
        if s.processes is not None and s.time >= window.now - SYSTEM_WINDOW_S
    ]
    if not recent or recent[-1].processes is None:
        return None
    mains = [
        p for p in recent[-1].processes.processes if p.role == "main" and p.cpu_pct is not None
    ]
    pid = window.hello.pid if window.hello is not None else None
    mine = [p for p in mains if p.pid == pid] or mains
    if not mine:
        return None
    cpu = max(p.cpu_pct or 0.0 for p in mine)
    what = "busy" if cpu >= PROCESS_SATURATED_PCT / 2 else "mostly idle"
    return f"main process {fmt.pct_value(cpu)} CPU ({what})"


def _outside(window: Window) -> Verdict | None:
    """The training thread left its watched loop (evaluation, checkpointing, the end): not
    a stall, whatever the time since the last step."""
    hello = window.hello
    if hello is None or hello.loop != "outside" or hello.loop_since is None:
        return None
    away = max(0.0, window.now - hello.loop_since)
    if away < OUTSIDE_SHOW_S:
        return None
    how = hello.loop_exit or "unknown"
    if how.startswith("exception:"):
        headline = (
            f"Outside the training loop for {fmt.dur(away)}: it ended with "
            f"{how.removeprefix('exception:')}"
        )
    elif how == "exception":
        headline = (
            f"Outside the training loop for {fmt.dur(away)}: it ended with an exception "
            "from the loader"
        )
    elif how.startswith(MARKED):
        headline = f"Outside the training loop for {fmt.dur(away)}: {how.removeprefix(MARKED)}"
    elif how == "framework-exception":
        headline = (
            f"Outside the training loop for {fmt.dur(away)}: the framework's loop ended "
            "with an exception"
        )
    elif how == "shared":
        headline = (
            f"Outside the timed loop for {fmt.dur(away)}: two threads iterate one watched "
            "pass at once, its rest untimed"
        )
    elif how == "not-iterated":
        headline = (
            f"Outside the training loop for {fmt.dur(away)}: iter() made its loader's "
            "iterator, no batch asked for yet"
        )
    else:
        headline = f"Outside the training loop for {fmt.dur(away)} (evaluation or checkpoint?)"
    evidence = [
        f"the training loop was left {fmt.dur(away)} ago after {hello.step_count} steps "
        f"({_left_by(how)})"
    ]
    cpu = _main_cpu_line(window)
    evidence.append(cpu if cpu is not None else "main process CPU not sampled")
    usual = window.usual_away
    if usual is not None and away > max(AWAY_LONG_FACTOR * usual[0], usual[0] + AWAY_LONG_MIN_S):
        # A validation that hangs (a rank that died in a collective, a stuck loader)
        # is outside the loop too: longer than it takes, it is no longer just that.
        median, times = usual
        evidence.insert(
            0,
            f"{away / max(median, 1e-9):.1f}x the usual {fmt.dur(median)} (median of the "
            f"last {times} times)",
        )
        return Verdict(
            "outside-loop",
            "warning",
            0.8,
            headline + f", far longer than usual ({fmt.dur(median)}): a hang there?",
            evidence=tuple(evidence),
            advice=(
                f"if it should have ended, see where it waits: py-spy dump --pid {hello.pid}",
                pyspy_advice(hello.pid, hello.host, window.ptrace),
            ),
            conditions=("outside-loop",),
        )
    return Verdict(
        "outside-loop",
        "info",
        1.0,
        headline,
        evidence=tuple(evidence),
        advice=("steps resume when the loop is entered again",),
        conditions=("outside-loop",),
    )


def _stalled(window: Window, steps: list[StepRecord]) -> Verdict | None:
    """No step for much longer than usual. The steps in the window tell when the last step
    ended and what is typical; a viewer that attached during the hang has no steps and
    relies on the progress the probe repeats in its hello."""
    hello = window.hello
    if hello is not None and hello.loop == "outside":
        return None  # not in the loop: nothing is expected to step
    end, last_index, entered = _progress(window)
    if len(steps) >= MIN_STEPS:
        typical: float | None = typical_period(steps, STALL_TYPICAL_STEPS)
    elif hello is not None and hello.step_count >= MIN_STEPS:
        typical = hello.typical_period_s
    else:
        typical = None
    if typical is None or end is None:
        return None
    since = end if entered is None else max(end, entered)
    from_entry = since != end
    gap = window.now - since
    limit = max(STALL_FACTOR * typical, STALL_MIN_S)
    stack = current(window.stack, last_index)
    away = framework_away(stack) if stack is not None else None
    in_loop = hello is not None and hello.loop == "in-loop"
    if gap <= limit:
        # Before a stall the probe sends a stack only when it found the training thread in
        # a framework's evaluation or checkpoint code (probe.stack.AWAY_PEEK_FACTOR): a
        # validation Lightning runs between two fetches of a watched loader.
        if away is None:
            return None
        return _away(gap, away, _process_state(window.systems, window.now, in_loop))
    rule = (
        f"stall threshold {fmt.dur(limit)} "
        f"(max of {STALL_FACTOR:.0f}x typical step, {fmt.dur(STALL_MIN_S)})"
    )
    if from_entry:
        evidence = [f"the loop was entered {fmt.dur(gap)} ago, no step since; {rule}"]
        start = _pass_start_now(hello)
        if start is not None:
            usual, took = start
            starting = _starting_pass(window, gap, limit, usual, took, stack)
            if starting is not None:
                return starting
            # (a stack outside the loader: not the start's time; a start of 0 s: no ratio)
            if usual and (stack is None or stack.fetching):
                evidence.append(f"{took}: this start has taken {gap / usual:.1f}x that")
    else:
        evidence = [f"last step {last_index} ended {fmt.dur(gap)} ago; {rule}"]
    state = _process_state(window.systems, window.now, in_loop)
    if state:
        evidence.append(state)
    if away is not None:
        return _away(gap, away, state)
    if stack is None and gap <= limit + STACK_GRACE_S and hello is not None:
        return None  # the probe's stack is on its way: it may show the loop was left
    if stack is not None:
        evidence.extend(stack_evidence(stack))
    pid = window.hello.pid if window.hello is not None else None
    host = window.hello.host if window.hello is not None else None
    pyspy = f"otherwise see where it hangs: py-spy dump{'' if pid is None else f' --pid {pid}'}"
    if stack is not None and stack.fetching:
        # Inside the loader's next() (the probe's fact, from its clock or its own frame
        # on the stack): the loop waits for a batch that does not come.
        loader = hello.loader if hello is not None else None
        workers = loader.worker_pids if loader is not None else ()
        advice: tuple[str, ...] = (
            "the loop waits for its next batch: the loader hangs (a worker stuck in "
            "__getitem__, a read from a dead mount, a lock); a worker that died is "
            "reported by torch when its timeout= passes",
            workers_pyspy_advice(workers, host, window.ptrace)
            if workers
            else pyspy_advice(pid, host, window.ptrace),
        )
        headline = (
            f"Stalled: no batch for {fmt.dur(gap)} (the loop waits in the loader); "
            f"typical step {fmt.dur(typical)}"
        )
    else:
        advice = (
            "evaluation or a checkpoint run inside a step (Lightning's val_check_interval) "
            "clears by itself when the step ends (with probe.step, mark one between steps: "
            'with probe.outside("evaluation"): ...)',
            pyspy_advice(pid, host, window.ptrace) if stack is not None else pyspy,
        )
        headline = f"Stalled: no step for {fmt.dur(gap)}; typical step {fmt.dur(typical)}"
    return Verdict(
        "stalled",
        "critical",
        min(1.0, 0.5 + 0.5 * (gap - limit) / limit),
        headline,
        evidence=tuple(evidence),
        advice=advice,
        conditions=("stalled",),
    )


def _away(gap: float, away: tuple[str, Frame], state: str | None) -> Verdict:
    """No step for longer than a stall, the training thread in its framework's own
    evaluation or checkpoint code (the probe's stack): away from the loop, not stuck."""
    what, frame = away
    evidence = [f"no step for {fmt.dur(gap)}; the training thread is in {what}: at {where(frame)}"]
    if state:
        evidence.append(state)
    return Verdict(
        "outside-loop",
        "info",
        1.0,
        f"Outside the training loop for {fmt.dur(gap)}: {what} (the probe's stack)",
        evidence=tuple(evidence),
        advice=(
            "steps resume when it ends; with gputop's callback for the framework the probe "
            "says so itself, from its hooks",
        ),
        conditions=("outside-loop",),
    )


def _pass_start_now(hello: Hello | None) -> tuple[float | None, str] | None:
    """None unless the probe says the loop awaits the first step of a pass it listed (the
    current loader's newest start, its wait not known yet); then the median wait of that
    loader's last starts (None: none known) and which they are, "the last N passes". The
    median: one abnormal start (a cold first epoch, a hang that recovered) must not
    excuse the next ones."""
    if hello is None or not hello.passes:
        return None
    current = hello.passes[-1]
    waits_listed = len(current.waits) == len(current.starts)
    if not current.starts or not waits_listed or current.waits[-1] is not None:
        return None
    waits = [w for w in current.waits[:-1] if w is not None][-PASS_START_STALL_STARTS:]
    if not waits:
        return None, "the loader's first start seen: none to compare with"
    if len(waits) == 1:
        return waits[0], f"the last pass's first batch took {fmt.dur(waits[0])}"
    usual = statistics.median(waits)
    return (
        usual,
        f"the first batches of the last {len(waits)} passes took {fmt.dur(usual)} (median)",
    )


def _starting_pass(
    window: Window, gap: float, limit: float, usual: float | None, took: str, stack: Stack | None
) -> Verdict | None:
    """The loop entered ``gap`` ago and no step since, past the stall threshold
    ``limit``, the probe's ``stack`` (if taken) in the loader: a pass's start, judged
    against the median ``usual`` of the loader's last starts (info up to
    PASS_START_STALL_FACTOR times it), or, without them, as a first step is (a warning
    until FIRST_STEPS_STALL_S). None: a stall."""
    hello = window.hello
    if hello is None or (stack is not None and not stack.fetching):
        return None  # the probe's stack: not in the loader (the first step's own work)
    bound = FIRST_STEPS_STALL_S if usual is None else max(limit, PASS_START_STALL_FACTOR * usual)
    if gap > bound:
        return None
    where, look = _where_it_waits(window, hello, stack)
    return Verdict(
        "starting-pass",
        "warning" if usual is None else "info",
        0.5,
        f"Starting a pass: no batch for {fmt.dur(gap)} since the loop was entered ({took})",
        evidence=(f"the loop was entered {fmt.dur(gap)} ago, no step since; {took}", *where),
        advice=(
            "a pass's start forks the DataLoader's workers again (persistent_workers=False) "
            f"and runs worker_init_fn and the sampler's __iter__; called a stall past "
            f"{fmt.dur(bound)}",
            look,
        ),
        conditions=("starting-pass",),
    )


# --- candidates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    window: Window
    previous: Verdict | None
    stats: StepStats
    host: HostStats
    devices: list[DeviceState]
    steps: list[StepRecord]  # usable steps, oldest first
    own_device: tuple[str, int] | None  # ("GPU", 3): the rank's own accelerator, if matched
    device_note: str | None  # why the rank's own device could not be matched
    passes: PassStarts | None = None  # what the starts of passes cost (the probe's starts)
    host_from: float | None = None  # since when the host samples count (_stretch_from)

    @property
    def loader(self) -> LoaderInfo | None:
        return self.window.hello.loader if self.window.hello is not None else None

    @property
    def framework(self) -> str | None:
        return self.window.hello.framework if self.window.hello is not None else None


@dataclass(frozen=True)
class _Candidate:
    verdict: Verdict
    group: int  # order among equal severities: 0 limits throughput ... 5 healthy
    share: float = 0.0  # step time it costs, to rank limiters of the same severity

    @property
    def key(self) -> tuple[int, int, float]:
        return (-_severity_rank(self.verdict.severity), self.group, -self.share)


def _throughput(ctx: _Ctx) -> _Candidate:
    """Input-bound, compute-bound, or unknown when steps carry no wait time."""
    stats = ctx.stats
    share = stats.lost_share
    if share is None:
        return _unknown_wait(ctx)
    over = _over_passes(ctx)
    if over is not None:
        share = over.share
    kind, severity = _band(share, ctx.previous)  # share is known here
    if kind == "input-bound":
        return _input_bound(ctx, share, severity, over)
    return _compute_bound(ctx, share, over)


@dataclass(frozen=True)
class _OverPasses:
    """The share judged over the passes whose starts are judged, not over the window."""

    share: float  # the data wait's (or the device's idle time's) share of their time
    words: str  # over what: "over whole passes", "over the last 3 passes"
    passes: int  # starts judged


def _over_passes(ctx: _Ctx) -> _OverPasses | None:
    """The share over the passes judged when their starts are most of the wait: a window
    of a few seconds over part of a pass weighs its start as if the pass were that short
    (a window just after a start), or not at all (the rest of the pass, or the start left
    out as an outlier), and the headline swung with it: 5 s starts of 1,000-step passes
    (33 % over whole passes) read "8 %" with the cause named only in the 4 s after each
    start; passes of 3 s with 3 s starts read 83 % and 64 % in turn; a 0.4 s start of 50 s
    passes (0.9 %) read "moderately input-bound, 13 %" for 8 s of each. The device's idle
    time where that is what the window judges."""
    passes = ctx.passes
    if passes is None or passes.share < PASS_START_SHARE:
        return None  # the starts are not what the run waits for
    if not passes.cycle:
        return None  # one loader's passes of several taking turns: not the run's share
    share = passes.wait_share if ctx.stats.idle_share is None else passes.idle_share
    if share is None:
        return None
    return _OverPasses(share, _over_what(passes), passes.passes)


def _over_what(passes: PassStarts) -> str:
    """Over which passes their figures are: whole ones (scaled to passes the window does
    not hold whole), or the last ones judged."""
    if passes.whole:
        return "over whole passes"
    return "over the last pass" if passes.passes == 1 else f"over the last {passes.passes} passes"


def _passes_confidence(over: _OverPasses) -> float:
    """How far the starts judged vouch for a share over passes: one 0.6, three or more 1."""
    return min(1.0, 0.4 + 0.2 * over.passes)


def _input_bound(
    ctx: _Ctx, share: float, severity: str, over: _OverPasses | None = None
) -> _Candidate:
    stats = ctx.stats
    prev_cause = ctx.previous.cause if ctx.previous and ctx.previous.kind == "input-bound" else None
    hello = ctx.window.hello
    expected = hello is not None and hello.host_sampler
    # How long host samples of the loop have had to come: since the stretch they count
    # from (the first step, a re-entry), else since the process started.
    since = ctx.host_from if ctx.host_from is not None else (hello.started if hello else None)
    resumed = (
        ctx.host_from is not None
        and ctx.window.run_from is not None
        and ctx.host_from > ctx.window.run_from
    )
    cause = input_cause(
        ctx.host,
        ctx.loader,
        prev_cause,
        ctx.framework,
        stats.wait_share,
        expected,
        ctx.passes,
        run_age_s=ctx.window.now - since if since is not None else None,
        resumed=resumed,
        watched=ctx.window.watched,
    )
    threshold = INPUT_WARN_ENTER if severity == "warning" else INPUT_INFO_ENTER
    exit_at = INPUT_WARN_EXIT if severity == "warning" else INPUT_INFO_EXIT
    agreed = (
        _passes_confidence(over)
        if over is not None
        else _share_confidence(ctx, lambda s: s >= exit_at)
    )
    confidence = agreed * _margin(share, threshold, 0.10)
    if cause.name != "unknown":
        confidence *= cause.confidence
    label = "Input-bound" if severity == "warning" else "Moderately input-bound"
    what = _lost_label(stats)
    of = f"the time {over.words}" if over is not None else "step"
    waits = _wait_lines(stats, workers_of(ctx.loader, ctx.host), ctx.passes)
    verdict = Verdict(
        "input-bound",
        severity,
        round(confidence, 2),
        f"{label} ({what} {fmt.pct(share)} of {of}): {cause.summary}",
        cause=cause.name,
        evidence=(*waits, _throughput_line(stats), *cause.evidence),
        advice=cause.advice,
        headroom=_input_headroom(stats, cause, share),
        conditions=(f"input-bound/{cause.name}",),
        lead=len(waits) + 1 if cause.evidence else 0,
        passes_share=over.share if over is not None else None,
    )
    return _Candidate(verdict, 0 if severity == "warning" else 4, share)


def _starved(ctx: _Ctx, timed: bool) -> tuple[str, str, str] | None:
    """The loop's own work is the host's (no accelerator, no device timing) and its
    process gets well under a core while the cores it may use are full with others' work:
    (the line, the advice naming them, the cores' advice); None otherwise. A review: a
    CPU hog on the run's core halved it (7,898 -> 3,577 samples/s), shown "ok"."""
    hello = ctx.window.hello
    h = ctx.host
    if timed or ctx.devices or hello is None or hello.device is not None:
        return None
    # The cores full by the causes' rule (cores_full): in 3/4 of the samples to enter, a
    # burst of another process's CPU in a few of them is no starving; the median holds
    # it once the cores are said full.
    said = ctx.previous is not None and any(
        c.rpartition("/")[2] in CPU_FULL_CAUSES for c in ctx.previous.conditions
    )
    # Once said, held up to STARVED_EXIT_PCT: a main process the others starve hovers
    # near the line, and the verdict went ok and back every few samples.
    line = STARVED_EXIT_PCT if said else STARVED_MAIN_PCT
    if h.main_cpu_pct is None or h.main_cpu_pct >= line:
        return None
    if h.free_cores is None or not cores_full(h, HOST_CPU_FULL_FREE_CORES, said):
        return None
    gets = f"the main process gets {fmt.pct_value(h.main_cpu_pct)} of a core"
    affinity = affinity_advice(h)
    if narrowed(h) and affinity is not None:
        # The table is the node's busiest: which of them run on these cores it does not
        # say. The training's own share of the busy cores tells others are there.
        busy = (h.n_cores or 0) - h.free_cores
        if h.training_cpu_cores is None or h.training_cpu_cores >= 0.5 * busy:
            return None
        return (
            f"{gets} while the {h.n_cores} cores it may use are full with other processes",
            find_on_cores(h),
            affinity,
        )
    top = [(name, cpu) for name, cpu in h.others or () if cpu >= OTHER_NAMED_MIN_PCT][:3]
    if not top:
        return None
    named = ", ".join(f"{name} {fmt.pct_value(cpu)}" for name, cpu in top)
    return (
        f"{gets} while the host cores are full: {named}",
        f"stop, move or renice the other CPU consumers: {named}",
        "or give the run dedicated cores (taskset, a CPU-pinned container)",
    )


def _compute_bound(ctx: _Ctx, share: float, over: _OverPasses | None = None) -> _Candidate:
    stats = ctx.stats
    timed = _has_device_timing(stats)
    evidence = [*_wait_lines(stats, workers_of(ctx.loader, ctx.host)), _throughput_line(stats)]
    if stats.device_busy_share is not None:
        evidence.append(f"device busy {fmt.pct(stats.device_busy_share)} of step time")
    elif ctx.window.hello is None or ctx.window.hello.timing == "host":
        evidence.append(
            f"{_timing_note(ctx.window.hello)}: compute is the training loop's own time"
        )
    advice: list[str] = []
    for d in ctx.devices:
        if d.util_pct is not None and d.mem_share is not None:
            evidence.append(
                f"{d.label}: {fmt.pct_value(d.util_pct)} busy, memory {fmt.pct(d.mem_share)}"
            )
            if d.util_pct >= BATCH_HINT_UTIL_PCT and d.mem_share <= BATCH_HINT_MEM_MAX:
                advice.append(
                    f"{d.label} memory is {fmt.pct(d.mem_share)} used: a larger batch may "
                    "raise throughput (scale the learning rate with it)"
                )
    where = "the model step" if timed or ctx.devices else "the training loop's own work"
    starved = _starved(ctx, timed)
    if starved is not None:
        line, find, affinity = starved
        verdict = Verdict(
            "compute-bound",
            "warning",
            0.7,
            f"Compute-bound, and starved of CPU: {line}",
            cause="cpu-contention",
            evidence=tuple(dict.fromkeys([*evidence, *cpu_lines(ctx.host)])),
            advice=(find, affinity),
            conditions=("compute-bound", "compute-bound/cpu-contention"),
        )
        return _Candidate(verdict, 1, 0.0)
    verdict = Verdict(
        "compute-bound",
        "ok",
        round(
            (
                _passes_confidence(over)
                if over is not None
                else _share_confidence(ctx, lambda s: s < INPUT_INFO_ENTER)
            )
            * _margin(share, INPUT_INFO_ENTER, 0.05),
            2,
        ),
        f"Compute-bound: {where} limits throughput ({_lost_label(stats)} {fmt.pct(share)}"
        f"{' ' + over.words if over is not None else ''})",
        evidence=tuple(dict.fromkeys(evidence)),
        advice=tuple(dict.fromkeys(advice)),
        conditions=("compute-bound",),
        passes_share=over.share if over is not None else None,
    )
    return _Candidate(verdict, 5, 0.0)


def _unknown_wait(ctx: _Ctx) -> _Candidate:
    verdict = Verdict(
        "unknown",
        "info",
        0.0,
        "Bottleneck unknown: the steps carry no data-wait time (marked with probe.step)",
        evidence=(_throughput_line(ctx.stats),),
        advice=("iterate the loader through probe.watch(loader) to time the data wait",),
        conditions=("unknown",),
    )
    return _Candidate(verdict, 4, 0.0)


def _h2d(ctx: _Ctx) -> _Candidate | None:
    stats = ctx.stats
    limit = H2D_EXIT if _held(ctx.previous, "h2d-copies") else H2D_ENTER
    share = stats.h2d_share
    if share is None or share < limit:
        return None
    evidence = [
        f"phase '{stats.h2d_phase}' takes {fmt.pct(share)} of step time ({_window_text(stats)})",
        *_busy_links(ctx),
    ]
    advice = []
    loader = ctx.loader
    if loader is None or loader.pin_memory is not True:
        now = "now False" if loader is not None and loader.pin_memory is False else None
        now = now or knobs.setting(loader, "pin_memory")
        advice.append(
            f"{knobs.knob(ctx.framework, 'pin_memory', 'True')} ({now}): pageable memory is "
            "copied twice"
        )
    advice += [
        "tensor.to(device, non_blocking=True) so copies overlap compute",
        "fewer, larger copies per step: move the whole batch once; keep constants on device",
    ]
    verdict = Verdict(
        "h2d-copies",
        "warning",
        round(_time_confidence(stats.span_s) * _margin(share, H2D_ENTER, 0.10), 2),
        f"Host-to-device copies take {fmt.pct(share)} of each step",
        evidence=tuple(evidence),
        advice=tuple(advice),
        headroom=_headroom(stats, "the copies", share),
        conditions=("h2d-copies",),
    )
    return _Candidate(verdict, 0, share)


def _busy_links(ctx: _Ctx) -> list[str]:
    return [
        f"{label}: PCIe receive {fmt.bps(rx)}"
        for label, rx in _pcie_rx(ctx)
        if rx >= PCIE_RX_HIGH_BPS
    ]


def _pcie_rx(ctx: _Ctx) -> list[tuple[str, float]]:
    """Newest PCIe receive rate per GPU of this run."""
    newest: dict[tuple[str, int], float] = {}
    for s in ctx.window.systems:
        if s.time < ctx.window.now - SYSTEM_WINDOW_S:
            continue
        for g in s.gpus:
            if g.pcie_rx_bps is not None:
                newest[(s.host, g.index)] = g.pcie_rx_bps
    return [
        (f"GPU {index}", rx)
        for (_, index), rx in sorted(newest.items())
        if ctx.own_device is None or ctx.own_device == ("GPU", index)
    ]


def _overhead(ctx: _Ctx) -> _Candidate | None:
    """The device waits for the host's own work: in most steps that barely waited for data,
    the device had already finished everything queued when the host queued the step."""
    stats = ctx.stats
    share, n = stats.caught_up_share, stats.caught_up_steps
    limit = CAUGHT_UP_EXIT if _held(ctx.previous, "host-overhead") else CAUGHT_UP_ENTER
    # Too few such steps, or most steps wait for data: the input verdict explains it.
    if share is None or n < MIN_STEPS or 2 * n < stats.timed_steps or share < limit:
        return None
    # A step that ends in a host sync (loss.item()) is "caught up" even when the device is
    # the bottleneck: a device that NVML shows busy is not waiting for the host.
    busy_devices = [
        d for d in ctx.devices if d.util_pct is not None and d.util_pct >= OVERHEAD_MAX_UTIL_PCT
    ]
    if busy_devices:
        return None
    caught = round(share * n)
    evidence = [
        f"the device had caught up with the host (and waited for it) in {caught} of {n} "
        f"steps that waited < 5 % for data ({_window_text(stats)})"
    ]
    busy = stats.device_busy_share
    headroom = None
    if busy is not None and 0 < busy < 1:
        evidence.append(f"device busy {fmt.pct(busy)} of step time")
        rate, unit = _rate(stats)
        headroom = (
            f"if the host kept the device busy: at most ≈ {fmt.num(rate / busy)} {unit}, "
            f"{_gain(rate, rate / busy)}"
        )
    verdict = Verdict(
        "host-overhead",
        "warning",
        round(_time_confidence(stats.span_s) * _margin(share, CAUGHT_UP_ENTER, 0.3), 2),
        f"Host overhead: the device waits for the host in {fmt.pct(share)} of steps",
        evidence=(*evidence, *_busy_links(ctx)),
        advice=(
            "CUDA graphs or torch.compile(mode='reduce-overhead') cut per-kernel launch cost",
            "a larger batch does more work per launch",
            "avoid host syncs inside the step (.item(), .cpu(), printing tensors)",
        ),
        headroom=headroom,
        conditions=("host-overhead",),
    )
    return _Candidate(verdict, 0, 1.0 - busy if busy is not None else 0.0)


def _throttling(ctx: _Ctx) -> _Candidate | None:
    slowed = [d for d in ctx.devices if d.slowdown]
    capped = [d for d in ctx.devices if d.power_capped and not d.slowdown]
    if not slowed and not capped:
        return None
    evidence = [f"{d.label}: clock slowdown ({', '.join(d.slowdown)})" for d in slowed]
    for d in capped:
        watts = ""
        if d.power_w is not None and d.power_limit_w is not None:
            watts = f", {d.power_w:.0f} of {d.power_limit_w:.0f} W"
        evidence.append(f"{d.label}: at its power cap while busy (sw_power_cap{watts})")
    if slowed:
        names = ", ".join(d.label for d in slowed)
        headline = f"Throttling: {names} clocks slowed down ({', '.join(slowed[0].slowdown)})"
        advice: tuple[str, ...] = (
            "thermal: check cooling, airflow, fans and the GPU temperature",
            "hw_power_brake / hw_slowdown: the board or power supply asks for it: check PSU "
            "and power cables",
        )
        severity = "warning"
    else:
        names = ", ".join(d.label for d in capped)
        headline = f"Power-limited: {names} runs at its power cap"
        advice = ("normal at full load; `nvidia-smi -q -d POWER` shows the limit in force",)
        severity = "info"
    verdict = Verdict(
        "throttling",
        severity,
        0.8,
        headline,
        evidence=tuple(evidence),
        advice=advice,
        conditions=("throttling",),
    )
    return _Candidate(verdict, 1)


def _gib(d: DeviceState) -> str:
    if d.mem_used_bytes is None or not d.mem_total_bytes:
        return ""
    return f" ({d.mem_used_bytes / 2**30:.1f} of {d.mem_total_bytes / 2**30:.1f} GiB)"


def _gpu_memory(ctx: _Ctx) -> _Candidate | None:
    limit = GPU_MEM_FULL_EXIT if _held(ctx.previous, "gpu-memory-full") else GPU_MEM_FULL_ENTER
    full = [d for d in ctx.devices if d.mem_share is not None and d.mem_share >= limit]
    if not full:
        return None
    evidence = [f"{d.label}: {fmt.pct(d.mem_share or 0)} of memory used{_gib(d)}" for d in full]
    verdict = Verdict(
        "gpu-memory-full",
        "warning",
        0.9,
        f"{full[0].label} memory {fmt.pct(full[0].mem_share or 0)} full: out-of-memory risk",
        evidence=tuple(evidence),
        advice=(
            "a smaller batch with gradient accumulation keeps the effective batch",
            "mixed precision (bf16/fp16) or activation checkpointing cut activation memory",
        ),
        conditions=("gpu-memory-full",),
    )
    return _Candidate(verdict, 3)


def _cpu_quota(ctx: _Ctx, primary_cause: str | None) -> _Candidate | None:
    """The container's CPU limit throttles the run (when it is not already the input-bound
    cause)."""
    h = ctx.host
    if primary_cause == "cpu-quota" or h.throttled_pct is None or h.n_host_samples < MIN_SYSTEMS:
        return None
    limit = CPU_QUOTA_EXIT_PCT if _held(ctx.previous, "cpu-quota") else CPU_QUOTA_ENTER_PCT
    if h.throttled_pct < limit:
        return None
    # A device busy nearly all the time is not slowed by the host's quota.
    busy = ctx.stats.device_busy_share
    severity = "info" if busy is not None and busy >= 0.85 else "warning"
    quota = f" (quota {fmt.cores(h.quota_cores)})" if h.quota_cores is not None else ""
    verdict = Verdict(
        "cpu-quota",
        severity,
        0.8,
        f"CPU quota: the container was throttled in {fmt.pct_value(h.throttled_pct)} of CPU "
        f"periods{quota}",
        evidence=(
            f"cgroup cpu.stat: {fmt.pct_value(h.throttled_pct)} of periods throttled "
            f"(median of {h.n_host_samples} samples)",
        ),
        advice=("raise the container's CPU limit (docker --cpus, resources.limits.cpu)",),
        conditions=("cpu-quota",),
    )
    return _Candidate(verdict, 2)


def _side_notes(ctx: _Ctx, primary: Verdict) -> list[str]:
    """Observations that are not verdicts of their own but matter next to one."""
    notes: list[str] = []
    if ctx.device_note is not None:
        notes.append(ctx.device_note)
    h = ctx.host
    if (
        primary.cause != "memory"
        and h.swap_in_bps is not None
        and h.swap_in_bps >= SWAP_IN_ENTER_BPS
        and h.n_host_samples >= MIN_SYSTEMS
    ):
        notes.append(f"the host swaps in {fmt.bps(h.swap_in_bps)}: everything slows down")
    if primary.kind == "compute-bound" and not _has_device_timing(ctx.stats):
        idle = [d for d in ctx.devices if d.util_pct is not None and d.util_pct < LOW_GPU_UTIL_PCT]
        for d in idle:
            notes.append(
                f"{d.label} only {fmt.pct_value(d.util_pct or 0)} busy though the loop does not "
                f"wait for data: host-side work may limit ({_timing_note(ctx.window.hello)})"
            )
    if ctx.stats.h2d_share is None and primary.kind != "h2d-copies":
        for link in _busy_links(ctx):
            notes.append(f"{link}: copies may cost time; time them with probe.phase('h2d')")
    return notes


def _combine(candidates: list[_Candidate], ctx: _Ctx) -> Verdict:
    ordered = sorted(candidates, key=lambda c: c.key)
    primary = ordered[0].verdict
    others = [c.verdict for c in ordered[1:]]
    notes = [v.headline for v in others] + _side_notes(ctx, primary)
    return replace(
        primary,
        notes=tuple(notes),
        conditions=tuple(c for v in (primary, *others) for c in v.conditions),
        wait_share=ctx.stats.wait_share,
        samples_per_s=ctx.stats.samples_per_s,
        steps_per_s=ctx.stats.steps_per_s,
    )


_Builder = Callable[[_Ctx], "_Candidate | None"]
_BUILDERS: tuple[_Builder, ...] = (_h2d, _overhead, _throttling, _gpu_memory)


def _band(share: float | None, previous: Verdict | None) -> tuple[str, str]:
    """The (kind, severity) the data wait's share gives, with the exit thresholds of what
    ``previous`` shows (as _throughput decides)."""
    if share is None:
        return ("compute-bound", "ok")  # no figure: nothing to hold the shown verdict on
    held_warning = (
        previous is not None and previous.kind == "input-bound" and previous.severity == "warning"
    )
    warn_at = INPUT_WARN_EXIT if held_warning else INPUT_WARN_ENTER
    info_at = INPUT_INFO_EXIT if _held(previous, "input-bound") else INPUT_INFO_ENTER
    if share >= warn_at:
        return ("input-bound", "warning")
    if share >= info_at:
        return ("input-bound", "info")
    return ("compute-bound", "ok")


_BANDS = (("compute-bound", "ok"), ("input-bound", "info"), ("input-bound", "warning"))


def _stable_stats(
    steps: list[StepRecord], previous: Verdict | None, steady: frozenset[int] = frozenset()
) -> StepStats:
    """The last STEP_WINDOW_S decide, unless they would lower the input-bound verdict shown
    while the last STABLE_WINDOW_S still support it: then the longer window's figures are
    the ones judged and shown. A rising wait is shown fast, an easing one only once it
    has eased for a while (a loader delivering in rounds swings the short window)."""
    short = step_stats(steps, steady=steady)
    if previous is None or previous.kind != "input-bound":
        return short
    shown = (previous.kind, previous.severity)
    if _BANDS.index(_band(short.lost_share, previous)) >= _BANDS.index(shown):
        return short
    stable = step_stats(steps, STABLE_WINDOW_S, steady)
    return stable if _band(stable.lost_share, previous) == shown else short


def _scope(hello: Hello | None) -> Scope:
    """What of the node is this run's, from the probe's own facts."""
    if hello is None:
        return Scope()
    loader = hello.loader
    # The loader's own pids are its workers (compiler or logger children are not);
    # with num_workers=0 there are none. Unknown otherwise: the sampler's roles stand in.
    known = loader is not None and (bool(loader.worker_pids) or loader.num_workers == 0)
    return Scope(
        affinity=frozenset(hello.cpu_affinity),
        quota_cores=hello.cpu_quota_cores,
        main_pid=hello.pid,
        worker_pids=frozenset(loader.worker_pids) if known and loader is not None else None,
    )


def _stretch_from(window: Window, steps: list[StepRecord]) -> float | None:
    """Since when the host samples describe the loop as it runs now: its first step, or
    later its re-entry (after an evaluation outside it), or the end of the newest step
    that hung (as long as a stall: STALL_FACTOR x typical, STALL_MIN_S at least): a
    sample of the evaluation or of the hang would name its cause for the steps after it
    (a review: "cause unknown, 1.5 cores idle" for 4 s after each evaluation, with the
    host 96 % busy)."""
    start = window.run_from
    if len(steps) < MIN_STEPS:
        return start
    # as long as a stall (a step that long would have been one), not a worker's restart
    long = max(STALL_MIN_S, STALL_FACTOR * typical_period(steps, len(steps)))
    hello = window.hello
    if hello is not None and hello.loop == "in-loop" and hello.loop_since is not None:
        # Re-entered after a long time outside (an evaluation), not at a mere epoch's
        # turn (a small dataset's epochs are seconds apart: each would empty the window).
        entered = hello.loop_since
        before = [s.end_time for s in window.steps if s.end_time <= entered]
        if not before or entered - max(before) >= long:
            start = entered if start is None else max(start, entered)
    # any step of the window: a prefetched one may hang as well
    hung = next((s for s in reversed(window.steps) if s.period_s > long), None)
    if hung is not None:
        start = hung.end_time if start is None else max(start, hung.end_time)
    return start


def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
    """The verdict for ``window``. ``previous`` is the verdict shown now (hysteresis: a
    condition it holds is left only below its exit threshold)."""
    hello = window.hello
    skip = prefetched_steps(hello.loader if hello else None)
    steps = usable_steps(window.steps, skip)
    special = _outside(window) or _stalled(window, steps)
    if special is not None:
        return special
    if not enough_steps(steps):
        return _warming_up(window, steps)
    own, note = own_device(window.systems, hello.device if hello else None)
    host_from = _stretch_from(window, steps)
    ctx = _Ctx(
        window=window,
        previous=previous,
        stats=_stable_stats(
            steps, previous, steady_starts(hello.passes, steps) if hello else frozenset()
        ),
        host=host_stats(
            window.systems,
            hello.host if hello else None,
            window.now,
            _scope(hello),
            host_from,
        ),
        devices=device_states(window.systems, window.now, own),
        steps=steps,
        own_device=own,
        device_note=note,
        passes=(
            pass_start_costs(
                steps,
                hello.passes,
                hello.step_count,
                [whole for whole in window.whole_passes if usable_steps([whole.first], skip)],
            )
            if hello is not None
            else None
        ),
        host_from=host_from,
    )
    main = _throughput(ctx)
    candidates = [main, *(c for b in _BUILDERS if (c := b(ctx)) is not None)]
    quota = _cpu_quota(ctx, main.verdict.cause)
    if quota is not None:
        candidates.append(quota)
    return _combine(candidates, ctx)


# --- hysteresis -----------------------------------------------------------------------------


def _identity(verdict: Verdict) -> tuple[str, str | None, str]:
    return (verdict.kind, verdict.cause, verdict.severity)


def _refines(verdict: Verdict, shown: Verdict) -> bool:
    """``verdict`` names the cause that ``shown`` could not name yet (too few host samples):
    the same kind, no new claim taken back, so it is shown at once rather than after
    PERSIST_S (that delay guards against flapping between two causes, not against news)."""
    return (
        verdict.kind == shown.kind
        and shown.cause == "unknown"
        and verdict.cause not in (None, "unknown")
    )


class VerdictTracker:
    """Hysteresis over successive verdicts of one run (clock-free: ``now`` is given).

    A verdict with a new kind, cause or severity replaces the shown one only after it held
    for PERSIST_S over at least PERSIST_UPDATES consecutive updates; "stalled" and
    "warming-up" are shown, and left, at once, and so is a cause found where the shown
    verdict said "unknown". A verdict of the shown kind refreshes the
    figures at once. Back in the loop after a fact (outside the loop, a stall), the last
    judgement stands as the shown one: a new verdict replaces it as it would have replaced
    it before, and one of its kind that cannot name a cause for want of host samples yet
    keeps its cause for up to CARRY_S (carry_over).
    """

    def __init__(self, persist_s: float = PERSIST_S, persist_updates: int = PERSIST_UPDATES):
        self._persist_s = persist_s
        self._persist_updates = persist_updates
        self._shown: Verdict | None = None
        self._candidate: tuple[str, str | None, str] | None = None
        self._candidate_since = 0.0
        self._candidate_count = 0
        self._judged: Verdict | None = None  # the last judgement shown (no fact kind)
        self._carry_until: float | None = None  # see update

    @property
    def shown(self) -> Verdict | None:
        """The verdict shown now."""
        return self._shown

    @property
    def judged(self) -> Verdict | None:
        """The last judgement of the loop shown (not a fact: outside the loop, a stall,
        warming up): an ended run's bottleneck (ended_verdict)."""
        return self._judged

    @property
    def basis(self) -> Verdict | None:
        """The verdict to pass to ``analyze(..., previous=)``: the shown one, or while a
        fact is shown the judgement before it (back in the loop its exit thresholds and
        cause hold, not a fresh start's)."""
        shown = self._shown
        if shown is not None and shown.kind in IMMEDIATE_KINDS and self._judged is not None:
            return self._judged
        return shown

    def analyze(self, window: Window) -> Verdict:
        """Analyze ``window`` with this tracker's hysteresis and return what to show."""
        return self.update(analyze(window, previous=self.basis), window.now)

    def update(self, verdict: Verdict, now: float) -> Verdict:
        shown = self._shown
        judged = self._judged
        if (
            shown is not None
            and judged is not None
            and shown.kind in IMMEDIATE_KINDS
            and verdict.kind not in IMMEDIATE_KINDS
        ):
            # Back in the loop: the judgement before the fact is what is shown again. The
            # fact said nothing against it (an evaluation is no evidence on the loader);
            # showing the new verdict at once put "cause pending" after every evaluation.
            shown = self._shown = judged
            self._candidate, self._candidate_count = None, 0
            self._carry_until = now + CARRY_S
        if judged is not None and self._carry_until is not None:
            if now < self._carry_until and shown is not None and shown.kind not in IMMEDIATE_KINDS:
                carried = carry_over(verdict, judged)
                if carried is not None:
                    self._shown = replace(carried, since=judged.since)
                    return self._shown
            else:
                self._carry_until = None
        if (
            shown is None
            or _identity(verdict) == _identity(shown)
            or verdict.kind in IMMEDIATE_KINDS
            or shown.kind in IMMEDIATE_KINDS
            or _refines(verdict, shown)
        ):
            keep_since = shown is not None and _identity(verdict) == _identity(shown)
            since = shown.since if keep_since and shown is not None else now
            return self._show(verdict, since)
        key = _identity(verdict)
        if key != self._candidate or now < self._candidate_since:
            self._candidate, self._candidate_since, self._candidate_count = key, now, 0
        self._candidate_count += 1
        held = now - self._candidate_since
        if held >= self._persist_s and self._candidate_count >= self._persist_updates:
            return self._show(verdict, self._candidate_since)
        return shown

    def _show(self, verdict: Verdict, since: float | None) -> Verdict:
        self._shown = replace(verdict, since=since)
        self._candidate, self._candidate_count = None, 0
        if verdict.kind not in IMMEDIATE_KINDS:
            self._judged = self._shown
            self._carry_until = None  # news shown: nothing is carried any more
        return self._shown


CARRIED = (
    "cause as judged before the loop resumed: too few host samples since then to judge it again"
)
# What an ended run showed last that is no bottleneck of its own: the state it ended in.
ENDED_STATES = frozenset({"outside-loop", "starting-pass", "warming-up"})


def carry_over(verdict: Verdict, judged: Verdict) -> Verdict | None:
    """``judged`` (the judgement before the loop was left), with ``verdict``'s figures,
    where ``verdict`` is of its kind but cannot name a cause for want of host samples of
    the loop as it runs now ("cause pending", "only 1 host sample"): nothing new said
    against it. None where ``verdict`` says something: a cause, another kind, or that
    nothing measured explains the wait."""
    if verdict.kind != judged.kind or verdict.cause != "unknown":
        return None
    if judged.cause in (None, "unknown") or not awaits_samples(verdict.evidence):
        return None
    evidence = judged.evidence if CARRIED in judged.evidence else (CARRIED, *judged.evidence)
    return replace(
        judged,
        evidence=evidence,
        wait_share=verdict.wait_share,
        samples_per_s=verdict.samples_per_s,
        steps_per_s=verdict.steps_per_s,
    )


def ended_verdict(shown: Verdict | None, judged: Verdict | None) -> Verdict | None:
    """What an ended run's banner and snapshot say: its bottleneck, the last judgement of
    its loop, where what was shown last is only the state it ended in (outside the loop
    after a last evaluation, a pass starting, warming up); "Last verdict: Outside the
    training loop" hid what limited it. A stall or any judgement stays: how it ended."""
    if shown is None or judged is None or shown.kind not in ENDED_STATES:
        return shown
    note = f"last judged in the training loop; at its end: {shown.headline}"
    return replace(judged, evidence=(note, *judged.evidence))
