"""The messages of the gputop wire protocol.

``docs/protocol.md`` is the normative description; ``probe.protocol`` encodes and
decodes these. Every message is a frozen dataclass except :class:`StepRecord`, a msgspec
Struct sent as a msgpack *array* (it is by far the most frequent record, and an array is
~3x smaller and cheaper than a map). Fields added in a later minor version must have a
default and (for StepRecord) go at the end, so that a message from an older peer still
decodes. The ``Annotated`` aliases from ``probe.samples`` carry the limits a reader
enforces while decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from gputop_dl.probe.samples import Count, Num, Seconds, Str, SystemSample, Time

Pid = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
# A Steps message carries at most this many records; the probe splits bigger backlogs
# (docs/protocol.md, "Limits"), so one message stays far below the payload limit.
MAX_RECORDS = 20_000


@dataclass(frozen=True)
class LoaderInfo:
    """What a torch DataLoader was configured with (None: not a DataLoader / unknown)."""

    kind: Str  # "torch.DataLoader" or the iterable's type name
    num_workers: Count | None = None
    pin_memory: bool | None = None
    batch_size: Count | None = None
    prefetch_factor: Count | None = None
    persistent_workers: bool | None = None
    worker_pids: Annotated[tuple[Pid, ...], msgspec.Meta(max_length=4096)] = ()
    dataset_path: Str | None = None  # a filesystem path the dataset reads, when known
    # The type the user handed to watch() when it wraps the DataLoader described above
    # (e.g. "accelerate.DataLoaderShard", "lightning.CombinedLoader"); None: a plain loader.
    wrapper: Str | None = None


@dataclass(frozen=True)
class LoaderPasses:
    """The last passes over one loader run by an outermost watched loop (not inside
    another's step): the index of each one's first step, which waited for the pass's start
    (``iter(loader)``, where a DataLoader forks its workers, and the first batch)."""

    loader: LoaderInfo | None  # its description (no worker pids: the hello's loader has them)
    starts: Annotated[tuple[Count, ...], msgspec.Meta(max_length=64)] = ()  # oldest first
    # Each start's first step's data wait (what the pass's start cost, with its first
    # batch), in the order of ``starts``; None: not published yet (the first batch still
    # awaited) or not timed. Only as many as ``starts``.
    waits: Annotated[tuple[Seconds | None, ...], msgspec.Meta(max_length=64)] = ()
    # The last pass ran over a new loader object (a DataLoader built again for each pass:
    # persistent_workers=True keeps workers only across the passes of one object).
    rebuilt: bool = False


@dataclass(frozen=True)
class DeviceRef:
    """The accelerator this process trains on, as the probe knows it (never guessed)."""

    kind: Str  # "cuda" or "hpu"
    index: Count | None = None  # physical index (NVML index / hl-smi module id), mapped
    #   through CUDA_VISIBLE_DEVICES / HABANA_VISIBLE_MODULES; None: cannot be mapped
    uuid: Str | None = None  # "GPU-..." / "MIG-..." when known


@dataclass(frozen=True)
class Hello:
    """Who is speaking. Sent at start, again every few seconds (late subscribers), at once
    to a new subscriber, and whenever something in it changes (loop state, loader)."""

    source_id: Str  # "<host>:<pid>", unique per publishing process
    role: Str  # "probe" (inside a training process) or "agent" (gputop agent)
    name: Str  # run name
    host: Str
    pid: Pid
    started: Time  # Unix seconds
    probe_version: Str
    rank: Count | None = None
    local_rank: Count | None = None
    world_size: Count | None = None
    torch_version: Str | None = None
    devices: Annotated[tuple[Str, ...], msgspec.Meta(max_length=1024)] = ()
    timing: Str = "host"  # "cuda-events", or "host" (no device timing source)
    timing_note: Str | None = None  # why there is no device timing, when there is none
    loader: LoaderInfo | None = None
    host_sampler: bool = False  # this process samples the node (one per node)
    # Progress, so that a viewer attaching during a hang can still tell it is a hang:
    step_count: Count = 0  # steps measured so far
    last_step_end: Time | None = None  # Unix time the last step ended
    typical_period_s: Seconds | None = None  # median of the last 30 step periods
    # Facts the probe knows and the viewer must not guess:
    loop: Str = "not-started"  # "not-started", "in-loop" or "outside" (left the watched loop)
    loop_since: Time | None = None  # Unix time the loop state last changed
    loop_exit: Str | None = None  # how the loop was left: "exhausted", "break", "exception:<Type>"
    framework: Str | None = None  # "lightning", "transformers", "accelerate" or None (plain)
    cpu_affinity: Annotated[tuple[Count, ...], msgspec.Meta(max_length=65536)] = ()
    #   cores this process may run on; () unknown
    cpu_quota_cores: Num | None = None  # cgroup CPU limit in cores; None: none or unknown
    device: DeviceRef | None = None  # its own accelerator; None: none or unknown
    # The job this rank belongs to, as its launcher says (probe/jobenv.py): every rank of
    # one job carries the same key; None: not launched as part of a job.
    job: Str | None = None
    # The starts of the last passes (epochs) over each loader the outermost watched loops
    # ran over lately (a training loader's, an evaluation loader's run between epochs),
    # the loader used the longest ago first, the current one (``loader``) last. Passes of
    # a loop inside another's step (an evaluation in a training step) are not listed.
    passes: Annotated[tuple[LoaderPasses, ...], msgspec.Meta(max_length=16)] = ()


class StepRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One training step: from the arrival of a batch to the arrival of the next.

    Not tracked by the garbage collector (``gc=False``): its fields are numbers, strings
    and tuples of them, so it can never be part of a reference cycle, and a viewer keeps
    thousands per run.

    ``period_s`` covers the whole step; ``wait_s`` is the part spent inside ``next()``
    waiting for the next batch (None when steps are marked with ``probe.step``).
    ``device_s``/``device_idle_s`` come from CUDA events when available. On the wire
    this is an array of integer microseconds in field order (docs/protocol.md); the
    decoder's StepRows converts to these seconds when a record is first read.
    """

    index: Count  # 0-based, counts steps of this process
    end_time: Time  # Unix seconds when the step ended
    period_s: Seconds
    wait_s: Seconds | None
    samples: Count | None
    device_s: Seconds | None = None
    device_idle_s: Seconds | None = None
    phases: Annotated[tuple[tuple[Str, Seconds], ...], msgspec.Meta(max_length=64)] = ()
    # True: when the host finished queuing this step, the device had already done all the
    # work queued before it (it caught up and waited for the host); None: no device timing.
    device_caught_up: bool | None = None

    @property
    def compute_s(self) -> float:
        """Time of the step not spent waiting for data."""
        return max(0.0, self.period_s - (self.wait_s or 0.0))


class Steps(msgspec.Struct, frozen=True, gc=False):
    """A batch of step records, flushed at most ~10 times a second.

    A msgspec Struct (made faster than a frozen dataclass: the viewer decodes one per run
    every 0.1 s); encoded by ``protocol`` in its own wire form, never as this Struct.
    Not tracked by the garbage collector: records hold numbers and strings only.
    """

    source_id: Str
    # A decoded message carries a protocol.StepRows here (records made on first read);
    # at most MAX_RECORDS either way.
    records: Sequence[StepRecord]
    sent: Count  # messages this publisher sent so far (before this one)
    dropped: Count  # messages it had to drop (subscriber slow or absent) so far
    dropped_steps: Count = 0  # step records lost because the buffer overflowed


@dataclass(frozen=True)
class System:
    source_id: Str
    sample: SystemSample


@dataclass(frozen=True)
class Loop:
    """The training thread entered or left a watched loop (an epoch starts or ends)."""

    source_id: Str
    state: Str  # "in-loop" or "outside"
    time: Time  # Unix seconds
    step_index: Count  # steps measured before this event
    how: Str | None = None  # when leaving: "exhausted", "break" or "exception:<Type>"


# A Loop's ``how`` when the script marked the loop left (``probe.outside("evaluation")``:
# "marked:evaluation"); docs/protocol.md, "loop".
MARKED = "marked:"

# A bye's reason starts with this when an exception no one caught ended the process
# (docs/protocol.md, "bye"): "crashed (RuntimeError: text)".
CRASHED = "crashed"


@dataclass(frozen=True)
class Bye:
    """The publisher is going away (normal exit, exception in the loop, signal)."""

    source_id: Str
    reason: Str
    steps: Count


@dataclass(frozen=True)
class Frame:
    """One Python frame of a stack (docs/protocol.md, ``stack``)."""

    file: Annotated[str, msgspec.Meta(max_length=256)]  # cut at the front: the name stays
    line: Count
    function: Annotated[str, msgspec.Meta(max_length=128)]  # qualified name
    code: Annotated[str, msgspec.Meta(max_length=200)] | None = None  # the source line


@dataclass(frozen=True)
class Stack:
    """The training thread's Python stack, taken by the probe's publisher thread once
    per stall (no step for longer than the stall threshold)."""

    source_id: Str
    time: Time  # Unix seconds when it was taken
    step_index: Count  # the step that did not end (steps measured before it)
    stalled_s: Seconds  # time since the last step ended, when it was taken
    frames: Annotated[tuple[Frame, ...], msgspec.Meta(max_length=32)]  # innermost first
    left_out: Count = 0  # outer frames beyond the 32 innermost
    thread: Str | None = None  # the training thread's name
    # The thread is inside the watched loader's next(), waiting for a batch: the probe's
    # clock says so in a C-timed stretch (a fetch begun, not returned; no frame of the
    # probe's is on the stack there), its own frame anywhere on the stack elsewhere.
    fetching: bool = False


Message = Hello | Steps | System | Loop | Bye | Stack
