"""Network interfaces: receive and transmit rates; idle interfaces are summed up in one
line so that a node with many virtual interfaces stays readable."""

from __future__ import annotations

from rich.text import Text

from gputop_dl.probe.samples import NetSample
from gputop_dl.tui.format import fmt_rate
from gputop_dl.tui.widgets.base import Panel

MAX_ROWS = 5
COMPACT_ROWS = 1  # a short screen: the busiest interface, the others named after it
RATE_WIDTH = 10


def _traffic(net: NetSample) -> float:
    return (net.rx_bps or 0.0) + (net.tx_bps or 0.0)


class NetworkPanel(Panel):
    COMPONENT_CLASSES = {"net--rx", "net--tx"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.nets: tuple[NetSample, ...] = ()
        self.border_title = "Network"

    def show(self, nets: tuple[NetSample, ...]) -> None:
        if self.unchanged(nets):
            return
        self.nets = nets
        self.changed()

    def build(self, width: int) -> list[Text]:
        if not self.nets:
            return [Text("no network interface reported", self.style("panel--dim"))]
        busy = sorted((n for n in self.nets if _traffic(n) > 0), key=lambda n: n.interface)
        idle = sorted((n for n in self.nets if _traffic(n) <= 0), key=lambda n: n.interface)
        if self.compact:
            busy.sort(key=lambda n: -_traffic(n))
        shown = busy[: COMPACT_ROWS if self.compact else MAX_ROWS] or idle[:1]
        rest = [n for n in busy + idle if n not in shown]
        name_width = max(6, *(len(n.interface) for n in shown)) + 2
        lines = []
        for net in shown:
            line = Text(net.interface.ljust(name_width), self.style("panel--label"))
            line.append("rx ", self.style("panel--dim"))
            line.append(fmt_rate(net.rx_bps).rjust(RATE_WIDTH), self.style("net--rx"))
            line.append("   tx ", self.style("panel--dim"))
            line.append(fmt_rate(net.tx_bps).rjust(RATE_WIDTH), self.style("net--tx"))
            lines.append(line)
        if rest:
            names = ", ".join(n.interface for n in rest)
            label = "idle" if all(_traffic(n) <= 0 for n in rest) else "also"
            if self.compact:
                lines[-1].append(f" · {label}: {names}", self.style("panel--dim"))
            else:
                lines.append(Text(f"{label}: {names}", self.style("panel--dim")))
        return lines
