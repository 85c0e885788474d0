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
import ctypes
import errno
import functools
import ipaddress
import math
import operator
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq

from gputop_dl.probe.protocol import TOPIC_PREFIX

# Messages queued per subscriber before libzmq drops them (the default: the probe sizes
# its queue for its history replays, probe.core.SEND_QUEUE).
SEND_HWM = 128
RECV_HWM = 10_000
REVIVE_EVERY_S = 1.0  # a dropped peer is connected again at most this often
# ... and not while messages wait to be read (Subscriber._revive_dropped), for at most
# this long: a stream from other peers that never lets the socket empty must not keep
# a dropped peer away (what it sent before it was dropped is read long before).
REVIVE_POSTPONE_MAX_S = 1.0
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
RECEIVE_MAX = 1000  # messages one receive() returns at most (more wait for the next)

PRIVATE, LOOPBACK, EXPOSED = "private", "loopback", "exposed"
NO_AUTH = "unauthenticated; run gputop keys to require CURVE keys instead"
LOOPBACK_WARNING = (
    "listening on {endpoint}: every user of this host can connect and read the stream "
    "({no_auth}); the default ipc socket is private to you (directory mode 0700)"
)
REFUSED = (
    "listening on {endpoint} refused: without keys the stream would be readable by anyone "
    "who can reach this host; run gputop keys (then only holders of an authorized key "
    "connect), bind 127.0.0.1 and tunnel with ssh -L, or {opt_in} ({no_auth})"
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


def listen_policy(
    endpoint: str, *, insecure: bool, opt_in: str, keys: bool | None = None
) -> tuple[str | None, str | None]:
    """(refusal, warning) for binding ``endpoint``: a refusal when the network could
    read it and the user did not opt in; else a warning for anything less than private.
    ``opt_in`` names the switch in the user's terms ("set GPUTOP_INSECURE=1").

    With CURVE keys (``keys``; None: whether :func:`load_keys` finds some) a network
    endpoint is neither refused nor warned about: :class:`Publisher` then admits only
    clients holding an authorized key."""
    if "://" not in endpoint:  # a typo is not a network address: say what it lacks
        return (
            f"cannot listen on {endpoint!r}: not an endpoint (tcp://127.0.0.1:PORT, "
            "tcp://HOST:PORT or ipc:///PATH)",
            None,
        )
    kind = exposure(endpoint)
    words = {"endpoint": endpoint, "opt_in": opt_in, "no_auth": NO_AUTH}
    if kind == EXPOSED and (load_keys() is not None if keys is None else keys):
        return None, None
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
    ``send_hwm``: messages queued per subscriber before they are dropped (a burst the
    publisher sends at once must fit; a socket publishing for many sources needs room
    for each).
    """

    def __init__(
        self,
        endpoint: str,
        max_peers: int = MAX_PEERS,
        keys: CurveKeys | None = None,
        send_hwm: int = SEND_HWM,
    ) -> None:
        self.endpoint = endpoint
        # A network endpoint is CURVE-encrypted whenever the user has keys: only clients
        # whose public key is authorized get through the ZAP handler below.
        if keys is None and exposure(endpoint) == EXPOSED:
            keys = load_keys()
        self.keys = keys
        self.denied = 0  # peers turned away for their key
        # A private context: the training process may use zmq itself, and we must be able
        # to tear ours down without touching theirs.
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.SNDHWM, send_hwm)
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
        if keys is not None:
            curve_server(self._sock, keys)
            # The CURVE handshake (INITIATE: ~300 bytes) counts against the limit too.
            self._sock.setsockopt(zmq.MAXMSGSIZE, CURVE_MAXMSGSIZE)
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitor = self._sock.get_monitor_socket(_MONITOR_EVENTS)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._zap, zmq.POLLIN)
        # Waking the publisher thread early (close) without a shared Event and a timeout.
        self._waker = _Waker(self._ctx, self._poller)
        try:
            self.endpoint = _bind(self._sock, endpoint)
        except TransportError:
            self.close()
            raise
        self._held_send = held_send(self._sock)

    def send(self, frames: list[bytes]) -> bool:
        """Queue one message; False if it had to be dropped (never blocks). Call it from
        the thread that waits and closes: the GIL is kept through the send
        (:func:`held_send`).

        New peers are admitted here too (a non-blocking look, ~1 us), so a caller that
        only sends, and never calls :meth:`wait`, is still heard."""
        self._admit(ADMIT_PER_SEND)
        held = self._held_send
        if held is not None:
            return held(frames)
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.ZMQError:  # zmq.Again (queue full) included
            return False
        return True

    def wait(self, timeout_s: float, max_notices: int = SUB_NOTICE_HWM) -> int:
        """Sleep until ``timeout_s`` passes, :meth:`wake` is called or subscribers
        (re)subscribe; return how many subscription notices arrived (bounded)."""
        try:
            ready = dict(self._poller.poll(poll_ms(timeout_s)))
        except zmq.ZMQError:
            return 0
        if self._waker.rx in ready:
            self._waker.drain()
        if self._zap in ready:
            self._admit(max_notices)
        return self.subscriptions(max_notices) if self._sock in ready else 0

    def subscriptions(self, max_notices: int = SUB_NOTICE_HWM) -> int:
        """Subscription notices that arrived since the last look, without waiting (a
        subscriber libzmq admitted during a send is only heard of here or in wait)."""
        subscribed = 0
        for _ in range(max_notices):
            if not _readable(self._sock):
                break
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
            if not _readable(self._zap):
                return
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            ok = self.peers <= self.max_peers
            if not ok:
                self.refused += 1
            elif self.keys is not None and not key_allowed(request, self.keys):
                ok = False
                self.denied += 1
            request_id = request[1] if len(request) > 1 else b""
            reply = [b"1.0", request_id, b"200" if ok else b"400", b"", b"", b""]
            with contextlib.suppress(zmq.ZMQError):
                self._zap.send_multipart(reply, zmq.NOBLOCK)

    @property
    def peers(self) -> int:
        """Connections open now (the monitor reports each accept and each close)."""
        while _readable(self._monitor):
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
        self._waker.wake()

    def close(self) -> None:
        self._held_send = None  # its handle dies with the socket
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        self._waker.close()
        for sock in (self._sock, self._zap, self._monitor):
            with contextlib.suppress(Exception):
                sock.close(linger=0)
        with contextlib.suppress(Exception):
            self._ctx.term()


class _Waker:
    """Wakes the thread blocked in ``poller``'s poll, from any thread: an inproc PAIR
    whose receiving end the poller watches (a shared Event would need a poll timeout)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], poller: zmq.Poller) -> None:
        self._ctx = ctx
        self._addr = f"inproc://gputop-wake-{id(self)}"
        self.rx = ctx.socket(zmq.PAIR)
        self.rx.setsockopt(zmq.LINGER, 0)
        self.rx.bind(self._addr)
        self._tx: zmq.Socket[bytes] | None = None  # made by the first waking thread
        self._lock = threading.Lock()
        self._closed = False  # no socket made after: the context's term() would wait for it
        poller.register(self.rx, zmq.POLLIN)

    def wake(self) -> None:
        with self._lock, contextlib.suppress(Exception):
            if self._closed:
                return
            if self._tx is None:
                self._tx = self._ctx.socket(zmq.PAIR)
                self._tx.setsockopt(zmq.LINGER, 0)
                self._tx.connect(self._addr)
            self._tx.send(b"", zmq.NOBLOCK)

    def drain(self) -> None:
        """Take the wake-ups sent (on the polling thread)."""
        with contextlib.suppress(zmq.ZMQError):
            while True:
                self.rx.recv(zmq.NOBLOCK)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for sock in (self.rx, self._tx):
                if sock is not None:
                    with contextlib.suppress(Exception):
                        sock.close(linger=0)


def _mapped_libzmq() -> tuple[str, list[tuple[int, int]]] | None:
    """The one libzmq file mapped in this process and its address ranges (Linux), or
    None: none (pyzmq built with libzmq inside its extension), or more than one."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5]).startswith("libzmq"):
                    start, _, end = fields[0].partition("-")
                    ranges.setdefault(fields[5].rstrip("\n"), []).append(
                        (int(start, 16), int(end, 16))
                    )
    except (OSError, ValueError):
        return None
    return next(iter(ranges.items())) if len(ranges) == 1 else None


def held_send(sock: zmq.Socket[bytes]) -> Callable[[list[bytes]], bool] | None:
    """A send of whole messages on ``sock`` through libzmq's ``zmq_send`` with the GIL
    held (ctypes.PyDLL), or None where the socket's own libzmq cannot be told for sure.

    pyzmq lets go of the GIL around each frame it sends. Beside a training thread that
    runs Python, each release hands it the GIL, and taking it back waits the switch
    interval (5 ms) and then forces that thread off it: a context switch of the training
    thread and futex calls on both sides, per frame. A wake-up of the probe's publisher
    sends several messages of two frames (steps over 2,000 a message, a node sample,
    a hello; a history replay ~80). A non-blocking send only queues the frame for zmq's
    I/O thread, so the GIL is kept here. Measured with a probe watched over a loop of
    pure Python steps (bench/publisher_gil.py, 2026-11-26): at ~32,000 steps a second
    the training thread's voluntary context switches fell from 35-68 a second to 8-10;
    at ~110 us steps from 11-14 to 4, and the publisher's CPU from 1.65 ms a second to
    1.25 (0.20 to 0.15 us a step).

    The socket's libzmq is the one libzmq file mapped in this process whose code the
    socket's vtable points into. With none (libzmq linked into pyzmq's extension), or
    more than one, pyzmq sends. The socket must be used by one thread only, which also
    closes it, as pyzmq asks: with the GIL held nothing can close it during a send.
    """
    handle = sock.underlying
    found = _mapped_libzmq()
    if not handle or found is None:
        return None
    path, ranges = found
    try:
        vtable = ctypes.c_void_p.from_address(handle).value or 0
        if not any(start <= vtable < end for start, end in ranges):
            return None
        lib = ctypes.PyDLL(path)
        zmq_send = lib.zmq_send
        zmq_send.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
        zmq_send.restype = ctypes.c_int
        zmq_errno = lib.zmq_errno
        zmq_errno.argtypes = ()
        zmq_errno.restype = ctypes.c_int
    except (OSError, AttributeError, ValueError):
        return None
    more, last = _DONTWAIT | _SNDMORE, _DONTWAIT

    def send(frames: list[bytes]) -> bool:
        final = len(frames) - 1
        for i, frame in enumerate(frames):
            data = frame if type(frame) is bytes else bytes(frame)
            while zmq_send(handle, data, len(data), more if i < final else last) < 0:
                if zmq_errno() != errno.EINTR:
                    return False  # EAGAIN (a full queue) as pyzmq's zmq.Again: dropped
        return True

    return send


class Subscriber:
    """A SUB socket connected to any number of endpoints (used by the viewer)."""

    def __init__(self, keys: CurveKeys | None = None) -> None:
        # Keys for network endpoints (CURVE); loaded on the first such connect if None.
        self._keys = keys
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Bound the size of any one frame before it is even read into memory.
        self._sock.setsockopt(zmq.MAXMSGSIZE, 8 * 1024 * 1024)
        self._sock.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
        # libzmq drops a peer that sends a frame over MAXMSGSIZE as a protocol error and,
        # unlike after a network error, never reconnects: one hostile or buggy frame would
        # cut the viewer off for good. The monitor tells which endpoint was dropped, and
        # which refused this subscriber's security handshake (a key not admitted there).
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED_EVENTS
        )
        # endpoint -> why its handshake failed, the newest (libzmq tries again by itself)
        self.refusals: dict[str, str] = {}
        # endpoint -> how it was connected (SECURITY_*): what a failed handshake means
        self._security: dict[str, str] = {}
        self._poller = zmq.Poller()
        # Not the monitor: libzmq retries a peer that accepts and closes ~10 times a
        # second, each a DISCONNECTED event; a dropped peer waits for the next receive.
        self._poller.register(self._sock, zmq.POLLIN)
        self._waker = _Waker(self._ctx, self._poller)  # a long wait still ends at once
        self._dropped: dict[str, float] = {}  # endpoint -> monotonic time it was seen dropped
        self._revived: dict[str, float] = {}  # endpoint -> monotonic time of last revival
        self._lock = threading.Lock()
        self.endpoints: set[str] = set()

    def connect(self, endpoint: str) -> None:
        """Connect to ``endpoint``; TransportError when it cannot be (a malformed
        endpoint, or GPUTOP_SERVER_KEY for a network one)."""
        try:
            self._keys = connect_maybe_curve(self._sock, endpoint, self._keys)
        except zmq.ZMQError as exc:
            raise TransportError(f"cannot connect to {endpoint}: {exc.strerror}") from None
        self._security[endpoint] = security_of(endpoint, self._keys)
        self.endpoints.add(endpoint)

    def disconnect(self, endpoint: str) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disconnect(endpoint)
        self.endpoints.discard(endpoint)
        self._revived.pop(endpoint, None)
        self._security.pop(endpoint, None)
        self.refusals.pop(endpoint, None)  # a later connect starts afresh

    def receive(self, timeout_s: float, max_messages: int = RECEIVE_MAX) -> list[list[bytes]]:
        """Wait up to ``timeout_s`` for messages, or until :meth:`wake`; return all that
        are ready (bounded)."""
        out: list[list[bytes]] = []
        revival = self._revive_dropped()
        if revival is not None:  # a dropped peer's next try comes before the wait's end
            timeout_s = min(timeout_s, revival)
        sock = self._sock
        ready = dict(self._poller.poll(poll_ms(timeout_s)))  # an error: the caller's to report
        if self._waker.rx in ready:
            self._waker.drain()
        if sock in ready:
            while len(out) < max_messages and _readable(sock):
                try:
                    out.append(sock.recv_multipart(flags=zmq.NOBLOCK, copy=True))
                except zmq.Again:
                    break
        if revival is not None:
            self._revive_dropped()  # its time may have come during the wait
        return out

    def _revive_dropped(self) -> float | None:
        """Connect again to endpoints the socket dropped (at most once a second each: a
        peer that keeps sending oversized frames must not make us spin). Returns the
        seconds until the next one may be, None when none waits."""
        while _readable(self._monitor):
            try:
                frames = self._monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            endpoint = frames[-1].decode(errors="replace") if len(frames) == 2 else ""
            if endpoint not in self.endpoints:
                continue
            event = _MONITOR_EVENT.unpack_from(frames[0])[0] if len(frames[0]) >= 2 else 0
            refusal = handshake_failure(event, self._security.get(endpoint, SECURITY_PLAIN))
            if refusal is not None:
                self.refusals[endpoint] = refusal
            else:
                self._dropped.setdefault(endpoint, time.monotonic())
        now = time.monotonic()
        next_in: float | None = None
        # Not while a message waits to be read: disconnecting throws away what is still
        # in the peer's pipe, and a peer that closed its socket is dropped too (libzmq
        # would connect again by itself there). A probe's last steps and its bye, sent
        # just before it closed, were lost so while the viewer gathered: the run ended
        # shown as killed. The caller reads first; the wait then says "at once".
        unread = _readable(self._sock)
        for endpoint, seen in list(self._dropped.items()):
            wait = self._revived.get(endpoint, -1e9) + REVIVE_EVERY_S - now
            if endpoint not in self.endpoints:
                del self._dropped[endpoint]
            elif wait <= 0 and unread and now - seen < REVIVE_POSTPONE_MAX_S:
                next_in = 0.0
            elif wait <= 0:
                del self._dropped[endpoint]
                self._revived[endpoint] = now
                with contextlib.suppress(zmq.ZMQError, TransportError):
                    self._sock.disconnect(endpoint)
                    connect_maybe_curve(self._sock, endpoint, self._keys)
            else:
                next_in = wait if next_in is None else min(next_in, wait)
        return next_in

    def wake(self) -> None:
        """Make a pending :meth:`receive` return now (callable from any thread)."""
        self._waker.wake()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.disable_monitor()
        self._waker.close()
        with contextlib.suppress(Exception):
            self._monitor.close(linger=0)
        with contextlib.suppress(Exception):
            self._sock.close(linger=0)
        with contextlib.suppress(Exception):
            self._ctx.term()


# ------------------------------------------------------------------ CURVE keys
# docs/protocol.md, "Authenticated TCP": one key pair per user (like an ssh key),
# copied to the nodes or shared through the home directory. A server (probe, agent,
# relay on a network address) admits the clients whose public key is in its
# authorized_keys file; a client expects the server to hold the same user's key unless
# $GPUTOP_SERVER_KEY names another one.
ENV_SERVER_KEY = "GPUTOP_SERVER_KEY"
KEY_FILE = "gputop.key_secret"  # the key pair (zmq.auth certificate format), mode 0600
AUTHORIZED_FILE = "authorized_keys"  # one Z85 public key per line, "# comments"
MAX_KEY_FILE_BYTES = 64 * 1024
CURVE_MAXMSGSIZE = 1024  # a subscriber's largest frame under CURVE: its handshake


@dataclass(frozen=True)
class CurveKeys:
    """A user's CURVE key pair and whom it lets in (all keys Z85-encoded, 40 bytes)."""

    public: bytes
    secret: bytes
    authorized: frozenset[bytes]
    server: bytes  # the public key a client expects its server to prove
    # Why $GPUTOP_SERVER_KEY cannot be used, when it is set and malformed: a client then
    # refuses to connect rather than expect its own key in its place (the refusal would
    # blame the keys the server holds, not the variable).
    server_error: str | None = None


def keys_dir() -> Path:
    """Where ``gputop keys`` writes: $XDG_CONFIG_HOME/gputop, else ~/.config/gputop."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gputop"


def new_keypair() -> tuple[bytes, bytes]:
    """A fresh (public, secret) CURVE key pair, Z85-encoded."""
    public, secret = zmq.curve_keypair()
    return public, secret


def is_key(text: bytes) -> bool:
    """A well-formed Z85 CURVE key (40 characters decoding to 32 bytes)."""
    from zmq.utils import z85

    if len(text) != 40:
        return False
    try:
        return len(z85.decode(text)) == 32
    except Exception:
        return False


def parse_authorized(text: str) -> frozenset[bytes]:
    """The keys of an authorized_keys file: the first word of each line that is a key
    (comments and anything malformed are skipped). Z85 has "#" in its alphabet, so a
    comment is not cut at a "#" but told from a key by its length and decoding."""
    keys = set()
    for line in text.splitlines():
        words = line.split()
        if words and is_key(words[0].encode()):
            keys.add(words[0].encode())
    return frozenset(keys)


def load_keys(directory: Path | None = None) -> CurveKeys | None:
    """The user's keys, or None when there are none (or they cannot be read: a server
    then refuses the network as it does without keys, never listens unauthenticated)."""
    import zmq.auth

    directory = keys_dir() if directory is None else directory
    path = directory / KEY_FILE
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            return None
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError):
        return None
    try:
        authorized_text = (directory / AUTHORIZED_FILE).read_text(errors="replace")
    except OSError:
        authorized_text = ""  # nobody admitted yet: every client is refused
    if secret is None or not is_key(public) or not is_key(secret):
        return None
    authorized = parse_authorized(authorized_text[:MAX_KEY_FILE_BYTES])
    try:
        server = server_key_from_env() or public
    except ValueError as exc:
        return CurveKeys(public, secret, authorized, public, str(exc))
    return CurveKeys(public, secret, authorized, server)


# A certificate's public key line, as zmq.auth writes it: `public-key = "KEY"`.
_CERT_PUBLIC_KEY = re.compile(r'^\s*public-key\s*=\s*"([^"]*)"\s*$', re.MULTILINE)


def server_key_from_env() -> bytes | None:
    """$GPUTOP_SERVER_KEY: the public key a client expects its server to hold, None when
    unset. Also taken from a certificate's whole text (``cat gputop.key``), whose one
    `public-key = "..."` value is then the key. ValueError saying what is expected when
    it is neither."""
    text = os.environ.get(ENV_SERVER_KEY, "").strip()
    if not text:
        return None
    if is_key(text.encode()):
        return text.encode()
    found = set(_CERT_PUBLIC_KEY.findall(text))
    if len(found) == 1 and is_key(key := found.pop().encode()):
        return key
    what = (
        f"a text of {len(text)} characters with {len(found)} public-key values"
        if len(found) > 1
        else f"{len(text)} characters"
        + (" with spaces" if any(c.isspace() for c in text) else "")
        + ("" if len(text) != 40 else " that are not Z85")
    )
    raise ValueError(
        f"{ENV_SERVER_KEY} is not a CURVE public key ({what}): it must be the server's "
        "40-character Z85 public key, the quoted public-key value in its gputop.key, "
        "single-quoted in the shell (Z85 has characters such as $ & * # that the shell "
        f"would take): export {ENV_SERVER_KEY}='KEY'"
    )


def write_keypair(directory: Path) -> Path:
    """Write a new key pair as a zmq.auth certificate in ``directory`` (which the
    caller made 0700); the file is created 0600. Returns its path."""
    import zmq.auth

    old = os.umask(0o077)
    try:
        _public_file, secret_file = zmq.auth.create_certificates(str(directory), "gputop")
    finally:
        os.umask(old)
    os.chmod(secret_file, 0o600)
    with contextlib.suppress(OSError):
        os.chmod(directory / "gputop.key", 0o600)
    return Path(secret_file)


def curve_server(sock: zmq.Socket[bytes], keys: CurveKeys) -> None:
    """Make ``sock`` (before bind) a CURVE server with the user's key."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)


def key_allowed(request: list[bytes], keys: CurveKeys) -> bool:
    """A ZAP request (version, id, domain, address, identity, mechanism, credentials)
    from a CURVE client whose public key is authorized."""
    from zmq.utils import z85

    if len(request) < 7 or request[5] != b"CURVE" or len(request[6]) != 32:
        return False
    return z85.encode(request[6]) in keys.authorized


def connect_maybe_curve(
    sock: zmq.Socket[bytes], endpoint: str, keys: CurveKeys | None
) -> CurveKeys | None:
    """Connect ``sock``; to a network endpoint as a CURVE client when the user has keys.
    libzmq takes the security options at connect time, per connection, so the socket is
    set back to NULL security after: its other endpoints (ipc, loopback) stay plain.
    Returns the keys (loaded here on first need) for the next call."""
    if exposure(endpoint) != EXPOSED:
        sock.connect(endpoint)
        return keys
    keys = load_keys() if keys is None else keys
    if keys is None:
        sock.connect(endpoint)
        return None
    if keys.server_error is not None:
        raise TransportError(f"cannot connect to {endpoint}: {keys.server_error}")
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    try:
        sock.connect(endpoint)
    finally:
        sock.setsockopt(zmq.CURVE_SERVER, 0)  # mechanism back to NULL
    return keys


def security_of(endpoint: str, keys: CurveKeys | None) -> str:
    """How :func:`connect_maybe_curve` connected to ``endpoint`` (keys as it returned
    them): plain (ipc, loopback), a network endpoint without keys, or CURVE."""
    if exposure(endpoint) != EXPOSED:
        return SECURITY_PLAIN
    return SECURITY_NO_KEYS if keys is None else SECURITY_CURVE


# ----------------------------------------------------------------------- relay
# Messages queued per viewer before the relay drops (~10 s of a node's messages): a
# viewer that falls behind loses messages rather than lagging ever further.
RELAY_HWM = 1000


class _KeyCheck:
    """ZAP callback for the relay (pyzmq's authenticator asks it per client key)."""

    def __init__(self, keys: CurveKeys) -> None:
        self.keys = keys

    def callback(self, _domain: str, key: bytes) -> bool:
        return key in self.keys.authorized


class Forwarder:
    """Many publishers republished on one endpoint, by ZeroMQ's own proxy.

    An XSUB socket connects to the upstream publishers, an XPUB socket is bound for the
    viewers and ``zmq.proxy_steerable`` moves messages down and subscriptions up on a
    thread of its own. The XPUB is verbose, so each new viewer's subscription reaches
    every probe, which then replays its history to it (through the relay); XSUB also
    sends its subscriptions to each new upstream, which so replays on connect.

    Upstream sockets are the proxy thread's alone: :meth:`set_upstreams` queues the
    changes and stops the proxy (TERMINATE on the control socket); the thread applies
    them and starts it again. Queued messages stay in the sockets meanwhile.

    ``listen`` None: bind a private inproc endpoint and read it with :meth:`receive`
    (``gputop relay --stdio``).
    """

    def __init__(self, listen: str | None = None, *, keys: CurveKeys | None = None) -> None:
        self._ctx = zmq.Context(io_threads=1)
        self._front = self._ctx.socket(zmq.XSUB)
        self._front.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._front.setsockopt(zmq.LINGER, 0)
        self._front.setsockopt(zmq.MAXMSGSIZE, 8 * 1024 * 1024)
        self._back = self._ctx.socket(zmq.XPUB)
        self._back.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._back.setsockopt(zmq.SNDHWM, RELAY_HWM)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.setsockopt(zmq.MAXMSGSIZE, 256)  # downstream sends subscriptions only
        self._auth: object | None = None
        self.keys = keys
        endpoint = listen or f"inproc://gputop-relay-{id(self)}"
        if listen is not None and exposure(listen) == EXPOSED:
            self.keys = keys if keys is not None else load_keys()
            if self.keys is not None:
                from zmq.auth.thread import ThreadAuthenticator

                auth = ThreadAuthenticator(self._ctx)
                auth.start()
                auth.configure_curve_callback("*", _KeyCheck(self.keys))
                self._auth = auth
                curve_server(self._back, self.keys)
                self._back.setsockopt(zmq.MAXMSGSIZE, CURVE_MAXMSGSIZE)
        ctl = f"inproc://gputop-relay-ctl-{id(self)}"
        self._ctl_rx = self._ctx.socket(zmq.PAIR)
        self._ctl_rx.bind(ctl)
        self._ctl_tx = self._ctx.socket(zmq.PAIR)
        self._ctl_tx.setsockopt(zmq.LINGER, 0)
        self._ctl_tx.connect(ctl)
        self._tap: zmq.Socket[bytes] | None = None
        try:
            self.endpoint = _bind(self._back, endpoint)
        except TransportError:
            self._close_sockets()
            raise
        if listen is None:
            self._tap = self._ctx.socket(zmq.SUB)
            self._tap.setsockopt(zmq.RCVHWM, RECV_HWM)
            self._tap.setsockopt(zmq.LINGER, 0)
            self._tap.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
            self._tap.connect(self.endpoint)
        self.upstreams: set[str] = set()
        self._ops: list[tuple[bool, str]] = []  # (connect?, endpoint) for the proxy thread
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="gputop-relay", daemon=True)
        self._thread.start()

    def set_upstreams(self, endpoints: Iterable[str]) -> tuple[set[str], set[str]]:
        """Listen to exactly ``endpoints`` from now on; returns (added, removed)."""
        wanted = set(endpoints)
        added, removed = wanted - self.upstreams, self.upstreams - wanted
        if not added and not removed:
            return added, removed
        with self._lock:
            self._ops.extend((False, e) for e in sorted(removed))
            self._ops.extend((True, e) for e in sorted(added))
            self.upstreams = wanted
            with contextlib.suppress(zmq.ZMQError):
                self._ctl_tx.send(b"TERMINATE")
        return added, removed

    def _run(self) -> None:
        while True:
            with self._lock:
                ops, self._ops = self._ops, []
                closing = self._closing
            for connect, endpoint in ops:
                # TransportError: a malformed GPUTOP_SERVER_KEY; that upstream is left
                # out (the proxy thread must outlive it).
                with contextlib.suppress(zmq.ZMQError, TransportError):
                    if connect:
                        self.keys = connect_maybe_curve(self._front, endpoint, self.keys)
                    else:
                        self._front.disconnect(endpoint)
            if closing:
                return
            try:
                zmq.proxy_steerable(self._front, self._back, None, self._ctl_rx)
            except zmq.ZMQError:
                return

    def receive(self, timeout_s: float, max_messages: int = RECEIVE_MAX) -> list[list[bytes]]:
        """Messages forwarded (``listen`` None only): all ready within ``timeout_s``."""
        out: list[list[bytes]] = []
        tap = self._tap
        if tap is None or not tap.poll(poll_ms(timeout_s), zmq.POLLIN):
            return out
        while len(out) < max_messages and _readable(tap):
            try:
                out.append(tap.recv_multipart(flags=zmq.NOBLOCK, copy=True))
            except zmq.Again:
                break
        return out

    def close(self) -> None:
        with self._lock:
            self._closing = True
            with contextlib.suppress(zmq.ZMQError):
                self._ctl_tx.send(b"TERMINATE")
        self._thread.join(timeout=2.0)
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._auth is not None:
            with contextlib.suppress(Exception):
                self._auth.stop()  # type: ignore[attr-defined]
        for sock in (self._front, self._back, self._ctl_rx, self._ctl_tx, self._tap):
            if sock is not None:
                with contextlib.suppress(Exception):
                    sock.close(linger=0)
        with contextlib.suppress(Exception):
            self._ctx.term()


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``sock`` to ``endpoint``; the address it listens on (with a wildcard port,
    "tcp://127.0.0.1:*", the real one is known only now)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise TransportError(f"cannot listen on {endpoint}: {exc.strerror}") from None
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) and last else endpoint


def poll_ms(timeout_s: float) -> int:
    """A zmq poll's timeout in whole milliseconds, rounded up: a wait of 0.4 ms is not a
    poll(0), which would make a caller waiting for a deadline spin until it."""
    return math.ceil(max(0.0, timeout_s) * 1000)


def _readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on ``sock``: asked before a NOBLOCK receive, because the
    zmq.Again a receive on an empty socket raises costs ~8 us of Python, the question ~1
    (the publisher thread asks on every send)."""
    return bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)


# Why a server refused this subscriber's security handshake, by monitor event: what the
# viewer says of the endpoint (without it, "connecting" for ever, and "no run found").
# These are the texts of a network connection made without keys (the client side is then
# NULL, the server may want CURVE); see :func:`handshake_failure` for the others.
HANDSHAKE_FAILED = {
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): (
        "authentication failed: this viewer's key is not admitted there (on that host: "
        "gputop keys --authorize THIS_KEY, then restart the probe)"
    ),
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): (
        "the security handshake failed: the server wants CURVE keys and this viewer has "
        "none (gputop keys)"
    ),
    # libzmq reports a server with keys and a client without either way (NO_DETAIL or
    # PROTOCOL, as the handshake's messages cross): both texts name the keys.
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): (
        "the security handshake failed: the server wants CURVE keys and this viewer has "
        "none (gputop keys), or it is not a gputop publisher"
    ),
}
# The same for a CURVE connection (the viewer has keys): a server holding another key
# than the one expected drops the HELLO it cannot decrypt (NO_DETAIL here), and a server
# without keys (--insecure) speaks another mechanism (PROTOCOL).
_HANDSHAKE_FAILED_CURVE = {
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): HANDSHAKE_FAILED[int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)],
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): (
        "the CURVE handshake failed: the server holds another key than the one this viewer "
        "expects (this user's own, or GPUTOP_SERVER_KEY's), or it went away mid-handshake"
    ),
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): (
        "the CURVE handshake failed: the server does not use CURVE keys (started with "
        "--insecure?), or it is not a gputop publisher"
    ),
}
# A plain connection (ipc, loopback: never CURVE, on either side). Keys cannot be the
# cause: a NO_DETAIL is the peer closing the connection before the handshake ended,
# typically a process that just died (kill -9) while a child it forked (a DataLoader
# worker) still held its listening socket, so that the connect was accepted.
_HANDSHAKE_FAILED_PLAIN = {
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): "the publisher refused the connection",
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): (
        "the connection closed during the handshake: the process went away (or is not a "
        "gputop publisher)"
    ),
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): (
        "the handshake failed: the peer does not speak ZeroMQ as gputop does (not a gputop "
        "publisher?)"
    ),
}
# How a connection was made: which of the tables above explains its failed handshake.
SECURITY_PLAIN, SECURITY_NO_KEYS, SECURITY_CURVE = "plain", "no keys", "curve"


def handshake_failure(event: int, security: str) -> str | None:
    """Why a handshake failed (monitor ``event``) on a connection of ``security``, or
    None when ``event`` is not a handshake failure."""
    table = {
        SECURITY_PLAIN: _HANDSHAKE_FAILED_PLAIN,
        SECURITY_CURVE: _HANDSHAKE_FAILED_CURVE,
    }.get(security, HANDSHAKE_FAILED)
    return table.get(event)


_HANDSHAKE_FAILED_EVENTS = functools.reduce(operator.or_, HANDSHAKE_FAILED)
_MONITOR_EVENT = struct.Struct("=H")  # a monitor message's first frame: event, value

# Plain ints: zmq's constants are enum members, and `&` on an IntFlag costs microseconds.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_DONTWAIT = int(zmq.DONTWAIT)
_SNDMORE = int(zmq.SNDMORE)
