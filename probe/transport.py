"""ZeroMQ sockets: the only module in gputop that imports zmq.

The publisher side never blocks: NOBLOCK sends, a small high-water mark and linger 0,
so a slow, absent or killed subscriber costs the training process nothing but dropped
messages (which are counted and reported in the stream itself). What subscribers send
(subscription notices) is size-capped and read in bounded batches.

Who may connect (docs/protocol.md, "Access"): :func:`exposure` says who can reach an
endpoint; the probe and the agent refuse one that anyone on the network could reach
unless the user opts in. However many connect, at most MAX_PEERS are let through the
handshake at a time (a ZAP handler, answered by the publisher thread), so idle or
hostile subscribers cannot grow the training process's memory or CPU.
"""

from __future__ import annotations

import contextlib
import ipaddress
import struct
import threading
import time

import zmq

from gputop_dl.probe.protocol import TOPIC_PREFIX

SEND_HWM = 64  # messages queued per subscriber before we drop: ~6 s of step batches
RECV_HWM = 10_000
# Subscription notices kept queued for the publisher thread; a flood beyond this is
# dropped by libzmq, which only delays a replay (notices are coalesced anyway).
SUB_NOTICE_HWM = 1000
# Peers connected at once (viewers, snapshots); one more is refused at the handshake.
MAX_PEERS = 32
# A peer that connects and says nothing is dropped after this (it holds a peer's place).
HANDSHAKE_S = 5.0
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks whether a peer may connect
_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
ADMIT_PER_SEND = 4  # handshakes answered per send at most (wait() answers more)

PRIVATE, LOOPBACK, EXPOSED = "private", "loopback", "exposed"
NO_AUTH = "authenticated TCP is not available yet"
LOOPBACK_WARNING = (
    "listening on {endpoint}: every user of this host can connect and read the stream "
    "({no_auth}); the default ipc socket is private to you (directory mode 0700)"
)
REFUSED = (
    "listening on {endpoint} refused: the stream would be readable by anyone who can "
    "reach this host; bind 127.0.0.1 and tunnel with ssh -L, or {opt_in} ({no_auth})"
)
INSECURE_WARNING = (
    "listening on {endpoint} as asked ({opt_in}): anyone who can reach this host "
    "can read the stream ({no_auth})"
)


class TransportError(Exception):
    """An endpoint could not be bound or connected; the message says why."""


def exposure(endpoint: str) -> str:
    """Who can connect to ``endpoint`` once bound: PRIVATE (ipc, inproc: the file's
    directory decides), LOOPBACK (a TCP loopback address: every local user) or EXPOSED
    (a wildcard, any other address or name, any other transport: the network).

    Host names other than ``localhost`` count as exposed: resolving one here could block
    the training thread, and a name is not a promise of where it points."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return EXPOSED
    if scheme in ("ipc", "inproc"):
        return PRIVATE
    if scheme != "tcp":
        return EXPOSED
    host = rest.rpartition(":")[0] if ":" in rest else rest
    host = host.rpartition(";")[2].strip("[]").lower()  # "tcp://src;dst:port"
    if host in ("localhost", "lo"):
        return LOOPBACK
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return EXPOSED  # "*", an interface or host name
    return LOOPBACK if address.is_loopback else EXPOSED


def listen_policy(endpoint: str, *, insecure: bool, opt_in: str) -> tuple[str | None, str | None]:
    """(refusal, warning) for binding ``endpoint``: a refusal when the network could
    read it and the user did not opt in; else a warning for anything less than private.
    ``opt_in`` names the switch in the user's terms ("set GPUTOP_INSECURE=1")."""
    kind = exposure(endpoint)
    words = {"endpoint": endpoint, "opt_in": opt_in, "no_auth": NO_AUTH}
    if kind == EXPOSED:
        if not insecure:
            return REFUSED.format(**words), None
        return None, INSECURE_WARNING.format(**words)
    if kind == LOOPBACK:
        return None, LOOPBACK_WARNING.format(**words)
    return None, None


class Publisher:
    """A bound XPUB socket. Not thread-safe: use it from one thread only, except
    :meth:`wake`, which any thread may call (it has its own socket).

    XPUB is PUB that also tells the publisher about subscriptions: with XPUB_VERBOSE every
    SUBSCRIBE is reported, even a repeated one, which is what lets the probe send its
    history to a subscriber that just attached (:meth:`wait` returns the count).

    At most ``max_peers`` peers are connected at once: libzmq asks the ZAP handler
    (served in :meth:`wait` and :meth:`send`) about each new one; the socket monitor
    tells which connections are open. ``refused`` counts the peers turned away.
    """

    def __init__(self, endpoint: str, max_peers: int = MAX_PEERS) -> None:
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
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        # Every peer goes through the ZAP handler (a domain makes libzmq ask even for the
        # NULL mechanism); the monitor says which connections are open, by their fd.
        self.max_peers = max_peers
        self.refused = 0
        self._open: set[int] = set()  # fds of the connections open now
        self._sock.setsockopt(zmq.ZAP_DOMAIN, b"gputop")
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitor = self._sock.get_monitor_socket(_MONITOR_EVENTS)
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
        self._poller.register(self._zap, zmq.POLLIN)
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
        """Queue one message; False if it had to be dropped (never blocks).

        New peers are admitted here too (a non-blocking look, ~1 us), so a caller that
        only sends, and never calls :meth:`wait`, is still heard."""
        self._admit(ADMIT_PER_SEND)
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
        if self._zap in ready:
            self._admit(max_notices)
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

    def _admit(self, max_requests: int) -> None:
        """Answer libzmq's questions about new peers: yes while at most ``max_peers``
        connections are open, this one included (handshakes in progress and refused
        ones not yet closed count too: a burst may be refused whole, and the viewer
        tries again a second later), no beyond."""
        for _ in range(max_requests):
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            ok = self.peers <= self.max_peers
            if not ok:
                self.refused += 1
            request_id = request[1] if len(request) > 1 else b""
            reply = [b"1.0", request_id, b"200" if ok else b"400", b"", b"", b""]
            with contextlib.suppress(zmq.ZMQError):
                self._zap.send_multipart(reply, zmq.NOBLOCK)

    @property
    def peers(self) -> int:
        """Connections open now (the monitor reports each accept and each close)."""
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            if len(frames) != 2 or len(frames[0]) < 6:
                continue
            event, fd = struct.unpack("=HI", frames[0][:6])
            if event == zmq.EVENT_ACCEPTED:
                self._open.add(fd)
            elif event == zmq.EVENT_DISCONNECTED:
                self._open.discard(fd)
        return len(self._open)

    def wake(self) -> None:
        """Make a pending :meth:`wait` return now (callable from any thread)."""
        with self._wake_lock, contextlib.suppress(Exception):
            if self._wake_tx is None:
                self._wake_tx = self._ctx.socket(zmq.PAIR)
                self._wake_tx.setsockopt(zmq.LINGER, 0)
                self._wake_tx.connect(self._wake_addr)
            self._wake_tx.send(b"", zmq.NOBLOCK)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        with self._wake_lock:
            for sock in (self._sock, self._wake_rx, self._wake_tx, self._zap, self._monitor):
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
