"""What the starts of passes (epochs) cost: the first batch of a pass waits for its
loader to start (a DataLoader forking and initialising its workers again, a sampler's
``__iter__``), over what a first batch waits anyway (pure).

The probe names the steps that began a pass (``Hello.passes``: the last 16 of each loader
an outermost loop ran over lately, as of its last hello); a step belongs to the pass
begun last before it, whichever loader's, and each loader is judged on its own passes
with its own settings. A first batch is made from nothing, so it waits longer than the steps
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

import math
import statistics
import sys
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

from gputop_dl.probe.messages import LoaderInfo, LoaderPasses, StepRecord
from gputop_dl.tui.analysis.thresholds import (
    INPUT_WARN_ENTER,
    MAX_WINDOW_STEPS,
    PASS_OTHER_STEPS,
    PASS_START_STALL_STARTS,
    STEP_WINDOW_S,
)

REFERENCE_PERCENTILE = 0.9
KEPT_LOST = 0.05  # a kept pass may miss this share of its other steps (messages lost)
KEPT_STARTS = 16  # the whole passes a viewer keeps are among this many last starts
CYCLE_EVIDENCE = 4  # passes that must repeat in order before a cycle is taken from them
CYCLE_ORDER = 64  # the last starts a cycle is looked for in (a probe lists ~16 a loader)
ROUNDS_WAIT_SHARE = 0.25  # other steps waiting this share of their period: rounds
TORCH_PREFETCH_FACTOR = 2  # a DataLoader's default with workers


@dataclass(frozen=True)
class LoaderStarts:
    """One loader's pass starts among the steps judged."""

    loader: LoaderInfo | None  # as the probe described it
    passes: int  # its pass starts among those steps
    first_wait_s: float  # a pass's first step's data wait, on average
    batch_wait_s: float  # what a first batch of its waits anyway (the reference above)
    share: float  # its starts' waits beyond the reference / all the data wait judged
    pass_steps: int | None  # steps a pass of it runs (the median of whole ones); None: none
    rebuilt: bool = False  # its last pass ran over a new loader object (the probe's fact)
    # Its first steps are not among the steps held (a pass longer than them): the median
    # of this many of its last starts' first waits, as the probe published them, stands
    # for one. 0: measured steps.
    recalled: int = 0


@dataclass(frozen=True)
class PassStarts:
    """The starts of passes over the steps judged: from the oldest listed start among the
    recent steps to the last step the hello could list a start for. The loops of a
    training loader and of an evaluation loader run between its epochs take turns: each
    step is its pass's, and each pass its loader's."""

    loaders: tuple[LoaderStarts, ...]  # the loaders judged, the costliest first
    passes: int  # their pass starts among those steps
    share: float  # their waits beyond their references / all the data wait of those steps
    rate: float  # samples (or steps, without counts) a second over those steps
    ceiling: float  # the same without the first steps' waits beyond the other steps'
    #   typical wait, never above the rate without any wait: an upper bound
    per_sample: bool  # rate and ceiling count samples, not steps
    whole: bool = False  # the steps held end early in a pass: its other steps counted as
    #   many times as a whole pass has them (the figures are over whole passes)
    partial: bool = False  # a loader's passes are not judged: the share is of the others'
    # All the data wait's share of the time over those steps (over whole passes when
    # `whole`): what the run loses to waiting, its starts included.
    wait_share: float = 0.0
    idle_share: float | None = None  # the device's idle time's share the same way (timed)
    # Every loader whose passes take turns with the current one's is judged: the figures
    # are over a cycle of the run's passes, not one loader's (an evaluation's passes
    # alone read 50 % for a cycle that loses 37 %).
    cycle: bool = True


def _wait(step: StepRecord) -> float:
    wait = step.wait_s or 0.0
    return wait if wait < step.period_s else step.period_s


@dataclass(frozen=True)
class WholePass:
    """A pass a viewer kept once it ended (passes_to_keep): its first step, and its other
    steps as sums (exact, whatever their pattern: a sample of them aliased with workers
    delivering in rounds). In the middle of a long training pass, the evaluation's passes
    that ran before it are the rest of the run's cycle, and the viewer's log drops their
    steps a minute later."""

    first: StepRecord
    length: int  # the pass's steps (its next start's index less its first's)
    others: int  # its other steps received (fewer than length - 1 where some were lost)
    wait_s: float  # their data wait, each at most its period
    period_s: float  # their time
    samples: int | None  # their samples; None: a step without a count
    idle_s: float | None  # their device idle time, each at most its period; None: not timed
    typical_wait_s: float  # their REFERENCE_PERCENTILE wait (0 without other steps)

    @property
    def scale(self) -> float:
        """Its other steps received count this many times (some lost on the way)."""
        return (self.length - 1) / self.others if self.others else 1.0


def whole_pass(steps: Sequence[StepRecord], end: int) -> WholePass | None:
    """The pass whose steps received are ``steps`` (its first first, oldest first),
    ending before step ``end``, as a viewer keeps it; None where more than KEPT_LOST of
    its other steps are missing (a message lost: the rest stand for them)."""
    if not steps:
        return None
    first, rest = steps[0], steps[1:]
    length = end - first.index
    if length < 1 or len(rest) < (1 - KEPT_LOST) * (length - 1):
        return None
    waits = [_wait(s) for s in rest]
    counts = [s.samples for s in rest]
    idles = [s.device_idle_s for s in rest]
    return WholePass(
        first,
        length,
        len(rest),
        sum(waits),
        sum(s.period_s for s in rest),
        None if None in counts else sum(c or 0 for c in counts),
        None
        if None in idles
        else sum(min(i or 0.0, s.period_s) for i, s in zip(idles, rest, strict=True)),
        _typical_wait(waits) if waits else 0.0,
    )


def _typical_wait(waits: list[float]) -> float:
    """Their REFERENCE_PERCENTILE wait: what a batch waits anyway (non-empty)."""
    return sorted(waits)[int(REFERENCE_PERCENTILE * (len(waits) - 1))]


@dataclass
class _Loader:
    firsts: list[StepRecord] = field(default_factory=list)
    others: list[StepRecord] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # its whole passes' steps
    recalled: int = 0  # LoaderStarts.recalled
    kept: list[WholePass] = field(default_factory=list)  # their firsts are in `firsts`


def pass_start_costs(
    steps: Sequence[StepRecord],
    passes: Sequence[LoaderPasses],
    known: int,
    before: Sequence[WholePass] = (),
) -> PassStarts | None:
    """``steps``: usable steps, oldest first; ``passes``: the hello's; ``known``: its
    ``step_count`` (a start after it is not listed yet: the steps from there on are left
    out, or they would count a start as any other wait); ``before``: whole passes the
    viewer kept where loaders take turns (:func:`passes_to_keep`), for a cycle whose
    other passes the steps do not hold. None without starts among the steps, or without
    a loader whose starts can be told apart from its first batches (enough other steps
    to tell what a batch waits anyway, passes longer than what ``iter()`` asks for at
    once)."""
    tail = steps[-MAX_WINDOW_STEPS:]
    if not tail:
        return None
    owner = _owners(passes)
    lengths = _lengths(owner, known)
    # A pass begun with fewer than PASS_OTHER_STEPS steps after its first: its first
    # step alone, unscaled, made the share jump at every start (74 % "over the last 2
    # passes" for 42 %); its steps are left out as those of a start not yet listed.
    newest = max((i for i in owner if i < known), default=None)
    if newest is not None:
        usual = lengths.get(owner[newest])
        ran = tail[-1].index - newest  # its steps after the first
        if ran < min(PASS_OTHER_STEPS, statistics.median(usual) - 1 if usual else math.inf):
            known = newest
    kept = {whole.first.index: whole for whole in before}
    listed = sorted(i for i in owner if tail[0].index <= i < known)
    if not listed:
        return _recalled(tail, passes, owner, lengths, known, kept)
    judged = [s for s in tail if listed[0] <= s.index < known and s.wait_s is not None]
    loaders = {which: _Loader(lengths=each) for which, each in lengths.items()}
    for step in judged:
        start = listed[bisect_right(listed, step.index) - 1]
        group = loaders.setdefault(owner[start], _Loader())
        (group.firsts if step.index == start else group.others).append(step)
    # A cycle of passes is held when each pass of it has its start among the steps
    # judged; the others, where the viewer kept them whole, complete it, and the current
    # loader's pass held stands for its own that were not kept (longer than the log).
    cycle = _cycle(owner, listed[-1], kept, set(listed))
    current = loaders[owner[listed[-1]]]
    if cycle is not None and cycle[1] and not current.firsts:
        cycle = None  # (its first steps' waits not known)
    if cycle is not None:
        current.firsts += current.firsts[-1:] * cycle[1]
        judged += _join_kept(loaders, owner, lengths, cycle[0])
    starts = _judged(loaders, passes, judged)
    if starts is None:
        return None
    return replace(starts, cycle=cycle is not None)


def _cycle(
    owner: dict[int, int], current: int, kept: dict[int, WholePass], held: set[int]
) -> tuple[list[WholePass], int] | None:
    """The passes of the cycle that ends with the pass begun at ``current`` whose starts
    are not in ``held``, as the viewer kept them; and how many of the current loader's
    were not kept (its pass held stands for them). None where another loader's was not
    kept, or the cycle is not known yet."""
    since = _cycle_since(owner, current)
    if since is None:
        # A first pass of its loader: a cycle is not known yet where another loader's
        # pass ran before it and is not held (a first evaluation alone read "75 % of the
        # time over the last pass" after a training pass that lost 10 %).
        return ([], 0) if all(i in held for i in owner if i < current) else None
    found: list[WholePass] = []
    missing = 0
    for start in sorted(i for i in owner if since < i < current and i not in held):
        whole = kept.get(start)
        if whole is not None:
            found.append(whole)
        elif owner[start] == owner[current]:
            missing += 1
        else:
            return None
    return found, missing


def _join_kept(
    loaders: dict[int, _Loader],
    owner: dict[int, int],
    lengths: dict[int, list[int]],
    kept: Sequence[WholePass],
) -> list[StepRecord]:
    """Add the whole passes ``kept`` to their loaders' groups (a loader's own kept passes
    of the cycle join its pass held: "A A A B"); their first steps."""
    for whole in kept:
        which = owner[whole.first.index]
        group = loaders.setdefault(which, _Loader(lengths=lengths.get(which, [])))
        group.firsts.append(whole.first)
        group.kept.append(whole)
    return [whole.first for whole in kept]


def _cycle_since(owner: dict[int, int], current: int) -> int | None:
    """The start before the first pass of the cycle that ends with ``current``'s: the
    passes of a run repeat in the order of their loaders (a training pass and an
    evaluation; or two evaluations, "A B B"; or an evaluation every third epoch,
    "A A A B"), and a cycle is the repetition the last starts show longest, twice at
    least, over all of them or CYCLE_EVIDENCE passes (the probe lists every loader's
    starts from one horizon on: the order is whole). A loader run once in the middle (a
    test pass) is left behind once the order after it shows the cycle; "A B B" is not
    "B" repeating (the two evaluations alone read 70 % for 40.7 %). Where the order
    shows none yet, all the listed passes (-1); None for the first pass of a loader
    after another's."""
    # (the last CYCLE_ORDER of them: a peer may list 64 starts for each of 8 loaders)
    starts = sorted(i for i in owner if i <= current)[-CYCLE_ORDER:]
    order = [owner[i] for i in starts]
    n = len(order)
    best: tuple[int, int] | None = None  # (the periodic suffix's length, the period)
    for period in range(1, n // 2 + 1):
        k = n - 1
        while k >= period and order[k] == order[k - period]:
            k -= 1
        suffix = n - 1 - k + period
        shown = suffix >= 2 * period and (suffix == n or suffix >= CYCLE_EVIDENCE)
        if shown and (best is None or suffix > best[0]):
            best = (suffix, period)
    if best is not None:
        return starts[-best[1] - 1]
    if order[-1] not in order[:-1]:
        return None
    return -1


def _recalled(
    tail: Sequence[StepRecord],
    passes: Sequence[LoaderPasses],
    owner: dict[int, int],
    lengths: dict[int, list[int]],
    known: int,
    kept: dict[int, WholePass],
) -> PassStarts | None:
    """The steps held are all of one pass begun before them (a pass longer than a
    window): its loader's last starts (up to PASS_START_STALL_STARTS whose first waits the
    probe published) stand for its first step, a step of their usual wait and the held
    steps' mean compute; the held steps for the rest of a whole pass. Without this, a
    long pass's costly start was judged only while its first steps were held: the
    verdict changed in the middle of every pass (5 s starts of 1,000-step passes: "83 %
    of the data wait" for 4 s of each, nothing for the other 9).

    Where another loader's passes ran since the previous one of this loader (an
    evaluation between epochs), they are the rest of the cycle: judged on the whole
    passes the viewer kept of them, or not at all (one loader's passes alone read 30 %
    for a cycle that loses 37 %, 50 % in the evaluation's)."""
    before = sorted(i for i in owner if i < tail[0].index)
    if not before:
        return None
    current = before[-1]
    which = owner[current]
    cycle = _cycle(owner, current, kept, set())
    if cycle is None:
        return None  # loaders taking turns: the other passes of the cycle are not known
    if not lengths.get(which):
        return None  # no whole pass of it yet: its length is not known
    others = [s for s in tail if s.index < known and s.wait_s is not None]
    if not others:
        return None
    listed = passes[which]
    if len(listed.waits) != len(listed.starts):
        return None
    waits = [
        wait
        for start, wait in zip(listed.starts, listed.waits, strict=True)
        if wait is not None and start < tail[0].index
    ][-PASS_START_STALL_STARTS:]
    if not waits:
        return None
    # Their median, and the least of two: one abnormal start (a cold first epoch) must
    # not weigh on every pass after it (15.5 s, then 0.5 s, read 8.1 s "the median of
    # the last 2 passes": 43 % of the second pass for 12 % measured).
    wait = statistics.median(waits) if len(waits) > 2 else min(waits)
    compute = statistics.fmean(s.period_s - _wait(s) for s in others)
    counts = [s.samples for s in others]
    samples = None if None in counts else round(statistics.median(c or 0 for c in counts))
    # A first step's device waited with its host (nothing was queued during the start).
    timed = all(s.device_idle_s is not None for s in others)
    first = StepRecord(
        current, others[0].end_time, wait + compute, wait, samples, None, wait if timed else None
    )
    # A pass longer than its loader's usual ones (the first whole pass after a run
    # resumed in the middle of an epoch; epochs that grow) has no known length: 5 s starts
    # of 1,000-step passes after a 100-step one read 65 % over passes "of 230 steps".
    if others[-1].index - current + 1 > statistics.median(lengths[which]):
        return None
    # Its passes of the cycle not kept (longer than the viewer's log): one more each.
    kept_passes, missing = cycle
    loaders = {which: _Loader([first] * (1 + missing), others, lengths[which], len(waits))}
    judged = [first, *others, *_join_kept(loaders, owner, lengths, kept_passes)]
    starts = _judged(loaders, passes, judged)
    if starts is None or not starts.whole:
        return None  # the steps held are a whole pass's: no start left out to stand for
    return starts


def _judged(
    loaders: dict[int, _Loader], passes: Sequence[LoaderPasses], judged: Sequence[StepRecord]
) -> PassStarts | None:
    """The loaders' starts judged on their first and other steps (pass_start_costs)."""
    kept = [whole for group in loaders.values() for whole in group.kept]
    per_sample = all(s.samples is not None for s in judged)
    per_sample = per_sample and all(whole.samples is not None for whole in kept)
    timed = all(s.device_idle_s is not None for s in judged)  # device idle known
    timed = timed and all(whole.idle_s is not None for whole in kept)
    span = done = idle = 0.0
    waited: dict[int, float] = {}  # each loader's passes' data wait
    scaled = False
    for which, group in loaders.items():
        # The steps held may end early in a pass (a long one's first steps only): its
        # other steps count as many times as a whole pass has them, or the start's wait
        # would weigh as if passes were that short.
        scale = 1.0
        if group.lengths and group.others:
            firsts = len(group.firsts) - len(group.kept)  # those of the steps held
            whole = firsts * (statistics.median(group.lengths) - 1)
            scale = max(1.0, whole / len(group.others))
            scaled = scaled or scale > 1.0
        waited[which] = 0.0
        for part, weight in ((group.firsts, 1.0), (group.others, scale)):
            waited[which] += weight * sum(_wait(s) for s in part)
            span += weight * sum(s.period_s for s in part)
            done += weight * (sum(s.samples or 0 for s in part) if per_sample else len(part))
            if timed:
                idle += weight * sum(min(s.device_idle_s or 0.0, s.period_s) for s in part)
        for pass_ in group.kept:  # their firsts are among the firsts above
            waited[which] += pass_.scale * pass_.wait_s
            span += pass_.scale * pass_.period_s
            done += pass_.scale * ((pass_.samples or 0) if per_sample else pass_.others)
            idle += pass_.scale * (pass_.idle_s or 0.0)
    costs = {
        which: cost
        for which, group in loaders.items()
        if (cost := _loader_costs(passes[which].loader, group)) is not None
    }
    # The share is of the judged loaders' passes' wait: a loader whose starts cannot be
    # told from its first batches (passes no longer than iter()'s prefetch) would add its
    # first waits to the whole and none to the starts' part.
    judged_wait = sum(waited[which] for which in costs)
    if not costs or judged_wait <= 0 or span <= sum(waited.values()):
        return None
    found = []
    saved = 0.0  # the first steps' waits beyond the other steps' typical wait
    for which, (beyond, beyond_typical, first_wait, reference) in costs.items():
        group = loaders[which]
        length = round(statistics.median(group.lengths)) if group.lengths else None
        found.append(
            LoaderStarts(
                passes[which].loader,
                len(group.firsts),
                first_wait,
                reference,
                beyond / judged_wait,
                length,
                passes[which].rebuilt,
                group.recalled,
            )
        )
        saved += beyond_typical
    found.sort(key=lambda starts: starts.share, reverse=True)
    return PassStarts(
        loaders=tuple(found),
        # (a recalled first step stands for as many starts as it is the median of)
        passes=sum(max(len(group.firsts), group.recalled) for group in loaders.values()),
        share=sum(starts.share for starts in found),
        rate=done / span,
        ceiling=done / (span - saved),
        per_sample=per_sample,
        whole=scaled,
        partial=len(costs) < sum(1 for group in loaders.values() if group.firsts),
        wait_share=sum(waited.values()) / span,
        idle_share=idle / span if timed else None,
    )


def passes_to_keep(
    passes: Sequence[LoaderPasses],
    known: int,
    period_s: float | None = None,
    window_s: float = 30.0,
) -> list[tuple[int, int]]:
    """The passes a viewer keeps once they ended, (first step, next pass's first step):
    where loaders take turns (a training's passes and an evaluation's), the whole ones
    among the last KEPT_STARTS starts. In the middle of a training pass longer than the
    steps held, the evaluation's passes that ran before it are the rest of the run's
    cycle (pass_start_costs); the viewer drops their steps after a minute. None where
    one loader runs (its starts' waits come with each hello), nor where a cycle of
    passes (a pass of each loader, at its usual length) is within a quarter of the
    analyzer's window (MAX_WINDOW_STEPS, ``window_s``), in steps and in time at the
    typical step ``period_s``: its windows hold whole cycles (a loop of short passes
    would be summed a few times a second for nothing). A quarter: steps of different
    lengths in turn (training steps of 0.5 s, evaluation steps of 0.15 s)."""
    owner = _owners(passes)
    if len(set(owner.values())) < 2:
        return []
    lengths = _lengths(owner, known)
    cycle = sum(statistics.median(each) for each in lengths.values())
    if cycle <= MAX_WINDOW_STEPS / 4 and period_s and cycle * period_s <= window_s / 4:
        return []
    starts = sorted(i for i in owner if i < known)[-KEPT_STARTS:]
    return list(pairwise(starts))


def _owners(passes: Sequence[LoaderPasses]) -> dict[int, int]:
    """A pass's first step -> its loader (its position in ``passes``); listed twice: the
    later loader's, the one run last."""
    return {start: which for which, listed in enumerate(passes) for start in listed.starts}


def _lengths(owner: dict[int, int], known: int) -> dict[int, list[int]]:
    """Each loader's whole passes' steps, from every start the probe lists before
    ``known`` (also those before the steps held: a long pass's length is known from its
    starts alone)."""
    lengths: dict[int, list[int]] = {}
    for start, end in pairwise(sorted(i for i in owner if i < known)):
        lengths.setdefault(owner[start], []).append(end - start)
    return lengths


def _loader_costs(
    info: LoaderInfo | None, group: _Loader
) -> tuple[float, float, float, float] | None:
    """(waits beyond the reference, beyond the other steps' typical wait, a first step's
    mean wait, the reference) of one loader's first steps; None where they cannot be told
    from first batches."""
    workers = (info.num_workers if info is not None else None) or 0
    if workers and group.lengths:
        prefetch = info.prefetch_factor if info is not None else None
        asked = workers * (prefetch or TORCH_PREFETCH_FACTOR)
        if statistics.median(group.lengths) <= asked:
            return None
    firsts, others, kept = group.firsts, group.others, group.kept
    count = len(others) + sum(whole.others for whole in kept)
    if not firsts or count < PASS_OTHER_STEPS:
        return None
    if others:
        typical = _typical_wait([_wait(s) for s in others])
    else:  # whole passes kept: the least usual of theirs
        typical = max(whole.typical_wait_s for whole in kept)
    period = (sum(s.period_s for s in others) + sum(w.period_s for w in kept)) / count
    reference = max(typical, workers * period) if typical >= ROUNDS_WAIT_SHARE * period else typical
    first_waits = [_wait(s) for s in firsts]
    beyond = sum(max(0.0, w - reference) for w in first_waits)
    beyond_typical = sum(max(0.0, w - typical) for w in first_waits)
    return beyond, beyond_typical, sum(first_waits) / len(firsts), reference


def steady_starts(passes: Sequence[LoaderPasses], steps: Sequence[StepRecord]) -> frozenset[int]:
    """The starts of passes that are part of the run's steady state, not one-offs to leave
    out of a window: a loader's whose waits (the probe's, two or more known) take at least
    INPUT_WARN_ENTER of a cycle by themselves (their median wait, plus a pass's steps at
    the steps' median period), with passes a window spans whole. Workers started again
    in 14 s before every 20-step pass made the window that held one start read
    "moderately input-bound, 13 %" (the start left out as an outlier) and the next
    "99 %", in turn."""
    if not passes or not steps:
        return frozenset()
    period = statistics.median(s.period_s for s in steps[-MAX_WINDOW_STEPS:])
    by_loader = _lengths(_owners(passes), sys.maxsize)
    steady: set[int] = set()
    for which, listed in enumerate(passes):
        waits = [w for w in listed.waits if w is not None]
        lengths = by_loader.get(which)
        if len(waits) < 2 or not lengths:
            continue
        wait, busy = statistics.median(waits), statistics.median(lengths) * period
        # Only passes that a window spans whole (STEP_WINDOW_S of steps): every window
        # then holds a start. Longer ones are judged over whole passes by
        # pass_start_costs; a window holding a start of those would weigh it as if the
        # pass were that short.
        if busy <= STEP_WINDOW_S and wait >= INPUT_WARN_ENTER * (wait + busy):
            steady.update(listed.starts)
    return frozenset(steady)
