"""RAM (used, cached, available), swap with its in/out rates, and one line of pressure
(PSI) and container limits."""

from __future__ import annotations

from rich.text import Text

from gputop_dl.probe.samples import CgroupSample, MemorySample, PressureSample, SourceStatus
from gputop_dl.tui.format import fmt_bytes, fmt_pct, fmt_rate, fmt_ratio
from gputop_dl.tui.widgets.base import Panel

SWAP_ACTIVE_BPS = 1e6  # sustained swap-in above this slows training: shown as a warning
PRESSURE_HIGH_PCT = 20.0
LABEL_WIDTH = 5


def _share(part: int | None, total: int | None) -> float | None:
    if part is None or not total:
        return None
    return part / total


COMPACT_BAR = 8


class MemoryPanel(Panel):
    COMPONENT_CLASSES = {"mem--used", "mem--cached", "mem--swap"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.memory: MemorySample | None = None
        self.pressure: PressureSample | None = None
        self.cgroup: CgroupSample | None = None
        self.statuses: tuple[SourceStatus, ...] = ()
        self.border_title = "Memory"

    def show(
        self,
        memory: MemorySample | None,
        pressure: PressureSample | None,
        cgroup: CgroupSample | None,
        statuses: tuple[SourceStatus, ...] = (),
    ) -> None:
        if self.unchanged(memory, pressure, cgroup, statuses):
            return
        self.memory, self.pressure, self.cgroup = memory, pressure, cgroup
        total = memory.total_bytes if memory is not None else None
        self.set_border_title(f"Memory · {fmt_bytes(total)}" if total else "Memory")
        self.statuses = tuple(s for s in statuses if s.source in ("pressure", "cgroup"))
        self.changed()

    def build(self, width: int) -> list[Text]:
        memory = self.memory
        if memory is None:
            return [Text("no memory sample yet", self.style("panel--dim"))]
        bar_width = COMPACT_BAR if self.compact else max(6, min(30, width // 4))
        ram = Text("RAM".ljust(LABEL_WIDTH), self.style("panel--label"))
        used = _share(memory.used_bytes, memory.total_bytes)
        cached = _share(memory.cached_bytes, memory.total_bytes)
        ram.append_text(self.styled_bar([used, cached], bar_width, ["mem--used", "mem--cached"]))
        ram.append(" used ", self.style("panel--dim"))
        ram.append(fmt_bytes(memory.used_bytes), self.style("mem--used"))
        if not self.compact:
            ram.append(" · cache ", self.style("panel--dim"))
            ram.append(fmt_bytes(memory.cached_bytes), self.style("mem--cached"))
        ram.append(" · avail ", self.style("panel--dim"))
        ram.append(fmt_bytes(memory.available_bytes))

        if self.compact:
            return [self._compact_tail(ram)]
        swap = Text("swap".ljust(LABEL_WIDTH), self.style("panel--label"))
        swap_share = _share(memory.swap_used_bytes, memory.swap_total_bytes)
        swap.append_text(self.styled_bar([swap_share], bar_width, ["mem--swap"]))
        if memory.swap_total_bytes == 0:
            swap.append(" none configured", self.style("panel--dim"))
        else:
            swap.append(f" {fmt_ratio(memory.swap_used_bytes, memory.swap_total_bytes)}")
            swapping = (memory.swap_in_bps or 0.0) >= SWAP_ACTIVE_BPS
            style = self.style("panel--warning") if swapping else self.style("panel--dim")
            swap.append(f" · in {fmt_rate(memory.swap_in_bps)}", style)
            swap.append(f" · out {fmt_rate(memory.swap_out_bps)}", self.style("panel--dim"))
        lines = [ram, swap]
        limits = self._limits_line()
        if limits is not None:
            lines.append(limits)
        return lines

    def _compact_tail(self, ram: Text) -> Text:
        """A short screen: swap and the limits after RAM, on the same line."""
        memory = self.memory
        assert memory is not None
        dim = self.style("panel--dim")
        ram.append(" · swap ", dim)
        if memory.swap_total_bytes == 0:
            ram.append("none", dim)
        else:
            swapping = (memory.swap_in_bps or 0.0) >= SWAP_ACTIVE_BPS
            ram.append(
                fmt_ratio(memory.swap_used_bytes, memory.swap_total_bytes),
                self.style("panel--warning") if swapping else None,
            )
        limits = self._limits_line()
        if limits is not None:
            ram.append(" · ", dim)
            ram.append_text(limits)
        return ram

    def _limits_line(self) -> Text | None:
        parts: list[Text] = []
        pressure = self.pressure
        if pressure is not None:
            text = Text("pressure ", self.style("panel--label"))
            for name, value in (
                ("cpu", pressure.cpu_some),
                ("io", pressure.io_some),
                ("mem", pressure.memory_some),
            ):
                style = (
                    self.style("panel--warning")
                    if value is not None and value >= PRESSURE_HIGH_PCT
                    else ""
                )
                text.append(f"{name} {fmt_pct(value)}", style)
                text.append(" ")
            text.rstrip()
            parts.append(text)
        cgroup = self.cgroup
        if cgroup is not None and cgroup.memory_limit_bytes is not None:
            text = Text("cgroup ", self.style("panel--label"))
            text.append(f"mem {fmt_ratio(cgroup.memory_used_bytes, cgroup.memory_limit_bytes)}")
            parts.append(text)
        for status in self.statuses:
            if not status.ok:
                parts.append(
                    Text(f"no {status.source}: {status.message}", self.style("panel--dim"))
                )
        if not parts:
            return None
        return Text(" · ").join(parts)
