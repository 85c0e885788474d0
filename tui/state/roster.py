"""Which runs the switcher lists, in which slot, under which label, and which run to show
when the one shown ended: pure functions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Who:
    """What tells runs apart on screen."""

    key: str
    name: str
    host: str | None
    rank: int | None
    pid: int | None


def next_slots(taken: Iterable[int], count: int) -> list[int]:
    """The ``count`` lowest free slots: a new run fills a gap and never moves the others."""
    used = set(taken)
    slots: list[int] = []
    slot = 0
    while len(slots) < count:
        if slot not in used:
            slots.append(slot)
        slot += 1
    return slots


def labels(runs: Sequence[Who]) -> dict[str, str]:
    """Switcher labels: the name, then "· r<rank>" where names collide, then "· <pid>"
    (or "· <host>:<pid>") where that still collides."""
    names = Counter(run.name for run in runs)
    out: dict[str, str] = {}
    with_rank: dict[str, str] = {}
    for run in runs:
        if names[run.name] == 1:
            out[run.key] = run.name
        else:
            rank = f" · r{run.rank}" if run.rank is not None else ""
            with_rank[run.key] = run.name + rank
    ranked = Counter(with_rank.values())
    pids = Counter((label, run.pid) for run in runs if (label := with_rank.get(run.key)))
    for run in runs:
        label = with_rank.get(run.key)
        if label is None:
            continue
        if ranked[label] > 1:
            if run.pid is None:
                label += f" · {run.key}"
            elif pids[(label, run.pid)] > 1 and run.host is not None:
                label += f" · {run.host}:{run.pid}"
            else:
                label += f" · {run.pid}"
        out[run.key] = label
    return out


@dataclass(frozen=True)
class Heard:
    """What following a new run reads of a run: when the viewer first and last heard
    from it (viewer time), and whether it ended (exited, lost, refused)."""

    key: str
    rank: int | None
    ended: bool
    first: float
    last: float


def successors(shown: Heard, runs: Sequence[Heard]) -> list[str]:
    """The runs that took over from ``shown``, best first: none while it runs; once it
    ended, those still running that were first heard after it last spoke (the training
    restarted under another name, or on another node). ``runs`` in switcher order; a
    job's rank 0 (or a run without rank) first, then that order.

    A run that was already there while ``shown`` ran is not one: the user saw both, and
    the one that ended stays on screen to say why it ended."""
    if not shown.ended:
        return []
    after = [run for run in runs if run.key != shown.key and not run.ended]
    after = [run for run in after if run.first >= shown.last]
    after.sort(key=lambda run: run.rank not in (None, 0))  # stable: switcher order next
    return [run.key for run in after]
