"""What the viewer knows: runs, their steps and throughput, hosts and their samples.

Pure Python (no Textual, no I/O but an optional pid check, no clock of its own):
:meth:`ViewerState.apply` takes the events a source produced, :meth:`ViewerState.tick`
recomputes what depends on time (connection states, ages, verdicts), and the read
accessors hand the widgets immutable values, so a paused display keeps what it showed.

Vocabulary: a *source* is one publisher (key ``Hello.source_id``); a *run* is a source
that is a training process (a probe), as opposed to an ``agent`` that only samples its
node. A *host* is a node name; its samples may come from any source on it. A
*placeholder* is an endpoint the source listens to from which nothing was read yet.

Everything is bounded whatever publishers send: at most MAX_SOURCES sources (the oldest
silent one is forgotten for a new one), ended runs removed a minute after they end, a
total budget of step records shared by the runs, so a tick costs O(runs shown).
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from gputop_dl.probe.discovery import left_running as discovery_left_running
from gputop_dl.probe.discovery import process_alive
from gputop_dl.probe.messages import Bye, Hello, Loop, Message, Stack, StepRecord, Steps, System
from gputop_dl.probe.samples import SystemSample, TrainingProcesses
from gputop_dl.tui.analysis.thresholds import MAX_WINDOW_STEPS
from gputop_dl.tui.events import BadInput, EndpointState, Received, SourceEvent
from gputop_dl.tui.format import fmt_count, fmt_duration
from gputop_dl.tui.state.clean import (
    check_time,
    clean_hello,
    clean_sample,
    clean_stack,
    clean_text,
    evolve,
)
from gputop_dl.tui.state.hosts import (
    LINK_CONNECTING,
    LINK_LIVE,
    Hosts,
    Link,
    Links,
    keep_recent,
    link_summary,
)
from gputop_dl.tui.state.jobs import Jobs, JobSummary
from gputop_dl.tui.state.model import (
    CONNECTING,
    ENDED,
    ENDPOINT_ERROR,
    EXITED,
    GONE_TEXT,
    INCOMPATIBLE,
    LIVE,
    LOST,
    SAMPLES_UNIT,
    STALE,
    Connection,
    ErrorEntry,
    NewRuns,
    RunSummary,
    ThroughputPoint,
    incompatible_text,
)
from gputop_dl.tui.state.roster import Heard, Who, labels, next_slots, successors
from gputop_dl.tui.state.run import ANALYSIS_WINDOW_S, MIN_WINDOW_STEPS, OWN_SAMPLES_S, Run

if TYPE_CHECKING:
    from gputop_dl.tui.analysis.stuck import Ptrace
    from gputop_dl.tui.analyzer import Verdict

STALE_AFTER_S = 3.0  # a live run publishes several messages a second
HELLO_PERIOD_S = 2.0  # probe.core.HELLO_EVERY_S: a live probe says hello this often
LOST_AFTER_S = 3 * HELLO_PERIOD_S  # a remote run this silent is shown as lost
GONE_QUIET_S = 1.0  # a local run whose pid is gone, silent this long, has exited
# Both under the default refresh period (1 s) by a margin: Textual's timer keeps its
# schedule, so the tick after a late one comes early, and must not be skipped (it was
# at 0.9 s when a tick came 150 ms late). At --refresh 2: every other tick.
PID_CHECK_EVERY_S = 0.75
REMOVE_AFTER_S = 60.0  # an ended run fades, then leaves the switcher for the recent list
RECENT_RUNS = 20
MAX_SOURCES = 1024  # publishers tracked at once (a 512-rank job, its agents and others)
SOURCE_KINDS = ("run", "node", "incompatible")  # source_kinds' keys, in this order
EVICT_SILENT_S = 10.0  # ... a new one replaces the one silent longest, if this silent
MAX_ENDPOINTS = 256
MAX_TOTAL_STEP_RECORDS = 200_000  # shared by all runs (~50 MB); each keeps at least:
MAX_WINDOW_RECORDS = 2 * MAX_WINDOW_STEPS  # the analyzer reads the last MAX_WINDOW_STEPS
# A run's verdict is recomputed about once a second: each tick at the default refresh.
ANALYZE_EVERY_S = 0.75
OTHERS_PER_TICK = 4  # ... runs not on screen: this many a tick, those judged longest ago
MAX_ERRORS = 20
# No step for this long (and twice the usual step) shows as a stall in the graph. Longer
# than the newest step can be old at a refresh while steps come: the probe's flush (0.5 s
# from 100 steps/s), the source's gather (half a refresh: 0.5 s at the default) and a
# late tick (1.0 s left ~0.2 s of margin: a review measured 0.81 s against the demo).
STALL_MIN_S = 1.5
LOOP_STATES = frozenset({"in-loop", "outside"})

PidAlive = Callable[[int, float | None], bool]
# An agent's hello -> whether it is this viewer's own node sampler (tui.source), not an agent.
OwnSampler = Callable[[Hello], bool]
# An ended run's worker pids, its start (Unix time) -> those still running here.
LeftRunning = Callable[[Sequence[int], float], tuple[int, ...]]


class ViewerState:
    """The viewer's model of every run and host it has heard from.

    ``pid_alive`` checks the pid of runs on ``local_host``; by default the real check
    when ``local_host`` is this machine, else none (a run's pid means nothing here).
    ``left_running`` finds the DataLoader workers an ended local run left running; by
    default the real one wherever ``pid_alive`` is. ``own_sampler`` tells the viewer's
    own node sampler among the agents; by default the one of this process (a replay
    passes the recorder's)."""

    def __init__(
        self,
        local_host: str,
        history_s: float = 300.0,
        *,
        pid_alive: PidAlive | bool | None = True,
        left_running: LeftRunning | None = None,
        own_sampler: OwnSampler | None = None,
    ) -> None:
        self.local_host = local_host
        self.history_s = history_s
        real = pid_alive is True and local_host == socket.gethostname()
        if pid_alive is True:
            pid_alive = process_alive if real else None
        self._pid_alive: PidAlive | None = pid_alive or None
        self._left_running: LeftRunning | None = left_running or (
            discovery_left_running if real else None
        )
        self._own_sampler: OwnSampler = own_sampler or _this_process
        self._sources: dict[str, Run] = {}
        self._hosts = Hosts(history_s)
        self._endpoints: dict[str, EndpointState] = {}
        self._links = Links()  # remote hosts over ssh (tui.remote)
        self._errors: deque[ErrorEntry] = deque(maxlen=MAX_ERRORS)
        self._error_count = 0
        self._selected_key: str | None = None
        # The user chose the run shown (select): a new run does not take its place.
        self._picked = False
        self._announced: set[str] = set()  # new runs follow_new_runs has told of
        self._summaries: tuple[RunSummary, ...] = ()
        self._recent: deque[RunSummary] = deque(maxlen=RECENT_RUNS)
        self._now: float | None = None
        self._roster = 0  # bumped when the list of runs or how one is named changes
        self._evictable_at = 0.0  # no source can be evicted before this viewer time
        self._jobs = Jobs()  # ranks of one job grouped, the job verdict (tui/state/jobs.py)
        self._jobs_roster = -1  # the roster the jobs were grouped from: regroup when it moves

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

    def _source(self, source_id: str, received: float) -> Run | None:
        """The source's state; None when MAX_SOURCES are tracked and none is silent
        enough to be forgotten (then the message is dropped, with an error)."""
        source = self._sources.get(source_id)
        if source is None:
            if len(self._sources) >= MAX_SOURCES and not self._evict(received):
                self._add_error(
                    received,
                    f"{MAX_SOURCES} publishers tracked: new ones ignored until one goes silent",
                )
                return None
            source = self._sources[source_id] = Run(source_id, self.history_s)
            self._roster += 1
        return source

    def _evict(self, received: float) -> bool:
        """Forget the source silent longest, if silent EVICT_SILENT_S; False if none is.
        A failed search is remembered, so a flood of new ids costs O(1) each."""
        if received < self._evictable_at:
            return False
        oldest_key, oldest_time = None, float("inf")
        shown = self.selected
        for key, source in self._sources.items():
            if shown is not None and key == shown.key:
                continue  # the run on screen stays, however silent
            heard = source.last_received
            if heard is None and source.incompatible is not None:
                heard = source.incompatible.received
            heard = heard if heard is not None else float("-inf")
            if heard < oldest_time:
                oldest_key, oldest_time = key, heard
        if oldest_key is None or received - oldest_time < EVICT_SILENT_S:
            self._evictable_at = (oldest_time if oldest_key else received) + EVICT_SILENT_S
            return False
        self._forget(oldest_key)
        return True

    def _forget(self, key: str) -> None:
        source = self._sources.pop(key)
        self._roster += 1
        self._announced.discard(key)
        if key == self._selected_key:  # gone (not replaced): the first run shows, and
            self._selected_key, self._picked = None, False  # new runs are followed again
        if source.is_run and source.slot is not None:
            summary = self._summary_of(key)
            if summary is not None:
                self._recent.append(summary)

    def _summary_of(self, key: str) -> RunSummary | None:
        return next((run for run in self._summaries if run.key == key), None)

    def _apply_message(self, message: Message, received: float) -> None:
        source = self._source(message.source_id, received)
        if source is None:
            return
        if isinstance(message, Hello):
            hello = clean_hello(message, received)
            if hello is None:
                self._invalid(source, received, 1, "hello")
                return
            previous = source.hello
            if previous is not None and hello.started != previous.started:
                source = self._restart(source)  # the same id started again (pid reuse)
                self._roster += 1
            elif previous is None or _naming(previous) != _naming(hello):
                self._roster += 1
            source.set_hello(hello)
        source.touch(received)
        source.gone_at = None  # it speaks: whatever the pid check said, it is there
        if not isinstance(message, Bye):
            if source.incompatible is not None:
                self._roster += 1
            source.incompatible = None
        if isinstance(message, Steps):
            invalid = source.add_steps(message, received)
            if invalid:
                self._invalid(source, received, invalid, "step records")
        elif isinstance(message, System):
            sample = clean_sample(message.sample, received)
            if sample is None:
                self._invalid(source, received, 1, "system samples")
                return
            source.clock_offsets.append(received - sample.time)
            # A history replay repeats samples: keep_recent leaves the repeats out, here
            # and in the host's history (which holds samples this one no longer does).
            keep_recent(source.systems, sample, OWN_SAMPLES_S)
            if sample.host_sampled:
                from_agent = source.hello is not None and source.hello.role == "agent"
                self._hosts.add(sample, received, from_agent=from_agent)
        elif isinstance(message, Loop):
            if message.state in LOOP_STATES and check_time(message.time, received):
                how = message.how
                source.add_loop(message if how is None else evolve(message, how=clean_text(how)))
            else:
                self._invalid(source, received, 1, "loop events")
        elif isinstance(message, Stack):
            stack = clean_stack(message, received)
            if stack is None:
                self._invalid(source, received, 1, "stacks")
            else:
                source.stack = stack
        elif isinstance(message, Bye):
            source.bye = evolve(message, reason=clean_text(message.reason))
            source.bye_received = received
            self._roster += 1

    def _restart(self, old: Run) -> Run:
        fresh = Run(old.source_id, self.history_s)
        fresh.slot = old.slot
        self._sources[old.source_id] = fresh
        return fresh

    def _invalid(self, source: Run, received: float, count: int, what: str) -> None:
        self._add_error(
            received, f"{source.name}: {what} with impossible values dropped", source.source_id
        )
        self._error_count += count - 1

    def _apply_bad_input(self, event: BadInput) -> None:
        text = clean_text(event.text)
        hint = clean_text(event.source_hint) if event.source_hint else None
        if hint and hint not in text:
            text = f"{hint}: {text}"
        self._add_error(event.received, text, hint)
        if event.theirs is not None:
            # One run per peer id, or per version when the id could not be read; it
            # leaves like an ended run when that peer stops sending.
            key = event.source_hint or f"peer speaking protocol {event.theirs[0]}.{event.theirs[1]}"
            source = self._source(key, event.received)
            if source is not None:
                if source.incompatible is None:
                    self._roster += 1
                source.incompatible = event

    def _apply_endpoint(self, event: EndpointState) -> None:
        if event.endpoint.startswith("ssh://"):
            event = self._apply_link(event)
            if event.state == "detached":
                if self._endpoints.pop(event.endpoint, None) is not None:
                    self._roster += 1
                return
        if event.state == "detached":
            if self._endpoints.pop(event.endpoint, None) is not None:
                self._roster += 1
            return
        if event.endpoint not in self._endpoints and len(self._endpoints) >= MAX_ENDPOINTS:
            self._add_error(self._now, f"{MAX_ENDPOINTS} endpoints listened to: one ignored")
            return
        self._roster += 1
        self._endpoints[event.endpoint] = event
        if event.state == "error" and not event.endpoint.startswith("ssh://"):
            detail = f": {clean_text(event.detail)}" if event.detail else ""
            endpoint = clean_text(event.endpoint)
            self._add_error(self._now, f"cannot use {endpoint}{detail}", event.endpoint)

    def _apply_link(self, event: EndpointState) -> EndpointState:
        """Record a remote host's link; what the endpoint list should hold for it: a
        placeholder ("connecting", or "error" with ssh's words) until the host was once
        live, nothing after (its runs stand for it; a later failure is an error line)."""
        host = clean_text(event.name or event.endpoint)
        detail = clean_text(event.detail)
        old = {link.endpoint: link for link in self._links.all()}.get(event.endpoint)
        link = self._links.apply(event.endpoint, host, event.state, detail, self._now)
        if old is None or old.state != link.state:
            self._roster += 1
        failed = link.state not in (LINK_LIVE, LINK_CONNECTING)
        if failed and (old is None or old.state != link.state or old.detail != detail):
            self._add_error(self._now, detail or f"{host}: {link.state}", event.endpoint)
        if link.ever_live:
            return EndpointState(event.endpoint, "detached", "", event.name)
        if failed:
            return EndpointState(event.endpoint, "error", "", event.name)
        return EndpointState(event.endpoint, "connecting", "", event.name)

    def _add_error(self, when: float | None, text: str, source: str | None = None) -> None:
        text = clean_text(text)  # it may quote the wire (an analyzer's message, a name)
        self._error_count += 1
        if self._errors and self._errors[-1].text == text:
            return  # the same problem again: counted, listed once
        self._errors.append(ErrorEntry(when, text, source))

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Recompute what depends on time: connection states, stalls, verdicts, summaries.
        Costs O(runs tracked), which MAX_SOURCES and REMOVE_AFTER_S bound."""
        self._now = now
        runs: list[tuple[Run, Connection]] = []
        expired: list[str] = []
        for source in self._sources.values():
            if not source.is_run:
                continue
            self._check_pid(source, now)
            self._check_leftovers(source, now)
            connection = self._connection(source, now)
            ended_at = self._ended_at(source, connection)
            if ended_at is not None and now - ended_at > REMOVE_AFTER_S:
                expired.append(source.source_id)
                continue
            runs.append((source, connection))
        for key in expired:
            self._forget(key)
        self._place_new_runs([run for run, _ in runs if run.slot is None])
        runs = [(run, connection) for run, connection in runs if run.source_id in self._sources]
        self._share_step_budget([run for run, _ in runs])
        runs.sort(key=lambda item: item[0].slot or 0)
        names = labels([_who(run) for run, _ in runs])
        self._judge(runs, now)
        regroup, self._jobs_roster = self._roster != self._jobs_roster, self._roster
        self._jobs.update(
            runs, self._hosts, now, lambda run: self._refresh_verdict(run, now), force=regroup
        )
        summaries = []
        for source, connection in runs:
            source.pending = self._pending_points(source, connection, now)
            label = names[source.source_id]
            summaries.append(self._summary(source, connection, label, now))
        summaries.extend(self._placeholders(summaries))
        self._summaries = tuple(summaries)

    def _judge(self, runs: Sequence[tuple[Run, Connection]], now: float) -> None:
        """Verdicts: the run on screen about once a second; the others (their switcher
        dots) in turn, at most OTHERS_PER_TICK a tick, so 64 runs cost a few analyses a
        tick, not 64."""
        shown = self.selected.key if self.selected is not None else None
        due: list[Run] = []
        for source, connection in runs:
            if connection.state == LIVE and (source.steps or source.hello is not None):
                last = source.analyzed_at
                if source.verdict is None or last is None or not 0 <= now - last < ANALYZE_EVERY_S:
                    due.append(source)
            elif source.verdict is None and source.steps and connection.state != LIVE:
                # Never seen live (attached late): judge it as of its last message, once.
                source.verdict = self._analyze(source, source.last_received or now, live=False)
        first_time = [s for s in due if s.verdict is None or s.source_id == shown]
        others = sorted(
            (s for s in due if s.verdict is not None and s.source_id != shown),
            key=lambda s: s.analyzed_at or 0.0,
        )
        for source in first_time + others[:OTHERS_PER_TICK]:
            source.verdict = self._analyze(source, now)
            source.analyzed_at = now

    def _refresh_verdict(self, source: Run, now: float) -> None:
        """Bring a run's own verdict up to date (a rank the job verdict may name)."""
        last = source.analyzed_at
        if last is None or not 0 <= now - last < ANALYZE_EVERY_S:
            source.verdict = self._analyze(source, now)
            source.analyzed_at = now

    def _check_pid(self, source: Run, now: float) -> None:
        """A local run's pid, at most once a second: gone without a bye means killed."""
        check, hello = self._pid_alive, source.hello
        if check is None or hello is None or source.bye is not None or source.gone_at is not None:
            return
        if hello.host != self.local_host:
            return
        if source.pid_checked is not None and 0 <= now - source.pid_checked < PID_CHECK_EVERY_S:
            return
        source.pid_checked = now
        quiet = now - (source.last_received or now)
        if quiet >= GONE_QUIET_S and not check(hello.pid, hello.started):
            source.gone_at = now
            self._roster += 1

    def _check_leftovers(self, source: Run, now: float) -> None:
        """An ended local run's DataLoader workers still running (orphaned): at its end,
        then at most once a second until none is left."""
        check, hello = self._left_running, source.hello
        ended = source.bye is not None or source.gone_at is not None
        if check is None or hello is None or not ended or hello.host != self.local_host:
            return
        pids = hello.loader.worker_pids if hello.loader is not None else ()
        if not pids or (source.leftovers_checked is not None and not source.leftover_workers):
            return  # none, or none left at the last look: they do not come back
        last = source.leftovers_checked
        if last is not None and 0 <= now - last < PID_CHECK_EVERY_S:
            return
        source.leftovers_checked = now
        source.leftover_workers = check(pids, hello.started)

    def _connection(self, source: Run, now: float) -> Connection:
        if source.incompatible is not None:
            return Connection(INCOMPATIBLE, incompatible_text(source.incompatible.theirs))
        if source.bye is not None:
            age = now - (source.bye_received or now)
            steps = fmt_count(source.bye.steps)
            text = f"exited: {source.bye.reason} after {steps} steps"
            return Connection(EXITED, text + _leftovers_text(source.leftover_workers), age)
        if source.last_received is None:
            return Connection(CONNECTING, "connecting")
        age = max(0.0, now - source.last_received)
        if source.gone_at is not None:
            return Connection(EXITED, GONE_TEXT + _leftovers_text(source.leftover_workers), age)
        local = source.host == self.local_host
        if not local and age > LOST_AFTER_S:
            return Connection(LOST, f"lost: no message for {fmt_duration(age)}", age)
        if age > STALE_AFTER_S:
            return Connection(STALE, f"stale: no message for {fmt_duration(age)}", age)
        return Connection(LIVE, "live", age)

    @staticmethod
    def _ended_at(source: Run, connection: Connection) -> float | None:
        """Viewer time the run ended (exited, lost, refused), None while it runs."""
        if connection.state not in ENDED:
            return None
        if source.incompatible is not None:
            return source.incompatible.received
        if source.bye is not None:
            return source.bye_received
        if source.gone_at is not None:
            return source.gone_at
        return (source.last_received or 0.0) + LOST_AFTER_S

    def _place_new_runs(self, new: list[Run]) -> None:
        """Give new runs the lowest free slots, in name/rank order among themselves; a
        new run named like an ended one on the same host takes its slot (and the
        selection, when the user was on it): it is the same job, restarted."""
        if not new:
            return
        new.sort(key=lambda run: (run.name, _rank(run), run.source_id))
        waiting = []
        for run in new:
            dead = self._replaced_by(run)
            if dead is None:
                waiting.append(run)
                continue
            run.slot = dead.slot
            if self._selected_key == dead.source_id:
                self._selected_key = run.source_id
            self._forget(dead.source_id)
        taken = [run.slot for run in self._sources.values() if run.slot is not None]
        for run, slot in zip(waiting, next_slots(taken, len(waiting)), strict=True):
            run.slot = slot

    def _replaced_by(self, new: Run) -> Run | None:
        hello = new.hello
        if hello is None or hello.role == "agent":
            return None
        for source in self._sources.values():
            old = source.hello
            if (
                source is not new
                and source.slot is not None
                and old is not None
                and (old.name, old.host, old.rank) == (hello.name, hello.host, hello.rank)
                and (source.bye is not None or source.gone_at is not None)
            ):
                return source
        return None

    @staticmethod
    def _share_step_budget(runs: Sequence[Run]) -> None:
        """Many runs share MAX_TOTAL_STEP_RECORDS: each keeps its newest share of it
        (never fewer than the analyzer reads)."""
        total = sum(len(run.steps) for run in runs)
        if total <= MAX_TOTAL_STEP_RECORDS:
            return
        share = max(MAX_WINDOW_RECORDS, MAX_TOTAL_STEP_RECORDS // len(runs))
        for run in runs:
            if len(run.steps) > share:
                run.steps.drop_oldest(len(run.steps) - share)

    def _pending_points(
        self, source: Run, connection: Connection, now: float
    ) -> tuple[ThroughputPoint, ...]:
        last_end = source.throughput.last_end
        if connection.state != LIVE or last_end is None or source.outside_loop:
            return ()  # outside the loop no step is late: its time is in no point
        typical = source.typical_period() or 0.0
        probe_now = source.probe_time(now)
        # Late from the later of the last step and the loop's re-entry: the time outside
        # it (an evaluation) was no step's to take (its pending zeros read "0.00 samples/s"
        # the moment the loop resumed).
        hello = source.window_hello()
        entered = hello.loop_since if hello is not None and hello.loop == "in-loop" else None
        since = last_end if entered is None else max(last_end, entered)
        if probe_now - since < max(STALL_MIN_S, 2.0 * typical):
            return ()
        return source.throughput.pending_points(probe_now)

    def _analyze(self, source: Run, now: float, live: bool = True) -> Verdict:
        """The run's verdict as of ``now`` (viewer clock). The analyzer compares times
        with the probe's steps and samples, so it is given ``now`` in the probe's clock;
        the tracker, whose times the banner shows, stays in the viewer's."""
        from gputop_dl.tui import state as package  # its ``analyze``: tests replace it
        from gputop_dl.tui.analyzer import Verdict, VerdictTracker, Window

        if source.tracker is None:
            source.tracker = VerdictTracker()
        probe_now = source.probe_time(now)
        since = probe_now - ANALYSIS_WINDOW_S
        hello = source.window_hello()
        window = Window(
            now=probe_now,
            steps=tuple(source.recent_steps(since, MIN_WINDOW_STEPS, MAX_WINDOW_RECORDS)),
            systems=tuple(self._run_systems(source, since)),
            hello=hello,  # the newest: it carries the progress of a hung run
            stack=source.stack,
            ptrace=self._ptrace(source),
            run_from=source.first_start,
            whole_passes=source.whole_passes,
            usual_away=source.usual_away(hello.loop_exit if hello is not None else None),
            # Judged live, this viewer receives the run: its probe samples once a second.
            watched=live,
        )
        try:
            # The verdict shown is passed back: a condition it holds is left only below
            # the analyzer's exit threshold (hysteresis), not at its entry threshold.
            verdict = package.analyze(window, previous=source.tracker.basis)
            return source.tracker.update(verdict, now)
        except Exception as exc:  # a bug in the analyzer must not take the viewer down
            text = f"analyzer failed: {type(exc).__name__}: {exc}"
            if not self._errors or self._errors[-1].text != text:
                self._add_error(now, text)
            return Verdict("error", "warning", 0.0, text)

    def _ptrace(self, source: Run) -> Ptrace | None:
        """Whether py-spy could attach to a stalled local run from here (None: remote)."""
        hello = source.hello
        if source.stack is None or hello is None or hello.host != self.local_host:
            return None
        from gputop_dl.tui.ptrace import ptrace_access

        return ptrace_access(hello.pid)

    def _run_systems(self, source: Run, since: float) -> list[SystemSample]:
        """Samples of the run's OWN host (a rank on node2 is not judged on node1's), with
        the run's own training processes when it reports them."""
        own = [s for s in source.systems if s.time >= since]
        if own and own[-1].host_sampled:
            return own
        host = self._hosts.get(source.host)
        if host is None:
            return own
        processes = next((s.processes for s in reversed(own) if s.processes is not None), None)
        samples = [s for s in host.history if s.time >= since]
        if processes is None:
            return samples
        return [evolve(s, processes=processes) for s in samples]

    def _summary(self, source: Run, connection: Connection, label: str, now: float) -> RunSummary:
        from gputop_dl.tui.analyzer import ended_verdict  # as _analyze: imported when used

        hello = source.window_hello()
        wait_share, device_share = source.shares()
        return RunSummary(
            key=source.source_id,
            label=label,
            name=source.name,
            host=source.host,
            pid=hello.pid if hello is not None else None,
            rank=hello.rank if hello is not None else None,
            world_size=hello.world_size if hello is not None else None,
            uptime_s=max(0.0, source.probe_time(now) - hello.started) if hello else None,
            step_count=source.step_count,
            unit=source.unit,
            # A run that ended has no rate now: its last points are from before it
            # stopped (a run killed outside its loop showed its last epoch's rate).
            # Nor one outside its loop: the last points are the loop's before it left (a
            # review: "1,907 samples/s" beside "outside the training loop").
            rate_now=None
            if connection.state in (EXITED, LOST) or source.outside_loop
            else source.rate_now(),
            rate_avg=source.rate_avg(),
            wait_share_now=wait_share,
            device_busy_now=device_share,
            connection=connection,
            # An ended run's bottleneck, not the state it ended in (outside the loop).
            verdict=ended_verdict(source.verdict, source.tracker.judged)
            if connection.state in (EXITED, LOST) and source.tracker is not None
            else source.verdict,
            loader=hello.loader if hello is not None else None,
            timing=hello.timing if hello is not None else None,
            timing_note=hello.timing_note if hello is not None else None,
            lost_messages=source.dropped - (source.dropped_baseline or 0),
            lost_steps=source.dropped_steps - (source.dropped_steps_baseline or 0),
            theirs=source.incompatible.theirs if source.incompatible is not None else None,
            slot=source.slot or 0,
            last_step_index=source.last_index,
            loop=hello.loop if hello is not None else None,
            ended_at=self._ended_at(source, connection),
            stack=source.stack,
        )

    def _placeholders(self, runs: Sequence[RunSummary]) -> list[RunSummary]:
        """Endpoints still waiting for their first message, as pseudo-runs."""
        # A discovered endpoint is its run once that run spoke: the same process of this
        # host, or else the same name as shown (a name with a tab or an escape in it is
        # shown cleaned: compared raw, its endpoint stayed "connecting" beside it).
        names = {run.name for run in runs}
        local_pids = {run.pid for run in runs if run.host == self.local_host}
        placeholders: list[RunSummary] = []
        for endpoint, info in self._endpoints.items():
            if info.pid is not None and info.pid in local_pids:
                continue
            if info.name is not None and clean_text(info.name) in names:
                continue
            if info.name is None and (runs or self.agent_only_hosts()):
                continue  # cannot tell which run it is: it is probably one of them
            shown = clean_text(endpoint)
            link = self._link(endpoint)
            if link is not None and info.state == "error":
                connection = Connection(ENDPOINT_ERROR, link.detail or f"{link.host}: {link.state}")
            elif info.state == "error":
                detail = f": {clean_text(info.detail)}" if info.detail else ""
                connection = Connection(ENDPOINT_ERROR, f"cannot use {shown}{detail}")
            else:
                connection = Connection(CONNECTING, "connecting")
            name = clean_text(info.name) if info.name else shown
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
                    endpoint=shown,
                    slot=len(runs) + len(placeholders),
                )
            )
        return placeholders

    def _link(self, endpoint: str) -> Link | None:
        if not endpoint.startswith("ssh://"):
            return None
        return next((link for link in self._links.all() if link.endpoint == endpoint), None)

    @property
    def links(self) -> tuple[Link, ...]:
        """Remote hosts given with ssh:// or --hosts, and their link states."""
        return self._links.all()

    def link_summary(self) -> str:
        """The remote hosts' states in one line ("" without remote hosts)."""
        return link_summary(self._links.all())

    def agent_only_hosts(self) -> tuple[str, ...]:
        """Hosts an agent (not the viewer's own sampler, see ``own_sampler``) reports on,
        where no training run is known: shown as nodes, not as runs that never arrive."""
        with_runs = {source.host for source in self._sources.values() if source.is_run}
        hosts: dict[str, None] = {}
        for source in self._sources.values():
            hello = source.hello
            if hello is None or hello.role != "agent" or source.host in with_runs:
                continue
            if self._own_sampler(hello):
                continue  # the viewer sampling its own host (tui.source)
            if source.host is not None:
                hosts[source.host] = None
        return tuple(hosts)

    # ------------------------------------------------------------------ selection

    @property
    def runs(self) -> tuple[RunSummary, ...]:
        """Runs (in slot order) and placeholders, as of the last :meth:`tick`."""
        return self._summaries

    @property
    def recent(self) -> tuple[RunSummary, ...]:
        """Runs removed a minute after they ended (or replaced), newest last."""
        return tuple(self._recent)

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
        """Select the run at ``index`` (0-based), as the user's choice: it stays shown
        when it ends and new runs start (see follow_new_runs). False if there is none."""
        if 0 <= index < len(self._summaries):
            self._selected_key = self._summaries[index].key
            self._picked = True
            return True
        return False

    def follow_new_runs(self) -> NewRuns | None:
        """Once the run shown has ended and new runs started after it (a training
        restarted under another name), show the best of them, as ``top`` shows what
        runs now, unless the user picked the run shown by hand: then keep it. Either
        way, the news (once per new run; None when there is none). Call after tick.

        The run shown is held by its key from then on: a new run given a lower slot
        (one freed by a run that left) does not take the screen from it."""
        shown = self.selected
        if shown is None or shown.is_placeholder:
            return None
        self._selected_key = shown.key
        heard = [h for run in self._summaries if (h := self._heard(run)) is not None]
        mine = next((h for h in heard if h.key == shown.key), None)
        new = successors(mine, heard) if mine is not None else []
        news = [key for key in new if key not in self._announced]
        if not news:
            return None
        self._announced.update(new)
        switch = not self._picked
        if switch:
            self._selected_key = new[0]
        numbers = {run.key: (index + 1, run.label) for index, run in enumerate(self._summaries)}
        shown_now = new if switch else news
        return NewRuns(numbers[shown.key], tuple(numbers[key] for key in shown_now), switch)

    def _heard(self, run: RunSummary) -> Heard | None:
        """When the viewer heard from the run (a refused peer: its refusal)."""
        source = None if run.is_placeholder else self._sources.get(run.key)
        if source is None:
            return None
        first, last = source.first_received, source.last_received
        if source.incompatible is not None:
            refused = source.incompatible.received
            first = refused if first is None else first
            last = refused if last is None else last
        if first is None or last is None:
            return None
        return Heard(run.key, run.rank, run.connection.state in ENDED, first, last)

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
        return self._hosts.names()

    @property
    def source_count(self) -> int:
        """Publishers tracked now (runs, agents, refused peers)."""
        return len(self._sources)

    def source_kinds(self) -> dict[str, int]:
        """Publishers tracked now by kind: ``run`` (a training process, an ended one
        for as long as it is kept), ``node`` (an agent or a host sampler without a loop),
        ``incompatible`` (a peer whose messages this viewer cannot read)."""
        kinds = dict.fromkeys(SOURCE_KINDS, 0)
        for source in self._sources.values():
            kind = (
                "incompatible"
                if source.incompatible is not None
                else "run"
                if source.is_run
                else "node"
            )
            kinds[kind] += 1
        return kinds

    @property
    def jobs(self) -> tuple[JobSummary, ...]:
        """Jobs among the runs (ranks grouped by ``Hello.job``), as of the last tick."""
        return self._jobs.summaries

    def job_of(self, key: str | None = None) -> JobSummary | None:
        """The job the run ``key`` (default: the selected run) is a rank of."""
        if key is None:
            key = self.selected.key if self.selected is not None else None
        return None if key is None else self._jobs.of_run(key)

    def throughput(self, key: str | None = None) -> tuple[ThroughputPoint, ...]:
        """The run's throughput points, oldest first, including a stall in progress."""
        source = self._selected_source() if key is None else self._sources.get(key)
        if source is None:
            return ()
        return tuple(source.throughput.points) + source.pending

    def steps(self, key: str | None = None) -> tuple[StepRecord, ...]:
        source = self._selected_source() if key is None else self._sources.get(key)
        return () if source is None else tuple(source.steps)

    def hello(self, key: str) -> Hello | None:
        """The run's newest hello, with its loop state merged (for the exporter)."""
        source = self._sources.get(key)
        return None if source is None else source.window_hello()

    def display_host(self) -> str | None:
        """The host the panels show: the selected run's, else this machine, else any."""
        source = self._selected_source()
        if source is not None and source.host is not None:
            return source.host
        hosts = self._hosts.names()
        if self.local_host in hosts:
            return self.local_host
        return next(iter(hosts), None)

    def host_system(self, host: str | None = None) -> SystemSample | None:
        """The newest host-wide sample of ``host`` (default: :meth:`display_host`)."""
        host = self.display_host() if host is None else host
        known = self._hosts.get(host)
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

    def _selected_source(self) -> Run | None:
        run = self.selected
        if run is None or run.is_placeholder:
            return None
        return self._sources.get(run.key)


def _this_process(hello: Hello) -> bool:
    """Whether the hello is this process's: a live viewer's own node sampler."""
    return hello.pid == os.getpid() and hello.host == socket.gethostname()


def _naming(hello: Hello) -> tuple[object, ...]:
    """What of a hello names the run on screen."""
    return (hello.name, hello.host, hello.rank, hello.world_size, hello.role)


def _rank(run: Run) -> int:
    rank = run.hello.rank if run.hello is not None else None
    return -1 if rank is None else rank


def _who(run: Run) -> Who:
    hello = run.hello
    return Who(
        run.source_id,
        run.name,
        run.host,
        hello.rank if hello is not None else None,
        hello.pid if hello is not None else None,
    )


def _leftovers_text(pids: tuple[int, ...]) -> str:
    """What an ended run left running, and what to do about it."""
    if not pids:
        return ""
    listed = " ".join(str(pid) for pid in pids[:8]) + (" …" if len(pids) > 8 else "")
    workers = "worker" if len(pids) == 1 else "workers"
    return f"; {len(pids)} of its DataLoader {workers} still running, orphaned: kill {listed}"
