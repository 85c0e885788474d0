"""Headless view: the same source and viewer state as the TUI, printed once.

Used by ``gputop snapshot`` and ``gputop demo --no-tui``: scripts, CI and people
without a TUI get the same verdict the banner shows.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import threading
import time
from typing import Any

import msgspec

from gputop_dl.tui.events import Source, SourceEvent
from gputop_dl.tui.format import fmt_bytes, fmt_duration, fmt_number, fmt_pct, fmt_share
from gputop_dl.tui.source import ZmqSource
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.state.jobs import JobSummary

NO_RUN_FOUND = (
    "no training run found; instrument one with: "
    "from gputop_dl import probe; for batch in probe.watch(loader): ..."
)


class Collector:
    """Runs a ZmqSource and keeps its events until :meth:`snapshot` applies them."""

    def __init__(
        self, endpoints: list[str], *, local_sampler: bool = True, source: Source | None = None
    ) -> None:
        self.source: Source = source or ZmqSource(
            endpoints, discover=not endpoints, local_sampler=local_sampler
        )
        self.state = ViewerState(socket.gethostname())
        self._pending: list[SourceEvent] = []
        self._lock = threading.Lock()

    def _emit(self, events: list[SourceEvent]) -> None:  # called on the source thread
        with self._lock:
            self._pending.extend(events)

    def start(self) -> None:
        self.source.start(self._emit)

    def stop(self) -> None:
        self.source.stop()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        with self._lock:
            events, self._pending = self._pending, []
        self.state.apply_all(events)
        self.state.tick(time.time() if now is None else now)
        return build_snapshot(self.state)


def build_snapshot(state: ViewerState) -> dict[str, Any]:
    runs = []
    for run in state.runs:
        if run.is_placeholder and run.connection.state == "connecting":
            continue
        if run.is_placeholder and run.key.startswith("endpoint:ssh://"):
            continue  # a remote host's link: listed under "hosts"
        verdict = dataclasses.asdict(run.verdict) if run.verdict is not None else None
        runs.append(
            {
                "name": run.name,
                # An endpoint that never spoke, listed for its connection's state (why it
                # could not be used): no host, pid or figures.
                "placeholder": run.is_placeholder,
                "host": run.host,
                "pid": run.pid,
                "rank": run.rank,
                "world_size": run.world_size,
                "state": run.connection.state,
                "connection": run.connection.text,
                "steps": run.step_count,  # a count; the newest index is separate
                "last_step_index": run.last_step_index,
                "loop": run.loop,
                "unit": run.unit,
                "rate_now": run.rate_now,
                "rate_avg": run.rate_avg,
                "data_wait_share": run.wait_share_now,
                "timing": run.timing,
                "loader": dataclasses.asdict(run.loader) if run.loader else None,
                "verdict": verdict,
                # The newest stack the probe took in a stall (innermost frame first); it
                # is the stall in progress while its step_index > last_step_index.
                "stack": dataclasses.asdict(run.stack) if run.stack is not None else None,
            }
        )
    host = state.display_host()
    system = state.host_system(host) if host else None
    jobs = [job_json(job) for job in state.jobs]
    selected = state.job_of()
    return {
        "host": host,
        "runs": runs,
        "agent_only": list(state.agent_only_hosts()),
        "hosts": [
            {"host": link.host, "state": link.state, "detail": link.detail} for link in state.links
        ],
        "systems": {
            name: msgspec.to_builtins(sample)  # cores are msgspec Structs: not asdict
            for name in state.agent_only_hosts()
            if (sample := state.host_system(name)) is not None and name != host
        },
        "system": msgspec.to_builtins(system) if system is not None else None,
        "errors": [e.text for e in state.errors],
        # The selected run's job (else the largest one), and every job.
        "job": job_json(selected) if selected is not None else _largest(jobs),
        "jobs": jobs,
    }


def job_json(job: JobSummary) -> dict[str, Any]:
    verdict = job.verdict
    return {
        "id": job.job_id,
        "name": job.name,
        "world_size": job.world_size,
        "hosts": list(job.hosts),
        "verdict": dataclasses.asdict(verdict) if verdict is not None else None,
        "straggler": (
            {
                "rank": verdict.straggler_rank,
                "host": verdict.straggler_host,
                "run": verdict.straggler,
            }
            if verdict is not None and verdict.straggler is not None
            else None
        ),
        "ranks": [dataclasses.asdict(row) for row in job.ranks],
    }


def _largest(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(jobs, key=lambda job: len(job["ranks"]), default=None)


def render_text(snap: dict[str, Any]) -> str:
    lines: list[str] = []
    for link in snap.get("hosts", []):
        detail = f": {link['detail']}" if link["detail"] else ""
        lines.append(f"host {link['host']}: {link['state']}{detail}")
    not_yet = None if found_runs(snap) else _no_run_yet(snap.get("recording"))
    for node in snap.get("agent_only", []):
        lines.append(f"node {node}: {not_yet or 'no training run (agent only)'}")
    if not found_runs(snap) and not snap.get("agent_only"):
        lines.append(not_yet or NO_RUN_FOUND)
    placeheld: set[str] = set()  # placeholders' texts, not repeated as errors
    for run in snap["runs"]:
        if run.get("placeholder"):
            # Only the reason: it has no host, pid or figures to print (they read
            # "(None:None) ... 0 steps, n/a samples/s").
            text = run["connection"] or run["state"]
            placeheld.add(text)
            lines.append(text if run["name"] in text else f"{run['name']}: {text}")
            continue
        rank = f" rank {run['rank']}/{run['world_size']}" if run["rank"] is not None else ""
        lines.append(
            f"{run['name']} ({run['host']}:{run['pid']}{rank}) {run['connection']}: "
            f"{run['steps']} steps, {fmt_number(run['rate_now'])} {run['unit']} now, "
            f"{fmt_number(run['rate_avg'])} avg, data wait {fmt_share(run['data_wait_share'])}"
        )
        verdict = run["verdict"]
        if verdict:
            cause = f" ({verdict['cause']})" if verdict.get("cause") else ""
            lines.append(
                f"  verdict: {verdict['kind']}{cause} [{verdict['severity']}] {verdict['headline']}"
            )
            lines.extend(f"    evidence: {e}" for e in verdict["evidence"])
            lines.extend(f"    advice:   {a}" for a in verdict["advice"])
            if verdict.get("headroom"):
                lines.append(f"    headroom: {verdict['headroom']}")
    for job in snap.get("jobs", ()):
        verdict = job["verdict"]
        said = f"{verdict['kind']}: {verdict['headline']}" if verdict else "not judged yet"
        world = job["world_size"] if job["world_size"] is not None else "?"
        hosts = len(job["hosts"])
        lines.append(
            f"job {job['id']} ({len(job['ranks'])} of {world} ranks on "
            f"{hosts} host{'s' if hosts != 1 else ''}) {said}"
        )
    for system in [snap["system"], *snap.get("systems", {}).values()]:
        if system:
            lines.extend(_system_lines(system))
    lines.extend(f"error: {e}" for e in snap["errors"] if e not in placeheld)
    return "\n".join(lines)


def _no_run_yet(recording: dict[str, Any] | None) -> str | None:
    """What a recording's snapshot with no run says when a run starts later in it (a
    moment before the first run, not a recording without one), else None."""
    if recording is None or recording.get("first_run") is None:
        return None
    start, at, first = recording["start"], recording["at"], recording["first_run"]
    if first <= at:
        return None
    first_s = first - start
    return (
        f"no run yet at {fmt_duration(at - start)} into the recording; the first run "
        f"starts at {fmt_duration(first_s)} (--at {math.ceil(first_s * 10) / 10:g}s)"
    )


def found_runs(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of ``snap`` that spoke (not an endpoint listed for its error alone)."""
    return [run for run in snap["runs"] if not run.get("placeholder")]


def _system_lines(system: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if system:
        cpu = system.get("cpu")
        if cpu:
            busy = [
                100 - (c["idle_pct"] or 0) - (c["iowait_pct"] or 0)
                for c in cpu["cores"]
                if c["idle_pct"] is not None
            ]
            if busy:
                lines.append(
                    f"host {system['host']}: {len(cpu['cores'])} cores, busy "
                    f"{fmt_pct(sum(busy) / len(busy))} avg, {fmt_pct(max(busy))} max"
                )
        mem = system.get("memory")
        if mem:
            lines.append(
                f"  memory: {fmt_bytes(mem['used_bytes'])} used of {fmt_bytes(mem['total_bytes'])}"
            )
        for status in system.get("statuses", []):
            if not status["ok"]:
                lines.append(f"  {status['source']}: {status['message']}")
    return lines
