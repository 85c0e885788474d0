"""Runs grouped into jobs: the ranks of one world, their rank board rows and job verdict.

A job is what the probes say it is (``Hello.job``, with the world size): never guessed
from names. Each rank appears once (a restarted rank's newest run). Recomputed about
once a second from the runs the viewer tracks (bounded by its MAX_SOURCES), into
immutable :class:`JobSummary` values the rank board and the snapshot read.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputop_dl.probe.messages import CRASHED, DeviceRef
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.analysis.job import (
    JOB_WINDOW_S,
    HostFigures,
    JobTracker,
    JobVerdict,
    RankFigures,
    RankInput,
    judge_job,
    rank_figures,
)
from gputop_dl.tui.analysis.thresholds import MAX_WINDOW_STEPS, MIN_STEPS
from gputop_dl.tui.state.hosts import Hosts
from gputop_dl.tui.state.model import EXITED, LIVE, LOST, Connection
from gputop_dl.tui.state.run import Run

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict

JOB_EVERY_S = 0.9  # job verdicts and rank rows are recomputed about once a second
HOST_SAMPLES = 6  # a node's figures: medians over its newest samples (~6 s)
MAX_JOBS = 64  # jobs kept apart; beyond, the smallest are not shown (each rank still is)


@dataclass(frozen=True)
class RankRow:
    """One rank on the rank board."""

    key: str  # the run (source id)
    rank: int | None
    local_rank: int | None
    host: str | None
    state: str  # connection state: live, stale, lost, exited, ...
    step_s: float | None  # median step period
    samples_per_s: float | None
    steps_per_s: float | None
    wait_share: float | None  # data wait / step time
    own_share: float | None  # time outside the collective / step time
    device: str | None  # "GPU 3" (its own device in its node's sample)
    device_util_pct: float | None
    device_mem_share: float | None
    verdict: str | None  # its own verdict, "kind/cause"
    verdict_severity: str | None
    slow: bool = False  # the job verdict names it (straggler, or among the slow ranks)


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    name: str  # the runs' name (rank 0's)
    world_size: int | None
    ranks: tuple[RankRow, ...]  # by rank
    verdict: JobVerdict | None
    hosts: tuple[str, ...]

    def row(self, key: str) -> RankRow | None:
        return next((row for row in self.ranks if row.key == key), None)


def job_key(run: Run) -> tuple[str, int | None] | None:
    hello = run.hello
    if hello is None or hello.job is None or hello.role == "agent":
        return None
    return hello.job, hello.world_size


def _newest(sample_host: str | None, run: Run, hosts: Hosts) -> SystemSample | None:
    known = hosts.get(sample_host)
    if known is not None and known.history:
        return known.history[-1]
    return run.systems[-1] if run.systems else None


def own_device_figures(
    sample: SystemSample | None, device: DeviceRef | None
) -> tuple[str | None, float | None, float | None]:
    """(label, util %, memory used share) of the rank's own accelerator in ``sample``:
    matched by uuid, else physical index; (None, None, None) when it is not there."""
    if sample is None or device is None:
        return None, None, None
    kind = "GPU" if device.kind == "cuda" else "HPU"
    listed = sample.gpus if kind == "GPU" else sample.hpus
    for d in listed:
        if device.uuid is not None and d.uuid is not None:
            match = d.uuid == device.uuid
        else:
            match = device.index is not None and d.index == device.index
        if match:
            used, total = d.mem_used_bytes, d.mem_total_bytes
            share = used / total if used is not None and total else None
            return f"{kind} {d.index}", d.util_pct, share
    return None, None, None


def host_figures(samples: Sequence[SystemSample]) -> HostFigures:
    """Medians over a node's newest samples of what a straggler's cause rests on."""
    recent = list(samples)[-HOST_SAMPLES:]

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    disk: list[float] = []
    cpu: list[float] = []
    swap: list[float] = []
    net: list[float] = []
    for s in recent:
        if s.data_device:
            busy = [
                d.busy_pct
                for d in s.disks
                if d.busy_pct is not None
                and (s.data_device.startswith(d.device) or d.device.startswith(s.data_device))
            ]
            if busy:
                disk.append(max(busy))
        if s.cpu is not None:
            cores = [c for c in s.cpu.cores if c.idle_pct is not None]
            if cores:
                cpu.append(
                    sum(100 - (c.idle_pct or 0) - (c.iowait_pct or 0) for c in cores) / len(cores)
                )
        if s.memory is not None and s.memory.swap_in_bps is not None:
            swap.append(s.memory.swap_in_bps)
        rx = [n.rx_bps for n in s.nets if n.rx_bps is not None]
        if rx:
            net.append(sum(rx))
    return HostFigures(median(disk), median(cpu), median(swap), median(net))


def _rank_key(run: Run) -> int:
    hello = run.hello
    return -1 if hello is None or hello.rank is None else hello.rank


def _ended_badly(run: Run, connection: Connection) -> bool:
    """Lost, killed (gone without a bye) or crashed (its bye says so); not a run that
    finished or was closed."""
    if connection.state == LOST:
        return True
    if connection.state != EXITED:
        return False
    return run.bye is None or run.bye.reason.startswith(CRASHED)


def _pick(runs: Sequence[tuple[Run, Connection]]) -> list[tuple[Run, Connection]]:
    """One run per rank: a live one before an ended one, then the newest started."""
    best: dict[object, tuple[Run, Connection]] = {}
    for run, connection in runs:
        hello = run.hello
        assert hello is not None
        rank: object = hello.rank if hello.rank is not None else run.source_id
        have = best.get(rank)
        if have is None:
            best[rank] = (run, connection)
            continue
        old_hello = have[0].hello
        assert old_hello is not None
        mine = (connection.state == LIVE, hello.started)
        theirs = (have[1].state == LIVE, old_hello.started)
        if mine > theirs:
            best[rank] = (run, connection)
    return sorted(best.values(), key=lambda item: (_rank_key(item[0]), item[0].source_id))


def _figures(run: Run) -> RankFigures | None:
    last = run.throughput.last_end
    if last is None or not run.steps:
        return None
    steps = run.recent_steps(last - JOB_WINDOW_S, MIN_STEPS + 1, MAX_WINDOW_STEPS)
    return rank_figures(steps)


def _verdict_name(verdict: Verdict | None) -> str | None:
    if verdict is None:
        return None
    return f"{verdict.kind}/{verdict.cause}" if verdict.cause else verdict.kind


class Jobs:
    """The jobs among the viewer's runs, recomputed by :meth:`update`."""

    def __init__(self) -> None:
        self._trackers: dict[tuple[str, int | None], JobTracker] = {}
        self._summaries: tuple[JobSummary, ...] = ()
        self._by_run: dict[str, JobSummary] = {}
        self._updated_at: float | None = None

    @property
    def summaries(self) -> tuple[JobSummary, ...]:
        return self._summaries

    def of_run(self, key: str) -> JobSummary | None:
        """The job the run ``key`` is a rank of."""
        return self._by_run.get(key)

    def update(
        self,
        runs: Sequence[tuple[Run, Connection]],
        hosts: Hosts,
        now: float,
        refresh_verdict: Callable[[Run], None] | None = None,
        *,
        force: bool = False,
    ) -> None:
        """Regroup and rejudge, at most every JOB_EVERY_S (``force``: now).
        ``refresh_verdict(run)`` brings a run's own verdict up to date: called for the
        rank most likely to be named, so the job verdict gives its current cause."""
        last = self._updated_at
        if not force and last is not None and 0 <= now - last < JOB_EVERY_S:
            return
        self._updated_at = now
        groups: dict[tuple[str, int | None], list[tuple[Run, Connection]]] = {}
        for run, connection in runs:
            key = job_key(run)
            if key is not None:
                groups.setdefault(key, []).append((run, connection))
        kept = sorted(groups.items(), key=lambda item: -len(item[1]))[:MAX_JOBS]
        summaries = [
            self._judge(key, _pick(members), hosts, now, refresh_verdict) for key, members in kept
        ]
        live = {key for key, _ in kept}
        self._trackers = {k: t for k, t in self._trackers.items() if k in live}
        summaries.sort(key=lambda job: job.job_id)
        self._summaries = tuple(summaries)
        self._by_run = {row.key: job for job in summaries for row in job.ranks}

    def _judge(
        self,
        key: tuple[str, int | None],
        members: list[tuple[Run, Connection]],
        hosts: Hosts,
        now: float,
        refresh_verdict: Callable[[Run], None] | None,
    ) -> JobSummary:
        figures = {run.source_id: _figures(run) for run, _ in members}
        if refresh_verdict is not None:
            ranked = [
                (share, run)
                for run, _ in members
                if (f := figures[run.source_id]) is not None and (share := f.own_share) is not None
            ]
            if len(ranked) >= 2:
                refresh_verdict(max(ranked, key=lambda item: item[0])[1])
        job_hosts = sorted({run.host for run, _ in members if run.host is not None})
        by_host = {name: host_figures(_host_samples(hosts, name)) for name in job_hosts}
        inputs = [
            RankInput(
                run.source_id,
                run.hello.rank if run.hello else None,
                run.host,
                figures[run.source_id] if connection.state == LIVE else None,
                run.verdict,
                run.last_index,
                connection.text if connection.state in (EXITED, LOST) else None,
                connection.age_s,
                _ended_badly(run, connection),
            )
            for run, connection in members
        ]
        world = key[1]
        tracker = self._trackers.setdefault(key, JobTracker())
        verdict = tracker.update(judge_job(inputs, world, by_host, tracker.shown), now)
        slow = set(verdict.slow)
        rows = tuple(self._row(run, c, figures[run.source_id], hosts, slow) for run, c in members)
        first = members[0][0]
        return JobSummary(key[0], first.name, world, rows, verdict, tuple(job_hosts))

    @staticmethod
    def _row(
        run: Run, connection: Connection, figures: RankFigures | None, hosts: Hosts, slow: set[str]
    ) -> RankRow:
        hello = run.hello
        device = hello.device if hello is not None else None
        label, util, mem = own_device_figures(_newest(run.host, run, hosts), device)
        return RankRow(
            key=run.source_id,
            rank=hello.rank if hello is not None else None,
            local_rank=hello.local_rank if hello is not None else None,
            host=run.host,
            state=connection.state,
            step_s=figures.period_s if figures is not None else None,
            samples_per_s=figures.samples_per_s if figures is not None else None,
            steps_per_s=figures.steps_per_s if figures is not None else None,
            wait_share=figures.wait_share if figures is not None else None,
            own_share=figures.own_share if figures is not None else None,
            device=label,
            device_util_pct=util,
            device_mem_share=mem,
            verdict=_verdict_name(run.verdict),
            verdict_severity=run.verdict.severity if run.verdict is not None else None,
            slow=run.source_id in slow,
        )


def _host_samples(hosts: Hosts, name: str) -> Sequence[SystemSample]:
    known = hosts.get(name)
    return () if known is None else tuple(known.history)[-HOST_SAMPLES:]
