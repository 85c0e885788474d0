"""What every panel shares: width-aware rendering and styles taken from ``app.tcss``."""

from __future__ import annotations

import io
from collections.abc import Callable

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text
from textual.app import RenderResult as TextualRenderResult
from textual.widget import Widget

from tui.format import stacked_bar

_WRAP_CONSOLE = Console(file=io.StringIO(), width=1000, color_system=None)


def wrap(text: Text, width: int, *, max_lines: int = 2, indent: int = 2) -> list[Text]:
    """``text`` word-wrapped to ``width``; continuation lines indented; at most
    ``max_lines`` (the last one ends in "…" when text was left out)."""
    if text.cell_len <= width or max_lines <= 1:
        return [text]
    first, *rest = text.wrap(_WRAP_CONSOLE, width)
    lines = [first]
    if rest:
        remainder = Text(" ").join(rest)
        for line in remainder.wrap(_WRAP_CONSOLE, max(1, width - indent)):
            lines.append(Text(" " * indent) + line)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        last.truncate(max(1, width - 1))
        last.append("…")
    for line in lines:
        line.rstrip()
    return lines


class Lines:
    """A Rich renderable whose lines are built for the width Textual gives it, so that
    panels lay themselves out (bar widths, grid columns) for any terminal size."""

    def __init__(self, build: Callable[[int], list[Text]]) -> None:
        self._build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(1, options.max_width)
        lines = self._build(width)
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        text = Text("\n").join(lines)
        text.no_wrap = True
        yield text  # ends in a newline: Textual counts newlines for the height

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)


class Panel(Widget):
    """A panel: keeps what it was last shown (``show``) and renders it in ``build``.

    Colours live in ``app.tcss`` as component classes (``COMPONENT_CLASSES``); ``style``
    reads them, so this module never names a colour.
    """

    DEFAULT_CSS = """
    Panel {
        height: auto;
    }
    """

    COMPONENT_CLASSES = {
        "bar--track",  # the empty part of every bar
        "panel--dim",  # labels, units, statuses that need no action
        "panel--label",  # names: devices, interfaces, cores
        "panel--ok",
        "panel--warning",
        "panel--error",
        "panel--accent",  # marks: the data device, the selected run
    }

    def render(self) -> TextualRenderResult:
        return Lines(self.build)

    def build(self, width: int) -> list[Text]:
        raise NotImplementedError

    def style(self, component: str) -> Style:
        """The Rich style of ``component`` (a name in ``COMPONENT_CLASSES``)."""
        return self.get_component_rich_style(component)

    def changed(self) -> None:
        """Redraw after new data; the height may change with it."""
        self.refresh(layout=True)

    def styled_bar(self, fractions: list[float | None], width: int, parts: list[str]) -> Text:
        """A stacked bar whose part ``i`` takes the style of component ``parts[i]``; the
        empty rest takes ``bar--track``."""
        text = Text()
        for chunk, part in stacked_bar(fractions, width):
            text.append(chunk, self.style(parts[part] if part >= 0 else "bar--track"))
        return text
