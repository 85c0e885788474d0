"""Remote nodes over the user's own ``ssh``: ``gputop ssh://[user@]host[:port]`` and
``gputop --hosts node[01-16]``.

Per host a thread runs ``ssh -T -o BatchMode=yes ... host gputop relay --stdio`` (the
user's config, agent and ProxyJump apply; no port is opened anywhere), reads the framed
stream (tui.relay), decodes each message and hands events to one emitter thread, which
passes them on in batches. Each host's link state goes out as an :class:`EndpointState`
whose endpoint is ``ssh://...``: connecting, live, or a failure (auth failed, gputop not
installed there, unreachable, lost) followed by a reconnect after a capped backoff.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import queue
import re
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.tui.events import BadInput, Emit, EndpointState, Received, Source, SourceEvent
from gputop_dl.tui.relay import FrameReader, FramingError
from gputop_dl.tui.source import event_of

ENV_REMOTE_COMMAND = "GPUTOP_REMOTE_COMMAND"
ENV_SSH = "GPUTOP_SSH"  # the ssh program (default: ssh on PATH)
DEFAULT_REMOTE_COMMAND = "gputop relay --stdio"
SSH_OPTIONS = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=10",  # a host that drops packets fails in 10 s, not the kernel's ~2 min
)
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # waits before reconnecting, then the last
EMIT_EVERY_S = 0.1
QUEUE_MAX = 20_000  # events waiting for the emitter; a full queue slows the ssh reader
STDERR_KEPT = 4096  # bytes of ssh's stderr kept for the failure message
STOP_GRACE_S = 2.0
# ssh handshakes in progress at once: sshd's MaxStartups (default 10:30:100) starts
# dropping unauthenticated connections past 10, and a jump host sees every node's. The
# rest wait their turn ("connecting"); a live session holds no slot.
HANDSHAKES_AT_ONCE = 10
HANDSHAKE_HOLD_S = 15.0  # a slot is given back after this long, whatever ssh is doing

CONNECTING, LIVE = "connecting", "live"
AUTH_FAILED, NOT_INSTALLED = "auth failed", "not installed"
UNREACHABLE, LOST = "unreachable", "lost"
FAILURES = (AUTH_FAILED, NOT_INSTALLED, UNREACHABLE, LOST)


@dataclass(frozen=True)
class Target:
    """One remote host as ssh takes it."""

    host: str
    user: str | None = None
    port: int | None = None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def endpoint(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"ssh://{self.destination}{port}"


def parse_ssh_url(text: str) -> Target:
    """``ssh://[user@]host[:port]``; ValueError saying what is wrong."""
    if not text.startswith("ssh://"):
        raise ValueError(f"{text!r} is not an ssh:// address")
    rest = text.removeprefix("ssh://").rstrip("/")
    user, at, hostport = rest.rpartition("@")
    host, port_text = hostport, ""
    if hostport.startswith("["):  # ssh://[::1]:22
        host, _, tail = hostport[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    if not host or host.startswith("-") or any(c.isspace() or c in "/@" for c in host):
        raise ValueError(f"{text!r}: no usable host (expected ssh://[user@]host[:port])")
    if at and (not user or user.startswith("-") or any(c.isspace() for c in user)):
        raise ValueError(f"{text!r}: bad user name")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return Target(host, user or None, port)


def remote_command(override: str | None = None) -> str:
    """What runs on the node: --remote-command, else $GPUTOP_REMOTE_COMMAND, else
    ``gputop relay --stdio``."""
    return override or os.environ.get(ENV_REMOTE_COMMAND) or DEFAULT_REMOTE_COMMAND


def ssh_command(target: Target, command: str, ssh: str | None = None) -> list[str]:
    program = shlex.split(ssh or os.environ.get(ENV_SSH) or "ssh")
    port = ["-p", str(target.port)] if target.port is not None else []
    # "--" keeps a host name from being read as an option.
    return [*program, *SSH_OPTIONS, *port, "--", target.destination, command]


def classify(host: str, status: int | None, stderr: str, command: str) -> tuple[str, str]:
    """(state, what to tell the user) after ssh ended with ``status`` and ``stderr``.

    255 is ssh's own failure; 127 (or the shell's "not found") is the remote command
    missing; anything else is the relay ending, taken as the link lost."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    lowered = stderr.lower()
    if status == 127 or "command not found" in lowered or ": not found" in lowered:
        program = shlex.split(command)[0] if command.strip() else command
        return NOT_INSTALLED, (
            f"{host}: {program} not found there ({last or 'exit status 127'}); install it "
            f"on {host} (pip install /path/to/gputop, or its wheel) or name it with "
            "--remote-command "
            f"'/path/to/venv/bin/gputop relay --stdio' (or ${ENV_REMOTE_COMMAND})"
        )
    if status == 255:
        if "permission denied" in lowered or "host key verification failed" in lowered:
            return AUTH_FAILED, f"{host}: {last}"
        return UNREACHABLE if "closed by remote host" not in lowered else LOST, (
            f"{host}: {last or 'ssh failed (exit status 255)'}"
        )
    detail = f"exit status {status}" if status is not None else "ended"
    return LOST, f"{host}: relay {detail}" + (f": {last}" if last else "")


class _Host:
    """One host's ssh process and reader thread."""

    def __init__(self, target: Target, source: RemoteSource) -> None:
        self.target = target
        self.source = source
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: deque[bytes] = deque()
        self.thread = threading.Thread(
            target=self.run, name=f"gputop-ssh-{target.host}", daemon=True
        )
        self._last_error: dict[str, float] = {}

    def state(self, state: str, detail: str = "") -> None:
        self.source.put(EndpointState(self.target.endpoint, state, detail, self.target.host))

    def run(self) -> None:
        failures = 0
        stop = self.source.stopped
        while not stop.is_set():
            if failures == 0:  # a retry keeps showing why the last attempt failed
                self.state(CONNECTING)
            went_live = self.once()
            if stop.is_set():
                break
            failures = 0 if went_live else failures + 1
            wait = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
            stop.wait(wait)

    def once(self) -> bool:
        """One ssh session, to its end; True if the stream started."""
        command = self.source.command
        if not self.source.handshake_slot():
            return False  # stopped while waiting for one
        slot = [True]  # held until the stream starts, the attempt ends or the hold ends
        lock = threading.Lock()

        def release() -> None:
            with lock:
                if slot:
                    slot.clear()
                    self.source.handshakes.release()

        # A host that never answers (or an sshd that never greets) holds no slot for
        # long: past the connect timeout and a login's grace the others' turn comes.
        timer = threading.Timer(HANDSHAKE_HOLD_S, release)
        timer.daemon = True
        timer.start()

        try:
            proc = subprocess.Popen(
                ssh_command(self.target, command, self.source.ssh),
                stdin=subprocess.PIPE,  # never written: its end tells the relay to stop
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # no controlling terminal: ssh cannot touch the TUI's
            )
        except OSError as exc:
            release()
            self.state(UNREACHABLE, f"{self.target.host}: cannot run ssh: {exc.strerror or exc}")
            return False
        self.proc = proc
        self.stderr.clear()
        err_thread = threading.Thread(target=self._read_stderr, args=(proc,), daemon=True)
        err_thread.start()
        assert proc.stdout is not None
        reader = FrameReader(proc.stdout)
        live = False
        problem = ""
        try:
            reader.read_magic()
            release()
            live = True
            self.state(LIVE)
            while not self.source.stopped.is_set():
                frames = reader.read_message()
                if frames is None:
                    break
                event = self._decode(frames)
                if event is not None:
                    self.source.put(event)
        except FramingError as exc:
            problem = str(exc)
        except (OSError, ValueError):
            pass  # the pipe closed under us (stop)
        finally:
            timer.cancel()
            release()
        self._end(proc)
        err_thread.join(timeout=1.0)
        if self.source.stopped.is_set():
            return live
        stderr = b"".join(self.stderr).decode(errors="replace")
        state, detail = classify(self.target.host, proc.returncode, stderr, command)
        if live:
            state = LOST  # it was streaming: whatever ended it, the link was lost
        if problem and not (state == NOT_INSTALLED or proc.returncode == 255):
            detail = f"{self.target.host}: {problem}"
        self.state(state, detail)
        return live

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        fd = proc.stderr.fileno()
        kept = 0
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: os.read(fd, 4096), b""):
                self.stderr.append(chunk)
                kept += len(chunk)
                while kept > STDERR_KEPT and len(self.stderr) > 1:
                    kept -= len(self.stderr.popleft())

    def _decode(self, frames: list[bytes]) -> Received | BadInput | None:
        return event_of(
            frames, time.time(), self._last_error, time.monotonic(), f"{self.target.host}: "
        )

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        """Close ssh's input (the relay ends by itself), then make sure it is gone."""
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=STOP_GRACE_S if self.source.stopped.is_set() else 0.5)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError, ValueError):
            if proc.stdout is not None:
                proc.stdout.close()

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()


class RemoteSource:
    """Every given host's relay, over ssh. ``command`` runs on each host."""

    def __init__(
        self, targets: Sequence[Target], *, command: str | None = None, ssh: str | None = None
    ) -> None:
        self.targets = list(dict.fromkeys(targets))
        self.command = remote_command(command)
        self.ssh = ssh
        self.stopped = threading.Event()
        self._queue: queue.Queue[SourceEvent] = queue.Queue(QUEUE_MAX)
        self._hosts = [_Host(t, self) for t in self.targets]
        self.handshakes = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)
        self._emitter: threading.Thread | None = None

    def put(self, event: SourceEvent) -> None:
        """From a host thread: wait while the queue is full (ssh's pipe then fills and
        the relay drops, as a slow subscriber's publisher does)."""
        while not self.stopped.is_set():
            try:
                self._queue.put(event, timeout=0.2)
                return
            except queue.Full:
                continue

    def handshake_slot(self) -> bool:
        """Wait for one of the HANDSHAKES_AT_ONCE slots; False if stopped meanwhile."""
        while not self.stopped.is_set():
            if self.handshakes.acquire(timeout=0.2):
                return True
        return False

    def start(self, emit: Emit) -> None:
        self._emitter = threading.Thread(
            target=self._emit_loop, args=(emit,), name="gputop-remote", daemon=True
        )
        self._emitter.start()
        for host in self._hosts:
            host.thread.start()

    def _emit_loop(self, emit: Emit) -> None:
        while not self.stopped.is_set():
            batch: list[SourceEvent] = []
            with contextlib.suppress(queue.Empty):
                batch.append(self._queue.get(timeout=EMIT_EVERY_S))
                while len(batch) < QUEUE_MAX:
                    batch.append(self._queue.get_nowait())
            if batch:
                emit(batch)

    def stop(self) -> None:
        self.stopped.set()
        for host in self._hosts:
            host.kill()
        for host in self._hosts:
            host.thread.join(timeout=STOP_GRACE_S + 1.0)
        if self._emitter is not None:
            self._emitter.join(timeout=1.0)


class CompositeSource:
    """Several sources as one (local discovery and remote hosts together)."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)

    def start(self, emit: Emit) -> None:
        for source in self.sources:
            source.start(emit)

    def stop(self) -> None:
        for source in self.sources:
            source.stop()


__all__ = [
    "AUTH_FAILED",
    "CONNECTING",
    "LIVE",
    "LOST",
    "NOT_INSTALLED",
    "UNREACHABLE",
    "CompositeSource",
    "RemoteSource",
    "Target",
    "classify",
    "parse_ssh_url",
    "remote_command",
    "ssh_command",
]


# ------------------------------------------------------------------ command line
ENV_NODELIST = "SLURM_JOB_NODELIST"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The viewer's and snapshot's remote options."""
    ap.add_argument(
        "--hosts",
        nargs="?",
        const="",
        metavar="HOSTLIST",
        help="watch these nodes over ssh, in Slurm syntax (node[01-16],gpu[1-2]); with no "
        f"value, ${ENV_NODELIST}. Each runs: ssh -T -o BatchMode=yes HOST "
        f"{DEFAULT_REMOTE_COMMAND}",
    )
    ap.add_argument(
        "--remote-command",
        metavar="COMMAND",
        help=f"what ssh runs on each node (default ${ENV_REMOTE_COMMAND} or "
        f"'{DEFAULT_REMOTE_COMMAND}'), e.g. '~/venv/bin/gputop relay --stdio'",
    )


def target_arg(text: str) -> str:
    """An argparse type for a positional target: an ssh:// address or an endpoint."""
    if text.startswith("ssh://"):
        try:
            parse_ssh_url(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    from gputop_dl.tui.cli import COMMANDS, endpoint_arg

    try:
        return endpoint_arg(text)
    except argparse.ArgumentTypeError as exc:
        # What the user likely meant: a command mistyped, a tcp:// left out.
        close = difflib.get_close_matches(text, COMMANDS, n=1, cutoff=0.75)
        if close:
            hint = f"did you mean the command: gputop {close[0]}?"
        elif "://" not in text and re.fullmatch(r"[\w.\-\[\]:]+:\d+", text):
            hint = f"did you mean tcp://{text}?"
        else:
            hint = "ssh://[USER@]HOST[:PORT] and a recording FILE are read too"
        raise argparse.ArgumentTypeError(f"{exc}; {hint}") from None


def remote_targets(texts: Sequence[str], hosts: str | None) -> list[Target]:
    """The ssh targets among the positional ``texts`` and ``--hosts``; ValueError
    (the message for the user) when --hosts has no list to read."""
    from gputop_dl.tui.hostlist import expand

    targets = [parse_ssh_url(t) for t in texts if t.startswith("ssh://")]
    if hosts is not None:
        text = hosts or os.environ.get(ENV_NODELIST, "")
        if not text:
            raise ValueError(f"--hosts needs a host list (node[01-16]) or ${ENV_NODELIST}")
        targets.extend(Target(host) for host in expand(text))
    return list(dict.fromkeys(targets))


def build_source(
    endpoints: list[str], targets: list[Target], command: str | None, local: Source | None
) -> Source:
    """The remote hosts' source, with ``local`` (endpoints, discovery) when given."""
    remote = RemoteSource(targets, command=command)
    return remote if local is None else CompositeSource([local, remote])
