"""Recordings for other tools: a Chrome Trace Event JSON (ui.perfetto.dev,
chrome://tracing) and CSV tables (pandas).

The exports read facts (step records, node samples, de-duplicated as the viewer does) and
take verdicts from the viewer's own state, replayed (``Replayer``): an end reads, it never
judges a run its own way.

Trace layout: one process per run (its name, rank and host in ``process_name``), thread 1
"steps" with a slice per step holding "data wait" and "compute" (the step's named phases
nested in "compute", in the order the probe reported them), counters for its samples/s
(one value per second), and an instant event at each change of its verdict; one process
per host with counters for CPU, memory, disk, network and each accelerator.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.events import Received
from gputop_dl.tui.record.reader import Timeline
from gputop_dl.tui.record.replay import Replayer
from gputop_dl.tui.state import ViewerState

US = 1_000_000
RATE_BUCKET_S = 1.0
STEPS_TID, HOST_TID = 1, 1


@dataclass
class RunFacts:
    """What one publisher sent, de-duplicated: history replays repeat step records."""

    source_id: str
    hello: Hello | None = None
    steps: dict[int, StepRecord] = field(default_factory=dict)

    @property
    def label(self) -> str:
        hello = self.hello
        if hello is None:
            return self.source_id
        rank = f" rank {hello.rank}" if hello.rank is not None else ""
        return f"{hello.name}{rank} ({hello.host}:{hello.pid})"


@dataclass
class Facts:
    runs: dict[str, RunFacts] = field(default_factory=dict)
    samples: dict[tuple[str, float], SystemSample] = field(default_factory=dict)  # host, time


Span = tuple[float, float]  # the stretch of the recording exported, Unix seconds
EVERYTHING: Span = (0.0, float("inf"))


def collect(timeline: Timeline, span: Span = EVERYTHING) -> Facts:
    """Runs, their steps ending within ``span``, and the node samples taken within it."""
    low, high = span
    facts = Facts()
    for event in timeline.events:
        if not isinstance(event, Received):
            continue
        message = event.message
        if isinstance(message, Hello):
            if message.role == "probe":
                facts.runs.setdefault(
                    message.source_id, RunFacts(message.source_id)
                ).hello = message
        elif isinstance(message, Steps):
            run = facts.runs.setdefault(message.source_id, RunFacts(message.source_id))
            for record in message.records:
                if low <= record.end_time <= high:
                    run.steps.setdefault(record.index, record)
        elif isinstance(message, System) and message.sample.host_sampled:
            sample = message.sample
            if low <= sample.time <= high:
                facts.samples.setdefault((sample.host, sample.time), sample)
    return facts


@dataclass(frozen=True)
class VerdictChange:
    time: float
    source_id: str
    label: str
    kind: str
    cause: str | None
    severity: str
    headline: str


def verdict_changes(timeline: Timeline, span: Span = EVERYTHING) -> list[VerdictChange]:
    """Each run's shown verdict whenever it changed within ``span`` (the one shown as it
    begins, at its start), from a replay of the recording up to its end."""
    changes: list[VerdictChange] = []
    shown: dict[str, tuple[str, str | None, str]] = {}

    def on_tick(state: ViewerState, now: float) -> None:
        for run in state.runs:
            verdict = run.verdict
            if verdict is None:
                continue
            key = (verdict.kind, verdict.cause, verdict.severity)
            if shown.get(run.key) != key:
                shown[run.key] = key
                changes.append(
                    VerdictChange(
                        now, run.key, run.label, verdict.kind, verdict.cause,
                        verdict.severity, verdict.headline,
                    )
                )  # fmt: skip

    replayer = Replayer(timeline, on_tick=on_tick)
    replayer.advance_to(min(timeline.end, span[1]))
    low = span[0]
    held: dict[str, VerdictChange] = {}
    for change in changes:
        if change.time < low:
            held[change.source_id] = dataclasses.replace(change, time=low)
    return [*held.values(), *(c for c in changes if c.time >= low)]


# ----------------------------------------------------------------------- Perfetto
def _us(seconds: float) -> int:
    return round(seconds * US)


def step_slices(record: StepRecord, pid: int) -> Iterator[dict[str, Any]]:
    """The step's slice and its children, in integer µs so children nest exactly."""
    end = _us(record.end_time)
    start = end - _us(record.period_s)
    args: dict[str, Any] = {"index": record.index, "samples": record.samples}
    yield _slice(f"step {record.index}", "step", start, end, pid, args)
    compute_start = start
    if record.wait_s is not None:
        compute_start = min(end, start + _us(record.wait_s))
        yield _slice("data wait", "wait", start, compute_start, pid)
    if compute_start < end:
        yield _slice("compute", "compute", compute_start, end, pid)
    at = compute_start
    for name, seconds in record.phases:
        phase_end = min(end, at + _us(seconds))
        if phase_end > at:
            yield _slice(name, "phase", at, phase_end, pid)
        at = phase_end


def _slice(
    name: str, cat: str, start: int, end: int, pid: int, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start,
        "dur": end - start,
        "pid": pid,
        "tid": STEPS_TID,
    }
    if args:
        event["args"] = args
    return event


def _meta(kind: str, pid: int, name: str, tid: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _counter(name: str, ts: float, pid: int, values: dict[str, float | None]) -> dict[str, Any]:
    series = {key: value for key, value in values.items() if value is not None}
    return {"name": name, "ph": "C", "ts": _us(ts), "pid": pid, "tid": HOST_TID, "args": series}


def rate_counters(records: list[StepRecord], pid: int) -> Iterator[dict[str, Any]]:
    """samples/s (steps/s when samples are not reported) per RATE_BUCKET_S of steps."""
    bucket: int | None = None
    samples: int | None = 0  # None when a step of the bucket did not report them
    steps = 0
    busy = 0.0
    for record in sorted(records, key=lambda r: r.end_time):
        key = int(record.end_time // RATE_BUCKET_S)
        if bucket is not None and key != bucket and busy > 0:
            yield _rate(bucket, samples, steps, busy, pid)
            samples, steps, busy = 0, 0, 0.0
        bucket = key
        steps += 1
        busy += record.period_s
        samples = None if samples is None or record.samples is None else samples + record.samples
    if bucket is not None and busy > 0:
        yield _rate(bucket, samples, steps, busy, pid)


def _rate(bucket: int, samples: int | None, steps: int, busy: float, pid: int) -> dict[str, Any]:
    ts = (bucket + 1) * RATE_BUCKET_S
    if samples is not None:
        return _counter("samples/s", ts, pid, {"samples/s": samples / busy})
    return _counter("steps/s", ts, pid, {"steps/s": steps / busy})


def host_counters(sample: SystemSample, pid: int) -> Iterator[dict[str, Any]]:
    row = system_row(sample)
    yield _counter("CPU %", sample.time, pid, {"busy": row["cpu_busy_pct"]})
    yield _counter("memory bytes", sample.time, pid, {"used": row["mem_used_bytes"]})
    yield _counter(
        "disk bytes/s",
        sample.time,
        pid,
        {"read": row["disk_read_bytes_per_s"], "write": row["disk_write_bytes_per_s"]},
    )
    yield _counter(
        "network bytes/s",
        sample.time,
        pid,
        {"rx": row["net_rx_bytes_per_s"], "tx": row["net_tx_bytes_per_s"]},
    )
    for device in device_rows(sample):
        name = f"{device['kind']}{device['index']}"
        yield _counter(f"{name} util %", sample.time, pid, {"util": device["util_pct"]})
        yield _counter(f"{name} memory bytes", sample.time, pid, {"used": device["mem_used_bytes"]})


def perfetto_events(timeline: Timeline, span: Span = EVERYTHING) -> Iterator[dict[str, Any]]:
    facts = collect(timeline, span)
    pids: dict[str, int] = {}
    for sort, run in enumerate(sorted(facts.runs.values(), key=lambda r: r.label)):
        pid = pids[run.source_id] = sort + 1
        yield _meta("process_name", pid, run.label)
        yield {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}}
        yield _meta("thread_name", pid, "steps", STEPS_TID)
        records = sorted(run.steps.values(), key=lambda r: r.index)
        for record in records:
            yield from step_slices(record, pid)
        yield from rate_counters(records, pid)
    hosts: dict[str, int] = {}
    for (host, _), sample in sorted(facts.samples.items(), key=lambda item: item[0][1]):
        if host not in hosts:
            hosts[host] = 1000 + len(hosts)
            yield _meta("process_name", hosts[host], f"host {host}")
            yield {
                "name": "process_sort_index",
                "ph": "M",
                "pid": hosts[host],
                "args": {"sort_index": hosts[host]},
            }
        yield from host_counters(sample, hosts[host])
    for change in verdict_changes(timeline, span):
        if change.source_id not in pids:
            continue
        pid = pids[change.source_id]
        cause = f" ({change.cause})" if change.cause else ""
        yield {
            "name": f"{change.kind}{cause}",
            "cat": "verdict",
            "ph": "i",
            "s": "p",
            "ts": _us(change.time),
            "pid": pid,
            "tid": STEPS_TID,
            "args": {"severity": change.severity, "headline": change.headline},
        }


def write_perfetto(timeline: Timeline, out: Path, span: Span = EVERYTHING) -> int:
    """Write the trace (streamed: one event a line); the number of events."""
    count = 0
    with open(out, "w", encoding="utf-8") as stream:
        stream.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for event in perfetto_events(timeline, span):
            if count:
                stream.write(",\n")
            stream.write(json.dumps(event, separators=(",", ":")))
            count += 1
        stream.write("\n]}\n")
    return count


# --------------------------------------------------------------------------- CSV
STEP_COLUMNS = (
    "source_id", "run", "rank", "index", "end_time_unix_s", "period_s", "wait_s", "samples",
    "device_s", "device_idle_s", "device_caught_up", "phases_s",
)  # fmt: skip
SYSTEM_COLUMNS = (
    "host", "time_unix_s", "interval_s", "cpu_busy_pct", "cpu_iowait_pct", "load_avg_1m",
    "mem_used_bytes", "mem_available_bytes", "swap_used_bytes", "disk_read_bytes_per_s",
    "disk_write_bytes_per_s", "net_rx_bytes_per_s", "net_tx_bytes_per_s",
)  # fmt: skip
DEVICE_COLUMNS = (
    "host", "time_unix_s", "kind", "index", "name", "util_pct", "mem_used_bytes",
    "mem_total_bytes", "power_w", "temperature_c",
)  # fmt: skip
VERDICT_COLUMNS = ("time_unix_s", "source_id", "run", "kind", "cause", "severity", "headline")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _total(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def system_row(sample: SystemSample) -> dict[str, Any]:
    cores = sample.cpu.cores if sample.cpu is not None else ()
    busy = [100.0 - c.idle_pct - (c.iowait_pct or 0.0) for c in cores if c.idle_pct is not None]
    iowait = [c.iowait_pct for c in cores if c.iowait_pct is not None]
    memory = sample.memory
    nets = [n for n in sample.nets if n.interface != "lo"]
    load = sample.cpu.load_avg if sample.cpu is not None else None
    return {
        "host": sample.host,
        "time_unix_s": sample.time,
        "interval_s": sample.interval_s,
        "cpu_busy_pct": _mean(busy),
        "cpu_iowait_pct": _mean(iowait),
        "load_avg_1m": load[0] if load else None,
        "mem_used_bytes": memory.used_bytes if memory else None,
        "mem_available_bytes": memory.available_bytes if memory else None,
        "swap_used_bytes": memory.swap_used_bytes if memory else None,
        "disk_read_bytes_per_s": _total([d.read_bps for d in sample.disks]),
        "disk_write_bytes_per_s": _total([d.write_bps for d in sample.disks]),
        "net_rx_bytes_per_s": _total([n.rx_bps for n in nets]),
        "net_tx_bytes_per_s": _total([n.tx_bps for n in nets]),
    }


def device_rows(sample: SystemSample) -> list[dict[str, Any]]:
    rows = []
    for kind, devices in (("gpu", sample.gpus), ("hpu", sample.hpus)):
        for device in devices:
            rows.append(
                {
                    "host": sample.host,
                    "time_unix_s": sample.time,
                    "kind": kind,
                    "index": device.index,
                    "name": device.name,
                    "util_pct": device.util_pct,
                    "mem_used_bytes": device.mem_used_bytes,
                    "mem_total_bytes": device.mem_total_bytes,
                    "power_w": device.power_w,
                    "temperature_c": device.temperature_c,
                }
            )
    return rows


def step_row(run: RunFacts, record: StepRecord) -> dict[str, Any]:
    hello = run.hello
    return {
        "source_id": run.source_id,
        "run": hello.name if hello else None,
        "rank": hello.rank if hello else None,
        "index": record.index,
        "end_time_unix_s": record.end_time,
        "period_s": record.period_s,
        "wait_s": record.wait_s,
        "samples": record.samples,
        "device_s": record.device_s,
        "device_idle_s": record.device_idle_s,
        "device_caught_up": record.device_caught_up,
        "phases_s": json.dumps(dict(record.phases)) if record.phases else None,
    }


def _write_table(path: Path, columns: tuple[str, ...], rows: Iterator[dict[str, Any]]) -> int:
    """One CSV with a header row; None (not reported) is an empty cell, never 0."""
    count = 0
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.DictWriter(stream, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
            count += 1
    return count


def write_csv(timeline: Timeline, folder: Path, span: Span = EVERYTHING) -> dict[str, int]:
    """steps.csv, system.csv, devices.csv and verdicts.csv in ``folder``; rows of each."""
    folder.mkdir(parents=True, exist_ok=True)
    facts = collect(timeline, span)
    samples = sorted(facts.samples.values(), key=lambda s: (s.time, s.host))

    def steps() -> Iterator[dict[str, Any]]:
        for run in facts.runs.values():
            for index in sorted(run.steps):
                yield step_row(run, run.steps[index])

    def devices() -> Iterator[dict[str, Any]]:
        for sample in samples:
            yield from device_rows(sample)

    def verdicts() -> Iterator[dict[str, Any]]:
        for change in verdict_changes(timeline, span):
            yield {
                "time_unix_s": change.time,
                "source_id": change.source_id,
                "run": change.label,
                "kind": change.kind,
                "cause": change.cause,
                "severity": change.severity,
                "headline": change.headline,
            }

    return {
        "steps.csv": _write_table(folder / "steps.csv", STEP_COLUMNS, steps()),
        "system.csv": _write_table(
            folder / "system.csv", SYSTEM_COLUMNS, (system_row(s) for s in samples)
        ),
        "devices.csv": _write_table(folder / "devices.csv", DEVICE_COLUMNS, devices()),
        "verdicts.csv": _write_table(folder / "verdicts.csv", VERDICT_COLUMNS, verdicts()),
    }


__all__ = ["write_csv", "write_perfetto"]
