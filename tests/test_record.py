"""Recordings: the file format (damage, truncation, sizes, rotation), the raw tap on the
live source, and ``gputop record`` on a real training killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe.messages import Steps, System
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.probe.transport import Publisher
from gputop_dl.tui.events import Received
from gputop_dl.tui.record.commands import parse_moment, size_arg
from gputop_dl.tui.record.format import (
    CHUNK_MAGIC,
    CODEC_ZLIB,
    CODEC_ZSTD,
    MAGIC,
    MAX_CHUNK_BYTES,
    NotARecording,
    ReadNotes,
    encode_chunk,
    encode_entry,
    is_recording,
    iter_chunks,
    iter_entries,
    read_header,
)
from gputop_dl.tui.record.reader import load_timeline, open_recording
from gputop_dl.tui.record.recorder import TapRecorder
from gputop_dl.tui.record.writer import RecordWriter
from gputop_dl.tui.source import ZmqSource
from tests.fakes_tui import HOST, T0, hello, live_run
from tests.recordings import write_events

# ------------------------------------------------------------------ round trip


def frames_of(path: Path) -> list[tuple[float, list[bytes]]]:
    return [(e.received, e.frames) for e in open_recording(path).entries()]


@pytest.mark.parametrize("codec", [CODEC_ZSTD, CODEC_ZLIB])
def test_frames_come_back_byte_for_byte_with_their_times(tmp_path: Path, codec: int) -> None:
    events = live_run(T0 + 30.0, duration_s=30.0)
    path = tmp_path / "r.gtrec"
    write_events(path, events, codec=codec, chunk_every=7)
    stored = frames_of(path)
    expected = [(e.received, encode(e.message)) for e in events if isinstance(e, Received)]
    assert stored == expected
    with open(path, "rb") as stream:
        header = read_header(stream)
    assert header.codec == {CODEC_ZSTD: "zstd", CODEC_ZLIB: "gzip"}[codec]
    assert header.protocol == (2, 0) and header.host == HOST
    assert is_recording(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # what the runs published: theirs


def test_a_recording_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "r.gtrec"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        RecordWriter(path, host=HOST)
    assert path.read_bytes() == b"precious"


def test_not_a_recording_is_said(tmp_path: Path) -> None:
    path = tmp_path / "x"
    for content in (b"", b"hello world", MAGIC + b"\x09\x00" + b"\0" * 4, MAGIC + b"\x01\x00"):
        path.write_bytes(content)
        with pytest.raises(NotARecording):
            open_recording(path)
    header = MAGIC + struct.pack("<HI", 1, 5) + b"{bad}"
    path.write_bytes(header)
    with pytest.raises(NotARecording):
        open_recording(path)


# ------------------------------------------------------------ damage and bounds


def three_chunks(tmp_path: Path) -> tuple[Path, int]:
    """A recording of 3 chunks of 10 messages; the byte where the third chunk starts."""
    events = live_run(T0 + 30.0, duration_s=30.0)[:30]
    path = tmp_path / "r.gtrec"
    write_events(path, events, chunk_every=10)
    data = path.read_bytes()
    third = data.rfind(CHUNK_MAGIC)
    return path, third


def test_every_truncation_of_the_last_chunk_keeps_the_others(tmp_path: Path) -> None:
    path, third = three_chunks(tmp_path)
    data = path.read_bytes()
    whole = frames_of(path)
    assert len(whole) == 30
    for cut in range(third, len(data), 7):  # a recorder killed in the middle of a write
        path.write_bytes(data[:cut])
        recording = open_recording(path)
        assert [(e.received, e.frames) for e in recording.entries()] == whole[:20]
        if cut > third:
            assert recording.notes.count == 1
            assert "truncated" in recording.notes.notes[0]


def test_a_damaged_chunk_is_skipped_and_the_next_ones_read(tmp_path: Path) -> None:
    path, third = three_chunks(tmp_path)
    data = bytearray(path.read_bytes())
    second = data.rfind(CHUNK_MAGIC, 0, third)
    for offset in (second + 5, second + 20, (second + third) // 2):  # header, payload
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        path.write_bytes(bytes(damaged))
        recording = open_recording(path)
        got = [(e.received, e.frames) for e in recording.entries()]
        whole = frames_of_bytes(tmp_path, bytes(data))
        assert got == whole[:10] + whole[20:], offset
        assert recording.notes.count >= 1
    garbage = bytes(data[:third]) + os.urandom(3000) + bytes(data[third:])
    path.write_bytes(garbage)
    assert len(frames_of(path)) == 30  # random bytes between chunks: skipped, found again


def test_a_zstd_recording_without_zstandard_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe-only install read a zstd recording with one note a chunk ("chunk at byte
    N skipped: ...", 32 lines for a short recording), naming no remedy."""
    path = tmp_path / "r.gtrec"
    write_events(path, live_run(T0 + 30.0, duration_s=30.0), codec=CODEC_ZSTD, chunk_every=7)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard: ImportError
    recording = open_recording(path)
    assert list(recording.entries()) == []
    assert recording.notes.count > 3
    assert recording.notes.notes == [
        "zstd chunks skipped: zstandard is not installed (pip install 'gputop-dl[viewer]')"
    ]


def frames_of_bytes(tmp_path: Path, data: bytes) -> list[tuple[float, list[bytes]]]:
    other = tmp_path / "clean.gtrec"
    other.write_bytes(data)
    return frames_of(other)


def test_oversized_claims_are_refused_without_allocating(tmp_path: Path) -> None:
    notes = ReadNotes()
    head = struct.pack("<4sBII", CHUNK_MAGIC, CODEC_ZLIB, MAX_CHUNK_BYTES + 1, 10)
    crc = zlib.crc32(b"x", zlib.crc32(head))
    stream = _bytes_stream(head + struct.pack("<I", crc) + b"x")
    assert list(iter_chunks(stream, notes)) == []
    assert notes.count >= 1 and "claims" in notes.notes[0]


def test_a_chunk_that_inflates_beyond_its_claim_is_refused() -> None:
    raw = b"\0" * 100_000
    chunk = bytearray(encode_chunk(CODEC_ZLIB, raw))
    struct.pack_into("<I", chunk, 9, 1000)  # says 1000 bytes: a decompression bomb
    crc = zlib.crc32(bytes(chunk[17:]), zlib.crc32(bytes(chunk[:13])))
    struct.pack_into("<I", chunk, 13, crc)
    notes = ReadNotes()
    assert list(iter_chunks(_bytes_stream(bytes(chunk)), notes)) == []
    assert "inflates" in notes.notes[0]
    for codec in (CODEC_ZSTD, CODEC_ZLIB):  # both codecs refuse a wrong claim
        chunk = bytearray(encode_chunk(codec, raw))
        struct.pack_into("<I", chunk, 9, 99_999)
        crc = zlib.crc32(bytes(chunk[17:]), zlib.crc32(bytes(chunk[:13])))
        struct.pack_into("<I", chunk, 13, crc)
        notes = ReadNotes()
        assert list(iter_chunks(_bytes_stream(bytes(chunk)), notes)) == []


@pytest.mark.parametrize(
    "raw",
    [
        encode_entry([b"gputop.hello", b"x"], T0)[:-1],  # frame cut short
        struct.pack("<dB", T0, 200),  # 200 frames
        struct.pack("<dBI", T0, 1, 64 * 1024 * 1024),  # a 64 MiB frame
        struct.pack("<dB", float("nan"), 0),  # an impossible time
        struct.pack("<dB", -5.0, 0),
        b"\x01\x02",
    ],
)
def test_malformed_entries_end_their_chunk_with_a_note(raw: bytes) -> None:
    good = encode_entry([b"gputop.bye", b"y"], T0)
    notes = ReadNotes()
    entries = list(iter_entries(good + raw, notes))
    assert [e.frames for e in entries] == [[b"gputop.bye", b"y"]]
    assert notes.count == 1


def _bytes_stream(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


# --------------------------------------------------------------------- rotation


def test_max_size_rotates_into_parts_read_back_in_order(tmp_path: Path) -> None:
    events = live_run(T0 + 400.0, duration_s=400.0)
    path = tmp_path / "r.gtrec"
    writer = write_events(path, events, max_size=64 * 1024, chunk_every=20)
    parts = sorted(tmp_path.glob("r.gtrec*"), key=lambda p: (len(p.name), p.name))
    assert writer.part >= 2 and len(parts) == writer.part + 1
    assert [p.name for p in parts[:3]] == ["r.gtrec", "r.gtrec.1", "r.gtrec.2"]
    with open(path, "rb") as stream:
        first = read_header(stream)
    for part in parts:
        assert part.stat().st_size <= 64 * 1024
        with open(part, "rb") as stream:
            assert read_header(stream).recording == first.recording
    expected = [(e.received, encode(e.message)) for e in events if isinstance(e, Received)]
    assert frames_of(path) == expected  # FILE follows its parts
    # a part of another recording with the next number is not taken for this one's
    parts[-1].rename(tmp_path / "saved")
    write_events(parts[-1], events[:5])
    assert len(frames_of(path)) < len(expected)


def test_a_chunk_is_written_a_second_after_its_first_message(tmp_path: Path) -> None:
    now = [100.0]
    path = tmp_path / "r.gtrec"
    writer = RecordWriter(path, host=HOST, clock=lambda: now[0])
    header_size = path.stat().st_size
    writer.add(encode(hello()), T0)
    now[0] += 0.5
    writer.tick()
    assert path.stat().st_size == header_size  # buffered
    now[0] += 0.6
    writer.tick()
    assert path.stat().st_size > header_size  # a kill now would lose nothing
    assert len(frames_of(path)) == 1


def test_the_tap_recorder_flushes_by_itself_and_stops_on_a_write_error(tmp_path: Path) -> None:
    path = tmp_path / "r.gtrec"
    recorder = TapRecorder(RecordWriter(path, host=HOST))
    recorder.tap(encode(hello()), T0)
    deadline = time.monotonic() + 10
    while not frames_of(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(frames_of(path)) == 1  # written without another message or a close
    os.close(recorder.writer._fd)  # the disk goes away under it
    recorder.tap(encode(hello()), T0 + 1)
    deadline = time.monotonic() + 10
    while recorder.error is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert recorder.error is not None and "recording stopped" in recorder.error
    recorder.tap(encode(hello()), T0 + 2)  # ignored, no exception
    recorder.close()


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64k", 65536), ("100M", 100 * 1024**2), ("2G", 2 * 1024**3), ("1.5m", 1572864)],
)
def test_sizes(text: str, expected: int) -> None:
    assert size_arg(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "10", "-5M", "1e9", "5 apples"])
def test_bad_sizes(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        size_arg(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 1090.0),
        ("90", 1090.0),
        ("5m", 1300.0),
        ("1.5h", 6400.0),
        ("-30s", 4970.0),
        ("-1m", 4940.0),
        ("1970-01-01T00:20:00+00:00", 1200.0),
    ],
)
def test_moments(text: str, expected: float) -> None:
    assert parse_moment(text, 1000.0, 5000.0) == expected


@pytest.mark.parametrize("text", ["yesterday", "5x", "--3s", ""])
def test_bad_moments(text: str) -> None:
    with pytest.raises(ValueError):
        parse_moment(text, 1000.0, 5000.0)


# ------------------------------------------------------------ the live source's tap


def test_the_tap_sees_every_frame_undecoded_and_the_local_samples_encoded() -> None:
    endpoint = f"ipc://{os.environ['GPUTOP_RUNTIME_DIR']}/tap.sock"
    publisher = Publisher(endpoint)
    tapped: list[tuple[list[bytes], float]] = []
    events: list[Any] = []
    lock = threading.Lock()

    def tap(frames: list[bytes], received: float) -> None:
        with lock:
            tapped.append((list(frames), received))

    def emit(batch: list[Any]) -> None:
        with lock:
            events.extend(batch)

    source = ZmqSource([endpoint], discover=False, local_sampler=True, raw_tap=tap)
    source.start(emit)
    sent = [encode(hello()), [b"gputop.steps", b"\xc1 not msgpack"]]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for frames in sent:
                publisher.send(frames)
            publisher.wait(0.2)
            with lock:
                kinds = {bytes(f[0]) for f, _ in tapped}
                if len(kinds) >= 3:
                    break
    finally:
        source.stop()
        publisher.close()
    with lock:
        got = list(tapped)
    assert [bytes(x) for x in sent[0]] in [[bytes(x) for x in f] for f, _ in got]
    assert [bytes(x) for x in sent[1]] in [[bytes(x) for x in f] for f, _ in got]  # undecodable
    local = [decode(f) for f, _ in got if bytes(f[0]) == b"gputop.system"]
    assert local and all(isinstance(m, System) for m in local)  # the viewer's own sampler
    with lock:
        decoded = {e.received for e in events if isinstance(e, Received)}
    assert decoded and decoded <= {r for _, r in got}  # the tap's time is the event's time


# ------------------------------------------------- a real training, killed -9


@pytest.mark.e2e
def test_record_a_real_training_kill_it_and_replay_the_fault(tmp_path: Path) -> None:
    """A CPU training whose loader turns slow 25 s in; ``gputop record`` killed with
    SIGKILL; the recording replays compute-bound before the fault and input-bound after,
    with a truncated tail (the kill mid-write, simulated by cutting the file) skipped."""
    pytest.importorskip("torch")
    endpoint = f"ipc://{os.environ['GPUTOP_RUNTIME_DIR']}/train.sock"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": "faulty"}
    log = tmp_path / "train.log"
    with open(log, "wb") as out:
        train = subprocess.Popen(
            [sys.executable, "-m", "tests.record_train", "--fault-after", "25", "--duration", "90"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    path = tmp_path / "run.gtrec"
    recorder = None
    try:
        socket_path = Path(endpoint.removeprefix("ipc://"))
        deadline = time.monotonic() + 120
        while not socket_path.exists():
            assert train.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        recorder = subprocess.Popen(
            [sys.executable, "-m", "gputop_dl", "record", str(path), endpoint],
            stderr=subprocess.PIPE,
        )
        time.sleep(50)  # ~25 s before the fault (warm-up included), ~25 s after
        assert recorder.poll() is None
        recorder.send_signal(signal.SIGKILL)
        recorder.wait(10)
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
        train.kill()
        train.wait(10)
    assert path.stat().st_size > 1000
    timeline = load_timeline(path)
    assert timeline.notes.count == 0, timeline.notes  # a kill between writes: nothing lost
    steps = [e for e in timeline.events if isinstance(e, Received) and isinstance(e.message, Steps)]
    fault_at = min(
        r.end_time for e in steps for r in e.message.records if r.wait_s and r.wait_s > 0.1
    )
    # killed in the middle of a write: half a chunk at the end
    data = path.read_bytes()
    last = data.rfind(CHUNK_MAGIC)
    with open(path, "ab") as stream:
        stream.write(data[last : last + (len(data) - last) // 2])

    def snapshot(*extra: str) -> tuple[dict[str, Any], str]:
        out = subprocess.run(
            [sys.executable, "-m", "gputop_dl", "snapshot", str(path), "--json", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout), out.stderr

    before, notes = snapshot("--at", datetime_iso(fault_at - 2))
    assert "truncated" in notes
    after, _ = snapshot()
    verdicts = [s["runs"][0]["verdict"] for s in (before, after)]
    assert verdicts[0]["kind"] == "compute-bound", (verdicts, log.read_text()[-2000:])
    assert verdicts[1]["kind"] == "input-bound", verdicts
    assert before["runs"][0]["name"] == "faulty"
    assert after["recording"]["skipped"] and "truncated" in after["recording"]["skipped"][0]


def datetime_iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


# ------------------------------------------------------------ gputop record itself


@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGINT, 0), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_record_stops_cleanly_on_a_signal(tmp_path: Path, sig: int, status: int) -> None:
    path = tmp_path / "r.gtrec"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "gputop_dl", "record", str(path), "--no-local"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert recorder.stderr is not None
        assert "recording to" in recorder.stderr.readline()  # started, handlers set
        recorder.send_signal(sig)
        assert recorder.wait(30) == status
    finally:
        if recorder.poll() is None:
            recorder.kill()
    recording = open_recording(path)
    assert list(recording.entries()) == [] and recording.notes.count == 0


def test_a_split_recording_is_refused_at_start_where_a_part_exists(tmp_path: Path) -> None:
    """FILE.1 there already stopped a --max-size recording part-way ("File exists"),
    after its summary had counted the part."""
    path = tmp_path / "r.gtrec"
    (tmp_path / "r.gtrec.2").write_text("keep me")
    run = [sys.executable, "-m", "gputop_dl", "record", str(path), "--no-local"]
    out = subprocess.run([*run, "--max-size", "64k"], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "a part of another recording is there" in out.stderr and "r.gtrec.2" in out.stderr
    assert not path.exists() and (tmp_path / "r.gtrec.2").read_text() == "keep me"


def test_record_refuses_an_existing_file_and_a_dead_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "r.gtrec"
    path.write_text("keep me")
    run = [sys.executable, "-m", "gputop_dl", "record"]
    out = subprocess.run([*run, str(path), "--no-local"], capture_output=True, text=True)
    assert out.returncode == 2 and "cannot create" in out.stderr
    assert path.read_text() == "keep me"
    dead = f"ipc://{tmp_path}/nothing.sock"
    out = subprocess.run([*run, str(tmp_path / "new.gtrec"), dead], capture_output=True, text=True)
    assert out.returncode == 1 and "no such socket" in out.stderr


FULL_DISK_CHILD = r"""
import os, resource, signal, sys
from gputop_dl.tui.record.writer import RecordWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # the disk is full at 8 KB
w = RecordWriter(sys.argv[1], host="h")
try:
    for i in range(1000):
        w.add([b"gputop.steps", os.urandom(700)], 1.0 + i)  # incompressible
        if i % 3 == 2:
            w.flush()
    print("no error")
except OSError as exc:
    print(exc.errno, w.frames, w.saved, w.bytes_written)
"""


def test_a_full_disk_counts_what_is_on_it(tmp_path: Path) -> None:
    """A disk that fills mid-chunk: the writer counts the bytes the file holds, cut
    chunk included, and as saved only the messages a reader gets back."""
    path = tmp_path / "full.gtrec"
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    errno, added, saved, written = (int(x) for x in out)
    assert errno == 27  # EFBIG, as ENOSPC would come
    assert written == path.stat().st_size == 8192  # the header, whole chunks, a cut one
    assert len(frames_of(path)) == saved < added
