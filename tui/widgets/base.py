"""What every panel shares: width-aware rendering and styles taken from ``app.tcss``.

A panel is cheap to keep on screen: ``show`` hands it new data, ``changed`` rebuilds its
lines and asks Textual to repaint only when they differ from what is on screen (and to
lay the screen out again only when the number of lines changed). The lines are built
once per change, at the panel's width, and turned into strips without going through a
Rich console.
"""

from __future__ import annotations

import io
from collections.abc import Hashable, Iterable

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual.app import RenderResult as TextualRenderResult
from textual.css.styles import RulesMap
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.visual import RenderOptions, Visual
from textual.widget import Widget

from gputop_dl.tui.format import bar_eighths, stacked_bar

_WRAP_CONSOLE = Console(file=io.StringIO(), width=1000, color_system=None)
_NULL = Style.null()


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


def trusted_text(plain: str, spans: list[Span] | None = None, style: Style | str = "") -> Text:
    """``Text(plain, style, spans=spans)`` for text this viewer composed itself (bars,
    figures, glyphs; never a string from the wire): Rich strips control codes from every
    string it is given, a ``str.translate`` that costs more than the rest of a wide graph
    row."""
    text = Text(style=style)
    text._text = [plain]  # what Text.__init__ sets, without the sanitizing copy
    text._length = len(plain)
    text._spans = spans or []
    return text


Part = tuple[str, Style | None]
MAX_BARS = 4096  # distinct bars a panel keeps styled (emptied when full)
MAX_SPAN_STYLES = 1024  # distinct span styles a panel keeps combined with its base style


def trusted_copy(text: Text) -> Text:
    """``text.copy()`` without sanitizing its plain text again: it was sanitized when
    ``text`` was made (or composed by this viewer), and stripping is idempotent."""
    copy = trusted_text(text.plain, text.spans[:], text.style)
    copy.justify, copy.overflow, copy.no_wrap = text.justify, text.overflow, text.no_wrap
    copy.end, copy.tab_size = text.end, text.tab_size
    return copy


def assemble(parts: Iterable[Part], *, trusted: bool = False) -> Text:
    """One line from ``(text, style)`` parts, one span per run of the same style (faster
    than ``Text.append`` part by part, and cheaper to draw). ``trusted``: no part holds a
    control code (see :func:`trusted_text`)."""
    plain: list[str] = []
    spans: list[Span] = []
    position = 0
    run_start, run_style = 0, None  # the styled run being extended
    for text, style in parts:
        if not text:
            continue
        if style is not run_style:
            if run_style and run_start < position:
                spans.append(Span(run_start, position, run_style))
            run_start, run_style = position, style
        plain.append(text)
        position += len(text)
    if run_style and run_start < position:
        spans.append(Span(run_start, position, run_style))
    if trusted:
        return trusted_text("".join(plain), spans)
    return Text("".join(plain), spans=spans)


def _as_style(style: str | Style | None) -> Style:
    if not style:
        return _NULL
    return style if isinstance(style, Style) else Style.parse(style)


def line_segments(
    line: Text, base: Style, styles: dict[Style | str, Style | None] | None = None
) -> list[Segment] | None:
    """The segments Rich would render for one line of a panel under ``base`` (the
    widget's own colours), or None when the line needs Rich's general algorithm
    (overlapping spans, tabs). ``styles`` keeps each span style combined with ``base``
    across the lines of one panel (for lines without a style of their own)."""
    plain = line.plain
    if not plain:
        return []
    if "\t" in plain:
        return None
    line_style = base + _as_style(line.style)
    outside = line_style or None
    combined = styles if styles is not None and not line.style else {}
    segments: list[Segment] = []
    append = segments.append
    position = 0
    length = len(plain)
    for start, end, style in line.spans:
        if start < position:
            return None  # overlapping spans: the order of styles matters
        if end > length:
            end = length
        if end <= start:
            continue
        if start > position:
            append(Segment(plain[position:start], outside))
        inside = combined.get(style, _NULL)
        if inside is _NULL:
            if len(combined) >= MAX_SPAN_STYLES:  # bounded: emptied when full
                combined.clear()
            inside = combined[style] = line_style + _as_style(style) or None
        append(Segment(plain[start:end], inside))
        position = end
    if position < length:
        append(Segment(plain[position:], outside))
    return segments


class PanelVisual(Visual):
    """A panel's lines as Textual strips, from the panel's cache."""

    def __init__(self, panel: Panel) -> None:
        self._panel = panel

    def render_strips(
        self, width: int, height: int | None, style: VisualStyle, options: RenderOptions
    ) -> list[Strip]:
        strips = self._panel.strips(width, style.rich_style)
        return strips if height is None else strips[:height]

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return container_width

    def get_height(self, rules: RulesMap, width: int) -> int:
        return max(1, len(self._panel.lines(width)))


def same_line(a: Text, b: Text) -> bool:
    """Whether two lines look the same (``Text ==`` ignores the base style)."""
    return a.plain == b.plain and a.style == b.style and a.spans == b.spans


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


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

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.set_reactive(Widget.auto_links, False)  # no links: no per-strip link pass
        self._visual = PanelVisual(self)
        self._lines_key: Hashable = None
        self._lines: list[Text] = []
        self._strips_key: tuple[int, Style] | None = None
        self._strips: list[Strip] = []
        self._line_strips: dict[int, tuple[Text, Strip]] = {}
        self._line_strips_key: tuple[int, Style] | None = None
        self._component_rich: dict[str, Style] = {}
        self._span_styles: dict[Style | str, Style | None] = {}  # see ``line_segments``
        self._bars: dict[tuple[object, ...], tuple[Part, ...]] = {}  # see ``bar_parts``
        self._shown: object = object()  # what ``show`` was last given (see ``unchanged``)
        self._border_title_text: str | None = None

    def render(self) -> TextualRenderResult:
        return self._visual

    def build(self, width: int) -> list[Text]:
        raise NotImplementedError

    def layout_key(self) -> Hashable:
        """What, besides the width, ``build`` depends on (e.g. the height)."""
        return self.compact

    @property
    def compact(self) -> bool:
        """A short terminal (``-short``, see ``GputopApp.VERTICAL_BREAKPOINTS``): every
        panel keeps to a few lines so that all of them fit under the verdict."""
        return self.is_attached and self.screen.has_class("-short")

    def style(self, component: str) -> Style:
        """The Rich style of ``component`` (a name in ``COMPONENT_CLASSES``).

        Kept until the styles change: Textual forgets it at every repaint."""
        style = self._component_rich.get(component)
        if style is None:
            style = self._component_rich[component] = self.get_component_rich_style(component)
        return style

    # ---------------------------------------------------------------- cache

    def lines(self, width: int) -> list[Text]:
        """``build(width)``, truncated to the width, built once until something changes."""
        width = max(1, width)
        key = (width, self.layout_key())
        if key != self._lines_key:
            lines = self.build(width)
            for line in lines:
                line.truncate(width, overflow="ellipsis")
            self._lines, self._lines_key, self._strips_key = lines, key, None
        return self._lines

    def strips(self, width: int, base: Style) -> list[Strip]:
        """The lines as strips; a line kept from the previous build keeps its strip."""
        lines = self.lines(width)
        key = (width, base)
        if key != self._strips_key:
            reuse = self._line_strips if self._line_strips_key == key else {}
            if self._line_strips_key is None or self._line_strips_key[1] != base:
                self._span_styles = {}  # combined with another base style
            strips, line_strips = [], {}
            for line in lines or [Text()]:
                kept = reuse.get(id(line))
                strip = kept[1] if kept is not None and kept[0] is line else None
                if strip is None:
                    strip = self._strip(line, width, base)
                line_strips[id(line)] = (line, strip)
                strips.append(strip)
            self._strips, self._strips_key = strips, key
            self._line_strips, self._line_strips_key = line_strips, key
        return self._strips

    def _strip(self, line: Text, width: int, base: Style) -> Strip:
        segments = line_segments(line, base, self._span_styles)
        if segments is None:  # Rich's own rendering, as for any renderable
            console = self.app.console
            options = self.app.console_options.update(highlight=False, width=width)
            text = line.copy()
            text.no_wrap = True
            rendered = Segment.apply_style(console.render(text, options), base)
            lines = list(
                Segment.split_and_crop_lines(rendered, width, include_new_lines=False, pad=False)
            )
            segments = lines[0] if lines else []
        return Strip(segments)

    def notify_style_update(self) -> None:
        # A class or theme change may change the component styles the lines were built with.
        self._lines_key = self._strips_key = self._line_strips_key = None
        self._component_rich.clear()
        self._span_styles = {}
        self._bars.clear()
        super().notify_style_update()

    # ---------------------------------------------------------------- updates

    def unchanged(self, *shown: object) -> bool:
        """True when ``show`` is given what it was given last time (nothing to do)."""
        if shown == self._shown:
            return True
        self._shown = shown
        return False

    def changed(self) -> None:
        """Redraw after new data: only the lines that look different; the whole screen
        is laid out again only when the number of lines changed."""
        key = self._lines_key
        if not self.display:  # hidden: built when shown again (which lays out anyway)
            self._lines_key = None
            return
        if key is None or not self.is_mounted or not self.size.width:
            self._lines_key = None
            self.refresh(layout=True)
            return
        old, old_strips_key = self._lines, self._strips_key
        self._lines_key = None
        new = self.lines(key[0])  # type: ignore[index]
        if len(new) != len(old) or not new:
            self.refresh(layout=True)
            return
        dirty = []
        for y, (before, after) in enumerate(zip(old, new, strict=True)):
            if same_line(before, after):
                new[y] = before  # the same object keeps its strip
            else:
                dirty.append(y)
        if not dirty:  # keep what is on screen
            self._lines, self._strips_key = old, old_strips_key
            return
        # Whole rows, border and padding included: the region is relative to the content,
        # so it starts at minus the content's left offset. A region as wide as the content
        # alone made Textual crop each line it rendered again to it: a fifth of what those
        # lines cost it (the CPU grid's 10 lines 570 us against 701, alternated).
        left, width = self.content_offset.x, self.outer_size.width
        self.refresh(
            *(Region(-left, first, width, last - first + 1) for first, last in _runs(dirty))
        )

    def set_border_title(self, title: str) -> None:
        """Setting ``border_title`` repaints even when it is the same: only set changes."""
        if title != self._border_title_text:
            self._border_title_text = title
            self.border_title = title

    def set_display(self, display: bool) -> None:
        if display != self.display:
            self.display = display

    def bar_parts(
        self, fractions: list[float | None], width: int, parts: list[str]
    ) -> tuple[Part, ...]:
        """A stacked bar as parts: part ``i`` takes the style of component ``parts[i]``;
        the empty rest takes ``bar--track``. Kept by what the bar looks like (its eighths):
        64 cores redrawn each second show far fewer distinct bars."""
        if width <= 0:
            return ()
        key = (bar_eighths(fractions, width), width, *parts)
        styled = self._bars.get(key)
        if styled is None:
            if len(self._bars) >= MAX_BARS:
                self._bars.clear()
            styled = self._bars[key] = tuple(
                (chunk, self.style(parts[part] if part >= 0 else "bar--track"))
                for chunk, part in stacked_bar(fractions, width)
            )
        return styled

    def styled_bar(self, fractions: list[float | None], width: int, parts: list[str]) -> Text:
        """:meth:`bar_parts` as a Text."""
        return assemble(self.bar_parts(fractions, width, parts))
