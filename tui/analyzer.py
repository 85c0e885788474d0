"""Bottleneck analyzer (stub: being written). Pure: no I/O, no clock of its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from probe.messages import Hello, StepRecord
from probe.samples import SystemSample


@dataclass(frozen=True)
class Window:
    now: float  # Unix seconds
    steps: Sequence[StepRecord]  # this run's recent steps, oldest first
    systems: Sequence[SystemSample]  # this run's host samples, oldest first
    hello: Hello | None


@dataclass(frozen=True)
class Verdict:
    kind: str  # "warming-up", "compute-bound", "input-bound", "stalled", ...
    severity: str  # "ok", "info", "warning", "critical"
    confidence: float  # 0..1
    headline: str
    cause: str | None = None  # input-bound cause: "few-workers", "disk", ... or "unknown"
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    headroom: str | None = None  # "without the data wait: ≈ 412 samples/s, +38 %"


def analyze(window: Window) -> Verdict:
    return Verdict("warming-up", "info", 0.0, "Not enough data yet")


class VerdictTracker:
    """Hysteresis over successive verdicts of one run."""

    def update(self, verdict: Verdict, now: float) -> Verdict:
        return verdict
