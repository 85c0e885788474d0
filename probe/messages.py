"""The messages of the gputop wire protocol as frozen dataclasses.

``docs/protocol.md`` is the normative description; ``probe.protocol`` encodes and
decodes these. Fields added in a later minor version must have a default, so that a
message from an older peer still decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop_dl.probe.samples import SystemSample


@dataclass(frozen=True)
class LoaderInfo:
    """What a torch DataLoader was configured with (None: not a DataLoader / unknown)."""

    kind: str  # "torch.DataLoader" or the iterable's type name
    num_workers: int | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    worker_pids: tuple[int, ...] = ()
    dataset_path: str | None = None  # a filesystem path the dataset reads, when known
    # The type the user handed to watch() when it wraps the DataLoader described above
    # (e.g. "accelerate.DataLoaderShard", "lightning.CombinedLoader"); None: a plain loader.
    wrapper: str | None = None


@dataclass(frozen=True)
class DeviceRef:
    """The accelerator this process trains on, as the probe knows it (never guessed)."""

    kind: str  # "cuda" or "hpu"
    index: int | None = None  # physical index (NVML index / hl-smi module id), mapped
    #   through CUDA_VISIBLE_DEVICES / HABANA_VISIBLE_MODULES; None: cannot be mapped
    uuid: str | None = None  # "GPU-..." / "MIG-..." when known


@dataclass(frozen=True)
class Hello:
    """Who is speaking. Sent at start, again every few seconds (late subscribers) and
    whenever the loader changes (new worker PIDs at each epoch)."""

    source_id: str  # "<host>:<pid>", unique per publishing process
    role: str  # "probe" (inside a training process) or "agent" (gputop agent)
    name: str  # run name
    host: str
    pid: int
    started: float  # Unix seconds
    probe_version: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    torch_version: str | None = None
    devices: tuple[str, ...] = ()
    timing: str = "host"  # "cuda-events", or "host" (no device timing source)
    timing_note: str | None = None  # why there is no device timing, when there is none
    loader: LoaderInfo | None = None
    host_sampler: bool = False  # this process samples the node (one per node)
    # Progress, so that a viewer attaching during a hang can still tell it is a hang:
    step_count: int = 0  # steps measured so far
    last_step_end: float | None = None  # Unix time the last step ended
    typical_period_s: float | None = None  # median of the last 30 step periods
    # Facts the probe knows and the viewer must not guess:
    loop: str = "not-started"  # "not-started", "in-loop" or "outside" (left the watched loop)
    loop_since: float | None = None  # Unix time the loop state last changed
    loop_exit: str | None = None  # how the loop was left: "exhausted", "break", "exception:<Type>"
    framework: str | None = None  # "lightning", "transformers", "accelerate" or None (plain)
    cpu_affinity: tuple[int, ...] = ()  # cores this process may run on; () unknown
    cpu_quota_cores: float | None = None  # cgroup CPU limit in cores; None: none or unknown
    device: DeviceRef | None = None  # its own accelerator; None: none or unknown


@dataclass(frozen=True)
class StepRecord:
    """One training step: from the arrival of a batch to the arrival of the next.

    ``period_s`` covers the whole step; ``wait_s`` is the part spent inside ``next()``
    waiting for the next batch (None when steps are marked with ``probe.step``).
    ``device_s``/``device_idle_s`` come from CUDA events when available.
    """

    index: int  # 0-based, counts steps of this process
    end_time: float  # Unix seconds when the step ended
    period_s: float
    wait_s: float | None
    samples: int | None
    device_s: float | None = None
    device_idle_s: float | None = None
    phases: tuple[tuple[str, float], ...] = ()  # ("forward", seconds), ...
    # True: when the host finished queuing this step, the device had already done all the
    # work queued before it (it caught up and waited for the host); None: no device timing.
    device_caught_up: bool | None = None

    @property
    def compute_s(self) -> float:
        """Time of the step not spent waiting for data."""
        return max(0.0, self.period_s - (self.wait_s or 0.0))


@dataclass(frozen=True)
class Steps:
    """A batch of step records, flushed at most ~10 times a second."""

    source_id: str
    records: tuple[StepRecord, ...]
    sent: int  # messages this publisher sent so far (before this one)
    dropped: int  # messages it had to drop (subscriber slow or absent) so far
    dropped_steps: int = 0  # step records lost because the buffer overflowed


@dataclass(frozen=True)
class System:
    source_id: str
    sample: SystemSample


@dataclass(frozen=True)
class Loop:
    """The training thread entered or left a watched loop (an epoch starts or ends)."""

    source_id: str
    state: str  # "in-loop" or "outside"
    time: float  # Unix seconds
    step_index: int  # steps measured before this event
    how: str | None = None  # when leaving: "exhausted", "break" or "exception:<Type>"


@dataclass(frozen=True)
class Bye:
    """The publisher is going away (normal exit, exception in the loop, signal)."""

    source_id: str
    reason: str
    steps: int


Message = Hello | Steps | System | Loop | Bye
