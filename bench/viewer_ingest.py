"""The viewer's cost to take in one training step: decode + ViewerState.apply.

Steps arrive as the probe flushes them at 150 steps/s: a Steps message every 0.5 s
(probe.core.flush_period, 75 records a message) with data wait, device time and
batch size set. Each repeat feeds a fresh ViewerState 20 s of such messages
(plus a hello, a 64-core node sample a second and a tick at 2 Hz, as the app does) and
reports CPU time (process_time: all threads) per step: the whole pass less the ticks
(the clock is read around the pass and each tick, not around each message: a read costs
~0.7 us here), a pass that only decodes, a pass without the node samples (their cost
grows with the node's cores, not with the step rate) and a pass decoding only those.
Prints median and spread over the repeats, interleaved. The same steps host-timed (no
device time), as a ``watch`` loop's probe sends them once settled: runs of clock
readings (docs/protocol.md, "StepRun"), which the decoder makes into rows; and as
records, for comparison.
Goal: decode + state <= 2 us per step.

Uses only encode/decode and keyword construction of the messages, so it runs unchanged
whichever codec probe.protocol implements (run it with another tree on PYTHONPATH to
compare).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time

from gputop_dl.probe.core import flush_period
from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import HostRun, decode, encode, encode_steps, pack_readings
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.tui.events import Received
from gputop_dl.tui.state import ViewerState

REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "9"))
STEPS_PER_S = 150
# As the probe flushes at this rate (probe.core.flush_period); GPUTOP_BENCH_FLUSH_S
# compares another period.
FLUSH_S = float(os.environ.get("GPUTOP_BENCH_FLUSH_S", flush_period(STEPS_PER_S)))
SECONDS = 20
T0 = 1_700_000_000.0
SID = "bench-host:4242"


def frames(steps_as: str = "cuda") -> list[tuple[float, list[bytes], int]]:
    """(arrival time, frames, step records in it), in arrival order; steps CUDA-timed
    records, or host-timed as ``"records"`` or ``"runs"``."""
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
        first = index + 1
        for _ in range(per_flush):
            index += 1
            records.append(
                StepRecord(
                    index=index,
                    end_time=T0 + index * period,
                    period_s=period,
                    wait_s=period * 0.3,
                    samples=64,
                    device_s=period * 0.6 if steps_as == "cuda" else None,
                    device_idle_s=period * 0.3 if steps_as == "cuda" else None,
                )
            )
        at = T0 + (flush + 1) * FLUSH_S
        if steps_as == "runs":  # readings in ns of a clock that read 0 at T0
            readings = [round((first - 1) * period * 1e9)]
            for r in records:
                end_ns = round((r.end_time - T0) * 1e9)
                readings += [end_ns - round((r.period_s - r.wait_s) * 1e9), end_ns]  # type: ignore[operator]
            run = HostRun(first, pack_readings(readings), [64] * per_flush)
            encoded = encode_steps(SID, T0, [], flush, 0, 0, [run], 0)
        else:
            encoded = encode(Steps(source_id=SID, records=tuple(records), sent=flush, dropped=0))
        out.append((at + 0.001, encoded, per_flush))
        if flush % round(1 / FLUSH_S) == 0:
            cores = tuple(CpuCore(c, 20.0, 5.0, 0.0, 0.0, 75.0) for c in range(64))
            sample = SystemSample(
                time=at, host="bench-host", interval_s=1.0, cpu=CpuSample(cores, None)
            )
            out.append((at + 0.002, encode(System(source_id=SID, sample=sample)), 0))
    return out


def run_once(stream: list[tuple[float, list[bytes], int]]) -> tuple[float, float, int, int]:
    """(decode + apply CPU s, tick CPU s, steps, ticks) of one pass over ``stream``. The
    clock is read around the whole pass and around each tick only: reading it around
    each message (0.5-1 us a read here) would add a share of a step's cost."""
    tick_s = 0.0
    steps = ticks = 0
    state = ViewerState("viewer-host", pid_alive=None)
    next_tick = T0
    clock = time.process_time
    start = clock()
    for at, message_frames, count in stream:
        state.apply(Received(decode(message_frames), at))
        steps += count
        if at >= next_tick:  # the app ticks at its refresh rate (2 Hz by default)
            t0 = clock()
            state.tick(at)
            tick_s += clock() - t0
            ticks += 1
            next_tick = at + 0.5
    return clock() - start - tick_s, tick_s, steps, ticks


def decode_once(stream: list[tuple[float, list[bytes], int]]) -> float:
    """CPU s to decode every message of ``stream``."""
    clock = time.process_time
    start = clock()
    for _, message_frames, _ in stream:
        decode(message_frames)
    return clock() - start


def reference_us() -> float:
    """CPU us of a fixed piece of Python (bench/probe_overhead.py's step, 1,200 integer
    additions): this machine's speed, so that figures taken on hosts of different speed
    can be compared (this VM's has varied 4x from one day to the next)."""

    def work() -> int:  # as bench/probe_overhead.py's children run it
        x = 0
        for i in range(1200):
            x += i
        return x

    best = math.inf
    for _ in range(5):
        start = time.process_time()
        for _ in range(2_000):
            work()
        best = min(best, (time.process_time() - start) / 2_000 * 1e6)
    return best


def show(name: str, values: list[float], unit: str) -> None:
    low, high, mid = min(values), max(values), statistics.median(values)
    print(f"  {name:<32} median {mid:7.2f} {unit}  (min {low:.2f}, max {high:.2f})")


def main() -> None:
    stream = frames()
    steps_only = [item for item in stream if b"system" not in item[1][0]]
    system_only = [item for item in stream if b"system" in item[1][0]]
    run_once(stream)  # warm-up: imports the analyzer, fills caches
    gc.collect()
    total_us: list[float] = []
    decode_us: list[float] = []
    apply_us: list[float] = []
    steps_us: list[float] = []
    system_us: list[float] = []
    system_decode_us: list[float] = []
    tick_ms: list[float] = []
    for _ in range(REPEATS):  # the variants interleaved: the machine's load drifts
        ingest_s, tick_s, steps, ticks = run_once(stream)
        decode_s = decode_once(stream)
        steps_s = run_once(steps_only)[0]
        system_decode_s = decode_once(system_only)
        total_us.append(1e6 * ingest_s / steps)
        decode_us.append(1e6 * decode_s / steps)
        apply_us.append(1e6 * (ingest_s - decode_s) / steps)
        steps_us.append(1e6 * steps_s / steps)
        system_us.append(1e6 * (ingest_s - steps_s) / steps)
        system_decode_us.append(1e6 * system_decode_s / steps)
        tick_ms.append(1e3 * tick_s / ticks)
    print(
        f"viewer ingest: {STEPS_PER_S} steps/s in {round(STEPS_PER_S * FLUSH_S)}-record "
        f"messages, {REPEATS} repeats of {SECONDS} s of stream, CPU time (all threads)"
    )
    show("ingest (decode+apply) per step", total_us, "us")
    show("  decode", decode_us, "us")
    show("  state.apply", apply_us, "us")
    show("  Steps messages (hello too)", steps_us, "us")
    show("  64-core node sample, 1 Hz", system_us, "us")
    show("    of which its decode", system_decode_us, "us")
    show("state.tick (2 Hz, 1 run)", tick_ms, "ms")
    host: dict[str, list[float]] = {"records": [], "runs": []}
    host_decode: dict[str, list[float]] = {"records": [], "runs": []}
    streams = {kind: frames(kind) for kind in host}
    for _ in range(REPEATS):
        for kind, kind_stream in streams.items():
            ingest_s, _tick_s, steps, _ticks = run_once(kind_stream)
            host[kind].append(1e6 * ingest_s / steps)
            host_decode[kind].append(1e6 * decode_once(kind_stream) / steps)
    for kind in host:
        show(f"host-timed steps as {kind}", host[kind], "us")
        show("  decode", host_decode[kind], "us")
    print(f"this machine: the reference step (1,200 Python additions) {reference_us():.1f} us")
    print("goal: ingest <= 2 us per step; the tick (summaries, verdict once a second) is per")
    print("      refresh, not per step: at 2 Hz, 1 ms a tick is 0.2 % of a core")


if __name__ == "__main__":
    main()
