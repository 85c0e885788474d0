"""Table tests of the viewer's formatting helpers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputop_dl.tui.format import (
    NA,
    bar,
    column_chars,
    fmt_age,
    fmt_bytes,
    fmt_count,
    fmt_duration,
    fmt_mhz,
    fmt_number,
    fmt_pct,
    fmt_rate,
    fmt_ratio,
    fmt_share,
    fmt_temp,
    fmt_watts,
    nice_ceiling,
    stacked_bar,
    truncate,
)

GIB = 1024**3


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, NA),
        (float("nan"), NA),
        (0, "0 B"),
        (512, "512 B"),
        (999, "999 B"),
        (1000, "0.98 KiB"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (10 * 1024**2, "10.0 MiB"),
        (int(12.3 * GIB), "12.3 GiB"),
        (512 * GIB, "512 GiB"),
        (1000 * GIB, "0.98 TiB"),
        (3 * 1024**4, "3.00 TiB"),
    ],
)
def test_fmt_bytes(value: float | None, text: str) -> None:
    assert fmt_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, NA),
        (0.0, "0 B/s"),
        (4096.0, "4.10 kB/s"),
        (123e6, "123 MB/s"),
        (1.2e9, "1.20 GB/s"),
        (12.5e9, "12.5 GB/s"),
        (float("inf"), NA),
    ],
)
def test_fmt_rate(value: float | None, text: str) -> None:
    assert fmt_rate(value) == text


@pytest.mark.parametrize(
    ("value", "digits", "compact", "text"),
    [
        (None, 0, False, NA),
        (71.4, 0, False, "71 %"),
        (71.4, 0, True, "71%"),
        (0.84, 1, False, "0.8 %"),
        (100.0, 0, True, "100%"),
    ],
)
def test_fmt_pct(value: float | None, digits: int, compact: bool, text: str) -> None:
    assert fmt_pct(value, digits, compact=compact) == text


@pytest.mark.parametrize(
    ("value", "text"), [(None, NA), (0.71, "71 %"), (0.0, "0 %"), (1.0, "100 %")]
)
def test_fmt_share(value: float | None, text: str) -> None:
    assert fmt_share(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, NA),
        (0.35, "350ms"),
        (4.25, "4.2s"),
        (42.0, "42s"),
        (185.0, "3m05s"),
        (3720.0, "1h02m"),
        (2 * 86400 + 3 * 3600 + 5, "2d03h"),
        (-3.0, "0ms"),
    ],
)
def test_fmt_duration(value: float | None, text: str) -> None:
    assert fmt_duration(value) == text


@pytest.mark.parametrize(
    ("value", "text"), [(None, NA), (0.2, "just now"), (12.4, "12s ago"), (185, "3m05s ago")]
)
def test_fmt_age(value: float | None, text: str) -> None:
    assert fmt_age(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, NA), (1234.4, "1,234"), (98.74, "98.7"), (1.234, "1.23"), (0.0, "0.00")],
)
def test_fmt_number(value: float | None, text: str) -> None:
    assert fmt_number(value) == text


def test_small_formatters() -> None:
    assert fmt_count(12345) == "12,345"
    assert fmt_count(None) == NA
    assert fmt_watts(312.4) == "312 W"
    assert fmt_temp(67.0) == "67°C"
    assert fmt_mhz(1980.0) == "1980 MHz"
    assert fmt_watts(None) == fmt_temp(None) == fmt_mhz(None) == NA


@pytest.mark.parametrize(
    ("used", "total", "short", "text"),
    [
        (int(61.2 * GIB), 80 * GIB, False, "61.2/80.0 GiB"),
        (int(61.2 * GIB), 80 * GIB, True, "61.2/80.0G"),
        (int(0.2 * GIB), 8 * GIB, False, "0.2/8.0 GiB"),
        (int(96 * GIB), 512 * GIB, False, "96.0/512 GiB"),
        (512, 900, False, "512/900 B"),
        (None, 80 * GIB, False, NA),
        (5 * GIB, None, False, "5.00 GiB"),
    ],
)
def test_fmt_ratio(used: int | None, total: int | None, short: bool, text: str) -> None:
    assert fmt_ratio(used, total, short=short) == text


@pytest.mark.parametrize(
    ("fraction", "width", "text"),
    [
        (0.0, 4, "    "),
        (None, 4, "    "),
        (1.0, 4, "████"),
        (0.5, 4, "██  "),
        (0.25 + 2 / 32, 4, "█▎  "),
        (2.0, 3, "███"),
        (-1.0, 3, "   "),
        (0.5, 0, ""),
    ],
)
def test_bar(fraction: float | None, width: int, text: str) -> None:
    assert bar(fraction, width) == text


@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 200))
def test_bar_is_always_exactly_width(fraction: float, width: int) -> None:
    assert len(bar(fraction, width)) == width


def test_stacked_bar_runs_cover_the_width_in_order() -> None:
    runs = stacked_bar([0.5, 0.25], 8)
    assert runs == [("████", 0), ("██", 1), ("  ", -1)]
    assert stacked_bar([None, None], 3) == [("   ", -1)]
    assert stacked_bar([1.0, 0.5], 4) == [("████", 0)]  # never beyond the width


def test_stacked_bar_keeps_a_half_cell_part_visible() -> None:
    # 5 % of 10 cells = half a cell: it wins the cell it shares with nothing larger.
    runs = stacked_bar([0.0, 0.05], 10)
    assert runs[0][1] == 1


@given(
    st.lists(st.one_of(st.none(), st.floats(-1, 2)), max_size=5),
    st.integers(0, 120),
)
def test_stacked_bar_total_width(fractions: list[float | None], width: int) -> None:
    runs = stacked_bar(fractions, width)
    assert sum(len(text) for text, _part in runs) == width
    assert all(-1 <= part < len(fractions) for _text, part in runs)


@pytest.mark.parametrize(
    ("value", "top", "height", "chars"),
    [
        (None, 100.0, 2, [" ", " "]),
        (0.0, 100.0, 2, [" ", " "]),
        (100.0, 100.0, 2, ["█", "█"]),
        (50.0, 100.0, 2, ["█", " "]),
        (75.0, 100.0, 2, ["█", "▄"]),
        (0.1, 100.0, 1, ["▁"]),  # a trickle is never hidden
        (500.0, 100.0, 1, ["█"]),
    ],
)
def test_column_chars(value: float | None, top: float, height: int, chars: list[str]) -> None:
    assert column_chars(value, top, height) == chars


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [
        (0.0, 1.0),
        (math.nan, 1.0),
        (1.0, 1.0),
        (97.0, 100.0),
        (112.0, 120.0),
        (130.0, 150.0),
        (0.042, 0.05),
    ],
)
def test_nice_ceiling(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == pytest.approx(ceiling)


def test_truncate() -> None:
    assert truncate("abcdef", 4) == "abc…"
    assert truncate("abc", 4) == "abc"
    assert truncate("abc", 0) == ""
