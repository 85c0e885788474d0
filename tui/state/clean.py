"""What arrives from the wire, made safe before it reaches the state and the screen.

The decoder checks types and sizes; these check meaning: times that are finite and close to
the arrival time, durations that are not negative, strings without terminal controls, and
lists no longer than a screen or the analyzer can use (30,000 "cores" would freeze the UI).
Each function is pure: a value in, a clean value (or None: drop it) out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from gputop_dl.probe.messages import Hello, Stack, StepRecord
from gputop_dl.probe.protocol import PLAUSIBLE_DURATION_S, PLAUSIBLE_SAMPLES
from gputop_dl.probe.samples import SystemSample

T = TypeVar("T")

MAX_TEXT = 200  # characters of any one wire string shown
MAX_SKEW_S = 86_400.0  # a probe's clock may differ from the viewer's, not by more than a day
# A step, a wait, an interval: longer is a broken clock. The steps decoder checks rows
# against these two (protocol.StepRows.plausible), so that the ingest need not.
MAX_DURATION_S = PLAUSIBLE_DURATION_S
MAX_SAMPLES = PLAUSIBLE_SAMPLES  # per step
MAX_CORES = 1024  # the largest real nodes have 512 logical cores
MAX_DEVICES = 64  # GPUs / HPUs per node
MAX_LIST = 64  # disks, interfaces, statuses
MAX_PROCESSES = 256  # main + DataLoader workers


def evolve(value: T, **changes: Any) -> T:
    """A copy of a frozen dataclass or msgspec Struct with ``changes``."""
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(value, **changes)
    return dataclasses.replace(value, **changes)  # type: ignore[type-var]


def clean_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` without control, format or escape characters (they could move the cursor,
    clear the screen, retitle the terminal or reorder the line), cut to ``limit``."""
    if text.isprintable() and len(text) <= limit:
        return text  # the usual case, checked in C
    kept = []
    for char in text[: limit * 4]:
        if char.isprintable():
            kept.append(char)
        elif char in "\t\n\r":
            kept.append(" ")
    cleaned = "".join(kept)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def _finite(value: float | None, low: float, high: float) -> bool:
    return value is None or (math.isfinite(value) and low <= value <= high)


def check_time(time: float, received: float) -> bool:
    """A Unix time from the probe: finite and within a day of the viewer's clock."""
    return math.isfinite(time) and abs(time - received) <= MAX_SKEW_S


def clean_step(record: StepRecord, received: float) -> StepRecord | None:
    """The record if its values make sense (a wait a hair over the period, from rounding,
    is cut to the period); None to drop it. Called for every step: plain comparisons,
    which NaN fails and infinities fail against the bounds."""
    period, wait = record.period_s, record.wait_s
    if not (
        0.0 <= period <= MAX_DURATION_S
        and -MAX_SKEW_S <= record.end_time - received <= MAX_SKEW_S
        and record.index >= 0
    ):
        return None
    device, idle, samples = record.device_s, record.device_idle_s, record.samples
    if (
        (wait is not None and not 0.0 <= wait <= period + 1e-3)
        or (device is not None and not 0.0 <= device <= MAX_DURATION_S)
        or (idle is not None and not 0.0 <= idle <= MAX_DURATION_S)
        or (samples is not None and not 0 <= samples <= MAX_SAMPLES)
    ):
        return None
    if record.phases and not all(0.0 <= seconds <= MAX_DURATION_S for _, seconds in record.phases):
        return None
    if wait is not None and wait > period:
        return evolve(record, wait_s=period)
    return record


def new_steps(
    records: Sequence[StepRecord], received: float, last_index: int | None, last_end: float | None
) -> tuple[list[StepRecord], int]:
    """The records newer than ``last_index``/``last_end`` (the probe replays its history to
    each new subscriber: same indices again) whose values make sense, and how many had
    impossible ones. One call per message: the checks of :func:`clean_step`, inlined."""
    accepted: list[StepRecord] = []
    invalid = 0
    low_end, high_end = received - MAX_SKEW_S, received + MAX_SKEW_S
    for record in records:
        index, end = record.index, record.end_time
        if (last_index is not None and index <= last_index) or (
            last_end is not None and end <= last_end
        ):
            continue  # replayed, or out of order: the points already cover that time
        period, wait, device, idle = (
            record.period_s,
            record.wait_s,
            record.device_s,
            record.device_idle_s,
        )
        if (
            0.0 <= period <= MAX_DURATION_S
            and low_end <= end <= high_end
            and index >= 0
            and (wait is None or 0.0 <= wait <= period)
            and (device is None or 0.0 <= device <= MAX_DURATION_S)
            and (idle is None or 0.0 <= idle <= MAX_DURATION_S)
            and not record.phases
            and (record.samples is None or 0 <= record.samples <= MAX_SAMPLES)
        ):
            accepted.append(record)  # the usual record, checked without a call
        else:
            checked = clean_step(record, received)
            if checked is None:
                invalid += 1
                continue
            accepted.append(checked)
        last_index, last_end = index, end
    return accepted, invalid


def clean_hello(hello: Hello, received: float) -> Hello | None:
    """The hello with its strings safe to show; None when its times make no sense."""
    if (
        not check_time(hello.started, received)
        or not (hello.last_step_end is None or check_time(hello.last_step_end, received))
        or not (hello.loop_since is None or check_time(hello.loop_since, received))
        or not _finite(hello.typical_period_s, 0.0, MAX_DURATION_S)
        or hello.step_count < 0
    ):
        return None
    changes: dict[str, Any] = {}
    for name in ("name", "host", "timing", "timing_note", "loop_exit", "framework", "job"):
        value = getattr(hello, name)
        if value is not None and clean_text(value) != value:
            changes[name] = clean_text(value)
    loader = hello.loader
    if loader is not None:
        loader_changes: dict[str, Any] = {
            name: clean_text(value)
            for name in ("kind", "dataset_path", "wrapper")
            if (value := getattr(loader, name)) is not None and clean_text(value) != value
        }
        if len(loader.worker_pids) > MAX_PROCESSES:
            loader_changes["worker_pids"] = loader.worker_pids[:MAX_PROCESSES]
        if loader_changes:
            changes["loader"] = evolve(loader, **loader_changes)
    if len(hello.cpu_affinity) > MAX_CORES:
        changes["cpu_affinity"] = hello.cpu_affinity[:MAX_CORES]
    if len(hello.devices) > MAX_DEVICES:
        changes["devices"] = hello.devices[:MAX_DEVICES]
    return evolve(hello, **changes) if changes else hello


def _clean_named(items: tuple[T, ...], fields: tuple[str, ...], limit: int) -> tuple[T, ...]:
    """At most ``limit`` items, each with its ``fields`` strings safe to show."""
    items = items[:limit]
    values = [getattr(item, field) for item in items for field in fields]
    if all(value is None or value.isprintable() for value in values):
        return items
    return tuple(
        evolve(
            item,
            **{
                field: clean_text(value)
                for field in fields
                if (value := getattr(item, field)) is not None
            },
        )
        for item in items
    )


def clean_sample(sample: SystemSample, received: float) -> SystemSample | None:
    """The sample with lists clamped and strings safe to show; None when its time or
    interval makes no sense."""
    if not check_time(sample.time, received) or not _finite(sample.interval_s, 0.0, MAX_DURATION_S):
        return None
    changes: dict[str, Any] = {}
    if clean_text(sample.host) != sample.host:
        changes["host"] = clean_text(sample.host)
    if sample.cpu is not None and len(sample.cpu.cores) > MAX_CORES:
        changes["cpu"] = evolve(sample.cpu, cores=sample.cpu.cores[:MAX_CORES])
    devices = ("name", "error")  # a lost device's row shows why it was lost
    for name, fields, limit in (
        ("gpus", devices, MAX_DEVICES),
        ("hpus", devices, MAX_DEVICES),
        ("disks", ("device",), MAX_LIST),
        ("nets", ("interface",), MAX_LIST),
        ("statuses", ("message",), MAX_LIST),
        ("top", ("name",), MAX_PROCESSES),  # any user's processes: a name may be an escape
    ):
        items = getattr(sample, name)
        if not items:
            continue  # none reported (a node without GPUs): nothing to clean
        cleaned = _clean_named(items, fields, limit)
        if cleaned is not items:
            changes[name] = cleaned
    processes = sample.processes
    if processes is not None:
        kept = _clean_named(processes.processes, ("name",), MAX_PROCESSES)
        if kept is not processes.processes:
            changes["processes"] = evolve(processes, processes=kept)
    if sample.top_time is not None and not (
        check_time(sample.top_time, received) and sample.top_time <= sample.time
    ):
        changes["top_time"] = None  # not known: the title then claims no age
    for name in ("data_device", "data_fs_type"):
        value = getattr(sample, name)
        if value is not None and clean_text(value) != value:
            changes[name] = clean_text(value)
    return evolve(sample, **changes) if changes else sample


def clean_stack(stack: Stack, received: float) -> Stack | None:
    """The stack with printable text only; None when its time makes no sense."""
    if not check_time(stack.time, received):
        return None
    frames = tuple(
        evolve(
            f,
            file=clean_text(f.file),
            function=clean_text(f.function),
            code=clean_text(f.code) if f.code is not None else None,
        )
        for f in stack.frames
    )
    thread = clean_text(stack.thread) if stack.thread is not None else None
    return evolve(stack, frames=frames, thread=thread)
