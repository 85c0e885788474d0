"""The top line: which run, how it is connected, how fast it goes; and the run switcher.

In a replay the connection is the recording's, not a live one: the line says "replay"
(its speed, paused, or ended) where a live viewer says "● live", and keeps the other
states (stale, exited, lost), which say what the run did at that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from gputop_dl.tui.format import fmt_count, fmt_duration, fmt_number
from gputop_dl.tui.state import NewRuns, RunSummary
from gputop_dl.tui.widgets.base import Panel

STATE_GLYPHS = {
    "live": "●",
    "stale": "◐",
    "lost": "◌",
    "exited": "■",
    "incompatible": "✖",
    "connecting": "◌",
    "error": "✖",
}


@dataclass(frozen=True)
class ReplayMark:
    """How a replay goes, for the header (tui.record.replay_app)."""

    speed: int
    paused: bool
    at_end: bool  # the clock reached the end of the recording: nothing more comes


def replay_text(mark: ReplayMark) -> str:
    """The replay's state in a few words: "▶ replay x2", "⏸ replay paused"."""
    if mark.at_end:
        return "■ replay ended"
    if mark.paused:
        return "⏸ replay paused"
    return f"▶ replay \u00d7{mark.speed}"


def _key(number: int) -> str:
    """How to reach the run numbered ``number`` in the switcher."""
    return f"press {number}" if number <= 9 else "tab to it"


def new_runs_text(news: NewRuns) -> str:
    """The notice of runs that started after the run shown ended: what the viewer did
    (switched, or kept the run the user picked) and the key that shows the other."""
    (ended_number, ended), (number, first) = news.ended, news.runs[0]
    more = len(news.runs) - 1
    if news.switched:
        others = f", the first of {more + 1} new runs" if more else ""
        return f"{ended} ended: showing {first}{others} ({_key(ended_number)} for {ended})"
    if more:
        return f"{more + 1} runs started ({first}, …): {_key(number)} for {first}"
    return f"{first} started: {_key(number)} to show it"


def _fit(fields: Sequence[tuple[int, Text]], width: int, separator: str = "  ") -> Text:
    """Join the fields that fit in ``width``, keeping the lowest priority numbers first
    and the original order on screen."""
    lengths = [text.cell_len for _priority, text in fields]  # measured once each
    chosen: set[int] = set()
    used = 0
    for position in sorted(range(len(fields)), key=lambda i: fields[i][0]):
        extra = lengths[position] + (len(separator) if chosen else 0)
        if used + extra > width and chosen:
            continue
        chosen.add(position)
        used += extra
    line = Text()
    filled = False  # the line has cells (not measured again at each field)
    for position, (_priority, text) in enumerate(fields):
        if position in chosen:
            if filled:
                line.append(separator)
            line.append_text(text)
            filled = filled or lengths[position] > 0
    return line


class HeaderBar(Panel):
    """Run name, host, rank/world, uptime, step count, samples/s now and average,
    connection state; a second line lists the runs when there are several."""

    COMPONENT_CLASSES = {
        "header--live",
        "header--stale",
        "header--lost",
        "header--exited",
        "header--incompatible",
        "header--connecting",
        "header--error",
        "header--name",
        "header--rate",
        "header--paused",
        "header--replay",
        "header--selected",
        "severity--ok",
        "severity--info",
        "severity--warning",
        "severity--critical",
    }

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run: RunSummary | None = None
        self.runs: tuple[RunSummary, ...] = ()
        self.selected_index: int | None = None
        self.host: str | None = None
        self.paused = False
        self.replay: ReplayMark | None = None  # a recording is shown, not live runs
        # What the source does while nothing came (ZmqSource.waiting_for; set by the
        # app): with no node sampled, "waiting for samples" would never come true.
        self.waiting: tuple[str, ...] = ()

    def show(
        self,
        run: RunSummary | None,
        runs: tuple[RunSummary, ...],
        selected_index: int | None,
        host: str | None,
    ) -> None:
        if self.unchanged(run, runs, selected_index, host):
            return
        self.run, self.runs, self.selected_index, self.host = run, runs, selected_index, host
        self.changed()

    def set_paused(self, paused: bool) -> None:
        if paused != self.paused:
            self.paused = paused
            self.changed()

    def set_replay(self, mark: ReplayMark | None) -> None:
        """Say the runs are a recording's, and how its replay goes."""
        if mark != self.replay:
            self.replay = mark
            self.changed()

    # ---------------------------------------------------------------- rendering

    def build(self, width: int) -> list[Text]:
        paused = Text(" ⏸ PAUSED ", self.style("header--paused")) if self.paused else Text()
        room = width - paused.cell_len - (1 if self.paused else 0)
        line = self._run_line(room)
        if self.paused:
            line.append(" " * max(1, width - line.cell_len - paused.cell_len))
            line.append_text(paused)
        lines = [line]
        if len(self.runs) > 1:
            lines.append(self._switcher(width))
        return lines

    def _replay_field(self) -> list[tuple[int, Text]]:
        """The replay's state, first on the line (none when live)."""
        if self.replay is None:
            return []
        return [(0, Text(replay_text(self.replay), self.style("header--replay")))]

    def _state(self, run: RunSummary) -> Text:
        state = run.connection.state
        if state == "live" and self.replay is not None:
            return Text()  # it was live when recorded: the replay field says what it is
        glyph = STATE_GLYPHS.get(state, "○")
        text = run.connection.text
        if state == "exited" and run.connection.age_s is not None:
            text += f" ({fmt_duration(run.connection.age_s)} ago)"
        return Text(f"{glyph} {text}", self.style(f"header--{state}"))

    def _run_line(self, width: int) -> Text:
        run = self.run
        if run is None:
            if self.host:
                doing = [(1, Text(f"host {self.host}"))]
            elif self.waiting:
                first, *rest = self.waiting
                doing = [(1, Text(first)), *((2, Text(text)) for text in rest)]
            else:
                doing = [(1, Text("waiting for samples"))]
            fields = [
                *self._replay_field(),
                (0, Text("○ no training run", self.style("panel--dim"))),
                *doing,
                (3, Text("? help", self.style("panel--dim"))),
            ]
            return _fit(fields, width)
        if run.is_placeholder:
            fields = [(0, self._state(run)), (1, Text(run.name, self.style("header--name")))]
            if run.endpoint and run.name != run.endpoint:
                fields.append((2, Text(run.endpoint, self.style("panel--dim"))))
            return _fit(fields, width)
        name = Text(run.name, self.style("header--name"))
        if run.rank is not None:
            world = f"/{run.world_size}" if run.world_size is not None else ""
            name.append(f" rank {run.rank}{world}")
        rate = Text()
        if run.rate_now is not None:
            rate.append(fmt_number(run.rate_now), self.style("header--rate"))
            rate.append(f" {run.unit}")
        fields = [
            *self._replay_field(),
            (0, self._state(run)),
            (1, name),
            (2, rate),
            (4, Text(f"avg {fmt_number(run.rate_avg)}") if run.rate_avg is not None else Text()),
            (3, Text(f"{fmt_count(run.step_count)} steps")),
            (5, Text(f"@ {run.host}") if run.host else Text()),
            (6, Text(f"up {fmt_duration(run.uptime_s)}") if run.uptime_s is not None else Text()),
        ]
        return _fit([(p, t) for p, t in fields if t.cell_len], width)

    def _labels(self) -> list[str]:
        """The runs' labels (disambiguated by the state); just "r<rank>" when every run
        is a rank of one job."""
        runs = [run for run in self.runs if not run.is_placeholder]
        ranks = [run.rank for run in runs]
        one_job = len({run.name for run in runs}) == 1 and None not in ranks
        if one_job and len(set(ranks)) == len(ranks):
            return [run.label if run.is_placeholder else f"r{run.rank}" for run in self.runs]
        return [run.label for run in self.runs]

    def _dot(self, run: RunSummary) -> Text:
        state = run.connection.state
        if state == "live" and run.verdict is not None:
            return Text("●", self.style(f"severity--{run.verdict.severity}"))
        return Text(STATE_GLYPHS.get(state, "○"), self.style(f"header--{state}"))

    def _switcher(self, width: int) -> Text:
        items = []
        for number, (run, label) in enumerate(zip(self.runs, self._labels(), strict=True), 1):
            key = str(number) if number <= 9 else "·"
            item = Text()
            item.append_text(self._dot(run))
            item.append(f" {key} {label}")
            if number - 1 == self.selected_index:
                item.stylize(self.style("header--selected"))
            items.append(item)
        selected = self.selected_index or 0
        prefix = Text("runs ", self.style("panel--dim"))
        # Show a window of runs around the selected one that fits the width.
        first, last = selected, selected + 1
        used = prefix.cell_len + items[selected].cell_len
        while True:
            grew = False
            for candidate in (last, first - 1):
                if 0 <= candidate < len(items):
                    need = items[candidate].cell_len + 2
                    if used + need + 8 <= width:
                        used += need
                        if candidate == last:
                            last += 1
                        else:
                            first -= 1
                        grew = True
            if not grew:
                break
        line = prefix
        if first > 0:
            line.append(f"+{first} ", self.style("panel--dim"))
        for item in items[first:last]:
            line.append_text(item)
            line.append("  ")
        if last < len(items):
            line.append(f"+{len(items) - last}", self.style("panel--dim"))
        line.append("  tab ⇄", self.style("panel--dim"))
        return line
