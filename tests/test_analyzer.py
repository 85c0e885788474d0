"""The bottleneck analyzer on synthetic windows: one case per verdict and cause, the
boundary of every threshold, missing data, and the tracker's hysteresis over time."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe.messages import DeviceRef, Hello, LoaderInfo, StepRecord
from gputop_dl.probe.samples import (
    CgroupSample,
    CpuCore,
    CpuSample,
    DiskSample,
    GpuSample,
    HpuSample,
    MemorySample,
    NetSample,
    PressureSample,
    ProcessSample,
    SystemSample,
    TopProcess,
    TrainingProcesses,
)
from gputop_dl.tui.analysis import fmt
from gputop_dl.tui.analysis.causes import suggest_workers
from gputop_dl.tui.analysis.thresholds import STACK_GRACE_S
from gputop_dl.tui.analyzer import Verdict, VerdictTracker, Window, analyze
from gputop_dl.tui.state.clean import evolve as replace

T0 = 1_700_000_000.0
HOST = "node1"

# --- builders -------------------------------------------------------------------------------


def make_steps(
    n: int = 40,
    period: float = 0.1,
    wait: float | None = 0.0,
    *,
    samples: int | None = 32,
    first: int = 1,
    start: float = T0,
    device_s: float | None = None,
    idle_s: float | None = None,
    phases: tuple[tuple[str, float], ...] = (),
    caught_up: float | None = None,
) -> list[StepRecord]:
    """``n`` identical steps, indices from ``first``, the first one ending at ``start``;
    ``caught_up`` of them (a fraction, spread evenly) report the device caught up."""
    return [
        StepRecord(
            index=first + i,
            end_time=start + i * period,
            period_s=period,
            wait_s=wait,
            samples=samples,
            device_s=device_s,
            device_idle_s=idle_s,
            phases=phases,
            device_caught_up=None
            if caught_up is None
            else int((i + 1) * caught_up) > int(i * caught_up),
        )
        for i in range(n)
    ]


def cores(n: int = 8, busy: float = 5.0, pinned: int = 0, iowait: float = 0.0) -> CpuSample:
    """``pinned`` cores at 100 %, the rest at ``busy`` % with ``iowait`` % iowait."""
    made = []
    for i in range(n):
        b = 100.0 if i < pinned else busy
        w = 0.0 if i < pinned else iowait
        made.append(CpuCore(i, b, 0.0, w, 0.0, max(0.0, 100.0 - b - w)))
    return CpuSample(tuple(made), None)


def processes(
    main: float | None = 30.0,
    workers: Sequence[float] = (),
    *,
    main_reads: float | None = None,
    worker_reads: float | None = None,
) -> TrainingProcesses:
    """The training's processes; ``*_reads``: each one's reads from storage, bytes/s
    (None: not reported, as an older probe's samples)."""
    procs = [ProcessSample(100, "main", "python", main, 1 << 30, main_reads)]
    procs += [
        ProcessSample(101 + i, "worker", "python", w, 1 << 28, worker_reads)
        for i, w in enumerate(workers)
    ]
    return TrainingProcesses(
        tuple(procs),
        saturated_workers=sum(1 for w in workers if w >= 90.0),
        worker_count=len(workers),
    )


def system(
    t: float,
    *,
    cpu: CpuSample | None = None,
    procs: TrainingProcesses | None = None,
    disk_busy: float | None = None,
    disk_read: float | None = None,
    disk_write: float | None = 0.0,
    data_device: str | None = "nvme0n1",
    swap_in: float | None = 0.0,
    throttled: float | None = None,
    quota: float | None = None,
    fs: str | None = "ext4",
    net_rx: float | None = None,
    io_some: float | None = None,
    gpus: tuple[GpuSample, ...] = (),
    hpus: tuple[HpuSample, ...] = (),
    host_sampled: bool = True,
    top: tuple[TopProcess, ...] | None = None,
) -> SystemSample:
    disks = ()
    if disk_busy is not None or disk_read is not None:
        disks = (DiskSample("nvme0n1", disk_read, disk_write, 100.0, 0.0, disk_busy),)
    cgroup = None
    if throttled is not None or quota is not None:
        cgroup = CgroupSample(quota, 1000, 100, 10, throttled, None, None)
    return SystemSample(
        time=t,
        host=HOST,
        interval_s=1.0,
        host_sampled=host_sampled,
        cpu=(cpu or cores()) if host_sampled else None,
        memory=MemorySample(64 << 30, 8 << 30, 56 << 30, 4 << 30, 8 << 30, 0, swap_in, 0.0)
        if host_sampled
        else None,
        disks=disks,
        nets=(NetSample("eth0", net_rx, 0.0), NetSample("lo", 1e9, 1e9))
        if net_rx is not None
        else (),
        pressure=PressureSample(None, io_some, None, None, None) if io_some is not None else None,
        cgroup=cgroup,
        processes=procs,
        gpus=gpus,
        hpus=hpus,
        data_device=data_device,
        data_fs_type=fs,
        top=top,
    )


def systems(now: float, n: int = 5, **kw: object) -> list[SystemSample]:
    """``n`` samples one second apart, the newest at ``now``."""
    return [system(now - (n - 1 - i), **kw) for i in range(n)]  # type: ignore[arg-type]


def gpu(
    util: float = 95.0,
    mem: float = 0.6,
    reasons: tuple[str, ...] | None = (),
    pcie_rx: float | None = None,
) -> GpuSample:
    total = 80 << 30
    return GpuSample(
        index=0,
        name="A100",
        uuid="GPU-0",
        util_pct=util,
        mem_used_bytes=int(total * mem),
        mem_total_bytes=total,
        power_w=300.0,
        power_limit_w=300.0,
        pcie_rx_bps=pcie_rx,
        throttle_reasons=reasons,
    )


def hello(
    num_workers: int | None = 4,
    *,
    loader: bool = True,
    timing: str = "host",
    pin_memory: bool | None = True,
    persistent: bool | None = True,
    prefetch: int | None = 4,
    host_sampler: bool = False,
    started: float = T0 - 30,
) -> Hello:
    info = (
        LoaderInfo(
            "torch.DataLoader",
            num_workers=num_workers,
            pin_memory=pin_memory,
            batch_size=32,
            prefetch_factor=prefetch,
            persistent_workers=persistent,
        )
        if loader
        else None
    )
    return Hello(
        source_id=f"{HOST}:100",
        role="probe",
        name="run",
        host=HOST,
        pid=100,
        started=started,
        probe_version="0.1.0",
        timing=timing,
        loader=info,
        host_sampler=host_sampler,
    )


def window(
    steps: Sequence[StepRecord],
    sys: Sequence[SystemSample] | None = None,
    h: Hello | None = None,
    *,
    now: float | None = None,
    **sys_kw: object,
) -> Window:
    """A window whose clock is just after the last step; host samples from ``sys_kw``
    unless given explicitly."""
    last = steps[-1].end_time if steps else T0
    t = last + 0.05 if now is None else now
    if sys is None:
        sys = systems(t, **sys_kw)
    return Window(now=t, steps=steps, systems=sys, hello=h if h is not None else hello())


INPUT = 0.06  # 60 % of a 100 ms step: clearly input-bound
# hello()'s 4 workers x prefetch_factor 4 serve steps 1-16 from batches prefetched during
# start-up (not counted): short step lists start after them
PAST_PREFETCH = 17
QUIET = {"procs": processes(30.0, [70.0] * 4)}  # 4 workers busy but not saturated, CPU idle

# --- one case per kind and cause ------------------------------------------------------------

Case = tuple[Callable[[], Window], str, str, str | None]

CASES: dict[str, Case] = {
    "no steps": (lambda: window([], now=T0), "warming-up", "info", None),
    "4 usable steps": (lambda: window(make_steps(4)), "warming-up", "info", None),
    "5 records but step 0 is not counted": (
        lambda: window(make_steps(5, first=0)),
        "warming-up",
        "info",
        None,
    ),
    "exactly 5 usable steps": (
        lambda: window(make_steps(5, first=PAST_PREFETCH)),
        "compute-bound",
        "ok",
        None,
    ),
    "compute-bound": (lambda: window(make_steps(wait=0.001), **QUIET), "compute-bound", "ok", None),
    "few-workers: num_workers=0, main pinned, cores idle": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(0),
            cpu=cores(8, pinned=1),
            procs=processes(100.0),
        ),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "few-workers: num_workers=0 with no host samples at all": (
        lambda: window(make_steps(wait=INPUT), [], hello(0)),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "few-workers: every worker saturated, 6 cores idle": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(2),
            cpu=cores(8, pinned=2),
            procs=processes(20.0, [99.0, 98.0]),
        ),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "few-workers: no loader info, main pinned, cores idle": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(loader=False),
            cpu=cores(8, pinned=1),
            procs=processes(100.0),
        ),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "cpu-workers: every worker saturated, no core idle": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(8),
            cpu=cores(8, pinned=8),
            procs=processes(20.0, [99.0] * 8),
        ),
        "input-bound",
        "warning",
        "cpu-workers",
    ),
    "cpu-workers: workers below a core each but the host CPU is full": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(8),
            cpu=cores(4, busy=97.0),
            procs=processes(50.0, [45.0] * 8),
        ),
        "input-bound",
        "warning",
        "cpu-workers",
    ),
    "cpu-contention: the CPU is full with other processes": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(2),
            cpu=cores(4, busy=98.0),
            procs=processes(40.0, [30.0, 30.0]),
        ),
        "input-bound",
        "warning",
        "cpu-contention",
    ),
    "disk: data disk 90 % busy": (
        lambda: window(make_steps(wait=INPUT), disk_busy=90.0, disk_read=400e6, **QUIET),
        "input-bound",
        "warning",
        "disk",
    ),
    "disk: data device unknown, busiest disk stands in": (
        lambda: window(
            make_steps(wait=INPUT), disk_busy=90.0, disk_read=400e6, data_device=None, **QUIET
        ),
        "input-bound",
        "warning",
        "disk",
    ),
    "disk (weak): iowait high, loader not CPU-bound": (
        lambda: window(make_steps(wait=INPUT), cpu=cores(8, busy=5.0, iowait=20.0), **QUIET),
        "input-bound",
        "warning",
        "disk",
    ),
    "disk (weak): I/O pressure high": (
        lambda: window(make_steps(wait=INPUT), io_some=35.0, **QUIET),
        "input-bound",
        "warning",
        "disk",
    ),
    "disk: num_workers=0, main process off-CPU while the node reads": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(0),
            procs=processes(39.0),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "input-bound",
        "warning",
        "disk",
    ),
    "few-workers: num_workers=0, main process off-CPU but no reads": (
        lambda: window(make_steps(wait=INPUT), h=hello(0), procs=processes(39.0), disk_read=0.0),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "few-workers: 1 worker at 3 % CPU waits, loop waits 60 %, cores idle": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(1),
            cpu=cores(2, busy=15.0),
            procs=processes(40.0, [3.0]),
            disk_read=0.0,
        ),
        "input-bound",
        "warning",
        "few-workers",
    ),
    "cpu-workers: 4 workers each ~100 % CPU, cores full": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(4),
            cpu=cores(4, busy=100.0),
            procs=processes(20.0, [99.0, 100.0, 98.0, 99.0]),
        ),
        "input-bound",
        "warning",
        "cpu-workers",
    ),
    "disk: 1 worker at 3 % CPU while the node reads": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(1),
            cpu=cores(2, busy=15.0),
            procs=processes(40.0, [3.0]),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "input-bound",
        "warning",
        "disk",
    ),
    "disk: workers off-CPU, some I/O pressure": (
        lambda: window(make_steps(wait=INPUT), procs=processes(20.0, [30.0] * 4), io_some=12.0),
        "input-bound",
        "warning",
        "disk",
    ),
    "memory: sustained swap-in 5 MB/s": (
        lambda: window(make_steps(wait=INPUT), swap_in=5e6, **QUIET),
        "input-bound",
        "warning",
        "memory",
    ),
    "network-storage: dataset on nfs4, 120 MB/s received": (
        lambda: window(make_steps(wait=INPUT), fs="nfs4", net_rx=120e6, **QUIET),
        "input-bound",
        "warning",
        "network-storage",
    ),
    "network-storage: fuse mount (s3fs)": (
        lambda: window(make_steps(wait=INPUT), fs="fuse.s3fs", net_rx=1e6, **QUIET),
        "input-bound",
        "warning",
        "network-storage",
    ),
    "cpu-quota as the input-bound cause": (
        lambda: window(make_steps(wait=INPUT), throttled=30.0, quota=2.0, **QUIET),
        "input-bound",
        "warning",
        "cpu-quota",
    ),
    "unknown: no host samples and workers configured": (
        lambda: window(make_steps(wait=INPUT), []),
        "input-bound",
        "warning",
        "unknown",
    ),
    "unknown: a single host sample": (
        lambda: window(make_steps(wait=INPUT), n=1, **QUIET),
        "input-bound",
        "warning",
        "unknown",
    ),
    "unknown: nothing measured explains the wait": (
        lambda: window(make_steps(wait=INPUT), **QUIET),
        "input-bound",
        "warning",
        "unknown",
    ),
    "unknown: only samples of a rank that does not sample the host": (
        lambda: window(make_steps(wait=INPUT), host_sampled=False, **QUIET),
        "input-bound",
        "warning",
        "unknown",
    ),
    "unknown: host samples are stale": (
        lambda: window(make_steps(wait=INPUT), systems(T0 - 60, procs=processes(30.0, [40.0] * 4))),
        "input-bound",
        "warning",
        "unknown",
    ),
    "moderately input-bound (12 %)": (
        lambda: window(make_steps(wait=0.012), **QUIET),
        "input-bound",
        "info",
        "unknown",
    ),
    "stalled: no step for 20 s at 0.1 s steps": (
        lambda: window(make_steps(), now=T0 + 3.9 + 20),
        "stalled",
        "critical",
        None,
    ),
    "stalled: slow 5 s steps, none for 30 s": (
        lambda: window(make_steps(10, period=5.0, first=PAST_PREFETCH), now=T0 + 45 + 30),
        "stalled",
        "critical",
        None,
    ),
    "host-overhead: the device caught up with the host in 70 % of steps": (
        lambda: window(
            make_steps(wait=0.002, device_s=0.07, caught_up=0.7), h=hello(timing="cuda-events")
        ),
        "host-overhead",
        "warning",
        None,
    ),
    "h2d-copies: phase h2d 20 %": (
        lambda: window(make_steps(wait=0.001, phases=(("forward", 0.05), ("h2d", 0.02)))),
        "h2d-copies",
        "warning",
        None,
    ),
    "h2d-copies: phase named to_device": (
        lambda: window(make_steps(wait=0.001, phases=(("to_device", 0.03),))),
        "h2d-copies",
        "warning",
        None,
    ),
    "gpu-memory-full: 97 %": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(mem=0.97),)),
        "gpu-memory-full",
        "warning",
        None,
    ),
    "gpu-memory-full: an HPU at 96 %": (
        lambda: window(
            make_steps(wait=0.001),
            hpus=(
                HpuSample(0, "HL-325L", "u", util_pct=90.0, mem_used_bytes=96, mem_total_bytes=100),
            ),
        ),
        "gpu-memory-full",
        "warning",
        None,
    ),
    "not gpu-memory-full: hl-smi stopped updating, its last figures are stale": (
        lambda: window(
            make_steps(wait=0.001),
            hpus=(
                HpuSample(
                    0,
                    "HL-325L",
                    "u",
                    state="stale",
                    error="stale: no update for 12 s",
                    util_pct=90.0,
                    mem_used_bytes=96,
                    mem_total_bytes=100,
                ),
            ),
        ),
        "compute-bound",
        "ok",
        None,
    ),
    "throttling: hw_thermal": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(reasons=("hw_thermal",)),)),
        "throttling",
        "warning",
        None,
    ),
    "throttling: sw_power_cap while busy is info": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(util=97.0, reasons=("sw_power_cap",)),)),
        "throttling",
        "info",
        None,
    ),
    "not throttling: sw_power_cap while idle": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(util=10.0, reasons=("sw_power_cap",)),)),
        "compute-bound",
        "ok",
        None,
    ),
    "cpu-quota kind when not input-bound": (
        lambda: window(make_steps(wait=0.001), throttled=30.0, quota=2.0),
        "cpu-quota",
        "warning",
        None,
    ),
    "unknown: steps marked with probe.step carry no wait": (
        lambda: window(make_steps(wait=None)),
        "unknown",
        "info",
        None,
    ),
    "device stayed busy through the wait: compute-bound": (
        lambda: window(
            make_steps(wait=0.03, device_s=0.099, idle_s=0.001), h=hello(timing="cuda-events")
        ),
        "compute-bound",
        "ok",
        None,
    ),
}


@pytest.mark.parametrize(("build", "kind", "severity", "cause"), CASES.values(), ids=CASES.keys())
def test_kind_and_cause(
    build: Callable[[], Window], kind: str, severity: str, cause: str | None
) -> None:
    v = analyze(build())
    assert (v.kind, v.severity, v.cause) == (kind, severity, cause), v
    assert v.headline
    assert 0.0 <= v.confidence <= 1.0
    if kind not in ("warming-up",):
        assert v.evidence, "every verdict names its evidence"


# --- boundaries of each threshold -------------------------------------------------------------

BOUNDARIES: dict[str, tuple[Callable[[], Window], str, str | None]] = {
    "wait 4.9 %: compute-bound": (lambda: window(make_steps(wait=0.0049)), "compute-bound", "ok"),
    "wait 5.1 %: moderately input-bound": (
        lambda: window(make_steps(wait=0.0051)),
        "input-bound",
        "info",
    ),
    "wait 19.9 %: moderately input-bound": (
        lambda: window(make_steps(wait=0.0199)),
        "input-bound",
        "info",
    ),
    "wait 20.1 %: input-bound": (
        lambda: window(make_steps(wait=0.0201)),
        "input-bound",
        "warning",
    ),
    "h2d 14 %: not flagged": (
        lambda: window(make_steps(wait=0.001, phases=(("h2d", 0.014),))),
        "compute-bound",
        "ok",
    ),
    "h2d 16 %: flagged": (
        lambda: window(make_steps(wait=0.001, phases=(("h2d", 0.016),))),
        "h2d-copies",
        "warning",
    ),
    "device caught up in 40 % of steps: not flagged": (
        lambda: window(make_steps(wait=0.001, device_s=0.085, caught_up=0.4)),
        "compute-bound",
        "ok",
    ),
    "device caught up in 60 % of steps: flagged": (
        lambda: window(make_steps(wait=0.001, device_s=0.083, caught_up=0.6)),
        "host-overhead",
        "warning",
    ),
    "device caught up in every step, but the loop waits for data: input-bound": (
        lambda: window(make_steps(wait=INPUT, device_s=0.03, caught_up=1.0), **QUIET),
        "input-bound",
        "warning",
    ),
    "GPU memory 94 %: fine": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(mem=0.94),)),
        "compute-bound",
        "ok",
    ),
    "GPU memory 95.5 %: full": (
        lambda: window(make_steps(wait=0.001), gpus=(gpu(mem=0.955),)),
        "gpu-memory-full",
        "warning",
    ),
    "quota throttled 9 %: fine": (
        lambda: window(make_steps(wait=0.001), throttled=9.0),
        "compute-bound",
        "ok",
    ),
    "quota throttled 11 %: flagged": (
        lambda: window(make_steps(wait=0.001), throttled=11.0),
        "cpu-quota",
        "warning",
    ),
    "no step for 9.9 s at 0.1 s steps: not stalled (10 s minimum)": (
        lambda: window(make_steps(), now=T0 + 3.9 + 9.9),
        "compute-bound",
        "ok",
    ),
    "no step for 10.1 s at 0.1 s steps, no stack yet: not stalled (it is on its way)": (
        lambda: window(make_steps(), now=T0 + 3.9 + 10.1),
        "compute-bound",
        "ok",
    ),
    "no step for 11.6 s at 0.1 s steps, no stack: stalled": (
        lambda: window(make_steps(), now=T0 + 3.9 + 11.6),
        "stalled",
        "critical",
    ),
    "5 s steps, none for 24 s: not stalled (5 x typical)": (
        lambda: window(make_steps(10, period=5.0, first=PAST_PREFETCH), now=T0 + 45 + 24),
        "compute-bound",
        "ok",
    ),
}


@pytest.mark.parametrize(("build", "kind", "severity"), BOUNDARIES.values(), ids=BOUNDARIES.keys())
def test_threshold_boundaries(build: Callable[[], Window], kind: str, severity: str) -> None:
    v = analyze(build())
    assert (v.kind, v.severity) == (kind, severity), v


CAUSE_BOUNDARIES: dict[str, tuple[dict[str, object], str]] = {
    "disk 69 % busy: not the disk": ({"disk_busy": 69.0}, "unknown"),
    "disk 71 % busy: the disk": ({"disk_busy": 71.0}, "disk"),
    "swap-in 0.9 MB/s: not memory": ({"swap_in": 0.9e6}, "unknown"),
    "swap-in 1.1 MB/s: memory": ({"swap_in": 1.1e6}, "memory"),
    "quota throttled 9 %: not the quota": ({"throttled": 9.0}, "unknown"),
    "quota throttled 11 %: the quota": ({"throttled": 11.0}, "cpu-quota"),
    "loader workers at 61 %, reading: not blocked": (
        {"disk_read": 50e6, "procs": processes(20.0, [61.0] * 4)},
        "unknown",
    ),
    "loader workers at 59 %, reading: blocked on the disk": (
        {"disk_read": 50e6, "procs": processes(20.0, [59.0] * 4)},
        "disk",
    ),
    "loader workers at 61 %, nothing read: not said to wait": (
        {"disk_read": 0.0, "procs": processes(20.0, [61.0] * 4)},
        "unknown",
    ),
    "loader workers at 59 %, nothing read: they wait, more overlap the waits": (
        {"disk_read": 0.0, "procs": processes(20.0, [59.0] * 4)},
        "few-workers",
    ),
    "iowait 0.4 cores: not the disk": ({"cpu": cores(8, busy=5.0, iowait=5.0)}, "unknown"),
    "iowait 0.56 cores: the disk": ({"cpu": cores(8, busy=5.0, iowait=7.0)}, "disk"),
}


@pytest.mark.parametrize(("kw", "cause"), CAUSE_BOUNDARIES.values(), ids=CAUSE_BOUNDARIES.keys())
def test_cause_boundaries(kw: dict[str, object], cause: str) -> None:
    v = analyze(window(make_steps(wait=INPUT), **{**QUIET, **kw}))
    assert (v.kind, v.cause) == ("input-bound", cause), v


# --- figures, text and advice ------------------------------------------------------------------


def test_input_bound_figures_and_headroom() -> None:
    v = analyze(window(make_steps(wait=0.042, period=0.059), h=hello(0), procs=processes(100.0)))
    assert v.wait_share == pytest.approx(0.042 / 0.059)
    assert v.samples_per_s == pytest.approx(32 / 0.059)
    assert v.steps_per_s == pytest.approx(1 / 0.059)
    assert "71 %" in v.evidence[0] and "42 ms" in v.evidence[0] and "59 ms" in v.evidence[0]
    # Without the wait: 32 samples per 17 ms of compute = 1882 samples/s, +247 %.
    # The loading (the main process, 100 % CPU during 71 % of the step: 1.3 ms of CPU per
    # sample) would keep up on the 4 workers advised, so the step without the wait bounds it.
    assert v.headroom == (
        "without the data wait: at most ≈ 1882 samples/s, +247 % "
        "(loading 1.3 ms CPU per sample keeps up on 4 cores)"
    )


def test_headroom_in_steps_when_samples_unknown() -> None:
    v = analyze(window(make_steps(wait=0.05, samples=None), **QUIET))
    assert v.samples_per_s is None
    assert v.headroom == "without the data wait: at most ≈ 20.0 steps/s, +100 %"


def test_few_workers_advice_is_bounded_by_idle_cores() -> None:
    v = analyze(
        window(
            make_steps(wait=INPUT),
            h=hello(0),
            cpu=cores(8, busy=0, pinned=1),
            procs=processes(100.0),
        )
    )
    assert v.cause == "few-workers"
    assert v.advice[0] == "set DataLoader(num_workers=2\u20134) (now 0; 7 of 8 cores idle)"
    two_cores = analyze(window(make_steps(wait=INPUT), h=hello(0), cpu=cores(2, busy=40, pinned=1)))
    assert two_cores.advice[0].startswith("set DataLoader(num_workers=1) (now 0; ")
    # Pinned to one core, and it is busy: a worker would load where nothing is free
    # (a review's "set num_workers=1 (0 of 1 core idle)" bought nothing).
    one = replace(hello(0), cpu_affinity=(0,))
    full = analyze(
        window(make_steps(wait=INPUT), h=one, procs=processes(100.0), cpu=cores(2, busy=100))
    )
    assert full.cause == "cpu-workers", full
    assert not any("num_workers=" in a for a in full.advice), full.advice
    assert full.advice[0].startswith("let it use more of the node's cores"), full.advice


@pytest.mark.parametrize(
    ("current", "free", "expected"),
    [
        (0, 8.0, (2, 4)),
        (0, 0.3, (1, 1)),  # moving the loading off the main process always helps
        (0, 2.9, (2, 3)),  # 2.9 idle cores round to 3 workers
        (2, 6.0, (4, 6)),
        (8, 40.0, (10, 16)),
        (0, None, (2, 4)),
        (4, None, (5, 8)),
    ],
)
def test_suggest_workers(current: int, free: float | None, expected: tuple[int, int]) -> None:
    assert suggest_workers(current, free) == expected


def test_cpu_quota_caps_idle_cores() -> None:
    """64 idle host cores do not count when the container may use 4 and uses 3.5 already."""
    v = analyze(
        window(
            make_steps(wait=INPUT),
            h=hello(3),
            cpu=cores(64, busy=5.0),
            procs=processes(50.0, [100.0] * 3),
            quota=4.0,
            throttled=0.0,
        )
    )
    assert v.cause == "cpu-workers", v


def test_missing_host_samples_is_said_plainly() -> None:
    v = analyze(window(make_steps(wait=INPUT), []))
    assert v.cause == "unknown"
    assert any("no host samples" in e and "gputop agent" in e for e in v.evidence)
    assert "no host samples" in v.headline


def test_rank_without_host_figures_is_said_plainly() -> None:
    v = analyze(window(make_steps(wait=INPUT), host_sampled=False, **QUIET))
    assert any(e.startswith("no host samples: run `gputop agent`") for e in v.evidence)


def test_stale_host_samples_are_said_plainly() -> None:
    v = analyze(window(make_steps(wait=INPUT), systems(T0 - 60)))
    assert any(e.startswith("no host sample for 64 s:") for e in v.evidence), v.evidence


# Host samples not arrived yet: the cause waits for them (a young run, or one whose probe
# samples its node), rather than advising an agent. (A review: `gputop snapshot --wait 6`
# started 2 s before a single local process read "cause unknown (no host samples)" and
# "run `gputop agent`" 2 of 3 times.)
PENDING = "cause pending: waiting for the run's first host samples"
# steps from T0 to T0 + 3.9 s; a process started 2 s before the first step is young
YOUNG = T0 - 2.0
HOST_SAMPLES_PENDING: dict[str, tuple[Callable[[], Window], str]] = {
    "young run, its probe samples the host, no host sample yet": (
        lambda: window(make_steps(wait=INPUT), [], hello(host_sampler=True, started=YOUNG)),
        "its probe samples the node",
    ),
    "young run, num_workers=0, its probe samples the host, no host sample yet": (
        lambda: window(make_steps(wait=INPUT), [], hello(0, host_sampler=True, started=YOUNG)),
        "its probe samples the node",
    ),
    "old run, its probe samples the host, no host sample yet": (
        lambda: window(make_steps(wait=INPUT), [], hello(host_sampler=True)),
        "its probe samples the node",
    ),
    "young run, another process samples the host, none yet": (
        lambda: window(make_steps(wait=INPUT), [], hello(started=YOUNG)),
        "the loop began 6.0 s ago",
    ),
    "its probe samples the host, the samples held are the start-up's": (
        lambda: Window(
            now=T0 + 3.95,
            steps=make_steps(wait=INPUT),
            systems=systems(T0 - 1.0, **QUIET),  # each interval began before the first step
            hello=hello(host_sampler=True, started=YOUNG),
            run_from=T0 - 0.1,
        ),
        "its probe samples the node",
    ),
}


@pytest.mark.parametrize(
    ("build", "why"), HOST_SAMPLES_PENDING.values(), ids=HOST_SAMPLES_PENDING.keys()
)
def test_host_samples_on_their_way_are_awaited_not_an_agent(
    build: Callable[[], Window], why: str
) -> None:
    v = analyze(build())
    assert v.kind == "input-bound" and v.cause == "unknown", v
    assert "cause pending (waiting for the run's first host samples)" in v.headline, v.headline
    assert any(e.startswith(PENDING) and why in e for e in v.evidence), v.evidence
    assert not any("gputop agent" in e for e in v.evidence), v.evidence


def test_a_young_run_waits_for_samples_before_blaming_num_workers_0() -> None:
    """With num_workers=0 the host samples tell few-workers from a loader blocked on reads:
    a young run waits for them even without a host sampler of its own."""
    v = analyze(window(make_steps(wait=INPUT), [], hello(0, started=YOUNG)))
    assert v.cause == "unknown" and any(e.startswith(PENDING) for e in v.evidence), v


def test_no_sampler_and_no_agent_keeps_the_agent_advice() -> None:
    """An old run whose probe does not sample the host, and no agent's samples."""
    v = analyze(window(make_steps(wait=INPUT), [], hello(host_sampler=False)))
    assert "cause unknown (no host samples)" in v.headline, v.headline
    assert any(e.startswith("no host samples: run `gputop agent`") for e in v.evidence)


# The node's reads are not said to be the loader's: a sample carries no reads per process
# (probe/samples.py ProcessSample), so the disk rules that rest on the node's I/O alone
# say whose reads are unknown. (A review: a loader that sleeps read "disk … the main
# process waits on reads" while another job read the disk.)
WHOSE = "whose reads these are is unknown: the node samples carry no reads per process"
DISK_READS_UNATTRIBUTED: dict[str, tuple[Callable[[], Window], str | None]] = {
    "blocked loader, num_workers=0: main off-CPU while the node reads": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(0),
            procs=processes(20.0),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "the main process loads the batches itself and uses at most 33 % of a core while "
        "the loop waits for them: it is mostly off-CPU while the node reads",
    ),
    "blocked loader, workers off-CPU while the node reads": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(4),
            procs=processes(20.0, [20.0] * 4),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "the loader workers use only 20 % of a core while the loop waits for them: they are "
        "mostly off-CPU while the node reads",
    ),
    "disk (weak): I/O pressure high": (
        lambda: window(make_steps(wait=INPUT), io_some=35.0, **QUIET),
        None,
    ),
}


@pytest.mark.parametrize(
    ("build", "line"), DISK_READS_UNATTRIBUTED.values(), ids=DISK_READS_UNATTRIBUTED.keys()
)
def test_disk_from_the_nodes_reads_says_whose_they_are_is_unknown(
    build: Callable[[], Window], line: str | None
) -> None:
    v = analyze(build())
    assert v.cause == "disk", v
    assert any(e.startswith(WHOSE) for e in v.evidence), v.evidence
    assert line is None or line in v.evidence, v.evidence
    assert not any("it is blocked, and" in e for e in v.evidence), v.evidence


# With reads per process (ProcessSample.read_bps) the node's reads are told apart: a
# loader that sleeps in __getitem__ on a node where another job reads 400 MB/s read
# "disk … mostly off-CPU while the node reads", advice "copy the dataset to NVMe", and
# flapped with few-workers as the other job's reads came and went.
OTHERS = "another process's reads"
ZERO_OWN = {"main_reads": 0.0, "worker_reads": 0.0}
DISK_READS_OF_ANOTHER: dict[str, tuple[Callable[[], Window], str, str]] = {
    "num_workers=0, main off-CPU and reading nothing, the node 400 MB/s": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(0),
            procs=processes(20.0, **ZERO_OWN),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "few-workers",
        "the node reads 400 MB/s, the training's loading processes 0 kB/s: " + OTHERS,
    ),
    "4 workers off-CPU and reading nothing, the node 400 MB/s": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(4),
            procs=processes(20.0, [20.0] * 4, **ZERO_OWN),
            disk_read=400e6,
            disk_busy=34.0,
        ),
        "few-workers",
        "the node reads 400 MB/s, the training's loading processes 0 kB/s: " + OTHERS,
    ),
    "data disk 90 % busy with another process's reads": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(4),
            procs=processes(20.0, [20.0] * 4, main_reads=0.0, worker_reads=5e3),
            disk_read=400e6,
            disk_busy=90.0,
        ),
        "few-workers",
        "the node reads 400 MB/s, the training's loading processes 20 kB/s: " + OTHERS,
    ),
    "I/O pressure 35 % and iowait, the node 2.6 MB/s, the loader 0": (
        lambda: window(
            make_steps(wait=INPUT),
            h=hello(0),
            cpu=cores(iowait=10.0),
            procs=processes(20.0, **ZERO_OWN),
            disk_read=2.6e6,
            io_some=35.0,
        ),
        "few-workers",
        "the node reads 2.6 MB/s, the training's loading processes 0 kB/s: " + OTHERS,
    ),
}


@pytest.mark.parametrize(
    ("build", "cause", "line"), DISK_READS_OF_ANOTHER.values(), ids=DISK_READS_OF_ANOTHER.keys()
)
def test_the_nodes_reads_of_another_process_are_not_the_loaders_disk(
    build: Callable[[], Window], cause: str, line: str
) -> None:
    v = analyze(build())
    assert (v.kind, v.cause) == ("input-bound", cause), v
    assert line in v.evidence, v.evidence
    assert any(
        "what the node reads is another process's: the loading waits" in e for e in v.evidence
    ), v.evidence
    assert not any(e.startswith(WHOSE) for e in v.evidence), v.evidence
    assert not any("NVMe" in a for a in v.advice), v.advice


def test_a_sleeping_loader_is_few_workers_whether_or_not_the_node_reads() -> None:
    """The same loader, the other job's reads coming and going: one verdict."""

    def cause(disk_read: float, busy: float) -> str | None:
        v = analyze(
            window(
                make_steps(wait=INPUT),
                h=hello(1),
                procs=processes(20.0, [3.0], **ZERO_OWN),
                disk_read=disk_read,
                disk_busy=busy,
            )
        )
        assert v.kind == "input-bound", v
        return v.cause

    assert cause(400e6, 34.0) == cause(0.0, 0.0) == "few-workers"


DISK_READS_OF_THE_LOADER: dict[str, Callable[[], Window]] = {
    "num_workers=0, main off-CPU reading 350 MB/s of the node's 400": lambda: window(
        make_steps(wait=INPUT),
        h=hello(0),
        procs=processes(20.0, main_reads=350e6),
        disk_read=400e6,
        disk_busy=34.0,
    ),
    "4 workers off-CPU reading 350 MB/s of the node's 400": lambda: window(
        make_steps(wait=INPUT),
        h=hello(4),
        procs=processes(20.0, [20.0] * 4, main_reads=0.0, worker_reads=87.5e6),
        disk_read=400e6,
        disk_busy=34.0,
    ),
    "data disk 90 % busy, the loader reading 350 MB/s of it": lambda: window(
        make_steps(wait=INPUT),
        h=hello(4),
        procs=processes(20.0, [20.0] * 4, main_reads=0.0, worker_reads=87.5e6),
        disk_read=400e6,
        disk_busy=90.0,
    ),
}


# What a review found called "another process's": a loader blocked on a saturated
# seek-bound disk reads little (75-100 IOPS of 4 KB), and workers started again this epoch
# have no read figure yet (a pid's first sample).
NOT_ANOTHERS: dict[str, Callable[[], Window]] = {
    "4 workers blocked on small random reads, 100 kB/s each, the disk saturated": lambda: window(
        make_steps(wait=INPUT),
        h=hello(4),
        procs=processes(20.0, [20.0] * 4, main_reads=0.0, worker_reads=100e3),
        disk_read=150e6,
        disk_busy=100.0,
        io_some=60.0,
    ),
    "workers new this epoch: no read figure yet, the main process 0": lambda: window(
        make_steps(wait=INPUT),
        h=hello(4),
        procs=processes(20.0, [20.0] * 4, main_reads=0.0, worker_reads=None),
        disk_read=400e6,
        disk_busy=90.0,
    ),
}


@pytest.mark.parametrize("build", NOT_ANOTHERS.values(), ids=NOT_ANOTHERS.keys())
def test_a_loader_reading_little_or_not_yet_known_is_not_said_to_read_nothing(
    build: Callable[[], Window],
) -> None:
    v = analyze(build())
    assert v.cause == "disk", v
    assert not any(OTHERS in e for e in v.evidence), v.evidence


@pytest.mark.parametrize(
    "build", DISK_READS_OF_THE_LOADER.values(), ids=DISK_READS_OF_THE_LOADER.keys()
)
def test_the_loaders_own_reads_name_the_disk_and_say_whose(build: Callable[[], Window]) -> None:
    v = analyze(build())
    assert v.cause == "disk", v
    own = "the training's loading processes (main and workers) read 350 MB/s of the node's 400 MB/s"
    assert own in v.evidence, v.evidence
    assert not any(e.startswith(WHOSE) for e in v.evidence), v.evidence


def test_single_host_sample_is_said_plainly() -> None:
    v = analyze(window(make_steps(wait=INPUT), n=1, **QUIET))
    assert any("only 1 host sample" in e for e in v.evidence), v.evidence


@pytest.mark.parametrize(
    ("main_cpu", "disk_read", "waits"),
    [
        # the wait is 60 % of the step: 30 % of a core over the step is at most 50 % in it
        (30.0, 0.0, True),  # off-CPU, nothing read: it waits on something else
        (39.0, 0.0, False),  # at most 65 % in the wait: it may compute (a step off-CPU)
        (5.0, 0.0, True),
        (100.0, 0.0, False),  # pinned: it computes
        (60.0, 0.0, False),  # at the blocked threshold: not said
    ],
)
def test_a_main_process_that_loads_off_cpu_is_said_to_wait(
    main_cpu: float, disk_read: float, waits: bool
) -> None:
    v = analyze(
        window(make_steps(wait=INPUT), h=hello(0), procs=processes(main_cpu), disk_read=disk_read)
    )
    assert v.cause == "few-workers"
    said = [e for e in v.evidence if "the loading waits" in e]
    assert bool(said) == waits, v.evidence
    # its figure once, in the host evidence
    assert sum(f"main process {main_cpu:.0f} % CPU" in e for e in v.evidence) == 1, v.evidence


# Workers that wait (a remote store, a sleep in __getitem__): (workers' CPU, cores, cause,
# advice[0], headroom), the loop waiting 60 % of 100 ms steps of 32 samples (320/s).
WAITING_WORKERS: dict[str, tuple[list[float], CpuSample, str, str | None, str | None]] = {
    # (workers at 3 % of a core: the 2 cores hold many more than 2 of them)
    "1 worker at 3 % CPU, 1.7 of 2 cores idle: 3-5 workers": (
        [3.0],
        cores(2, busy=15.0),
        "few-workers",
        "more workers overlap the waits: set DataLoader(num_workers=3\u20135) (now 1; 1.7 of 2",
        "without the data wait: at most ≈ 800 samples/s, +150 %",  # 5 x 320/s is more
    ),
    "1 worker at 3 % CPU, 7.6 of 8 cores idle: 3-5 workers": (
        [3.0],
        cores(8, busy=5.0),
        "few-workers",
        "more workers overlap the waits: set DataLoader(num_workers=3\u20135) (now 1; 7.6 of 8",
        "without the data wait: at most ≈ 800 samples/s, +150 %",  # 5 x 320/s is more
    ),
    "4 workers at 10 % CPU, 7.6 of 8 cores idle: 6-8 workers": (
        [10.0] * 4,
        cores(8, busy=5.0),
        "few-workers",
        "more workers overlap the waits: set DataLoader(num_workers=6\u20138) (now 4; 7.6 of 8",
        # each of the 4 delivers 80/s: 8 of them, 640/s
        "with the advice: at most ≈ 640 samples/s, +100 % (8 loaders waiting side by side, "
        "each at today's pace; without any data wait ≈ 800)",
    ),
    "4 workers each ~100 % CPU, cores full: CPU-bound, no more workers": (
        [99.0, 100.0, 98.0, 99.0],
        cores(4, busy=100.0),
        "cpu-workers",
        None,
        None,
    ),
    "1 worker at 3 % CPU, cores full: no core for another": (
        [3.0],
        cores(2, busy=100.0),
        "cpu-contention",
        None,
        None,
    ),
}


@pytest.mark.parametrize(
    ("workers", "cpu", "cause", "advice", "headroom"),
    WAITING_WORKERS.values(),
    ids=WAITING_WORKERS.keys(),
)
def test_workers_that_wait_are_told_to_grow_to_overlap_the_waits(
    workers: list[float], cpu: CpuSample, cause: str, advice: str | None, headroom: str | None
) -> None:
    """A DataLoader whose __getitem__ sleeps 4 ms (a review): num_workers=0 was told
    "num_workers=1"; once followed, its one worker at 3 % of a core, the loop still waiting
    59 % and 1.7 of 2 cores idle, read "cause unknown". The workers wait, not compute:
    more of them overlap more waits. Workers that fill the cores are CPU-bound instead."""
    v = analyze(
        window(
            make_steps(wait=INPUT),
            h=hello(len(workers)),
            cpu=cpu,
            procs=processes(40.0, workers),
            disk_read=0.0,
        )
    )
    assert (v.kind, v.cause) == ("input-bound", cause), v
    said = any("the loading waits" in e for e in v.evidence)
    assert said == (cause == "few-workers"), v.evidence
    if advice is None:
        assert not any("num_workers=" in a for a in v.advice), v.advice
    else:
        assert v.advice[0].startswith(advice), v.advice
        assert "the loading waits, not computes" in v.headline, v.headline
    if headroom is not None:
        assert v.headroom == headroom, v.headroom


def test_stalled_says_how_long_and_typical_step() -> None:
    v = analyze(window(make_steps(period=0.21), now=T0 + 39 * 0.21 + 47))
    assert v.headline == "Stalled: no step for 47 s; typical step 210 ms"
    assert any("py-spy dump --pid 100" in a for a in v.advice)


def test_stalled_tells_blocked_from_busy() -> None:
    now = T0 + 3.9 + 30
    blocked = analyze(window(make_steps(), now=now, procs=processes(0.5, [0.0, 0.0])))
    busy = analyze(window(make_steps(), now=now, procs=processes(100.0, [0.0])))
    assert any("blocked" in e for e in blocked.evidence), blocked.evidence
    assert any("busy outside the step loop" in e for e in busy.evidence), busy.evidence


def test_stalled_wins_over_everything() -> None:
    v = analyze(
        window(
            make_steps(wait=INPUT),
            now=T0 + 3.9 + 60,
            gpus=(gpu(mem=0.99, reasons=("hw_thermal",)),),
            throttled=50.0,
        )
    )
    assert v.kind == "stalled"


def test_input_bound_wins_and_the_rest_become_notes() -> None:
    v = analyze(
        window(
            make_steps(wait=INPUT),
            gpus=(gpu(mem=0.97, reasons=("hw_thermal",)),),
            **QUIET,
        )
    )
    assert (v.kind, v.severity) == ("input-bound", "warning")
    assert any("memory" in n and "full" in n for n in v.notes), v.notes
    assert any(n.startswith("Throttling") for n in v.notes), v.notes
    assert v.conditions[0].startswith("input-bound/")
    assert {"gpu-memory-full", "throttling"} <= set(v.conditions)


def test_largest_limiter_is_primary() -> None:
    """Copies cost 30 % of the step and the data wait 22 %: the copies come first."""
    v = analyze(window(make_steps(wait=0.022, phases=(("h2d", 0.03),)), **QUIET))
    assert v.kind == "h2d-copies"
    assert any(n.startswith("Input-bound") for n in v.notes)


def test_h2d_advice_follows_pin_memory() -> None:
    steps = make_steps(wait=0.001, phases=(("h2d", 0.03),))
    unpinned = analyze(window(steps, h=hello(pin_memory=False)))
    pinned = analyze(window(steps, h=hello(pin_memory=True)))
    assert any("pin_memory=True" in a for a in unpinned.advice)
    assert not any("pin_memory=True" in a for a in pinned.advice)


def test_pcie_alone_is_a_note_not_a_verdict() -> None:
    v = analyze(window(make_steps(wait=0.001), gpus=(gpu(pcie_rx=10e9),)))
    assert v.kind == "compute-bound"
    assert any("PCIe receive 10.0 GB/s" in n for n in v.notes), v.notes


def test_compute_bound_batch_hint_needs_evidence() -> None:
    roomy = analyze(window(make_steps(wait=0.001), gpus=(gpu(util=97.0, mem=0.3),)))
    full = analyze(window(make_steps(wait=0.001), gpus=(gpu(util=97.0, mem=0.8),)))
    nothing = analyze(window(make_steps(wait=0.001)))
    assert any("larger batch" in a for a in roomy.advice)
    assert not full.advice
    assert not nothing.advice  # never advice from nothing


def test_compute_bound_on_the_cpu_says_what_compute_means() -> None:
    v = analyze(window(make_steps(wait=0.001)))
    assert "training loop's own work" in v.headline
    assert any("compute is the training loop's own time" in e for e in v.evidence)


def test_idle_gpu_without_device_timing_is_noted() -> None:
    v = analyze(window(make_steps(wait=0.001), gpus=(gpu(util=20.0),)))
    assert v.kind == "compute-bound"
    assert any("only 20 % busy" in n for n in v.notes), v.notes


def test_bursty_waits_count() -> None:
    """One step in four waits 300 ms, the others not at all: the median wait is 0 but
    the loop waits 43 % of the time."""
    steps = []
    t = T0
    for i in range(1, 41):
        wait = 0.3 if i % 4 == 0 else 0.0
        t += 0.1 + wait
        steps.append(StepRecord(i, t, 0.1 + wait, wait, 32))
    v = analyze(window(steps, **QUIET))
    assert (v.kind, v.severity) == ("input-bound", "warning")
    assert any("bursts" in e for e in v.evidence)
    # num_workers=0: no rounds of workers; the odd slow batch is its own
    alone = analyze(window(steps, h=hello(0), procs=processes(100.0)))
    assert alone.kind == "input-bound" and not any("bursts" in e for e in alone.evidence)


def test_lone_outlier_step_is_left_out() -> None:
    """One 5 s wait (an epoch start) among 40 quick steps does not make the run input-bound."""
    steps = make_steps(40, wait=0.001)
    odd = steps[20]
    steps[20] = replace(odd, period_s=5.0, wait_s=4.9)
    steps = [replace(s, end_time=s.end_time + (4.9 if s.index >= odd.index else 0)) for s in steps]
    v = analyze(window(steps))
    assert v.kind == "compute-bound", v
    assert any("1 outlier step left out" in e for e in v.evidence)


def test_rounds_longer_than_the_window_count() -> None:
    """8 workers, 4 s per batch each: 7 quick steps then a 3.6 s wait, round after round.
    Each window holds one long step, and it is no outlier: it recurs."""
    steps = []
    t = T0
    for i in range(1, 49):
        wait = 3.6 if i % 8 == 0 else 0.0
        t += 0.05 + wait
        steps.append(StepRecord(i, t, 0.05 + wait, wait, 32))
    for cut in (40, 43, 47):  # just after a long step, in the middle of a round, before one
        v = analyze(window(steps[:cut], **QUIET))
        assert (v.kind, v.severity) == ("input-bound", "warning"), (cut, v)


def test_resume_after_a_stall_is_not_the_state() -> None:
    """The step that spans a 20 s hang is left out once steps resume."""
    steps = make_steps(40, wait=0.001)
    hang = StepRecord(41, steps[-1].end_time + 20.0, 20.0, 0.0, 32)
    after = make_steps(5, wait=0.001, first=42, start=hang.end_time + 0.1)
    v = analyze(window([*steps, hang, *after]))
    assert v.kind == "compute-bound", v
    assert v.steps_per_s == pytest.approx(10.0)


def test_stale_steps_are_windowed_by_time() -> None:
    """The wait of 10 s ago is over: only the last STEP_WINDOW_S counts."""
    old = make_steps(100, wait=INPUT)
    new = make_steps(100, wait=0.001, first=101, start=old[-1].end_time + 0.1)
    v = analyze(window(old + new))
    assert v.kind == "compute-bound", v


def test_throttling_needs_most_recent_samples() -> None:
    now = T0 + 3.95
    sys = [
        system(now - 4 + i, gpus=(gpu(reasons=("hw_thermal",) if i == 4 else ()),))
        for i in range(5)
    ]
    assert analyze(window(make_steps(wait=0.001), sys)).kind == "compute-bound"


def test_other_tenants_gpu_is_ignored() -> None:
    g = replace(gpu(mem=0.99), training_mem_bytes=0)
    assert analyze(window(make_steps(wait=0.001), gpus=(g,))).kind == "compute-bound"


# --- hysteresis in analyze (enter / exit thresholds) --------------------------------------------


@pytest.mark.parametrize(
    ("wait", "previous_kind", "previous_severity", "expected"),
    [
        (0.017, "input-bound", "warning", ("input-bound", "warning")),  # 17 %: held
        (0.017, "compute-bound", "ok", ("input-bound", "info")),  # 17 %: not entered
        (0.014, "input-bound", "warning", ("input-bound", "info")),  # below exit
        (0.004, "input-bound", "info", ("input-bound", "info")),  # 4 %: held
        (0.004, "compute-bound", "ok", ("compute-bound", "ok")),
        (0.002, "input-bound", "info", ("compute-bound", "ok")),  # below exit
    ],
)
def test_enter_exit_thresholds(
    wait: float, previous_kind: str, previous_severity: str, expected: tuple[str, str]
) -> None:
    cause = "unknown" if previous_kind == "input-bound" else None
    cond = f"{previous_kind}/{cause}" if cause else previous_kind
    prev = Verdict(previous_kind, previous_severity, 1.0, "", cause=cause, conditions=(cond,))
    v = analyze(window(make_steps(wait=wait), **QUIET), previous=prev)
    assert (v.kind, v.severity) == expected


def test_disk_cause_held_until_exit_threshold() -> None:
    prev = Verdict(
        "input-bound", "warning", 1.0, "", cause="disk", conditions=("input-bound/disk",)
    )
    w = window(make_steps(wait=INPUT), disk_busy=65.0, **QUIET)
    assert analyze(w).cause == "unknown"
    assert analyze(w, previous=prev).cause == "disk"


def test_gpu_memory_held_until_exit_threshold() -> None:
    w = window(make_steps(wait=0.001), gpus=(gpu(mem=0.93),))
    prev = Verdict("gpu-memory-full", "warning", 1.0, "", conditions=("gpu-memory-full",))
    assert analyze(w).kind == "compute-bound"
    assert analyze(w, previous=prev).kind == "gpu-memory-full"


# --- the tracker --------------------------------------------------------------------------------


def v_(kind: str, severity: str = "warning", cause: str | None = None) -> Verdict:
    return Verdict(kind, severity, 1.0, kind, cause=cause)


def test_tracker_shows_first_verdict_at_once() -> None:
    t = VerdictTracker()
    shown = t.update(v_("compute-bound", "ok"), 0.0)
    assert shown.kind == "compute-bound" and shown.since == 0.0


def test_tracker_needs_persistence_for_a_new_kind() -> None:
    t = VerdictTracker()
    t.update(v_("compute-bound", "ok"), 0.0)
    assert t.update(v_("input-bound"), 1.0).kind == "compute-bound"
    assert t.update(v_("input-bound"), 2.0).kind == "compute-bound"  # 1 s held
    shown = t.update(v_("input-bound"), 3.0)  # 2 s held, 3 updates
    assert shown.kind == "input-bound" and shown.since == 1.0


def test_tracker_needs_two_updates_even_after_a_gap() -> None:
    t = VerdictTracker()
    t.update(v_("compute-bound", "ok"), 0.0)
    assert t.update(v_("input-bound"), 10.0).kind == "compute-bound"
    assert t.update(v_("input-bound"), 12.0).kind == "input-bound"


def test_tracker_debounces_cause_changes() -> None:
    t = VerdictTracker()
    t.update(v_("input-bound", cause="few-workers"), 0.0)
    assert t.update(v_("input-bound", cause="disk"), 1.0).cause == "few-workers"
    assert t.update(v_("input-bound", cause="disk"), 3.0).cause == "disk"


def test_tracker_shows_a_found_cause_at_once_but_debounces_losing_it() -> None:
    """Issue 11: "cause unknown" (one host sample so far) is a placeholder; the cause that
    follows it is news, not a flap, and must not wait PERSIST_S. Going back to unknown is."""
    t = VerdictTracker()
    t.update(v_("input-bound", cause="unknown"), 0.0)
    assert t.update(v_("input-bound", cause="disk"), 0.5).cause == "disk"
    assert t.update(v_("input-bound", cause="unknown"), 1.0).cause == "disk"
    assert t.update(v_("compute-bound", "ok"), 1.5).kind == "input-bound"  # a new kind waits


@pytest.mark.parametrize("kind", ["stalled", "warming-up"])
def test_tracker_stalled_and_warming_up_apply_and_clear_at_once(kind: str) -> None:
    t = VerdictTracker()
    t.update(v_("compute-bound", "ok"), 0.0)
    assert t.update(v_(kind), 1.0).kind == kind
    assert t.update(v_("compute-bound", "ok"), 2.0).kind == "compute-bound"


def test_tracker_does_not_flap_on_alternating_verdicts() -> None:
    t = VerdictTracker()
    shown = [
        t.update(v_("input-bound") if i % 2 else v_("compute-bound", "ok"), float(i)).kind
        for i in range(20)
    ]
    assert set(shown) == {"compute-bound"}


def test_tracker_refreshes_figures_and_keeps_since() -> None:
    t = VerdictTracker()
    t.update(replace(v_("input-bound"), headline="a"), 0.0)
    shown = t.update(replace(v_("input-bound"), headline="b"), 5.0)
    assert shown.headline == "b" and shown.since == 0.0


# --- over time: appear within 5 s, clear when it ends, no flapping ------------------------------

Profile = Callable[[float], tuple[float, float]]  # time since start -> (period, wait)


def simulate(profile: Profile, duration: float, **sys_kw: object) -> list[tuple[float, Verdict]]:
    """Steps produced by ``profile``, host samples at 1 Hz, the tracker updated at 1 Hz."""
    steps: list[StepRecord] = []
    t, index = T0, 0
    while t < T0 + duration:
        period, wait = profile(t - T0)
        t += period
        steps.append(StepRecord(index, t, period, wait, 32))
        index += 1
    tracker = VerdictTracker()
    h = sys_kw.pop("h", hello())
    shown = []
    for second in range(1, int(duration)):
        now = T0 + second
        visible = [s for s in steps if s.end_time <= now]
        w = Window(now, visible, systems(now, **sys_kw), h)  # type: ignore[arg-type]
        shown.append((float(second), tracker.analyze(w)))
    return shown


def first_time(
    shown: list[tuple[float, Verdict]], after: float, pred: Callable[[Verdict], bool]
) -> float:
    return next(t for t, v in shown if t >= after and pred(v))


def step_profile(start: float, end: float, inside: float, outside: float = 0.001) -> Profile:
    """A 100 ms compute step whose data wait is ``inside`` between start and end."""

    def profile(t: float) -> tuple[float, float]:
        wait = inside if start <= t < end else outside
        return 0.1 + wait, wait

    return profile


def test_input_bound_appears_within_5_s_and_clears_when_it_ends() -> None:
    shown = simulate(
        step_profile(20.0, 40.0, 0.08),
        60.0,
        h=hello(0),
        procs=processes(100.0),
        cpu=cores(8, pinned=1),
    )
    before = [v.kind for t, v in shown if 5 <= t < 20]
    assert set(before) == {"compute-bound"}
    appeared = first_time(
        shown, 20.0, lambda v: v.kind == "input-bound" and v.severity == "warning"
    )
    assert appeared - 20.0 <= 5.0
    at = dict(shown)[appeared]
    assert at.cause == "few-workers"
    # An easing wait is lowered only once the last 8 s agree (STABLE_WINDOW_S), then the
    # tracker's 2 s: about 10 s.
    cleared = first_time(shown, 40.0, lambda v: v.kind == "compute-bound")
    assert cleared - 40.0 <= 11.0
    during = [v.kind for t, v in shown if appeared <= t < 40]
    assert set(during) == {"input-bound"}


def test_stall_appears_at_once_and_clears_when_steps_resume() -> None:
    def profile(t: float) -> tuple[float, float]:
        return (15.0, 0.0) if 20 <= t < 20.2 else (0.1, 0.001)  # one 15 s step at 20 s

    shown = simulate(profile, 45.0)
    stalled = [t for t, v in shown if v.kind == "stalled"]
    # minimum 10 s, plus the update tick, plus the wait for the probe's stack (none here)
    assert stalled and min(stalled) <= 20.1 + 11 + STACK_GRACE_S
    assert max(stalled) < 20.1 + 15 + 1.01  # cleared by the first update after resuming


def test_no_flapping_when_the_wait_eases_below_the_enter_threshold() -> None:
    """25 % wait from 10 s, then 16-19 % from 25 s: once shown as input-bound (warning) the
    run stays so; it leaves only below 15 %."""

    def profile(t: float) -> tuple[float, float]:
        if t < 10:
            share = 0.01
        elif t < 25:
            share = 0.25
        else:
            share = 0.16 if int(t) % 2 else 0.19
        return 0.1 / (1 - share), 0.1 / (1 - share) * share

    shown = simulate(profile, 60.0, **QUIET)
    later = [(v.kind, v.severity) for t, v in shown if t >= 20]
    assert set(later) == {("input-bound", "warning")}, later


def slow_alternation(low: float, high: float) -> Profile:
    """1 % wait for 10 s, then ``high`` and ``low`` in turns of 6 s: longer than the step
    window, so without enter/exit thresholds the verdict would follow every turn."""

    def profile(t: float) -> tuple[float, float]:
        share = 0.01 if t < 10 else (high if int(t - 10) // 6 % 2 == 0 else low)
        return 0.1 / (1 - share), 0.1 / (1 - share) * share

    return profile


@pytest.mark.parametrize(
    ("low", "high", "settled"),
    [
        (0.17, 0.23, ("input-bound", "warning")),  # around 20 %, above the 15 % exit
        (0.04, 0.065, ("input-bound", "info")),  # around 5 %, above the 3 % exit
    ],
)
def test_no_flapping_around_a_threshold(low: float, high: float, settled: tuple[str, str]) -> None:
    shown = simulate(slow_alternation(low, high), 70.0, **QUIET)
    entered = first_time(shown, 10.0, lambda v: (v.kind, v.severity) == settled)
    assert entered - 10.0 <= 5.0  # appears within 5 s even this close to the threshold
    after = {(v.kind, v.severity) for t, v in shown if t >= entered}
    assert after == {settled}, [(t, v.kind, v.severity) for t, v in shown]


# --- robustness: any window gives a well-formed verdict -----------------------------------------

_opt_pct = st.none() | st.floats(0, 100)


@st.composite
def any_window(draw: st.DrawFn) -> Window:
    n = draw(st.integers(0, 40))
    steps, t = [], T0
    for i in range(n):
        period = draw(st.floats(0, 5))
        t += period
        steps.append(
            StepRecord(
                i,
                t,
                period,
                draw(st.none() | st.floats(0, 6)),
                draw(st.none() | st.integers(0, 512)),
                draw(st.none() | st.floats(0, 5)),
                draw(st.none() | st.floats(0, 5)),
                draw(st.sampled_from([(), (("h2d", 0.01),), (("copy", 9.0),)])),
            )
        )
    now = t + draw(st.floats(0, 100))
    sys = []
    for k in range(draw(st.integers(0, 4))):
        ncores = draw(st.integers(0, 4))
        busy = [draw(st.floats(0, 100)) for _ in range(ncores)]
        sys.append(
            system(
                now - k,
                cpu=CpuSample(
                    tuple(CpuCore(i, b, 0.0, None, None, 100 - b) for i, b in enumerate(busy)),
                    None,
                ),
                procs=draw(
                    st.none() | st.just(processes(draw(_opt_pct), [draw(st.floats(0, 200))]))
                ),
                disk_busy=draw(_opt_pct),
                swap_in=draw(st.none() | st.floats(0, 1e8)),
                throttled=draw(_opt_pct),
                quota=draw(st.none() | st.floats(0.1, 8)),
                fs=draw(st.sampled_from([None, "ext4", "nfs4"])),
                io_some=draw(_opt_pct),
                gpus=draw(st.sampled_from([(), (gpu(mem=0.99, reasons=None),), (gpu(util=0.0),)])),
                host_sampled=draw(st.booleans()),
            )
        )
    h = draw(st.sampled_from([None, hello(0), hello(None, loader=False), hello(2)]))
    if h is not None:  # the probe's own facts, any of them odd
        h = replace(
            h,
            loop=draw(st.sampled_from(["not-started", "in-loop", "outside"])),
            loop_since=draw(st.none() | st.floats(now - 100, now + 5)),
            loop_exit=draw(st.sampled_from([None, "exhausted", "break", "exception:OSError"])),
            framework=draw(st.sampled_from([None, "lightning", "transformers", "accelerate"])),
            cpu_affinity=tuple(draw(st.lists(st.integers(0, 70), max_size=6))),
            cpu_quota_cores=draw(st.none() | st.floats(0.1, 64)),
            device=draw(
                st.sampled_from(
                    [None, DeviceRef("cuda", 0, "GPU-0"), DeviceRef("cuda", 3), DeviceRef("hpu")]
                )
            ),
        )
    steps = [replace(s, device_caught_up=draw(st.none() | st.booleans())) for s in steps]
    return Window(now, steps, sys[::-1], h)


@settings(max_examples=150, deadline=None)
@given(any_window())
def test_any_window_gives_a_well_formed_verdict(w: Window) -> None:
    tracker = VerdictTracker()
    v = tracker.analyze(w)
    assert v.severity in ("ok", "info", "warning", "critical")
    assert 0.0 <= v.confidence <= 1.0
    assert v.headline
    assert v.kind != "input-bound" or v.cause


@pytest.mark.parametrize(
    ("step_count", "last_end_ago", "typical", "kind"),
    [
        (1200, 47.0, 0.21, "stalled"),  # attached during a hang: only the hello knows
        (1200, 1.0, 0.21, "warming-up"),  # steps are flowing, just not received yet
        (3, 47.0, 0.21, "warming-up"),  # too few steps ever to know what is typical
        (1200, 40.0, 10.0, "warming-up"),  # slow steps: 40 s is within 5 x typical
    ],
)
def test_stall_seen_from_the_hello_alone(
    step_count: int, last_end_ago: float, typical: float, kind: str
) -> None:
    now = T0 + 1000
    h = replace(
        hello(), step_count=step_count, last_step_end=now - last_end_ago, typical_period_s=typical
    )
    v = analyze(Window(now=now, steps=(), systems=systems(now), hello=h))
    assert v.kind == kind
    if kind == "warming-up":  # not "0 of 5 steps" beside a header that counts 1,200
        assert v.headline == (
            f"Waiting for the run's recent steps: {step_count:,} steps so far, none received yet"
        )
        assert v.evidence[-1].startswith("its last step ended")
    if kind == "stalled":
        assert v.headline == "Stalled: no step for 47 s; typical step 210 ms"
        assert any("last step 1199" in e for e in v.evidence)


# --- a review's real runs, as host figures (each failed before) -----------------------------


def test_a_main_process_loading_on_cpu_beside_an_off_cpu_step_is_not_blocked() -> None:
    """num_workers=0, 12 ms of CPU a sample, a 2 s step off the CPU (a device sync): the
    main process's 29 % of a core over the step is ~97 % of one in the 30 % the loop
    waits. Not "input-bound (disk): it is blocked" (the disk 1 % busy), nor "the
    loading waits rather than computes": few workers, its cost counted whole."""
    v = analyze(
        window(
            make_steps(wait=0.03),
            h=hello(0),
            procs=processes(29.0),
            disk_read=26e6,
            disk_busy=1.0,
            cpu=cores(2, busy=30),
        )
    )
    assert (v.kind, v.cause) == ("input-bound", "few-workers"), v
    assert not any("loading waits" in e or "blocked" in e for e in v.evidence), v.evidence
    # 0.29 cores at 320 samples/s: 0.9 ms (over the wait share of its CPU: 0.27)
    assert v.headroom is not None and "loading 0.9 ms CPU per sample" in v.headroom, v.headroom


def test_a_disk_busy_with_writes_is_not_blamed_on_the_dataset_reads() -> None:
    """A loader that writes and fsyncs 64 KB a sample: the disk 72 % busy, nothing read."""
    v = analyze(
        window(
            make_steps(wait=INPUT),
            disk_busy=72.0,
            disk_read=0.0,
            disk_write=20e6,
            **QUIET,
        )
    )
    assert v.cause == "disk", v
    assert "busy with writes, not the dataset's reads" in v.headline, v.headline
    assert "disk nvme0n1: 20 MB/s written, 0 kB/s read" in v.evidence, v.evidence
    assert not any("copy the dataset" in a for a in v.advice), v.advice


def test_busy_cores_no_process_accounts_for_are_not_other_processes() -> None:
    """Workers started again every epoch: the cores are busy with processes too short-
    lived for the process table, which names others at 0 %. Not "stop these other
    processes: kdamond 0 %, ..."."""
    top = (
        TopProcess(100, 1, "python", 40.0, 1 << 30),
        TopProcess(77, 2, "kdamond.0", 0.0, 0),
        TopProcess(1, 0, "process_api", 0.0, 1 << 20),
    )
    h = replace(hello(2), loader=replace(hello(2).loader, persistent_workers=False))
    v = analyze(
        window(
            make_steps(wait=INPUT),
            h=h,
            cpu=cores(2, busy=80),
            procs=processes(40.0, [0.0, 0.0]),
            top=top,
        )
    )
    assert v.cause != "cpu-contention", v
    assert not any("kdamond" in a for a in v.advice), v.advice
    assert any("persistent_workers=True" in a for a in v.advice), v.advice


@pytest.mark.parametrize("how", ["re-entered", "after a hung step"])
def test_host_samples_of_an_evaluation_or_a_hang_do_not_name_the_cause_after(how: str) -> None:
    """Resumed after an evaluation outside the loop, or after a step that hung: the
    samples of that time (cores idle) said "cause unknown, 1.5 cores idle" for seconds
    beside a host line "96 % busy". Only the samples since count."""
    steps = make_steps(40, wait=INPUT, start=T0)
    resumed = steps[0].end_time - steps[0].period_s  # the stretch's first step starts
    h = replace(hello(4), loop="in-loop", loop_since=resumed)
    if how == "after a hung step":
        h = hello(4)
        hang = replace(steps[10], period_s=60.0)  # its end is when the loop resumed
        steps = [*steps[:10], hang, *steps[11:]]
        resumed = hang.end_time
    now = steps[-1].end_time + 0.05
    busy = {"cpu": cores(8, busy=97), "procs": processes(30.0, [97.0] * 4)}
    idle = {"cpu": cores(8, busy=5), "procs": processes(5.0, [2.0] * 4)}
    # Most of the host window is the evaluation's (or the hang's) idle cores.
    before = [system(resumed - 0.5 - i, **idle) for i in range(8)]  # type: ignore[arg-type]
    after = [system(t, **busy) for t in (resumed + 1.5, now)]  # type: ignore[arg-type]
    v = analyze(Window(now=now, steps=steps, systems=before + after, hello=h))
    assert v.kind == "input-bound" and v.cause == "cpu-workers", v


def test_a_generator_is_not_told_to_set_num_workers() -> None:
    """A plain generator has no num_workers: the advice says to make the batches in a
    DataLoader, not "set DataLoader(num_workers=1)" (a review's generator loop)."""
    h = replace(hello(0), loader=LoaderInfo("generator"))
    v = analyze(window(make_steps(wait=INPUT), h=h, procs=processes(100.0), cpu=cores(8, busy=5)))
    assert v.cause == "few-workers", v
    assert v.advice[0].startswith("load in parallel: make the batches in a torch DataLoader("), v
    assert "instead of the generator" in v.advice[0]
    assert not v.advice[0].startswith("set DataLoader"), v.advice


def test_no_gain_is_said_so() -> None:
    from gputop_dl.tui.analyzer import _gain

    assert _gain(100.0, 143.0) == "+43 %"
    assert _gain(100.0, 99.8) == "no gain" and _gain(100.0, 100.2) == "no gain"  # not "+-0 %"


AWAY_CASES = {
    "no usual time yet: info": (25.0, None, "info"),
    "25 s, usually 20 s: info": (25.0, (20.0, 3), "info"),
    "65 s, usually 20 s (under 3x and +60 s): info": (65.0, (20.0, 3), "info"),
    "81 s, usually 20 s: a hang there?": (81.0, (20.0, 3), "warning"),
    "25 min, usually 10 min (under 3x): info": (1500.0, (600.0, 5), "info"),
    "31 min, usually 10 min: a hang there?": (1860.0, (600.0, 5), "warning"),
}


@pytest.mark.parametrize(("away", "usual", "severity"), AWAY_CASES.values(), ids=AWAY_CASES.keys())
def test_a_validation_far_longer_than_usual_is_a_warning(
    away: float, usual: tuple[float, int] | None, severity: str
) -> None:
    """A validation marked by a framework callback is outside the loop, info: one that
    hangs (a rank dead in a collective) read so for good (a review)."""
    steps = make_steps(40)
    left = steps[-1].end_time + 0.01
    h = replace(hello(), loop="outside", loop_since=left, loop_exit="marked:validation")
    v = analyze(replace(window(steps, h=h, now=left + away), usual_away=usual))
    assert (v.kind, v.severity) == ("outside-loop", severity), v
    if severity == "warning":
        assert usual is not None
        assert v.headline.endswith(f"far longer than usual ({fmt.dur(usual[0])}): a hang there?")
        assert v.evidence[0].startswith(f"{away / usual[0]:.1f}x the usual")
        assert v.advice[0].startswith("if it should have ended, see where it waits: ")


def test_the_usual_time_outside_is_each_ways_own() -> None:
    from gputop_dl.probe.messages import Loop
    from gputop_dl.tui.state.run import AWAY_KINDS_KEPT, Run

    run = Run("h:1", 60.0)
    run.hello = replace(hello(), loop="in-loop", loop_since=T0)
    t = T0
    for seconds in (10.0, 30.0, 20.0):
        run.add_loop(Loop("h:1", "outside", t + 1, 5, "marked:validation"))
        run.add_loop(Loop("h:1", "in-loop", t + 1 + seconds, 5, None))
        t += 100
    run.add_loop(Loop("h:1", "outside", t, 5, "marked:validation"))  # at an epoch's end:
    run.add_loop(Loop("h:1", "outside", t + 40, 5, "exhausted"))  # its return not sent
    run.add_loop(Loop("h:1", "in-loop", t + 41, 5, None))
    assert run.usual_away("marked:validation") == (25.0, 4)
    run.add_loop(Loop("h:1", "outside", t, 5, "marked:checkpoint"))
    run.add_loop(Loop("h:1", "in-loop", t + 7, 5, None))
    assert run.usual_away("marked:checkpoint") is None  # once: no usual time yet
    assert run.usual_away(None) is None
    for i in range(3 * AWAY_KINDS_KEPT):  # a peer naming thousands of ways: bounded
        run.add_loop(Loop("h:1", "outside", t + i, 5, f"marked:{i}"))
        run.add_loop(Loop("h:1", "in-loop", t + i + 0.5, 5, None))
    assert len(run._away_spans) == AWAY_KINDS_KEPT


def test_an_evaluation_marked_by_the_script_is_outside_not_stalled() -> None:
    """A loop timed with probe.step that evaluates 25 s: critical "Stalled" every epoch
    (a review), unless the script says so with probe.outside -- then an info line."""
    steps = make_steps(40)
    now = steps[-1].end_time + 25.0
    stalled = analyze(window(steps, now=now))
    assert (stalled.kind, stalled.severity) == ("stalled", "critical")
    assert any('probe.outside("evaluation")' in a for a in stalled.advice), stalled.advice
    marked = replace(
        hello(), loop="outside", loop_since=steps[-1].end_time + 0.01, loop_exit="marked:evaluation"
    )
    v = analyze(window(steps, h=marked, now=now))
    assert (v.kind, v.severity) == ("outside-loop", "info"), v
    assert v.headline == "Outside the training loop for 25 s: evaluation"
    assert "marked as left: probe.outside('evaluation')" in v.evidence[0]


@pytest.mark.parametrize(
    ("how", "headline", "left_by"),
    [
        ("exception:OSError", "25 s: it ended with OSError", "(exception:OSError)"),
        ("exception", "25 s: it ended with an exception from the loader", "(the loader raised"),
        ("break", "25 s (evaluation or checkpoint?)", "(the loop broke off)"),
        ("exhausted", "25 s (evaluation or checkpoint?)", "(the loader ran out)"),
        (
            "framework-exception",
            "25 s: the framework's loop ended with an exception",
            "(the framework's loop was left without its end: an exception)",
        ),
        (
            "shared",
            "25 s: two threads iterate one watched pass at once, its rest untimed",
            "(two threads iterate one pass at once: the rest of it is not timed)",
        ),
        (
            "not-iterated",
            "25 s: iter() made its loader's iterator, no batch asked for yet",
            "(the loader's iterator was made, no batch asked of it)",
        ),
    ],
)
def test_how_the_loop_was_left_is_said(how: str, headline: str, left_by: str) -> None:
    """A loader's exception whose type the probe did not see (a plan's C-timed steps) is
    an exception, not an evaluation."""
    steps = make_steps(40)
    now = steps[-1].end_time + 25.0
    left = replace(hello(), loop="outside", loop_since=steps[-1].end_time, loop_exit=how)
    v = analyze(window(steps, h=left, now=now))
    assert (v.kind, v.severity) == ("outside-loop", "info"), v
    loop = "timed loop" if how == "shared" else "training loop"
    assert v.headline == f"Outside the {loop} for {headline}", v.headline
    assert left_by in v.evidence[0], v.evidence


def test_a_loader_that_waits_gets_a_headroom_of_loaders_waiting_side_by_side() -> None:
    """num_workers=0, each item a 2 ms sleep: the loading's CPU is near nothing, so a CPU
    cost a sample promised "+3157 %" where two workers bought 2x (a review). Loaders
    that wait each keep today's pace: two of them, twice the loading's."""
    v = analyze(
        window(make_steps(wait=0.09), h=hello(0), procs=processes(5.0), cpu=cores(2, busy=5))
    )
    assert v.cause == "few-workers", v
    assert any("the loading waits" in e for e in v.evidence), v.evidence
    # 320 samples/s with the main process loading 90 % of the time: 356/s a loader
    assert v.headroom is not None and v.headroom.startswith("with the advice: at most ≈ 711"), v
    assert "+122 %" in v.headroom and "2 loaders waiting side by side" in v.headroom


def test_a_cpu_hog_on_the_runs_cores_is_not_compute_bound_ok() -> None:
    """Training on the CPU, a hog on its core: the step doubled and throughput halved,
    shown "Compute-bound [ok]" (a review). The main process gets half a core while the
    cores are full with the hog's work: a warning that names it."""
    top = (
        TopProcess(100, 1, "python", 48.0, 1 << 30),
        TopProcess(300, 1, "hog.py", 52.0, 1 << 20),
    )
    busy = {"cpu": cores(2, busy=100), "procs": processes(48.0), "top": top}
    v = analyze(window(make_steps(wait=0.001), h=hello(0), **busy))
    assert (v.kind, v.severity, v.cause) == ("compute-bound", "warning", "cpu-contention"), v
    assert "the main process gets 48 % of a core" in v.headline, v.headline
    assert v.advice[0] == "stop, move or renice the other CPU consumers: hog.py (pid 300) 52 %"
    # Alone on its core: ok, as before.
    alone = analyze(window(make_steps(wait=0.001), h=hello(0), procs=processes(100.0)))
    assert (alone.kind, alone.severity) == ("compute-bound", "ok"), alone
    # On a GPU the host process may idle in a sync: not starved.
    gpu_run = replace(hello(0), device=DeviceRef("cuda", 0))
    assert analyze(window(make_steps(wait=0.001), h=gpu_run, **busy)).severity == "ok"


def test_an_epoch_turn_is_not_a_new_stretch() -> None:
    """A small dataset's epochs re-enter the loop every few seconds: each re-entry
    emptied the host window and left the cause "unknown: only 1 host sample" (the demo's
    input-bound run, 8 steps an epoch). Only a re-entry after a stall's length counts."""
    from gputop_dl.tui.analyzer import _stretch_from

    steps = make_steps(40, wait=INPUT)
    turn = replace(hello(0), loop="in-loop", loop_since=steps[30].end_time + 0.01)
    assert _stretch_from(Window(T0 + 5, steps, (), turn), steps) is None
    back = replace(hello(0), loop="in-loop", loop_since=steps[30].end_time + 25.0)
    later = [*steps[:31], *(replace(s, end_time=s.end_time + 25.0) for s in steps[31:])]
    assert _stretch_from(Window(T0 + 30, later, (), back), later) == back.loop_since


def test_contention_spread_over_many_processes_is_still_contention() -> None:
    """Another job's 28 workers: the table lists the ten busiest, whose sum cannot reach
    half the busy cores; a listed other at 50 % is enough to name contention."""
    top = tuple(TopProcess(500 + i, 1, f"pt_data_worker{i}", 50.0, 1 << 28) for i in range(10))
    v = analyze(
        window(
            make_steps(wait=INPUT),
            cpu=cores(16, busy=100),
            procs=processes(30.0, [40.0] * 4),
            top=top,
        )
    )
    assert v.cause == "cpu-contention", v
    assert "pt_data_worker0 (pid 500) 50 %" in v.advice[0], v.advice


def test_contention_within_a_narrowed_affinity_names_no_process_off_its_cores() -> None:
    """Pinned to 4 of 32 cores on a shared node, another user's ffmpeg at 2000 % on the
    other cores: the node's table cannot say it runs on these 4. Not "stop ffmpeg"."""
    top = (TopProcess(900, 1, "ffmpeg", 2000.0, 1 << 30),)
    h = replace(hello(4), cpu_affinity=(0, 1, 2, 3))
    v = analyze(
        window(
            make_steps(wait=INPUT),
            h=h,
            cpu=cores(32, busy=100),
            procs=processes(30.0, [40.0] * 4),
            top=top,
        )
    )
    assert v.cause == "cpu-contention", v
    assert not any("ffmpeg" in a for a in v.advice), v.advice
    assert v.advice[0].startswith("find what runs on the 4 cores it may use"), v.advice
    assert "its CPU affinity allows 4 of 32" in v.advice[1], v.advice


def test_a_stateful_dataloader_is_told_to_set_its_workers() -> None:
    """torchdata's StatefulDataLoader has num_workers: not "make the batches in a
    DataLoader instead of the torchdata.StatefulDataLoader"."""
    loader = LoaderInfo("torchdata.StatefulDataLoader", num_workers=0, batch_size=32)
    h = replace(hello(0), loader=loader)
    v = analyze(window(make_steps(wait=INPUT), h=h, procs=processes(100.0), cpu=cores(8, busy=5)))
    assert v.advice[0].startswith("set DataLoader(num_workers="), v.advice


def test_persistent_workers_is_never_advised_alone_with_no_workers() -> None:
    """torch refuses persistent_workers=True with num_workers=0 (ValueError): advised
    alone, a user following it would crash the run."""
    h = replace(hello(0), loader=replace(hello(0).loader, persistent_workers=False))
    v = analyze(window(make_steps(wait=INPUT), h=h, procs=processes(100.0), cpu=cores(8, busy=5)))
    assert v.advice[0].startswith("set DataLoader(num_workers=")
    (line,) = [a for a in v.advice if "persistent_workers" in a]
    assert line.startswith("with the workers, DataLoader(persistent_workers=True) too"), line
