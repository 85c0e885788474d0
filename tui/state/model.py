"""The immutable values the viewer state hands to widgets and the snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from gputop_dl.probe.messages import LoaderInfo, Stack
from gputop_dl.probe.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict

INSTRUMENT_HINT = "from gputop_dl import probe; for batch in probe.watch(loader): ..."

CONNECTING = "connecting"
LIVE = "live"
STALE = "stale"
LOST = "lost"  # a remote run silent for several hello periods: gone or unreachable
EXITED = "exited"
INCOMPATIBLE = "incompatible"
ENDPOINT_ERROR = "error"
ENDED = frozenset({LOST, EXITED, INCOMPATIBLE})  # faded, then removed after a minute

SAMPLES_UNIT = "samples/s"
STEPS_UNIT = "steps/s"
GONE_TEXT = "exited: process gone without goodbye (killed?)"


@dataclass(frozen=True)
class Connection:
    """How a run's publisher is doing, as one short line for the header."""

    state: str  # connecting, live, stale, lost, exited, incompatible, error (endpoint)
    text: str  # "stale: no message for 12s", "exited: finished after 1,200 steps", ...
    age_s: float | None = None  # seconds since the last message (since the bye when exited)


class ThroughputPoint(msgspec.Struct, frozen=True, gc=False):
    """Half a second of a run: steps are spread over the time they covered.

    A msgspec Struct: made for every finished half second of every run (a frozen
    dataclass took ~15x longer to make). Not tracked by the garbage collector: numbers.
    """

    end: float  # end of the bucket, Unix seconds (the run's clock)
    samples_per_s: float | None  # 0 when no step covered the bucket; None: unknown
    steps_per_s: float | None
    wait_share: float | None  # 0..1 of the covered time spent waiting for data
    covered_s: float  # how much of the bucket the received steps cover
    pending: bool = False  # synthetic: no step has ended here yet (the run is stuck)
    device_share: float | None = None  # 0..1 of the covered time the device was busy

    def rate(self, unit: str) -> float | None:
        return self.samples_per_s if unit == SAMPLES_UNIT else self.steps_per_s


@dataclass(frozen=True)
class ErrorEntry:
    time: float | None  # viewer's Unix seconds; None when the event carried no time
    text: str
    source: str | None = None  # the run (source id) or endpoint it concerns, when known


@dataclass(frozen=True)
class RunSummary:
    """Everything the header, switcher and banner show about one run (or placeholder).

    Every string in it is safe to print (control characters removed)."""

    key: str  # source_id, or "endpoint:<endpoint>" for a placeholder
    label: str  # switcher name, disambiguated: "train.py", "train.py · r1", "train.py · 4242"
    name: str
    host: str | None
    pid: int | None
    rank: int | None
    world_size: int | None
    uptime_s: float | None
    step_count: int  # steps the probe measured (a count, not an index)
    unit: str  # SAMPLES_UNIT, or STEPS_UNIT when the probe reports no batch sizes
    rate_now: float | None
    rate_avg: float | None
    wait_share_now: float | None  # None: the probe cannot tell the data wait
    device_busy_now: float | None  # None: no device timing
    connection: Connection
    verdict: Verdict | None
    loader: LoaderInfo | None = None
    timing: str | None = None
    timing_note: str | None = None
    lost_messages: int = 0  # messages the probe dropped since the viewer attached
    lost_steps: int = 0  # step records the probe dropped since the viewer attached
    is_placeholder: bool = False
    endpoint: str | None = None
    theirs: tuple[int, int] | None = None  # the peer's protocol version when incompatible
    slot: int = 0  # stable position in the switcher: a new run never renumbers the others
    last_step_index: int | None = None  # index of the newest step received
    loop: str | None = None  # "not-started" | "in-loop" | "outside" (newest of hello and loop)
    ended_at: float | None = None  # viewer time it exited / was lost; removed a minute later
    stack: Stack | None = None  # the newest stack the probe took in a stall (probe/stack.py)


@dataclass(frozen=True)
class NewRuns:
    """Runs that started after the run shown ended (ViewerState.follow_new_runs)."""

    ended: tuple[int, str]  # the run that ended: (switcher number, label)
    runs: tuple[tuple[int, str], ...]  # the new runs, best first: (switcher number, label)
    switched: bool  # the viewer shows the first now (the user had not picked a run)


OUR_PROTOCOL = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"


def incompatible_text(theirs: tuple[int, int] | None) -> str:
    """Both protocol versions, short enough for the header."""
    if theirs is None:
        return f"incompatible protocol (this gputop speaks {OUR_PROTOCOL})"
    return f"incompatible: probe speaks protocol {theirs[0]}.{theirs[1]}, gputop {OUR_PROTOCOL}"


def upgrade_advice(theirs: tuple[int, int] | None) -> str:
    """Which side to upgrade so that both speak the same major protocol version."""
    if theirs is None:
        return "install the same gputop version where the probe runs and here"
    if theirs[0] > PROTOCOL_MAJOR:
        return f"upgrade this gputop (pip install -U gputop-dl) to read protocol {theirs[0]}.x"
    return (
        f"upgrade gputop in the training environment: its probe speaks {theirs[0]}.x, "
        f"this viewer reads {PROTOCOL_MAJOR}.x"
    )
