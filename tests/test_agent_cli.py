"""`gputop agent`, `snapshot` and `list` as a user runs them: real processes, real sockets."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe.core import Probe
from tests.fakes.fake_nvml import FakeNvml
from tests.wire_reader import WireReader

FAKES = Path(__file__).parent / "fakes"
VENV_BIN = str(Path(sys.executable).parent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def path_without_hlsmi() -> str:
    return os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "hl-smi").exists()
    )


def start_agent(endpoint: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "agent", "--listen", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATH": path_without_hlsmi(), **(env or {})},
    )


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    return out, err


def system_bodies(reader: WireReader) -> list[dict[str, Any]]:
    return [b["sample"] for b in reader.of_kind("system")]


def test_agent_publishes_host_samples_and_says_why_accelerators_are_absent() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    agent = start_agent(endpoint)
    reader = WireReader(endpoint)
    try:
        reader.pump(4.5)
    finally:
        out, err = stop(agent)
        reader.pump(0.5)  # what was sent before exit is already queued here
        reader.close()
    assert agent.returncode == 0, err
    assert f"publishing on {endpoint}" in out
    samples = system_bodies(reader)
    assert len(samples) >= 2
    last = samples[-1]
    assert len(last["cpu"]["cores"]) == os.cpu_count()
    assert last["memory"]["total_bytes"] > 0
    assert any(d["read_bps"] is not None for d in last["disks"])
    assert "lo" in {n["interface"] for n in last["nets"]}
    statuses = {s["source"]: s for s in last["statuses"]}
    assert statuses["nvml"] == {
        "source": "nvml",
        "ok": False,
        "message": "NVML library not found",
        "state": "absent",
    }
    assert statuses["hl-smi"] == {
        "source": "hl-smi",
        "ok": False,
        "message": "hl-smi not installed",
        "state": "absent",
    }
    hello = reader.of_kind("hello")[-1]
    assert hello["role"] == "agent" and hello["loader"] is None
    assert reader.of_kind("bye")  # a clean stop says goodbye


def test_agent_on_a_port_in_use_says_it_could_not_bind_and_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        agent = start_agent(f"tcp://127.0.0.1:{port}")
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 1
    assert "Address already in use" in err and "could not start" in err
    assert "Training continues" not in err  # the probe's message, wrong for an agent


def test_hung_hlsmi_never_delays_host_samples() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = {
        "PATH": f"{FAKES}{os.pathsep}{VENV_BIN}{os.pathsep}{path_without_hlsmi()}",
        "FAKE_HLSMI_MODE": "hang",
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "agent", "--listen", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    reader = WireReader(endpoint)
    try:
        reader.pump(6.5)
    finally:
        stop(agent)
        reader.close()
    samples = system_bodies(reader)
    times = [s["time"] for s in samples]
    assert len(times) >= 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 1.5, gaps  # 1 Hz, whatever hl-smi does
    statuses = {s["source"]: s for s in samples[-1]["statuses"]}
    assert statuses["hl-smi"]["ok"] is False
    assert "timed out after 2 s" in statuses["hl-smi"]["message"]


def test_eight_fake_gpus_and_hpus_come_through_with_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{VENV_BIN}{os.pathsep}{path_without_hlsmi()}")
    monkeypatch.setenv("FAKE_HLSMI_MODEL", "HL-325L")
    FakeNvml(8).install(monkeypatch)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    agent = Probe(name="agent", listen=endpoint, role="agent", system_interval_s=0.5)
    reader = WireReader(endpoint)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            reader.pump(0.5)
            samples = system_bodies(reader)
            if samples and len(samples[-1]["hpus"]) == 8 and len(samples[-1]["gpus"]) == 8:
                break
    finally:
        agent.close()
        reader.close()
    last = system_bodies(reader)[-1]
    gpu = last["gpus"][0]
    assert gpu["name"].startswith("NVIDIA") and gpu["state"] == "ok"
    assert 0 < gpu["power_w"] < 1000  # watts, not milliwatts
    assert gpu["mem_total_bytes"] > 10 * 2**30  # bytes
    hpu = last["hpus"][0]
    assert hpu["name"] == "HL-325L"
    assert hpu["mem_total_bytes"] == 131072 * 2**20  # MiB -> bytes
    assert 0 < hpu["power_w"] <= hpu["power_max_w"]
    statuses = {s["source"]: s for s in last["statuses"]}
    assert statuses["nvml"]["ok"] and statuses["hl-smi"]["ok"]


def test_snapshot_with_nothing_running_explains_and_exits_1() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--wait", "2.5"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path_without_hlsmi()},
    )
    assert out.returncode == 1, out.stderr  # no run reachable
    assert "no training run found" in out.stdout
    assert "from gputop_dl import probe" in out.stdout
    assert "nvml: NVML library not found" in out.stdout  # the host part came from the local sampler


def test_snapshot_json_sees_a_probe_and_list_finds_it() -> None:
    code = (
        "from gputop_dl import probe\nimport time\n"
        "for _ in probe.watch(range(100000)):\n    time.sleep(0.02)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "GPUTOP_NAME": "listed"}
    )
    try:
        time.sleep(2.0)
        listed = subprocess.run(
            [sys.executable, "-m", "gputop_dl", "list"], capture_output=True, text=True, timeout=30
        )
        snap = subprocess.run(
            [sys.executable, "-m", "gputop_dl", "snapshot", "--json", "--wait", "3"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        proc.kill()
        proc.wait()
    assert "listed" in listed.stdout and str(proc.pid) in listed.stdout
    data = json.loads(snap.stdout)
    runs = [r for r in data["runs"] if r["name"] == "listed"]
    assert len(runs) == 1 and runs[0]["state"] == "live"
    assert runs[0]["steps"] > 20
    # steps is a count: one more than the newest index (the issue: it was the index)
    assert runs[0]["steps"] >= runs[0]["last_step_index"] + 1 > 20
    assert runs[0]["loop"] == "in-loop"
    assert runs[0]["rate_now"] is not None
