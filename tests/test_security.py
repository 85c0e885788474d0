"""Who may read the stream: the listen policy (loopback warned, network refused unless
opted in), the cap on connected peers, and what the commands say when the runtime
directory is refused. Real ZeroMQ sockets on loopback, a real probe, real subprocesses."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from gputop_dl.probe import core
from gputop_dl.probe.core import Probe, current
from gputop_dl.probe.transport import (
    EXPOSED,
    LOOPBACK,
    PRIVATE,
    Publisher,
    Subscriber,
    exposure,
    listen_policy,
)
from gputop_dl.tui import cli


@pytest.fixture(autouse=True)
def _no_probe_left_behind() -> Iterator[None]:
    core._access_warned.clear()
    yield
    live = current()
    if live is not None:
        live.close()


@pytest.mark.parametrize(
    ("endpoint", "kind"),
    [
        ("ipc:///run/user/1000/gputop/1.sock", PRIVATE),
        ("inproc://x", PRIVATE),
        ("tcp://127.0.0.1:5555", LOOPBACK),
        ("tcp://127.0.0.1:*", LOOPBACK),
        ("tcp://127.1.2.3:5555", LOOPBACK),
        ("tcp://localhost:5555", LOOPBACK),
        ("tcp://LOCALHOST:*", LOOPBACK),
        ("tcp://[::1]:5555", LOOPBACK),
        ("tcp://lo:5555", LOOPBACK),
        ("tcp://0.0.0.0:5555", EXPOSED),
        ("tcp://0.0.0.0:*", EXPOSED),
        ("tcp://*:*", EXPOSED),
        ("tcp://*:5555", EXPOSED),
        ("tcp://[::]:5555", EXPOSED),
        ("tcp://:::5555", EXPOSED),
        ("tcp://10.0.0.7:5555", EXPOSED),
        ("tcp://192.168.1.2:*", EXPOSED),
        ("tcp://eth0:5555", EXPOSED),
        ("tcp://gpu-node-07:5555", EXPOSED),  # a name: not resolved, not trusted
        ("tcp://10.0.0.7;127.0.0.1:5555", LOOPBACK),  # source;destination
        ("pgm://eth0;239.192.1.1:5555", EXPOSED),
        ("ws://127.0.0.1:5555", EXPOSED),
        ("garbage", EXPOSED),
    ],
)
def test_exposure(endpoint: str, kind: str) -> None:
    assert exposure(endpoint) == kind


@pytest.mark.parametrize(
    ("endpoint", "insecure", "refused", "warned"),
    [
        ("ipc:///tmp/x.sock", False, False, None),
        ("tcp://127.0.0.1:*", False, False, "every user of this host"),
        ("tcp://127.0.0.1:*", True, False, "every user of this host"),
        ("tcp://0.0.0.0:*", False, True, None),
        ("tcp://0.0.0.0:*", True, False, "anyone who can reach this host"),
        ("tcp://10.0.0.7:5555", False, True, None),
    ],
)
def test_listen_policy(endpoint: str, insecure: bool, refused: bool, warned: str | None) -> None:
    refusal, warning = listen_policy(endpoint, insecure=insecure, opt_in="--opt")
    assert (refusal is not None) == refused
    if refusal is not None:
        assert "refused" in refusal and "ssh -L" in refusal and "--opt" in refusal
        assert "gputop keys" in refusal
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and warned in warning


# ------------------------------------------------------------------ the probe


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_probe_refuses_a_wildcard_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gputop.probe")
    p = Probe(name="wild", listen="tcp://0.0.0.0:*")
    assert not p.enabled and p.endpoint is None
    assert [i for i in p.watch(range(5))] == [0, 1, 2, 3, 4]
    p.close()
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "refused" in warnings[0] and "GPUTOP_INSECURE=1" in warnings[0]
    assert "Training continues unmonitored" in warnings[0]


def test_gputop_insecure_opts_in(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gputop.probe")
    monkeypatch.setenv("GPUTOP_INSECURE", "1")
    p = Probe(name="wild", listen="tcp://0.0.0.0:*")
    assert p.enabled and p.endpoint is not None and p.endpoint.startswith("tcp://0.0.0.0:")
    p.close()
    assert any("anyone who can reach this host" in w for w in _warnings(caplog))


def test_gputop_insecure_0_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTOP_INSECURE", "0")
    p = Probe(name="wild", listen="tcp://*:*")
    assert not p.enabled
    p.close()


def test_loopback_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gputop.probe")
    for _ in range(2):
        p = Probe(name="lo", listen="tcp://127.0.0.1:*")
        assert p.enabled
        p.close()
    warnings = [w for w in _warnings(caplog) if "every user of this host" in w]
    assert len(warnings) == 1, _warnings(caplog)
    assert "ipc" in warnings[0]


def test_the_default_ipc_socket_is_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gputop.probe")
    p = Probe(name="quiet")
    assert p.enabled
    p.close()
    assert _warnings(caplog) == []


# ------------------------------------------------------------------ the agent


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:*", "tcp://*:*", "tcp://10.0.0.7:5555"])
def test_agent_refuses_the_network_without_insecure(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["agent", "--listen", endpoint]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "refused" in err and "--insecure" in err and "ssh -L" in err
    assert "Traceback" not in err


def test_agent_with_insecure_publishes_on_all_interfaces() -> None:
    command = ["agent", "--listen", "tcp://0.0.0.0:*", "--insecure", "--interval", "0.2"]
    agent = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl.tui.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert "publishing on tcp://0.0.0.0:" in line
    finally:
        agent.send_signal(2)
        try:
            _, err = agent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, err = agent.communicate()
            pytest.fail(f"the agent did not stop on SIGINT: {err}")
    assert agent.returncode == 0
    assert "anyone who can reach this host" in err


# ------------------------------------------------------------------ peer cap


def _connected(subs: list[zmq.Socket[bytes]], pub: Publisher, seconds: float) -> list[bool]:
    """Serve the publisher for a while, sending a message every 50 ms; which subs got one."""
    got = [False] * len(subs)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pub.wait(0.05)
        pub.send([b"gputop.x", b"payload"])
        for i, sub in enumerate(subs):
            while sub.poll(0):
                sub.recv_multipart()
                got[i] = True
    return got


def _sub(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"gputop.")
    sub.connect(endpoint)
    return sub


def test_at_most_max_peers_are_let_in_and_a_place_frees_up() -> None:
    pub = Publisher("tcp://127.0.0.1:*", max_peers=3)
    ctx = zmq.Context()
    try:
        first = []
        for _ in range(3):  # one after the other: each is let in
            first.append(_sub(ctx, pub.endpoint))
            assert _connected(first[-1:], pub, 0.3) == [True]
        late = [_sub(ctx, pub.endpoint) for _ in range(3)]
        assert _connected([*first, *late], pub, 1.0) == [True] * 3 + [False] * 3
        # Each late one refused at least once (zmq may try again within the second).
        assert pub.refused >= 3
        assert pub.peers == 3  # the refused ones were closed
        # Two leave: two places for newcomers.
        first[0].close()
        first[1].close()
        newcomers = [_sub(ctx, pub.endpoint) for _ in range(2)]
        time.sleep(0.2)
        assert _connected(newcomers, pub, 1.0) == [True, True]
        assert pub.peers <= 3
    finally:
        pub.close()
        ctx.destroy(linger=0)


def test_the_viewer_gets_in_when_a_place_frees_up() -> None:
    """The viewer's Subscriber is refused while the peers are all taken, and connects
    again by itself (its revival of dropped endpoints) once one leaves."""
    from gputop_dl.probe.transport import Subscriber

    pub = Publisher("tcp://127.0.0.1:*", max_peers=1)
    ctx = zmq.Context()
    viewer = Subscriber()
    try:
        squatter = ctx.socket(zmq.SUB)
        squatter.setsockopt(zmq.LINGER, 0)
        squatter.setsockopt(zmq.SUBSCRIBE, b"")
        squatter.connect(pub.endpoint)
        assert _connected([squatter], pub, 0.5) == [True]
        viewer.connect(pub.endpoint)
        received = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pub.wait(0.05)
            pub.send([b"gputop.x", b"payload"])
            received += len(viewer.receive(0.0))
        assert received == 0
        squatter.close()
        end = time.monotonic() + 5.0
        while time.monotonic() < end and not received:
            pub.wait(0.05)
            pub.send([b"gputop.x", b"payload"])
            received += len(viewer.receive(0.0))
        assert received > 0
    finally:
        viewer.close()
        pub.close()
        ctx.destroy(linger=0)


BOMB = textwrap.dedent(
    """
    import sys, time, zmq
    endpoint, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 10 * n)  # closed ones are reaped later
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        subs = []
        for _ in range(n):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SUBSCRIBE, b"gputop.")
            s.connect(endpoint)
            subs.append(s)
        time.sleep(0.5)
        for s in subs:
            s.close()
    """
)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_subscription_bomb_does_not_grow_the_training_process(tmp_path: Path) -> None:
    """500 subscribers connecting, subscribing and leaving over and over while the probe
    holds a full history: the training process grows by little, and never lets more than
    MAX_PEERS in (a publisher thread replays history to each newcomer)."""
    p = Probe(name="bombed", listen="tcp://127.0.0.1:*", system_interval_s=0)
    assert p.enabled and p.endpoint is not None
    for _ in p.watch(range(20_000)):
        pass
    time.sleep(0.5)  # published: the history is full
    before = _rss()
    script = tmp_path / "bomb.py"
    script.write_text(BOMB)
    bomb = subprocess.Popen([sys.executable, str(script), p.endpoint, "500", "6"])
    peak = 0
    while bomb.poll() is None:
        for _ in p.watch(range(100)):
            pass
        peak = max(peak, _rss() - before)
        time.sleep(0.1)
    assert bomb.returncode == 0
    publisher = p._publisher
    assert publisher is not None
    assert publisher.refused > 0
    p.close()
    assert peak < 64 * 2**20, f"grew by {peak / 2**20:.0f} MiB"


# ------------------------------------------------------ a refused runtime directory


@pytest.fixture
def open_runtime_dir(runtime_dir: Path) -> Path:
    runtime_dir.chmod(0o777)
    return runtime_dir


def test_list_says_why_nothing_is_found(
    open_runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["list"]) == cli.EXIT_NO_RUN
    out, err = capsys.readouterr()
    assert "no probe running" not in out
    assert "refused" in err and "open to other users" in err and "GPUTOP_RUNTIME_DIR" in err


def test_snapshot_says_why_nothing_is_found(
    open_runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["snapshot", "--wait", "0.2"]) == cli.EXIT_NO_RUN
    err = capsys.readouterr().err
    assert "refused" in err and "open to other users" in err


def test_demo_says_why_it_cannot_start(open_runtime_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gputop_dl.tui.cli", "demo", "--no-tui", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == cli.EXIT_NO_RUN
    assert "open to other users" in done.stderr and "GPUTOP_RUNTIME_DIR" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_publisher_sending_an_oversized_frame_is_read_again_after_it() -> None:
    # libzmq drops a peer whose frame exceeds the subscriber's limit (8 MiB); the
    # Subscriber's monitor sees the disconnect and connects again, so the stream goes on.
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        time.sleep(0.3)
        pub.send_multipart([b"gputop.bye", b"x" * (9 * 1024 * 1024)])
        got: list[list[bytes]] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not got:
            pub.send_multipart([b"gputop.bye", b"after"])
            got = [f for f in sub.receive(0.1) if f[1] == b"after"]
        assert got, "the subscriber never read the publisher again"
    finally:
        sub.close()
        pub.close(0)
        ctx.term()
