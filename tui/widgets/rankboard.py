"""The rank board (key ``j``): one row per rank of the selected run's job, and the job
verdict above them.

A :class:`~textual.widgets.DataTable` renders only the rows on screen, so 512 ranks cost
what a screenful costs; a refresh updates only the cells whose text changed (rows are
keyed by run), and re-sorts only when the order can have changed. ``o`` cycles the sort
column, ``r`` reverses it; the straggler's row is highlighted (``rankboard--slow``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.widgets.data_table import ColumnKey

from gputop_dl.tui.format import fmt_duration, fmt_number, fmt_share
from gputop_dl.tui.state.jobs import JobSummary, RankRow


def _num(value: float | None) -> float:
    """Sort key: unknown values sort last whichever the direction (see _sort_key)."""
    return value if value is not None else float("-inf")


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    text: Callable[[RankRow], str]
    order: Callable[[RankRow], object]
    right: bool = True  # numbers are right-aligned


def _rank_text(row: RankRow) -> str:
    rank = "?" if row.rank is None else str(row.rank)
    return rank if row.local_rank is None else f"{rank} ({row.local_rank})"


def _device_text(row: RankRow) -> str:
    if row.device is None:
        return "n/a"
    util = "n/a" if row.device_util_pct is None else f"{row.device_util_pct:.0f}%"
    mem = "n/a" if row.device_mem_share is None else f"{row.device_mem_share * 100:.0f}%"
    return f"{row.device} {util} m{mem}"


COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank (local)", _rank_text, lambda r: _num(r.rank)),
    Column("host", "host", lambda r: r.host or "?", lambda r: r.host or "", right=False),
    Column("step", "step", lambda r: fmt_duration(r.step_s), lambda r: _num(r.step_s)),
    Column(
        "rate", "samples/s", lambda r: fmt_number(r.samples_per_s), lambda r: _num(r.samples_per_s)
    ),
    Column("wait", "data wait", lambda r: fmt_share(r.wait_share), lambda r: _num(r.wait_share)),
    Column("own", "own time", lambda r: fmt_share(r.own_share), lambda r: _num(r.own_share)),
    Column(
        "device", "device util mem", _device_text, lambda r: _num(r.device_util_pct), right=False
    ),
    Column("verdict", "verdict", lambda r: r.verdict or "", lambda r: r.verdict or "", right=False),
    Column("state", "state", lambda r: r.state, lambda r: r.state, right=False),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)


def job_line(job: JobSummary) -> str:
    """The job in one line: its verdict, or that it is not judged yet."""
    world = job.world_size if job.world_size is not None else "?"
    hosts = len(job.hosts)
    head = f"job {job.job_id}: {len(job.ranks)} of {world} ranks on {hosts} host"
    head += "s" if hosts != 1 else ""
    verdict = job.verdict
    return f"{head} · {verdict.headline}" if verdict is not None else f"{head} · not judged yet"


class KeyedText(Text):
    """A cell that knows its row (DataTable's sort sees cells, not row keys)."""

    def __init__(self, row_key: str, text: str, **kwargs: object) -> None:
        super().__init__(text, **kwargs)  # type: ignore[arg-type]
        self.row_key = row_key


class RankTable(DataTable[Text]):
    COMPONENT_CLASSES = DataTable.COMPONENT_CLASSES | {"rankboard--slow", "rankboard--dim"}


class RankBoard(Screen[None]):
    """One row per rank of a job; ``j`` or ``escape`` returns to the panels."""

    BINDINGS = [
        Binding("j,escape", "dismiss", "Back to panels"),
        Binding("o", "cycle_sort", "Sort column"),
        Binding("r", "reverse_sort", "Reverse"),
    ]

    def __init__(self) -> None:
        super().__init__(id="rankboard")
        self.verdict_line = Static(id="rankboard-verdict")
        self.table = RankTable(id="rankboard-table", cursor_type="row", zebra_stripes=True)
        self.sort_column = "rank"
        self.sort_reverse = False
        self.job_id: str | None = None
        self._rows: dict[str, RankRow] = {}
        self._order: tuple[str, ...] = ()
        self._before_mount: tuple[JobSummary | None] | None = None  # shown once mounted

    def compose(self) -> ComposeResult:
        yield self.verdict_line
        yield self.table
        yield Footer()

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.table.add_column(f"{column.label}  ", key=column.key)  # room for the arrow
        self._label_columns()
        if self._before_mount is not None:
            self.show(self._before_mount[0])
        self._before_mount = None

    # ---------------------------------------------------------------- data

    def show(self, job: JobSummary | None) -> None:
        """Show ``job`` (the selected run's): rows added, removed, changed cells updated."""
        if not self.table.columns:  # not mounted yet: on_mount shows it
            self._before_mount = (job,)
            return
        if job is None:
            self.verdict_line.update(
                "the selected run is not part of a distributed job "
                "(it has no torchrun, Slurm or MASTER_ADDR/MASTER_PORT environment)"
            )
            self.verdict_line.set_classes("-muted")
            if self._rows:
                self.table.clear()
                self._rows.clear()
            self.job_id = None
            return
        severity = job.verdict.severity if job.verdict is not None else "info"
        self.verdict_line.set_classes(f"-{severity}")
        self.verdict_line.update(job_line(job))
        if job.job_id != self.job_id:
            self.table.clear()
            self._rows.clear()
            self.job_id = job.job_id
        table = self.table
        seen = set()
        reorder = False
        for row in job.ranks:
            seen.add(row.key)
            old = self._rows.get(row.key)
            if old == row:
                continue
            self._rows[row.key] = row
            cells = self._cells(row)
            if old is None:
                table.add_row(*cells, key=row.key)
                reorder = True
                continue
            old_cells = self._cells(old)
            for column, new, before in zip(COLUMN_KEYS, cells, old_cells, strict=True):
                if (new.plain, new.style) != (before.plain, before.style):
                    table.update_cell(row.key, column, new)
                    reorder = reorder or column == self.sort_column
        for key in [k for k in self._rows if k not in seen]:
            del self._rows[key]
            table.remove_row(key)
        if reorder:
            self._sort()

    def _cells(self, row: RankRow) -> list[Text]:
        style = self.table.get_component_rich_style("rankboard--slow") if row.slow else None
        if style is None and row.state != "live":
            style = self.table.get_component_rich_style("rankboard--dim")
        cells = [
            Text(column.text(row), style=style or "", justify="right" if column.right else "left")
            for column in COLUMNS[1:]
        ]
        first = COLUMNS[0]
        return [KeyedText(row.key, first.text(row), style=style or "", justify="right"), *cells]

    # ---------------------------------------------------------------- sorting

    def _sort(self) -> None:
        column = next(c for c in COLUMNS if c.key == self.sort_column)
        rows = self._rows
        order = sorted(rows, key=lambda key: (column.order(rows[key]), _num(rows[key].rank)))
        if self.sort_reverse:
            order.reverse()
        if tuple(order) == self._order:
            return
        self._order = tuple(order)
        position = {key: i for i, key in enumerate(order)}
        # DataTable sorts by cell values; the first cell carries its row's key.
        self.table.sort("rank", key=lambda cell: position.get(getattr(cell, "row_key", ""), 0))

    def _label_columns(self) -> None:
        arrow = "▼" if self.sort_reverse else "▲"
        for column in COLUMNS:
            label = column.label + (f" {arrow}" if column.key == self.sort_column else "  ")
            self.table.columns[ColumnKey(column.key)].label = Text(label)
        self.table.refresh()

    def action_cycle_sort(self) -> None:
        index = COLUMN_KEYS.index(self.sort_column)
        self.sort_column = COLUMN_KEYS[(index + 1) % len(COLUMN_KEYS)]
        self._order = ()
        self._label_columns()
        self._sort()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._order = ()
        self._label_columns()
        self._sort()
