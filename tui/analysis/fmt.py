"""Short, human figures for verdict text ("42 ms", "71 %", "412 MB/s")."""

from __future__ import annotations


def pct(share: float) -> str:
    """A share (0.71) as percent text ("71 %")."""
    return f"{share * 100:.0f} %"


def pct_value(value: float) -> str:
    """A value already in percent (71.3) as text ("71 %")."""
    return f"{value:.0f} %"


def dur(seconds: float) -> str:
    """A duration with as many digits as a human reads at a glance."""
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10.0:
        return f"{seconds:.1f} s"
    if seconds < 120.0:
        return f"{seconds:.0f} s"
    if seconds < 7200.0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def num(value: float) -> str:
    """A rate or count: integers when large, a digit or two when small."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2f}"


def bps(value: float) -> str:
    """Bytes per second in decimal units (disks and links are sold that way)."""
    if value >= 1e9:
        return f"{value / 1e9:.1f} GB/s"
    if value >= 10e6:
        return f"{value / 1e6:.0f} MB/s"
    if value >= 1e6:
        return f"{value / 1e6:.1f} MB/s"
    return f"{value / 1e3:.0f} kB/s"


def cores(value: float) -> str:
    """Core-equivalents ("6.5 cores", "1 core")."""
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text} core" if text == "1" else f"{text} cores"


def worker_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}\u2013{hi}"  # en dash


def cores_of(part: float, whole: float) -> str:
    """Part of a number of cores ("0.8 of 2 cores", "1 of 1 core")."""
    text = f"{part:.1f}".removesuffix(".0")
    return f"{text} of {cores(whole)}"
