"""``gputop relay``: real probes (subprocesses), a real relay process, real sockets.

Two probes through one relay; a late attacher gets history through it (and a second
late attacher too: the relay forwards every subscription upstream); the relay killed
and restarted; the stdio framing, its bounds and how the relay ends on stdio.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gputop_dl.probe import discovery
from gputop_dl.probe.messages import Hello, Steps
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.probe.transport import Forwarder, Publisher, Subscriber
from gputop_dl.tui.relay import (
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_FRAMES,
    FrameReader,
    FramingError,
    frame_message,
    upstreams,
)

NODE_PROBE = str(Path(__file__).parent / "fakes" / "node_probe.py")


def start(args: list[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def node_probe(procs: list[subprocess.Popen[bytes]], host: str, name: str) -> None:
    proc = start([NODE_PROBE, host, name], stdout=subprocess.PIPE)
    procs.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"


def relay(procs: list[subprocess.Popen[bytes]], *extra: str) -> str:
    proc = start(["-m", "gputop_dl", "relay", *extra], stdout=subprocess.PIPE)
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("gputop relay publishing on "), line
    return line.split(" on ", 1)[1].strip()


def collect(
    sub: Subscriber, until: Callable[[list[object]], bool], timeout_s: float = 15.0
) -> list[object]:
    got: list[object] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(got):
        got.extend(decode(frames) for frames in sub.receive(0.1))
    return got


def first_indices(messages: list[object]) -> dict[str, int]:
    """Per source, the lowest step index received."""
    low: dict[str, int] = {}
    for m in messages:
        if isinstance(m, Steps) and m.records:
            low[m.source_id] = min(low.get(m.source_id, 1 << 30), m.records[0].index)
    return low


def hellos(messages: list[object]) -> set[str]:
    return {m.source_id for m in messages if isinstance(m, Hello)}


# ------------------------------------------------------------------- the relay


def test_two_probes_on_one_node_through_one_relay(procs: list[subprocess.Popen[bytes]]) -> None:
    node_probe(procs, "node1", "rank0")
    node_probe(procs, "node1", "rank1")
    endpoint = relay(procs)
    records = {r.role: r for r in discovery.discover()}
    assert records["relay"].endpoint == endpoint  # registered: gputop list shows it
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        got = collect(sub, lambda g: len(first_indices(g)) == 2 and len(hellos(g)) == 2)
    finally:
        sub.close()
    names = {m.name for m in got if isinstance(m, Hello)}
    assert names == {"rank0", "rank1"}
    assert {m.host for m in got if isinstance(m, Hello)} == {"node1"}


def test_late_attachers_get_history_through_the_relay(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    node_probe(procs, "node1", "early")
    endpoint = relay(procs)
    time.sleep(2.0)  # steps are published (to nobody) before anyone attaches
    first = Subscriber()
    second = Subscriber()
    try:
        first.connect(endpoint)
        got = collect(first, lambda g: 0 in first_indices(g).values())
        assert min(first_indices(got).values()) == 0  # the probe replayed from step 0
        # The relay is subscribed upstream already: only XPUB_VERBOSE on the relay
        # makes this second subscription reach the probe, and so its replay.
        time.sleep(1.0)
        second.connect(endpoint)
        got2 = collect(second, lambda g: 0 in first_indices(g).values())
        assert min(first_indices(got2).values()) == 0
    finally:
        first.close()
        second.close()


def test_relay_killed_and_restarted(procs: list[subprocess.Popen[bytes]]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    node_probe(procs, "node1", "survivor")
    relay(procs, "--listen", endpoint)
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        assert first_indices(collect(sub, lambda g: bool(first_indices(g))))
        procs[-1].kill()  # kill -9: no goodbye, the socket just goes
        procs[-1].wait()
        assert relay(procs, "--listen", endpoint) == endpoint
        # The viewer reconnects by itself and the probe replays its history again.
        got = collect(sub, lambda g: 0 in first_indices(g).values())
        assert 0 in first_indices(got).values()
    finally:
        sub.close()


def test_forwarder_follows_its_upstreams() -> None:
    """Added upstreams are heard; a removed one no more (in-process, real sockets)."""
    a, b = Publisher("tcp://127.0.0.1:*"), Publisher("tcp://127.0.0.1:*")
    fwd = Forwarder()
    try:
        fwd.set_upstreams([a.endpoint, b.endpoint])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (a.wait(0.05) + b.wait(0.05)) < 2:
            pass  # both saw the relay subscribe
        hello_a = encode(Hello("a:1", "probe", "a", "h", 1, 0.0, "0"))
        hello_b = encode(Hello("b:2", "probe", "b", "h", 2, 0.0, "0"))
        a.send(hello_a)
        b.send(hello_b)
        got = {decode(m).source_id for m in _receive(fwd, 2)}
        assert got == {"a:1", "b:2"}
        assert fwd.set_upstreams([a.endpoint]) == (set(), {b.endpoint})
        time.sleep(0.3)
        b.send(hello_b)
        a.send(hello_a)
        assert {decode(m).source_id for m in _receive(fwd, 1)} == {"a:1"}
        time.sleep(0.3)
        assert not fwd.receive(0.3)
    finally:
        fwd.close()
        a.close()
        b.close()


def _receive(fwd: Forwarder, count: int) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    deadline = time.monotonic() + 10
    while len(out) < count and time.monotonic() < deadline:
        out.extend(fwd.receive(0.1))
    return out


def test_relays_never_relay_relays() -> None:
    records = [
        discovery.Record("ipc:///x/1.sock", 1, "h", "p", "probe", 0.0),
        discovery.Record("ipc:///x/2.sock", 2, "h", "a", "agent", 0.0),
        discovery.Record("ipc:///x/3.sock", 3, "h", "r", "relay", 0.0),
        discovery.Record("ipc:///x/4.sock", 4, "h", "me", "probe", 0.0),
    ]
    assert upstreams(records, own_pid=4) == {"ipc:///x/1.sock", "ipc:///x/2.sock"}


# ------------------------------------------------------------------ stdio mode


def test_stdio_relay_streams_frames_and_ends_with_its_input(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    node_probe(procs, "node1", "piped")
    proc = start(
        ["-m", "gputop_dl", "relay", "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    procs.append(proc)
    assert proc.stdout is not None and proc.stdin is not None
    reader = FrameReader(proc.stdout)
    assert reader.read_magic() == b""
    kinds = set()
    while not {"Hello", "Steps"} <= kinds:
        frames = reader.read_message()
        assert frames is not None
        kinds.add(type(decode(frames)).__name__)
    proc.stdin.close()  # ssh closes it when the viewer goes
    assert proc.wait(timeout=10) == 0


def test_stdio_relay_ends_cleanly_when_its_reader_goes(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    node_probe(procs, "node1", "piped")
    read_fd, write_fd = os.pipe()
    proc = start(
        ["-m", "gputop_dl", "relay", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=write_fd,
        stderr=subprocess.PIPE,
    )
    procs.append(proc)
    os.close(write_fd)
    assert os.read(read_fd, len(MAGIC)) == MAGIC
    os.close(read_fd)  # EPIPE at its next write
    assert proc.wait(timeout=15) == 0
    assert proc.stderr is not None
    assert b"Traceback" not in proc.stderr.read()


def test_relay_refuses_the_network_without_keys(procs: list[subprocess.Popen[bytes]]) -> None:
    proc = start(
        ["-m", "gputop_dl", "relay", "--listen", "tcp://0.0.0.0:*"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    procs.append(proc)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert b"gputop keys" in err and b"--insecure" in err


def test_relay_stops_on_sigterm(procs: list[subprocess.Popen[bytes]]) -> None:
    endpoint = relay(procs)
    procs[-1].send_signal(signal.SIGTERM)
    assert procs[-1].wait(timeout=10) == 128 + signal.SIGTERM
    assert not [r for r in discovery.discover() if r.endpoint == endpoint]


# --------------------------------------------------------------------- framing


def framed(*messages: list[bytes]) -> io.BytesIO:
    return io.BytesIO(MAGIC + b"".join(frame_message(m) for m in messages))


def test_framing_round_trip() -> None:
    frames = encode(Hello("h:1", "probe", "n", "h", 1, 0.0, "0"))
    reader = FrameReader(framed(frames, [b"a", b""]))
    assert reader.read_magic() == b""
    assert reader.read_message() == frames
    assert reader.read_message() == [b"a", b""]
    assert reader.read_message() is None


def test_noise_before_the_stream_is_skipped() -> None:
    stream = io.BytesIO(b"Welcome to node1\nlast login: never\n" + MAGIC + frame_message([b"x"]))
    reader = FrameReader(stream)
    assert reader.read_magic() == b"Welcome to node1\nlast login: never\n"
    assert reader.read_message() == [b"x"]


U32 = struct.Struct(">I")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (U32.pack(0), "bad frame count 0"),
        (U32.pack(MAX_FRAMES + 1), "bad frame count"),
        (U32.pack(1) + U32.pack(MAX_FRAME_BYTES + 1), "exceeds"),
        (U32.pack(0xFFFFFFFF), "bad frame count"),
        (U32.pack(1) + U32.pack(10) + b"abc", "ended inside a frame"),
        (U32.pack(2) + U32.pack(1) + b"a", "ended inside a message"),
        (b"\x00\x00", "ended inside a frame count"),
    ],
)
def test_malformed_streams_are_refused(body: bytes, why: str) -> None:
    reader = FrameReader(io.BytesIO(MAGIC + body))
    reader.read_magic()
    with pytest.raises(FramingError, match=why):
        reader.read_message()


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"", "ended before"),
        (b"bash: gputop: command not found\n", "command not found"),
        (b"x" * 70_000 + b"\n" + MAGIC, "other output"),
    ],
)
def test_no_stream(stream: bytes, why: str) -> None:
    with pytest.raises(FramingError, match=why):
        FrameReader(io.BytesIO(stream)).read_magic()


def test_frame_message_refuses_what_the_reader_would() -> None:
    with pytest.raises(FramingError):
        frame_message([])
    with pytest.raises(FramingError):
        frame_message([b"x"] * (MAX_FRAMES + 1))
