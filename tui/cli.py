"""``gputop`` command line: the viewer, and the demo, agent, snapshot and list commands."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gputop_dl.probe import discovery
from gputop_dl.probe.version import __version__

COMMANDS = ("demo", "agent", "snapshot", "list")
SCENARIOS = ("input-bound", "compute-bound", "balanced", "disk-bound", "stall")
INSTRUMENT_HINT = (
    "instrument a training script with: "
    "from gputop_dl import probe; for batch in probe.watch(loader): ..."
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        command, rest = args[0], args[1:]
        handler = {"demo": cmd_demo, "agent": cmd_agent, "snapshot": cmd_snapshot, "list": cmd_list}
        return handler[command](rest)
    return cmd_view(args)


# ------------------------------------------------------------------------ viewer
def view_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gputop",
        description="A top for deep-learning training runs. With no ENDPOINT, attaches to "
        "every probe running on this host and shows this host's own panels.",
        epilog="commands: gputop demo | agent | snapshot | list  (each has --help)",
    )
    ap.add_argument(
        "endpoints",
        nargs="*",
        metavar="ENDPOINT",
        help="probe or agent to attach to: ipc://PATH or tcp://HOST:PORT",
    )
    ap.add_argument(
        "--refresh",
        type=float,
        default=2.0,
        metavar="HZ",
        help="screen refreshes per second (default 2)",
    )
    ap.add_argument(
        "--no-local", action="store_true", help="do not sample this host when no probe does"
    )
    ap.add_argument("--version", action="version", version=f"gputop {__version__}")
    return ap


def cmd_view(argv: list[str]) -> int:
    args = view_parser().parse_args(argv)
    from gputop_dl.tui.source import ZmqSource

    source = ZmqSource(
        args.endpoints,
        discover=not args.endpoints,
        local_sampler=not args.no_local and not _only_remote(args.endpoints),
    )
    return run_app(source, args.refresh)


def _only_remote(endpoints: list[str]) -> bool:
    return bool(endpoints) and all(e.startswith("tcp://") for e in endpoints)


def run_app(source: Any, refresh_hz: float = 2.0) -> int:
    from gputop_dl.tui.app import GputopApp

    GputopApp(source, local_host=socket.gethostname(), refresh_hz=refresh_hz).run()
    return 0


# -------------------------------------------------------------------------- demo
def cmd_demo(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gputop demo",
        description="Train a small CNN on the CPU (real PyTorch, synthetic JPEGs) with the "
        "probe, and watch it in gputop.",
    )
    ap.add_argument("--scenario", choices=SCENARIOS, default="input-bound")
    ap.add_argument(
        "--duration", type=float, default=0.0, help="seconds to train (0: until you quit)"
    )
    ap.add_argument(
        "--no-tui", action="store_true", help="print a snapshot every few seconds instead"
    )
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "gputop demo needs PyTorch: pip install 'gputop-dl[demo]' (or run make demo)",
            file=sys.stderr,
        )
        return 2
    child, endpoint, log_path = start_demo(args.scenario, args.duration)
    print(f"demo: training pid {child.pid}, log {log_path}", file=sys.stderr)
    try:
        if args.no_tui:
            return _print_live(child, [endpoint])
        from gputop_dl.tui.source import ZmqSource

        return run_app(ZmqSource([endpoint], discover=False, local_sampler=False))
    finally:
        stop_child(child)


def start_demo(
    scenario: str,
    duration: float = 0.0,
    extra: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start the demo training as a child process publishing on a private endpoint.

    ``launcher`` replaces ``python -m gputop_dl.tui.demo.train`` (the screenshots use it to run the
    training with simulated accelerators)."""
    endpoint = f"ipc://{discovery.runtime_dir()}/demo-{os.getpid()}-{scenario}.sock"
    log_path = Path(tempfile.gettempdir()) / f"gputop-demo-{os.getpid()}-{scenario}.log"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": f"demo {scenario}"}
    base = list(launcher) if launcher else [sys.executable, "-m", "gputop_dl.tui.demo.train"]
    cmd = [*base, "--scenario", scenario, "--duration", str(duration), *extra]
    with open(log_path, "wb") as log:
        child = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return child, endpoint, log_path


def stop_child(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _print_live(child: subprocess.Popen[bytes], endpoints: list[str]) -> int:
    from gputop_dl.tui.snapshot import Collector, render_text

    collector = Collector(endpoints, local_sampler=False)
    collector.start()
    try:
        while child.poll() is None:
            time.sleep(3.0)
            print(render_text(collector.snapshot()), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
    return 0


# ------------------------------------------------------------------------- agent
def cmd_agent(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gputop agent",
        description="Publish this node's CPU, memory, disk, network, GPU and HPU samples "
        "with no training process, for remote viewers or unmodified jobs.",
    )
    ap.add_argument(
        "--listen",
        metavar="ENDPOINT",
        help="where to listen (default: private ipc socket; e.g. tcp://127.0.0.1:5555)",
    )
    ap.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between samples"
    )
    ap.add_argument("--name", default=None, help="name shown by viewers")
    args = ap.parse_args(argv)
    from gputop_dl.probe.core import Probe

    if args.listen and args.listen.startswith("tcp://") and not _loopback(args.listen):
        print(
            f"warning: {args.listen} is reachable from other hosts and has no authentication",
            file=sys.stderr,
        )
    agent = Probe(
        name=args.name or f"agent@{socket.gethostname()}",
        listen=args.listen,
        role="agent",
        sample_host=True,
        system_interval_s=args.interval,
    )
    if not agent.enabled:
        print(f"gputop agent: {agent.error}", file=sys.stderr)
        return 1
    print(f"gputop agent publishing on {agent.endpoint}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    agent.close("agent stopped")
    return 0


def _loopback(endpoint: str) -> bool:
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


# ---------------------------------------------------------------------- snapshot
def cmd_snapshot(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gputop snapshot",
        description="Attach for a while, then print the runs, the host and the bottleneck "
        "verdict, and exit 0. For scripts, CI and terminals without a TUI.",
    )
    ap.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    ap.add_argument(
        "--wait", type=float, default=5.0, metavar="SECONDS", help="how long to listen (default 5)"
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    from gputop_dl.tui.snapshot import Collector, render_text

    collector = Collector(args.endpoints, local_sampler=not _only_remote(args.endpoints))
    collector.start()
    try:
        time.sleep(max(0.0, args.wait))
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
    snap = collector.snapshot()
    print(json.dumps(snap, indent=2) if args.json else render_text(snap))
    return 0


# -------------------------------------------------------------------------- list
def cmd_list(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="gputop list", description="List the probes and agents on this host."
    ).parse_args(argv)
    records = discovery.discover()
    if not records:
        print(f"no probe running on this host; {INSTRUMENT_HINT}")
        return 0
    for r in records:
        age = time.time() - r.started
        print(f"{r.pid:>8}  {r.role:<6} {r.name:<28} up {age:>7.0f}s  {r.endpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
