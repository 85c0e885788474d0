"""Soak: the real viewer for SOAK_SECONDS (default 600) against publishers that flood,
come and go, and send garbage; its RSS must stay flat.

Everything speaks the real protocol over real sockets, found through discovery in a
private runtime dir (the viewer is started with no endpoint, as a user would):
- steady: one process playing 16 runs x 100 steps/s (SOAK_RUNS, SOAK_RATE), with a node
  sample a second;
- churn: a real ``Probe`` training loop (sleep-based steps) started every 5 s, each living
  10-40 s; every third one is killed with SIGKILL (its record and socket left behind);
- hostile: a publisher that sends random bytes, a ``"kind": [1]`` payload, an unknown
  major version, 30,000 reported cores and, every 10 s, a 20 MB frame.

The viewer is the real ``gputop`` in a private tmux server (200x50). Every 10 s its RSS
and CPU (all threads) are sampled; at the end ``q`` is pressed and the time to exit
measured. Pass: after the warm-up (the viewer's 300 s history window filling, or half
the run if shorter) the RSS stays within 10 % (+8 MiB) of its first sample there, and
the viewer quits.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulated import SCRIPT

SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
SAMPLE_S = float(os.environ.get("SOAK_SAMPLE_S", "10"))
# The steady publisher's runs and steps/s per run (SOAK_RUNS=64 SOAK_RATE=200: the
# flood of bench/viewer_flood.py, 12,800 steps/s).
RUNS = int(os.environ.get("SOAK_RUNS", "16"))
RATE = int(os.environ.get("SOAK_RATE", "100"))
# The viewer keeps 300 s of history by design: RSS grows until that window is full.
HISTORY_FULL_S = 330.0
WARMUP_S = min(HISTORY_FULL_S, SECONDS / 2)
GPUTOP = str(Path(sys.executable).parent / "gputop")

CHURN = """
import sys, time
from gputop_dl import probe
life = float(sys.argv[1])
end = time.time() + life
for _ in probe.watch(range(10**9)):
    time.sleep(0.01)
    if time.time() > end:
        break
"""

HOSTILE = """
import os, random, socket, time
import msgspec
from gputop_dl.probe import discovery
from gputop_dl.probe.messages import Hello, System
from gputop_dl.probe.protocol import TOPIC_PREFIX, encode
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.probe.transport import Publisher
pub = Publisher(discovery.ipc_endpoint(os.getpid()))
discovery.register(discovery.Record(pub.endpoint, os.getpid(), socket.gethostname(),
                                    "soak-hostile\\x1b[2J", "probe", time.time()))
rng = random.Random(7)
hello = encode(Hello(source_id="hostile:1", role="probe", name="\\x1b]0;pwned\\x07hostile",
                     host=socket.gethostname(), pid=1, started=time.time(), probe_version="0"))
topic = hello[0]
cores = tuple(CpuCore(c, 50.0, 5.0, 0.0, 0.0, 45.0) for c in range(30_000))
i = 0
while True:
    i += 1
    pub.send(hello)
    pub.send([topic, rng.randbytes(rng.randrange(1, 2000))])
    pub.send([topic, msgspec.msgpack.encode({"v": [2, 0], "kind": [1]})])
    pub.send([TOPIC_PREFIX + b"9", msgspec.msgpack.encode({"v": [9, 0], "kind": "hello"})])
    if i % 5 == 0:
        sample = SystemSample(time=time.time(), host="hostile-host", interval_s=1.0,
                              cpu=CpuSample(cores, None))
        pub.send(encode(System(source_id="hostile:1", sample=sample)))
    if i % 10 == 0:
        pub.send([topic, b"x" * (20 * 1024 * 1024)])
    time.sleep(1.0)
"""


def proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds of all threads, RSS bytes) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def main() -> int:
    if not shutil.which("tmux"):
        print("soak: tmux is needed to run the real viewer in a terminal", file=sys.stderr)
        return 2
    rng = random.Random(1)
    tmp = Path(tempfile.mkdtemp(prefix="gputop-soak-"))
    runtime = tmp / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "GPUTOP_RUNTIME_DIR": str(runtime)}
    for name, text in (("steady.py", SCRIPT), ("churn.py", CHURN), ("hostile.py", HOSTILE)):
        (tmp / name).write_text(text)
    quiet = subprocess.DEVNULL
    children: list[subprocess.Popen[bytes]] = [
        subprocess.Popen(
            [
                sys.executable,
                str(tmp / "steady.py"),
                "discover",
                str(RUNS),
                str(RATE),
                "0",
                "steady",
            ],
            env=env,
        ),
        subprocess.Popen([sys.executable, str(tmp / "hostile.py")], env=env, stderr=quiet),
    ]
    tmux = ["tmux", "-L", f"gputop-soak-{os.getpid()}"]
    pythonpath = os.environ.get("PYTHONPATH", "")
    extra = os.environ.get("SOAK_VIEWER_ENV", "")  # e.g. MALLOC_ARENA_MAX=2, for experiments
    command = f"exec env GPUTOP_RUNTIME_DIR={runtime} PYTHONPATH={pythonpath} {extra} {GPUTOP}"
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "50", command], check=True)
    churn: list[tuple[subprocess.Popen[bytes], float, bool]] = []
    started = killed = 0
    series: list[tuple[float, int]] = []
    try:
        time.sleep(3.0)
        pid = int(
            subprocess.run(
                [*tmux, "display", "-p", "#{pane_pid}"], capture_output=True, text=True
            ).stdout
        )
        t0 = time.monotonic()
        cpu0, _ = proc_stat(pid)
        next_sample = t0 + SAMPLE_S
        next_churn = t0
        cpu_at_warmup: tuple[float, float] | None = None
        print(f"soak: {SECONDS:.0f} s, viewer pid {pid}, sampling every {SAMPLE_S:.0f} s")
        while (now := time.monotonic()) - t0 < SECONDS:
            if not alive(pid):
                print("soak: FAIL, the viewer died", file=sys.stderr)
                return 1
            if now >= next_churn:
                next_churn += 5.0
                life = rng.uniform(10.0, 40.0)
                child = subprocess.Popen(
                    [sys.executable, str(tmp / "churn.py"), str(life)],
                    env=env,
                    stdout=quiet,
                    stderr=quiet,
                )
                started += 1
                churn.append((child, now + life * rng.uniform(0.3, 0.9), started % 3 == 0))
            for entry in list(churn):
                child, kill_at, brutal = entry
                if child.poll() is not None:
                    churn.remove(entry)
                elif brutal and now >= kill_at:
                    child.kill()
                    child.wait()
                    killed += 1
                    churn.remove(entry)
            if now >= next_sample:
                next_sample += SAMPLE_S
                cpu, rss = proc_stat(pid)
                if cpu_at_warmup is None and now - t0 >= WARMUP_S:
                    cpu_at_warmup = (cpu, now)
                series.append((now - t0, rss))
                print(f"  t={now - t0:6.0f} s  RSS {rss / 2**20:6.1f} MiB", flush=True)
            time.sleep(0.5)
        cpu1, _ = proc_stat(pid)
        t1 = time.monotonic()
        subprocess.run([*tmux, "send-keys", "q"], check=False)
        q0 = time.monotonic()
        while alive(pid) and time.monotonic() - q0 < 10.0:
            time.sleep(0.02)
        quit_s = time.monotonic() - q0
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, stderr=quiet)
        for child in [*children, *(c for c, _, _ in churn)]:
            child.send_signal(signal.SIGKILL)
            child.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return report(series, cpu0, cpu1, t0, t1, cpu_at_warmup, started, killed, quit_s)


def report(
    series: list[tuple[float, int]],
    cpu0: float,
    cpu1: float,
    t0: float,
    t1: float,
    cpu_at_warmup: tuple[float, float] | None,
    started: int,
    killed: int,
    quit_s: float,
) -> int:
    mib = [rss / 2**20 for t, rss in series if t >= WARMUP_S]
    print(f"churn: {started} probes started, {killed} of them killed with SIGKILL")
    print(f"RSS series every {SAMPLE_S:.0f} s (MiB; warm-up ends at {WARMUP_S:.0f} s): ", end="")
    print(" ".join(f"{rss / 2**20:.0f}" for _, rss in series))
    print(f"viewer CPU: {100 * (cpu1 - cpu0) / (t1 - t0):.1f} % of one core overall", end="")
    if cpu_at_warmup is not None and t1 > cpu_at_warmup[1]:
        after = 100 * (cpu1 - cpu_at_warmup[0]) / (t1 - cpu_at_warmup[1])
        print(f", {after:.1f} % after the warm-up")
    else:
        print()
    print(f"q answered in {quit_s:.2f} s")
    if len(mib) < 2:
        print("soak: too short to judge the RSS (SOAK_SECONDS > 2 x SOAK_SAMPLE_S + warm-up)")
        return 0
    tail = mib[-max(1, len(mib) // 4) :]
    limit = mib[0] * 1.10 + 8
    print(
        f"RSS after the warm-up {mib[0]:.1f} MiB, "
        f"last quarter median {statistics.median(tail):.1f} MiB "
        f"(max {max(tail):.1f}), limit {limit:.1f} MiB"
    )
    flat = max(tail) <= limit
    quit_ok = quit_s < 10.0
    print("soak: PASS" if flat and quit_ok else "soak: FAIL")
    return 0 if flat and quit_ok else 1


if __name__ == "__main__":
    sys.exit(main())
