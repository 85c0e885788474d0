"""A probe's history replay (docs/protocol.md, "History on attach") taken once: its node
samples were appended to the histories again, and counted twice in the figures; and a
recording's own node sampler, replayed in another process, read as an agent."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import gputop_dl.tui.state as state_module
from gputop_dl.probe.messages import Hello, System
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.analysis.host import host_stats
from gputop_dl.tui.analyzer import Verdict, Window, analyze
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.record.reader import load_timeline
from gputop_dl.tui.record.replay import recorder_sampler, replay_state
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.state.clean import evolve
from gputop_dl.tui.state.hosts import keep_recent
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, system_sample


def sample(at: float, interval_s: float = 1.0) -> SystemSample:
    return SystemSample(time=at, host=HOST, interval_s=interval_s)


def times(history: Sequence[SystemSample]) -> list[float]:
    return [s.time for s in history]


def span(first: int, last: int) -> list[float]:
    return [float(t) for t in range(first, last + 1)]


# ------------------------------------------------------------------ keep_recent
@pytest.mark.parametrize(
    ("held", "maxlen", "interval_s", "keep_s", "arriving", "kept", "expected"),
    [
        pytest.param(
            span(1, 10), 300, 1.0, 100.0, span(1, 10), [False] * 10, span(1, 10), id="repeats-all"
        ),
        # The probe sent its sample of now live, then its history: a late viewer fills it.
        pytest.param(
            [60.0], 300, 1.0, 100.0, span(1, 60), [True] * 59 + [False], span(1, 60), id="late"
        ),
        pytest.param(
            [*span(1, 4), *span(6, 10)],
            300,
            1.0,
            100.0,
            span(1, 10),
            [False] * 4 + [True] + [False] * 5,
            span(1, 10),
            id="fills-a-lost-sample",
        ),
        # A replayed sample more than keep_s older than the newest is not kept.
        pytest.param(
            span(150, 160), 300, 1.0, 100.0, span(40, 59), [False] * 20, span(150, 160), id="old"
        ),
        pytest.param(
            span(6, 10), 5, 1.0, 100.0, span(1, 10), [False] * 10, span(6, 10), id="full-repeats"
        ),
        pytest.param(
            [6.0, 7.0, 9.0, 10.0, 11.0],
            5,
            1.0,
            100.0,
            [8.0, 11.0],
            [True, False],
            [7.0, 8.0, 9.0, 10.0, 11.0],
            id="full-missed-one",
        ),
        # Further back than a replay of 60 samples reaches: the clock stepped back.
        pytest.param(
            span(1000, 1010),
            300,
            1.0,
            100.0,
            [1010.0, 600.0],
            [False, True],
            [*span(1000, 1010), 600.0],
            id="clock-stepped-back",
        ),
        # Every 60 s: a replay reaches an hour back, not a clock stepped back 7 minutes.
        pytest.param(
            [3000.0, 3060.0],
            300,
            60.0,
            600.0,
            [2640.0, 3000.0],
            [True, False],
            [2640.0, 3000.0, 3060.0],
            id="slow-sampler",
        ),
    ],
)
def test_keep_recent_takes_a_sample_once_in_time_order(
    held: list[float],
    maxlen: int,
    interval_s: float,
    keep_s: float,
    arriving: list[float],
    kept: list[bool],
    expected: list[float],
) -> None:
    history: deque[SystemSample] = deque((sample(t, interval_s) for t in held), maxlen=maxlen)
    took = [keep_recent(history, sample(t, interval_s), keep_s) for t in arriving]
    assert times(history) == expected
    assert took == kept


# ---------------------------------------------------------------- the figures
def swapping(at: float, swap_in_bps: float) -> Received:
    base = system_sample(at, with_processes=False)
    assert base.memory is not None
    shown = evolve(base, memory=evolve(base.memory, swap_in_bps=swap_in_bps))
    return Received(System(SOURCE_ID, shown), at + 0.02)


def test_a_replay_does_not_count_twice_in_the_analyzers_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Samples 1..10 s (no swap), a replay of them (another viewer attached), then 4 s of
    swapping at 50 MB/s. The last 6 s hold 3 samples without swap and 4 with: the median
    is 50 MB/s. With the replay appended the window held 8..10 twice: median 0 over 10."""
    windows: list[Window] = []

    def spy(window: Window, previous: Verdict | None = None) -> Verdict:
        windows.append(window)
        return analyze(window, previous)

    monkeypatch.setattr(state_module, "analyze", spy)
    state = ViewerState(HOST)
    state.apply(Received(hello(started=T0), T0))
    first = [swapping(T0 + t, 0.0) for t in range(1, 11)]
    state.apply_all(first)
    state.apply_all(Received(e.message, T0 + 10.5) for e in first)  # the replay
    state.apply_all(swapping(T0 + t, 50e6) for t in range(11, 15))
    state.tick(T0 + 14.0)
    (window,) = windows
    expected = [T0 + t for t in range(1, 15)]
    assert times(window.systems) == expected
    assert times(state.host_history(HOST)) == expected
    stats = host_stats(window.systems, HOST, window.now)
    assert stats.n_host_samples == 7
    assert stats.swap_in_bps == 50e6


# ------------------------------------------------------- a real probe, real ZeroMQ
PROBE = """
import sys
from gputop_dl.probe.core import Probe

probe = Probe(name="replay52", sample_host=True, system_interval_s=0.2)
print(probe.endpoint, flush=True)
sys.stdin.read()  # until the test closes it
probe.close()
"""


@pytest.fixture
def probe() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stdin is not None
    endpoint = proc.stdout.readline().decode().strip()
    try:
        assert endpoint, "the probe did not start"
        yield endpoint
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def node_samples(events: Sequence[SourceEvent]) -> list[float]:
    return [
        e.message.sample.time
        for e in events
        if isinstance(e, Received) and isinstance(e.message, System)
    ]


def test_a_second_subscriber_s_replay_leaves_the_histories_as_they_were(probe: str) -> None:
    """The probe samples its node unwatched (every 5 s) before the viewer attaches: the
    replay on attach fills the viewer's history from before it. A second subscriber then
    makes the probe replay to everyone: the viewer's histories hold each sample once."""
    time.sleep(5.5)  # two unwatched samples, at least
    attached = time.time()
    events: list[SourceEvent] = []
    state = ViewerState(socket.gethostname())
    viewer = ZmqSource([probe], discover=False, local_sampler=False)
    viewer.start(events.extend)
    other = ZmqSource([probe], discover=False, local_sampler=False)
    try:

        def take_until(done: float) -> None:
            while time.time() < done:
                time.sleep(0.1)
                batch, events[:] = list(events), []
                state.apply_all(batch)
                seen.extend(node_samples(batch))
                state.tick(time.time())

        seen: list[float] = []
        take_until(time.time() + 3.0)  # the replay on attach, and ~10 live samples
        before = len(seen)
        other.start(lambda _: None)  # another viewer: the probe replays to both
        take_until(time.time() + 3.0)
    finally:
        other.stop()
        viewer.stop()
    repeats = [t for i, t in enumerate(seen) if t in seen[:i]]
    assert len(repeats) >= 10, "no replay came to the second subscription"
    assert any(t in seen[:before] for t in seen[before:]), "no replay after the second"
    (run,) = state.runs
    history = times(state.host_history(socket.gethostname()))
    assert history == sorted(set(history)), "a node sample twice, or out of order"
    # Sampled before the viewer connected: only the replay on attach brought it.
    assert history[0] < attached, "the replay on attach did not fill the history"
    assert len(history) == len(set(seen))
    own = times(state._sources[run.key].systems)
    assert own == sorted(set(own))


# ------------------------------------------- the recorder's own sampler on replay
def recorder_hello(**changes: object) -> Hello:
    """What tui.source's local sampler says: an agent, not its node's host sampler."""
    local = Hello(f"{HOST}:77", "agent", "this host", HOST, 77, T0, "0.1.0")
    return evolve(local, **changes)


@pytest.mark.parametrize(
    ("hello_", "own"),
    [
        pytest.param(recorder_hello(), True, id="the-recorders-sampler"),
        pytest.param(recorder_hello(host_sampler=True), False, id="a-gputop-agent"),
        pytest.param(recorder_hello(host="node2", source_id="node2:77"), False, id="another-hosts"),
        pytest.param(recorder_hello(source_id=f"{HOST}:78"), False, id="another-process"),
    ],
)
def test_the_recorders_sampler_is_told_from_an_agent(hello_: Hello, own: bool) -> None:
    assert recorder_sampler(HOST)(hello_) is own


def record(path: Path, seconds: float) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "record", "--duration", str(seconds), str(path)],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()


def test_a_recording_s_own_sampler_is_no_agent_on_replay(tmp_path: Path) -> None:
    """``gputop record`` sampling its host (no probe there), replayed by another process:
    the host is the recorder's, not "(agent only)". A real ``gputop agent`` recorded
    still is one."""
    host = socket.gethostname()
    alone = tmp_path / "alone.gtrec"
    record(alone, 2.5)
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--json", str(alone)],
        capture_output=True,
        timeout=60,
    )
    snap = json.loads(out.stdout)
    assert snap["system"]["host"] == host  # the recorder's sampler's samples are there
    assert snap["agent_only"] == []
    text = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", str(alone)],
        capture_output=True,
        timeout=60,
    ).stdout.decode()
    assert "agent only" not in text and f"host {host}:" in text

    agent = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "agent", "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert agent.stdout is not None and "publishing on" in agent.stdout.readline().decode()
        with_agent = tmp_path / "agent.gtrec"
        record(with_agent, 2.5)  # discovers the agent in the runtime dir
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert replay_state(load_timeline(str(with_agent))).state.agent_only_hosts() == (host,)
