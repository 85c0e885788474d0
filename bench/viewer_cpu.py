"""The viewer's own CPU use, and its time to first frame, in a real terminal (tmux).

A publisher process feeds ``gputop tcp://...`` what a big node looks like: a training
run at 50 steps/s and, at 1 Hz, system samples with 64 cores, 8 GPUs, 8 HPUs, 4 disks and
4 interfaces. The viewer's CPU time is read from /proc over a minute. For comparison the
same is measured for ``btop`` (1 s refresh) when it is installed.
Goals: <= 3 % of one core; first frame < 1 s.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEASURE_S = float(os.environ.get("GPUTOP_BENCH_SECONDS", "60"))
ROOT = Path(__file__).resolve().parent.parent
GPUTOP = str(Path(sys.executable).parent / "gputop")

PUBLISHER = """
import random, socket, sys, time
from gputop_dl.probe.messages import Hello, LoaderInfo, StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.probe.samples import (CpuCore, CpuSample, DiskSample, GpuSample, HpuSample,
    MemorySample, NetSample, ProcessSample, SourceStatus, SystemSample, TrainingProcesses)
from gputop_dl.probe.transport import Publisher

pub = Publisher(sys.argv[1])
host, sid = socket.gethostname(), socket.gethostname() + ":4242"
hello = Hello(sid, "probe", "bench-run", host, 4242, time.time(), "0.1.0", 0, 0, 8,
              loader=LoaderInfo("torch.DataLoader", 8, True, 256, 2, True, tuple(range(100, 108))))
gib = 1 << 30
i, last_sys, last_hello, t = 0, 0.0, 0.0, time.time()
while True:
    time.sleep(0.1)
    now = time.time()
    recs = []
    for _ in range(5):  # 50 steps/s
        recs.append(StepRecord(i, now, 0.02, 0.004 + random.random() * 0.002, 256))
        i += 1
    pub.send(encode(Steps(sid, tuple(recs), i, 0)))
    if now - last_hello > 2:
        last_hello = now
        pub.send(encode(hello))
    if now - last_sys >= 1:
        last_sys = now
        cores = tuple(CpuCore(c, random.uniform(5, 90), 3.0, 1.0, 0.0, 5.0) for c in range(64))
        gpus = tuple(GpuSample(g, "NVIDIA H100 80GB HBM3", f"GPU-{g}",
                     util_pct=random.uniform(60, 99), mem_used_bytes=60 * gib,
                     mem_total_bytes=80 * gib, power_w=500.0, power_limit_w=700.0,
                     temperature_c=61.0, sm_clock_mhz=1980.0, pcie_rx_bps=3e9, pcie_tx_bps=1e8)
                     for g in range(8))
        hpus = tuple(HpuSample(h, "HL-225", f"01P0-{h}", util_pct=50.0, mem_used_bytes=40 * gib,
                     mem_total_bytes=96 * gib, power_w=300.0, power_max_w=600.0, temperature_c=40.0)
                     for h in range(8))
        procs = TrainingProcesses(tuple([ProcessSample(4242, "main", "python", 100.0, 8 * gib)] +
                 [ProcessSample(100 + w, "worker", "python", 60.0, gib) for w in range(8)]), 0, 8)
        sample = SystemSample(now, host, 1.0, cpu=CpuSample(cores, (30.0, 28.0, 25.0)),
            memory=MemorySample(512 * gib, 200 * gib, 300 * gib, 100 * gib, 0, 0, 0.0, 0.0),
            disks=tuple(DiskSample(f"nvme{d}n1", 5e8, 1e7, 4000.0, 100.0, 40.0) for d in range(4)),
            nets=tuple(NetSample(f"eth{n}", 1e8, 1e7) for n in range(4)),
            processes=procs, gpus=gpus, hpus=hpus,
            statuses=(SourceStatus("nvml", True), SourceStatus("hl-smi", True)))
        pub.send(encode(System(sid, sample)))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def pane_pid(session: str) -> int:
    return int(tmux("display", "-p", "-t", session, "#{pane_pid}").strip())


def measure(session: str, command: str, ready: str) -> tuple[float, float]:
    """(seconds to first frame containing ``ready``, % of one core over MEASURE_S)."""
    tmux("kill-session", "-t", session)
    t0 = time.monotonic()
    tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "50", command)
    first = float("nan")
    while time.monotonic() - t0 < 20:
        if ready in tmux("capture-pane", "-p", "-t", session):
            first = time.monotonic() - t0
            break
        time.sleep(0.02)
    time.sleep(3)  # past start-up
    pid = pane_pid(session)
    c0, w0 = cpu_seconds(pid), time.monotonic()
    time.sleep(MEASURE_S)
    c1, w1 = cpu_seconds(pid), time.monotonic()
    tmux("kill-session", "-t", session)
    return first, 100 * (c1 - c0) / (w1 - w0)


def main() -> None:
    if not shutil.which("tmux"):
        print("viewer cpu: skipped (tmux not installed)")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "publisher.py"
        script.write_text(PUBLISHER)
        pub = subprocess.Popen([sys.executable, str(script), endpoint], cwd=ROOT)
        try:
            time.sleep(1.0)
            first, cpu = measure("gputop-bench", f"exec {GPUTOP} {endpoint}", "bench-run")
            print(
                f"gputop viewer: {cpu:.2f} % of one core over {MEASURE_S:.0f} s "
                f"(64 cores, 8 GPUs, 8 HPUs at 1 Hz, 50 steps/s); first frame {first:.2f} s"
            )
        finally:
            pub.kill()
            pub.wait()
    if shutil.which("btop"):
        with tempfile.TemporaryDirectory() as conf:
            (Path(conf) / "btop").mkdir()
            (Path(conf) / "btop" / "btop.conf").write_text("update_ms = 1000\n")
            cmd = f"XDG_CONFIG_HOME={conf} exec btop --utf-force"
            _, cpu = measure("btop-bench", cmd, "cpu")
        print(f"btop (1 s refresh, this machine): {cpu:.2f} % of one core over {MEASURE_S:.0f} s")
    else:
        print("btop not installed: no comparison")


if __name__ == "__main__":
    main()
