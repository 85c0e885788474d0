"""New-user audit 51: what a failed handshake is blamed on, GPUTOP_SERVER_KEY, and what
``gputop snapshot`` exits with (nothing reached; Ctrl-C), and the --help exit tables.

Real zmq sockets throughout: a peer that accepts a connection and closes it before the
ZeroMQ handshake is a plain socket (what a killed probe's DataLoader workers, which
inherited its listening socket, are to a viewer that reconnects).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputop_dl.probe.transport import (
    ENV_SERVER_KEY,
    Publisher,
    Subscriber,
    TransportError,
    load_keys,
    new_keypair,
)
from gputop_dl.tui.cli import main
from gputop_dl.tui.events import EndpointState, SourceEvent
from gputop_dl.tui.snapshot import render_text
from gputop_dl.tui.source import ZmqSource
from tests.test_curve import local_address, make_keys


class Closer:
    """Accepts connections on a real socket and closes each at once, before any
    handshake: a peer that goes away mid-handshake."""

    def __init__(self, family: int, address: str | tuple[str, int]) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def ipc_closer(runtime_dir: Path) -> Iterator[str]:
    path = runtime_dir / "4242.sock"
    closer = Closer(socket.AF_UNIX, str(path))
    try:
        yield f"ipc://{path}"
    finally:
        closer.close()


@pytest.fixture
def tcp_closer() -> Iterator[str]:
    closer = Closer(socket.AF_INET, ("127.0.0.1", 0))
    try:
        yield f"tcp://127.0.0.1:{closer.sock.getsockname()[1]}"
    finally:
        closer.close()


def refusal(sub: Subscriber, endpoint: str, seconds: float = 5.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and endpoint not in sub.refusals:
        sub.receive(0.05)
    return sub.refusals.get(endpoint, "")


# ------------------------------------------------------- 1. ipc is never "keys"


def test_a_peer_closing_an_ipc_connection_mid_handshake_is_not_blamed_on_keys(
    ipc_closer: str,
) -> None:
    sub = Subscriber()
    try:
        sub.connect(ipc_closer)
        why = refusal(sub, ipc_closer)
    finally:
        sub.close()
    assert why, "the failed handshake is reported"
    assert "key" not in why.lower() and "CURVE" not in why, why  # no CURVE on ipc
    assert "went away" in why, why


def test_a_failed_handshake_of_a_run_that_ended_is_not_a_problem() -> None:
    """A run killed while its workers held its socket: the viewer's reconnect fails
    mid-handshake, then its record goes. No error for it, ever; a live run's refusal
    is reported once a later discovery still finds the run."""

    class Sub:  # what the source reads of a Subscriber
        def __init__(self) -> None:
            self.refusals: dict[str, str] = {}

        def receive(self, _timeout_s: float) -> list[list[bytes]]:
            return []

        def disconnect(self, endpoint: str) -> None:
            self.refusals.pop(endpoint, None)

    src = ZmqSource(discover=False, local_sampler=False)
    src._last_error, src._eager_until = {}, 0.0
    src._last_local_sample = src._last_foreign_host_sample = 0.0
    src._ended, src._refused = [], {}
    dead, live = "ipc:///run/1.sock", "ipc:///run/2.sock"
    src._known = {dead: "killed", live: "alive"}
    src._last_discover = time.monotonic()
    sub = Sub()
    sub.refusals = {dead: "the connection closed during the handshake", live: "refused"}
    events: list[SourceEvent] = []
    src._iteration(sub, events)  # type: ignore[arg-type]
    assert not [e for e in events if isinstance(e, EndpointState)], events
    # The next discovery: the killed run's record went, the live one is still there.
    del src._known[dead]
    src._ended.append((dead, "killed", time.monotonic()))
    src._last_discover = time.monotonic() + 0.001
    src._iteration(sub, events)  # type: ignore[arg-type]
    src._iteration(sub, events)  # type: ignore[arg-type]
    errors = [(e.endpoint, e.state) for e in events if isinstance(e, EndpointState)]
    assert (dead, "error") not in errors and (live, "error") in errors, errors


# -------------------------------------------------------- 2. GPUTOP_SERVER_KEY


def test_a_malformed_server_key_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_keys(capsys)
    monkeypatch.setenv(ENV_SERVER_KEY, "abc")  # an unquoted key cut at a "$"
    sub = Subscriber()
    try:
        with pytest.raises(TransportError) as caught:
            sub.connect(f"tcp://{local_address()}:5999")
    finally:
        sub.close()
    text = str(caught.value)
    assert ENV_SERVER_KEY in text and "40-character Z85" in text and "single-quoted" in text


def test_the_server_key_may_be_a_certificate_file_s_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README: GPUTOP_SERVER_KEY is "the contents of its gputop.key"."""
    import zmq.auth

    make_keys(capsys)
    public_file, _ = zmq.auth.create_certificates(str(tmp_path), "server")
    server_public, _ = zmq.auth.load_certificate(public_file)
    monkeypatch.setenv(ENV_SERVER_KEY, Path(public_file).read_text())
    keys = load_keys()
    assert keys is not None and keys.server_error is None and keys.server == server_public


def test_a_viewer_with_keys_is_not_told_it_has_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server holds another key than the one expected: the refusal names that."""
    make_keys(capsys)
    pub = Publisher("tcp://0.0.0.0:*")  # CURVE with this user's key
    endpoint = f"tcp://{local_address()}:{pub.endpoint.rpartition(':')[2]}"
    monkeypatch.setenv(ENV_SERVER_KEY, new_keypair()[0].decode())  # not the server's
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and endpoint not in sub.refusals:
            pub.wait(0.02)
            sub.receive(0.05)
        why = sub.refusals.get(endpoint, "")
    finally:
        sub.close()
        pub.close()
    assert why and "has none" not in why, why
    assert "GPUTOP_SERVER_KEY" in why, why


# ----------------------------------------------------- 3, 4. snapshot exit codes


def test_snapshot_exits_1_when_the_only_endpoint_refuses_the_handshake(
    tcp_closer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["snapshot", "--wait", "1.5", tcp_closer]) == 1
    out = capsys.readouterr().out
    assert "None" not in out and "n/a" not in out, out
    assert f"cannot use {tcp_closer}" in out and "no training run found" in out, out
    assert out.count("cannot use") == 1, out  # not again as an "error:" line


def test_render_text_prints_no_none_for_an_endpoint_that_never_spoke() -> None:
    run = {
        "name": "tcp://h:1",
        "placeholder": True,
        "state": "error",
        "host": None,
        "pid": None,
        "connection": "cannot use tcp://h:1: refused",
    }
    snap = {"runs": [run], "errors": ["cannot use tcp://h:1: refused"], "system": None}
    assert "None" not in render_text(snap)


def test_snapshot_interrupted_prints_what_it_has_and_exits_130(runtime_dir: Path) -> None:
    env = dict(os.environ, GPUTOP_RUNTIME_DIR=str(runtime_dir), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl.tui.cli", "snapshot", "--wait", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        time.sleep(4.0)  # past the imports: the wait has begun
        proc.send_signal(signal.SIGINT)
        out, _err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, out)
    assert out.strip(), "what came so far is printed"


# ---------------------------------------------------------- 5. --help epilogs


@pytest.mark.parametrize("command", [[], ["demo"], ["snapshot"], ["list"]])
def test_commands_that_do_not_listen_say_nothing_of_listening(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    assert "exit status:" in text and "--insecure" not in text and "130 SIGINT" in text


def test_agent_help_says_keys_or_insecure(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "without CURVE keys (gputop keys) or --insecure" in text, text
    assert "stopped by hand" in text
