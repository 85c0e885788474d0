"""A fake event source for the viewer and builders of realistic events.

Everything is deterministic: times are offsets from :data:`T0`, variation comes from
fixed formulas, never from a random generator, so snapshots do not drift.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from gputop_dl.probe.messages import Bye, Hello, LoaderInfo, Message, StepRecord, Steps, System
from gputop_dl.probe.samples import (
    ABSENT,
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
    SourceStatus,
    SystemSample,
    TopProcess,
    TrainingProcesses,
)
from gputop_dl.tui.analyzer import Verdict
from gputop_dl.tui.events import BadInput, Emit, EndpointState, Received, SourceEvent

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
HOST = "gpu-node-07"
PID = 4242
SOURCE_ID = f"{HOST}:{PID}"
ENDPOINT = "tcp://127.0.0.1:5555"
GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_TOTAL = 85_520_809_984
WORKER_PIDS = (4301, 4302, 4303, 4304)


class FakeSource:
    """Implements the Source protocol; tests push batches of events by hand."""

    def __init__(self) -> None:
        self.emit: Emit | None = None
        self.started = False
        self.stopped = False

    def start(self, emit: Emit) -> None:
        self.emit = emit
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def push(self, events: Iterable[SourceEvent]) -> None:
        if self.emit is None:
            raise RuntimeError("push before start: the app has not mounted yet")
        self.emit(list(events))


def received(message: Message, at: float) -> Received:
    return Received(message, at)


def hello(
    source_id: str = SOURCE_ID,
    *,
    name: str = "resnet50",
    host: str = HOST,
    pid: int = PID,
    started: float = T0,
    rank: int | None = 0,
    world_size: int | None = 8,
    role: str = "probe",
    num_workers: int = 4,
    host_sampler: bool = True,
) -> Hello:
    return Hello(
        source_id=source_id,
        role=role,
        name=name,
        host=host,
        pid=pid,
        started=started,
        probe_version="0.1.0",
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        torch_version="2.13.0",
        devices=("cuda:0",),
        timing="cuda-events",
        loader=LoaderInfo(
            kind="torch.DataLoader",
            num_workers=num_workers,
            pin_memory=True,
            batch_size=32,
            prefetch_factor=2,
            persistent_workers=False,
            worker_pids=WORKER_PIDS[:num_workers],
            dataset_path="/data/imagenet/train",
        ),
        host_sampler=host_sampler,
    )


def step_records(
    start: float,
    duration_s: float,
    *,
    samples_per_s: float = 100.0,
    batch: int | None = 25,
    wait_share: float | None = 0.7,
    first_index: int = 0,
    wobble: float = 0.0,
) -> tuple[StepRecord, ...]:
    """Contiguous steps from ``start`` for ``duration_s`` at about ``samples_per_s``.

    ``wobble`` (0..1) varies the step period along a slow sine so that graphs show shape.
    """
    records = []
    nominal = (batch or 25) / samples_per_s
    end = start
    index = first_index
    while True:
        period = nominal * (1.0 + wobble * math.sin(index / 7.0))
        if end + period > start + duration_s + 1e-9:
            break
        end += period
        wait = None if wait_share is None else period * wait_share
        records.append(
            StepRecord(
                index=index,
                end_time=end,
                period_s=period,
                wait_s=wait,
                samples=batch,
                device_s=period * (1.0 - (wait_share or 0.0)) * 0.9,
            )
        )
        index += 1
    return tuple(records)


def steps_events(
    records: Sequence[StepRecord],
    source_id: str = SOURCE_ID,
    *,
    flush_s: float = 0.1,
    sent: int = 0,
    dropped: int = 0,
    dropped_steps: int = 0,
    latency_s: float = 0.01,
) -> list[SourceEvent]:
    """The records as Steps messages flushed every ``flush_s`` (as the probe does)."""
    events: list[SourceEvent] = []
    batch: list[StepRecord] = []
    flush_at: float | None = None
    count = sent

    def flush() -> None:
        nonlocal count
        message = Steps(source_id, tuple(batch), count, dropped, dropped_steps)
        events.append(Received(message, batch[-1].end_time + latency_s))
        count += 1
        batch.clear()

    for record in records:
        if flush_at is None:
            flush_at = record.end_time + flush_s
        if record.end_time > flush_at and batch:
            flush()
            flush_at = record.end_time + flush_s
        batch.append(record)
    if batch:
        flush()
    return events


def gpus(
    count: int = 8, *, util: float = 24.0, at: float = 0.0, lost: Sequence[int] = ()
) -> tuple[GpuSample, ...]:
    devices = []
    for index in range(count):
        if index in lost:
            devices.append(
                GpuSample(index, None, None, state="lost", error="GPU has fallen off the bus")
            )
            continue
        jitter = 6.0 * math.sin(index * 1.3 + at / 3.0)
        devices.append(
            GpuSample(
                index=index,
                name=H100,
                uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
                util_pct=max(0.0, min(100.0, util + jitter)),
                mem_util_pct=util / 2,
                mem_used_bytes=int((58.0 + index * 0.4) * GIB),
                mem_total_bytes=H100_TOTAL,
                power_w=180.0 + 10.0 * index,
                power_limit_w=700.0,
                temperature_c=44.0 + index,
                sm_clock_mhz=1980.0,
                mem_clock_mhz=2619.0,
                pcie_rx_bps=1.2e9 + index * 1e7,
                pcie_tx_bps=0.2e9,
                throttle_reasons=(),
                training_mem_bytes=int(56.0 * GIB),
            )
        )
    return tuple(devices)


def cores(count: int = 64, *, busy: Sequence[int] = (3, 4, 5, 6, 7), at: float = 0.0) -> CpuSample:
    """Most cores idle; ``busy`` ones pinned (DataLoader workers); a little iowait."""
    result = []
    for index in range(count):
        if index in busy:
            user, system, iowait = 88.0, 8.0, 2.0
        elif index < 2:
            user, system, iowait = 35.0, 10.0, 15.0  # the main process and its I/O
        else:
            user = 3.0 + 2.0 * (1 + math.sin(index + at))
            system, iowait = 1.0, 0.5
        idle = max(0.0, 100.0 - user - system - iowait)
        result.append(CpuCore(index, user, system, iowait, 0.0, idle))
    return CpuSample(tuple(result), (5.2, 5.0, 4.8))


def processes(workers: int = 4, *, worker_cpu: float = 98.0) -> TrainingProcesses:
    procs = [ProcessSample(PID, "main", "python", 87.0, int(9.5 * GIB))]
    for i in range(workers):
        procs.append(
            ProcessSample(
                WORKER_PIDS[i % len(WORKER_PIDS)] + (i // len(WORKER_PIDS)) * 100,
                "worker",
                "pt_data_worker",
                worker_cpu - i,
                int(2.1 * GIB),
            )
        )
    saturated = sum(1 for p in procs if p.role == "worker" and (p.cpu_pct or 0) >= 90)
    return TrainingProcesses(tuple(procs), saturated, workers)


def top_processes(workers: int = 4) -> tuple[TopProcess, ...]:
    """The node's busiest processes: another user's ffmpeg first, then the training's
    main process and its workers, a second rank, and the node's daemons."""
    procs = [
        TopProcess(9100, 1, "ffmpeg", 310.0, int(1.2 * GIB)),
        TopProcess(PID, 1000, "python", 87.0, int(9.5 * GIB)),
        *(
            TopProcess(
                WORKER_PIDS[i % len(WORKER_PIDS)] + (i // len(WORKER_PIDS)) * 100,
                PID,
                "pt_data_worker",
                98.0 - i,
                int(2.1 * GIB),
            )
            for i in range(workers)
        ),
        TopProcess(4243, 1000, "python", 64.0, int(9.1 * GIB)),
        TopProcess(2210, 1, "dockerd", 3.0, int(0.3 * GIB)),
        TopProcess(1, 0, "systemd", 0.0, int(0.01 * GIB)),
        TopProcess(7000, 1, "jupyter-lab", None, int(14.0 * GIB)),
    ]
    return tuple(sorted(procs, key=lambda p: -(p.cpu_pct if p.cpu_pct is not None else -1.0)))


def system_sample(
    at: float,
    *,
    host: str = HOST,
    gpu_count: int = 8,
    core_count: int = 64,
    workers: int = 4,
    with_processes: bool = True,
    lost: Sequence[int] = (),
    statuses: tuple[SourceStatus, ...] = (
        SourceStatus("psutil", True),
        SourceStatus("nvml", True),
        SourceStatus("hl-smi", False, "hl-smi not installed", ABSENT),
    ),
    hpu_count: int = 0,
) -> SystemSample:
    """A busy 8-GPU node whose training is input-bound: 4 workers pinned, GPUs mostly idle."""
    return SystemSample(
        time=at,
        host=host,
        interval_s=1.0,
        host_sampled=True,
        cpu=cores(core_count, at=at),
        memory=MemorySample(
            total_bytes=512 * GIB,
            used_bytes=int(96.4 * GIB),
            available_bytes=int(401.0 * GIB),
            cached_bytes=int(180.2 * GIB),
            swap_total_bytes=8 * GIB,
            swap_used_bytes=int(0.2 * GIB),
            swap_in_bps=0.0,
            swap_out_bps=4096.0,
        ),
        disks=(
            DiskSample("nvme0n1", 412e6, 1.5e6, 3300.0, 12.0, 47.0),
            DiskSample("sda", 0.0, 0.8e6, 0.0, 9.0, 1.0),
        ),
        nets=(NetSample("eth0", 1.2e6, 0.4e6), NetSample("ib0", 0.0, 0.0)),
        pressure=PressureSample(3.1, 12.4, 4.0, 0.0, 0.0),
        cgroup=None,
        processes=processes(workers) if with_processes else None,
        gpus=gpus(gpu_count, at=at, lost=lost),
        hpus=tuple(
            HpuSample(
                i,
                "HL-225",
                f"hpu-{i}",
                util_pct=40.0 + i,
                mem_used_bytes=int(70.5 * GIB),
                mem_total_bytes=96 * GIB,
                power_w=310.0,
                power_max_w=600.0,
                temperature_c=41.0,
            )
            for i in range(hpu_count)
        ),
        statuses=statuses
        if not hpu_count
        # A node that shows GPUs read them through NVML: its status is ok.
        else (
            SourceStatus("nvml", True)
            if gpu_count
            else SourceStatus("nvml", False, "NVML library not found", ABSENT),
            SourceStatus("hl-smi", True),
        ),
        data_device="nvme0n1",
        data_fs_type="ext4",
        top=top_processes(workers) if with_processes else None,
    )


def cgroup_sample() -> CgroupSample:
    return CgroupSample(8.0, 1000, 120, 3_000_000, 12.0, 64 * GIB, int(41.5 * GIB))


def systems_events(
    start: float, end: float, source_id: str = SOURCE_ID, **kwargs: object
) -> list[SourceEvent]:
    """One System message a second from ``start`` to ``end`` (inclusive)."""
    events: list[SourceEvent] = []
    at = start
    while at <= end + 1e-9:
        sample = system_sample(at, **kwargs)  # type: ignore[arg-type]
        events.append(Received(System(source_id, sample), at + 0.02))
        at += 1.0
    return events


def live_run(
    now: float = T0 + 60.0,
    *,
    source_id: str = SOURCE_ID,
    name: str = "resnet50",
    rank: int | None = 0,
    duration_s: float = 60.0,
    samples_per_s: float = 100.0,
    wait_share: float = 0.7,
    host: str = HOST,
    **system_kwargs: object,
) -> list[SourceEvent]:
    """A run that started ``duration_s`` before ``now``: hello, steps, a sample a second.

    Events come in arrival order; the last one arrived just before ``now``.
    """
    start = now - duration_s
    pid = int(source_id.rpartition(":")[2])
    events: list[SourceEvent] = [
        Received(hello(source_id, name=name, rank=rank, started=start, host=host, pid=pid), start)
    ]
    records = step_records(
        start, duration_s - 0.05, samples_per_s=samples_per_s, wait_share=wait_share, wobble=0.3
    )
    events += steps_events(records, source_id)
    events += systems_events(start + 1.0, now - 0.5, source_id, host=host, **system_kwargs)
    events.sort(key=lambda e: e.received if isinstance(e, Received | BadInput) else 0.0)
    return events


def bye(source_id: str = SOURCE_ID, *, reason: str = "finished", steps: int = 2400) -> Bye:
    return Bye(source_id, reason, steps)


def incompatible(
    at: float, *, theirs: tuple[int, int] = (2, 0), hint: str | None = SOURCE_ID
) -> BadInput:
    text = (
        f"incompatible protocol version {theirs[0]}.{theirs[1]} (this gputop reads 1.x, speaks 1.0)"
    )
    return BadInput(text, at, theirs, hint)


def connecting(endpoint: str = ENDPOINT, name: str | None = "resnet50") -> EndpointState:
    return EndpointState(endpoint, "connecting", "", name)


def agent_only(now: float = T0 + 10.0, host: str = HOST) -> list[SourceEvent]:
    """What the viewer's own local sampler emits when no probe runs: an agent hello and
    host samples without training processes."""
    source_id = f"{host}:999"
    agent = Hello(source_id, "agent", "this host", host, 999, now - 10.0, "0.1.0")
    events: list[SourceEvent] = [Received(agent, now - 10.0)]
    events += systems_events(now - 9.0, now - 0.5, source_id, host=host, with_processes=False)
    return events


# The verdicts of the demo, in the analyzer's own words (the longest lines it writes).
LONG_INPUT_BOUND = Verdict(
    kind="input-bound",
    severity="warning",
    confidence=0.75,
    headline=(
        "Input-bound (data wait 82 % of step): the main process loads the data itself "
        "(num_workers=0)"
    ),
    cause="few-workers",
    evidence=(
        "data wait 82 % of step time (418 ms of 507 ms per step, last 7 steps, 3.3 s)",
        "throughput 68.5 samples/s (2.1 steps/s)",
    ),
    advice=(
        "set DataLoader(num_workers=1) (now 0; 1.1 of 2 cores idle, core 1 55 % idle)",
        "persistent_workers=True: workers are not restarted every epoch",
    ),
    headroom=(
        "with the advice: at most ≈ 112 samples/s, +31 % (loading 6.1 ms CPU per sample on "
        "1 core; without any data wait ≈ 345)"
    ),
)
STALLED = Verdict(
    kind="stalled",
    severity="critical",
    confidence=0.9,
    headline="Stalled: no step for 41 s; typical step 320 ms",
    cause="stalled",
    evidence=("last step 236 ended 41 s ago; stall threshold 10 s (30 typical steps)",),
    advice=(
        "evaluation or checkpointing clears by itself when steps resume",
        "otherwise see where it hangs: py-spy dump --pid 4242",
    ),
)
