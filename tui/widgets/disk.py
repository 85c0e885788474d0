"""Disks: read and write MB/s and busy % per device; the device holding the data set
is marked, since it is the one an input-bound run waits on."""

from __future__ import annotations

from rich.text import Text

from gputop_dl.probe.samples import DiskSample
from gputop_dl.tui.format import fmt_pct, fmt_rate
from gputop_dl.tui.widgets.base import Panel

MAX_ROWS = 6
BUSY_HIGH_PCT = 70.0
DATA_MARK = "◆"
RATE_WIDTH = 10
COMPACT_ROWS = 2
QUIET_BPS = 1e6  # a short screen leaves out devices under 1 MB/s ...
BUSY_SHOWN_PCT = 20.0  # ... and under 20 % busy


def _traffic(disk: DiskSample) -> float:
    return (disk.read_bps or 0.0) + (disk.write_bps or 0.0)


class DiskPanel(Panel):
    COMPONENT_CLASSES = {"disk--busy", "disk--read", "disk--write"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.disks: tuple[DiskSample, ...] = ()
        self.data_device: str | None = None
        self.data_fs_type: str | None = None
        self.dataset_path: str | None = None
        self.border_title = "Disk"

    def show(
        self,
        disks: tuple[DiskSample, ...],
        data_device: str | None,
        data_fs_type: str | None,
        dataset_path: str | None,
    ) -> None:
        if self.unchanged(disks, data_device, data_fs_type, dataset_path):
            return
        self.disks, self.data_device = disks, data_device
        self.data_fs_type, self.dataset_path = data_fs_type, dataset_path
        self.changed()

    def _ordered(self) -> list[DiskSample]:
        """The data device first, then the busiest; idle devices only while there is room."""
        return sorted(
            self.disks, key=lambda d: (d.device != self.data_device, -_traffic(d), d.device)
        )

    def build(self, width: int) -> list[Text]:
        if not self.disks:
            lines = [Text("no disk reported", self.style("panel--dim"))]
        elif self.compact:
            return self._compact(width)
        else:
            lines = self._table(width)
        note = self._data_note()
        if note is not None:
            lines.append(note)
        return lines

    def _table(self, width: int) -> list[Text]:
        ordered = self._ordered()
        shown = [d for d in ordered if _traffic(d) > 0 or d.device == self.data_device]
        shown = (shown or ordered[:1])[:MAX_ROWS]
        for disk in ordered:
            if len(shown) >= min(MAX_ROWS, 3):
                break
            if disk not in shown:
                shown.append(disk)
        name_width = max(7, *(len(d.device) for d in shown)) + 2
        fixed = name_width + 2 * (RATE_WIDTH + 1) + 6
        bar_width = max(0, min(20, width - fixed - 1))
        head = Text("device".ljust(name_width), self.style("panel--dim"))
        head.append(
            "read".rjust(RATE_WIDTH) + " " + "write".rjust(RATE_WIDTH), self.style("panel--dim")
        )
        head.append("  busy", self.style("panel--dim"))
        lines = [head]
        for disk in shown:
            is_data = disk.device == self.data_device
            line = Text(disk.device, self.style("panel--label"))
            if is_data:
                line.append(f" {DATA_MARK}", self.style("panel--accent"))
            line.pad_right(name_width - line.cell_len)
            line.append(fmt_rate(disk.read_bps).rjust(RATE_WIDTH), self.style("disk--read"))
            line.append(" ")
            line.append(fmt_rate(disk.write_bps).rjust(RATE_WIDTH), self.style("disk--write"))
            line.append(" ")
            busy = disk.busy_pct
            if bar_width >= 4:
                line.append(" ")
                line.append_text(
                    self.styled_bar(
                        [None if busy is None else busy / 100], bar_width, ["disk--busy"]
                    )
                )
            style = self.style("panel--warning") if (busy or 0.0) >= BUSY_HIGH_PCT else ""
            line.append(f"{fmt_pct(busy, compact=True):>5}", style)
            lines.append(line)
        hidden = len(self.disks) - len(shown)
        if hidden > 0:
            lines.append(Text(f"+{hidden} idle", self.style("panel--dim")))
        return lines

    def _compact(self, width: int) -> list[Text]:
        """A short screen: one line a device, the data device and the busiest few;
        the others counted on the last line."""
        ordered = self._ordered()
        shown = [
            d
            for d in ordered
            if d.device == self.data_device
            or _traffic(d) >= QUIET_BPS
            or (d.busy_pct or 0.0) >= BUSY_SHOWN_PCT
        ][:COMPACT_ROWS] or ordered[:1]
        dim = self.style("panel--dim")
        name_width = max(len(d.device) for d in shown) + 2
        lines = []
        for disk in shown:
            line = Text(disk.device, self.style("panel--label"))
            if disk.device == self.data_device:
                line.append(f" {DATA_MARK}", self.style("panel--accent"))
            line.pad_right(name_width - line.cell_len)
            line.append(" read ", dim)
            line.append(fmt_rate(disk.read_bps), self.style("disk--read"))
            line.append(" · write ", dim)
            line.append(fmt_rate(disk.write_bps), self.style("disk--write"))
            busy = disk.busy_pct
            style = self.style("panel--warning") if (busy or 0.0) >= BUSY_HIGH_PCT else None
            line.append(" · busy ", dim)
            line.append(fmt_pct(busy, compact=True), style)
            lines.append(line)
        hidden = len(self.disks) - len(shown)
        if hidden > 0:
            lines[-1].append(f" · +{hidden} quiet", dim)
        return lines

    def _data_note(self) -> Text | None:
        if self.data_device is None and self.dataset_path is None:
            return None
        line = Text(f"{DATA_MARK} data", self.style("panel--accent"))
        if self.dataset_path:
            line.append(f" {self.dataset_path}")
        if self.data_device:
            line.append(f" on {self.data_device}", self.style("panel--dim"))
        if self.data_fs_type:
            line.append(f" ({self.data_fs_type})", self.style("panel--dim"))
        return line
