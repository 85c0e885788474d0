"""What the viewer knows, split by what changes together.

``model`` (the immutable values widgets read), ``clean`` (wire values made safe),
``throughput`` (half-second points), ``run`` (one publisher), ``hosts`` (per-node
samples), ``roster`` (slots and labels) and ``viewer`` (:class:`ViewerState`, which
applies events and ticks). Import from here: ``from gputop_dl.tui.state import ...``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputop_dl.tui.state.clean import clean_text
from gputop_dl.tui.state.model import (
    CONNECTING,
    ENDPOINT_ERROR,
    EXITED,
    GONE_TEXT,
    INCOMPATIBLE,
    INSTRUMENT_HINT,
    LIVE,
    LOST,
    OUR_PROTOCOL,
    SAMPLES_UNIT,
    STALE,
    STEPS_UNIT,
    Connection,
    ErrorEntry,
    NewRuns,
    RunSummary,
    ThroughputPoint,
    incompatible_text,
    upgrade_advice,
)
from gputop_dl.tui.state.throughput import BUCKET_S
from gputop_dl.tui.state.viewer import MAX_ERRORS, ViewerState

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict, Window


def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
    """:func:`tui.analyzer.analyze`, imported when the first run is analyzed (not needed
    for the first frame). Looked up here at each call, so tests can replace it."""
    from gputop_dl.tui.analyzer import analyze as analyze_window

    return analyze_window(window, previous)


__all__ = [
    "BUCKET_S",
    "CONNECTING",
    "ENDPOINT_ERROR",
    "EXITED",
    "GONE_TEXT",
    "INCOMPATIBLE",
    "INSTRUMENT_HINT",
    "LIVE",
    "LOST",
    "MAX_ERRORS",
    "OUR_PROTOCOL",
    "SAMPLES_UNIT",
    "STALE",
    "STEPS_UNIT",
    "Connection",
    "ErrorEntry",
    "NewRuns",
    "RunSummary",
    "ThroughputPoint",
    "ViewerState",
    "analyze",
    "clean_text",
    "incompatible_text",
    "upgrade_advice",
]
