"""ZeroMQ sockets: the only module in gputop that imports zmq.

The publisher side never blocks: NOBLOCK sends, a small high-water mark and linger 0,
so a slow, absent or killed subscriber costs the training process nothing but dropped
messages (which are counted and reported in the stream itself).
"""

from __future__ import annotations

import contextlib
import threading
import time

import zmq

from gputop_dl.probe.protocol import TOPIC_PREFIX

SEND_HWM = 64  # messages queued per subscriber before we drop: ~6 s of step batches
RECV_HWM = 10_000


class TransportError(Exception):
    """An endpoint could not be bound or connected; the message says why."""


class Publisher:
    """A bound PUB socket. Not thread-safe: use it from one thread only."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # A private context: the training process may use zmq itself, and we must be able
        # to tear ours down without touching theirs.
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise TransportError(f"cannot listen on {endpoint}: {exc.strerror}") from None
        # With a wildcard port ("tcp://127.0.0.1:*") the real address is known only now.
        last = self._sock.getsockopt(zmq.LAST_ENDPOINT)
        if isinstance(last, bytes) and last:
            self.endpoint = last.decode()

    def send(self, frames: list[bytes]) -> bool:
        """Queue one message; False if it had to be dropped (never blocks)."""
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            return False
        except zmq.ZMQError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.close(linger=0)
        with contextlib.suppress(Exception):
            self._ctx.term()


class Subscriber:
    """A SUB socket connected to any number of endpoints (used by the viewer)."""

    def __init__(self) -> None:
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Bound the size of any one frame before it is even read into memory.
        self._sock.setsockopt(zmq.MAXMSGSIZE, 8 * 1024 * 1024)
        self._sock.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
        # libzmq drops a peer that sends a frame over MAXMSGSIZE as a protocol error and,
        # unlike after a network error, never reconnects: one hostile or buggy frame would
        # cut the viewer off for good. The monitor tells which endpoint was dropped.
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._dropped: set[str] = set()
        self._revived: dict[str, float] = {}  # endpoint -> monotonic time of last revival
        self._lock = threading.Lock()
        self.endpoints: set[str] = set()

    def connect(self, endpoint: str) -> None:
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            raise TransportError(f"cannot connect to {endpoint}: {exc.strerror}") from None
        self.endpoints.add(endpoint)

    def disconnect(self, endpoint: str) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disconnect(endpoint)
        self.endpoints.discard(endpoint)
        self._revived.pop(endpoint, None)

    def receive(self, timeout_s: float, max_messages: int = 1000) -> list[list[bytes]]:
        """Wait up to ``timeout_s`` for messages; return all that are ready (bounded)."""
        out: list[list[bytes]] = []
        self._revive_dropped()
        if not self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return out
        while len(out) < max_messages:
            try:
                out.append(self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=True))
            except zmq.Again:
                break
        return out

    def _revive_dropped(self) -> None:
        """Connect again to endpoints the socket dropped (at most once a second each: a
        peer that keeps sending oversized frames must not make us spin)."""
        while True:
            try:
                frames = self._monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # zmq.Again: no event waiting
                break
            endpoint = frames[-1].decode(errors="replace") if len(frames) == 2 else ""
            if endpoint in self.endpoints:
                self._dropped.add(endpoint)
        now = time.monotonic()
        for endpoint in list(self._dropped):
            if endpoint not in self.endpoints:
                self._dropped.discard(endpoint)
            elif now - self._revived.get(endpoint, -1e9) >= 1.0:
                self._dropped.discard(endpoint)
                self._revived[endpoint] = now
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.disconnect(endpoint)
                    self._sock.connect(endpoint)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        with contextlib.suppress(Exception):
            self._monitor.close(linger=0)
        with contextlib.suppress(Exception):
            self._sock.close(linger=0)
        with contextlib.suppress(Exception):
            self._ctx.term()
