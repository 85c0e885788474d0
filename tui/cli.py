"""``gputop`` command line: the viewer, and the demo, agent, snapshot and list commands.

Exit status, kept as UNIX tools keep theirs (scripts may rely on it):
0 a run was found (``snapshot``) or the viewer was quit; 1 no run reachable (an endpoint
that nothing listens on, a socket that does not exist, ``snapshot`` that found no run, an
agent that could not bind); 2 a usage error (bad arguments, no terminal for the viewer,
the viewer not installed, a command told to listen on a network address without CURVE
keys or ``--insecure``); 128+n stopped by signal n (129 SIGHUP, 130 SIGINT, 143 SIGTERM,
141 a closed pipe), but 0 for a long-running command (agent, relay, exporter, record)
stopped by hand with SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gputop_dl.probe import discovery
from gputop_dl.probe.version import __version__
from gputop_dl.tui import endpoints
from gputop_dl.tui.record import commands as recording
from gputop_dl.tui.state.clean import clean_text
from gputop_dl.tui.stopsignals import StopSignals

COMMANDS = ("demo", "agent", "snapshot", "list", "exporter", "record", "export", "relay", "keys")
SCENARIOS = ("input-bound", "compute-bound", "balanced", "disk-bound", "stall", "worker-restarts")
INSTRUMENT_HINT = (
    "instrument a training script with: "
    "from gputop_dl import probe; for batch in probe.watch(loader): ..."
)
EXIT_OK, EXIT_NO_RUN, EXIT_USAGE = 0, 1, 2
# The exit status table of a command's --help; each command shows the lines true of it
# (README.md, "CLI reference", has all of them).
_EXIT_HEAD = """exit status:
  0      a run was found (snapshot; or a node an agent reports on), or the
         viewer was quit"""
_EXIT_NO_RUN = """
  1      no run reachable: nothing listens on the endpoint, no such socket,
         no run found (snapshot, list), the agent could not bind"""
_EXIT_USAGE = """
  2      usage error: bad arguments, no terminal for the viewer, viewer not installed"""
_EXIT_SIGNALS = """
  128+n  stopped by signal n: 129 SIGHUP, 130 SIGINT, 141 closed pipe, 143 SIGTERM"""
# Commands that run until stopped and may listen on the network: agent, relay, exporter
# (the last two take EXIT_CODES from here).
EXIT_CODES = (
    _EXIT_HEAD
    + """; or the command was stopped by hand (Ctrl-C, SIGINT)"""
    + _EXIT_NO_RUN
    + _EXIT_USAGE
    + """,
         a network --listen address without CURVE keys (gputop keys) or
         --insecure (the exporter's: without --insecure, keys or not)"""
    + _EXIT_SIGNALS
    + """ (not SIGINT: 0, above)"""
)
# The viewer, demo, snapshot and list: they listen on nothing, and SIGINT is 130.
EXIT_CODES_CLIENT = _EXIT_HEAD + _EXIT_NO_RUN + _EXIT_USAGE + _EXIT_SIGNALS
# record, export and keys: each its own exit paths (tui/record/commands.py, tui/keys.py).
EXIT_CODES_RECORD = """exit status:
  0      stopped by hand (Ctrl-C, SIGINT) or at --duration; what came is saved
  1      no run reachable: nothing listens on any ENDPOINT, no such socket;
         or the recording stopped on a write error (disk full)
  2      usage error: bad arguments, FILE cannot be created (it exists, or its
         directory does not), a part FILE.n is there already (--max-size)
  128+n  stopped by signal n: 129 SIGHUP, 143 SIGTERM, what came is saved all
         the same (SIGINT: 0, above; 130 before the recording began)"""
EXIT_CODES_EXPORT = (
    """exit status:
  0      the files were written
  1      FILE cannot be read (no such file, not a recording), or an output
         cannot be written
  2      usage error: bad arguments, neither --perfetto nor --csv, a --from or
         --to that is no moment, or a range that holds none of the recording"""
    + _EXIT_SIGNALS
)
EXIT_CODES_KEYS = (
    """exit status:
  0      the key pair was created or shown, and the keys authorized
  1      the keys directory cannot be used (it cannot be created, is not a
         directory, or is another user's), or the keys cannot be written or
         read back
  2      usage error: bad arguments, an --authorize that is no CURVE public key"""
    + _EXIT_SIGNALS
)


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions as usual, keeps the line breaks of texts that have them."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


REFRESH_HZ = (0.1, 10.0)  # the viewer's refresh rate range, per second
# Once a second, as the node samples come (and as nvtop, hl-smi -l 1): a second
# refresh showed only the steps of the probe's second flush, and cost the training
# node ~0.5 % of a core more (docs/measurements.md, "Viewer: CPU of one run").
DEFAULT_REFRESH_HZ = 1.0
WAIT_S = (0.1, 3600.0)  # snapshot --wait range, seconds
VIEWER_INSTALL = "the viewer needs: pip install 'gputop-dl[viewer]'"
# What the viewer extra installs (pyproject.toml), by the name a failed import gives.
VIEWER_EXTRA_MODULES = frozenset({"textual", "prometheus_client", "zstandard"})
NO_TTY_HINT = (
    "run it in a terminal (over SSH: ssh -t HOST gputop), or print the same verdict "
    "without one: gputop snapshot"
)
NO_TTY_DEMO_HINT = (
    "run it in a terminal (over SSH: ssh -t HOST gputop demo), or print the verdicts "
    "without one: gputop demo --no-tui"
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in COMMANDS:
            command, rest = args[0], args[1:]
            handler = {
                "demo": cmd_demo,
                "agent": cmd_agent,
                "snapshot": cmd_snapshot,
                "list": cmd_list,
                "exporter": _lazy("gputop_dl.tui.exporter", "cmd_exporter"),
                "record": recording.cmd_record,
                "export": recording.cmd_export,
                "relay": _lazy("gputop_dl.tui.relay", "cmd_relay"),
                "keys": _lazy("gputop_dl.tui.keys", "cmd_keys"),
            }
            return handler[command](rest)
        return cmd_view(args)
    except BrokenPipeError:
        # The reader went away (``gputop snapshot | head -1``): end quietly, as a UNIX
        # tool killed by SIGPIPE would, and keep Python from complaining at exit.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def _lazy(module: str, name: str) -> Callable[[list[str]], int]:
    """A command defined in its own module, imported only when it runs."""

    def run(argv: list[str]) -> int:
        try:
            command = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name not in VIEWER_EXTRA_MODULES:
                raise
            # A probe-only install (the training's environment): say what to install,
            # as the viewer does, not a traceback.
            print(f"gputop: {exc.name} is missing: {VIEWER_INSTALL}", file=sys.stderr)
            return 2
        handler: Callable[[list[str]], int] = getattr(command, name)
        return handler(argv)

    return run


# ------------------------------------------------------------- argument types
def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def in_range(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from ``low`` to ``high`` (above ``low`` if open)."""

    def parse(text: str) -> float:
        value = _number(text)
        if value < low or value > high or (low_open and value == low):
            bound = f"above {low:g}" if low_open else f"from {low:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: {bound} to {high:g}")
        return value

    return parse


def endpoint_arg(text: str) -> str:
    try:
        return endpoints.parse(text)
    except endpoints.EndpointError as exc:
        if "://" not in text and (os.sep in text or text.endswith(".gtrec")):
            # A recording's name, most likely: it is taken as one only if it exists.
            raise argparse.ArgumentTypeError(
                f"{exc}; nor is it a recording: no such file"
            ) from None
        raise argparse.ArgumentTypeError(str(exc)) from None


def listen_arg(text: str) -> str:
    try:
        return endpoints.parse(text, listen=True)
    except endpoints.EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _error(command: str, text: str) -> None:
    print(f"{command}: {text}", file=sys.stderr)


def _refuse_viewer(command: str, text: str) -> None:
    """Why the viewer cannot start, where the user sees it: with stderr sent away (the
    viewer needs it: Textual draws on it) on the terminal its stdout is, too."""
    _error(command, text)
    if sys.stderr is not None and _is_terminal(sys.stdout) and not _is_terminal(sys.stderr):
        print(f"{command}: {text}", flush=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return stream is not None and os.isatty(stream.fileno())
    except (OSError, ValueError):  # closed, or not a real file
        return False


RUNTIME_DIR_FIX = f"set {discovery.ENV_RUNTIME_DIR} to a directory only you can enter (mode 0700)"


def runtime_dir_refused() -> str | None:
    """Why discovery cannot see any probe on this host (a refused runtime directory:
    probes cannot register there either), or None."""
    problem = discovery.runtime_dir_problem()
    if problem is None:
        return None
    return (
        f"the runtime directory is refused ({problem}), so no probe can be found; {RUNTIME_DIR_FIX}"
    )


def reachable(command: str, targets: list[str]) -> list[str]:
    """The endpoints something listens on; each other one is reported on stderr (and
    left out: the others are still watched)."""
    ok = []
    for endpoint in targets:
        why = endpoints.unreachable(endpoint)
        if why is None:
            ok.append(endpoint)
        else:
            _error(command, why)
    return ok


# ------------------------------------------------------------------------ viewer
def view_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gputop",
        formatter_class=HelpFormatter,
        description="A top for deep-learning training runs. With no ENDPOINT, attaches to "
        "every probe running on this host and shows this host's own panels.",
        epilog="commands: gputop demo | agent | snapshot | list | record | export | exporter | "
        "relay | keys  (each has --help)\nreplay a recording: gputop FILE\n\n" + EXIT_CODES_CLIENT,
    )
    ap.add_argument(
        "endpoints",
        nargs="*",
        type=_target_arg,
        metavar="ENDPOINT",
        help="probe, agent or relay to attach to: ipc://PATH, tcp://HOST:PORT, or a node "
        "over ssh: ssh://[USER@]HOST[:PORT]",
    )
    _remote_arguments(ap)
    ap.add_argument(
        "--refresh",
        type=in_range(*REFRESH_HZ),
        default=DEFAULT_REFRESH_HZ,
        metavar="HZ",
        help=f"screen refreshes per second, {REFRESH_HZ[0]:g} to {REFRESH_HZ[1]:g} "
        f"(default {DEFAULT_REFRESH_HZ:g})",
    )
    ap.add_argument(
        "--no-local", action="store_true", help="do not sample this host when no probe does"
    )
    ap.add_argument("--version", action="version", version=f"gputop {__version__}")
    return ap


def cmd_view(argv: list[str]) -> int:
    if recording.recording_arg(argv) is not None:
        return recording.cmd_view_recording(argv)
    args = view_parser().parse_args(argv)
    if (problem := viewer_unavailable()) is not None:
        _refuse_viewer("gputop", problem)
        return EXIT_USAGE
    remote, targets = _split_remote("gputop", args)
    if remote is None:
        return EXIT_USAGE
    if targets:
        # Refused at start: ZeroMQ would wait on these for ever, silently.
        targets = reachable("gputop", targets)
        if not targets and not remote:
            return EXIT_NO_RUN
    from gputop_dl.tui.source import ZmqSource, gather_for

    source: Any = ZmqSource(
        targets,
        discover=not targets,
        local_sampler=not args.no_local and not _only_remote(targets),
        gather_s=gather_for(args.refresh),
    )
    if remote:
        source = _with_remote(source if targets else None, targets, remote, args)
    return run_app(source, args.refresh)


def _target_arg(text: str) -> str:
    from gputop_dl.tui.remote import target_arg

    return target_arg(text)


def _remote_arguments(ap: argparse.ArgumentParser) -> None:
    from gputop_dl.tui.remote import add_arguments

    add_arguments(ap)


def _split_remote(command: str, args: argparse.Namespace) -> tuple[list[Any] | None, list[str]]:
    """(ssh targets, ZeroMQ endpoints) of the command line; None targets: a usage error
    (already reported)."""
    from gputop_dl.tui.hostlist import HostlistError
    from gputop_dl.tui.remote import remote_targets

    endpoints = [t for t in args.endpoints if not t.startswith("ssh://")]
    try:
        return remote_targets(args.endpoints, args.hosts), endpoints
    except (ValueError, HostlistError) as exc:
        _error(command, str(exc))
        return None, endpoints


def _with_remote(local: Any, targets: list[str], remote: list[Any], args: Any) -> Any:
    from gputop_dl.tui.remote import build_source

    return build_source(targets, remote, args.remote_command, local)


def viewer_unavailable(hint: str = NO_TTY_HINT) -> str | None:
    """Why the TUI cannot start here (no Textual, no terminal), or None."""
    try:
        import textual  # noqa: F401
    except ImportError:
        return VIEWER_INSTALL
    streams = (
        ("input (stdin)", sys.stdin),
        ("output (stdout)", sys.stdout),
        ("error output (stderr, which Textual draws on)", sys.stderr),
    )
    for name, stream in streams:
        if not _is_terminal(stream):
            return f"the viewer needs a terminal, and its {name} is not one; {hint}"
    return None


def _only_remote(targets: list[str]) -> bool:
    return bool(targets) and all(e.startswith("tcp://") for e in targets)


def run_app(
    source: Any,
    refresh_hz: float = DEFAULT_REFRESH_HZ,
    *,
    on_start: Callable[[Any], None] | None = None,
) -> int:
    """Run the viewer until it is quit; its exit status (128+n after signal n)."""
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        # Such a terminal shows no colour; Textual would still send 24-bit colour codes.
        os.environ.setdefault("NO_COLOR", "1")
    from gputop_dl.tui.app import GputopApp

    app = GputopApp(source, local_host=socket.gethostname(), refresh_hz=refresh_hz)
    if on_start is not None:
        on_start(app)
    app.run()
    return app.return_code or EXIT_OK


# -------------------------------------------------------------------------- demo
class Stopped(Exception):
    """A signal asked this process to stop; ``code`` is its exit status, 128+n."""

    def __init__(self, sig: int) -> None:
        super().__init__(signal.Signals(sig).name)
        self.code = 128 + sig


@contextlib.contextmanager
def stop_on_signals(*signals: int) -> Iterator[None]:
    """Turn these signals into :class:`Stopped` in the main thread, so ``finally`` blocks
    (stopping the demo's child, removing its socket) run; the old handlers come back."""

    def raise_stopped(sig: int, _frame: Any) -> None:
        raise Stopped(sig)

    previous = {sig: signal.signal(sig, raise_stopped) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_demo(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gputop demo",
        description="Train a small CNN on the CPU (real PyTorch, synthetic JPEGs) with the "
        "probe, and watch it in gputop. The training stops, and its socket is removed, "
        "whenever the demo ends.",
        epilog=EXIT_CODES_CLIENT,
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--scenario", choices=SCENARIOS, default="input-bound")
    ap.add_argument(
        "--duration",
        type=in_range(0.0, 7 * 24 * 3600.0),
        default=0.0,
        help="seconds the demo runs, data preparation included; then the training stops "
        "and the demo ends (0: until you quit)",
    )
    ap.add_argument(
        "--no-tui", action="store_true", help="print a snapshot every few seconds instead"
    )
    args = ap.parse_args(argv)
    if not args.no_tui and (problem := viewer_unavailable(NO_TTY_DEMO_HINT)) is not None:
        _refuse_viewer("gputop demo", problem if problem != VIEWER_INSTALL else DEMO_INSTALL)
        return EXIT_USAGE
    if importlib.util.find_spec("torch") is None:  # found, not imported: seconds saved
        _error("gputop demo", f"{DEMO_INSTALL} (or run make demo)")
        return EXIT_USAGE
    try:
        discovery.runtime_dir()  # the demo's socket goes there
    except discovery.DiscoveryError as exc:
        _error("gputop demo", f"cannot use the runtime directory ({exc}); {RUNTIME_DIR_FIX}")
        return EXIT_NO_RUN
    with stop_on_signals(signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            return _run_demo(args.scenario, args.duration, tui=not args.no_tui)
        except Stopped as stop:
            return stop.code


DEMO_INSTALL = "the demo needs PyTorch and the viewer: pip install 'gputop-dl[demo]'"
DEMO_GRACE_S = 5.0  # after --duration, how long the child may take to stop by itself


def _run_demo(scenario: str, duration: float, *, tui: bool) -> int:
    # The demo ends at --duration (+ grace) whatever the child does.
    deadline = time.monotonic() + duration + DEMO_GRACE_S if duration else math.inf
    child, endpoint, log_path = start_demo(scenario, duration)
    print(f"demo: training pid {child.pid}, log {log_path}", file=sys.stderr)
    ended = threading.Event()
    try:
        if not tui:
            return _print_live(child, [endpoint], deadline)
        from gputop_dl.tui.source import ZmqSource, gather_for

        def watch_child(app: Any) -> None:
            """The demo ends with its training: at --duration, or if the child dies."""

            def wait() -> None:
                left = deadline - time.monotonic()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=max(0.0, left) if duration else None)
                if not ended.is_set():
                    with contextlib.suppress(Exception):
                        app.call_from_thread(app.exit)

            threading.Thread(target=wait, name="gputop-demo-child", daemon=True).start()

        code = run_app(
            ZmqSource(
                [endpoint],
                discover=False,
                local_sampler=False,
                gather_s=gather_for(DEFAULT_REFRESH_HZ),
            ),
            on_start=watch_child,
        )
        return code
    finally:
        ended.set()
        ended_by_itself = child.poll()
        stop_child(child)
        remove_socket(endpoint)
        if ended_by_itself in (None, 0, -signal.SIGINT):
            log_path.unlink(missing_ok=True)  # nothing to read: not left in /tmp
        else:
            _error(
                "gputop demo", f"the training ended with status {child.returncode}; see {log_path}"
            )


def remove_socket(endpoint: str) -> None:
    """The child removes its socket when it closes cleanly; not when it was killed."""
    if endpoint.startswith("ipc://"):
        with contextlib.suppress(OSError):
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)


def start_demo(
    scenario: str,
    duration: float = 0.0,
    extra: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start the demo training as a child process publishing on a private endpoint.

    The child stops by itself if this process dies (``--exit-with-parent``).
    ``launcher`` replaces ``python -m gputop_dl.tui.demo.train`` (the screenshots use it to run the
    training with simulated accelerators)."""
    endpoint = f"ipc://{discovery.runtime_dir()}/demo-{os.getpid()}-{scenario}.sock"
    log_path = Path(tempfile.gettempdir()) / f"gputop-demo-{os.getpid()}-{scenario}.log"
    env = {**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": f"demo {scenario}"}
    base = list(launcher) if launcher else [sys.executable, "-m", "gputop_dl.tui.demo.train"]
    cmd = [*base, "--scenario", scenario, "--duration", str(duration), "--exit-with-parent"]
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [*cmd, *extra], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    return child, endpoint, log_path


def stop_child(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _print_live(child: subprocess.Popen[bytes], targets: list[str], deadline: float) -> int:
    from gputop_dl.tui.snapshot import Collector, render_text

    collector = Collector(targets, local_sampler=False)
    collector.start()
    try:
        while child.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, min(3.0, deadline - time.monotonic())))
            print(render_text(collector.snapshot()), flush=True)
    finally:
        collector.stop()
    return EXIT_OK


# ------------------------------------------------------------------------- agent
def cmd_agent(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gputop agent",
        description="Publish this node's CPU, memory, disk, network, GPU and HPU samples "
        "with no training process, for remote viewers or unmodified jobs. Runs until "
        "SIGINT, SIGTERM or SIGHUP.",
        epilog=EXIT_CODES,
        formatter_class=HelpFormatter,
    )
    ap.add_argument(
        "--listen",
        metavar="ENDPOINT",
        type=listen_arg,
        help="where to listen (default: private ipc socket; e.g. tcp://127.0.0.1:5555, "
        "tcp://127.0.0.1:* for any free port). Loopback TCP is readable by every user of "
        "this host; a wildcard or network address needs keys (gputop keys) or --insecure",
    )
    ap.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a wildcard or network address: anyone who can reach it "
        "reads the samples (without keys from gputop keys; prefer those, or ssh -L)",
    )
    ap.add_argument(
        "--interval",
        type=in_range(0.1, 3600.0),
        default=1.0,
        metavar="S",
        help="seconds between samples, 0.1 to 3600 (default 1)",
    )
    ap.add_argument("--name", default=None, help="name shown by viewers")
    args = ap.parse_args(argv)
    from gputop_dl.probe.core import Probe
    from gputop_dl.probe.transport import listen_policy

    if args.listen:
        refusal, warning = listen_policy(args.listen, insecure=args.insecure, opt_in="--insecure")
        if refusal is not None:
            _error("gputop agent", refusal)
            return EXIT_USAGE
    else:
        warning = None
    # The probe's own warning speaks to a training process ("Training continues
    # unmonitored"); the agent says what happens to it instead.
    probe_log = logging.getLogger("gputop.probe")
    was_disabled, probe_log.disabled = probe_log.disabled, True
    try:
        agent = Probe(
            name=args.name or f"agent@{socket.gethostname()}",
            listen=args.listen,
            role="agent",
            sample_host=True,
            system_interval_s=args.interval,
            insecure=args.insecure,
        )
    finally:
        probe_log.disabled = was_disabled
    if not agent.enabled:
        _error("gputop agent", f"could not start, nothing is published: {agent.error}")
        return EXIT_NO_RUN
    if warning is not None:  # once bound (a port in use: only the error)
        print(f"gputop agent: warning: {warning}", file=sys.stderr)
    signals = StopSignals()  # before the line that tells a supervisor we are up
    print(f"gputop agent publishing on {agent.endpoint}", flush=True)
    signals.done.wait()
    agent.close("agent stopped")
    return signals.exit_status(EXIT_OK)


# ---------------------------------------------------------------------- snapshot
def cmd_snapshot(argv: list[str]) -> int:
    if recording.recording_arg(argv) is not None:
        return recording.cmd_snapshot_recording(argv)
    if any(arg == "--at" or arg.startswith("--at=") for arg in argv):
        _error("gputop snapshot", "--at TIME reads a recording: gputop snapshot FILE --at TIME")
        return EXIT_USAGE
    ap = argparse.ArgumentParser(
        prog="gputop snapshot",
        usage="gputop snapshot [-h] [--hosts [HOSTLIST]] [--remote-command COMMAND] "
        "[--wait SECONDS] [--json] [ENDPOINT ...]\n"
        "       gputop snapshot FILE [--at TIME] [--json]",
        description="Attach for a while, then print the runs, the host and the bottleneck "
        "verdict. For scripts, CI and terminals without a TUI. With no ENDPOINT, every "
        "probe on this host. With a recording FILE: its verdict at the end, or --at TIME.",
        epilog=EXIT_CODES_CLIENT,
        formatter_class=HelpFormatter,
    )
    ap.add_argument(
        "endpoints",
        nargs="*",
        type=_target_arg,
        metavar="ENDPOINT",
        help="probe, agent or relay to read: ipc://PATH, tcp://HOST:PORT, or "
        "ssh://[USER@]HOST[:PORT]",
    )
    _remote_arguments(ap)
    ap.add_argument(
        "--wait",
        type=in_range(*WAIT_S),
        default=5.0,
        metavar="SECONDS",
        help=f"how long to listen, {WAIT_S[0]:g} to {WAIT_S[1]:g} (default 5)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    remote, targets = _split_remote("gputop snapshot", args)
    if remote is None:
        return EXIT_USAGE
    if targets:
        targets = reachable("gputop snapshot", targets)
        if not targets and not remote:
            return EXIT_NO_RUN
    from gputop_dl.tui.snapshot import Collector, found_runs, render_text

    source = None
    if remote:
        from gputop_dl.tui.source import ZmqSource

        local = ZmqSource(targets, discover=False, local_sampler=False) if targets else None
        source = _with_remote(local, targets, remote, args)
    collector = Collector(targets, local_sampler=not _only_remote(targets), source=source)
    # Ctrl-C ends the wait and prints what came so far, then exits 130 all the same: a
    # script must not take a cut-short snapshot for a full one. Not time.sleep: a SIGINT
    # the kernel hands to one of the collector's threads would not wake it.
    interrupted = StopSignals((signal.SIGINT,))
    collector.start()
    try:
        interrupted.done.wait(args.wait)
    finally:
        interrupted.restore()
        collector.stop()
    snap = collector.snapshot()
    print(json.dumps(snap, indent=2) if args.json else render_text(snap), flush=True)
    if not snap["runs"] and not targets and (refused := runtime_dir_refused()) is not None:
        _error("gputop snapshot", refused)
    if interrupted.received == signal.SIGINT:
        return 128 + signal.SIGINT
    # An agent's node with no run is found too: its figures are what was asked for. An
    # endpoint listed for its error alone (a refused handshake) is no run reached.
    return EXIT_OK if found_runs(snap) or snap["agent_only"] else EXIT_NO_RUN


# -------------------------------------------------------------------------- list
def cmd_list(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="gputop list",
        description="List the probes and agents on this host.",
        epilog=EXIT_CODES_CLIENT,
        formatter_class=HelpFormatter,
    ).parse_args(argv)
    records = discovery.discover()
    if not records:
        if (refused := runtime_dir_refused()) is not None:
            _error("gputop list", refused)
        else:
            print(f"no probe running on this host; {INSTRUMENT_HINT}", flush=True)
        return EXIT_NO_RUN
    for r in records:
        age = time.time() - r.started
        # A record's strings are a process's own (its name, from argv or GPUTOP_NAME):
        # cleaned as the viewer cleans them, they cannot move the cursor or retitle.
        role, name, endpoint = (clean_text(t) for t in (r.role, r.name, r.endpoint))
        print(f"{r.pid:>8}  {role:<6} {name:<28} up {age:>7.0f}s  {endpoint}")
    sys.stdout.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
