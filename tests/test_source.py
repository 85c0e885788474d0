"""The viewer's ZeroMQ source against an adversarial publisher, over real loopback sockets.

Whatever a publisher sends, the source thread must stay alive, report what it could not
read (BadInput) and go on delivering the valid messages that follow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest
import zmq
from fakes_tui import hello, system_sample

import gputop_dl.probe.transport as transport
import gputop_dl.tui.source as source_module
from gputop_dl.probe.messages import Hello, Message, System
from gputop_dl.probe.protocol import encode, topic
from gputop_dl.probe.transport import Publisher, Subscriber
from gputop_dl.tui.cli import DEFAULT_REFRESH_HZ
from gputop_dl.tui.events import BadInput, EndpointState, Received, SourceEvent
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import GONE_TEXT, RunSummary, ViewerState

DEADLINE_S = 10.0


class Collected:
    """The events a source emitted, readable from the test thread."""

    def __init__(self) -> None:
        self.events: list[SourceEvent] = []
        self._lock = threading.Lock()

    def __call__(self, events: list[SourceEvent]) -> None:
        with self._lock:
            self.events.extend(events)

    def snapshot(self) -> list[SourceEvent]:
        with self._lock:
            return list(self.events)

    def messages(self) -> list[Message]:
        return [e.message for e in self.snapshot() if isinstance(e, Received)]

    def bad(self) -> list[BadInput]:
        return [e for e in self.snapshot() if isinstance(e, BadInput)]


@pytest.fixture
def wired() -> Iterator[tuple[Publisher, ZmqSource, Collected]]:
    pub = Publisher("tcp://127.0.0.1:*")
    src = ZmqSource([pub.endpoint], discover=False, local_sampler=False)
    got = Collected()
    src.start(got)
    try:
        yield pub, src, got
    finally:
        src.stop()
        pub.close()


def until(condition: Callable[[], bool], send: Callable[[], object] | None = None) -> bool:
    """Poll ``condition`` (re-sending with ``send``: PUB drops what it sends before the
    subscriber has joined) until it holds or DEADLINE_S passes."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if send is not None:
            send()
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def marker(name: str) -> Hello:
    return hello(f"h:{name}", name=name)


def delivered(pub: Publisher, got: Collected, name: str) -> bool:
    """Send a valid hello named ``name`` until the source delivers it."""
    frames = encode(marker(name))
    return until(
        lambda: any(isinstance(m, Hello) and m.name == name for m in got.messages()),
        lambda: pub.send(frames),
    )


def payload(kind: object, body: object, version: object = (1, 0)) -> bytes:
    return msgpack.packb({"v": list(version), "kind": kind, "body": body}, use_bin_type=True)  # type: ignore[arg-type]


HOSTILE: list[tuple[str, list[bytes]]] = [
    ("one frame", [b"gputop.hello"]),
    ("three frames", [b"gputop.hello", b"x", b"y"]),
    ("not msgpack", [topic("hello"), b"\xc1\xc1\xc1"]),
    ("kind is a list", [topic("hello"), payload([1], {})]),
    ("kind is a map", [topic("hello"), payload({"a": 1}, {})]),
    ("body is a list", [topic("hello"), payload("hello", [1, 2])]),
    ("version is a string", [topic("hello"), payload("hello", {}, "1.0")]),
    ("truncated", [topic("steps"), encode(marker("t"))[1][:7]]),
    ("empty payload", [topic("steps"), b""]),
]


@pytest.mark.parametrize(("case", "frames"), HOSTILE, ids=[case for case, _ in HOSTILE])
def test_a_hostile_message_is_reported_and_the_stream_goes_on(
    wired: tuple[Publisher, ZmqSource, Collected], case: str, frames: list[bytes]
) -> None:
    pub, _src, got = wired
    assert delivered(pub, got, "before")
    pub.send(frames)
    assert delivered(pub, got, "after"), case
    assert got.bad(), f"{case}: nothing reported"
    assert all(isinstance(e.text, str) and e.text for e in got.bad())


def test_an_unexpected_decoder_exception_costs_one_message_not_the_thread(
    wired: tuple[Publisher, ZmqSource, Collected], monkeypatch: pytest.MonkeyPatch
) -> None:
    pub, src, got = wired
    assert delivered(pub, got, "before")
    real = source_module.decode
    calls = {"n": 0}

    def flaky(frames: list[bytes]) -> Message:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("decoder bug")
        return real(frames)

    monkeypatch.setattr(source_module, "decode", flaky)
    assert delivered(pub, got, "after")
    assert any("RuntimeError: decoder bug" in e.text for e in got.bad())
    assert src._thread is not None and src._thread.is_alive()


def test_a_50_mb_frame_does_not_cut_the_viewer_off(
    wired: tuple[Publisher, ZmqSource, Collected],
) -> None:
    pub, src, got = wired
    assert delivered(pub, got, "before")
    pub.send([topic("steps"), b"\x00" * (50 * 1024 * 1024)])
    assert delivered(pub, got, "after")  # the connection came back (or was never cut)
    assert src._thread is not None and src._thread.is_alive()


@pytest.mark.parametrize(
    ("timeout_s", "ms"), [(0.0, 0), (0.0004, 1), (0.001, 1), (0.0011, 2), (1.0, 1000), (-1.0, 0)]
)
def test_a_poll_waits_whole_milliseconds_rounded_up(timeout_s: float, ms: int) -> None:
    # Truncated, 0.4 ms was a poll(0): a caller waiting for its deadline spun until it.
    assert transport.poll_ms(timeout_s) == ms


@pytest.mark.parametrize(("revived_ago", "waits"), [(0.3, 0.7), (0.99, 0.01), (1.5, None)])
def test_a_dropped_peer_is_connected_again_once_a_second_and_the_wait_says_when(
    revived_ago: float, waits: float | None
) -> None:
    """A peer dropped for an oversized frame: connected again at once if its last revival
    is a second old, else the receive's wait ends when it may be (not a whole idle poll
    later, which cut a peer off for up to 2 s)."""
    sub = Subscriber()
    endpoint = "tcp://127.0.0.1:9"  # nothing listens: connecting costs nothing
    try:
        sub.connect(endpoint)
        sub._dropped[endpoint] = time.monotonic()
        sub._revived[endpoint] = time.monotonic() - revived_ago
        wait = sub._revive_dropped()
        if waits is None:
            assert wait is None and endpoint not in sub._dropped  # connected again
        else:
            assert wait == pytest.approx(waits, abs=0.05) and endpoint in sub._dropped
            started = time.monotonic()
            sub.receive(60.0)  # nothing arrives: the wait ends at the revival
            assert time.monotonic() - started < 5.0
            assert endpoint not in sub._dropped
    finally:
        sub.close()


def test_what_a_publisher_sent_before_it_closed_is_read_while_the_source_gathers() -> None:
    """The peer's close is a disconnect the subscriber hears of. Connecting to it again
    (as for a peer dropped for an oversized frame) threw away what it had sent and the
    source had not read yet: a probe's last steps and its bye, while the viewer gathered."""
    got = Collected()
    pub = Publisher("tcp://127.0.0.1:*")
    src = ZmqSource([pub.endpoint], discover=False, local_sampler=False, gather_s=2.0)
    src.start(got)
    try:
        assert delivered(pub, got, "joined")  # the source now gathers for 2 s
        names = [f"last{i}" for i in range(5)]
        for name in names:
            assert pub.send(encode(marker(name)))
    finally:
        pub.close()  # at once, as a probe closes after its bye
    try:
        assert until(lambda: "last4" in [m.name for m in got.messages() if isinstance(m, Hello)])
        read = [m.name for m in got.messages() if isinstance(m, Hello) and m.name in names]
        assert read == names
    finally:
        src.stop()


ENDING = """
import time
from gputop_dl import probe
for _ in probe.watch(range(150)):
    time.sleep(0.02)
probe.current().close()
"""


@pytest.mark.parametrize("gather_s", [0.0, 0.5])
def test_a_run_that_ends_is_shown_exited_with_all_its_steps_not_as_killed(
    gather_s: float,
) -> None:
    """A discovered probe that finishes (3 s: past the eager reads after it was found):
    its last steps and its bye arrive before the source lets go of it (its record goes
    just after its bye), and a viewer shows it exited, as it said, with every step."""
    got = Collected()
    src = ZmqSource(local_sampler=False, gather_s=gather_s)
    src.start(got)
    state = ViewerState(socket.gethostname())
    try:
        env = {**os.environ, "GPUTOP_NAME": "ending"}
        subprocess.run([sys.executable, "-c", ENDING], env=env, check=True, timeout=60)

        def detached() -> bool:
            return any(
                isinstance(e, EndpointState) and e.state == "detached" for e in got.snapshot()
            )

        assert until(detached)
        events = got.snapshot()
        state.apply_all(events)
        state.tick(time.time())
        run = next(run for run in state.runs if run.name == "ending")
        assert run.connection.text == "exited: closed after 150 steps"
        assert run.step_count == 150
        kinds = [
            type(e.message).__name__ if isinstance(e, Received) else getattr(e, "state", "")
            for e in events
        ]
        assert kinds.index("Bye") < kinds.index("detached")
    finally:
        src.stop()


def test_a_dropped_peer_waits_for_unread_messages_at_most_a_while() -> None:
    """Reconnecting throws away what the dropped peer's pipe still holds, so it waits
    while messages wait to be read; but a stream from other peers that never lets the
    socket empty kept it away for good (transport.REVIVE_POSTPONE_MAX_S)."""
    pub = Publisher("tcp://127.0.0.1:*")
    sub = Subscriber()
    dropped = "tcp://127.0.0.1:9"  # nothing listens: connecting costs nothing
    try:
        sub.connect(pub.endpoint)
        sub.connect(dropped)
        frames = encode(marker("waiting"))
        assert until(lambda: transport._readable(sub._sock), lambda: pub.send(frames))
        sub._dropped[dropped] = time.monotonic()  # just seen dropped, messages unread
        assert sub._revive_dropped() == 0.0 and dropped in sub._dropped  # read first
        sub._dropped[dropped] = time.monotonic() - transport.REVIVE_POSTPONE_MAX_S
        assert transport._readable(sub._sock)
        assert sub._revive_dropped() is None and dropped not in sub._dropped  # at last
    finally:
        sub.close()
        pub.close()


class FullThenShort:
    """A subscriber whose first read is full (RECEIVE_MAX messages) and the next short."""

    def __init__(self) -> None:
        self.reads = [[[b"x"]] * transport.RECEIVE_MAX, [[b"x"]]]
        self.disconnected: list[str] = []
        self.refusals: dict[str, str] = {}

    def receive(self, timeout_s: float) -> list[list[bytes]]:
        return self.reads.pop(0) if self.reads else []

    def disconnect(self, endpoint: str) -> None:
        self.disconnected.append(endpoint)


def test_a_run_whose_record_went_is_let_go_only_after_a_read_that_took_all() -> None:
    """A full read may leave the run's bye behind: disconnecting then throws it away."""
    src = ZmqSource(discover=False, local_sampler=False)
    src._known, src._last_error, src._eager_until = {}, {}, 0.0
    src._last_local_sample = src._last_foreign_host_sample = 0.0
    src._ended = [("ipc:///gone.sock", "gone", time.monotonic())]
    src._refused = {}
    sub = FullThenShort()
    events: list[SourceEvent] = []
    src._iteration(sub, events)  # type: ignore[arg-type]
    assert sub.disconnected == [] and src._ended  # a full read: not yet
    src._iteration(sub, events)  # type: ignore[arg-type]
    assert sub.disconnected == ["ipc:///gone.sock"] and not src._ended
    assert [e.state for e in events if isinstance(e, EndpointState)] == ["detached"]


def test_a_flood_of_garbage_is_reported_rate_limited_and_valid_messages_still_pass(
    wired: tuple[Publisher, ZmqSource, Collected],
) -> None:
    pub, _src, got = wired
    assert delivered(pub, got, "before")
    for i in range(5_000):
        pub.send([topic("hello"), payload([i], {})])
    assert delivered(pub, got, "after")
    # The same fault is reported at most once a second, however often it arrives.
    assert 1 <= len(got.bad()) <= 50


KILLABLE = """
import itertools, time
from gputop_dl import probe
for _ in probe.watch(itertools.count()):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("tick_s", [0.25, 1.0 / DEFAULT_REFRESH_HZ])  # the app's timer
def test_a_probe_killed_with_sigkill_is_shown_gone_within_three_seconds(tick_s: float) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": "killme"}
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE], env=env)
    state = ViewerState(socket.gethostname())  # this host: its pids can be checked
    got = Collected()
    src = ZmqSource([endpoint], discover=False, local_sampler=False)
    src.start(got)
    applied = 0

    def shown(now: float) -> RunSummary | None:
        nonlocal applied
        events = got.snapshot()
        state.apply_all(events[applied:])
        applied = len(events)
        state.tick(now)
        return next((run for run in state.runs if run.name == "killme"), None)

    try:
        assert until(lambda: (run := shown(time.time())) is not None and run.step_count > 10)
        proc.send_signal(signal.SIGKILL)  # the OOM killer's way: no bye
        proc.wait()
        killed = time.time()
        gone_at = None
        while gone_at is None and time.time() - killed < DEADLINE_S:
            time.sleep(tick_s)
            now = time.time()
            run = shown(now)
            if run is not None and run.connection.text == GONE_TEXT:
                gone_at = now
        assert gone_at is not None, "never shown as gone"
        assert gone_at - killed <= 3.0
    finally:
        src.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


Entry = tuple[str, "list[SourceEvent] | float"]


class ReadLog(Collected):
    """The source's hand-overs (each one a wake-up of the viewer's queue) and, with
    :class:`LoggedStop`, its gather waits, in the order they came: ``("read", events)``,
    ``("gather", seconds)``."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Entry] = []

    def __call__(self, events: list[SourceEvent]) -> None:
        self.log.append(("read", events))
        super().__call__(events)

    @property
    def emits(self) -> int:
        return sum(1 for what, _ in list(self.log) if what == "read")

    def reads(self) -> list[tuple[int, list[SourceEvent]]]:
        """(position in the log, events) of each hand-over."""
        return [(i, e) for i, (what, e) in enumerate(list(self.log)) if isinstance(e, list)]

    def gathers_in(self, start: int, end: int) -> int:
        return sum(1 for what, _ in self.log[start:end] if what == "gather")

    def summary(self) -> list[tuple[str, float]]:
        """The log with each hand-over's size for its events (for a failure's message)."""
        return [(w, len(e) if isinstance(e, list) else e) for w, e in list(self.log)]


class LoggedStop(threading.Event):
    """The source's stop event, logging each wait into ``log`` (the source's thread only
    waits on it for the gather and after a fault)."""

    def __init__(self, log: list[Entry]) -> None:
        super().__init__()
        self._log = log

    def wait(self, timeout: float | None = None) -> bool:
        self._log.append(("gather", timeout if timeout is not None else -1.0))
        return super().wait(timeout)


@contextlib.contextmanager
def gathering(gather_s: float, got: Collected) -> Iterator[tuple[Publisher, ZmqSource]]:
    """A publisher and a source that gathers for ``gather_s``, joined (one message in)."""
    pub = Publisher("tcp://127.0.0.1:*")
    src = ZmqSource([pub.endpoint], discover=False, local_sampler=False, gather_s=gather_s)
    src.start(got)
    try:
        assert delivered(pub, got, "joined")
        yield pub, src
    finally:
        src.stop()
        pub.close()


def test_a_gathering_source_takes_a_stream_in_few_wake_ups_and_loses_nothing() -> None:
    got = ReadLog()
    with gathering(0.4, got) as (pub, _src):
        emits_before = got.emits
        names = [f"m{i}" for i in range(30)]
        for name in names:  # 30 messages over 0.6 s, as a probe's flushes come
            pub.send(encode(marker(name)))
            time.sleep(0.02)
        assert until(lambda: {"m29"} <= {m.name for m in got.messages() if isinstance(m, Hello)})
        received = [m.name for m in got.messages() if isinstance(m, Hello) and m.name in names]
        assert received == names  # all of them, in order
        # Read every 0.4 s at most: 0.6 s of stream is taken in 3 reads or fewer (30 with
        # a read per message).
        assert got.emits - emits_before <= 3


def test_a_gathering_source_reads_a_backlog_without_waiting_between_reads() -> None:
    """A read that took as many messages as one read takes (transport.RECEIVE_MAX) left more
    behind: waiting ``gather_s`` before the next one caps the source at 1000 messages per
    gather (2,000 a second at the default refresh, against 3,000 from 512 ranks through
    relays), and the screen then falls further behind every second.

    Checked from the order of the source's reads and waits, not from a clock: a loaded
    machine slows both kinds of source alike (CI once took 1.03 s against a 1.0 s bound)."""
    got = ReadLog()
    pub = Publisher("tcp://127.0.0.1:*", send_hwm=100_000)
    src = ZmqSource(
        [pub.endpoint],
        discover=False,
        local_sampler=False,
        gather_s=source_module.gather_for(DEFAULT_REFRESH_HZ),
    )
    src._stop = LoggedStop(got.log)
    src.start(got)
    try:
        assert delivered(pub, got, "joined")
        burst = [encode(marker(f"b{i}")) for i in range(4000)]  # 64 late replays' worth
        for frames in burst:
            pub.send(frames)
        assert until(
            lambda: any(isinstance(m, Hello) and m.name == "b3999" for m in got.messages()[-50:])
        )
    finally:
        src.stop()
        pub.close()
    received = [m.name for m in got.messages() if isinstance(m, Hello) and m.name.startswith("b")]
    assert received == [f"b{i}" for i in range(4000)]  # all of them, in order
    most = transport.RECEIVE_MAX
    reads = got.reads()
    full = [i for i, events in reads if len(events) == most]
    assert full, got.summary()  # no read took RECEIVE_MAX: this test would show nothing
    for i in full:  # a full read is followed by the next read (if more was left), not a gather
        assert got.gathers_in(i + 1, i + 2) == 0, got.summary()[i - 1 : i + 3]
    # ...while a read of fewer does wait the gather (a source that never gathers would pass
    # the check above)
    assert any(got.gathers_in(i + 1, i + 2) for i, events in reads if len(events) < most)


def test_a_run_discovered_while_another_streams_is_read_without_the_gather(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run just found must not wait for the gather: the busy run's messages keep the
    source gathering, and the new run's hello (its name on screen) would come up to
    ``gather_s`` after it was subscribed to. Checked from the order of the source's
    subscriptions, reads and waits, not from a clock (EAGER_AFTER_FOUND_S is raised so
    that a loaded machine's slow subscription does not end the eager reads first)."""
    from gputop_dl.probe import discovery

    busy, new = Publisher("tcp://127.0.0.1:*"), Publisher("tcp://127.0.0.1:*")
    records = [discovery.Record(busy.endpoint, 1, "h", "busy", "probe", 0.0)]
    monkeypatch.setattr(source_module.discovery, "discover", lambda: list(records))
    got = ReadLog()
    src = ZmqSource([], discover=True, local_sampler=False, gather_s=0.5)
    src._stop = LoggedStop(got.log)
    src.start(got)

    def first_read(holds: Callable[[SourceEvent], bool]) -> int | None:
        return next((i for i, events in got.reads() if any(map(holds, events))), None)

    def found(event: SourceEvent) -> bool:
        return isinstance(event, EndpointState) and event.endpoint == new.endpoint

    def hello(event: SourceEvent) -> bool:
        return isinstance(event, Received) and getattr(event.message, "name", "") == "new"

    try:
        assert delivered(busy, got, "busy")
        frames, busy_frames = encode(marker("new")), encode(marker("still busy"))
        # The busy run alone is read in gathers once its own eager second is over.
        assert until(lambda: ("gather", 0.5) in got.log, lambda: busy.send(busy_frames))
        monkeypatch.setattr(source_module, "EAGER_AFTER_FOUND_S", DEADLINE_S)
        records.append(discovery.Record(new.endpoint, 2, "h", "new", "probe", 0.0))
        end = time.monotonic() + DEADLINE_S
        while first_read(hello) is None and time.monotonic() < end:
            new.send(frames)  # as a probe's hello answers a new subscriber
            busy.send(busy_frames)
            time.sleep(0.01)
    finally:
        src.stop()
        busy.close()
        new.close()
    subscribed, named = first_read(found), first_read(hello)
    assert subscribed is not None and named is not None
    # read as it landed, not after a gather
    assert got.gathers_in(subscribed, named) == 0, got.summary()[subscribed : named + 1]


def test_stop_ends_a_gathering_source_at_once() -> None:
    with gathering(60.0, Collected()) as (_pub, src):  # it now waits 60 s to read again
        thread = src._thread
        assert thread is not None
        src.stop()
        thread.join(5.0)
        assert not thread.is_alive()


def test_stop_wakes_a_source_out_of_a_long_wait_for_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet stream: the thread waits in its poll until the next duty (discovery, the
    local sample: about a second), not 0.1 s at a time; ``stop`` ends that wait."""
    monkeypatch.setattr(source_module, "IDLE_POLL_S", 60.0)
    with gathering(0.0, Collected()) as (_pub, src):
        time.sleep(0.3)  # in its poll now, with nothing to read
        thread = src._thread
        assert thread is not None
        src.stop()  # joins for 2 s at most: a thread still polling would be alive after
        assert not thread.is_alive()


@pytest.mark.parametrize(
    ("discover", "local", "last_discover", "last_local", "last_probe_sample", "wait_s"),
    [
        (False, False, 0.0, 0.0, 0.0, 1.0),  # nothing else to do: IDLE_POLL_S
        (True, False, 99.7, 0.0, 0.0, 0.7),  # discovery due at 100.7
        (False, True, 0.0, 99.2, 0.0, 0.2),  # the local sample due at 100.2
        (True, True, 99.9, 99.5, 0.0, 0.5),
        (True, False, 50.0, 0.0, 0.0, 0.0),  # overdue: no wait
        # A probe samples this host: no local sample while its samples come, so none due
        # (the local one's second long past, it spun at poll(0) between the probe's)
        (False, True, 0.0, 50.0, 99.8, 1.0),
        (False, True, 0.0, 50.0, 97.5, 0.5),  # the probe silent: local sampling from 100.5
    ],
)
def test_the_poll_waits_until_the_next_duty(
    discover: bool,
    local: bool,
    last_discover: float,
    last_local: float,
    last_probe_sample: float,
    wait_s: float,
) -> None:
    src = ZmqSource([], discover=discover, local_sampler=local)
    src._last_discover, src._last_local_sample = last_discover, last_local
    src._last_foreign_host_sample = last_probe_sample
    assert src._poll_s(100.0) == pytest.approx(wait_s)


class CountedReceives(Subscriber):
    calls = 0

    def receive(self, timeout_s: float, max_messages: int = 1000) -> list[list[bytes]]:
        CountedReceives.calls += 1
        return super().receive(timeout_s, max_messages)


def test_a_probe_sampling_this_host_does_not_make_the_source_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The viewer's default: the local sampler on, a probe on this host sending its node
    samples (so the viewer does not sample). The thread waits for messages between them."""
    monkeypatch.setattr(source_module, "Subscriber", CountedReceives)
    CountedReceives.calls = 0
    pub = Publisher("tcp://127.0.0.1:*")
    got = Collected()
    src = ZmqSource([pub.endpoint], discover=False, local_sampler=True)
    src.start(got)
    frames = encode(System("probe:1", system_sample(time.time(), host=socket.gethostname())))
    try:
        assert until(
            lambda: any(isinstance(m, System) for m in got.messages()), lambda: pub.send(frames)
        )
        before = CountedReceives.calls
        for _ in range(8):  # 2 s of a probe's samples, more often than it sends them
            pub.send(frames)
            time.sleep(0.25)
        # A wake-up per message and per idle second at most: ~10. Spinning: ~10^5.
        assert CountedReceives.calls - before <= 30
    finally:
        src.stop()
        pub.close()


@pytest.mark.parametrize(
    ("refresh_hz", "gather_s"),
    [(0.0, 0.0), (0.5, 0.5), (1.0, 0.5), (2.0, 0.25), (4.0, 0.125), (10.0, 0.05)],
)
def test_a_viewer_gathers_for_half_its_refresh_period(refresh_hz: float, gather_s: float) -> None:
    assert source_module.gather_for(refresh_hz) == pytest.approx(gather_s)


def test_a_refused_handshake_is_reported_once_per_reason() -> None:
    """libzmq retries a server that refuses this viewer's key: the reason is an endpoint
    error once (the error line, snapshot's errors), not on every retry."""
    src = ZmqSource(discover=False, local_sampler=False)
    src._known, src._last_error, src._eager_until = {}, {}, 0.0
    src._last_local_sample = src._last_foreign_host_sample = 0.0
    src._ended, src._refused = [], {}
    sub = FullThenShort()
    sub.reads = [[], [], []]
    sub.refusals["tcp://node1:5555"] = transport.HANDSHAKE_FAILED[
        int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    ]
    events: list[SourceEvent] = []
    for _ in range(3):
        src._iteration(sub, events)  # type: ignore[arg-type]
    errors = [e for e in events if isinstance(e, EndpointState)]
    assert [(e.endpoint, e.state) for e in errors] == [("tcp://node1:5555", "error")]
    assert errors[0].detail.startswith("authentication failed")
    state = ViewerState(socket.gethostname())
    state.apply_all(events)
    assert any("authentication failed" in e.text for e in state.errors), state.errors
