"""What the starts of passes (epochs) cost: the first batch of a pass waits for its
loader to start (a DataLoader forking and initialising its workers again, a sampler's
``__iter__``), over what a first batch waits anyway (pure).

The probe names the steps that began a pass (``Hello.pass_starts``, its last 16, as of
its last hello). A first batch is made from nothing, so it waits longer than the steps
after it even when the start costs nothing: only its wait beyond a batch's making is the
start's cost. That reference is the longer of the other steps' 90th-percentile wait (a
loader without workers makes each batch in the wait) and ``num_workers`` periods of
the other steps (workers delivering in rounds make each batch over that long).

The second holds only where the other steps wait in rounds (their 90th-percentile wait
a quarter of their period or more): workers that keep ahead make their batches in less
than their periods, and give no figure for it. Nor can a start be told from a first
batch where a pass is no longer than what ``iter()`` asks the workers for at once
(``num_workers`` x ``prefetch_factor`` batches): the whole pass is then made during its
first wait. The headroom takes the first reference only: an upper bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from gputop_dl.probe.messages import LoaderInfo, StepRecord
from gputop_dl.tui.analysis.thresholds import MAX_WINDOW_STEPS, PASS_OTHER_STEPS

REFERENCE_PERCENTILE = 0.9
ROUNDS_WAIT_SHARE = 0.25  # other steps waiting this share of their period: rounds
TORCH_PREFETCH_FACTOR = 2  # a DataLoader's default with workers


@dataclass(frozen=True)
class PassStarts:
    """The starts of passes over the steps judged: from the oldest listed start among the
    recent steps to the last step the hello could list a start for."""

    passes: int  # pass starts among those steps
    first_wait_s: float  # a pass's first step's data wait, on average
    batch_wait_s: float  # what a first batch waits anyway (the reference above)
    share: float  # their waits beyond the reference / all the data wait of those steps
    rate: float  # samples (or steps, without counts) a second over those steps
    ceiling: float  # the same without the first steps' waits beyond the other steps'
    #   typical wait, never above the rate without any wait: an upper bound
    per_sample: bool  # rate and ceiling count samples, not steps


def _wait(step: StepRecord) -> float:
    wait = step.wait_s or 0.0
    return wait if wait < step.period_s else step.period_s


def pass_start_costs(
    steps: Sequence[StepRecord],
    pass_starts: Sequence[int],
    known: int,
    loader: LoaderInfo | None,
) -> PassStarts | None:
    """``steps``: usable steps, oldest first; ``pass_starts``: the hello's; ``known``:
    its ``step_count`` (a start after it is not listed yet: the steps from there on are
    left out, or they would count a start as any other wait); ``loader``: the hello's.
    None without starts among the steps, without enough other steps to tell what a batch
    waits anyway, or with passes too short to tell a start from a first batch."""
    tail = steps[-MAX_WINDOW_STEPS:]
    if not pass_starts or not tail:
        return None
    listed = sorted({i for i in pass_starts if tail[0].index <= i < known})
    if not listed:
        return None
    workers = (loader.num_workers if loader is not None else None) or 0
    if workers and len(listed) >= 2:
        prefetch = loader.prefetch_factor if loader is not None else None
        asked = workers * (prefetch or TORCH_PREFETCH_FACTOR)
        if statistics.median(b - a for a, b in pairwise(listed)) <= asked:
            return None
    starts = set(listed)
    judged = [s for s in tail if listed[0] <= s.index < known and s.wait_s is not None]
    firsts = [s for s in judged if s.index in starts]
    others = [s for s in judged if s.index not in starts]
    if not firsts or len(others) < PASS_OTHER_STEPS:
        return None
    waits = sorted(_wait(s) for s in others)
    typical = waits[int(REFERENCE_PERCENTILE * (len(waits) - 1))]
    period = sum(s.period_s for s in others) / len(others)
    reference = max(typical, workers * period) if typical >= ROUNDS_WAIT_SHARE * period else typical
    first_waits = [_wait(s) for s in firsts]
    beyond = sum(max(0.0, w - reference) for w in first_waits)
    beyond_typical = sum(max(0.0, w - typical) for w in first_waits)
    waited = sum(_wait(s) for s in judged)
    span = sum(s.period_s for s in judged)
    if waited <= 0 or span <= waited:
        return None
    per_sample = all(s.samples is not None for s in judged)
    done = float(sum(s.samples or 0 for s in judged)) if per_sample else float(len(judged))
    return PassStarts(
        passes=len(firsts),
        first_wait_s=sum(first_waits) / len(firsts),
        batch_wait_s=reference,
        share=beyond / waited,
        rate=done / span,
        ceiling=done / (span - beyond_typical),
        per_sample=per_sample,
    )
