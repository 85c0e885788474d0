"""ZeroMQ sockets: the only module in gputop that imports zmq.

The publisher side never blocks: NOBLOCK sends, a small high-water mark and linger 0,
so a slow, absent or killed subscriber costs the training process nothing but dropped
messages (which are counted and reported in the stream itself). What subscribers send
(subscription notices) is size-capped and read in bounded batches.
"""

from __future__ import annotations

import contextlib
import threading
import time

import zmq

from gputop_dl.probe.protocol import TOPIC_PREFIX

SEND_HWM = 64  # messages queued per subscriber before we drop: ~6 s of step batches
RECV_HWM = 10_000
# Subscription notices kept queued for the publisher thread; a flood beyond this is
# dropped by libzmq, which only delays a replay (notices are coalesced anyway).
SUB_NOTICE_HWM = 1000


class TransportError(Exception):
    """An endpoint could not be bound or connected; the message says why."""


class Publisher:
    """A bound XPUB socket. Not thread-safe: use it from one thread only, except
    :meth:`wake`, which any thread may call (it has its own socket).

    XPUB is PUB that also tells the publisher about subscriptions: with XPUB_VERBOSE every
    SUBSCRIBE is reported, even a repeated one, which is what lets the probe send its
    history to a subscriber that just attached (:meth:`wait` returns the count).
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # A private context: the training process may use zmq itself, and we must be able
        # to tear ours down without touching theirs.
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._sock.setsockopt(zmq.RCVHWM, SUB_NOTICE_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        # Nothing a peer sends may grow this process: subscribe frames are a few bytes.
        self._sock.setsockopt(zmq.MAXMSGSIZE, 256)
        # Waking the publisher thread early (close) without a shared Event and a timeout.
        self._wake_addr = f"inproc://gputop-wake-{id(self)}"
        self._wake_rx = self._ctx.socket(zmq.PAIR)
        self._wake_rx.setsockopt(zmq.LINGER, 0)
        self._wake_rx.bind(self._wake_addr)
        self._wake_tx: zmq.Socket[bytes] | None = None
        self._wake_lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_rx, zmq.POLLIN)
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
        except zmq.ZMQError:  # zmq.Again (queue full) included
            return False
        return True

    def wait(self, timeout_s: float, max_notices: int = SUB_NOTICE_HWM) -> int:
        """Sleep until ``timeout_s`` passes, :meth:`wake` is called or subscribers
        (re)subscribe; return how many subscription notices arrived (bounded)."""
        try:
            ready = dict(self._poller.poll(int(timeout_s * 1000)))
        except zmq.ZMQError:
            return 0
        if self._wake_rx in ready:
            with contextlib.suppress(zmq.ZMQError):
                while True:
                    self._wake_rx.recv(zmq.NOBLOCK)
        subscribed = 0
        if self._sock in ready:
            for _ in range(max_notices):
                try:
                    notice = self._sock.recv(zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                if notice[:1] == b"\x01":  # \x01 + topic = subscribe, \x00 = unsubscribe
                    subscribed += 1
        return subscribed

    def wake(self) -> None:
        """Make a pending :meth:`wait` return now (callable from any thread)."""
        with self._wake_lock, contextlib.suppress(Exception):
            if self._wake_tx is None:
                self._wake_tx = self._ctx.socket(zmq.PAIR)
                self._wake_tx.setsockopt(zmq.LINGER, 0)
                self._wake_tx.connect(self._wake_addr)
            self._wake_tx.send(b"", zmq.NOBLOCK)

    def close(self) -> None:
        with self._wake_lock:
            for sock in (self._sock, self._wake_rx, self._wake_tx):
                if sock is not None:
                    with contextlib.suppress(Exception):
                        sock.close(linger=0)
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
