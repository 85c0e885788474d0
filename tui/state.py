"""What the viewer knows: runs, their steps and throughput, hosts and their samples.

Pure Python (no Textual, no I/O, no clock of its own): :meth:`ViewerState.apply` takes the
events a source produced, :meth:`ViewerState.tick` recomputes what depends on time
(connection states, ages, verdicts), and the read accessors hand the widgets immutable
values (frozen dataclasses, tuples), so a paused display can keep what it last showed.

Vocabulary: a *source* is one publisher (key ``Hello.source_id``); a *run* is a source
that is a training process (a probe), as opposed to an ``agent`` that only samples its
node. A *host* is a node name; its samples may come from any source on it. A
*placeholder* is an endpoint the source listens to from which nothing was read yet.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING

from gputop_dl.probe.messages import Bye, Hello, LoaderInfo, Message, StepRecord, Steps, System
from gputop_dl.probe.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR
from gputop_dl.probe.samples import SystemSample, TrainingProcesses
from gputop_dl.tui.analysis.thresholds import MAX_WINDOW_STEPS
from gputop_dl.tui.events import BadInput, EndpointState, Received, SourceEvent
from gputop_dl.tui.format import fmt_count, fmt_duration

if TYPE_CHECKING:  # the analyzer is imported on first use: not needed for the first frame
    from gputop_dl.tui.analyzer import Verdict, VerdictTracker, Window

BUCKET_S = 0.5  # one throughput point per half second of the run's clock
STALE_AFTER_S = 3.0  # a live run publishes several messages a second
RATE_WINDOW_S = 5.0  # "samples/s now" covers the last few seconds
ANALYSIS_WINDOW_S = 30.0  # steps and samples handed to the analyzer
MIN_WINDOW_STEPS = 30  # ... and always at least the last 30 steps, however old (a long hang)
# ... and at most this many: the analyzer reads the last MAX_WINDOW_STEPS usable ones
MAX_WINDOW_RECORDS = 2 * MAX_WINDOW_STEPS
ANALYZE_EVERY_S = 0.9  # a run's verdict is recomputed about once a second (every 2nd tick)
MAX_STEP_RECORDS = 5_000  # per run: bounds memory with many ranks (the analyzer needs ~300)
STEP_KEEP_S = 2 * ANALYSIS_WINDOW_S  # older step records are dropped (totals are kept)
CLOCK_SAMPLES = 50  # recent arrivals the probe's clock offset is estimated from
CLOCK_SKEW_MIN_S = 1.0  # smaller offsets are delays (flush, network) or do not matter
OWN_SAMPLES = 120  # a source's own system samples kept: two minutes at one a second
MAX_ERRORS = 20
AGENT_DEFERS_S = 5.0  # an agent's host samples are ignored while a probe samples the host
STALL_MIN_S = 1.0  # no step for this long (and twice the usual step) shows as a stall

INSTRUMENT_HINT = "from gputop_dl import probe; for batch in probe.watch(loader): ..."

CONNECTING = "connecting"
LIVE = "live"
STALE = "stale"
EXITED = "exited"
INCOMPATIBLE = "incompatible"
ENDPOINT_ERROR = "error"


@dataclass(frozen=True)
class Connection:
    """How a run's publisher is doing, as one short line for the header."""

    state: str  # connecting, live, stale, exited, incompatible, error (endpoint)
    text: str  # "stale: no message for 12s", "exited: finished after 1,200 steps", ...
    age_s: float | None = None  # seconds since the last message (since the bye when exited)


@dataclass(frozen=True)
class ThroughputPoint:
    """Half a second of a run: steps are spread over the time they covered."""

    end: float  # end of the bucket, Unix seconds (the run's clock)
    samples_per_s: float | None  # 0 when no step covered the bucket; None: unknown
    steps_per_s: float | None
    wait_share: float | None  # 0..1 of the covered time spent waiting for data
    covered_s: float  # how much of the bucket the received steps cover
    pending: bool = False  # synthetic: no step has ended here yet (the run is stuck)

    def rate(self, unit: str) -> float | None:
        return self.samples_per_s if unit == SAMPLES_UNIT else self.steps_per_s


SAMPLES_UNIT = "samples/s"
STEPS_UNIT = "steps/s"


@dataclass(frozen=True)
class ErrorEntry:
    time: float | None  # viewer's Unix seconds; None when the event carried no time
    text: str
    source: str | None = None  # the run (source id) or endpoint it concerns, when known


@dataclass(frozen=True)
class RunSummary:
    """Everything the header, switcher and banner show about one run (or placeholder)."""

    key: str  # source_id, or "endpoint:<endpoint>" for a placeholder
    label: str  # short name for the run switcher: "resnet50 r0"
    name: str
    host: str | None
    pid: int | None
    rank: int | None
    world_size: int | None
    uptime_s: float | None
    step_count: int
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


@dataclass
class _Bucket:
    samples: float = 0.0
    steps: float = 0.0
    covered_s: float = 0.0
    wait_s: float = 0.0
    wait_covered_s: float = 0.0


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


class _Throughput:
    """Turns step records into half-second points, spreading each step over its period."""

    def __init__(self, max_points: int) -> None:
        self.points: deque[ThroughputPoint] = deque(maxlen=max_points)
        self._max_points = max_points
        self._open: dict[int, _Bucket] = {}
        self._last_final: int | None = None  # index of the newest finished bucket
        self._finished_any = False
        self.last_end: float | None = None

    def add(self, record: StepRecord) -> None:
        end = record.end_time
        period = max(0.0, record.period_s)
        start = max(end - period, end - self._max_points * BUCKET_S)
        if self._last_final is not None:  # never reopen a finished bucket
            start = max(start, (self._last_final + 1) * BUCKET_S)
        if end <= start:
            return
        span = end - start
        wait = record.wait_s
        # The wait is spread over the step like the samples: at half-second resolution
        # its share is what matters, not where inside the step it fell.
        wait_fraction = min(1.0, wait / period) if wait is not None and period > 0 else 0.0
        first, last = math.floor(start / BUCKET_S), math.floor(end / BUCKET_S)
        if last > first and end == last * BUCKET_S:
            last -= 1  # a step ending exactly on a boundary belongs to the bucket before
        for index in range(first, last + 1):
            lo, hi = index * BUCKET_S, (index + 1) * BUCKET_S
            cover = _overlap(start, end, lo, hi)
            if cover <= 0.0:
                continue
            bucket = self._open.setdefault(index, _Bucket())
            share = cover / span
            bucket.samples += (record.samples or 0) * share
            bucket.steps += share
            bucket.covered_s += cover
            if wait is not None:
                bucket.wait_covered_s += cover
                bucket.wait_s += wait_fraction * cover
        self.last_end = end if self.last_end is None else max(self.last_end, end)

    def finish_until(self, end: float) -> None:
        """Close every bucket that ends at or before ``end``: no later step can add to it."""
        final = math.floor(end / BUCKET_S) - 1
        if self._last_final is None:
            if not self._open:
                return
            self._last_final = min(self._open) - 1
        if final <= self._last_final:
            return
        first = max(self._last_final + 1, final - self._max_points + 1)
        for index in range(first, final + 1):
            # The run's first bucket may start mid-way: its rate is over the time the
            # steps cover. Later, time no step covers (an epoch boundary, a pause in
            # the loop) is time without progress: rates are over the whole bucket.
            bucket = self._open.pop(index, None)
            self.points.append(self._point(index, bucket, whole=self._finished_any))
            self._finished_any = True
        for index in [i for i in self._open if i <= final]:
            del self._open[index]
        self._last_final = final

    @staticmethod
    def _point(
        index: int, bucket: _Bucket | None, *, whole: bool = True, pending: bool = False
    ) -> ThroughputPoint:
        end = (index + 1) * BUCKET_S
        if bucket is None or bucket.covered_s <= 0.0:
            return ThroughputPoint(end, 0.0, 0.0, None, BUCKET_S, pending=pending)
        covered = BUCKET_S if whole or pending else bucket.covered_s
        wait_share = bucket.wait_s / bucket.wait_covered_s if bucket.wait_covered_s > 0 else None
        return ThroughputPoint(
            end,
            bucket.samples / covered,
            bucket.steps / covered,
            wait_share,
            covered,
            pending=pending,
        )

    def pending_points(self, now: float) -> tuple[ThroughputPoint, ...]:
        """Points from the last finished bucket up to ``now`` while no step ends (a stall)."""
        if self._last_final is None:
            return ()
        newest = math.floor(now / BUCKET_S) - 1
        first = max(self._last_final + 1, newest - self._max_points + 1)
        return tuple(
            self._point(index, self._open.get(index), pending=True)
            for index in range(first, newest + 1)
        )


class _Source:
    """Everything received from one publisher."""

    def __init__(self, source_id: str, history_s: float) -> None:
        self.source_id = source_id
        self.hello: Hello | None = None
        self.first_received: float | None = None
        self.last_received: float | None = None
        self.steps: deque[StepRecord] = deque(maxlen=MAX_STEP_RECORDS)
        self.throughput = _Throughput(max(1, math.ceil(history_s / BUCKET_S)))
        self.step_count = 0
        self.total_samples = 0.0
        self.total_steps = 0
        self.first_start: float | None = None
        self.samples_known = False
        self.sent = 0
        self.dropped = 0
        self.dropped_steps = 0
        self.dropped_baseline: int | None = None
        self.dropped_steps_baseline: int | None = None
        self.bye: Bye | None = None
        self.bye_received: float | None = None
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
        self.pending: tuple[ThroughputPoint, ...] = ()

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
        return host if sep else None

    @property
    def unit(self) -> str:
        return SAMPLES_UNIT if self.samples_known or not self.total_steps else STEPS_UNIT

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

    def add_steps(self, message: Steps) -> None:
        if self.dropped_baseline is None:
            self.dropped_baseline = message.dropped
            self.dropped_steps_baseline = message.dropped_steps
        self.sent = max(self.sent, message.sent)
        self.dropped = max(self.dropped, message.dropped)
        self.dropped_steps = max(self.dropped_steps, message.dropped_steps)
        for record in message.records:
            last_end = self.throughput.last_end
            if last_end is not None and record.end_time <= last_end:
                continue  # out of order or repeated: the points already cover that time
            if self.first_start is None:
                self.first_start = record.end_time - max(0.0, record.period_s)
            self.steps.append(record)
            self.step_count = max(self.step_count, record.index + 1)
            self.total_steps += 1
            if record.samples is not None:
                self.samples_known = True
                self.total_samples += record.samples
            self.throughput.add(record)
        if self.throughput.last_end is not None:
            self.throughput.finish_until(self.throughput.last_end)
            oldest = self.throughput.last_end - STEP_KEEP_S
            while len(self.steps) > MIN_WINDOW_STEPS and self.steps[0].end_time < oldest:
                self.steps.popleft()

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
        periods = [r.period_s for r in islice(reversed(self.steps), 20)]
        return statistics.median(periods) if periods else None


class _Host:
    def __init__(self, history_s: float) -> None:
        self.history: deque[SystemSample] = deque(maxlen=max(60, math.ceil(history_s)))
        self.probe_sample_received: float | None = None


def _rank_label(hello: Hello | None) -> str:
    if hello is None or hello.rank is None:
        return ""
    return f"r{hello.rank}"


def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
    """:func:`tui.analyzer.analyze`, imported when the first run is analyzed."""
    from gputop_dl.tui.analyzer import analyze as analyze_window

    return analyze_window(window, previous)


class ViewerState:
    """The viewer's model of every run and host it has heard from."""

    def __init__(self, local_host: str, history_s: float = 300.0) -> None:
        self.local_host = local_host
        self.history_s = history_s
        self._sources: dict[str, _Source] = {}
        self._hosts: dict[str, _Host] = {}
        self._endpoints: dict[str, EndpointState] = {}
        self._errors: deque[ErrorEntry] = deque(maxlen=MAX_ERRORS)
        self._error_count = 0
        self._selected_key: str | None = None
        self._summaries: tuple[RunSummary, ...] = ()
        self._now: float | None = None
        self._roster = 0  # bumped when the list of runs or how one is named changes

    # ------------------------------------------------------------------ input

    def apply(self, event: SourceEvent) -> None:
        """Take one event from the source. Never raises on odd input."""
        if isinstance(event, Received):
            self._apply_message(event.message, event.received)
        elif isinstance(event, BadInput):
            self._apply_bad_input(event)
        elif isinstance(event, EndpointState):
            self._apply_endpoint(event)

    def apply_all(self, events: Iterable[SourceEvent]) -> None:
        for event in events:
            self.apply(event)

    def _source(self, source_id: str) -> _Source:
        source = self._sources.get(source_id)
        if source is None:
            source = self._sources[source_id] = _Source(source_id, self.history_s)
            self._roster += 1
        return source

    def _apply_message(self, message: Message, received: float) -> None:
        source = self._source(message.source_id)
        source.touch(received)
        if not isinstance(message, Bye):
            if source.incompatible is not None:
                self._roster += 1
            source.incompatible = None
        if isinstance(message, Hello):
            previous = source.hello
            restarted = previous is not None and message.started != previous.started
            if source.bye is not None and restarted:
                source.bye = None  # the same id started again
            if previous is None or restarted or _naming(previous) != _naming(message):
                self._roster += 1
            source.hello = message
        elif isinstance(message, Steps):
            source.add_steps(message)
            if message.records:
                newest = max(record.end_time for record in message.records)
                source.clock_offsets.append(received - newest)
        elif isinstance(message, System):
            source.clock_offsets.append(received - message.sample.time)
            self._apply_system(source, message.sample, received)
        elif isinstance(message, Bye):
            source.bye = message
            source.bye_received = received
            self._roster += 1

    def _apply_system(self, source: _Source, sample: SystemSample, received: float) -> None:
        source.systems.append(sample)
        if not sample.host_sampled:
            return
        host = self._hosts.get(sample.host)
        if host is None:
            host = self._hosts[sample.host] = _Host(self.history_s)
        from_agent = source.hello is not None and source.hello.role == "agent"
        if from_agent:
            recent = host.probe_sample_received
            if recent is not None and received - recent <= AGENT_DEFERS_S:
                return  # a probe samples this host: its samples carry the processes too
        else:
            host.probe_sample_received = received
        host.history.append(sample)

    def _apply_bad_input(self, event: BadInput) -> None:
        text = event.text
        if event.source_hint and event.source_hint not in text:
            text = f"{event.source_hint}: {text}"
        self._add_error(event.received, text, event.source_hint)
        if event.theirs is not None:
            key = event.source_hint or f"peer speaking protocol {event.theirs[0]}.{event.theirs[1]}"
            source = self._source(key)
            source.incompatible = event
            self._roster += 1

    def _apply_endpoint(self, event: EndpointState) -> None:
        self._roster += 1
        if event.state == "detached":
            self._endpoints.pop(event.endpoint, None)
            return
        self._endpoints[event.endpoint] = event
        if event.state == "error":
            detail = f": {event.detail}" if event.detail else ""
            self._add_error(self._now, f"cannot use {event.endpoint}{detail}", event.endpoint)

    def _add_error(self, when: float | None, text: str, source: str | None = None) -> None:
        self._errors.append(ErrorEntry(when, text, source))
        self._error_count += 1

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Recompute what depends on time: connection states, stalls, verdicts, summaries."""
        self._now = now
        summaries = []
        for source in self._sources.values():
            if not source.is_run:
                continue
            connection = self._connection(source, now)
            source.pending = self._pending_points(source, connection, now)
            if connection.state == LIVE and (source.steps or source.hello is not None):
                last = source.analyzed_at
                if source.verdict is None or last is None or not 0 <= now - last < ANALYZE_EVERY_S:
                    source.verdict = self._analyze(source, now)
                    source.analyzed_at = now
            elif source.verdict is None and source.steps and connection.state in (STALE, EXITED):
                # Never seen live (attached late): judge it as of its last message, once.
                source.verdict = self._analyze(source, source.last_received or now)
            summaries.append(self._summary(source, connection, now))
        summaries.sort(key=_summary_order)
        summaries.extend(self._placeholders(summaries))
        self._summaries = tuple(summaries)

    def _connection(self, source: _Source, now: float) -> Connection:
        if source.incompatible is not None:
            return Connection(INCOMPATIBLE, incompatible_text(source.incompatible.theirs))
        if source.bye is not None:
            age = now - (source.bye_received or now)
            steps = fmt_count(source.bye.steps)
            return Connection(EXITED, f"exited: {source.bye.reason} after {steps} steps", age)
        if source.last_received is None:
            return Connection(CONNECTING, "connecting")
        age = max(0.0, now - source.last_received)
        if age > STALE_AFTER_S:
            return Connection(STALE, f"stale: no message for {fmt_duration(age)}", age)
        return Connection(LIVE, "live", age)

    def _pending_points(
        self, source: _Source, connection: Connection, now: float
    ) -> tuple[ThroughputPoint, ...]:
        last_end = source.throughput.last_end
        if connection.state != LIVE or last_end is None:
            return ()
        typical = source.typical_period() or 0.0
        probe_now = source.probe_time(now)
        if probe_now - last_end < max(STALL_MIN_S, 2.0 * typical):
            return ()
        return source.throughput.pending_points(probe_now)

    def _analyze(self, source: _Source, now: float) -> Verdict:
        """The run's verdict as of ``now`` (viewer clock). The analyzer compares times
        with the probe's steps and samples, so it is given ``now`` in the probe's clock;
        the tracker, whose times the banner shows, stays in the viewer's."""
        from gputop_dl.tui.analyzer import Verdict, VerdictTracker, Window

        if source.tracker is None:
            source.tracker = VerdictTracker()
        probe_now = source.probe_time(now)
        since = probe_now - ANALYSIS_WINDOW_S
        window = Window(
            now=probe_now,
            steps=tuple(source.recent_steps(since, MIN_WINDOW_STEPS, MAX_WINDOW_RECORDS)),
            systems=tuple(self._run_systems(source, since)),
            hello=source.hello,  # the newest: it carries the progress of a hung run
        )
        try:
            # The verdict shown is passed back: a condition it holds is left only below
            # the analyzer's exit threshold (hysteresis), not at its entry threshold.
            verdict = analyze(window, previous=source.tracker.shown)
            return source.tracker.update(verdict, now)
        except Exception as exc:  # a bug in the analyzer must not take the viewer down
            text = f"analyzer failed: {type(exc).__name__}: {exc}"
            if not self._errors or self._errors[-1].text != text:
                self._add_error(now, text)
            return Verdict("error", "warning", 0.0, text)

    def _run_systems(self, source: _Source, since: float) -> list[SystemSample]:
        """The run's host samples, with the run's own training processes when it has them."""
        own = [s for s in source.systems if s.time >= since]
        if own and own[-1].host_sampled:
            return own
        host = self._hosts.get(source.host or "")
        if host is None:
            return own
        processes = next((s.processes for s in reversed(own) if s.processes is not None), None)
        samples = [s for s in host.history if s.time >= since]
        if processes is None:
            return samples
        return [replace(s, processes=processes) for s in samples]

    def _summary(self, source: _Source, connection: Connection, now: float) -> RunSummary:
        hello = source.hello
        name = hello.name if hello is not None else source.source_id
        rank = hello.rank if hello is not None else None
        recent = source.recent_steps((source.throughput.last_end or 0.0) - RATE_WINDOW_S)
        wait_share, device_share = _shares(recent)
        return RunSummary(
            key=source.source_id,
            label=" ".join(part for part in (name, _rank_label(hello)) if part),
            name=name,
            host=source.host,
            pid=hello.pid if hello is not None else None,
            rank=rank,
            world_size=hello.world_size if hello is not None else None,
            uptime_s=max(0.0, source.probe_time(now) - hello.started) if hello else None,
            step_count=source.step_count,
            unit=source.unit,
            rate_now=self._rate_now(source),
            rate_avg=self._rate_avg(source),
            wait_share_now=wait_share,
            device_busy_now=device_share,
            connection=connection,
            verdict=source.verdict,
            loader=hello.loader if hello is not None else None,
            timing=hello.timing if hello is not None else None,
            timing_note=hello.timing_note if hello is not None else None,
            lost_messages=source.dropped - (source.dropped_baseline or 0),
            lost_steps=source.dropped_steps - (source.dropped_steps_baseline or 0),
            theirs=source.incompatible.theirs if source.incompatible is not None else None,
        )

    def _rate_now(self, source: _Source) -> float | None:
        points = list(source.throughput.points) + list(source.pending)
        window = points[-round(RATE_WINDOW_S / BUCKET_S) :]
        covered = sum(p.covered_s for p in window if p.rate(source.unit) is not None)
        if covered <= 0:
            return None
        total = sum((p.rate(source.unit) or 0.0) * p.covered_s for p in window)
        return total / covered

    def _rate_avg(self, source: _Source) -> float | None:
        if source.first_start is None or source.throughput.last_end is None:
            return None
        elapsed = source.throughput.last_end - source.first_start
        if elapsed <= 0:
            return None
        total = source.total_samples if source.samples_known else source.total_steps
        return total / elapsed

    def _placeholders(self, runs: Sequence[RunSummary]) -> list[RunSummary]:
        """Endpoints still waiting for their first message, as pseudo-runs."""
        names = {run.name for run in runs}
        placeholders = []
        for endpoint, info in self._endpoints.items():
            if info.name is not None and info.name in names:
                continue
            if info.name is None and runs:
                continue  # cannot tell which run it is: it is probably one of them
            if info.state == "error":
                detail = f": {info.detail}" if info.detail else ""
                connection = Connection(ENDPOINT_ERROR, f"cannot use {endpoint}{detail}")
            else:
                connection = Connection(CONNECTING, "connecting")
            name = info.name or endpoint
            placeholders.append(
                RunSummary(
                    key=f"endpoint:{endpoint}",
                    label=name,
                    name=name,
                    host=None,
                    pid=None,
                    rank=None,
                    world_size=None,
                    uptime_s=None,
                    step_count=0,
                    unit=SAMPLES_UNIT,
                    rate_now=None,
                    rate_avg=None,
                    wait_share_now=None,
                    device_busy_now=None,
                    connection=connection,
                    verdict=None,
                    is_placeholder=True,
                    endpoint=endpoint,
                )
            )
        return placeholders

    # ------------------------------------------------------------------ selection

    @property
    def runs(self) -> tuple[RunSummary, ...]:
        """Runs and placeholders in switcher order, as of the last :meth:`tick`."""
        return self._summaries

    @property
    def selected_index(self) -> int | None:
        if not self._summaries:
            return None
        for index, run in enumerate(self._summaries):
            if run.key == self._selected_key:
                return index
        return 0

    @property
    def selected(self) -> RunSummary | None:
        index = self.selected_index
        return None if index is None else self._summaries[index]

    def select(self, index: int) -> bool:
        """Select the run at ``index`` (0-based); False if there is none."""
        if 0 <= index < len(self._summaries):
            self._selected_key = self._summaries[index].key
            return True
        return False

    def select_next(self, step: int = 1) -> None:
        index = self.selected_index
        if index is not None:
            self.select((index + step) % len(self._summaries))

    def select_previous(self) -> None:
        self.select_next(-1)

    # ------------------------------------------------------------------ reads

    @property
    def roster(self) -> int:
        """Changes whenever a run appears, goes, is named (its hello), exits or turns out
        incompatible: what the screen should show at once, not at the next tick."""
        return self._roster

    @property
    def has_probe(self) -> bool:
        """True when any training process has spoken (placeholders do not count)."""
        return any(not run.is_placeholder for run in self._summaries)

    @property
    def errors(self) -> tuple[ErrorEntry, ...]:
        """Recent problems (bad input, endpoint errors), oldest first."""
        return tuple(self._errors)

    @property
    def error_count(self) -> int:
        """All problems seen, including those no longer in :attr:`errors`."""
        return self._error_count

    @property
    def endpoints(self) -> tuple[EndpointState, ...]:
        return tuple(self._endpoints.values())

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._hosts)

    def throughput(self, key: str | None = None) -> tuple[ThroughputPoint, ...]:
        """The run's throughput points, oldest first, including a stall in progress."""
        source = self._selected_source() if key is None else self._sources.get(key)
        if source is None:
            return ()
        return tuple(source.throughput.points) + source.pending

    def steps(self, key: str | None = None) -> tuple[StepRecord, ...]:
        source = self._selected_source() if key is None else self._sources.get(key)
        return () if source is None else tuple(source.steps)

    def display_host(self) -> str | None:
        """The host the panels show: the selected run's, else this machine, else any."""
        source = self._selected_source()
        if source is not None and source.host is not None:
            return source.host
        if self.local_host in self._hosts:
            return self.local_host
        return next(iter(self._hosts), None)

    def host_system(self, host: str | None = None) -> SystemSample | None:
        """The newest host-wide sample of ``host`` (default: :meth:`display_host`)."""
        host = self.display_host() if host is None else host
        known = self._hosts.get(host or "")
        if known is not None and known.history:
            return known.history[-1]
        source = self._selected_source()
        if source is not None and source.systems and source.host == host:
            return source.systems[-1]
        return None

    def host_history(self, host: str) -> tuple[SystemSample, ...]:
        known = self._hosts.get(host)
        return () if known is None else tuple(known.history)

    def training_processes(self) -> TrainingProcesses | None:
        """The selected run's own main process and DataLoader workers."""
        source = self._selected_source()
        if source is not None:
            for sample in reversed(source.systems):
                if sample.processes is not None:
                    return sample.processes
            return None
        system = self.host_system()
        return None if system is None else system.processes

    def _selected_source(self) -> _Source | None:
        run = self.selected
        if run is None or run.is_placeholder:
            return None
        return self._sources.get(run.key)


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


def _shares(records: Sequence[StepRecord]) -> tuple[float | None, float | None]:
    """Shares of the step time the data wait and the device take, each over the records
    that report it."""
    wait = wait_covered = device = device_covered = 0.0
    for record in records:
        period = record.period_s
        if period <= 0:
            continue
        if record.wait_s is not None:
            wait += min(record.wait_s, period)
            wait_covered += period
        if record.device_s is not None:
            device += min(record.device_s, period)
            device_covered += period
    return (
        wait / wait_covered if wait_covered > 0 else None,
        device / device_covered if device_covered > 0 else None,
    )


def _naming(hello: Hello) -> tuple[object, ...]:
    """What of a hello names the run on screen."""
    return (hello.name, hello.host, hello.rank, hello.world_size, hello.role)


def _summary_order(run: RunSummary) -> tuple[str, int, str]:
    return (run.name, run.rank if run.rank is not None else -1, run.key)


__all__ = [
    "CONNECTING",
    "EXITED",
    "INCOMPATIBLE",
    "INSTRUMENT_HINT",
    "LIVE",
    "SAMPLES_UNIT",
    "STALE",
    "STEPS_UNIT",
    "Connection",
    "ErrorEntry",
    "RunSummary",
    "ThroughputPoint",
    "ViewerState",
    "incompatible_text",
    "upgrade_advice",
]
