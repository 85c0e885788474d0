"""One job of 512 ranks into one viewer: how soon is a straggler named, at what CPU cost?

Simulated ranks speak the real protocol over real sockets: each publisher process binds
one endpoint (a "node", or a few) and plays its ranks like the probe does — a Steps
message every 0.2 s per rank (10 steps/s, two records each: probe.core.flush_period), a
hello every 2 s with the
job id and the rank's device, and one node sample a second from each node's local rank 0.
DDP's pacing is kept: every rank steps every 100 ms; at a chosen moment one random rank
starts waiting 40 ms per step for its data (the others then wait in the collective), and
its node's data disk turns 95 % busy. The viewer process runs the pipeline the TUI and
``gputop snapshot`` use (ZmqSource thread + ViewerState ticked at 2 Hz) and reports:
seconds until the job verdict names that rank, its whole-process CPU (all threads), and
how far behind it is (now minus the newest step end it holds, over every rank).

Reusable publisher side: :func:`start_ranks` starts the simulated ranks on given
endpoints (one process per endpoint), e.g. behind relays:

    procs = start_ranks(["ipc:///tmp/n0", ...], world=512, job="torchrun:bench",
                        straggler=300, straggle_at=time.time() + 10, seconds=30)

Median and spread over GPUTOP_BENCH_REPEATS runs. Goal: named within 5 s, <= 1 s behind.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS = int(os.environ.get("GPUTOP_BENCH_RANKS", "512"))
PROCESSES = int(os.environ.get("GPUTOP_BENCH_PROCESSES", "8"))
SECONDS = float(os.environ.get("GPUTOP_BENCH_SECONDS", "30"))
STRAGGLE_AFTER_S = float(os.environ.get("GPUTOP_BENCH_STRAGGLE_AFTER", "12"))
REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "3"))
RANKS_PER_NODE = 8
STEP_S = 0.1

RANKS_SCRIPT = """
import sys, time
from gputop_dl.probe.core import SEND_QUEUE, flush_period
from gputop_dl.probe.messages import DeviceRef, Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.probe.samples import DiskSample, GpuSample, SystemSample
from gputop_dl.probe.transport import Publisher

endpoint, job = sys.argv[1], sys.argv[5]
first, last, world, straggler = (int(sys.argv[i]) for i in (2, 3, 4, 6))
straggle_at, seconds = float(sys.argv[7]), float(sys.argv[8])
PER_NODE, STEP = 8, 0.1
# One socket stands for many probes here: each probe has a queue of its own.
pub = Publisher(endpoint, send_hwm=SEND_QUEUE * (last - first))
start = time.time()
ranks = range(first, last)
sid = {r: f"node{r // PER_NODE:02d}:{10000 + r}" for r in ranks}

def hello(r):
    return encode(Hello(source_id=sid[r], role="probe", name="train.py",
                        host=f"node{r // PER_NODE:02d}", pid=10000 + r, started=start,
                        probe_version="0", rank=r, local_rank=r % PER_NODE, world_size=world,
                        job=job, host_sampler=r % PER_NODE == 0,
                        device=DeviceRef("cuda", r % PER_NODE, None)))

def sample(node, now, slow):
    gpus = tuple(GpuSample(i, "H100", None, util_pct=97.0, mem_used_bytes=60 << 30,
                           mem_total_bytes=80 << 30) for i in range(PER_NODE))
    disk = (DiskSample("nvme0n1", 2e8, 0.0, 900.0, 0.0, 95.0 if slow else 10.0),)
    return encode(System(source_id=sid[node * PER_NODE], sample=SystemSample(
        now, f"node{node:02d}", 1.0, True, disks=disk, gpus=gpus, data_device="nvme0n1p1")))

hellos = {r: hello(r) for r in ranks}
index = dict.fromkeys(ranks, 0)
FLUSH_EVERY = max(1, round(flush_period(1 / STEP) / STEP))  # steps per message, as a probe
pending = {r: [] for r in ranks}
tick = 0
late = 0.0  # how far this publisher itself fell behind its schedule (a loaded machine)
next_at = time.time()
while time.time() - start < seconds:
    next_at += STEP
    now = time.time()
    late = max(late, now - next_at + STEP)
    for r in ranks:
        if tick % 20 == r % 20:  # hellos spread over the 2 s
            pub.send(hellos[r])
        wait = 0.04 if r == straggler and now >= straggle_at else 0.005
        pending[r].append(StepRecord(index[r], now, STEP, wait, 32))
        index[r] += 1
        if (tick + 1) % FLUSH_EVERY == 0:
            records, pending[r] = tuple(pending[r]), []
            pub.send(encode(Steps(source_id=sid[r], records=records, sent=tick, dropped=0)))
    if tick % 10 == 0:
        for node in sorted({r // PER_NODE for r in ranks if r % PER_NODE == 0}):
            slow = straggler // PER_NODE == node and now >= straggle_at
            pub.send(sample(node, now, slow))
    tick += 1
    time.sleep(max(0.0, next_at - time.time()))
if len(sys.argv) > 9:
    open(sys.argv[9], "w").write(str(late))
time.sleep(2.0)
"""

VIEWER_SCRIPT = """
import json, statistics, sys, time
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState

endpoints, seconds = sys.argv[1].split(","), float(sys.argv[2])
straggler, straggle_at = int(sys.argv[3]), float(sys.argv[4])
state = ViewerState("viewer-host", pid_alive=False)
inbox = []
source = ZmqSource(endpoints, discover=False, local_sampler=False)
source.start(inbox.extend)  # list.extend is atomic under the GIL
named_at = None
lags = []
c0 = w0 = None
end = time.time() + seconds
while time.time() < end:
    events = inbox[:]
    del inbox[:len(events)]
    state.apply_all(events)
    now = time.time()
    state.tick(now)
    if c0 is None and len(state.runs) >= 1 and now > straggle_at - 8:
        c0, w0 = time.process_time(), now  # measured once every rank is in (warm)
    ends = [run.throughput.last_end for run in state._sources.values()  # no copies
            if run.throughput.last_end is not None]
    if c0 is not None and ends:
        lags.append((now - min(ends), now - statistics.median(ends)))
    job = state.jobs[0] if state.jobs else None
    verdict = job.verdict if job is not None else None
    if named_at is None and now >= straggle_at and verdict is not None \\
            and verdict.straggler_rank == straggler:
        named_at = now
    time.sleep(max(0.0, 0.5 - (time.time() - now)))
c1, w1 = time.process_time(), time.time()
source.stop()
job = state.jobs[0] if state.jobs else None
print(json.dumps({
    "cpu_pct": 100 * (c1 - c0) / (w1 - w0) if c0 is not None else None,
    "named_after_s": named_at - straggle_at if named_at is not None else None,
    "ranks": len(job.ranks) if job else 0,
    "verdict": job.verdict.headline if job and job.verdict else None,
    "lag_worst_s": max(l[0] for l in lags) if lags else None,
    "lag_median_s": statistics.median(l[1] for l in lags) if lags else None,
    "rss": int(open("/proc/self/statm").read().split()[1]) * 4096,
}), flush=True)
"""


def start_ranks(
    endpoints: list[str],
    *,
    world: int,
    job: str,
    straggler: int,
    straggle_at: float,
    seconds: float,
    script_dir: Path | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` simulated ranks split evenly over ``endpoints``, one publisher
    process per endpoint (each binds it). Rank ``straggler`` waits 40 ms a step for its
    data from Unix time ``straggle_at``; all stop after ``seconds``, each writing how late
    it ran (seconds behind its own schedule, at worst) to ``late-<i>.txt`` there."""
    folder = script_dir or Path(tempfile.mkdtemp(prefix="gputop-ranks-"))
    script = folder / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    per = -(-world // len(endpoints))
    procs = []
    for i, endpoint in enumerate(endpoints):
        first, last = i * per, min(world, (i + 1) * per)
        if first >= last:
            break
        late = folder / f"late-{i}.txt"
        args = [endpoint, first, last, world, job, straggler, straggle_at, seconds, late]
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)]))
    return procs


def free_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def run_once(tmp: Path, rng: random.Random) -> dict[str, float | int | str | None]:
    endpoints = [free_endpoint() for _ in range(PROCESSES)]
    straggler = rng.randrange(RANKS)
    start = time.time() + 1.0
    straggle_at = start + STRAGGLE_AFTER_S
    (tmp / "viewer.py").write_text(VIEWER_SCRIPT)
    viewer = subprocess.Popen(
        [
            sys.executable,
            str(tmp / "viewer.py"),
            ",".join(endpoints),
            str(SECONDS + 1.0),
            str(straggler),
            str(straggle_at),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(max(0.0, start - time.time()))
    procs = start_ranks(
        endpoints,
        world=RANKS,
        job="torchrun:bench",
        straggler=straggler,
        straggle_at=straggle_at,
        seconds=SECONDS,
        script_dir=tmp,
    )
    try:
        assert viewer.stdout is not None
        result: dict[str, float | int | str | None] = json.loads(viewer.stdout.readline())
    finally:
        for proc in procs:  # they end on their own (and say how late they ran)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        viewer.wait()
    result["straggler"] = straggler
    lateness = [float(p.read_text()) for p in tmp.glob("late-*.txt")]
    result["publisher_late_s"] = max(lateness) if lateness else None
    for p in tmp.glob("late-*.txt"):
        p.unlink()
    return result


def _fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "n/a"


def spread(values: list[float], unit: str) -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    return f"median {med:.2f}{unit} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    print(
        f"job scale: {RANKS} ranks x 10 steps/s in {PROCESSES} publisher processes, "
        f"{SECONDS:.0f} s, straggler after {STRAGGLE_AFTER_S:.0f} s, {REPEATS} repeats"
    )
    rng = random.Random(int(os.environ.get("GPUTOP_BENCH_SEED", "0")) or None)
    named: list[float] = []
    cpu: list[float] = []
    worst: list[float] = []
    median_lag: list[float] = []
    publisher_late: list[float] = []
    missed = 0
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(REPEATS):
            r = run_once(Path(folder), rng)
            print(
                f"  straggler rank {r['straggler']}: named after {_fmt(r['named_after_s'])} s; "
                f"viewer {_fmt(r['cpu_pct'])} % of one core; behind: worst rank "
                f"{_fmt(r['lag_worst_s'])} s, median {_fmt(r['lag_median_s'])} s; "
                f"publishers at worst {_fmt(r['publisher_late_s'])} s late; "
                f"{r['ranks']} ranks; RSS {int(r['rss'] or 0) / 2**20:.0f} MiB; "
                f"verdict: {r['verdict']}"
            )
            if isinstance(r["named_after_s"], float):
                named.append(r["named_after_s"])
            else:
                missed += 1
            for values, key in ((cpu, "cpu_pct"), (worst, "lag_worst_s")):
                if isinstance(r[key], float):
                    values.append(float(r[key]))  # type: ignore[arg-type]
            if isinstance(r["lag_median_s"], float):
                median_lag.append(r["lag_median_s"])
            if isinstance(r["publisher_late_s"], float):
                publisher_late.append(r["publisher_late_s"])
    print(f"straggler named after: {spread(named, ' s')}; not named in {missed} of {REPEATS}")
    print(f"viewer CPU: {spread(cpu, ' % of one core')}")
    print(f"behind (worst rank, worst moment): {spread(worst, ' s')}")
    print(f"behind (median rank): {spread(median_lag, ' s')}")
    print(f"publishers' own lateness (worst): {spread(publisher_late, ' s')}")


if __name__ == "__main__":
    main()
