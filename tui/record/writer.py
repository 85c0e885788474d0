"""Append frames to a recording: buffered, cut into a chunk about every second, rotated.

A chunk is written (one ``write`` of whole bytes, then flushed to the kernel) when the
buffer is FLUSH_EVERY_S old or CHUNK_BYTES big, so a recorder killed at any moment loses
at most the last second. ``max_size`` splits the recording into parts: FILE, FILE.1,
FILE.2, ..., each a complete recording (its own header, the same recording id) of at
most ``max_size`` bytes (a single chunk larger than that still gets a part of its own).
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from gputop_dl.probe.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR
from gputop_dl.probe.version import __version__
from gputop_dl.tui.record.format import (
    CODEC_NAMES,
    RecordingHeader,
    default_codec,
    encode_chunk,
    encode_entry,
    encode_header,
)

FLUSH_EVERY_S = 1.0
CHUNK_BYTES = 4 * 1024 * 1024  # raw bytes buffered at most before a chunk is cut
MIN_MAX_SIZE = 64 * 1024


def _no_parts_there(path: Path) -> None:
    """FileExistsError when a FILE.n is there already: a split recording would stop at
    it part-way (each part is created, never overwritten), so it is refused at start."""
    prefix = f"{path.name}."
    with os.scandir(path.parent) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit():
                raise FileExistsError(
                    errno.EEXIST, "a part of another recording is there", entry.path
                )


def part_path(path: Path, part: int) -> Path:
    """The file of part ``part``: FILE for the first, then FILE.1, FILE.2, ..."""
    return path if part == 0 else path.with_name(f"{path.name}.{part}")


class RecordWriter:
    """Writes one recording at ``path`` (refuses an existing file: a recording is never
    overwritten). Not thread-safe: one thread adds and flushes. ``clock`` is monotonic."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        host: str,
        origin: str = "record",
        max_size: int | None = None,
        codec: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.max_size = max_size
        self.codec = default_codec() if codec is None else codec
        self.clock = clock
        self._header = RecordingHeader(
            protocol=(PROTOCOL_MAJOR, PROTOCOL_MINOR),
            codec=CODEC_NAMES[self.codec],
            created=time.time(),
            host=host,
            gputop=__version__,
            recording=secrets.token_hex(8),
            origin=origin,
        )
        self.part = 0
        if max_size is not None:
            _no_parts_there(self.path)
        self.frames = 0  # entries added in all (buffered, written or lost to an error)
        self.saved = 0  # entries in chunks written whole
        self.bytes_written = 0  # in all parts, a chunk cut short by an error included
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._first_at: float | None = None
        self._fd = self._open(self.path)
        self._size = self._header_size = self._write_header()
        self.closed = False

    @property
    def current_path(self) -> Path:
        return part_path(self.path, self.part)

    def _open(self, path: Path) -> int:
        # 0600: a recording holds what the runs published, which only their user may read.
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)

    def _write_header(self) -> int:
        header = RecordingHeader(**{**self._header.__dict__, "part": self.part})
        data = encode_header(header)
        os.write(self._fd, data)
        self.bytes_written += len(data)
        return len(data)

    def add(self, frames: list[bytes], received: float) -> None:
        """Buffer one message; cut a chunk when the buffer is big or old enough."""
        entry = encode_entry(frames, received)
        if self._first_at is None:
            self._first_at = self.clock()
        self._buffer.append(entry)
        self._buffered += len(entry)
        self.frames += 1
        if self._buffered >= CHUNK_BYTES:
            self.flush()

    def due(self) -> bool:
        return self._first_at is not None and self.clock() - self._first_at >= FLUSH_EVERY_S

    def tick(self) -> None:
        """Call often (every ~0.1 s): writes the buffer once it is FLUSH_EVERY_S old."""
        if self.due():
            self.flush()

    def flush(self) -> None:
        if not self._buffer or self.closed:
            return
        chunk = encode_chunk(self.codec, b"".join(self._buffer))
        entries = len(self._buffer)
        self._buffer, self._buffered, self._first_at = [], 0, None
        full = self.max_size is not None and self._size + len(chunk) > self.max_size
        if full and self._size > self._header_size:  # an empty part takes the chunk anyway
            os.close(self._fd)
            self.part += 1
            self._fd = self._open(self.current_path)
            self._size = self._header_size = self._write_header()
        written = 0
        try:
            while written < len(chunk):  # os.write may write less (a signal, a full pipe)
                written += os.write(self._fd, chunk[written:])
        finally:
            # A full disk can take part of a chunk: the file holds those bytes (which a
            # reader skips as a cut last chunk), and the count says what is on disk.
            self._size += written
            self.bytes_written += written
        self.saved += entries

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            os.close(self._fd)
