"""The viewer's real data source: ZeroMQ subscriptions plus, when nothing else samples
this host, a local node sampler. Runs on one background thread and only emits events;
the app applies them on its own thread."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from gputop_dl.probe import discovery
from gputop_dl.probe.messages import Hello, Message, System
from gputop_dl.probe.protocol import IncompatibleVersion, ProtocolError, decode, encode
from gputop_dl.probe.transport import RECEIVE_MAX, Subscriber, TransportError
from gputop_dl.probe.version import __version__
from gputop_dl.tui.events import (
    BadInput,
    Emit,
    EndpointState,
    Received,
    SourceEvent,
    ThreadSource,
)

POLL_S = 0.1  # the wait after an error
# The longest wait for a message: what else the thread does (discovery, the local sample)
# is due about once a second, and ``stop`` wakes it. Each wake-up of this thread costs
# ~0.2 ms of CPU here (a poll 0.1 s long took 0.28 % of a core for one quiet run, 0.18
# with 1 s).
IDLE_POLL_S = 1.0
# A viewer shows what arrived at its next refresh; reading the socket as each message
# lands (a probe's steps, its node sample and its hello: 3-5 messages a second, every
# run) wakes this thread for nothing. Half a refresh: at the default 1 s, 2.0-2.2
# wake-ups a second instead of 4.7-4.8 at 0.2 s (one run at 150 steps/s; this thread
# 0.11-0.15 % of a core against 0.18), and a message is on screen at most half a
# refresh later than it would be.
GATHER_MAX_S = 0.5
DISCOVER_EVERY_S = 1.0
EAGER_AFTER_FOUND_S = 1.0  # messages are read as they land this long after a run is found
ENDED_WAIT_MAX_S = 5.0  # a run whose record went is let go of this long after, at most
LOCAL_SAMPLE_GRACE_S = 3.0  # a probe's own host samples take precedence this long
BAD_INPUT_REPEAT_S = 1.0  # the same error is reported at most this often
# Sees every message's frames, undecoded, with its receive time (the recorder, issue 13).
RawTap = Callable[[list[bytes], float], None]


class ZmqSource(ThreadSource):
    """Subscribe to ``endpoints``; with ``discover`` also to every probe found on this host.

    ``gather_s``: after handing over what arrived, wait this long before reading again, so
    that one wake-up takes several messages (a viewer passes :func:`gather_for` its
    refresh). A message into a quiet stream is still read at once; the receive times of
    the later ones are up to ``gather_s`` late, so a recorder keeps the default, 0.

    ``local_sampler``: sample this host in the viewer when no probe or agent does.
    ``raw_tap`` (settable at any time) is called on the source's thread with the frames of
    every message before it is decoded, the local sampler's messages encoded as a probe
    would: what the viewer shows, as it arrived.
    """

    def __init__(
        self,
        endpoints: list[str] | None = None,
        *,
        discover: bool = True,
        local_sampler: bool = True,
        sample_interval_s: float = 1.0,
        raw_tap: RawTap | None = None,
        gather_s: float = 0.0,
    ) -> None:
        self.raw_tap = raw_tap
        self.gather_s = gather_s
        super().__init__()
        self.endpoints = list(endpoints or [])
        self.discover = discover
        self.local_sampler = local_sampler
        self.sample_interval_s = sample_interval_s
        self.hostname = socket.gethostname()
        self._sub: Subscriber | None = None  # while the thread runs
        # endpoint -> (why, monotonic time first seen) of a discovered run's failed
        # handshake not reported yet: reported once a later discovery still finds the
        # run. A run killed (-9) while its DataLoader workers still held its socket fails
        # the viewer's reconnect mid-handshake; its record goes at the next discovery, and
        # the failure is no problem of a live run to show for ever on the error line.
        self._unconfirmed: dict[str, tuple[str, float]] = {}

    def waiting_for(self) -> tuple[str, ...]:
        """What this source does while no run spoke and no node was sampled, for the
        viewer's header, most telling first: nothing when it samples this host (its first
        sample comes within a second, and "waiting for samples" is then true)."""
        if self.local_sampler:
            return ()
        if not self.discover:
            return ("no node sampled",)  # the endpoints show as "connecting" meanwhile
        try:
            where = f"looking for probes in {discovery.runtime_dir(create=False)}"
        except discovery.DiscoveryError:
            where = "no probe can be found: the runtime directory is refused"
        return ("no node sampled", where)

    def _run(self, emit: Emit) -> None:
        sub = self._sub = Subscriber()
        self._sampler: Any = None  # created on first need, used on this thread only
        try:
            self._loop(sub, emit)
        finally:
            self._sub = None
            sub.close()
            if self._sampler is not None:
                with contextlib.suppress(Exception):
                    self._sampler.close()

    def _loop(self, sub: Subscriber, emit: Emit) -> None:
        events: list[SourceEvent] = []
        for endpoint in self.endpoints:
            events.append(self._connect(sub, endpoint, None))
        self._known: dict[str, str] = {}  # discovered endpoint -> run name
        # (endpoint, name, monotonic time) of runs whose records went, to let go of
        self._ended: list[tuple[str, str, float]] = []
        self._refused: dict[str, str] = {}  # endpoint -> the refusal already reported
        self._last_discover = 0.0
        self._last_local_sample = 0.0
        self._last_foreign_host_sample = 0.0
        self._last_error: dict[str, float] = {}
        self._local_hello_sent = False
        # Messages read in the last iteration, and fewer than one read takes: a full read
        # left more behind, and the next one comes at once, not after the gather (which
        # would cap the source at RECEIVE_MAX messages a gather, 2,000 a second at the
        # default refresh, and let a backlog grow).
        self._read_messages = False
        self._eager_until = 0.0  # no gather before this (monotonic): a run was just found
        while not self._stop.is_set():
            try:
                self._iteration(sub, events)
            except Exception as exc:  # the thread must outlive any bug: report, go on
                text = f"viewer source error: {type(exc).__name__}: {exc}"
                if _should_report(self._last_error, text, time.monotonic()):
                    events.append(BadInput(text, time.time()))
                self._stop.wait(POLL_S)  # a persistent fault must not spin
            if events:
                emit(events)
                events = []
                now = time.monotonic()
                if self.gather_s > 0 and self._read_messages and now >= self._eager_until:
                    # Let the next ones gather (``stop`` ends it); not for a while after
                    # a run was found: its hello (once subscribed) makes it appear.
                    self._stop.wait(self.gather_s)

    def _iteration(self, sub: Subscriber, events: list[SourceEvent]) -> None:
        """One poll: read what arrived, rediscover, sample this host when nobody does.
        The duties are timed from one clock reading taken after the wait (up to
        IDLE_POLL_S), so that those due together come in one wake-up."""
        received = sub.receive(self._poll_s(time.monotonic()))
        now = time.monotonic()
        # Runs whose record went before this read, once a read took all that waited (a
        # full one may have left their bye behind), or after ENDED_WAIT_MAX_S whatever
        # comes: disconnecting throws away what is still unread from them.
        drained = len(received) < RECEIVE_MAX
        ended = [e for e in self._ended if drained or now - e[2] >= ENDED_WAIT_MAX_S]
        if self.discover and now - self._last_discover >= DISCOVER_EVERY_S:
            self._last_discover = now
            events.extend(self._rediscover(sub, self._known))
        events.extend(self._refusals(sub, now))
        self._read_messages = 0 < len(received) < RECEIVE_MAX
        for frames in received:
            event = self._decode(frames, now)
            if event is None:
                continue
            message = event.message if isinstance(event, Received) else None
            if (
                isinstance(message, System)
                and message.sample.host == self.hostname
                and message.sample.host_sampled
            ):
                self._last_foreign_host_sample = now
            events.append(event)
        for entry in ended:
            self._ended.remove(entry)
            endpoint, name, _ = entry
            if endpoint in self._known:
                continue  # found again since (a new process with the reused pid)
            sub.disconnect(endpoint)
            events.append(EndpointState(endpoint, "detached", "process ended", name))
        if (
            self.local_sampler
            and now - self._last_local_sample >= self.sample_interval_s
            and now - self._last_foreign_host_sample > LOCAL_SAMPLE_GRACE_S
        ):
            self._last_local_sample = now
            if self._sampler is None:
                self._sampler = _local_sampler(self.sample_interval_s)
            if self._sampler is not None:
                source_id = f"{self.hostname}:{os.getpid()}"
                if not self._local_hello_sent:
                    self._local_hello_sent = True
                    hello = Received(_local_hello(source_id, self.hostname), time.time())
                    self._tap_message(hello.message, hello.received)
                    events.append(hello)
                with contextlib.suppress(Exception):
                    local = Received(System(source_id, self._sampler.sample()), time.time())
                    self._tap_message(local.message, local.received)
                    events.append(local)

    def _refusals(self, sub: Subscriber, now: float) -> list[SourceEvent]:
        """Endpoint errors for handshakes that failed: each reason once (libzmq retries),
        a discovered run's only once a discovery after it still finds the run, none for a
        run whose record went (it ended: the failure was its going away)."""
        events: list[SourceEvent] = []
        ended = {entry[0] for entry in self._ended}
        for endpoint, why in sub.refusals.items():
            if self._refused.get(endpoint) == why:
                continue
            if endpoint in ended:
                self._unconfirmed.pop(endpoint, None)
                continue
            name = self._known.get(endpoint)
            if name is not None and endpoint not in self.endpoints:
                seen_why, seen = self._unconfirmed.get(endpoint, (why, now))
                if seen_why != why:
                    seen = now
                self._unconfirmed[endpoint] = (why, seen)
                if self._last_discover <= seen:
                    continue  # not yet confirmed by a discovery after it
            self._unconfirmed.pop(endpoint, None)
            self._refused[endpoint] = why
            events.append(EndpointState(endpoint, "error", why, name))
        for endpoint in [e for e in self._unconfirmed if e not in sub.refusals]:
            del self._unconfirmed[endpoint]
        return events

    def _poll_s(self, now: float) -> float:
        """How long the next poll may wait: until the next discovery or local sample
        (not before the grace a probe's own samples of this host give it)."""
        due = now + IDLE_POLL_S
        if self.discover:
            due = min(due, self._last_discover + DISCOVER_EVERY_S)
        if self.local_sampler:
            local = max(
                self._last_local_sample + self.sample_interval_s,
                self._last_foreign_host_sample + LOCAL_SAMPLE_GRACE_S,
            )
            due = min(due, local)
        return max(0.0, due - now)

    def stop(self) -> None:
        self._stop.set()
        sub = self._sub
        if sub is not None:
            sub.wake()  # out of a poll that may last IDLE_POLL_S
        super().stop()

    def _decode(self, frames: list[bytes], now: float) -> Received | BadInput | None:
        """The message in ``frames``, or a (rate-limited) report of why there is none.
        Any exception counts: a decoder bug must cost one message, not the thread."""
        wall = time.time()
        if self.raw_tap is not None:
            self._tap(frames, wall)
        return event_of(frames, wall, self._last_error, now)

    def _tap(self, frames: list[bytes], received: float) -> None:
        tap = self.raw_tap
        if tap is not None:
            with contextlib.suppress(Exception):  # a recorder's fault must not stop the view
                tap(frames, received)

    def _tap_message(self, message: Message, received: float) -> None:
        if self.raw_tap is not None:
            self._tap(encode(message), received)

    def _connect(
        self, sub: Subscriber, endpoint: str, name: str | None, pid: int | None = None
    ) -> EndpointState:
        try:
            sub.connect(endpoint)
        except TransportError as exc:
            return EndpointState(endpoint, "error", str(exc), name, pid)
        return EndpointState(endpoint, "connecting", "", name, pid)

    def _rediscover(self, sub: Subscriber, known: dict[str, str]) -> list[SourceEvent]:
        events: list[SourceEvent] = []
        # A relay republishes the probes listed here too: read them at the source.
        records = {
            r.endpoint: r
            for r in discovery.discover()
            if r.pid != os.getpid() and r.role != "relay"
        }
        for endpoint, record in records.items():
            if endpoint not in known and endpoint not in self.endpoints:
                known[endpoint] = record.name
                events.append(self._connect(sub, endpoint, record.name, record.pid))
                # Its hello (once subscribed) puts it on screen: read it as it lands.
                self._eager_until = time.monotonic() + EAGER_AFTER_FOUND_S
        for endpoint in list(known):
            if endpoint not in records:
                # Detached after a later read: a probe's bye goes out just before its
                # record does, and may still be on its way.
                self._ended.append((endpoint, known.pop(endpoint), time.monotonic()))
        return events


def gather_for(refresh_hz: float) -> float:
    """How long a viewer refreshing ``refresh_hz`` times a second lets messages gather:
    half a refresh period, at most :data:`GATHER_MAX_S`; 0 without a timer (the viewer
    then wakes for each message)."""
    return 0.0 if refresh_hz <= 0 else min(GATHER_MAX_S, 0.5 / refresh_hz)


def event_of(
    frames: Sequence[bytes],
    wall: float,
    last_error: dict[str, float],
    now: float,
    prefix: str = "",
) -> Received | BadInput | None:
    """What a viewer makes of one message's frames received at ``wall``: the message, or
    a report of why there is none (the same text at most once per BAD_INPUT_REPEAT_S of
    ``now``, kept in ``last_error``). Any exception counts: a decoder bug must cost one
    message, not the thread. Live sources, ssh links and replays all use this."""
    try:
        return Received(decode(frames), wall)
    except IncompatibleVersion as exc:
        text, theirs, hint = str(exc), exc.theirs, exc.source_id
    except ProtocolError as exc:
        text, theirs, hint = f"malformed message ignored: {exc}", None, None
    except Exception as exc:
        text = f"unreadable message ignored ({type(exc).__name__}: {exc})"
        theirs, hint = None, None
    if _should_report(last_error, text, now):
        return BadInput(f"{prefix}{text}"[:500], wall, theirs, hint)
    return None


def _should_report(last: dict[str, float], text: str, now: float) -> bool:
    if now - last.get(text, -1e9) < BAD_INPUT_REPEAT_S:
        return False
    if len(last) > 256:
        last.clear()
    last[text] = now
    return True


def _local_sampler(interval_s: float) -> Any:
    try:
        from gputop_dl.probe.collectors.sampler import NodeSampler

        sampler = NodeSampler(main_pid=None, interval_s=interval_s, host=True)
        sampler.start(thread=False)  # sampled on the source's own thread
        return sampler
    except Exception:
        return None


def _local_hello(source_id: str, host: str) -> Hello:
    return Hello(
        source_id=source_id,
        role="agent",
        name="this host",
        host=host,
        pid=os.getpid(),
        started=time.time(),
        probe_version=__version__,
    )


__all__ = ["ZmqSource"]
