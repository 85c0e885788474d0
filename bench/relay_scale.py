"""A whole job through relays: 64 nodes x 8 ranks = 512 publishers, 64 ``gputop relay``
processes, one viewer. How far behind is the viewer, and what do viewer and relays cost?

Each node is a runtime directory of its own. Its 8 ranks are simulated publishers (the
real :class:`Publisher`, the real protocol over real ipc sockets, registered in the
node's discovery directory), packed into a few processes; rank 0 also sends one node
sample a second. Each node runs a real ``gputop relay --listen ipc://...`` that finds
its ranks by discovery. One viewer process runs the real pipeline (ZmqSource on the 64
relay endpoints + ViewerState, ticked at 2 Hz as the TUI does) and measures, per
``steps`` message, the time from its newest step's end (publish) to the moment the
viewer (a) received it from the source thread and (b) applied it at a tick. Whole-
process CPU (all threads) of the viewer and of every relay over each window; median
and spread over GPUTOP_BENCH_REPEATS windows.
Goal (issue 9): the viewer <= 1 s behind. The simulated publishers, relays and viewer
share this machine: when together they need more than its cores (the load printed per
window), every queue grows and "behind" measures the machine, not the viewer; scale
down with GPUTOP_BENCH_NODES to see the pipeline itself.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = int(os.environ.get("GPUTOP_BENCH_NODES", "64"))
RANKS = int(os.environ.get("GPUTOP_BENCH_RANKS", "8"))
# Steps a second per rank: a large model's data-parallel step takes about a second; a
# probe sends at most one message per flush (probe.core.flush_period: every 0.2 s below
# 100 steps/s), so 5 and more is 5 messages/s/rank.
STEPS_PER_S = float(os.environ.get("GPUTOP_BENCH_RATE", "2"))
SECONDS = float(os.environ.get("GPUTOP_BENCH_SECONDS", "15"))  # per window
REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "3"))
PUB_PROCS = int(os.environ.get("GPUTOP_BENCH_PUB_PROCS", "4"))
WARMUP_S = 5.0

PUBLISHER = """
import json, os, sys, time
from gputop_dl.probe.core import flush_period
from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.probe.transport import Publisher

root = sys.argv[1]
first, last, ranks, world = (int(a) for a in sys.argv[2:6])
rate = float(sys.argv[6])
period = flush_period(rate)  # as a probe flushes at this rate
start = time.time()
pubs = []  # (publisher, source_id, node, rank)
for node in range(first, last):
    directory = os.path.join(root, f"n{node:02d}")
    for local in range(ranks):
        rank = node * ranks + local
        endpoint = f"ipc://{directory}/r{local}.sock"
        pub = Publisher(endpoint)
        sid = f"node{node:02d}:{100000 + rank}"
        record = {"endpoint": endpoint, "pid": os.getpid(), "host": f"node{node:02d}",
                  "name": "job", "role": "probe", "started": start}
        path = os.path.join(directory, f"{os.getpid()}-{local}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        hello = encode(Hello(source_id=sid, role="probe", name="job", host=f"node{node:02d}",
                             pid=100000 + rank, started=start, probe_version="0", rank=rank,
                             world_size=world, local_rank=local))
        pubs.append((pub, sid, node, local, hello))
print("ready", flush=True)
index = {sid: 0 for _, sid, _, _, _ in pubs}
flush = 0
next_at = time.time()
due = 0.0  # steps owed: a probe sends a message only at a flush with steps in it
cores = tuple(CpuCore(c, 20.0, 5.0, 0.0, 0.0, 75.0) for c in range(8))
while True:
    next_at += period
    due += rate * period
    per = int(due)
    due -= per
    for pub, sid, node, local, hello in pubs:
        if pub.wait(0) or flush % round(2 / period) == 0:  # a hello every 2 s
            pub.send(hello)
        now = time.time()
        i = index[sid]
        recs = tuple(StepRecord(index=i + k, end_time=now - (per - 1 - k) / rate,
                                period_s=1 / rate, wait_s=0.2 / rate, samples=32,
                                device_s=0.7 / rate) for k in range(per))
        index[sid] = i + per
        if per:
            pub.send(encode(Steps(source_id=sid, records=recs, sent=flush, dropped=0)))
        if local == 0 and flush % round(1 / period) == 0:  # a node sample a second
            sample = SystemSample(time=now, host=f"node{node:02d}", interval_s=1.0,
                                  cpu=CpuSample(cores, None), host_sampled=True)
            pub.send(encode(System(source_id=sid, sample=sample)))
    flush += 1
    time.sleep(max(0.0, next_at - time.time()))
"""

VIEWER = """
import json, statistics, sys, threading, time
from gputop_dl.probe.messages import Steps
from gputop_dl.tui.events import Received
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState

endpoints, windows = json.loads(sys.argv[1]), int(sys.argv[2])
seconds, warmup = float(sys.argv[3]), float(sys.argv[4])
state = ViewerState("viewer-host")
inbox = []
delivered = []  # publish -> source emit, seconds
lock = threading.Lock()

def emit(events):
    now = time.time()
    with lock:
        for e in events:
            if isinstance(e, Received) and isinstance(e.message, Steps) and e.message.records:
                delivered.append(now - e.message.records[-1].end_time)
        inbox.extend(events)

source = ZmqSource(endpoints, discover=False, local_sampler=False)
source.start(emit)
applied = []

def pump(until):
    while time.time() < until:
        with lock:
            events = inbox[:]
            del inbox[:]
        now = time.time()
        for e in events:
            if isinstance(e, Received) and isinstance(e.message, Steps) and e.message.records:
                applied.append(now - e.message.records[-1].end_time)
        state.apply_all(events)
        state.tick(time.time())
        time.sleep(0.5)

pump(time.time() + warmup)
print(json.dumps({"phase": "measuring"}), flush=True)
for _ in range(windows):
    with lock:
        delivered.clear()
    applied.clear()
    c0, w0 = time.process_time(), time.time()
    pump(w0 + seconds)
    c1, w1 = time.process_time(), time.time()
    with lock:
        d = sorted(delivered)
    a = sorted(applied)
    runs = [r for r in state.runs if not r.is_placeholder]
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None
    print(json.dumps({
        "cpu_pct": 100 * (c1 - c0) / (w1 - w0),
        "delivered_p50": q(d, 0.5), "delivered_p99": q(d, 0.99),
        "applied_p50": q(a, 0.5), "applied_p99": q(a, 0.99), "applied_max": a[-1] if a else None,
        "messages": len(a), "runs": len(runs), "hosts": len(state.hosts),
        "start": w0, "end": w1,
    }), flush=True)
source.stop()
"""


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float], unit: str, digits: int = 1) -> str:
    return (
        f"median {statistics.median(values):.{digits}f}{unit} "
        f"(min {min(values):.{digits}f}, max {max(values):.{digits}f})"
    )


def main() -> None:
    print(
        f"relay scale: {NODES} nodes x {RANKS} ranks = {NODES * RANKS} publishers "
        f"({PUB_PROCS} processes), {STEPS_PER_S:g} steps/s each "
        f"({NODES * RANKS * STEPS_PER_S:,.0f} steps/s), {NODES} relays, one viewer; "
        f"{REPEATS} windows of {SECONDS:.0f} s"
    )
    root = Path(tempfile.mkdtemp(prefix="gtrs-"))
    procs: list[subprocess.Popen[str]] = []
    env = dict(os.environ)
    try:
        (root / "pub.py").write_text(PUBLISHER)
        (root / "viewer.py").write_text(VIEWER)
        for node in range(NODES):
            (root / f"n{node:02d}").mkdir(mode=0o700)
        per_proc = -(-NODES // PUB_PROCS)
        for first in range(0, NODES, per_proc):
            last = min(NODES, first + per_proc)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(root / "pub.py"),
                    str(root),
                    *(str(n) for n in (first, last, RANKS, NODES * RANKS, STEPS_PER_S)),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        relays: list[subprocess.Popen[str]] = []
        endpoints = []
        for node in range(NODES):
            directory = root / f"n{node:02d}"
            endpoint = f"ipc://{directory}/relay.sock"
            relay = subprocess.Popen(
                [sys.executable, "-m", "gputop_dl", "relay", "--listen", endpoint],
                env={**env, "GPUTOP_RUNTIME_DIR": str(directory)},
                stdout=subprocess.DEVNULL,
                text=True,
            )
            relays.append(relay)
            endpoints.append(endpoint)
        procs.extend(relays)
        time.sleep(3.0)  # relays up and subscribed
        viewer = subprocess.Popen(
            [
                sys.executable,
                str(root / "viewer.py"),
                json.dumps(endpoints),
                *(str(n) for n in (REPEATS, SECONDS, WARMUP_S)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(viewer)
        assert viewer.stdout is not None
        json.loads(viewer.stdout.readline())  # measuring from now
        results = []
        publishers = procs[: len(procs) - NODES - 1]
        pub_cpu: list[float] = []
        relay_cpu: list[float] = []
        relay_each: list[float] = []
        for _ in range(REPEATS):
            c0 = [cpu_seconds(r.pid) for r in relays]
            p0 = sum(cpu_seconds(p.pid) for p in publishers)
            w0 = time.monotonic()
            result = json.loads(viewer.stdout.readline())
            c1 = [cpu_seconds(r.pid) for r in relays]
            wall = time.monotonic() - w0
            pub_cpu.append(100 * (sum(cpu_seconds(p.pid) for p in publishers) - p0) / wall)
            per = [100 * (b - a) / wall for a, b in zip(c0, c1, strict=True)]
            relay_cpu.append(sum(per))
            relay_each.append(statistics.median(per))
            results.append(result)
            print(
                f"  window: viewer {result['cpu_pct']:.1f} % of a core; behind (publish -> "
                f"applied at a 2 Hz tick) median {result['applied_p50']:.2f} s, p99 "
                f"{result['applied_p99']:.2f} s, max {result['applied_max']:.2f} s; "
                f"received median {1000 * result['delivered_p50']:.0f} ms, p99 "
                f"{1000 * result['delivered_p99']:.0f} ms; {result['runs']} runs, "
                f"{result['hosts']} hosts; relays {sum(per):.1f} % in all, "
                f"publishers {pub_cpu[-1]:.0f} %; load {os.getloadavg()[0]:.1f} "
                f"on {os.cpu_count()} cores"
            )
        print(f"viewer CPU: {spread([r['cpu_pct'] for r in results], ' %')} of one core")
        print(f"behind, median: {spread([r['applied_p50'] for r in results], ' s', 2)}")
        print(f"behind, p99:    {spread([r['applied_p99'] for r in results], ' s', 2)}")
        print(
            "received (publish -> source), p99: "
            f"{spread([1000 * r['delivered_p99'] for r in results], ' ms', 0)}"
        )
        print(f"relays, all {NODES}: {spread(relay_cpu, ' %')} of one core")
        print(f"one relay, median: {spread(relay_each, ' %', 2)} of one core")
        print(f"simulated publishers, all: {spread(pub_cpu, ' %')} of one core")
        print("goal: the viewer <= 1 s behind")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
