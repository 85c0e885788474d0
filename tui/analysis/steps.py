"""Figures over the recent training steps: data-wait share, throughput, device idle."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import LoaderInfo, StepRecord
from gputop_dl.tui.analysis.thresholds import (
    CHUNK_S,
    CONFIDENCE_HORIZON_S,
    H2D_PHASE_NAMES,
    MAX_WINDOW_STEPS,
    MIN_SLOW_STEPS,
    MIN_STEPS,
    OUTLIER_FACTOR,
    OUTLIER_REPEAT,
    SKIP_FIRST_STEPS,
    SMALL_WAIT_SHARE,
    STEP_WINDOW_S,
    WARM_S,
)


@dataclass(frozen=True)
class StepStats:
    """Time-weighted figures over the step window.

    Shares are sums over the window (seconds waited / seconds elapsed), not medians:
    DataLoader workers deliver batches in bursts (N quick steps, then one long wait), and
    a median over such steps reads 0 % wait while the run is really input-bound.
    """

    n: int  # steps in the window
    span_s: float  # sum of their periods
    trimmed: int  # outlier steps left out
    mean_period_s: float
    wait_share: float | None  # None: no step reports wait_s (marked with probe.step)
    idle_share: float | None  # device idle during the data wait / period (device timing)
    mean_wait_s: float | None
    median_wait_s: float | None
    samples_per_s: float | None
    steps_per_s: float
    device_busy_share: float | None  # device_s / period; None without device timing
    caught_up_steps: int  # steps whose own data wait is small and that report whether the
    #   device had caught up with the host (StepRecord.device_caught_up)
    caught_up_share: float | None  # of those, the share where it had: it waited for the host
    timed_steps: int  # steps that report device_caught_up at all
    h2d_share: float | None  # copy phases / period; None when no step has such a phase
    h2d_phase: str | None  # the phase name that matched

    @property
    def lost_share(self) -> float | None:
        """The share of step time the data wait costs: device idle when measured, else the
        host's wait."""
        return self.idle_share if self.idle_share is not None else self.wait_share


def enough_steps(steps: Sequence[StepRecord]) -> bool:
    """Enough usable steps for a verdict: MIN_STEPS, or fewer slow ones covering WARM_S."""
    if len(steps) >= MIN_STEPS:
        return True
    return len(steps) >= MIN_SLOW_STEPS and sum(s.period_s for s in steps) >= WARM_S


def prefetched_steps(loader: LoaderInfo | None) -> int:
    """Steps after step 0 served from the batches the workers prepared during start-up:
    num_workers x prefetch_factor (torch's default factor 2 when it is not reported). They
    wait for nothing whatever the loader's steady rate, so they say nothing about it."""
    if loader is None or not loader.num_workers:
        return 0
    return loader.num_workers * (loader.prefetch_factor or 2)


def usable_steps(steps: Sequence[StepRecord], skip: int = 0) -> list[StepRecord]:
    """Steps that can enter statistics: not step 0 (nor the ``skip`` steps after it), with a
    positive finite period."""
    first = SKIP_FIRST_STEPS + skip
    inf = math.inf  # 0 < p < inf: positive and finite (NaN fails both), one comparison chain
    return [s for s in steps if s.index >= first and 0 < s.period_s < inf]


def recent(steps: Sequence[StepRecord], window_s: float = STEP_WINDOW_S) -> list[StepRecord]:
    """The steps that ended in the last STEP_WINDOW_S before the newest, at least MIN_STEPS.

    Measured from the newest step, not from the clock: a stall is judged separately and
    must not empty the window.
    """
    tail = list(steps[-MAX_WINDOW_STEPS:])
    if not tail:
        return []
    newest = max(s.end_time for s in tail)
    inside = [s for s in tail if s.end_time >= newest - window_s]
    return inside if len(inside) >= MIN_STEPS else tail[-MIN_STEPS:]


def trim_outlier(
    window: list[StepRecord], history: Sequence[StepRecord], steady: Collection[int] = ()
) -> list[StepRecord]:
    """Leave out the window's longest step when it is a one-off (an epoch start, the resume
    after a stall): OUTLIER_FACTOR times the median period, and no other step of the
    history comes within OUTLIER_REPEAT of it.

    Long steps that recur are the steady state of a loader delivering in rounds, and
    count in full; so do the starts of passes in ``steady`` (their indices), which the
    probe says recur at every pass at a cost that makes a run input-bound by itself
    (steady_starts), however few of them the history holds.
    """
    if len(window) < 2:
        return window
    longest = max(range(len(window)), key=lambda i: window[i].period_s)
    odd = window[longest]
    if odd.index in steady:
        return window
    median = statistics.median(s.period_s for s in history)
    if odd.period_s <= OUTLIER_FACTOR * median:
        return window
    near = odd.period_s / OUTLIER_REPEAT
    if any(s is not odd and s.period_s >= near for s in history):
        return window
    return window[:longest] + window[longest + 1 :]


def typical_period(steps: Sequence[StepRecord], count: int) -> float:
    """Median period of the last ``count`` steps (robust to the odd slow step)."""
    return statistics.median(s.period_s for s in steps[-count:])


def _h2d_seconds(step: StepRecord) -> tuple[float, str | None]:
    total = 0.0
    name: str | None = None
    for phase, seconds in step.phases:
        key = phase.lower()
        if key in H2D_PHASE_NAMES or key.startswith("h2d"):
            total += seconds
            name = name or phase
    return total, name


def _share(parts: Sequence[float], wholes: Sequence[float]) -> float | None:
    whole = sum(wholes)
    return sum(parts) / whole if parts and whole > 0 else None


def step_stats(
    steps: list[StepRecord], window_s: float = STEP_WINDOW_S, steady: Collection[int] = ()
) -> StepStats:
    """Figures over ``recent(steps)`` with a lone outlier trimmed (not a start of a pass
    in ``steady``). ``steps`` must be usable and enough for a verdict (``enough_steps``)."""
    window = recent(steps, window_s)
    kept = trim_outlier(window, steps[-MAX_WINDOW_STEPS:], steady)
    periods = [s.period_s for s in kept]
    span = sum(periods)

    waited = [s for s in kept if s.wait_s is not None]
    # A wait within its step. Here and below min(a, b) is written ``b if b < a else a``:
    # the same result (NaN included), without a call per step.
    waits = [p if (p := s.period_s) < (w := s.wait_s or 0.0) else w for s in waited]
    wait_share = _share(waits, [s.period_s for s in waited])

    counted = [s for s in kept if s.samples is not None]
    samples = sum(s.samples or 0 for s in counted)
    counted_span = sum(s.period_s for s in counted)

    timed = [s for s in kept if s.device_s is not None]
    idled = [s for s in kept if s.device_idle_s is not None]
    # With device timing, the wait costs only the part the device sat idle through: the
    # device may still drain queued work while the host waits for the next batch.
    both = [s for s in idled if s.wait_s is not None]
    idle_waits = [w if (w := s.wait_s or 0.0) < (i := s.device_idle_s or 0.0) else i for s in both]

    # A device that caught up while the host waited for data waits for the data, not for
    # the host's own work: only steps with a small data wait can show host overhead.
    reported = [s for s in kept if s.device_caught_up is not None]
    host_limited = [
        s for s in reported if s.wait_s is not None and s.wait_s <= SMALL_WAIT_SHARE * s.period_s
    ]

    copies = [(s, *_h2d_seconds(s)) for s in kept if s.phases]
    copy_names = [name for _, _, name in copies if name]

    return StepStats(
        n=len(kept),
        span_s=span,
        trimmed=len(window) - len(kept),
        mean_period_s=span / len(kept),
        wait_share=wait_share,
        idle_share=_share(idle_waits, [s.period_s for s in both]) if both else None,
        mean_wait_s=sum(waits) / len(waits) if waits else None,
        median_wait_s=statistics.median(waits) if waits else None,
        samples_per_s=samples / counted_span if counted and counted_span > 0 else None,
        steps_per_s=len(kept) / span,
        device_busy_share=_share([s.device_s or 0.0 for s in timed], [s.period_s for s in timed]),
        caught_up_steps=len(host_limited),
        caught_up_share=(
            sum(1 for s in host_limited if s.device_caught_up) / len(host_limited)
            if host_limited
            else None
        ),
        timed_steps=len(reported),
        h2d_share=(
            _share([sec for _, sec, _ in copies], [s.period_s for s, _, _ in copies])
            if copy_names
            else None
        ),
        h2d_phase=copy_names[0] if copy_names else None,
    )


def agreeing_time(
    steps: Sequence[StepRecord], agrees: Callable[[Sequence[StepRecord]], bool]
) -> float:
    """Seconds of consistent evidence: the newest steps, cut into chunks of at least
    CHUNK_S, back to the first chunk that does not agree (or CONFIDENCE_HORIZON_S).

    Measured in time, not in steps: five 1 s steps are as much evidence as fifty 0.1 s
    steps with the same split.
    """
    total = 0.0
    chunk_s: float = 0  # the periods of steps[start:end], added newest first
    start = end = len(steps)  # the chunk being filled: steps[start:end]
    while start > 0:
        if total + chunk_s >= CONFIDENCE_HORIZON_S:
            break
        start -= 1
        chunk_s += steps[start].period_s
        if chunk_s >= CHUNK_S:
            if not agrees(steps[start:end][::-1]):  # newest first, the order it was filled in
                return total
            total += chunk_s
            end, chunk_s = start, 0
    if start < end and agrees(steps[start:end][::-1]):
        total += chunk_s
    return total


def lost_share(steps: Sequence[StepRecord]) -> float | None:
    """The data wait's cost over ``steps`` as StepStats.lost_share computes it."""
    both = [s for s in steps if s.device_idle_s is not None and s.wait_s is not None]
    if both:  # min(idle, wait) and min(wait, period) written out as in step_stats
        return _share(
            [w if (w := s.wait_s or 0.0) < (i := s.device_idle_s or 0.0) else i for s in both],
            [s.period_s for s in both],
        )
    waited = [s for s in steps if s.wait_s is not None]
    return _share(
        [p if (p := s.period_s) < (w := s.wait_s or 0.0) else w for s in waited],
        [s.period_s for s in waited],
    )
