"""CPU cores as a compact grid of stacked bars (user, system, iowait, steal), the
DataLoader workers' CPU, load and the container's CPU quota."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.style import Style
from rich.text import Span, Text

from gputop_dl.probe.samples import CgroupSample, CpuCore, CpuSample, TrainingProcesses
from gputop_dl.tui.format import TIMES, bar_eighths, fmt_pct
from gputop_dl.tui.widgets.base import MAX_BARS, Panel, Part, assemble, trusted_text

MAX_SHARES = 16  # workers whose CPU the line lists, busiest first; the rest counted
SUMMARY_BAR = 12  # the all-cores bar of the compact form
IOWAIT_SHOWN_PCT = 1.0  # the compact form names iowait only from this share on
CORE_PARTS = ["cpu--user", "cpu--system", "cpu--iowait", "cpu--steal"]
BarRun = tuple[int, int, str | Style]  # (start, end, style) within a core's bar


@dataclass(frozen=True)
class GridShape:
    columns: int
    rows: int
    bar_width: int
    show_pct: bool


def grid_shape(cores: int, width: int) -> GridShape:
    """Columns, rows and bar width so that ``cores`` fit ``width`` in few rows: at most
    4 rows up to 16 cores, 8 rows beyond (64 cores: 8 x 8); percentages when room."""
    cores = max(1, cores)
    label = len(str(cores - 1)) + 1
    max_rows = 4 if cores <= 16 else 8
    columns = math.ceil(cores / max_rows)
    for show_pct, minimum in ((True, 8), (False, 4)):
        bar = width // columns - label - 1 - (5 if show_pct else 0)
        if bar >= minimum:
            return GridShape(columns, math.ceil(cores / columns), min(bar, 40), show_pct)
    columns = max(1, width // (label + 3 + 1))
    bar = max(1, width // columns - label - 1)
    return GridShape(columns, math.ceil(cores / columns), bar, False)


def _fractions(core: CpuCore) -> list[float | None]:
    return [
        None if v is None else v / 100.0
        for v in (core.user_pct, core.system_pct, core.iowait_pct, core.steal_pct)
    ]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


class CpuPanel(Panel):
    COMPONENT_CLASSES = {"cpu--user", "cpu--system", "cpu--iowait", "cpu--steal"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cpu: CpuSample | None = None
        self.processes: TrainingProcesses | None = None
        self.cgroup: CgroupSample | None = None
        self.border_title = "CPU"
        self._core_bars: dict[tuple[object, ...], tuple[str, tuple[BarRun, ...]]] = {}

    def show(
        self,
        cpu: CpuSample | None,
        processes: TrainingProcesses | None,
        cgroup: CgroupSample | None,
    ) -> None:
        if self.unchanged(cpu, processes, cgroup):
            return
        self.cpu, self.processes, self.cgroup = cpu, processes, cgroup
        count = len(cpu.cores) if cpu is not None else 0
        load = ""
        if cpu is not None and cpu.load_avg is not None:
            load = " · load " + " ".join(f"{v:.1f}" for v in cpu.load_avg)
        self.set_border_title(f"CPU {TIMES}{count}{load}" if count else "CPU")
        self.changed()

    def build(self, width: int) -> list[Text]:
        lines: list[Text] = []
        workers = self._workers_line()
        if workers is not None and workers.cell_len > width:  # the counts before the figures
            workers = self._workers_line(figures=False)
        if workers is not None and workers.cell_len > width:
            workers = self._workers_line(figures=False, main_label="main")
        if workers is not None:
            lines.append(workers)
        if self.cpu is None or not self.cpu.cores:
            lines.append(Text("no CPU sample yet", self.style("panel--dim")))
            return lines
        if self.compact:
            lines.append(self._busiest(self.cpu.cores, width))
            return lines
        lines.extend(self._grid(self.cpu.cores, width))
        lines.append(self._summary(self.cpu.cores))
        return lines

    def _busiest(self, cores: tuple[CpuCore, ...], width: int) -> Text:
        """One line: a bar of all cores together, then the busiest cores by number."""
        mean = [_mean([f[i] for f in map(_fractions, cores)]) for i in range(len(CORE_PARTS))]
        dim = self.style("panel--dim")
        parts: list[Part] = [("all ", dim)]
        parts += self.bar_parts(mean, SUMMARY_BAR, CORE_PARTS)
        busy = _mean([c.busy_pct for c in cores])
        parts.append((f"{fmt_pct(busy, compact=True):>5}", None))
        iowait = _mean([c.iowait_pct for c in cores])
        if iowait is not None and iowait >= IOWAIT_SHOWN_PCT:
            parts.append((f" · iowait {fmt_pct(iowait, 1)}", self.style("cpu--iowait")))
        parts.append((" · busiest:", dim))
        room = width - sum(len(text) for text, _ in parts)
        ranked = sorted(cores, key=lambda c: -(c.busy_pct or 0.0))
        for core in ranked:
            cell = f" #{core.index} {fmt_pct(core.busy_pct, compact=True)}"
            if len(cell) > room or core.busy_pct is None:
                break
            parts.append((cell, None))
            room -= len(cell)
        return assemble(parts)

    def _grid(self, cores: tuple[CpuCore, ...], width: int) -> list[Text]:
        shape = grid_shape(len(cores), width)
        label_width = len(str(len(cores) - 1))
        dim = self.style("panel--dim")
        lines = []
        for row in range(shape.rows):
            plain: list[str] = []
            spans: list[Span] = []
            offset = 0
            for column in range(shape.columns):
                position = column * shape.rows + row  # column-major, like htop
                if position >= len(cores):
                    break
                core = cores[position]
                # The gap before a column takes the label's colour: a space looks the
                # same in any colour, and one run is drawn instead of two.
                label = f"{' ' if column else ''}{core.index:>{label_width}} "
                spans.append(Span(offset, offset + len(label), dim))
                offset += len(label)
                bar, runs = self._core_bar(core, shape)
                spans += [Span(offset + start, offset + end, style) for start, end, style in runs]
                plain += (label, bar)
                offset += len(bar)
            lines.append(trusted_text("".join(plain), spans))  # digits and bars only
        return lines

    def _core_bar(self, core: CpuCore, shape: GridShape) -> tuple[str, tuple[BarRun, ...]]:
        """A core's bar and figure, as text and styled runs, kept by their look: a grid
        of 64 cores redrawn every second holds far fewer distinct bars."""
        fractions = _fractions(core)
        pct = f"{fmt_pct(core.busy_pct, compact=True):>5}" if shape.show_pct else ""
        key = (bar_eighths(fractions, shape.bar_width), shape.bar_width, pct)
        bar = self._core_bars.get(key)
        if bar is None:
            cell = assemble([*self.bar_parts(fractions, shape.bar_width, CORE_PARTS), (pct, None)])
            bar = (cell.plain, tuple((s.start, s.end, s.style) for s in cell.spans))
            if len(self._core_bars) >= MAX_BARS:
                self._core_bars.clear()
            self._core_bars[key] = bar
        return bar

    def notify_style_update(self) -> None:
        self._core_bars.clear()  # styled with the component styles of before
        super().notify_style_update()

    def _summary(self, cores: tuple[CpuCore, ...]) -> Text:
        line = Text()
        busy = _mean([c.busy_pct for c in cores])
        iowait = _mean([c.iowait_pct for c in cores])
        line.append(f"busy {fmt_pct(busy)} · iowait {fmt_pct(iowait, 1)}")
        quota = self.cgroup.cpu_quota_cores if self.cgroup is not None else None
        if quota is not None:
            line.append(f" · quota {quota:g} cores")
            throttled = self.cgroup.throttled_pct if self.cgroup is not None else None
            if throttled is not None:
                style = self.style("panel--warning") if throttled >= 10 else ""
                line.append(f", throttled {fmt_pct(throttled)}", style)
        line.append("   ")
        for part, name in zip(CORE_PARTS, ("user", "system", "iowait", "steal"), strict=True):
            line.append("■", self.style(part))
            line.append(f" {name} ", self.style("panel--dim"))
        return line

    def _workers_line(self, figures: bool = True, main_label: str = "main process") -> Text | None:
        processes = self.processes
        if processes is None:
            return None
        workers = [p for p in processes.processes if p.role == "worker"]
        main = next((p for p in processes.processes if p.role == "main"), None)
        line = Text()
        if workers:
            count, saturated = len(workers), processes.saturated_workers
            style = self.style("panel--warning") if saturated >= count else ""
            noun = "worker" if count == 1 else "workers"
            line.append(f"DataLoader: {count} {noun}", self.style("panel--label"))
            if all(w.cpu_pct is None for w in workers):
                # new workers' first sample (each pass, without persistent_workers): no
                # interval to measure their CPU over yet, so nothing to say about it
                line.append(", CPU not measured yet", self.style("panel--dim"))
            else:
                line.append(f", {saturation_words(count, saturated)}", style)
                if figures:
                    busiest = sorted(workers, key=lambda p: -(p.cpu_pct or 0.0))[:MAX_SHARES]
                    shares = ", ".join(fmt_pct(w.cpu_pct, compact=True) for w in busiest)
                    line.append(f" ({shares}", style)
                    if count > MAX_SHARES:
                        line.append(f" +{count - MAX_SHARES} more", self.style("panel--dim"))
                    line.append(")", style)
        else:
            # The loader's own setting is the banner's to state (the probe reports it, or
            # says it is unknown): here only what the process table shows.
            line.append("no DataLoader worker processes", self.style("panel--dim"))
        if main is not None:
            line.append(f" · {main_label} ")
            line.append(fmt_pct(main.cpu_pct, compact=True))
        others = [p for p in processes.processes if p.role == "other"]
        if others and figures:  # compilers, tokenizers, loggers: the training's, not workers
            children = "other child" if len(others) == 1 else "other children"
            line.append(f" · {len(others)} {children} ", self.style("panel--dim"))
            line.append(fmt_pct(sum(p.cpu_pct or 0.0 for p in others), compact=True))
        return line


def saturation_words(count: int, saturated: int) -> str:
    """How many of ``count`` DataLoader workers are saturated (the probe's count of those
    at >= 90 % of a core: they cannot go faster), in words read at a glance: "none
    saturated", "2 saturated", "all saturated"; "saturated" or "not saturated" for a lone
    worker. A bare count read as a riddle: "0 at ≥90 % of a core (1 1 %)"."""
    if count == 1:
        return "saturated" if saturated else "not saturated"
    if saturated <= 0:
        return "none saturated"
    if saturated >= count:
        return "all saturated"
    return f"{saturated} saturated"
