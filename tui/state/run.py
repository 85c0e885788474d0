"""Everything received from one publisher (a training run, or an agent sampling its node)."""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import chain, islice
from operator import attrgetter
from typing import TYPE_CHECKING

from gputop_dl.probe.messages import Bye, Hello, Loop, Stack, StepRecord, Steps
from gputop_dl.probe.protocol import MICROS, StepRows, WireStep
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.analysis.passes import WholePass, passes_to_keep, whole_pass
from gputop_dl.tui.events import BadInput
from gputop_dl.tui.state.clean import clean_text, evolve, new_steps
from gputop_dl.tui.state.model import SAMPLES_UNIT, STEPS_UNIT, ThroughputPoint
from gputop_dl.tui.state.steplog import StepLog
from gputop_dl.tui.state.throughput import BUCKET_S, Throughput

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict, VerdictTracker

ANALYSIS_WINDOW_S = 30.0  # steps and samples handed to the analyzer
MIN_WINDOW_STEPS = 30  # ... and always at least the last 30 steps, however old (a long hang)
MAX_STEP_RECORDS = 5_000  # per run: bounds memory with many ranks (the analyzer needs ~300)
STEP_KEEP_S = 2 * ANALYSIS_WINDOW_S  # older step records are dropped (totals are kept)
RATE_WINDOW_S = 5.0  # "samples/s now" covers the last few seconds
CLOCK_SAMPLES = 50  # recent arrivals the probe's clock offset is estimated from
CLOCK_SKEW_MIN_S = 1.0  # smaller offsets are delays (flush, network) or do not matter
OWN_SAMPLES = 120  # a source's own system samples kept: two minutes at one a second ...
OWN_SAMPLES_S = 120.0  # ... and none older than two minutes
# Times outside the loop kept, the last few of each way it was left ("marked:validation"):
# how long a validation usually takes, to tell one that hangs (usual_away). At most so
# many ways: the probe names them, a peer could name thousands.
AWAY_SPANS_KEPT = 5
AWAY_KINDS_KEPT = 16
# Spans of the run's clock spent outside the loop, the newest: "samples/s now" leaves them
# out (an evaluation's 25 s read as 0 samples/s, then a ramp, once the loop resumed).
OUTSIDE_SPANS_KEPT = 64
_samples = attrgetter("samples")
_index = attrgetter("index")


def _first_index(records: Sequence[StepRecord]) -> int:
    """The index of a message's first record, without making a StepRecord of a row."""
    if type(records) is StepRows and records.rows is not None:
        return records.rows[0].index
    return records[0].index


class Run:
    """One publisher, keyed by ``Hello.source_id``. A restarted process with the same id
    (a new ``started``) gets a fresh Run in the same slot."""

    # Set by _forget_steps (at creation, and before a replay that live steps overtook).
    steps: StepLog
    throughput: Throughput
    pending: tuple[ThroughputPoint, ...]
    last_index: int | None  # replays of the probe's history repeat indices
    total_samples: float
    total_steps: int
    first_start: float | None
    samples_known: bool
    _whole_passes: dict[int, WholePass | None]  # by first step; None: not all here
    _to_keep: list[tuple[int, int]]  # passes to keep not yet ended: (first step, end)
    _passes_seen: tuple[tuple[int, ...], bool] | None  # see _keep_passes

    def __init__(self, source_id: str, history_s: float) -> None:
        self.source_id = source_id
        self.hello: Hello | None = None
        self.loop: Loop | None = None  # newest Loop message, when newer than the hello's state
        self._window_hello: Hello | None = None  # hello with the loop merged, cached
        self._away_spans: dict[str, deque[float]] = {}  # how the loop was left -> seconds
        # (left, returned) in the probe's clock, oldest first (see rate_now)
        self.outside_spans: deque[tuple[float, float]] = deque(maxlen=OUTSIDE_SPANS_KEPT)
        self.first_received: float | None = None
        self.last_received: float | None = None
        self._points = max(1, math.ceil(history_s / BUCKET_S))
        self._forget_steps()
        self.sent = 0
        self.dropped = 0
        self.dropped_steps = 0
        self.dropped_baseline: int | None = None
        self.dropped_steps_baseline: int | None = None
        self.bye: Bye | None = None
        self.bye_received: float | None = None
        self.gone_at: float | None = None  # viewer time its pid was found gone (no bye)
        self.incompatible: BadInput | None = None
        # Its own samples: the latest processes, and the analyzer's window when it is
        # the host sampler (the host's longer history is kept once, per host).
        self.systems: deque[SystemSample] = deque(maxlen=OWN_SAMPLES)
        self.tracker: VerdictTracker | None = None  # created with the first verdict
        self.verdict: Verdict | None = None
        self.analyzed_at: float | None = None  # viewer time of the last analysis
        # Viewer clock minus the probe's: arrival time minus the newest time the message
        # carries is the offset plus a delay (network, flush), so the smallest recent one
        # is the best estimate. The probe may run on another host with another clock.
        self.clock_offsets: deque[float] = deque(maxlen=CLOCK_SAMPLES)
        self.slot: int | None = None  # switcher position, given at the first tick
        self.pid_checked: float | None = None  # viewer time of the last pid check
        # Its DataLoader workers still running once it ended (orphaned), and when the
        # viewer last looked (None: not yet).
        self.leftover_workers: tuple[int, ...] = ()
        self.leftovers_checked: float | None = None
        self.stack: Stack | None = None  # the newest stack the probe took in a stall

    # ---------------------------------------------------------------- identity

    @property
    def is_run(self) -> bool:
        """A training process (probe), not an agent that only samples its node."""
        if self.hello is not None:
            return self.hello.role != "agent"
        return bool(self.steps) or self.incompatible is not None or self.bye is not None

    @property
    def host(self) -> str | None:
        if self.hello is not None:
            return self.hello.host
        if self.systems:
            return self.systems[-1].host
        host, sep, _pid = self.source_id.rpartition(":")
        return clean_text(host) if sep else None

    @property
    def name(self) -> str:
        return self.hello.name if self.hello is not None else clean_text(self.source_id)

    @property
    def unit(self) -> str:
        return SAMPLES_UNIT if self.samples_known or not self.total_steps else STEPS_UNIT

    @property
    def step_count(self) -> int:
        """Steps the probe measured: its hello's count, or more when steps arrived since."""
        received = 0 if self.last_index is None else self.last_index + 1
        return max(received, self.hello.step_count if self.hello is not None else 0)

    # ---------------------------------------------------------------- clock

    @property
    def clock_offset(self) -> float:
        """Viewer clock minus the probe's clock: 0 until a message carried a time, and
        while the difference is under CLOCK_SKEW_MIN_S (the same host, or close enough:
        the estimate includes the delivery delay, which must not be taken for a skew)."""
        if not self.clock_offsets:
            return 0.0
        offset = min(self.clock_offsets)
        return offset if abs(offset) >= CLOCK_SKEW_MIN_S else 0.0

    def probe_time(self, viewer_time: float) -> float:
        """A viewer time in the probe's clock (the clock of its steps and samples)."""
        return viewer_time - self.clock_offset

    def touch(self, received: float) -> None:
        if self.first_received is None:
            self.first_received = received
        self.last_received = (
            received if self.last_received is None else max(self.last_received, received)
        )

    # ---------------------------------------------------------------- input

    def set_hello(self, hello: Hello) -> None:
        before = self.window_hello()
        self.hello = hello
        self._window_hello = None
        self._keep_passes(hello)
        self._loop_moved(before)

    def _keep_passes(self, hello: Hello) -> None:
        """The passes ``hello`` lists that a cycle of loaders taking turns needs
        (passes.passes_to_keep): kept once they ended, from the steps here or arriving
        (the log drops steps after STEP_KEEP_S, before a long training pass is over, and
        beyond MAX_STEP_RECORDS: a late viewer's replay brings more)."""
        # Each hello lists them all again: nothing new without a new last start, or the
        # last one counted since (a start is listed with the step that begins it).
        newest = tuple(p.starts[-1] if p.starts else -1 for p in hello.passes)
        key = (newest, max(newest, default=-1) < hello.step_count)
        if key == self._passes_seen:
            return
        self._passes_seen = key
        # The probe's typical step: the log is empty when a late viewer's first hello
        # comes (its replay after it).
        period = hello.typical_period_s or self.typical_period()
        wanted = passes_to_keep(hello.passes, hello.step_count, period, ANALYSIS_WINDOW_S)
        # Those kept stay while listed (the typical step may tell otherwise for a while).
        listed = {start for p in hello.passes for start in p.starts}
        self._whole_passes = {
            start: whole for start, whole in self._whole_passes.items() if start in listed
        }
        self._to_keep = [(start, end) for start, end in wanted if start not in self._whole_passes]
        self._keep_ended(())

    def _keep_ended(self, arriving: Sequence[StepRecord]) -> None:
        """Keep the passes to keep that ended (their last step here or ``arriving``, not
        yet in the log), in one walk back over both; None for one whose steps are not
        all here (tried once)."""
        last = -1 if self.last_index is None else self.last_index
        ended = sorted(p for p in self._to_keep if p[1] - 1 <= last)
        if not ended:
            return
        self._to_keep = [p for p in self._to_keep if p[1] - 1 > last]
        starts = [start for start, _ in ended]
        found: list[list[StepRecord]] = [[] for _ in ended]  # newest first
        for record in chain(reversed(arriving), reversed(self.steps)):
            if record.index < starts[0]:
                break
            position = bisect_right(starts, record.index) - 1
            if record.index < ended[position][1]:
                found[position].append(record)
        for (start, end), records in zip(ended, found, strict=True):
            records.reverse()
            whole = records and records[0].index == start
            self._whole_passes[start] = whole_pass(records, end) if whole else None

    @property
    def whole_passes(self) -> tuple[WholePass, ...]:
        """The whole passes kept (see _keep_passes), oldest first."""
        return tuple(whole for _, whole in sorted(self._whole_passes.items()) if whole is not None)

    def add_loop(self, loop: Loop) -> None:
        before = self.window_hello()
        self.loop = loop
        self._window_hello = None
        self._loop_moved(before)

    def _loop_moved(self, before: Hello | None) -> None:
        """Note a return to the loop (an outside span) and how long the loop was away,
        once the loop's state as known (window_hello) moved on from ``before``. Either
        message may tell it first: the probe sends its two newest loop changes a flush,
        and a hello sent with them already says "in-loop" when the Loop message comes
        (read from the Loop message alone, no evaluation was ever taken out of "samples/s
        now", which fell to 3 on resuming and climbed back over 5 s)."""
        after = self.window_hello()
        if (
            before is None
            or after is None
            or before.loop != "outside"
            or before.loop_since is None
            or after.loop_since is None
            or after.loop_since <= before.loop_since
        ):
            return
        if after.loop == "in-loop":
            self.outside_spans.append((before.loop_since, after.loop_since))
        if before.loop_exit and (after.loop == "in-loop" or after.loop_exit != before.loop_exit):
            # Ended by a return to the loop, or by leaving it another way: a validation
            # at an epoch's end is followed at once by the epoch's end and the next
            # one's start.
            spans = self._away_spans.pop(before.loop_exit, None) or deque(maxlen=AWAY_SPANS_KEPT)
            spans.append(after.loop_since - before.loop_since)
            self._away_spans[before.loop_exit] = spans  # the newest way last
            if len(self._away_spans) > AWAY_KINDS_KEPT:
                del self._away_spans[next(iter(self._away_spans))]

    def usual_away(self, how: str | None) -> tuple[float, int] | None:
        """The median time the loop was outside when it was left this way ("marked:
        validation") and how many times that is from, from two on; None before."""
        spans = self._away_spans.get(how) if how else None
        if spans is None or len(spans) < 2:
            return None
        return statistics.median(spans), len(spans)

    @property
    def outside_loop(self) -> bool:
        """The probe says the training left its watched loop (an evaluation, a
        checkpoint between epochs): no step is expected, none is late."""
        hello = self.window_hello()
        return hello is not None and hello.loop == "outside"

    def window_hello(self) -> Hello | None:
        """The newest hello with the loop state of the newest Loop message when that is
        newer (a loop left between two hellos is known at once)."""
        hello = self.hello
        if hello is None or self.loop is None:
            return hello
        if self._window_hello is None:
            loop = self.loop
            since = hello.loop_since
            if since is not None and since > loop.time:
                self._window_hello = hello
            else:
                how = loop.how if loop.state == "outside" else None
                self._window_hello = evolve(
                    hello, loop=loop.state, loop_since=loop.time, loop_exit=how
                )
        return self._window_hello

    def add_steps(self, message: Steps, received: float) -> int:
        """Take the new records of ``message``; returns how many had impossible values."""
        if self.dropped_baseline is None:
            self.dropped_baseline = message.dropped
            self.dropped_steps_baseline = message.dropped_steps
        # Plain comparisons, not max(): once per message, but the viewer's hot path.
        if message.sent > self.sent:
            self.sent = message.sent
        if message.dropped > self.dropped:
            self.dropped = message.dropped
        if message.dropped_steps > self.dropped_steps:
            self.dropped_steps = message.dropped_steps
        records: Sequence[StepRecord] = message.records
        last = self.last_index
        # A replay (or steps out of order): the paths below drop what is here already,
        # unless live steps overtook the replay of a run just attached.
        if (
            last is not None
            and records
            and _first_index(records) <= last
            and self._overtaken(records)
        ):
            self._forget_steps()
        if (
            type(records) is StepRows
            and records.plausible
            and records.rows is not None  # not yet read as records
            and len(records.rows) <= MAX_STEP_RECORDS
            and self._add_rows(records, records.rows, received)
        ):
            return 0
        throughput = self.throughput
        if len(records) > MAX_STEP_RECORDS:  # more than a run keeps: only the newest count
            records = records[-MAX_STEP_RECORDS:]
        accepted, invalid = new_steps(records, received, self.last_index, throughput.last_end)
        if accepted:
            throughput.add(accepted)
            if self.first_start is None:
                self.first_start = accepted[0].end_time - accepted[0].period_s
            samples = sum(filter(None, map(_samples, accepted)))  # C loops
            self._took(accepted, len(accepted), accepted[-1].index, samples, received)
        return invalid

    def _overtaken(self, records: Sequence[StepRecord]) -> bool:
        """Whether ``records`` are a replay of the probe's history that live steps
        overtook: they begin before every step this run holds, and it holds every step
        it was sent (none trimmed yet: it has just attached).

        A viewer that attaches gets the history replayed. A live step that reaches it
        first (through a relay, or sent in the instant the probe heard of the new
        subscriber) would make it drop the whole replay as older: no graph and no
        verdict until enough new steps came. The replay holds every step up to the
        moment it was sent, the overtaking ones too (the probe keeps a step in its
        history before it sends it), so the run forgets what it holds and takes the
        replay from its start."""
        if self.total_steps != len(self.steps):
            return False
        return _first_index(records) < next(iter(self.steps)).index

    def _forget_steps(self) -> None:
        """No step taken: at creation, and before a replay that live steps overtook."""
        self.steps = StepLog(MAX_STEP_RECORDS)
        self.throughput = Throughput(self._points)
        self.pending = ()
        self.last_index = None
        self.total_samples = 0.0
        self.total_steps = 0
        self.first_start = None
        self.samples_known = False
        self._whole_passes = {}  # see _keep_passes
        self._to_keep = []
        self._passes_seen = None
        if self.hello is not None:
            self._keep_passes(self.hello)

    def _add_rows(self, records: StepRows, rows: tuple[WireStep, ...], received: float) -> bool:
        """The hot path: a decoded message's rows checked and bucketed in one pass and
        kept as rows. False, with nothing changed, when a row needs the general path."""
        last = self.last_index
        if not rows or (
            last is not None and rows[-1].index <= last and max(map(_index, rows)) <= last
        ):
            return True  # nothing, or a replay of what is here
        samples = self.throughput.add_rows(records.base, rows, received, last)
        if samples is None:
            return False
        if self.first_start is None:
            first = rows[0]
            self.first_start = records.base + (first.end_us - first.period_us) / MICROS
        self._took(records, len(rows), rows[-1].index, samples, received)
        return True

    def _took(
        self,
        accepted: Sequence[StepRecord],
        count: int,
        last_index: int,
        samples: float,
        received: float,
    ) -> None:
        """Count and keep the ``count`` records of ``accepted`` (already in the
        throughput buckets)."""
        self.last_index = last_index
        self.total_steps += count
        self.total_samples += samples
        if not self.samples_known:  # looked at until a record reports its batch size
            # The rows when it has them: no StepRecord made for this.
            rows = accepted.rows if type(accepted) is StepRows else None
            self.samples_known = any(n is not None for n in map(_samples, rows or accepted))
        if self._to_keep:  # before the log drops its oldest steps (extend, below)
            self._keep_ended(accepted)
        steps = self.steps
        steps.extend(accepted, count)
        throughput = self.throughput
        last_end = throughput.last_end
        if last_end is not None:
            if last_end >= throughput.close_at:
                throughput.finish_until(last_end)
            if steps.oldest_end < last_end - STEP_KEEP_S:
                steps.drop_before(last_end - STEP_KEEP_S, MIN_WINDOW_STEPS)
            self.clock_offsets.append(received - last_end)

    # ---------------------------------------------------------------- reads

    def recent_steps(
        self, since: float, at_least: int = 0, at_most: int = MAX_STEP_RECORDS
    ) -> list[StepRecord]:
        """Steps that ended at or after ``since``, and at least the last ``at_least``
        steps however old (at most the last ``at_most``); oldest first."""
        recent: list[StepRecord] = []
        for record in reversed(self.steps):
            if (record.end_time < since and len(recent) >= at_least) or len(recent) >= at_most:
                break
            recent.append(record)
        recent.reverse()
        return recent

    def typical_period(self) -> float | None:
        periods = self.steps.periods(20)
        return statistics.median(periods) if periods else None

    def rate_now(self) -> float | None:
        """Samples (or steps) a second over the last RATE_WINDOW_S of the loop's own time:
        the newest points, pending ones too (a stall is time without progress), less the
        time outside the loop (an evaluation is no time of the loop's). Right after the loop
        resumed the window reaches back to the points before it left: the last in-loop
        rate, not 0 and a ramp while new steps fill the window."""
        # Newest first, without copying the whole history every refresh.
        newest_first = chain(reversed(self.pending), reversed(self.throughput.points))
        return loop_rate(newest_first, self.unit, self.outside_spans, RATE_WINDOW_S)

    def rate_avg(self) -> float | None:
        """Samples (or steps) a second over the training loop's own time, the steps'
        periods summed: time outside the loop (an evaluation) is in no step. Over the
        wall time since the first step it froze while the run evaluated, then fell when
        steps resumed, and "now" read as a speed-up against it."""
        elapsed = self.throughput.covered_total_s
        if elapsed <= 0:
            return None
        total = self.total_samples if self.samples_known else self.total_steps
        return total / elapsed

    def shares(self) -> tuple[float | None, float | None]:
        """Shares of the recent step time (the last RATE_WINDOW_S of finished points) the
        data wait and the device take, each over the time that reports it."""
        count = round(RATE_WINDOW_S / BUCKET_S)
        wait = wait_covered = device = device_covered = 0.0
        for point in islice(reversed(self.throughput.points), count):
            if point.wait_share is not None:
                wait += point.wait_share * point.covered_s
                wait_covered += point.covered_s
            if point.device_share is not None:
                device += point.device_share * point.covered_s
                device_covered += point.covered_s
        return (
            wait / wait_covered if wait_covered > 0 else None,
            device / device_covered if device_covered > 0 else None,
        )


def outside_overlap(start: float, end: float, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of [start, end] inside the spans outside the loop."""
    total = 0.0
    for left, returned in spans:
        if returned > start and left < end:
            total += min(end, returned) - max(start, left)
    return total


def loop_rate(
    newest_first: Iterable[ThroughputPoint],
    unit: str,
    outside: Sequence[tuple[float, float]],
    window_s: float,
) -> float | None:
    """The rate over the newest ``window_s`` seconds of the loop's own time: each point's
    time less its part outside the loop (``outside``: (left, returned) spans). A point
    wholly outside counts nothing; the scan goes on past it to the loop's earlier
    points. None when no point has a rate."""
    covered = total = 0.0
    for point in newest_first:
        rate = point.rate(unit)
        if rate is None:
            continue
        time = point.covered_s
        if outside:
            away = outside_overlap(point.end - BUCKET_S, point.end, outside)
            # The steps of a point lie in the loop's time: its samples over that time.
            time = min(time, BUCKET_S - away)
        if time <= 1e-9:
            continue
        covered += time
        total += rate * point.covered_s
        if covered >= window_s - 1e-9:
            break
    return total / covered if covered > 0 else None
