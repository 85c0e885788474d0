"""The viewer's cost to take in one training step: decode + ViewerState.apply.

Steps arrive as the probe flushes them: a Steps message every 0.1 s, here at 150 steps/s
(15 records a message) with data wait, device time and batch size set. Each repeat feeds
a fresh ViewerState 20 s of such messages (plus a hello, system samples at 1 Hz and a
tick at 2 Hz, as the app does) and reports CPU time (process_time: all threads) per step
for decode alone, state alone and both, and for the Steps messages alone (the system
samples' cost grows with the node's cores, not with the step rate: here 64 cores).
Prints median and spread over the repeats.
Goal: decode + state <= 2 us per step.

Uses only encode/decode and keyword construction of the messages, so it runs unchanged
whichever codec probe.protocol implements.
"""

from __future__ import annotations

import gc
import os
import statistics
import time

from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.tui.events import Received
from gputop_dl.tui.state import ViewerState

REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "9"))
STEPS_PER_S = 150
FLUSH_S = 0.1
SECONDS = 20
T0 = 1_700_000_000.0
SID = "bench-host:4242"


def frames() -> list[tuple[float, list[bytes], int]]:
    """(arrival time, frames, step records in it), in arrival order."""
    out: list[tuple[float, list[bytes], int]] = []
    hello = Hello(
        source_id=SID,
        role="probe",
        name="bench",
        host="bench-host",
        pid=4242,
        started=T0,
        probe_version="0",
    )
    out.append((T0, encode(hello), 0))
    period = 1.0 / STEPS_PER_S
    per_flush = round(STEPS_PER_S * FLUSH_S)
    index = 0
    for flush in range(round(SECONDS / FLUSH_S)):
        records = []
        for _ in range(per_flush):
            index += 1
            records.append(
                StepRecord(
                    index=index,
                    end_time=T0 + index * period,
                    period_s=period,
                    wait_s=period * 0.3,
                    samples=64,
                    device_s=period * 0.6,
                    device_idle_s=period * 0.3,
                )
            )
        at = T0 + (flush + 1) * FLUSH_S
        message = Steps(source_id=SID, records=tuple(records), sent=flush, dropped=0)
        out.append((at + 0.001, encode(message), per_flush))
        if flush % round(1 / FLUSH_S) == 0:
            cores = tuple(CpuCore(c, 20.0, 5.0, 0.0, 0.0, 75.0) for c in range(64))
            sample = SystemSample(
                time=at, host="bench-host", interval_s=1.0, cpu=CpuSample(cores, None)
            )
            out.append((at + 0.002, encode(System(source_id=SID, sample=sample)), 0))
    return out


def run_once(
    stream: list[tuple[float, list[bytes], int]], by_kind: dict[str, list[float]] | None = None
) -> tuple[float, float, float, float, int, int]:
    """(decode CPU s, apply CPU s, decode + apply CPU s of the Steps messages alone, tick
    CPU s, steps, ticks); ``by_kind`` gathers [decode s, apply s] per message kind."""
    decode_s = apply_s = steps_s = tick_s = 0.0
    steps = ticks = 0
    state = ViewerState("viewer-host", pid_alive=None)
    next_tick = T0
    clock = time.process_time
    for at, message_frames, count in stream:
        t0 = clock()
        message = decode(message_frames)
        t1 = clock()
        state.apply(Received(message, at))
        t2 = clock()
        decode_s += t1 - t0
        apply_s += t2 - t1
        if count:
            steps_s += t2 - t0
        if by_kind is not None:
            part = by_kind.setdefault(type(message).__name__, [0.0, 0.0])
            part[0] += t1 - t0
            part[1] += t2 - t1
        steps += count
        if at >= next_tick:  # the app ticks at its refresh rate (2 Hz by default)
            t3 = clock()
            state.tick(at)
            tick_s += clock() - t3
            ticks += 1
            next_tick = at + 0.5
    return decode_s, apply_s, steps_s, tick_s, steps, ticks


def show(name: str, values: list[float], unit: str) -> None:
    low, high, mid = min(values), max(values), statistics.median(values)
    print(f"  {name:<28} median {mid:7.2f} {unit}  (min {low:.2f}, max {high:.2f})")


def main() -> None:
    stream = frames()
    run_once(stream)  # warm-up: imports the analyzer, fills caches
    gc.collect()
    decode_us: list[float] = []
    apply_us: list[float] = []
    total_us: list[float] = []
    steps_only_us: list[float] = []
    tick_ms: list[float] = []
    by_kind: dict[str, list[float]] = {}
    for _ in range(REPEATS):
        decode_s, apply_s, steps_s, tick_s, steps, ticks = run_once(stream, by_kind)
        decode_us.append(1e6 * decode_s / steps)
        apply_us.append(1e6 * apply_s / steps)
        total_us.append(1e6 * (decode_s + apply_s) / steps)
        steps_only_us.append(1e6 * steps_s / steps)
        tick_ms.append(1e3 * tick_s / ticks)
    print(
        f"viewer ingest: {STEPS_PER_S} steps/s in {round(STEPS_PER_S * FLUSH_S)}-record "
        f"messages, {REPEATS} repeats of {SECONDS} s of stream, CPU time (all threads)"
    )
    show("decode per step", decode_us, "us")
    show("state.apply per step", apply_us, "us")
    show("ingest (decode+apply)/step", total_us, "us")
    show("  of which Steps messages", steps_only_us, "us")
    show("state.tick (2 Hz, 1 run)", tick_ms, "ms")
    total_steps = REPEATS * sum(count for _, _, count in stream)
    print("  per step, by message kind (all repeats): decode + apply")
    for kind, (dec, app) in sorted(by_kind.items()):
        print(f"    {kind:<8} {1e6 * dec / total_steps:5.2f} + {1e6 * app / total_steps:5.2f} us")
    print("goal: ingest <= 2 us per step; the tick (summaries, verdict once a second) is per")
    print("      refresh, not per step: at 2 Hz, 1 ms a tick is 0.2 % of a core")


if __name__ == "__main__":
    main()
