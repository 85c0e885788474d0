"""An endpoint where only an agent publishes is a node, not a run that never arrives
(issue 9): a real ``gputop agent`` on loopback TCP, read by the viewer's pipeline and
by ``gputop snapshot``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gputop_dl.tui.events import SourceEvent
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState


@pytest.fixture
def agent() -> Iterator[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputop_dl",
            "agent",
            "--listen",
            "tcp://127.0.0.1:*",
            "--interval",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "publishing on" in line
    try:
        yield line.split(" on ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_viewer_shows_the_agents_node_not_a_waiting_run(agent: str) -> None:
    events: list[SourceEvent] = []
    source = ZmqSource([agent], discover=False, local_sampler=False)
    state = ViewerState("elsewhere")  # the viewer's own host is not the agent's
    source.start(events.extend)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
            state.agent_only_hosts() and state.host_system(socket.gethostname())
        ):
            time.sleep(0.2)
            batch, events[:] = list(events), []
            state.apply_all(batch)
            state.tick(time.time())
    finally:
        source.stop()
    assert state.agent_only_hosts() == (socket.gethostname(),)
    # No "waiting for the first message" placeholder for the endpoint any more.
    assert [r for r in state.runs if r.is_placeholder] == []
    assert state.host_system(socket.gethostname()) is not None


def test_snapshot_prints_the_node(agent: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--wait", "2", agent],
        capture_output=True,
        timeout=60,
    )
    text = out.stdout.decode()
    assert out.returncode == 0, text  # the node's figures were found
    assert f"node {socket.gethostname()}: no training run (agent only)" in text
    assert "no training run found" not in text
    assert f"host {socket.gethostname()}:" in text and "cores" in text
    as_json = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--wait", "2", "--json", agent],
        capture_output=True,
        timeout=60,
    )
    snap = json.loads(as_json.stdout)
    assert snap["runs"] == [] and snap["agent_only"] == [socket.gethostname()]
    assert snap["system"]["host"] == socket.gethostname()


def test_a_silent_endpoint_still_waits() -> None:
    """Without an agent the placeholder stays: nothing was heard from it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        events: list[SourceEvent] = []
        source = ZmqSource([endpoint], discover=False, local_sampler=False)
        source.start(events.extend)
        time.sleep(0.5)
        source.stop()
    state = ViewerState("elsewhere")
    state.apply_all(events)
    state.tick(time.time())
    assert [r.connection.state for r in state.runs] == ["connecting"]
    assert state.agent_only_hosts() == ()
