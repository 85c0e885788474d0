"""Audit 52: what the header says with no node sampled, what a recording's snapshot says
before its first run, the repeats of history replays a recorder leaves out, and the exit
tables of ``record`` and ``export``.

Real parts where it matters: a real probe in a training process, ``gputop record`` and
real ZeroMQ viewers attaching to it; the viewer with a real ZmqSource.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe.messages import Steps, System
from gputop_dl.probe.protocol import decode, encode, encode_steps
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.cli import main
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.format import fmt_duration
from gputop_dl.tui.record.reader import load_timeline
from gputop_dl.tui.record.repeats import Repeats, Span, Spans, spans_of
from gputop_dl.tui.snapshot import render_text
from gputop_dl.tui.source import ZmqSource
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, step_records, steps_events, systems_events
from tests.recordings import write_events
from tests.wire_reader import WireReader

# ------------------------------------------------- 1. the header with no node sampled


@pytest.mark.parametrize(
    ("local_sampler", "discover", "endpoints", "expected"),
    [
        (True, True, [], ()),  # its first sample comes within a second
        (True, False, ["ipc:///x.sock"], ()),
        (False, True, [], ("no node sampled", "looking for probes in {runtime}")),
        (False, False, ["tcp://10.0.0.1:5555"], ("no node sampled",)),
    ],
)
def test_what_a_source_waits_for(
    runtime_dir: Path,
    local_sampler: bool,
    discover: bool,
    endpoints: list[str],
    expected: tuple[str, ...],
) -> None:
    source = ZmqSource(endpoints, discover=discover, local_sampler=local_sampler)
    assert source.waiting_for() == tuple(text.format(runtime=runtime_dir) for text in expected)


def test_a_refused_runtime_directory_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    monkeypatch.setenv("GPUTOP_RUNTIME_DIR", str(open_dir))
    source = ZmqSource([], discover=True, local_sampler=False)
    assert source.waiting_for() == (
        "no node sampled",
        "no probe can be found: the runtime directory is refused",
    )


async def test_no_local_and_no_probe_the_header_says_what_is_true(runtime_dir: Path) -> None:
    """`gputop --no-local` with no probe: the header read "waiting for samples" for ever
    (none could come)."""
    source = ZmqSource([], discover=True, local_sampler=False)
    app = GputopApp(source, local_host=HOST)
    async with app.run_test(size=(160, 30)) as pilot:
        for _ in range(4):
            await pilot.pause()
        line = app.header.build(160)[0].plain
    assert "waiting for samples" not in line, line
    assert "no node sampled" in line and f"looking for probes in {runtime_dir}" in line, line


# ---------------------------------------- 2. a recording's snapshot before its first run

AGENT = "gpu-node-07:1"
FIRST_RUN_S = 30.0


def agent_then_run() -> list[SourceEvent]:
    """An agent samples the node from T0; a training run starts 30 s later."""
    start = T0 + FIRST_RUN_S
    events: list[SourceEvent] = [Received(hello(AGENT, name="agent", role="agent"), T0)]
    events += systems_events(T0 + 0.5, T0 + 60.0, AGENT, gpu_count=0)
    events.append(Received(hello(started=start), start))
    events += steps_events(step_records(start + 0.1, 29.0))
    received = sorted((e for e in events if isinstance(e, Received)), key=lambda e: e.received)
    return [Received(decode(encode(e.message)), e.received) for e in received]


def test_a_snapshot_before_the_first_run_says_none_had_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.gtrec"
    write_events(path, agent_then_run())
    assert main(["snapshot", str(path), "--at", "10s"]) == 1  # no run at that moment
    out = capsys.readouterr().out
    assert "no training run (agent only)" not in out, out
    assert (
        f"node {HOST}: no run yet at {fmt_duration(10.0)} into the recording; the first run "
        f"starts at {fmt_duration(FIRST_RUN_S)} (--at 30s)"
    ) in out, out


@pytest.mark.parametrize(
    ("agent_only", "expected"),
    [
        (["n1", "n2"], ["node n1: {not_yet}", "node n2: {not_yet}"]),
        ([], ["{not_yet}"]),  # not "instrument one": the recording holds one
    ],
)
def test_render_text_before_the_first_run(agent_only: list[str], expected: list[str]) -> None:
    snap: dict[str, Any] = {
        "host": None,
        "runs": [],
        "agent_only": agent_only,
        "hosts": [],
        "systems": {},
        "system": None,
        "errors": [],
        "jobs": [],
        "recording": {"start": 100.0, "at": 105.0, "first_run": 190.04},
    }
    not_yet = (
        f"no run yet at {fmt_duration(5.0)} into the recording; the first run starts at "
        f"{fmt_duration(90.04)} (--at 90.1s)"
    )
    assert render_text(snap).splitlines() == [line.format(not_yet=not_yet) for line in expected]


# ------------------------------------------------ 3. the repeats of history replays


@pytest.mark.parametrize(
    ("indices", "expected"),
    [
        ([], []),
        ([3], [(3, 3)]),
        ([5, 1, 2, 3, 7, 8, 2], [(1, 3), (5, 5), (7, 8)]),
    ],
)
def test_spans_of(indices: list[int], expected: list[Span]) -> None:
    assert spans_of(indices) == expected


@pytest.mark.parametrize(
    ("added", "asked", "covered", "spans"),
    [
        ([], [(0, 0)], False, []),
        ([[(0, 9)]], [(0, 9)], True, [(0, 9)]),
        ([[(0, 9)]], [(5, 10)], False, [(0, 9)]),
        ([[(0, 4)], [(5, 9)]], [(2, 7)], True, [(0, 9)]),  # adjacent spans merge
        ([[(0, 4)], [(6, 9)]], [(2, 7)], False, [(0, 4), (6, 9)]),  # a step missed
        ([[(0, 4)], [(6, 9)]], [(6, 9), (1, 2)], True, [(0, 4), (6, 9)]),
        ([[(6, 9)], [(0, 20)]], [(10, 20)], True, [(0, 20)]),
    ],
)
def test_spans_cover(
    added: list[list[Span]], asked: list[Span], covered: bool, spans: list[Span]
) -> None:
    seen = Spans()
    for more in added:
        seen.add(more)
    assert seen.covers(asked) is covered
    assert seen.spans == spans


def test_spans_keep_the_newest_when_full() -> None:
    seen = Spans(limit=2)
    seen.add([(0, 0), (2, 2), (4, 4)])
    assert seen.spans == [(2, 2), (4, 4)]


def steps(indices: Sequence[int], source_id: str = SOURCE_ID) -> list[bytes]:
    """A ``steps`` message of these step indices, 10 ms apart, as a probe sends it."""
    rows = [(i, 10_000 * i, 10_000, 1_000, 32) for i in indices]
    return encode_steps(source_id, T0, rows, sent=len(indices), dropped=0, dropped_steps=0)


def sample(at: float, source_id: str = SOURCE_ID) -> list[bytes]:
    (event,) = systems_events(at, at, source_id, gpu_count=0)
    assert isinstance(event, Received)
    return encode(event.message)


def indices_of(frames: list[bytes] | None) -> list[int] | None:
    if frames is None:
        return None
    message = decode(frames)
    assert isinstance(message, Steps)
    return [record.index for record in message.records]


@pytest.mark.parametrize(
    ("sent", "recorded"),
    [
        # live flushes, then a replay of the history: repeats left out
        ([range(0, 5), range(5, 10), range(0, 10)], [range(0, 5), range(5, 10), None]),
        # the replay's last message holds steps not sent live yet: cut to those
        ([range(0, 5), range(0, 8)], [range(0, 5), range(5, 8)]),
        # a replay that fills a gap (a live message lost): the missed steps kept
        ([range(0, 5), range(8, 10), range(0, 10)], [range(0, 5), range(8, 10), range(5, 8)]),
        # another publisher's steps are its own
        ([range(0, 5), ("other", range(0, 5))], [range(0, 5), range(0, 5)]),
    ],
)
def test_a_recorder_keeps_each_step_once(sent: list[Any], recorded: list[range | None]) -> None:
    repeats = Repeats()
    got = []
    for message in sent:
        source_id, indices = message if isinstance(message, tuple) else (SOURCE_ID, message)
        got.append(indices_of(repeats.news(steps(indices, source_id))))
    assert got == [None if r is None else list(r) for r in recorded]


def test_a_cut_message_keeps_its_values_and_counters() -> None:
    repeats = Repeats()
    repeats.news(steps(range(0, 5)))
    whole = decode(steps(range(0, 8)))
    cut = repeats.news(steps(range(0, 8)))
    assert cut is not None
    message = decode(cut)
    assert isinstance(message, Steps) and isinstance(whole, Steps)
    assert list(message.records) == list(whole.records)[5:]
    assert (message.sent, message.dropped, message.dropped_steps) == (
        whole.sent,
        whole.dropped,
        whole.dropped_steps,
    )


def test_replayed_samples_are_left_out_and_a_new_process_starts_afresh() -> None:
    repeats = Repeats()
    first = [sample(T0 + s) for s in range(3)]
    assert all(repeats.news(frames) is frames for frames in first)
    assert all(repeats.news(frames) is None for frames in first)  # the replay's samples
    assert repeats.news(sample(T0 + 3)) is not None
    hello_frames = encode(hello())
    assert repeats.news(hello_frames) is hello_frames  # a hello is always kept
    assert repeats.news(steps(range(0, 5))) is not None
    # The same host:pid, another process (the pid reused): its step 0 is news.
    assert repeats.news(encode(hello(started=T0 + 100))) is not None
    assert indices_of(repeats.news(steps(range(0, 5)))) == [0, 1, 2, 3, 4]


TRAIN = textwrap.dedent(
    """
    import sys, time
    from gputop_dl import probe
    stop = time.monotonic() + float(sys.argv[1])
    for step in probe.watch(range(10**9)):
        time.sleep(0.01)
        if time.monotonic() > stop:
            break
    """
)


@pytest.mark.e2e
def test_viewers_attaching_while_recording_add_no_repeats(
    runtime_dir: Path, tmp_path: Path
) -> None:
    """A real training's probe, ``gputop record`` on it, and viewers attaching and
    detaching meanwhile: each attach made the probe replay its history to every
    subscriber, and the recording kept every replay (it grew 3x with 20 attaches in a
    minute). Now each step and each node sample is in it once, and none is missing."""
    endpoint = f"ipc://{runtime_dir}/train.sock"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": "audit52"}
    train = subprocess.Popen([sys.executable, "-c", TRAIN, "40"], env=env)
    path = tmp_path / "r.gtrec"
    record = None
    try:
        deadline = time.monotonic() + 30
        while not Path(endpoint.removeprefix("ipc://")).exists():
            assert time.monotonic() < deadline and train.poll() is None
            time.sleep(0.1)
        record = subprocess.Popen(
            [sys.executable, "-m", "gputop_dl", "record", str(path), endpoint, "--no-local"],
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3.0)  # past its imports: recording
        for _ in range(4):  # two viewers at a time, attaching and going
            viewers = [WireReader(endpoint), WireReader(endpoint)]
            for viewer in viewers:
                viewer.pump(1.0)
            assert any(m["kind"] == "steps" for m in viewers[0].messages)  # the replay came
            for viewer in viewers:
                viewer.close()
            time.sleep(0.5)
        time.sleep(1.5)
        record.send_signal(signal.SIGINT)  # stopped by hand
        _, err = record.communicate(timeout=20)
    finally:
        for proc in (record, train):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert record.returncode == 0, err
    timeline = load_timeline(path)
    indices: list[int] = []
    times: list[float] = []
    for event in timeline.events:
        if isinstance(event, Received) and isinstance(event.message, Steps):
            indices += [r.index for r in event.message.records]
        elif isinstance(event, Received) and isinstance(event.message, System):
            times.append(event.message.sample.time)
    assert len(indices) > 200
    assert len(indices) == len(set(indices)), "a step recorded twice"
    assert sorted(indices) == list(range(min(indices), max(indices) + 1)), "a step missing"
    assert times and len(times) == len(set(times)), "a node sample recorded twice"
    assert "repeats of history replays left out" in err, err


# ----------------------------------------------------- 4. the exit tables of --help


@pytest.mark.parametrize(
    ("command", "lines"),
    [
        (
            "record",
            [
                "0 stopped by hand (Ctrl-C, SIGINT) or at --duration",
                "1 no run reachable: nothing listens on any ENDPOINT",
                "or the recording stopped on a write error (disk full)",
                "2 usage error: bad arguments, FILE cannot be created",
                "129 SIGHUP, 143 SIGTERM",
            ],
        ),
        (
            "keys",
            [
                "0 the key pair was created or shown, and the keys authorized",
                "1 the keys directory cannot be used",
                "2 usage error: bad arguments, an --authorize that is no CURVE public key",
            ],
        ),
        (
            "export",
            [
                "0 the files were written",
                "1 FILE cannot be read (no such file, not a recording), or an output cannot "
                "be written",
                "2 usage error: bad arguments, neither --perfetto nor --csv",
                "130 SIGINT",
            ],
        ),
    ],
)
def test_record_and_export_help_have_their_exit_table(
    command: str, lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status:" in text, text
    for line in lines:
        assert line in text, line


# ------------------------------------------------ 5. keys: never replaced unasked


def test_a_damaged_key_pair_is_left_as_it_is_and_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Replaced silently, every node holding the old public key refused this user."""
    from gputop_dl.probe.transport import KEY_FILE, keys_dir

    assert main(["keys"]) == 0
    secret = keys_dir() / KEY_FILE
    secret.write_text('public-key = "damaged"\n')
    capsys.readouterr()
    assert main(["keys"]) == 1
    err = capsys.readouterr().err
    assert "exists but is no CURVE key pair" in err and "--force" in err, err
    assert secret.read_text() == 'public-key = "damaged"\n'
    assert main(["keys", "--force"]) == 0  # asked for: replaced
    assert "created" in capsys.readouterr().out


def test_keys_that_cannot_be_written_are_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gputop_dl.probe.transport import keys_dir

    directory = keys_dir()
    (directory / "gputop.key").mkdir(parents=True)  # cannot be replaced by a file
    assert main(["keys"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gputop keys: cannot write the keys in"), err
