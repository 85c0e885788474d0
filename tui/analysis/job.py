"""The job verdict: does one rank hold a data-parallel job back, or are all ranks alike?

In DDP every rank leaves a step together: gradients are all-reduced during backward, so a
rank slow to get there makes the others wait *inside the collective*, and every rank's
step time is the straggler's. What differs is where the time goes. Each rank's *own
time* is the part of its step spent outside any collective: its data wait, and the named
phases (``probe.phase``) that cannot hold a collective (``forward``, ``h2d``, ...; not
``backward``, ``optimizer``, ``allreduce``, ...). The straggler is the rank whose own time
stands out from the others' (robust statistics, a minimum gap, not one slow step); its
own verdict says why. ``docs/verdicts.md`` ("Jobs") states the rule; pure functions here.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gputop_dl.probe.messages import StepRecord
from gputop_dl.tui.analysis.fmt import bps, dur, num, pct, pct_value
from gputop_dl.tui.analysis.steps import enough_steps, recent, usable_steps

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict

# --- thresholds (the "Jobs" section of docs/verdicts.md) ----------------------------------
JOB_WINDOW_S = 3.0  # each rank's steps of the last 3 s (by its newest step), at least 5
GAP_ENTER = 0.10  # own time at least 10 % of the step above the others' median (TraceML
GAP_EXIT = 0.07  #   warns at 10 % skew); a straggler shown holds until the gap is < 7 %
MAD_K = 4.0  # ... and at least 4 robust standard deviations of the others (large jobs)
MAD_SCALE = 1.4826  # MAD x this = the standard deviation of normally spread values
MAX_SLOW_SHARE = 0.25  # more ranks slow than this (or > 1 of < 8): uneven, not stragglers
SEVERE_SLOWER = 0.20  # a straggler costing the job >= 20 % is a warning, less is info
MAX_LISTED = 12  # ranks named in one line of evidence
MAX_WORLD = 1 << 17  # larger world sizes are not checked for missing ranks
# A new job verdict is shown after it held 1 s over 2 updates (about 2 s at the viewer's
# 1 Hz): half the run verdicts' 2 s, as the rule already needs the gap without the rank's
# worst step; a straggler is then named ~3 s after it starts (goal: within 5 s).
PERSIST_S = 1.0
PERSIST_UPDATES = 2
# A phase whose name contains one of these may hold a collective (or wait for one): it is
# not the rank's own time. DDP all-reduces inside backward, ZeRO/FSDP gather in the
# optimizer step and forward; "forward" is still counted, as plain DDP has none there.
COLLECTIVE_WORDS = (
    "backward",
    "reduce",
    "comm",
    "sync",
    "barrier",
    "collective",
    "gather",
    "scatter",
    "broadcast",
    "optim",
)
DATA_WAIT = "data wait"
# Which host figure supports which input-bound cause of the straggler.
_CAUSE_FIGURE = {
    "disk": "data_disk_busy_pct",
    "network-storage": "net_rx_bps",
    "memory": "swap_in_bps",
    "few-workers": "cpu_busy_pct",
    "cpu-workers": "cpu_busy_pct",
    "cpu-contention": "cpu_busy_pct",
    "cpu-quota": "cpu_busy_pct",
}


@functools.lru_cache(maxsize=1024)  # phase names repeat every step
def is_collective(phase: str) -> bool:
    name = phase.lower()
    return any(word in name for word in COLLECTIVE_WORDS)


@dataclass(frozen=True)
class RankFigures:
    """One rank's recent steps, as the job verdict compares them."""

    steps: int
    span_s: float  # seconds of steps in the window
    period_s: float  # median step period
    steps_per_s: float
    samples_per_s: float | None  # None: no batch sizes
    wait_share: float | None  # data wait / step time; None: not reported (probe.step)
    own_share: float | None  # own time / step time; None: neither wait nor own phases
    trimmed_share: float | None  # ... without its single longest own step
    parts: tuple[tuple[str, float], ...]  # own time per step by part: (name, seconds)


def rank_figures(steps: Sequence[StepRecord], window_s: float = JOB_WINDOW_S) -> RankFigures | None:
    """Figures over the rank's steps of the last ``window_s`` (at least 5); None with too
    few usable steps (step 0 is start-up)."""
    window = recent(usable_steps(steps), window_s)
    if not window or not enough_steps(window):
        return None
    # One pass: 512 ranks are judged every second.
    span = wait_sum = own_total = longest_own = longest_period = 0.0
    waited = counted = samples = 0
    known = False
    parts: dict[str, float] = {}
    periods: list[float] = []
    for s in window:
        period = s.period_s
        span += period
        periods.append(period)
        own = 0.0
        if s.wait_s is not None:
            own = s.wait_s
            wait_sum += own
            waited += 1
        for name, seconds in s.phases:
            if not is_collective(name):
                parts[name] = parts.get(name, 0.0) + seconds
                own += seconds
                known = True
        if s.samples is not None:
            samples += s.samples
            counted += 1
        own_total += own
        if own > longest_own:
            longest_own, longest_period = own, period
    if span <= 0:
        return None
    known = known or waited > 0
    if waited:
        parts = {DATA_WAIT: wait_sum, **parts}
    n = len(window)
    rest = span - longest_period
    trimmed = (own_total - longest_own) / rest if known and rest > 0 else None
    return RankFigures(
        steps=n,
        span_s=span,
        period_s=statistics.median(periods),
        steps_per_s=n / span,
        samples_per_s=samples / span if counted == n else None,
        wait_share=wait_sum / span if waited else None,
        own_share=own_total / span if known else None,
        trimmed_share=trimmed,
        parts=tuple((name, seconds / n) for name, seconds in parts.items()),
    )


@dataclass(frozen=True)
class HostFigures:
    """A node's recent figures, to compare the straggler's node with the others'."""

    data_disk_busy_pct: float | None = None
    cpu_busy_pct: float | None = None
    swap_in_bps: float | None = None
    net_rx_bps: float | None = None


@dataclass(frozen=True)
class RankInput:
    key: str  # the run (source id)
    rank: int | None
    host: str | None
    figures: RankFigures | None
    verdict: Verdict | None  # its own verdict (the analyzer's), if judged yet
    last_index: int | None = None  # index of its newest step
    ended: str | None = None  # how its run ended ("exited: …", "lost: …"), if it did
    ended_ago_s: float | None = None  # since when (its connection's age)
    ended_badly: bool = False  # killed (gone without a bye), crashed or lost


@dataclass(frozen=True)
class JobVerdict:
    kind: str  # "waiting", "ended", "straggler", "alike", "uneven"
    severity: str  # "ok", "info", "warning"
    headline: str
    straggler: str | None = None  # the run (source id) holding the job back
    straggler_rank: int | None = None
    straggler_host: str | None = None
    slower: float | None = None  # the job would be this much faster without it (0.31)
    cause: str | None = None  # "input-bound/disk", "slow forward", ...
    evidence: tuple[str, ...] = ()
    slow: tuple[str, ...] = ()  # every rank found slow (runs), worst first
    reporting: int = 0  # ranks with figures
    missing: tuple[int, ...] = ()  # ranks of the world not heard from
    since: float | None = None  # set by JobTracker


def _ranks_text(ranks: Sequence[int | None]) -> str:
    shown = [str(r) if r is not None else "?" for r in ranks[:MAX_LISTED]]
    more = f" and {len(ranks) - MAX_LISTED} more" if len(ranks) > MAX_LISTED else ""
    return ", ".join(shown) + more


def _verdict_name(verdict: Verdict) -> str:
    return f"{verdict.kind}/{verdict.cause}" if verdict.cause else verdict.kind


def _host_line(
    cause: str | None,
    straggler: RankInput,
    others: Sequence[RankInput],
    hosts: Mapping[str, HostFigures],
) -> str | None:
    """ "its data disk 95 % busy, others' 10 %": the straggler's node vs the other nodes,
    on the figure its cause rests on (only when the others run on other nodes)."""
    field = _CAUSE_FIGURE.get(cause or "")
    mine = hosts.get(straggler.host or "")
    if field is None or mine is None or getattr(mine, field) is None:
        return None
    other_hosts = {r.host for r in others if r.host is not None and r.host != straggler.host}
    values = [
        v for h in other_hosts if (f := hosts.get(h)) and (v := getattr(f, field)) is not None
    ]
    if not values:
        return None
    theirs = statistics.median(values)
    value = getattr(mine, field)
    if field.endswith("_pct"):
        what = "data disk" if field == "data_disk_busy_pct" else "CPU"
        return f"its {what} {pct_value(value)} busy, others' {pct_value(theirs)}"
    what = "swap-in" if field == "swap_in_bps" else "network receive"
    return f"its {what} {bps(value)}, others' {bps(theirs)}"


def _missing(ranks: Sequence[RankInput], world_size: int | None) -> tuple[int, ...]:
    """Ranks of the world not heard from; none listed for an implausible world (a
    publisher may claim any size: the viewer must not count to 2**63)."""
    if not world_size or world_size > MAX_WORLD:
        return ()
    present = {r.rank for r in ranks}
    return tuple(r for r in range(world_size) if r not in present)


def judge_job(
    ranks: Sequence[RankInput],
    world_size: int | None,
    hosts: Mapping[str, HostFigures] | None = None,
    previous: JobVerdict | None = None,
) -> JobVerdict:
    """The job verdict over its ranks (one input per rank). ``previous``: the verdict
    shown, whose straggler is kept down to GAP_EXIT (hysteresis)."""
    hosts = hosts or {}
    missing = _missing(ranks, world_size)
    notes: list[str] = []
    if missing:
        notes.append(
            f"not heard from: rank {_ranks_text(missing)} ({len(ranks)} of {world_size} reporting)"
        )
    ended = _ended(ranks, notes, missing)
    if ended is not None:
        return ended
    hung = _hang(ranks, notes, missing)
    if hung is not None:
        return hung
    compared = [r for r in ranks if r.figures is not None and r.figures.own_share is not None]
    blind = [r.rank for r in ranks if r.figures is not None and r.figures.own_share is None]
    if blind:
        notes.append(
            f"rank {_ranks_text(blind)} report neither data wait nor phases: iterate the "
            "loader through probe.watch(loader) to compare them"
        )
    if len(compared) < 2:
        return JobVerdict(
            "waiting",
            "info",
            f"waiting for steps of at least 2 ranks ({len(compared)} so far)",
            evidence=tuple(notes),
            reporting=len(compared),
            missing=missing,
        )
    share = {r.key: _own(r) for r in compared}
    order = sorted(compared, key=lambda r: share[r.key], reverse=True)
    others = order[1:]  # the statistics leave the slowest candidate out
    med = statistics.median(share[r.key] for r in others)
    mad = statistics.median(abs(share[r.key] - med) for r in others)
    held = previous is not None and previous.kind == "straggler"

    def slow(r: RankInput) -> bool:
        kept = held and previous is not None and r.key in previous.slow
        gap = max(GAP_EXIT if kept else GAP_ENTER, MAD_K * MAD_SCALE * mad)
        figures = r.figures
        trimmed = figures.trimmed_share if figures is not None else None
        return share[r.key] - med >= gap and trimmed is not None and trimmed - med >= gap

    slow_ranks = [r for r in order if slow(r)]
    allowed = max(1, int(MAX_SLOW_SHARE * len(compared))) if len(compared) >= 8 else 1
    if len(slow_ranks) > allowed:
        return JobVerdict(
            "uneven",
            "info",
            f"ranks uneven: {len(slow_ranks)} of {len(compared)} spend more of each step "
            "outside the collective than the rest",
            evidence=(f"slow: rank {_ranks_text([r.rank for r in slow_ranks])}", *notes),
            slow=tuple(r.key for r in slow_ranks),
            reporting=len(compared),
            missing=missing,
        )
    if not slow_ranks:
        return _alike(compared, notes, missing)
    return _straggler(
        slow_ranks, [r for r in compared if r not in slow_ranks], hosts, notes, missing
    )


def _ended(
    ranks: Sequence[RankInput], notes: list[str], missing: tuple[int, ...]
) -> JobVerdict | None:
    """A rank whose run ended (exited, killed, lost): the ranks still running wait for it
    at their next collective; when all ended, the first to end. The job line counted it
    among the ranks as if it ran ("3 of 3 ranks · all 2 ranks alike")."""
    gone = [r for r in ranks if r.ended is not None]
    if not gone:
        return None
    first = max(gone, key=lambda r: r.ended_ago_s if r.ended_ago_s is not None else -1.0)
    who = f"rank {first.rank}" if first.rank is not None else "a rank"
    where = f" on {first.host}" if first.host else ""
    bad = first.ended_badly
    others = [r.rank for r in gone if r is not first and r.rank is not None]
    evidence = [f"then rank {_ranks_text(others)} ended too"] if others else []
    if len(gone) == len(ranks):
        headline = f"the job ended: {who}{where} first ({first.ended})"
    else:
        running = len(ranks) - len(gone)
        headline = (
            f"{who}{where} {first.ended}: the {running} still running wait for it at "
            "their next collective"
        )
    return JobVerdict(
        "ended",
        "critical" if bad else "info",
        headline,
        straggler=first.key,
        straggler_rank=first.rank,
        straggler_host=first.host,
        evidence=(*evidence, *notes),
        reporting=len(ranks) - len(gone),
        missing=missing,
    )


def _hang(
    ranks: Sequence[RankInput], notes: list[str], missing: tuple[int, ...]
) -> JobVerdict | None:
    """Most ranks stalled: the rank whose step index is behind did not reach the collective
    the others wait in (it holds the job). None when no hang, or nobody is behind."""
    stalled = [r for r in ranks if r.verdict is not None and r.verdict.kind == "stalled"]
    if len(ranks) < 2 or 2 * len(stalled) <= len(ranks):
        return None
    indexed = [r for r in ranks if r.last_index is not None]
    if not indexed:
        return None
    top = max(r.last_index or 0 for r in indexed)
    behind = sorted(
        (r for r in indexed if (r.last_index or 0) < top), key=lambda r: r.last_index or 0
    )
    if not behind or len(behind) > max(1, int(MAX_SLOW_SHARE * len(ranks))):
        return None
    worst = behind[0]
    where = f" on {worst.host}" if worst.host else ""
    others = f"rank {_ranks_text([r.rank for r in behind[1:]])} also behind; " if behind[1:] else ""
    return JobVerdict(
        "straggler",
        "critical",
        f"rank {worst.rank}{where} holds the job: it stopped after step {worst.last_index}, "
        f"the others reached step {top}",
        straggler=worst.key,
        straggler_rank=worst.rank,
        straggler_host=worst.host,
        cause="stalled",
        evidence=(
            f"{others}the others wait for it inside a collective; see what it does: "
            f"py-spy dump --pid <its pid> on {worst.host or 'its node'}",
            *notes,
        ),
        slow=tuple(r.key for r in behind),
        reporting=len(ranks),
        missing=missing,
    )


def _own(r: RankInput) -> float:
    assert r.figures is not None and r.figures.own_share is not None
    return r.figures.own_share


def _alike(compared: Sequence[RankInput], notes: list[str], missing: tuple[int, ...]) -> JobVerdict:
    n = len(compared)
    judged = [r for r in compared if r.verdict is not None and r.verdict.kind != "warming-up"]
    if not judged:
        return JobVerdict(
            "alike",
            "ok",
            f"all {n} ranks alike (own time within {pct(GAP_ENTER)} of the step)",
            evidence=tuple(notes),
            reporting=n,
            missing=missing,
        )
    counts: dict[str, list[RankInput]] = {}
    for r in judged:
        assert r.verdict is not None
        counts.setdefault(_verdict_name(r.verdict), []).append(r)
    name, holders = max(counts.items(), key=lambda item: (len(item[1]), item[0]))
    first = min(holders, key=lambda r: (r.rank is None, r.rank or 0))
    assert first.verdict is not None
    return JobVerdict(
        "alike",
        first.verdict.severity,
        f"all {n} ranks alike: {name} on {len(holders)} of {len(judged)}",
        cause=name,
        evidence=(f"rank {first.rank}: {first.verdict.headline}", *notes),
        reporting=n,
        missing=missing,
    )


def _straggler(
    slow_ranks: Sequence[RankInput],
    fast: Sequence[RankInput],
    hosts: Mapping[str, HostFigures],
    notes: list[str],
    missing: tuple[int, ...],
) -> JobVerdict:
    worst = slow_ranks[0]
    wf = worst.figures
    assert wf is not None
    parts = dict(wf.parts)
    others_parts: dict[str, float] = {}
    for name in parts:
        values = [dict(r.figures.parts).get(name, 0.0) for r in fast if r.figures is not None]
        others_parts[name] = statistics.median(values) if values else 0.0
    part = max(parts, key=lambda p: parts[p] - others_parts[p])
    own_s = sum(parts.values())
    others_own = statistics.median(
        sum(s for _, s in r.figures.parts) for r in fast if r.figures is not None
    )
    excess = max(0.0, own_s - others_own)
    period = statistics.median(
        r.figures.period_s for r in (*slow_ranks, *fast) if r.figures is not None
    )
    slower = excess / (period - excess) if period > excess else None
    verdict = worst.verdict
    # The cause is the part it spends more on than the others, named by its own verdict
    # only when that part is the data wait: all ranks of a job may wait alike for data
    # while one is slow in its forward, and "more workers" would not help that one.
    if part != DATA_WAIT:
        cause: str | None = f"slow {part}"
    elif verdict is not None and verdict.kind == "input-bound":
        cause = _verdict_name(verdict)
    else:
        cause = "input-bound"
    host_line = _host_line(verdict.cause if verdict is not None else None, worst, fast, hosts)
    where = f" on {worst.host}" if worst.host else ""
    who = f"rank {worst.rank}{where}"
    same_host = worst.host is not None and all(r.host == worst.host for r in slow_ranks)
    if len(slow_ranks) > 1 and same_host and not any(r.host == worst.host for r in fast):
        who = f"{worst.host} (rank {_ranks_text([r.rank for r in slow_ranks])})"
    elif len(slow_ranks) > 1:
        notes.insert(0, f"also slow: rank {_ranks_text([r.rank for r in slow_ranks[1:]])}")
    how = f"{pct(slower)} slower" if slower is not None else "slower"
    headline = f"{who} is {how}: {cause}" + (f"; {host_line}" if host_line else "")
    plural = "s" if len(fast) != 1 else ""
    evidence = [
        f"{part}: {dur(parts[part])} per step vs {dur(others_parts[part])} (median of the "
        f"other {len(fast)} rank{plural})"
    ]
    theirs = statistics.median(_own(r) for r in fast)
    evidence.append(
        f"own time {pct(_own(worst))} of each step vs {pct(theirs)}; "
        f"the ranks step every {dur(period)} (median): in a collective, the others wait "
        "for it there"
    )
    if verdict is not None and verdict.kind not in ("warming-up", "error"):
        evidence.append(f"its own verdict: {verdict.headline}")
    if slower is not None and wf.samples_per_s is not None:
        evidence.append(
            f"without it the job could step ≈ {pct(slower)} faster "
            f"({num(wf.samples_per_s * (1 + slower))} samples/s on this rank)"
        )
    return JobVerdict(
        "straggler",
        "warning" if slower is None or slower >= SEVERE_SLOWER else "info",
        headline,
        straggler=worst.key,
        straggler_rank=worst.rank,
        straggler_host=worst.host,
        slower=slower,
        cause=cause,
        evidence=(*evidence, *notes),
        slow=tuple(r.key for r in slow_ranks),
        reporting=len(slow_ranks) + len(fast),
        missing=missing,
    )


def _identity(verdict: JobVerdict) -> tuple[str, str | None]:
    return (verdict.kind, verdict.straggler)


class JobTracker:
    """Hysteresis over successive job verdicts (clock-free): a new kind or straggler is
    shown after it held PERSIST_S over PERSIST_UPDATES consecutive updates, so one slow
    moment does not name a rank; the first verdict, and "waiting", are shown at once."""

    def __init__(self) -> None:
        self._shown: JobVerdict | None = None
        self._candidate: tuple[str, str | None] | None = None
        self._since = 0.0
        self._count = 0

    @property
    def shown(self) -> JobVerdict | None:
        return self._shown

    def update(self, verdict: JobVerdict, now: float) -> JobVerdict:
        shown = self._shown
        same = shown is not None and _identity(verdict) == _identity(shown)
        if (
            shown is None
            or same
            or "waiting" in (verdict.kind, shown.kind)
            or verdict.kind == "ended"
        ):
            since = shown.since if same and shown is not None else now
            return self._show(verdict, since)
        key = _identity(verdict)
        if key != self._candidate or now < self._since:
            self._candidate, self._since, self._count = key, now, 0
        self._count += 1
        if now - self._since >= PERSIST_S and self._count >= PERSIST_UPDATES:
            return self._show(verdict, self._since)
        return shown

    def _show(self, verdict: JobVerdict, since: float | None) -> JobVerdict:
        self._shown = replace(verdict, since=since)
        self._candidate, self._count = None, 0
        return self._shown
