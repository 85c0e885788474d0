"""``gputop exporter``: every run the viewer would show, as Prometheus metrics.

The same pipeline as the viewer and ``gputop snapshot`` (a :class:`ZmqSource` feeding a
:class:`ViewerState`), with one end more: a pump thread applies the source's events and
ticks the state once a second (so verdicts keep the same hysteresis as on screen), then
publishes an immutable :class:`Figures`; the HTTP threads of ``prometheus_client`` only
read the newest one (``collect()``). The ViewerState is touched by the pump thread alone.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gputop_dl.tui import metrics
from gputop_dl.tui.events import SourceEvent
from gputop_dl.tui.metrics import Figures, RunFigures, StepTotals
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.stopsignals import StopSignals

DEFAULT_LISTEN = "127.0.0.1:9477"
TICK_S = 1.0  # the viewer's verdicts are recomputed about once a second
EXIT_OK, EXIT_NO_RUN, EXIT_USAGE = 0, 1, 2


class ListenError(ValueError):
    """``--listen`` is not HOST:PORT."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9477`` for IPv6) -> (host, port); port 0: any free port."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise ListenError(f"{text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ListenError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


class Exporter(Collector):
    """The pump thread and the Prometheus collector over its newest figures."""

    def __init__(self, source: Any, local_host: str | None = None) -> None:
        self.source = source
        self.state = ViewerState(local_host or socket.gethostname())
        self._inbox: list[SourceEvent] = []
        self._lock = threading.Lock()
        self._totals: dict[str, StepTotals] = {}
        self._figures = Figures()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # ticks that raised (counted in gputop_exporter_errors_total)

    # ---------------------------------------------------------------- pump thread
    def _emit(self, events: list[SourceEvent]) -> None:  # the source's thread
        with self._lock:
            self._inbox.extend(events)

    def start(self) -> None:
        self.source.start(self._emit)
        self._thread = threading.Thread(target=self._pump, name="gputop-exporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.source.stop()

    def _pump(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.update(time.time())
            except Exception:  # one bad tick must not end the exporter: counted
                self.failures += 1

    def update(self, now: float) -> Figures:
        """Apply what arrived, tick, and publish the figures as of ``now``."""
        with self._lock:
            events, self._inbox = self._inbox, []
        state = self.state
        state.apply_all(events)
        state.tick(now)
        runs = []
        seen = set()
        for run in state.runs:
            if run.is_placeholder:
                continue
            seen.add(run.key)
            totals = self._totals.setdefault(run.key, StepTotals())
            totals.add(state.steps(run.key))
            verdict = run.verdict
            stalled = 0.0
            if verdict is not None and verdict.kind == "stalled" and verdict.since is not None:
                stalled = max(0.0, now - verdict.since)
            # The totals object keeps growing on this thread: hand the HTTP threads a copy.
            frozen = StepTotals(
                list(totals.counts),
                totals.count,
                totals.seconds,
                totals.wait_seconds,
                totals.samples,
                totals.samples_known,
                totals.last_index,
            )
            hello = state.hello(run.key)
            framework = hello.framework if hello is not None else None
            runs.append(RunFigures(run, frozen, framework, stalled))
        for key in [k for k in self._totals if k not in seen]:
            del self._totals[key]  # the run left the viewer (a minute after it ended)
        nodes = tuple(s for host in state.hosts if (s := state.host_system(host)) is not None)
        figures = Figures(
            tuple(runs),
            nodes,
            tuple(state.source_kinds().items()),
            state.error_count + self.failures,
        )
        self._figures = figures  # one reference store: readers see old or new, whole
        return figures

    # ---------------------------------------------------------------- HTTP threads
    def collect(self) -> list[Metric]:
        return metrics.families(self._figures)


def exporter_parser() -> argparse.ArgumentParser:
    from gputop_dl.tui.cli import EXIT_CODES, HelpFormatter, endpoint_arg

    ap = argparse.ArgumentParser(
        prog="gputop exporter",
        description="Serve every run gputop sees (and its node's CPU, memory, disk, network, "
        "GPU and HPU figures) as Prometheus metrics on http://HOST:PORT/metrics. With no "
        "ENDPOINT, every probe on this host. Runs until SIGINT, SIGTERM or SIGHUP.",
        epilog=EXIT_CODES,
        formatter_class=HelpFormatter,
    )
    ap.add_argument(
        "endpoints",
        nargs="*",
        type=endpoint_arg,
        metavar="ENDPOINT",
        help="probe, agent or relay to read: ipc://PATH or tcp://HOST:PORT",
    )
    ap.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {DEFAULT_LISTEN}; port 0: any free port). "
        "Loopback is readable by every user of this host; a wildcard or network address "
        "is refused without --insecure",
    )
    ap.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a wildcard or network address: anyone who can reach it "
        "reads the metrics (no authentication; prefer a local Prometheus or ssh -L)",
    )
    ap.add_argument(
        "--no-local", action="store_true", help="do not sample this host when no probe does"
    )
    return ap


EXPOSED_REFUSAL = (
    "serving metrics on {address} refused: plain HTTP, readable by anyone who can reach "
    "this host (gputop keys protect the probes' streams, not this); scrape it on "
    "127.0.0.1 (a local Prometheus, or ssh -L), or pass --insecure"
)
EXPOSED_WARNING = (
    "serving metrics on {address} as asked (--insecure): anyone who can reach this host "
    "can read them (plain HTTP, no authentication)"
)


def cmd_exporter(argv: list[str]) -> int:
    from gputop_dl.probe.transport import EXPOSED, exposure
    from gputop_dl.tui.cli import _only_remote, reachable
    from gputop_dl.tui.source import GATHER_MAX_S, ZmqSource

    ap = exporter_parser()
    args = ap.parse_args(argv)
    try:
        host, port = parse_listen(args.listen)
    except ListenError as exc:
        ap.error(str(exc))
    # The access rules of every gputop listener (docs/protocol.md, "Access"), but CURVE
    # keys do not cover plain HTTP: with keys made for the probes, a network address
    # was served to anyone who could reach it.
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exposure(f"tcp://{shown}") == EXPOSED:
        if not args.insecure:
            print(f"gputop exporter: {EXPOSED_REFUSAL.format(address=shown)}", file=sys.stderr)
            return EXIT_USAGE
        # Loopback, the default, goes unsaid: metrics on loopback are the norm.
        print(f"gputop exporter: warning: {EXPOSED_WARNING.format(address=shown)}", file=sys.stderr)
    targets = args.endpoints
    if targets:
        targets = reachable("gputop exporter", targets)
        if not targets:
            return EXIT_NO_RUN
    source = ZmqSource(
        targets,
        discover=not targets,
        local_sampler=not args.no_local and not _only_remote(targets),
        gather_s=GATHER_MAX_S,  # scraped every few seconds: no need to read each message
    )
    exporter = Exporter(source)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        print(f"gputop exporter: cannot listen on {shown}: {why}", file=sys.stderr)
        return EXIT_NO_RUN
    signals = StopSignals()
    exporter.start()
    bound = server.server_address[1]
    url_host = f"[{host}]" if ":" in host else host
    print(f"gputop exporter serving http://{url_host}:{bound}/metrics", flush=True)
    try:
        signals.done.wait()
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop()
    return signals.exit_status(EXIT_OK)


__all__ = ["Exporter", "cmd_exporter", "parse_listen"]
