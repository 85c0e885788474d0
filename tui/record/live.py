"""Key ``r`` in the live viewer: record what it receives, from now until ``r`` again."""

from __future__ import annotations

from typing import Any

from gputop_dl.tui.format import fmt_bytes
from gputop_dl.tui.record.recorder import TapRecorder, default_name, record_dir
from gputop_dl.tui.record.writer import RecordWriter


def toggle_recording(app: Any) -> None:
    """Start or stop recording ``app``'s source (a ZmqSource: it has ``raw_tap``)."""
    bar = app.record_bar
    source = app.source
    if bar.recorder is not None:
        source.raw_tap = None
        recorder = bar.stop_recording()
        size = fmt_bytes(recorder.writer.bytes_written)
        if recorder.error is not None:
            app.notify(recorder.error, severity="error", timeout=6)
        else:
            app.notify(f"Recording saved: {recorder.writer.path} ({size})", timeout=6)
        return
    if not hasattr(source, "raw_tap"):
        app.notify("Only a live view can be recorded", severity="warning", timeout=4)
        return
    folder = record_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / default_name(app.clock())
        writer = RecordWriter(path, host=app.local_host, origin="viewer")
    except OSError as exc:
        app.notify(f"Not recording: {exc}", severity="error", timeout=6)
        return
    recorder = TapRecorder(writer)
    source.raw_tap = recorder.tap
    bar.start_recording(recorder, path.resolve())
    app.notify(f"Recording to {path.resolve()}", timeout=4)
