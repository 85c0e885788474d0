"""GPUs and HPUs: utilisation and memory bars, power, temperature, clocks, PCIe.

Rows keep the fields that fit the width, most important first; with many devices on a
narrow terminal two devices share a row so that eight GPUs fit in four lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.control import strip_control_codes
from rich.text import Text

from gputop_dl.probe.samples import (
    ABSENT,
    STARTING,
    GpuSample,
    HpuSample,
    SourceStatus,
    SystemSample,
)
from gputop_dl.tui.format import NA, TIMES, fmt_pct, fmt_rate, fmt_ratio, fmt_temp
from gputop_dl.tui.widgets.base import Panel, Part, assemble, trusted_copy

MIN_CELL = 34  # columns a device needs when two share a row
MISSING_SOURCES = {"nvml": "no NVIDIA GPU", "hl-smi": "no Gaudi"}
SOURCE_KINDS = {"nvml": "GPU", "hl-smi": "HPU"}
COMPACT_PROBLEMS = 2  # a short screen's lines for devices with errors, then a count
PROBLEM_SHOWN = 48  # columns of a device's problem in its row (all of it in the sample)
SOURCE_NAMES = {"nvml": "NVML", "hl-smi": "hl-smi"}
STALE = "stale"  # what a device's cell says when its source stopped updating
# A per-field error's function, as the row names the field ("util: Unknown Error")
FIELD_WORDS = (
    ("Utilization", "util"),
    ("MemoryInfo", "mem"),
    ("PowerUsage", "power"),
    ("PowerLimit", "power limit"),
    ("Temperature", "temp"),
    ("ClockInfo", "clock"),
    ("Clocks", "clock reasons"),
    ("PcieThroughput", "PCIe"),
    ("Processes", "processes"),
)
THROTTLE_WORDS = {
    "hw_thermal": "thermal",
    "sw_thermal": "thermal",
    "hw_power_brake": "power brake",
    "sw_power_cap": "power cap",
    "hw_slowdown": "slowdown",
}
HOT_C = 85.0
COMPACT_ONE_A_LINE = 2  # a short screen shows this many devices a line each, more as
# cells: "0 ▇▇▇▇  30% m 73%", four to a line at 80 columns
CELL_BAR = 4
CELL_GAP = 2


@dataclass(frozen=True)
class Device:
    """What one row shows, for a GPU or an HPU alike."""

    kind: str  # "GPU" or "HPU"
    index: int
    name: str | None
    lost: str | None  # why, when the device is lost
    problem: str | None  # what went wrong reading it ("util: Unknown Error"; "stale: ...")
    util_pct: float | None
    mem_used: int | None
    mem_total: int | None
    power_w: float | None
    power_limit_w: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None = None
    pcie_rx_bps: float | None = None
    pcie_tx_bps: float | None = None
    throttle: tuple[str, ...] = ()
    stale: bool = False  # its figures are the last ones its source gave, seconds old


def field_errors(error: str | None) -> str | None:
    """A sample's error as a row says it: NVML's "nvmlDeviceGetUtilizationRates: Unknown
    Error; ..." as "util: Unknown Error, ..."; any other text as it is. Not "n/a": that
    is a field the device lacks (nvml.md), not a call that failed."""
    if not error:
        return None
    parts = []
    for part in error.split("; "):
        function, sep, message = part.partition(": ")
        word = next((w for key, w in FIELD_WORDS if key in function), None)
        parts.append(f"{word}: {message}" if sep and word else part)
    return ", ".join(parts)


def _gpu(gpu: GpuSample) -> Device:
    lost = (gpu.error or "lost") if gpu.state == "lost" else None
    throttle = tuple(
        dict.fromkeys(THROTTLE_WORDS[r] for r in gpu.throttle_reasons or () if r in THROTTLE_WORDS)
    )
    return Device(
        "GPU",
        gpu.index,
        gpu.name,
        lost,
        field_errors(gpu.error) if lost is None else None,
        gpu.util_pct,
        gpu.mem_used_bytes,
        gpu.mem_total_bytes,
        gpu.power_w,
        gpu.power_limit_w,
        gpu.temperature_c,
        gpu.sm_clock_mhz,
        gpu.pcie_rx_bps,
        gpu.pcie_tx_bps,
        throttle,
    )


def _hpu(hpu: HpuSample) -> Device:
    lost = (hpu.error or "lost") if hpu.state == "lost" else None
    return Device(
        "HPU",
        hpu.index,
        hpu.name,
        lost,
        hpu.error if lost is None else None,
        hpu.util_pct,
        hpu.mem_used_bytes,
        hpu.mem_total_bytes,
        hpu.power_w,
        hpu.power_max_w,
        hpu.temperature_c,
        stale=hpu.state == "stale",
    )


def _short_name(name: str | None) -> str:
    return (name or "?").removeprefix("NVIDIA ").removeprefix("Intel ")


def _power(device: Device) -> str:
    if device.power_w is None:
        return NA
    if device.power_limit_w is None:
        return f"{device.power_w:.0f}W"
    return f"{device.power_w:.0f}/{device.power_limit_w:.0f}W"


class AcceleratorsPanel(Panel):
    COMPONENT_CLASSES = {"gpu--util", "gpu--mem", "gpu--lost"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.devices: tuple[Device, ...] = ()
        self.statuses: tuple[SourceStatus, ...] = ()
        self.border_title = "Accelerators"
        # The rows of the last build, by what they were built from: a device whose figures
        # did not change since the last sample (an idle GPU beside the busy ranks) is not
        # formatted again. Only the last build's rows are kept (bounded by the devices).
        self._rows: dict[tuple[Device, int, bool, bool], Text] = {}

    def show(self, system: SystemSample | None) -> None:
        if system is None:
            if self.unchanged(None):
                return
            self.devices, self.statuses = (), ()
        else:
            if self.unchanged(system.gpus, system.hpus, system.statuses):
                return
            self.devices = tuple(_gpu(g) for g in system.gpus) + tuple(_hpu(h) for h in system.hpus)
            self.statuses = tuple(
                s for s in system.statuses if not s.ok and s.source in MISSING_SOURCES
            )
        self.set_border_title(self._title())
        self.changed()

    def _title(self) -> str:
        if not self.devices:
            return "Accelerators"
        parts = []
        for kind in ("GPU", "HPU"):
            devices = [d for d in self.devices if d.kind == kind]
            if not devices:
                continue
            names = {d.name for d in devices if d.name}
            name = f" {_short_name(names.pop())}" if len(names) == 1 else ""
            parts.append(f"{kind} {TIMES}{len(devices)}{name}")
        return " · ".join(parts) + " · util, memory"

    def layout_key(self) -> tuple[bool, bool]:
        return self.is_attached and self.screen.has_class("-narrow"), self.compact

    def _same_names(self) -> bool:
        return len({(d.kind, d.name) for d in self.devices if d.lost is None}) <= 1

    def build(self, width: int) -> list[Text]:
        lines: list[Text] = []
        if not self.devices and not self.statuses:
            return [Text("no accelerator reported", self.style("panel--dim"))]
        if self.compact:
            return self._compact(width)
        # On a narrow screen height is short: four or more devices go two to a row.
        two_per_row = (
            len(self.devices) >= 4
            and self.screen.has_class("-narrow")
            and (width - 2) // 2 >= MIN_CELL
        )
        cell_width = (width - 2) // 2 if two_per_row else width
        show_name = not self._same_names()
        cells = self._rows_of(cell_width, show_name)
        if two_per_row:
            for left, right in zip(cells[0::2], [*cells[1::2], Text()], strict=False):
                left.truncate(cell_width, pad=True)
                lines.append(Text("  ").join([left, right]))
        else:
            lines.extend(cells)
        for status in self.statuses:
            lines.append(self._status_line(status))
        return lines

    def _has(self, source: str) -> bool:
        kind = SOURCE_KINDS[source]
        return any(d.kind == kind for d in self.devices)

    def _present(self, status: SourceStatus) -> bool:
        """The source has devices here (on screen, or ones it failed to read): its problem
        is a warning, not "no Gaudi", and a short screen keeps a line for it."""
        return self._has(status.source) or status.state != ABSENT

    def _status_line(self, status: SourceStatus) -> Text:
        """A source's problem: "no Gaudi: hl-smi not installed" when there is none to
        read, a warning naming it when its devices are on screen (their figures may be
        old) or when it failed to read them (a hung driver is not "no NVIDIA GPU")."""
        message = status.message or "not available"
        if status.state == STARTING:
            return Text(f"{SOURCE_NAMES[status.source]}: {message}", self.style("panel--dim"))
        if self._present(status):
            return Text(f"⚠ {SOURCE_NAMES[status.source]}: {message}", self.style("panel--warning"))
        return Text(f"{MISSING_SOURCES[status.source]}: {message}", self.style("panel--dim"))

    def _rows_of(self, width: int, show_name: bool) -> list[Text]:
        """:meth:`_row` of every device, reusing the last build's row for a device shown
        as before (a copy: the caller truncates and pads the rows it gets)."""
        wide_index = len(self.devices) > 10
        previous, rows = self._rows, {}
        cells = []
        for device in self.devices:
            key = (device, width, show_name, wide_index)
            row = previous.get(key)
            if row is None:
                row = self._row(device, width, show_name)
            rows[key] = row
            cells.append(trusted_copy(row))
        self._rows = rows
        return cells

    def notify_style_update(self) -> None:
        self._rows = {}  # built with the component styles of before
        super().notify_style_update()

    def _compact(self, width: int) -> list[Text]:
        """A short screen: a few devices one line each, more as a grid of cells (util
        bar and %, memory %), the missing sources in one line only without devices."""
        if not self.devices:
            return [Text(" · ").join(self._status_line(s) for s in self.statuses)]
        # A source whose devices are shown, or that failed to read them, says what is
        # wrong even here (a stale hl-smi's figures look live otherwise); absent ones
        # do not take a line.
        problems = [self._status_line(s) for s in self.statuses if self._present(s)]
        if len(self.devices) <= COMPACT_ONE_A_LINE:
            rows = [self._row(d, width, not self._same_names()) for d in self.devices]
            return rows + problems
        # A cell has room for a ⚠ only: which device and what, below (a few of them).
        failing = [d for d in self.devices if d.problem is not None and not d.stale]
        for device in failing[:COMPACT_PROBLEMS]:
            problems.append(
                Text(
                    f"⚠ {device.kind} {device.index}: {device.problem}",
                    self.style("panel--warning"),
                )
            )
        if len(failing) > COMPACT_PROBLEMS:
            more = len(failing) - COMPACT_PROBLEMS
            problems.append(
                Text(f"⚠ {more} more devices with errors", self.style("panel--warning"))
            )
        cells = [self._cell(d) for d in self.devices]
        cell_width = max(cell.cell_len for cell in cells)
        per_row = max(1, (width + CELL_GAP) // (cell_width + CELL_GAP))
        lines = []
        for start in range(0, len(cells), per_row):
            row = cells[start : start + per_row]
            for cell in row[:-1]:
                cell.truncate(cell_width, pad=True)
            lines.append(Text(" " * CELL_GAP).join(row))
        return lines + problems

    def _cell(self, device: Device) -> Text:
        # GPUs and HPUs on one node are both numbered from 0: then the kind's initial
        # (and a shorter bar, so that four still fit a line at 80 columns)
        mixed = len({d.kind for d in self.devices}) > 1
        digits = len(str(max(d.index for d in self.devices)))
        index = f"{device.kind[0] if mixed else ''}{device.index:>{digits}} "
        if device.lost is not None:
            cell = Text(index, self.style("panel--label"))
            cell.append("lost", self.style("gpu--lost"))
            return cell
        if device.stale:
            cell = Text(index, self.style("panel--label"))
            cell.append(STALE, self.style("panel--warning"))
            return cell
        mem = (
            100.0 * device.mem_used / device.mem_total
            if device.mem_used is not None and device.mem_total
            else None
        )
        return assemble(
            [
                (index, self.style("panel--label")),
                *self.bar_parts([_fraction(device.util_pct)], CELL_BAR - mixed, ["gpu--util"]),
                (f"{fmt_pct(device.util_pct, compact=True):>5}", None),
                (f" m{fmt_pct(mem, compact=True):>4}", self.style("gpu--mem")),
                ("⚠" if device.throttle or device.problem else "", self.style("panel--warning")),
            ]
        )

    def _row(self, device: Device, width: int, show_name: bool) -> Text:
        label = self.style("panel--label")
        index = f"{device.index:>{2 if len(self.devices) > 10 else 1}} "
        if device.lost is not None:
            lost = Text(index, label)  # the label style spans the padding of a shared row
            lost.append(f"lost: {device.lost}", self.style("gpu--lost"))
            return lost
        if device.stale:
            # Its figures are the last ones hl-smi gave, seconds old: not shown as live.
            stale = Text(index, label)
            stale.append(device.problem or STALE, self.style("panel--warning"))
            return stale
        name = f"{_short_name(device.name)} " if show_name else ""
        util_pct = f"{fmt_pct(device.util_pct, compact=True):>4}"
        short = width < 60
        ratio = fmt_ratio(device.mem_used, device.mem_total, short=short)
        mem_ratio = f" {ratio}" if ratio != NA else " mem n/a"
        temp_style = (
            self.style("panel--warning")
            if device.temperature_c is not None and device.temperature_c >= HOT_C
            else None
        )
        # Optional fields, most important first; each keeps a leading space.
        temp, power = fmt_temp(device.temperature_c), _power(device)
        optional: list[Part] = [  # an unreported value keeps its name: "temp n/a"
            (f"  {temp}" if temp != NA else "  temp n/a", temp_style),
            (f"  {power}" if power != NA else "  power n/a", None),
        ]
        if device.sm_clock_mhz is not None:
            optional.append((f"  {device.sm_clock_mhz:.0f}MHz", None))
        if device.pcie_rx_bps is not None or device.pcie_tx_bps is not None:
            optional.append(
                (f"  PCIe ↓{fmt_rate(device.pcie_rx_bps)} ↑{fmt_rate(device.pcie_tx_bps)}", None)
            )
        problem = device.problem
        if problem is not None and cell_len(problem) > PROBLEM_SHOWN:
            problem = problem[: PROBLEM_SHOWN - 1] + "…"
        warnings = [*device.throttle, *([problem] if problem else [])]
        throttle = f"  ⚠ {', '.join(warnings)}" if warnings else ""
        fixed = cell_len(index + name + util_pct + mem_ratio + throttle) + 1
        min_bars = 10
        chosen: list[Part] = []
        room = width - fixed - min_bars
        for field in optional:
            field_len = cell_len(field[0])
            if field_len <= room:
                chosen.append(field)
                room -= field_len
            else:
                break
        bars = max(4, room + min_bars)
        util_width = max(3, min(24, bars * 11 // 20))
        mem_width = max(3, min(20, bars - util_width))
        mem_fraction = (
            device.mem_used / device.mem_total
            if device.mem_used is not None and device.mem_total
            else None
        )
        # The name and the problem are the strings from the wire here (cleaned at
        # ingest, tui.state.clean): without a control code in them the line has none,
        # and Rich's sanitizing copy of the line can be skipped (with one, Rich strips
        # the line as it always did).
        return assemble(
            [
                (index, label),
                (name, self.style("panel--dim")),
                *self.bar_parts([_fraction(device.util_pct)], util_width, ["gpu--util"]),
                (util_pct, None),
                (" ", None),
                *self.bar_parts([mem_fraction], mem_width, ["gpu--mem"]),
                (mem_ratio, None),
                *chosen,
                (throttle, self.style("panel--warning")),
            ],
            trusted=strip_control_codes(name + throttle) == name + throttle,
        )


def _fraction(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


__all__ = ["AcceleratorsPanel", "Device"]
