"""Jobs: the probe's job identity, rank figures, the job verdict (tables) and grouping."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop_dl.probe.jobenv import JobIdentity, job_identity
from gputop_dl.probe.messages import Bye, DeviceRef, Hello, StepRecord, Steps, System
from gputop_dl.probe.samples import DiskSample, GpuSample, SystemSample
from gputop_dl.tui.analysis.job import (
    GAP_ENTER,
    HostFigures,
    JobTracker,
    RankInput,
    is_collective,
    judge_job,
    rank_figures,
)
from gputop_dl.tui.analyzer import Verdict
from gputop_dl.tui.events import Received
from gputop_dl.tui.state import ViewerState

T0 = 1_700_000_000.0

# ------------------------------------------------------------------ probe: job identity

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "abc123",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "13",
    "SLURM_LOCALID": "5",
    "SLURM_NTASKS": "16",
}


@pytest.mark.parametrize(
    ("environ", "group", "expected"),
    [
        ({}, None, JobIdentity(None, None, None, None)),
        (TORCHRUN, None, JobIdentity("torchrun:abc123", 3, 1, 8)),
        # torchrun without --rdzv-id says "none": the rendezvous address is the key
        ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}, None, JobIdentity("node1:29500", 3, 1, 8)),
        (SLURM, None, JobIdentity("slurm:4711.0", 13, 5, 16)),
        ({**SLURM, "SLURM_STEP_ID": ""}, None, JobIdentity("slurm:4711", 13, 5, 16)),
        # torchrun inside an srun step: torchrun's own world and run id win
        ({**SLURM, **TORCHRUN}, None, JobIdentity("torchrun:abc123", 3, 1, 8)),
        # a loopback rendezvous is this node's: another node's localhost is another job
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2"},
            None,
            JobIdentity("n7/127.0.0.1:29500", None, None, 2),
        ),
        # Lightning sets no RANK: the initialised process group knows
        (
            {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "LOCAL_RANK": "1"},
            (5, 8),
            JobIdentity("10.0.0.1:1234", 5, 1, 8),
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "RANK": "junk"},
            None,
            JobIdentity(None, 2, None, 4),
        ),
        ({"RANK": "-1", "PMI_RANK": "6", "PMI_SIZE": "7"}, None, JobIdentity(None, 6, None, 7)),
    ],
)
def test_job_identity(
    environ: dict[str, str], group: tuple[int, int] | None, expected: JobIdentity
) -> None:
    assert job_identity(environ, "n7", group) == expected


def test_probe_hello_carries_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputop_dl.probe.core import Probe

    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPUTOP_DISABLE", "1")  # no publisher: only the hello is built
    probe = Probe(name="t")
    try:
        hello = probe.hello()
    finally:
        probe.close()
    assert (hello.job, hello.rank, hello.local_rank, hello.world_size) == (
        "torchrun:abc123",
        3,
        1,
        8,
    )


# ------------------------------------------------------------------ rank figures


def steps(
    n: int = 30,
    period: float = 0.1,
    wait: float | None = 0.005,
    end: float = T0 + 10,
    phases: tuple[tuple[str, float], ...] = (),
    slow_at: int | None = None,
    slow_wait: float = 1.0,
    samples: int | None = 32,
) -> list[StepRecord]:
    """``n`` steps ending at ``end``; step ``slow_at`` (from the end) waits ``slow_wait``."""
    out: list[StepRecord] = []
    t = end - n * period - (slow_wait if slow_at is not None else 0.0)
    for i in range(n):
        w = wait
        p = period
        if slow_at is not None and i == n - 1 - slow_at:
            w = (wait or 0.0) + slow_wait
            p = period + slow_wait
        t += p
        out.append(StepRecord(i + 1, t, p, w, samples, phases=phases))
    return out


def test_rank_figures_own_time_excludes_collective_phases() -> None:
    phases = (("forward", 0.02), ("backward", 0.05), ("optimizer", 0.01))
    f = rank_figures(steps(wait=0.01, phases=phases))
    assert f is not None
    assert f.own_share == pytest.approx(0.3)  # wait 10 ms + forward 20 ms of 100 ms
    assert dict(f.parts) == pytest.approx({"data wait": 0.01, "forward": 0.02})
    assert f.samples_per_s == pytest.approx(320)
    assert f.period_s == pytest.approx(0.1)
    assert is_collective("DDP all_reduce") and not is_collective("h2d")


def test_rank_figures_none_when_too_few_steps_or_blind() -> None:
    assert rank_figures(steps(n=3)) is None
    blind = rank_figures(steps(wait=None))
    assert blind is not None and blind.own_share is None and blind.wait_share is None


def test_rank_figures_trimmed_share_drops_the_one_slow_step() -> None:
    f = rank_figures(steps(slow_at=2))
    assert f is not None and f.trimmed_share is not None and f.own_share is not None
    assert f.own_share > 0.2 and f.trimmed_share < 0.06


# ------------------------------------------------------------------ the job verdict


def verdict(kind: str, cause: str | None = None, severity: str = "ok") -> Verdict:
    return Verdict(kind, severity, 1.0, f"{kind} headline", cause=cause)


def rank(
    r: int,
    wait: float | None = 0.005,
    host: str = "node1",
    v: Verdict | None = None,
    **kw: object,
) -> RankInput:
    return RankInput(f"{host}:{1000 + r}", r, host, rank_figures(steps(wait=wait, **kw)), v)  # type: ignore[arg-type]


COMPUTE = verdict("compute-bound")
INPUT_DISK = verdict("input-bound", "disk", "warning")
INPUT_FEW = verdict("input-bound", "few-workers", "warning")


def job_cases() -> list[tuple[str, list[RankInput], int | None, str, int | None]]:
    """(name, ranks, world size, expected kind, expected straggler rank)."""
    return [
        ("two alike", [rank(0, v=COMPUTE), rank(1, v=COMPUTE)], 2, "alike", None),
        (
            "all alike input-bound: their common verdict",
            [rank(r, wait=0.05, v=INPUT_FEW) for r in range(16)],
            16,
            "alike",
            None,
        ),
        (
            "rank 1 of 2 waits for data",
            [rank(0, v=COMPUTE), rank(1, wait=0.04, v=INPUT_DISK)],
            2,
            "straggler",
            1,
        ),
        (
            "rank 13 of 16 on node2",
            [rank(r, host=f"node{r // 8 + 1}") for r in range(16) if r != 13]
            + [rank(13, wait=0.03, host="node2", v=INPUT_DISK)],
            16,
            "straggler",
            13,
        ),
        (
            "a gap below the minimum is noise",
            [rank(0), rank(1, wait=0.005 + 0.8 * GAP_ENTER * 0.1)],
            2,
            "alike",
            None,
        ),
        ("one slow step is not a straggler", [rank(0), rank(1, slow_at=3)], 2, "alike", None),
        (
            "jittery ranks: the gap must beat the spread too",
            [rank(r, wait=0.002 + 0.003 * (r % 7)) for r in range(64)] + [rank(64, wait=0.021)],
            65,
            "alike",
            None,
        ),
        (
            "missing ranks: the rest is still judged",
            [rank(0), rank(2, wait=0.04), rank(3)],
            8,
            "straggler",
            2,
        ),
        ("one rank reporting: waiting", [rank(0)], 4, "waiting", None),
        (
            "many slow ranks: uneven, nobody named",
            [rank(r, wait=0.04 if r % 2 else 0.005) for r in range(16)],
            16,
            "uneven",
            None,
        ),
        (
            "a slow forward phase (compute straggler, named phases)",
            [rank(r, phases=(("forward", 0.02), ("backward", 0.07))) for r in range(3)]
            + [rank(3, phases=(("forward", 0.05), ("backward", 0.04)))],
            4,
            "straggler",
            3,
        ),
        (
            "ranks that report no wait are not compared",
            [rank(0, wait=None), rank(1, wait=None), rank(2)],
            3,
            "waiting",
            None,
        ),
    ]


@pytest.mark.parametrize(
    ("name", "ranks", "world", "kind", "straggler"),
    job_cases(),
    ids=[case[0] for case in job_cases()],
)
def test_judge_job(
    name: str, ranks: list[RankInput], world: int | None, kind: str, straggler: int | None
) -> None:
    v = judge_job(ranks, world)
    assert v.kind == kind, v
    assert v.straggler_rank == straggler
    if straggler is not None:
        assert v.headline.startswith(f"rank {straggler}")
        assert v.slow[0] == v.straggler


def test_straggler_headline_names_cause_and_compares_nodes() -> None:
    ranks = [rank(r, host=f"node{r // 8 + 1}") for r in range(16) if r != 13]
    ranks.append(rank(13, wait=0.03, host="node2", v=INPUT_DISK))
    hosts = {"node1": HostFigures(data_disk_busy_pct=10.0), "node2": HostFigures(95.0)}
    v = judge_job(ranks, 16, hosts)
    # 30 ms of each 100 ms step is its own, the others' 5 ms: they could step in 75 ms
    assert v.headline == (
        "rank 13 on node2 is 33 % slower: input-bound/disk; its data disk 95 % busy, others' 10 %"
    )
    assert v.slower == pytest.approx(0.025 / 0.075)
    assert v.severity == "warning"
    assert any(e.startswith("data wait: 30 ms per step vs 5.0 ms") for e in v.evidence)


def test_a_slow_forward_is_the_cause_though_every_rank_waits_for_data() -> None:
    """All ranks wait for data alike (their own verdicts: input-bound); one is slow in its
    forward. It was blamed on its data loading ("input-bound/few-workers"), whose advice
    (more workers) would not help it."""
    ranks = [rank(r, wait=0.03, phases=(("forward", 0.001),), v=INPUT_FEW) for r in range(3)]
    ranks[1] = rank(1, wait=0.03, phases=(("forward", 0.031),), v=INPUT_FEW)
    v = judge_job(ranks, 3)
    assert v.kind == "straggler" and v.straggler_rank == 1, v
    assert v.cause == "slow forward", v.cause
    assert v.evidence[0].startswith("forward: 31 ms per step vs 1.0 ms"), v.evidence


def test_alike_gives_the_common_verdict() -> None:
    ranks = [rank(r, wait=0.05, v=INPUT_FEW) for r in range(3)] + [rank(3, v=COMPUTE)]
    v = judge_job(ranks, 4)
    assert v.kind == "alike" and v.cause == "input-bound/few-workers"
    assert v.headline == "all 4 ranks alike: input-bound/few-workers on 3 of 4"
    assert v.severity == "warning"


def test_a_hung_job_names_the_rank_that_is_behind() -> None:
    stalled = verdict("stalled", severity="critical")
    ranks = [replace(rank(r, v=stalled), last_index=1201) for r in range(8) if r != 5]
    ranks.append(replace(rank(5, v=stalled, host="node2"), last_index=1200))
    v = judge_job(ranks, 8)
    assert (v.kind, v.straggler_rank, v.cause, v.severity) == (
        "straggler",
        5,
        "stalled",
        "critical",
    )
    assert v.headline == (
        "rank 5 on node2 holds the job: it stopped after step 1200, the others reached step 1201"
    )
    # all at the same step: nobody is behind, they are alike (stalled)
    level = [replace(r, last_index=1201) for r in ranks]
    assert judge_job(level, 8).kind == "alike"
    assert judge_job(level, 8).cause == "stalled"


def test_missing_ranks_are_listed() -> None:
    # a publisher claiming an absurd world is judged without counting to it
    assert judge_job([rank(0), rank(1)], 2**63 - 1).missing == ()
    v = judge_job([rank(0), rank(2), rank(3)], 8)
    assert v.missing == (1, 4, 5, 6, 7)
    assert any("not heard from: rank 1, 4, 5, 6, 7 (3 of 8 reporting)" in e for e in v.evidence)


KILLED = "exited: process gone without goodbye (killed?)"


def test_a_rank_that_ended_is_the_jobs_news() -> None:
    """A killed rank was counted among the ranks, and the rest were "all 2 ranks alike"."""
    killed = {"ended": KILLED, "ended_badly": True}
    ranks = [rank(0), replace(rank(1), figures=None, ended_ago_s=4.0, **killed), rank(2)]
    v = judge_job(ranks, 3)
    assert v.kind == "ended" and v.severity == "critical", v
    assert v.straggler_rank == 1 and v.reporting == 2
    assert v.headline == (
        f"rank 1 on node1 {KILLED}: the 2 still running wait for it at their next collective"
    )
    # all ended: the first to end is named (a killed rank, then the others crashed)
    crashed = "exited: crashed (RuntimeError: NCCL error) after 1,201 steps"
    all_ended = [
        replace(rank(0), figures=None, ended=crashed, ended_ago_s=1.0, ended_badly=True),
        replace(rank(1), figures=None, ended_ago_s=9.0, **killed),
        replace(rank(2), figures=None, ended=crashed, ended_ago_s=1.0, ended_badly=True),
    ]
    v = judge_job(all_ended, 3)
    assert v.kind == "ended" and v.headline == f"the job ended: rank 1 on node1 first ({KILLED})"
    assert "then rank 0, 2 ended too" in v.evidence
    # a job that finished: every rank exited as it said, no alarm
    done = [
        replace(rank(r), figures=None, ended="exited: process exit", ended_ago_s=2.0)
        for r in range(3)
    ]
    assert judge_job(done, 3).severity == "info"


def test_shown_straggler_holds_down_to_the_exit_gap() -> None:
    entered = judge_job([rank(0), rank(1, wait=0.04)], 2)
    assert entered.kind == "straggler"
    between = [rank(0), rank(1, wait=0.005 + 0.085 * 0.1)]  # gap 8.5 %: between exit and enter
    assert judge_job(between, 2).kind == "alike"
    assert judge_job(between, 2, previous=entered).kind == "straggler"


def test_tracker_needs_the_straggler_to_hold() -> None:
    tracker = JobTracker()
    alike = judge_job([rank(0), rank(1)], 2)
    strag = judge_job([rank(0), rank(1, wait=0.04)], 2)
    assert tracker.update(alike, 0.0).kind == "alike"
    assert tracker.update(strag, 1.0).kind == "alike"  # held 0 s
    assert tracker.update(alike, 2.0).kind == "alike"  # gone again: a blip
    assert tracker.update(strag, 3.0).kind == "alike"
    assert tracker.update(strag, 3.5).kind == "alike"  # 2 updates, held 0.5 s
    shown = tracker.update(strag, 4.0)
    assert shown.kind == "straggler" and shown.since == 3.0


# ------------------------------------------------------------------ grouping in the viewer


def hello(r: int, job: str | None = "torchrun:j1", world: int = 4, host: str = "node1") -> Hello:
    return Hello(
        source_id=f"{host}:{100 + r}",
        role="probe",
        name="train.py",
        host=host,
        pid=100 + r,
        started=T0,
        probe_version="x",
        rank=r,
        local_rank=r % 2,
        world_size=world,
        job=job,
        device=DeviceRef("cuda", r % 2, None),
    )


def host_sample(host: str, t: float) -> SystemSample:
    gpus = tuple(
        GpuSample(i, "H100", None, util_pct=90.0 + i, mem_used_bytes=40, mem_total_bytes=80)
        for i in range(2)
    )
    disk = (DiskSample("sda", 1e6, 0.0, 10.0, 0.0, 95.0 if host == "node2" else 10.0),)
    return SystemSample(t, host, 1.0, True, disks=disk, gpus=gpus, data_device="sda1")


def feed(state: ViewerState, h: Hello, wait: float, end: float = T0 + 10) -> None:
    state.apply(Received(h, end - 9))
    records = tuple(steps(n=60, wait=wait, end=end))
    state.apply(Received(Steps(h.source_id, records, 0, 0), end))
    for back in (2, 1, 0):  # the analyzer needs 2+ host samples for a cause
        state.apply(Received(System(h.source_id, host_sample(h.host, end - back)), end))


def test_viewer_groups_ranks_and_names_the_straggler() -> None:
    state = ViewerState("viewer-host", pid_alive=False)
    for r in range(4):
        feed(state, hello(r, host=f"node{r // 2 + 1}"), 0.04 if r == 3 else 0.005)
    feed(state, hello(0, job="torchrun:other", world=1, host="node9"), 0.0)
    feed(state, hello(7, job=None, host="node8"), 0.0)  # not launched as a job: not grouped
    state.tick(T0 + 10.1)
    jobs = {job.job_id: job for job in state.jobs}
    assert set(jobs) == {"torchrun:j1", "torchrun:other"}
    job = jobs["torchrun:j1"]
    assert [row.rank for row in job.ranks] == [0, 1, 2, 3]
    assert job.verdict is not None and job.verdict.kind == "straggler"
    assert job.verdict.straggler == "node2:103"
    assert job.verdict.headline.endswith("its data disk 95 % busy, others' 10 %")
    row = job.row("node2:103")
    assert row is not None and row.slow and row.host == "node2"
    assert row.device == "GPU 1" and row.device_util_pct == 91.0
    assert row.device_mem_share == 0.5 and row.wait_share == pytest.approx(0.4)
    assert row.verdict is not None and row.verdict.startswith("input-bound")
    assert state.job_of("node1:100") is job
    assert state.job_of("node8:107") is None


def test_the_viewer_says_a_rank_of_a_job_crashed() -> None:
    state = ViewerState("viewer-host", pid_alive=False)
    for r in range(3):
        feed(state, hello(r, world=3), 0.005)
    crashed = hello(1, world=3)
    state.apply(Received(Bye(crashed.source_id, "crashed (RuntimeError: boom)", 60), T0 + 10.5))
    state.tick(T0 + 11.0)
    (job,) = state.jobs
    assert job.verdict is not None and job.verdict.kind == "ended", job.verdict
    assert job.verdict.severity == "critical" and job.verdict.straggler_rank == 1
    assert "crashed (RuntimeError: boom)" in job.verdict.headline


@pytest.mark.parametrize(
    ("reason", "severity"),
    [
        ("process exit", "info"),
        ("interrupted (Ctrl-C)", "info"),
        # probe.close(reason) is the user's words: read as words, not as a crash
        ("closed: killed the stale workers, lost nothing", "info"),
        ("crashed (RuntimeError: CUDA error)", "critical"),
    ],
)
def test_how_a_finished_job_ended_is_read_from_the_bye_not_from_its_words(
    reason: str, severity: str
) -> None:
    state = ViewerState("viewer-host", pid_alive=False)
    for r in range(2):
        feed(state, hello(r, world=2), 0.005)
    first, second = hello(0, world=2), hello(1, world=2)
    state.apply(Received(Bye(first.source_id, reason, 60), T0 + 10.2))
    state.apply(Received(Bye(second.source_id, "process exit", 60), T0 + 10.5))
    state.tick(T0 + 11.0)
    (job,) = state.jobs
    assert job.verdict is not None and job.verdict.kind == "ended", job.verdict
    assert job.verdict.severity == severity and job.verdict.straggler_rank == 0


def test_a_restarted_rank_counts_once() -> None:
    state = ViewerState("viewer-host", pid_alive=False)
    for r in range(2):
        feed(state, hello(r, world=2), 0.005)
    restarted = Hello(**{**hello(1, world=2).__dict__, "source_id": "node1:999", "pid": 999})
    restarted = Hello(**{**restarted.__dict__, "started": T0 + 5})
    feed(state, restarted, 0.005)
    state.tick(T0 + 10.1)
    (job,) = state.jobs
    assert [row.key for row in job.ranks] == ["node1:100", "node1:999"]


def test_five_hundred_twelve_ranks_one_job() -> None:
    state = ViewerState("viewer-host", pid_alive=False)
    for r in range(512):
        feed(state, hello(r, world=512, host=f"node{r // 8}"), 0.03 if r == 300 else 0.005)
    state.tick(T0 + 10.1)
    (job,) = state.jobs
    assert len(job.ranks) == 512 and state.source_count == 512
    assert job.verdict is not None and job.verdict.straggler_rank == 300


def test_an_initialised_process_group_gives_rank_and_world() -> None:
    """Lightning sets no RANK: the probe reads the real torch process group."""
    import socket

    dist = pytest.importorskip("torch.distributed")
    from gputop_dl.probe.jobenv import process_group

    assert process_group() is None  # not initialised
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert process_group() == (0, 1)
    finally:
        dist.destroy_process_group()
    assert process_group() is None
