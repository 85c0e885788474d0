"""One line under the status line: the recording in progress (``● REC path size``) or,
in a replay, the time line (position / length, speed, pause)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.text import Text
from textual.timer import Timer
from textual.widgets import Static

from gputop_dl.tui.format import fmt_bytes
from gputop_dl.tui.record.recorder import TapRecorder


def clock_text(seconds: float) -> str:
    """``mm:ss`` or ``h:mm:ss`` of a non-negative duration."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def time_line(
    position: float, start: float, end: float, speed: int, paused: bool, width: int
) -> Text:
    """``▶ x4  12:05 / 1:00:00  ━━━━━●──────  03:12:05`` fitted to ``width`` cells."""
    length = max(0.0, end - start)
    offset = min(length, max(0.0, position - start))
    state = "⏸" if paused else "■" if length > 0 and offset >= length else "▶"  # ■: at its end
    when = datetime.fromtimestamp(position).strftime("%Y-%m-%d %H:%M:%S")
    left = f"{state} \u00d7{speed}  {clock_text(offset)} / {clock_text(length)}  "
    right = f"  {when}  space ⏯  +/- speed  ←/→ 10 s"
    room = width - len(left) - len(right)
    if room < 10:
        right = f"  {when[11:]}"
        room = width - len(left) - len(right)
    text = Text(left, style="bold")
    if room >= 5:
        filled = round((room - 1) * (offset / length)) if length > 0 else room - 1
        text.append("━" * filled, style="bold")
        text.append("●")
        text.append("─" * (room - 1 - filled), style="dim")
    text.append(right)
    return text


class RecordBar(Static):
    """Hidden unless recording or replaying."""

    DEFAULT_CSS = """
    RecordBar { height: 1; padding: 0 1; background: $boost; }
    RecordBar.-recording { color: $error; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.display = False
        self.recorder: TapRecorder | None = None
        self.path: Path | None = None
        self.replay: tuple[float, float, float, int, bool] | None = None
        self._timer: Timer | None = None

    # ------------------------------------------------------------------ recording
    def start_recording(self, recorder: TapRecorder, path: Path) -> None:
        self.recorder, self.path = recorder, path
        self.add_class("-recording")
        self.display = True
        if self._timer is None:
            self._timer = self.set_interval(1.0, self.refresh)
        self.refresh()

    def stop_recording(self) -> TapRecorder | None:
        """Stop and close the recording; the recorder (its figures), or None."""
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            recorder.close()
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.remove_class("-recording")
        self.display = self.replay is not None
        return recorder

    # --------------------------------------------------------------------- replay
    def show_replay(
        self, position: float, start: float, end: float, speed: int, paused: bool
    ) -> None:
        replay = (position, start, end, speed, paused)
        if replay != self.replay:
            self.replay = replay
            self.display = True
            self.refresh()

    def render(self) -> Text:
        recorder = self.recorder
        if recorder is not None:
            if recorder.error is not None:
                return Text(f"● {recorder.error}")
            size = fmt_bytes(recorder.writer.bytes_written)
            return Text(f"● REC {recorder.writer.current_path}  {size}  r stops")
        if self.replay is not None:
            return time_line(*self.replay, width=max(20, self.size.width - 2))
        return Text("")
