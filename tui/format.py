"""Pure formatting helpers for the viewer: numbers, sizes, rates, durations and bars.

Every helper turns ``None`` into :data:`NA` ("n/a"): a value a source did not report is
never shown as a made-up zero. Sizes use binary units (GiB, as ``free -h`` and NVML do),
rates use decimal units (MB/s, as disks and NICs are rated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

NA = "n/a"
TIMES = "\u00d7"  # the multiplication sign of "GPU x8" (not the letter)

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_DECIMAL_RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s")

# Eighth blocks, from empty to a full cell: a bar of width w has 8*w levels.
_EIGHTHS = " ▏▎▍▌▋▊▉█"
FULL_BLOCK = "█"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _three_digits(value: float) -> str:
    """``value`` (0 <= value < 1000) with three significant digits: 1.23, 12.3, 123."""
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _scaled(value: float, step: float, units: Sequence[str]) -> str:
    unit = 0
    while abs(value) >= 999.5 and unit < len(units) - 1:
        value /= step
        unit += 1
    if unit == 0:
        return f"{value:.0f} {units[0]}"
    sign = "-" if value < 0 else ""
    return f"{sign}{_three_digits(abs(value))} {units[unit]}"


def fmt_bytes(value: float | None) -> str:
    """Bytes in binary units: ``12.3 GiB``, ``512 B``."""
    if not _finite(value):
        return NA
    assert value is not None
    return _scaled(value, 1024.0, _BINARY_UNITS)


def fmt_rate(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal units: ``123 MB/s``, ``1.20 GB/s``, ``0 B/s``."""
    if not _finite(bytes_per_s):
        return NA
    assert bytes_per_s is not None
    return _scaled(bytes_per_s, 1000.0, _DECIMAL_RATE_UNITS)


def fmt_pct(value: float | None, digits: int = 0, *, compact: bool = False) -> str:
    """A percentage (0-100 scale): ``71 %`` (as the verdicts write it), ``71%`` compact."""
    if not _finite(value):
        return NA
    return f"{value:.{digits}f}{'' if compact else ' '}%"


def fmt_share(fraction: float | None, *, compact: bool = False) -> str:
    """A share (0-1 scale) as a percentage: ``0.71`` -> ``71 %``."""
    if not _finite(fraction):
        return NA
    assert fraction is not None
    return fmt_pct(fraction * 100.0, compact=compact)


def fmt_count(value: int | None) -> str:
    """An integer with thousands separators: ``12,345``."""
    if value is None:
        return NA
    return f"{value:,}"


def fmt_number(value: float | None) -> str:
    """A rate such as samples/s with sensible precision: ``1,234``, ``98.7``, ``1.23``."""
    if not _finite(value):
        return NA
    assert value is not None
    magnitude = abs(value)
    if magnitude >= 99.95:
        return f"{value:,.0f}"
    if magnitude >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_duration(seconds: float | None) -> str:
    """A duration: ``350ms``, ``42s``, ``3m05s``, ``1h02m``, ``2d03h``."""
    if not _finite(seconds):
        return NA
    assert seconds is not None
    if seconds < 0:
        seconds = 0.0
    if seconds < 1.0:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10.0:
        return f"{seconds:.1f}s"
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def fmt_age(seconds: float | None) -> str:
    """How long ago: ``12s ago``, ``3m05s ago``; ``just now`` under a second."""
    if not _finite(seconds):
        return NA
    assert seconds is not None
    if seconds < 1.0:
        return "just now"
    return f"{fmt_duration(seconds)} ago"


def fmt_watts(value: float | None) -> str:
    if not _finite(value):
        return NA
    return f"{value:.0f} W"


def fmt_temp(value: float | None) -> str:
    if not _finite(value):
        return NA
    return f"{value:.0f}°C"


def fmt_mhz(value: float | None) -> str:
    if not _finite(value):
        return NA
    return f"{value:.0f} MHz"


def fmt_ratio(used: float | None, total: float | None, *, short: bool = False) -> str:
    """``used/total`` in one unit of the total: ``61.2/80.0 GiB``; ``short`` drops "iB"."""
    if not _finite(used) or not _finite(total):
        if _finite(used):
            return fmt_bytes(used)
        return NA
    assert used is not None and total is not None
    unit = 0
    scale = 1.0
    while total / scale >= 999.5 and unit < len(_BINARY_UNITS) - 1:
        scale *= 1024.0
        unit += 1
    name = _BINARY_UNITS[unit]
    numbers = f"{_ratio_number(used / scale)}/{_ratio_number(total / scale)}"
    if short:
        return f"{numbers}{name[0]}"
    return f"{numbers} {name}"


def _ratio_number(value: float) -> str:
    if value >= 99.5:
        return f"{value:.0f}"
    return f"{value:.1f}"


def clamp01(value: float | None) -> float:
    """``value`` limited to 0..1; None and NaN become 0."""
    if value is None or not math.isfinite(value):
        return 0.0
    return min(1.0, max(0.0, value))


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar ``width`` cells wide filled to ``fraction`` (0-1) in eighths.

    The result is always exactly ``width`` characters (padded with spaces).
    """
    if width <= 0:
        return ""
    eighths = round(clamp01(fraction) * width * 8)
    full, rest = divmod(eighths, 8)
    text = FULL_BLOCK * full
    if rest and full < width:
        text += _EIGHTHS[rest]
    return text.ljust(width)


def stacked_bar(fractions: Sequence[float | None], width: int) -> list[tuple[str, int]]:
    """Runs of a bar stacking several shares (each 0-1 of the whole) left to right.

    Returns ``(text, part)`` runs covering exactly ``width`` cells, where ``part`` is the
    index into ``fractions`` the run shows, or -1 for the empty rest of the bar. Every
    cell belongs to the part that fills most of it, so small parts stay visible when
    they cover at least half a cell; the last filled cell may be a partial block.
    """
    if width <= 0:
        return []
    return list(_stacked_runs(bar_eighths(fractions, width), width))


def bar_eighths(fractions: Sequence[float | None], width: int) -> tuple[int, ...]:
    """Each part of a :func:`stacked_bar` ``width`` cells wide, in eighths of a cell: what
    the bar looks like (two bars with the same eighths are drawn the same)."""
    scale = width * 8
    # clamp01 inlined (None, NaN and infinities count as 0): this runs for every bar drawn
    # (a list comprehension: no generator to resume per part)
    return tuple(
        [
            0 if f is None or not 0.0 < f < math.inf else scale if f >= 1.0 else round(f * scale)
            for f in fractions
        ]
    )


@lru_cache(maxsize=4096)
def _stacked_runs(eighths: tuple[int, ...], width: int) -> tuple[tuple[str, int], ...]:
    """:func:`stacked_bar` from each part's size in eighths of a cell (few distinct bars
    recur on a screen: they are computed once)."""
    cells: list[int] = []
    total_eighths = 0
    bounds: list[tuple[int, int]] = []  # (end in eighths, part)
    for part, size in enumerate(eighths):
        total_eighths = min(width * 8, total_eighths + size)
        bounds.append((total_eighths, part))
    filled_eighths = total_eighths
    full_cells, rest = divmod(filled_eighths, 8)
    for cell in range(full_cells + (1 if rest else 0)):
        start, end = cell * 8, min(cell * 8 + 8, filled_eighths)
        best_part, best_cover = -1, 0
        previous_end = 0
        for bound_end, part in bounds:
            cover = max(0, min(end, bound_end) - max(start, previous_end))
            if cover > best_cover:
                best_part, best_cover = part, cover
            previous_end = bound_end
        cells.append(best_part)
    runs: list[tuple[str, int]] = []
    for index, part in enumerate(cells):
        char = FULL_BLOCK
        if index == full_cells:  # the partial last cell
            char = _EIGHTHS[rest]
        if runs and runs[-1][1] == part:
            runs[-1] = (runs[-1][0] + char, part)
        else:
            runs.append((char, part))
    empty = width - len(cells)
    if empty > 0:
        runs.append((" " * empty, -1))
    return tuple(runs)


VERTICAL_EIGHTHS = " ▁▂▃▄▅▆▇█"


def column_chars(value: float | None, top: float, height: int) -> list[str]:
    """One column of a bar chart ``height`` rows tall, bottom row first.

    ``value`` is drawn on a scale from 0 to ``top`` with eighth-row resolution; a
    positive value always shows at least one eighth so that a trickle is not hidden.
    """
    if height <= 0:
        return []
    if value is None or not math.isfinite(value) or top <= 0:
        return [" "] * height
    eighths = round(min(1.0, max(0.0, value / top)) * height * 8)
    if value > 0 and eighths == 0:
        eighths = 1
    chars = []
    for row in range(height):
        level = min(8, max(0, eighths - row * 8))
        chars.append(VERTICAL_EIGHTHS[level])
    return chars


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k that is >= ``value``."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    base = 10.0**exponent
    for step in (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if step * base >= value * (1 - 1e-9):
            return step * base
    return 10.0 * base  # pragma: no cover


def truncate(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in "…" when cut."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…"
