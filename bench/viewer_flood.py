"""Many runs into one viewer: 64 runs x 200 steps/s (12,800 steps/s), is anything left behind?

A publisher process plays 64 training runs (each: its steps as the probe sends
them, every 0.5 s at this rate (bench/simulated.py, probe.core.flush_period), a hello every
2 s; one node sample a second). A viewer process runs the real pipeline the TUI and
``gputop snapshot`` use (ZmqSource thread + ViewerState, ticked at 2 Hz) and reports its
whole-process CPU time (all threads) over the flood; after a drain it compares each run's
newest step index with the publisher's. With tmux installed the real TUI (200x50, default
refresh) is measured the same way. Median and spread over GPUTOP_BENCH_REPEATS runs.
GPUTOP_BENCH_STEPS=runs sends host-timed steps as runs (a settled ``watch`` loop's form),
which cost the viewer's decoder more than the default CUDA-timed records.
Goal: <= 15 % of one core, nothing left behind.
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

from simulated import SCRIPT

RUNS = int(os.environ.get("GPUTOP_BENCH_RUNS", "64"))
STEPS_PER_S = int(os.environ.get("GPUTOP_BENCH_RATE", "200"))
SECONDS = float(os.environ.get("GPUTOP_BENCH_SECONDS", "20"))
REPEATS = int(os.environ.get("GPUTOP_BENCH_REPEATS", "3"))
DRAIN_S = 3.0
GPUTOP = str(Path(sys.executable).parent / "gputop")

VIEWER = """
import json, sys, time
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState

endpoint, seconds, drain = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
state = ViewerState("viewer-host")
inbox = []
try:  # read as a viewer at 2 Hz reads (older checkouts: at each message)
    from gputop_dl.tui.source import gather_for
    gather = {"gather_s": gather_for(2.0)}
except ImportError:
    gather = {}
source = ZmqSource([endpoint], discover=False, local_sampler=False, **gather)
source.start(inbox.extend)  # list.extend is atomic under the GIL
def pump(until):
    while time.time() < until:
        events = inbox[:]
        del inbox[:len(events)]
        state.apply_all(events)
        state.tick(time.time())
        time.sleep(0.5)
pump(time.time() + 1.5)  # connected, first messages in
c0, w0 = time.process_time(), time.time()
pump(w0 + seconds)
c1, w1 = time.process_time(), time.time()
pump(w1 + drain)
source.stop()
last = {run.key: run.last_step_index for run in state.runs}
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
print(json.dumps({"cpu_pct": 100 * (c1 - c0) / (w1 - w0), "last": last, "rss": rss}), flush=True)
"""


def publisher(tmp: Path, endpoint: str, seconds: float) -> subprocess.Popen[str]:
    """RUNS simulated runs at STEPS_PER_S for ``seconds`` (bench/simulated.py)."""
    args = (endpoint, RUNS, STEPS_PER_S, seconds, "flood")  # bench/simulated.py's argv
    return subprocess.Popen(
        [sys.executable, str(tmp / "pub.py"), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
    )


def run_pipeline(endpoint: str, tmp: Path) -> tuple[float, int, int, int, int]:
    """(viewer CPU %, runs complete, runs seen, viewer RSS bytes, most steps missing)."""
    (tmp / "pub.py").write_text(SCRIPT)
    (tmp / "viewer.py").write_text(VIEWER)
    viewer = subprocess.Popen(
        [sys.executable, str(tmp / "viewer.py"), endpoint, str(SECONDS + 1.0), str(DRAIN_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    pub = publisher(tmp, endpoint, SECONDS)
    try:
        assert pub.stdout is not None and viewer.stdout is not None
        sent = json.loads(pub.stdout.readline())
        seen = json.loads(viewer.stdout.readline())
    finally:
        pub.kill()
        pub.wait()
        viewer.wait()
    behind = [
        last - (seen["last"].get(f"flood-{r}:{1000 + r}") or -1) for r, last in enumerate(sent)
    ]
    complete = sum(1 for b in behind if b == 0)
    return seen["cpu_pct"], complete, len(seen["last"]), seen["rss"], max(behind)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_tui(endpoint: str, tmp: Path) -> tuple[float, bool]:
    """The real TUI in a private tmux server at 200x50: % of one core during the flood,
    and whether its screen then says it dropped messages (its inbox holds what arrives
    between two refreshes, bounded: app.INBOX_MAX)."""
    (tmp / "pub.py").write_text(SCRIPT)
    tmux = ["tmux", "-L", f"gputop-flood-{os.getpid()}"]
    env = f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}"
    command = f"exec env {env} {GPUTOP} {endpoint}"
    # The publisher first: the viewer refuses an endpoint where nothing listens (exit 1).
    pub = publisher(tmp, endpoint, SECONDS + 5.0)
    time.sleep(1.0)
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "50", command], check=True)
    try:
        time.sleep(3.0)  # first frame, imports
        pid = int(
            subprocess.run(
                [*tmux, "display", "-p", "#{pane_pid}"], capture_output=True, text=True
            ).stdout
        )
        time.sleep(2.0)
        c0, w0 = cpu_seconds(pid), time.monotonic()
        time.sleep(SECONDS - 2.0)
        c1, w1 = cpu_seconds(pid), time.monotonic()
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p"], capture_output=True, text=True
        ).stdout
        return 100 * (c1 - c0) / (w1 - w0), "dropped" in screen
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
        pub.kill()
        pub.wait()


def free_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.1f} % (min {min(values):.1f}, max {max(values):.1f})"
    )


def main() -> None:
    print(
        f"viewer flood: {RUNS} runs x {STEPS_PER_S} steps/s = {RUNS * STEPS_PER_S:,} steps/s, "
        f"{SECONDS:.0f} s, {REPEATS} repeats"
    )
    pipeline: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(REPEATS):
            cpu, complete, seen, rss, behind = run_pipeline(free_endpoint(), Path(tmp))
            pipeline.append(cpu)
            print(
                f"  pipeline run: {cpu:.1f} % of one core, {complete}/{RUNS} runs complete "
                f"after a {DRAIN_S:.0f} s drain ({seen} seen, at most {behind} steps missing), "
                f"RSS {rss / 2**20:.0f} MiB"
            )
        print(f"source + state (no drawing): {spread(pipeline)}")
        if shutil.which("tmux"):
            runs = [run_tui(free_endpoint(), Path(tmp)) for _ in range(REPEATS)]
            dropped = sum(1 for _, shown in runs if shown)
            print(
                f"TUI at 200x50, default refresh: {spread([cpu for cpu, _ in runs])}, "
                f"'messages dropped' on screen after {dropped} of {len(runs)} runs"
            )
        else:
            print("tmux not installed: the TUI itself not measured")
    print("goal: <= 15 % of one core, every run complete")


if __name__ == "__main__":
    main()
