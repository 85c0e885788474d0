"""The publisher's sends through libzmq with the GIL held (transport.held_send): real
sockets on loopback, the bytes a subscriber gets, and the GIL a busy thread keeps."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from gil import progress_during

from gputop_dl import probe
from gputop_dl.probe import transport
from gputop_dl.probe.protocol import TOPIC_PREFIX
from gputop_dl.probe.transport import Publisher, Subscriber

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")


def attached(pub: Publisher) -> Subscriber:
    """A subscriber that the publisher has heard subscribe (PUB drops what it sends
    before that)."""
    sub = Subscriber()
    sub.connect(pub.endpoint)
    end = time.monotonic() + 10
    while not pub.wait(0.1) and time.monotonic() < end:
        pass
    return sub


def received(sub: Subscriber, count: int) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    end = time.monotonic() + 10
    while len(got) < count and time.monotonic() < end:
        got += sub.receive(0.1)
    return got


@linux
def test_messages_sent_with_the_gil_held_arrive_frame_for_frame() -> None:
    pub = Publisher("tcp://127.0.0.1:*")
    try:
        assert pub._held_send is not None, "pyzmq's libzmq not found: the held path is untested"
        sub = attached(pub)
        topic = TOPIC_PREFIX + b"steps"
        messages: list[list[bytes]] = [
            [topic, b"plain"],
            [topic, b""],  # an empty frame
            [topic, b"\x00" * 7 + b"nul inside"],  # not a C string: sent by its length
            [topic, os.urandom(3_000_000)],  # larger than any buffer on the way
            [topic, b"a", b"b", b"c"],  # more than two frames
        ]
        for frames in messages:
            assert pub.send(frames)
        # bytes-like frames are sent as their bytes, as pyzmq does
        assert pub.send([topic, bytearray(b"bytearray")])  # type: ignore[list-item]
        assert pub.send([topic, memoryview(b"memoryview")])  # type: ignore[list-item]
        got = received(sub, len(messages) + 2)
        assert got == [*messages, [topic, b"bytearray"], [topic, b"memoryview"]]
        sub.close()
    finally:
        pub.close()
    assert pub._held_send is None  # nothing may use the closed socket's handle


@linux
def test_a_socket_of_another_libzmq_is_sent_by_pyzmq(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket's vtable must point into the one libzmq file mapped: where it does
    not (libzmq linked into pyzmq's extension, another copy loaded), pyzmq sends."""
    found = transport._mapped_libzmq()
    assert found is not None
    path, _ranges = found
    monkeypatch.setattr(transport, "_mapped_libzmq", lambda: (path, [(0, 1)]))
    pub = Publisher("tcp://127.0.0.1:*")
    try:
        assert pub._held_send is None
        sub = attached(pub)
        assert pub.send([TOPIC_PREFIX + b"steps", b"by pyzmq"])
        assert received(sub, 1) == [[TOPIC_PREFIX + b"steps", b"by pyzmq"]]
        sub.close()
    finally:
        pub.close()
    monkeypatch.setattr(transport, "_mapped_libzmq", lambda: None)  # none, or two files
    pub = Publisher("tcp://127.0.0.1:*")
    try:
        assert pub._held_send is None
    finally:
        pub.close()


def test_a_full_queue_drops_the_message_and_says_so() -> None:
    """XPUB with NODROP returns EAGAIN at the high-water mark: the message is dropped,
    send() says False, and later messages still go out whole."""
    pub = Publisher("tcp://127.0.0.1:*", send_hwm=2)
    try:
        pub._sock.setsockopt(zmq.XPUB_NODROP, 1)
        sub = attached(pub)
        topic = TOPIC_PREFIX + b"steps"
        results = [pub.send([topic, b"%d" % i + b"x" * 100_000]) for i in range(200)]
        assert not all(results), "the queue of 2 never filled"
        sent = [i for i, ok in enumerate(results) if ok]
        got = received(sub, len(sent))
        assert [frames[1][: len(b"%d" % i)] for frames, i in zip(got, sent, strict=True)] == [
            b"%d" % i for i in sent
        ]
        sub.close()
    finally:
        pub.close()


READER = """
import sys, zmq
s = zmq.Context().socket(zmq.SUB)
s.connect(sys.argv[1])
s.subscribe(b"")
while True:
    s.recv()
"""


@linux
def test_a_watched_training_thread_keeps_the_gil_while_the_probe_publishes() -> None:
    """pyzmq lets go of the GIL around each frame it sends. When the training thread has
    asked for the GIL back meanwhile, it takes it there, and the publisher waits the
    switch interval (5 ms) for it again: a context switch of the training thread per
    frame. At ~30,000 steps a second the publisher sends 4 steps messages of two frames
    5 times a second: 44-73 switches a second of the training thread through pyzmq here,
    7-8 with the GIL held (bench/publisher_gil.py)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a released GIL is not taken by the other thread at once")
    p = probe.Probe(name="gil", listen="tcp://127.0.0.1:*", system_interval_s=0)
    reader = subprocess.Popen([sys.executable, "-c", READER, p.endpoint])
    try:
        assert p._publisher is not None and p._publisher._held_send is not None
        time.sleep(1.0)  # the reader attached: the probe is watched

        def switches() -> int:
            with open("/proc/thread-self/status") as f:
                return next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt"))

        batches = [(np.zeros((32, 3)), np.zeros(32))] * 1_000_000
        steps, s0, t0 = 0, switches(), time.monotonic()
        for _batch in p.watch(batches):
            x = 0
            for i in range(1_200):  # a training step's Python
                x += i
            steps += 1
            if steps % 500 == 0 and time.monotonic() - t0 > 3.0:
                break
        seconds = time.monotonic() - t0
        rate = (switches() - s0) / seconds
    finally:
        reader.kill()
        reader.wait()
        p.close()
    assert steps / seconds > 5_000, f"{steps / seconds:.0f} steps/s: too slow to publish often"
    assert rate < 25, f"{rate:.1f} switches a second of the training thread"


@linux
def test_no_other_thread_runs_python_during_a_send() -> None:
    """pyzmq copies a frame with the GIL released (its memcpy, then zmq_msg_send), and
    a busy thread runs Python meanwhile; held, it does not. (pyzmq: 5 of 5 sends let it
    run.)"""
    pub = Publisher("tcp://127.0.0.1:*")
    frames = [TOPIC_PREFIX + b"steps", os.urandom(8_000_000)]
    try:
        sub = attached(pub)
        moved = progress_during(lambda: pub.send(frames))
        assert len(received(sub, 5)) == 5
        sub.close()
    finally:
        pub.close()
    assert moved == [0] * 5, f"the busy thread ran during sends: {moved}"
