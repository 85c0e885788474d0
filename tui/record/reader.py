"""Read a recording (all its parts) into the viewer's events, decoded exactly as live.

The frames are decoded here, at read time, with ``probe.protocol.decode``: what could not
be decoded becomes the same (rate-limited) BadInput the live source would have shown.
"""

from __future__ import annotations

import bisect
import itertools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gputop_dl.tui.events import BadInput, Received
from gputop_dl.tui.record.format import (
    Entry,
    NotARecording,
    ReadNotes,
    RecordingHeader,
    iter_chunks,
    iter_entries,
    read_header,
)
from gputop_dl.tui.record.writer import part_path
from gputop_dl.tui.source import event_of

MAX_PARTS = 100_000

ReplayEvent = Received | BadInput


@dataclass
class Recording:
    """A recording's header, its part files, and what reading them skipped."""

    header: RecordingHeader
    paths: list[Path]
    notes: ReadNotes = field(default_factory=ReadNotes)

    def entries(self) -> Iterator[Entry]:
        """Every stored message in file order (damage skipped, noted in ``notes``)."""
        for path in self.paths:
            try:
                with open_file(path) as stream:
                    read_header(stream)
                    for raw in iter_chunks(stream, self.notes):
                        yield from iter_entries(raw, self.notes)
            except (OSError, NotARecording) as exc:
                self.notes.add(f"{path.name}: {exc}", 0)


def open_file(path: str | Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file, else NotARecording: opening a
    FIFO waited for a writer for ever (``gputop export FIFO`` hung)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARecording("not a regular file (a FIFO, a device or a directory?)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_recording(path: str | Path) -> Recording:
    """The recording at ``path`` with the parts that follow it (FILE.1, FILE.2, ... of the
    same recording id). Raises NotARecording or OSError for the first file only."""
    first = Path(path)
    with open_file(first) as stream:
        header = read_header(stream)
    paths = [first]
    for part in itertools.count(header.part + 1):
        if part > MAX_PARTS:
            break
        base = first if header.part == 0 else first.with_name(first.name.rsplit(".", 1)[0])
        candidate = part_path(base, part)
        try:
            with open_file(candidate) as stream:
                if read_header(stream).recording != header.recording:
                    break
        except (OSError, NotARecording):
            break
        paths.append(candidate)
    return Recording(header, paths)


def decode_entry(entry: Entry, last_error: dict[str, float]) -> ReplayEvent | None:
    """What the live source makes of these frames, on the recorded clock."""
    return event_of(entry.frames, entry.received, last_error, entry.received)


@dataclass
class Timeline:
    """A recording's events in file order with their replay times: the receive times made
    non-decreasing (a clock stepped back while recording does not replay backwards)."""

    header: RecordingHeader
    events: list[ReplayEvent]
    times: list[float]
    notes: ReadNotes

    @property
    def start(self) -> float:
        return self.times[0] if self.times else self.header.created

    @property
    def end(self) -> float:
        return self.times[-1] if self.times else self.header.created

    def index_after(self, t: float) -> int:
        """Index of the first event later than ``t`` (events at ``t`` come before it)."""
        return bisect.bisect_right(self.times, t)


def load_timeline(path: str | Path) -> Timeline:
    recording = open_recording(path)
    events: list[ReplayEvent] = []
    times: list[float] = []
    last_error: dict[str, float] = {}
    latest = 0.0
    for entry in recording.entries():
        event = decode_entry(entry, last_error)
        if event is None:
            continue
        latest = max(latest, entry.received)
        events.append(event)
        times.append(latest)
    return Timeline(recording.header, events, times, recording.notes)
