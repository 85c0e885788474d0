"""Samples/s over time, the data-wait share under it, and the step split now.

One column per half-second point, newest on the right, on a scale from zero (a graph
scaled from its minimum makes noise look like a collapse). A stall in progress shows as
a red floor; an unknown rate stays blank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from rich.style import Style
from rich.text import Span, Text

from gputop_dl.tui.format import (
    VERTICAL_EIGHTHS,
    clamp01,
    column_chars,
    fmt_duration,
    fmt_number,
    fmt_share,
    nice_ceiling,
)
from gputop_dl.tui.state import BUCKET_S, SAMPLES_UNIT, RunSummary, ThroughputPoint
from gputop_dl.tui.widgets.base import Panel, trusted_text

MIN_GUTTER = 6  # fits "wait ┤"
# A point's rate in the run's unit: read for every point at every redraw (the scale
# covers the whole history), so an attribute read rather than a method call.
_RATE = {SAMPLES_UNIT: attrgetter("samples_per_s")}
_STEPS_RATE = attrgetter("steps_per_s")
_WAIT_SHARE = attrgetter("wait_share")


@lru_cache(maxsize=4096)
def _column(value: float | None, top: float, rows: int) -> tuple[str, ...]:
    """:func:`column_chars`, computed once per point and scale (the graph scrolls: each
    point is drawn again at every refresh)."""
    return tuple(column_chars(value, top, rows))


class ThroughputGraph(Panel):
    COMPONENT_CLASSES = {
        "graph--bar",
        "graph--stall",
        "graph--axis",
        "graph--wait",
        "graph--compute",
    }

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run: RunSummary | None = None
        self.points: tuple[ThroughputPoint, ...] = ()
        self.border_title = "Throughput"
        self._glyphs: _Glyphs | None = None  # the last build's, to scroll rather than redraw

    def show(self, run: RunSummary | None, points: tuple[ThroughputPoint, ...]) -> None:
        if self.unchanged(run, points):
            return
        self.run, self.points = run, points
        unit = run.unit if run is not None else "samples/s"
        self.set_border_title(f"Throughput · {unit}")
        self.changed()

    def layout_key(self) -> int:
        return self.content_size.height

    def build(self, width: int) -> list[Text]:
        height = max(2, self.content_size.height or 4)
        run = self.run
        if run is None or run.is_placeholder or not self.points:
            return self._empty(width, height)
        wait_row = height >= 7
        chart_rows = height - 1 - (1 if wait_row else 0)
        rates = list(map(_RATE.get(run.unit, _STEPS_RATE), self.points))
        known = [r for r in rates if r is not None]
        top = nice_ceiling(max(max(known, default=0.0), run.rate_avg or 0.0, 0.0))
        top_label = fmt_number(top)
        gutter = max(MIN_GUTTER, len(top_label) + 2)
        columns = max(1, width - gutter)
        shown = self.points[-columns:]
        pad = columns - len(shown)
        glyphs = _scrolled(self._glyphs, (top, chart_rows, run.unit), shown, rates[-len(shown) :])
        self._glyphs = glyphs
        lines = self._chart(shown, glyphs, pad, top_label, gutter)
        if wait_row:
            lines.append(self._wait_row(shown, glyphs.waits, pad, gutter))
        lines.append(self._split(width, len(shown)))
        return lines

    def _empty(self, width: int, height: int) -> list[Text]:
        message = "no steps yet"
        if self.run is None or self.run.is_placeholder:
            message = "no training run: samples/s appear here once a probe publishes steps"
        lines = [Text() for _ in range(max(0, height - 1))]
        lines.insert(max(0, (height - 1) // 2), Text(f"  {message}", self.style("panel--dim")))
        return lines[:height]

    def _chart(
        self,
        shown: tuple[ThroughputPoint, ...],
        glyphs: _Glyphs,
        pad: int,
        top_label: str,
        gutter: int,
    ) -> list[Text]:
        bar_style = self.style("graph--bar")
        stall_style = self.style("graph--stall")
        axis_style = self.style("graph--axis")
        stalled = [i for i, point in enumerate(shown) if point.pending]
        rows = len(glyphs.rows)
        lines = []
        for row in reversed(range(rows)):
            if row == rows - 1:
                label = f"{top_label} ┤"
            elif row == 0:
                label = "0 ┤"
            else:
                label = "│"
            head = label.rjust(gutter) + " " * pad
            if row == 0 and stalled:  # a stall in progress: a red floor
                line = Text(label.rjust(gutter), axis_style)
                line.append(" " * pad)
                cells = list(glyphs.rows[row])
                marks = [False] * len(cells)
                for i in stalled:
                    cells[i] = "▁"
                    marks[i] = True
                _append_runs(line, cells, marks, stall_style, bar_style)
            else:
                # one row of glyphs composed here: no control code to strip
                plain = head + glyphs.rows[row]
                line = trusted_text(plain, _tail_span(len(head), len(plain), bar_style), axis_style)
            lines.append(line)
        return lines

    def _wait_row(
        self, shown: tuple[ThroughputPoint, ...], waits: str, pad: int, gutter: int
    ) -> Text:
        axis_style = self.style("graph--axis")
        wait_style = self.style("graph--wait")
        if " " not in waits:  # the data wait is known all along: one run
            head = "wait ┤".rjust(gutter) + " " * pad
            plain = head + waits
            return trusted_text(plain, _tail_span(len(head), len(plain), wait_style), axis_style)
        line = Text("wait ┤".rjust(gutter), axis_style)
        line.append(" " * pad)
        unknown = [point.wait_share is None for point in shown]
        _append_runs(line, list(waits), unknown, None, wait_style)
        return line

    def _split(self, width: int, shown: int) -> Text:
        run = self.run
        assert run is not None
        span = Text(f"last {fmt_duration(shown * BUCKET_S)}", self.style("panel--dim"))
        wait = run.wait_share_now
        line = Text()
        if wait is None:
            line.append("data wait n/a", self.style("panel--dim"))
            line.append(" (steps marked with probe.step)", self.style("panel--dim"))
        else:
            bar_width = max(6, min(32, width // 4))
            line.append("wait now ", self.style("graph--wait"))  # the last 5 s (RATE_WINDOW_S)
            line.append(fmt_share(wait), self.style("graph--wait"))
            line.append(" ")
            line.append_text(
                self.styled_bar([wait, 1.0 - wait], bar_width, ["graph--wait", "graph--compute"])
            )
            line.append(" ")
            line.append(f"compute {fmt_share(1.0 - wait)}", self.style("graph--compute"))
        if run.device_busy_now is not None:
            line.append(f"   device busy {fmt_share(run.device_busy_now)}")
        if line.cell_len + span.cell_len + 3 <= width:
            line.append(" " * (width - line.cell_len - span.cell_len))
            line.append_text(span)
        return line


@dataclass(frozen=True)
class _Glyphs:
    """The chart's glyphs for the points shown, one per point: a new half-second point
    scrolls the graph, and the points still shown keep theirs (only new ones are drawn)."""

    key: tuple[float, int, str]  # the scale's top, the chart's rows, the unit
    points: tuple[ThroughputPoint, ...]
    rows: tuple[str, ...]  # bottom row first
    waits: str  # the wait row


def _scrolled(
    previous: _Glyphs | None,
    key: tuple[float, int, str],
    shown: tuple[ThroughputPoint, ...],
    rates: list[float | None],
) -> _Glyphs:
    """The glyphs of ``shown`` (whose rates are ``rates``), taking from ``previous`` those
    of the points it showed too: the same objects, in the same order, from ``shown[0]``
    on (a point the state replaced, e.g. a bucket completed since, is drawn again)."""
    start = kept = 0
    if previous is not None and previous.key == key and shown:
        first = shown[0]
        start = next((i for i, p in enumerate(previous.points) if p is first), -1)
        if start >= 0:
            limit = min(len(previous.points) - start, len(shown))
            while kept < limit and previous.points[start + kept] is shown[kept]:
                kept += 1
    top, rows, _unit = key
    fresh = [_column(rate, top, rows) for rate in rates[kept:]]
    glyph_rows = tuple(
        (previous.rows[row][start : start + kept] if previous is not None and kept else "")
        + "".join([chars[row] for chars in fresh])
        for row in range(rows)
    )
    waits = "".join(map(_wait_char, map(_WAIT_SHARE, shown[kept:])))
    if previous is not None and kept:
        waits = previous.waits[start : start + kept] + waits
    return _Glyphs(key, shown, glyph_rows, waits)


def _tail_span(start: int, end: int, style: Style) -> list[Span]:
    """The span ``Text.append`` gives a part appended at ``start`` (none when empty)."""
    return [Span(start, end, style)] if style and end > start else []


@lru_cache(maxsize=1024)
def _wait_char(share: float | None) -> str:
    """The wait row's cell for a point: blank when unknown, at least a floor when known."""
    if share is None:
        return " "
    level = round(clamp01(share) * 8)
    return VERTICAL_EIGHTHS[level] if level else "▁"


def _append_runs(
    line: Text, cells: list[str], marks: list[bool], marked: Style | None, other: Style | None
) -> None:
    """Append ``cells``, styled ``marked`` where ``marks`` is set and ``other`` elsewhere,
    one span per run of equal styles (a span per cell costs at every redraw)."""
    start = 0
    for end in range(1, len(cells) + 1):
        if end == len(cells) or marks[end] != marks[start]:
            style = marked if marks[start] else other
            line.append("".join(cells[start:end]), style)
            start = end
