"""Authenticated TCP: ``gputop keys``, and CURVE + ZAP on real sockets.

A network endpoint (bound on 0.0.0.0) is reached through this machine's own
non-loopback address, so the client takes the network path (CURVE). The right key
receives; a wrong key or none receives nothing, and the server counts the refusal.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gputop_dl.probe.messages import Hello
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.probe.transport import (
    AUTHORIZED_FILE,
    KEY_FILE,
    CurveKeys,
    Publisher,
    Subscriber,
    is_key,
    keys_dir,
    listen_policy,
    load_keys,
    new_keypair,
    parse_authorized,
)
from gputop_dl.tui.cli import main

HELLO = encode(Hello("curve:1", "probe", "secret run", "h", 1, 0.0, "0"))


def local_address() -> str:
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family.name == "AF_INET" and not addr.address.startswith("127."):
                return str(addr.address)
    pytest.skip("this machine has no non-loopback IPv4 address to test the network path")


def make_keys(capsys: pytest.CaptureFixture[str]) -> CurveKeys:
    assert main(["keys"]) == 0
    capsys.readouterr()
    keys = load_keys()
    assert keys is not None
    return keys


def other_keys(server: bytes) -> CurveKeys:
    public, secret = new_keypair()
    return CurveKeys(public, secret, frozenset(), server)


@pytest.fixture
def publisher(capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[Publisher, str, CurveKeys]]:
    keys = make_keys(capsys)
    pub = Publisher("tcp://0.0.0.0:*")
    port = pub.endpoint.rpartition(":")[2]
    try:
        yield pub, f"tcp://{local_address()}:{port}", keys
    finally:
        pub.close()


def received(pub: Publisher, sub: Subscriber, seconds: float) -> list[object]:
    got: list[object] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not got:
        pub.wait(0.05)
        pub.send(HELLO)
        got.extend(decode(m) for m in sub.receive(0.1))
    return got


# ------------------------------------------------------------------ gputop keys


def test_keys_are_written_private_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys"]) == 0
    first = capsys.readouterr().out
    directory = keys_dir()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for name in (KEY_FILE, AUTHORIZED_FILE):
        assert stat.S_IMODE(os.stat(directory / name).st_mode) == 0o600
    keys = load_keys()
    assert keys is not None and keys.public in keys.authorized
    assert keys.public.decode() in first and "created" in first
    assert main(["keys"]) == 0  # again: the same pair, listed once
    again = capsys.readouterr().out
    assert "created" not in again and load_keys() == keys
    other, _ = new_keypair()
    assert main(["keys", "--authorize", other.decode()]) == 0
    refreshed = load_keys()
    assert refreshed is not None and refreshed.authorized == {keys.public, other}
    assert main(["keys", "--authorize", "not-a-key"]) == 2


def test_a_key_beginning_with_a_dash_is_authorized(capsys: pytest.CaptureFixture[str]) -> None:
    """Z85 digits include "-": argparse took such a key for an option (found by CI, where
    a random key began with one)."""
    other = b"-" + new_keypair()[0][1:]
    while not is_key(other):
        other = b"-" + new_keypair()[0][1:]
    assert main(["keys", "--authorize", other.decode()]) == 0
    keys = load_keys()
    assert keys is not None and other in keys.authorized


def test_authorized_keys_parsing() -> None:
    key, _ = new_keypair()
    hashed = key
    while b"#" not in hashed:  # "#" is a Z85 digit: a key may hold one
        hashed, _ = new_keypair()
    text = f"# comment\n\n{key.decode()}  # me\n{hashed.decode()}\nshort\n{key.decode()}x\n"
    assert parse_authorized(text) == {key, hashed}


def test_unreadable_keys_are_no_keys(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_text("garbage")
    assert load_keys(tmp_path) is None
    assert load_keys(tmp_path / "missing") is None


# ------------------------------------------------------------------- the wire


def test_right_key_receives(publisher: tuple[Publisher, str, CurveKeys]) -> None:
    pub, endpoint, keys = publisher
    assert pub.keys == keys  # a network endpoint with keys: CURVE
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        got = received(pub, sub, 10)
    finally:
        sub.close()
    assert got and got[0] == decode(HELLO)


def test_wrong_key_receives_nothing(publisher: tuple[Publisher, str, CurveKeys]) -> None:
    pub, endpoint, keys = publisher
    sub = Subscriber(other_keys(keys.public))
    try:
        sub.connect(endpoint)
        assert received(pub, sub, 3) == []
        # ... and it says why (a viewer showed "connecting" for ever, snapshot "no run")
        assert sub.refusals.get(endpoint, "").startswith("authentication failed"), sub.refusals
    finally:
        sub.close()
    assert pub.denied > 0  # turned away by the ZAP check, at the handshake


def test_no_key_receives_nothing(
    publisher: tuple[Publisher, str, CurveKeys], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pub, endpoint, _keys = publisher
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # this client has no keys
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        assert received(pub, sub, 3) == []
        why = sub.refusals.get(endpoint, "")
        # NO_DETAIL or PROTOCOL, as the handshake's messages cross: both name the keys
        assert why.startswith("the security handshake failed") and "gputop keys" in why, why
    finally:
        sub.close()


def test_curve_and_plain_endpoints_on_one_subscriber(
    publisher: tuple[Publisher, str, CurveKeys],
) -> None:
    """Security is per connection: after a CURVE connect the socket is plain again."""
    pub, endpoint, _keys = publisher
    plain = Publisher("tcp://127.0.0.1:*")
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        sub.connect(plain.endpoint)
        other = encode(Hello("plain:2", "probe", "plain", "h", 2, 0.0, "0"))
        seen: set[str] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(seen) < 2:
            pub.wait(0.02)
            plain.wait(0.02)
            pub.send(HELLO)
            plain.send(other)
            seen.update(decode(m).source_id for m in sub.receive(0.1))
        assert seen == {"curve:1", "plain:2"}
    finally:
        sub.close()
        plain.close()


# ------------------------------------------------------------------ the policy


def test_listen_policy_with_and_without_keys(capsys: pytest.CaptureFixture[str]) -> None:
    refusal, _ = listen_policy("tcp://0.0.0.0:5555", insecure=False, opt_in="--insecure")
    assert refusal is not None and "gputop keys" in refusal
    make_keys(capsys)
    assert listen_policy("tcp://0.0.0.0:5555", insecure=False, opt_in="--insecure") == (
        None,
        None,
    )
    # Loopback is not CURVE-protected: still the warning that every local user reads it.
    _, warning = listen_policy("tcp://127.0.0.1:5555", insecure=False, opt_in="--insecure")
    assert warning is not None and "every user of this host" in warning


@pytest.mark.parametrize("insecure", [False, True])
def test_a_listen_address_without_a_scheme_is_not_called_a_network_address(
    insecure: bool,
) -> None:
    """GPUTOP_LISTEN=garbage was refused as a network address without keys."""
    refusal, warning = listen_policy("garbage", insecure=insecure, opt_in="--insecure")
    assert warning is None
    assert refusal is not None and "'garbage': not an endpoint (tcp://" in refusal, refusal


def test_agent_on_the_network_with_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """``gputop agent --listen tcp://0.0.0.0:*`` starts once keys exist; a viewer with
    the key reads its samples through the network address."""
    make_keys(capsys)
    agent = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "agent", "--listen", "tcp://0.0.0.0:*"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline().decode()
        assert "publishing on tcp://0.0.0.0:" in line, agent.stderr.read() if agent.stderr else ""
        port = line.strip().rpartition(":")[2]
        sub = Subscriber()
        try:
            sub.connect(f"tcp://{local_address()}:{port}")
            got: list[object] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not got:
                got.extend(decode(m) for m in sub.receive(0.2))
        finally:
            sub.close()
        assert got
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_relay_on_the_network_admits_only_authorized_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``gputop relay --listen tcp://0.0.0.0:PORT`` with keys: CURVE + ZAP in the relay
    (pyzmq's authenticator); the key holder reads the node's probe, a stranger nothing."""
    keys = make_keys(capsys)
    probe = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "fakes" / "node_probe.py"), "n1", "p"],
        stdout=subprocess.PIPE,
    )
    relay = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "relay", "--listen", "tcp://0.0.0.0:*"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert probe.stdout is not None and probe.stdout.readline().strip() == b"ready"
        assert relay.stdout is not None
        line = relay.stdout.readline().decode()
        assert "publishing on tcp://0.0.0.0:" in line, relay.stderr.read() if relay.stderr else ""
        endpoint = f"tcp://{local_address()}:{line.strip().rpartition(':')[2]}"
        results = []
        for client in (Subscriber(other_keys(keys.public)), Subscriber()):
            try:
                client.connect(endpoint)
                got: list[object] = []
                deadline = time.monotonic() + 6
                while time.monotonic() < deadline and not got:
                    got.extend(decode(m) for m in client.receive(0.2))
                results.append(got)
            finally:
                client.close()
        stranger, holder = results
        assert stranger == []
        assert any(isinstance(m, Hello) and m.host == "n1" for m in holder)
    finally:
        for proc in (relay, probe):
            proc.kill()
            proc.wait()
