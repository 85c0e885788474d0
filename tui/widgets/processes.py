"""The node's busiest processes, with the training's own marked (key ``t``).

The verdict may blame other processes for taking the cores the DataLoader needs: this
table names them. The selected run's main process, its DataLoader workers and its other
children are marked, and so are the other runs' processes (other ranks on the node).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from rich.text import Text

from gputop_dl.probe.samples import TOP_EVERY, SystemSample, TopProcess, TrainingProcesses
from gputop_dl.tui.format import fmt_age, fmt_bytes, fmt_duration, fmt_pct
from gputop_dl.tui.widgets.base import Panel

SHORT_ROWS = 5  # rows on a short screen (the rest: on a tall one, or the full table)
ROLE_WIDTH = 11  # "◆ training "
# The node sampler reads the table every TOP_EVERY samples, more seldom where walking
# /proc is dear (thousands of processes): older than that spacing, or than this, the
# title says when it was read.
AGE_SHOWN_S = 6.0


# A training process's role as its node sampler reports it (ProcessSample.role), as marked
ROLE_LABELS = {"main": "main", "worker": "worker", "other": "child"}


def role_of(
    process: TopProcess,
    own_pid: int | None,
    roles: Mapping[int, str],
    run_pids: Collection[int],
) -> str:
    """ "main" / "worker" / "child" for the selected run's processes, as its sampler
    reported them (only the loader's published pids are workers: a compiler or a logger
    the main process started is a child), "training" for another run's main process or
    its children (the table has only their pids), "" for anything else on the node."""
    if own_pid is not None and process.pid == own_pid:
        return "main"
    role = roles.get(process.pid)
    if role is not None:
        return ROLE_LABELS.get(role, "child")
    # Not by parent pid for this run: its training tree leaves out gputop's own tools
    # (the hl-smi loop), and a child started since it was sampled is marked at the next
    # sample. Other runs' are marked by their parent: only their main pids are here.
    if process.pid in run_pids or (process.ppid in run_pids and process.ppid != own_pid):
        return "training"
    return ""


def table_title(age_s: float | None, interval_s: float | None = None) -> str:
    """The table's title: what its CPU figures cover, and its age (``age_s``: how much
    older it is than its sample, taken every ``interval_s``) once that is more than the
    sampler's usual spacing."""
    usual = AGE_SHOWN_S
    span = ""  # what its CPU figures cover: the time between two reads
    if interval_s is not None and 0.0 < interval_s < float("inf"):
        usual = max(usual, (TOP_EVERY + 0.5) * interval_s)
        span = f" over ~{fmt_duration(TOP_EVERY * interval_s)}"
    if age_s is None or not age_s >= usual:  # NaN: not said
        return f"Top processes · CPU % of one core{span}"
    return f"Top processes · CPU % of one core · read {fmt_age(age_s)}"


class ProcessTable(Panel):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.top: tuple[TopProcess, ...] | None = None
        self.own_pid: int | None = None
        self.roles: dict[int, str] = {}  # the selected run's processes: pid -> role
        self.run_pids: frozenset[int] = frozenset()
        self.border_title = "Top processes"

    def show(
        self,
        system: SystemSample | None,
        training: TrainingProcesses | None,
        own_pid: int | None,
        run_pids: frozenset[int] = frozenset(),
    ) -> None:
        """The table ``system`` carries, titled with its age when it is old."""
        top = system.top if system is not None else None
        read = system.top_time if system is not None else None
        age = None if system is None or read is None else system.time - read
        self.set_border_title(table_title(age, system.interval_s if system else None))
        if self.unchanged(top, training, own_pid, run_pids):
            return
        self.top, self.own_pid, self.run_pids = top, own_pid, run_pids
        self.roles = {p.pid: p.role for p in (training.processes if training else ())}
        self.changed()

    def layout_key(self) -> bool:
        return self.compact

    def build(self, width: int) -> list[Text]:
        if self.top is None:
            return [
                Text(
                    "the node sampler does not report the busiest processes",
                    self.style("panel--dim"),
                )
            ]
        dim, label = self.style("panel--dim"), self.style("panel--label")
        head = Text(f"{'pid':>7} {'cpu':>5} {'memory':>9}  {'':<{ROLE_WIDTH}}name", dim)
        lines = [head]
        rows = self.top[:SHORT_ROWS] if self.compact else self.top
        for process in rows:
            role = role_of(process, self.own_pid, self.roles, self.run_pids)
            line = Text(f"{process.pid:>7} ")
            line.append(f"{fmt_pct(process.cpu_pct, compact=True):>5} ")
            line.append(f"{fmt_bytes(process.rss_bytes):>9}  ")
            line.append(
                f"{('◆ ' + role) if role else '':<{ROLE_WIDTH}}", self.style("panel--accent")
            )
            line.append(process.name, label if role else None)
            lines.append(line)
        if len(rows) < len(self.top):
            lines.append(
                Text(f"+{len(self.top) - len(rows)} more (a taller terminal shows all)", dim)
            )
        return lines
