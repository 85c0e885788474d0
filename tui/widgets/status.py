"""One line of problems: undecodable input, endpoint errors, records the probe dropped."""

from __future__ import annotations

from rich.text import Text

from gputop_dl.tui.format import fmt_age, fmt_count
from gputop_dl.tui.state import ErrorEntry, RunSummary
from gputop_dl.tui.widgets.base import Panel


class StatusLine(Panel):
    """Hidden while there is nothing wrong."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.errors: tuple[ErrorEntry, ...] = ()
        self.error_count = 0
        self.run: RunSummary | None = None
        self.now = 0.0
        self.links = ""
        self.display = False

    def show(
        self,
        errors: tuple[ErrorEntry, ...],
        error_count: int,
        run: RunSummary | None,
        now: float,
        links: str = "",
    ) -> None:
        self.errors, self.error_count, self.run, self.now = errors, error_count, run, now
        self.links = links  # remote hosts' ssh link states (tui.state.hosts.link_summary)
        self.set_display(bool(self.parts()))
        self.changed()

    def parts(self) -> list[Text]:
        parts = []
        if self.links:
            parts.append(Text(self.links, self.style("panel--dim")))
        run = self.run
        if run is not None and run.lost_steps > 0:
            parts.append(
                Text(
                    f"probe dropped {fmt_count(run.lost_steps)} step records (buffer full)",
                    self.style("panel--warning"),
                )
            )
        if run is not None and run.lost_messages > 0:
            parts.append(
                Text(
                    f"{fmt_count(run.lost_messages)} messages lost in transit",
                    self.style("panel--warning"),
                )
            )
        errors = self.errors
        if run is not None and run.connection.state == "incompatible":
            errors = tuple(e for e in errors if e.source != run.key)  # the banner says it
        if errors:
            last = errors[-1]
            count = f"{self.error_count} problems, last " if self.error_count > 1 else ""
            age = f" ({fmt_age(self.now - last.time)})" if last.time is not None else ""
            parts.append(Text(f"⚠ {count}{last.text}{age}", self.style("panel--error")))
        return parts

    def build(self, width: int) -> list[Text]:
        return [Text(" · ").join(self.parts())]
