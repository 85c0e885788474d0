"""What 1,000 idle subscribers cost a training process publishing on loopback TCP.

A real training loop (a small PyTorch MLP on the CPU, one thread, ``probe.watch``) runs
STEPS steps three ways: no subscriber; 1,000 idle subscribers (real zmq SUB sockets in
another process that subscribe and never read) against the default publisher, which
admits at most MAX_PEERS of them; and the same 1,000 with the cap lifted (what it was
before). Reported: the training process's CPU per step (all threads: the probe's
publisher and zmq I/O threads included), its wall time per step, and its RSS after
the run. Median and spread over GPUTOP_BENCH_REPEATS runs.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = int(os.environ.get("GPUTOP_BENCH_STEPS", "6000"))
SUBSCRIBERS = int(os.environ.get("GPUTOP_BENCH_SUBSCRIBERS", "1000"))
REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "3"))

TRAINER = """
import json, os, sys, time
import torch
from gputop_dl.probe import transport
if sys.argv[2] == "uncapped":
    transport.Publisher.__init__.__defaults__ = (10**9,)
from gputop_dl import probe
torch.set_num_threads(1)
steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
p = probe.Probe(name="bench", system_interval_s=1.0)
print(p.endpoint, flush=True)
sys.stdin.readline()  # the subscribers are connected (or there are none)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rss0 = rss()
c0, w0 = time.process_time(), time.perf_counter()
for _ in p.watch(range(steps)):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
c1, w1 = time.process_time(), time.perf_counter()
time.sleep(1.0)
publisher = p._publisher
print(json.dumps({"cpu_us": 1e6 * (c1 - c0) / steps, "wall_us": 1e6 * (w1 - w0) / steps,
                  "rss0": rss0, "rss": rss(), "peers": publisher.peers,
                  "refused": publisher.refused}), flush=True)
p.close()
"""

SUBSCRIBERS_SCRIPT = """
import sys, time, zmq
endpoint, n = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context(io_threads=2)
ctx.set(zmq.MAX_SOCKETS, n + 100)
subs = []
for _ in range(n):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"gputop.")
    s.connect(endpoint)
    subs.append(s)
print("connected", flush=True)
time.sleep(3600)  # idle: never reads; killed by the bench
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(tmp: Path, subscribers: int, mode: str) -> dict[str, float]:
    env = {**os.environ, "GPUTOP_LISTEN": f"tcp://127.0.0.1:{free_port()}"}
    trainer = subprocess.Popen(
        [sys.executable, str(tmp / "trainer.py"), str(STEPS), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    subs = None
    try:
        assert trainer.stdin is not None and trainer.stdout is not None
        endpoint = trainer.stdout.readline().strip()
        if subscribers:
            subs = subprocess.Popen(
                [sys.executable, str(tmp / "subs.py"), endpoint, str(subscribers)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert subs.stdout is not None
            subs.stdout.readline()
            time.sleep(3.0)  # handshakes done, history replayed
        trainer.stdin.write("go\n")
        trainer.stdin.flush()
        result: dict[str, float] = json.loads(trainer.stdout.readline())
        return result
    finally:
        if subs is not None:
            subs.kill()
            subs.wait()
        trainer.kill()
        trainer.wait()


def spread(values: list[float], unit: str) -> str:
    return (
        f"median {statistics.median(values):.0f} {unit} "
        f"(min {min(values):.0f}, max {max(values):.0f})"
    )


def main() -> None:
    print(
        f"subscribers' cost to training: {STEPS} steps of a small MLP, "
        f"{SUBSCRIBERS} idle SUB sockets on loopback TCP, {REPEATS} repeats"
    )
    cases = [("no subscriber", 0, "capped"), (f"{SUBSCRIBERS} idle, capped", SUBSCRIBERS, "capped")]
    cases.append((f"{SUBSCRIBERS} idle, uncapped", SUBSCRIBERS, "uncapped"))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "trainer.py").write_text(TRAINER)
        (Path(tmp) / "subs.py").write_text(SUBSCRIBERS_SCRIPT)
        for label, n, mode in cases:
            results = [run(Path(tmp), n, mode) for _ in range(REPEATS)]
            cpu = [r["cpu_us"] for r in results]
            wall = [r["wall_us"] for r in results]
            rss = [r["rss"] / 2**20 for r in results]
            grown = [(r["rss"] - r["rss0"]) / 2**20 for r in results]
            peers = results[-1]["peers"]
            print(
                f"  {label:<24} CPU/step {spread(cpu, 'us')}, wall/step {spread(wall, 'us')}, "
                f"RSS {spread(rss, 'MiB')} (+{statistics.median(grown):.0f} MiB during the "
                f"run), {peers:.0f} admitted"
            )


if __name__ == "__main__":
    main()
