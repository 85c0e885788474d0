"""What the starts of passes (epochs) cost: the first batch of a pass waits for its
loader to start (a DataLoader forking and initialising its workers again, a sampler's
``__iter__``), over what a first batch waits anyway (pure).

The probe names the steps that began a pass (``Hello.pass_starts``, its last 16, as of
its last hello). A first batch is made from nothing, so it waits longer than the steps
after it even when the start costs nothing: only its wait beyond a batch's making is the
start's cost. That reference is the longer of the other steps' 90th-percentile wait (a
loader without workers makes each batch in the wait) and ``num_workers`` periods of
the other steps (workers delivering in rounds make each batch over that long).

The second is an upper bound of a batch's making (a loop whose workers keep ahead makes
its periods longer than their batches take): right for telling a start's cost from a
slow loader's first batch, too high for what keeping the workers buys. The headroom
(``removed``) takes the first only, and is an upper bound too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import StepRecord
from gputop_dl.tui.analysis.thresholds import MAX_WINDOW_STEPS, PASS_OTHER_STEPS

REFERENCE_PERCENTILE = 0.9


@dataclass(frozen=True)
class PassStarts:
    """The starts of passes over the steps judged: from the oldest listed start among the
    recent steps to the last step the hello could list a start for."""

    passes: int  # pass starts among those steps
    first_wait_s: float  # a pass's first step's data wait, on average
    batch_wait_s: float  # what a first batch waits anyway (the reference above)
    share: float  # their waits beyond the reference / all the data wait of those steps
    removed: float  # their waits beyond the other steps' typical wait / the time of those
    #   steps: at most the step time the starts cost


def _wait(step: StepRecord) -> float:
    wait = step.wait_s or 0.0
    return wait if wait < step.period_s else step.period_s


def pass_start_costs(
    steps: Sequence[StepRecord],
    pass_starts: Sequence[int],
    known: int,
    workers: int | None,
) -> PassStarts | None:
    """``steps``: usable steps, oldest first; ``pass_starts``: the hello's; ``known``:
    its ``step_count`` (a start after it is not listed yet: the steps from there on are
    left out, or they would count a start as any other wait); ``workers``: the loader's
    ``num_workers`` (None: unknown). None without starts among the steps, or without
    enough other steps to tell what a batch waits anyway."""
    tail = steps[-MAX_WINDOW_STEPS:]
    if not pass_starts or not tail:
        return None
    listed = {i for i in pass_starts if tail[0].index <= i < known}
    if not listed:
        return None
    since = min(listed)
    judged = [s for s in tail if since <= s.index < known and s.wait_s is not None]
    firsts = [s for s in judged if s.index in listed]
    others = [s for s in judged if s.index not in listed]
    if not firsts or len(others) < PASS_OTHER_STEPS:
        return None
    waits = sorted(_wait(s) for s in others)
    typical = waits[int(REFERENCE_PERCENTILE * (len(waits) - 1))]
    rounds = (workers or 0) * sum(s.period_s for s in others) / len(others)
    reference = max(typical, rounds)
    first_waits = [_wait(s) for s in firsts]
    beyond = sum(max(0.0, w - reference) for w in first_waits)
    beyond_typical = sum(max(0.0, w - typical) for w in first_waits)
    waited = sum(_wait(s) for s in judged)
    span = sum(s.period_s for s in judged)
    if waited <= 0 or span <= 0:
        return None
    return PassStarts(
        passes=len(firsts),
        first_wait_s=sum(first_waits) / len(firsts),
        batch_wait_s=reference,
        share=beyond / waited,
        removed=beyond_typical / span,
    )
