"""Record what a source receives: the tap that ``gputop record`` and the viewer's key
``r`` put on a :class:`~tui.source.ZmqSource`. What a probe's history replay repeats
(another viewer attached) is left out (tui.record.repeats).

The tap is called on the source's thread; a small thread of its own writes the buffer out
every second even when nothing arrives, so a recorder killed with SIGKILL loses at most
the last second. A write error (disk full) stops the recording and is kept in ``error``
for the caller to show; it never reaches the source.
"""

from __future__ import annotations

import contextlib
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from gputop_dl.tui.record.repeats import Repeats
from gputop_dl.tui.record.writer import RecordWriter

TICK_S = 0.2  # how often the flush thread looks at the buffer's age


def record_dir() -> Path:
    """Where the viewer's ``r`` records: $GPUTOP_RECORD_DIR, else
    $XDG_DATA_HOME/gputop/recordings (~/.local/share/gputop/recordings), never the
    current directory (a repository)."""
    if os.environ.get("GPUTOP_RECORD_DIR"):
        return Path(os.environ["GPUTOP_RECORD_DIR"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(data) / "gputop" / "recordings"


def default_name(now: float) -> str:
    stamp = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"gputop-{stamp}.gtrec"


class TapRecorder:
    """A thread-safe raw tap writing to a :class:`RecordWriter` (pass ``tap`` as the
    source's ``raw_tap``); ``close`` writes what is buffered and stops."""

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.error: str | None = None
        self.repeats = Repeats()  # what other viewers' attaching makes probes send again
        self.repeated = 0  # messages left out as repeats (not those cut to their news)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="gputop-record", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return self.error is None and not self._stop.is_set()

    def tap(self, frames: list[bytes], received: float) -> None:
        # Outside the lock: the source's thread alone taps, and decoding a replayed
        # message must not hold up the flusher.
        news = self.repeats.news(frames)
        if news is None:
            self.repeated += 1
            return
        with self._lock:
            if self.error is not None or self.writer.closed:
                return
            try:
                self.writer.add(news, received)
            except OSError as exc:
                self._fail(exc)

    def _flusher(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if self.error is not None or self.writer.closed:
                    return
                try:
                    self.writer.tick()
                except OSError as exc:
                    self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.error = f"recording stopped: {exc.strerror or exc}"
        with contextlib.suppress(OSError):
            self.writer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        with self._lock:
            if self.writer.closed:
                return
            try:
                self.writer.close()
            except OSError as exc:
                self.error = f"recording stopped: {exc.strerror or exc}"
