"""``gputop relay``: every probe and agent of this node, republished on one endpoint.

The forwarding itself is ZeroMQ's proxy (:class:`probe.transport.Forwarder`); this
module keeps its upstreams equal to what discovery finds (re-scanned every second) and,
with ``--stdio``, writes the forwarded messages to stdout in the framing of
docs/protocol.md ("Relay stdio framing"), for a viewer that runs it over ``ssh``.
The stdio stream starts with :data:`MAGIC`; then per message a u32 big-endian frame
count, and per frame a u32 big-endian length and the bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from gputop_dl.probe import discovery
from gputop_dl.tui.stopsignals import StopSignals

MAGIC = b"GPUTOP-RELAY 1\n"  # first bytes of a stdio stream; a new framing gets a new number
MAX_FRAMES = 8  # frames per message (gputop messages have 2)
MAX_FRAME_BYTES = 8 * 1024 * 1024  # the subscriber's own limit (transport.Subscriber)
MAX_NOISE_BYTES = 64 * 1024  # what a login script may print before the magic line
RESCAN_S = 1.0
_U32 = struct.Struct(">I")


class FramingError(Exception):
    """The stdio stream is not (or no longer) a relay stream; the message says how."""


def frame_message(frames: Iterable[bytes]) -> bytes:
    """One message in the stdio framing."""
    parts = list(frames)
    if not 0 < len(parts) <= MAX_FRAMES:
        raise FramingError(f"{len(parts)} frames (1 to {MAX_FRAMES} allowed)")
    out = [_U32.pack(len(parts))]
    for part in parts:
        if len(part) > MAX_FRAME_BYTES:
            raise FramingError(f"frame of {len(part)} bytes exceeds {MAX_FRAME_BYTES}")
        out.append(_U32.pack(len(part)))
        out.append(bytes(part))
    return b"".join(out)


class FrameReader:
    """Reads the stdio framing from a binary stream (ssh's stdout). Bounded: a message
    of more than MAX_FRAMES frames or a frame over MAX_FRAME_BYTES is refused before any
    of it is read into memory."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def _exactly(self, size: int, what: str) -> bytes | None:
        """``size`` bytes; None at end of stream before the first byte."""
        data = self._stream.read(size)
        if not data:
            return None
        while len(data) < size:
            more = self._stream.read(size - len(data))
            if not more:
                raise FramingError(f"stream ended inside {what} ({len(data)} of {size} bytes)")
            data += more
        return data

    def read_magic(self) -> bytes:
        """Skip what precedes the magic line (a login script's output); return it.
        FramingError when the stream ends or MAX_NOISE_BYTES pass without it."""
        noise = b""
        while len(noise) <= MAX_NOISE_BYTES:
            line = self._stream.readline(MAX_NOISE_BYTES + 1)
            if not line:
                shown = noise.decode(errors="replace").strip()[-200:]
                raise FramingError(
                    "the remote command ended before starting a relay stream"
                    + (f"; it printed: {shown}" if shown else "")
                )
            if line == MAGIC:
                return noise
            noise += line
        raise FramingError("no relay stream: the remote command printed other output")

    def read_message(self) -> list[bytes] | None:
        """The next message's frames; None at a clean end of stream."""
        head = self._exactly(4, "a frame count")
        if head is None:
            return None
        (count,) = _U32.unpack(head)
        if not 0 < count <= MAX_FRAMES:
            raise FramingError(f"bad frame count {count} (1 to {MAX_FRAMES} allowed)")
        frames = []
        for _ in range(count):
            size_bytes = self._exactly(4, "a frame length")
            if size_bytes is None:
                raise FramingError("stream ended inside a message")
            (size,) = _U32.unpack(size_bytes)
            if size > MAX_FRAME_BYTES:
                raise FramingError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
            data = self._exactly(size, "a frame") if size else b""
            if data is None:
                raise FramingError("stream ended inside a message")
            frames.append(data)
        return frames


def upstreams(records: Iterable[discovery.Record], own_pid: int) -> set[str]:
    """The endpoints a relay listens to: every probe and agent, never a relay (itself
    or another: that would loop messages)."""
    return {r.endpoint for r in records if r.role != "relay" and r.pid != own_pid}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def cmd_relay(argv: list[str]) -> int:
    from gputop_dl.tui.cli import (
        EXIT_CODES,
        EXIT_NO_RUN,
        EXIT_OK,
        EXIT_USAGE,
        HelpFormatter,
        listen_arg,
    )
    from gputop_dl.tui.cli import _error as error

    ap = argparse.ArgumentParser(
        prog="gputop relay",
        description="Republish every probe and agent of this node on one endpoint (a "
        "private ipc socket by default, registered so that gputop finds it), or with "
        "--stdio on stdout for a viewer that runs it over ssh (gputop ssh://HOST, "
        "gputop --hosts). Runs until SIGINT, SIGTERM or SIGHUP; with --stdio also until "
        "its input ends or its output is closed.",
        epilog=EXIT_CODES,
        formatter_class=HelpFormatter,
    )
    ap.add_argument(
        "--listen",
        metavar="ENDPOINT",
        type=listen_arg,
        help="where to republish (default: a private ipc socket). A network address "
        "requires CURVE keys (gputop keys) or --insecure",
    )
    ap.add_argument(
        "--stdio", action="store_true", help="write the messages to stdout (framed) instead"
    )
    ap.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a network address without keys: anyone who can reach it "
        "reads every run of this node",
    )
    args = ap.parse_args(argv)
    if args.stdio and args.listen:
        error("gputop relay", "--stdio and --listen exclude each other")
        return EXIT_USAGE
    from gputop_dl.probe.transport import Forwarder, TransportError, listen_policy

    listen: str | None = None
    if not args.stdio:
        try:
            listen = args.listen or discovery.ipc_endpoint(os.getpid())
        except discovery.DiscoveryError as exc:
            error("gputop relay", f"cannot use the runtime directory ({exc})")
            return EXIT_NO_RUN
        insecure = args.insecure or os.environ.get("GPUTOP_INSECURE", "") == "1"
        refusal, warning = listen_policy(listen, insecure=insecure, opt_in="--insecure")
        if refusal is not None:
            error("gputop relay", refusal)
            return EXIT_USAGE
    else:
        warning = None
    try:
        forwarder = Forwarder(listen)
    except TransportError as exc:
        error("gputop relay", str(exc))
        return EXIT_NO_RUN
    if warning is not None:  # once bound (a port in use: only the error)
        print(f"gputop relay: warning: {warning}", file=sys.stderr)
    signals = StopSignals()
    done = signals.done
    registered = False
    try:
        if args.stdio:
            _watch_stdin(done)
            _stdio_loop(forwarder, done)
        else:
            discovery.register(
                discovery.Record(
                    endpoint=forwarder.endpoint,
                    pid=os.getpid(),
                    host=socket.gethostname(),
                    name=f"relay@{socket.gethostname()}",
                    role="relay",
                    started=time.time(),
                )
            )
            registered = True
            print(f"gputop relay publishing on {forwarder.endpoint}", flush=True)
            while not done.is_set():
                forwarder.set_upstreams(upstreams(discovery.discover(), os.getpid()))
                done.wait(RESCAN_S)
    except BrokenPipeError:
        pass  # the reader went away: that is how a --stdio relay is meant to end
    finally:
        if registered:
            discovery.unregister(os.getpid())
        forwarder.close()
    return signals.exit_status(EXIT_OK)


def _watch_stdin(done: threading.Event) -> None:
    """End the relay when its input ends: ssh closes it when the viewer goes."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(sys.stdin.fileno(), 4096):
                pass
        done.set()

    threading.Thread(target=watch, name="gputop-relay-stdin", daemon=True).start()


def _stdio_loop(forwarder: Any, done: threading.Event) -> None:
    """Discovery once a second; in between, what the proxy forwards goes to stdout."""
    fd = sys.stdout.fileno()
    _write_all(fd, MAGIC)
    last_scan = 0.0
    while not done.is_set():
        now = time.monotonic()
        if now - last_scan >= RESCAN_S:
            last_scan = now
            forwarder.set_upstreams(upstreams(discovery.discover(), os.getpid()))
        messages = forwarder.receive(0.1)
        chunks = []
        for message in messages:
            with contextlib.suppress(FramingError):  # not a gputop message: not forwarded
                chunks.append(frame_message(message))
        if chunks:
            _write_all(fd, b"".join(chunks))


__all__ = ["MAGIC", "FrameReader", "FramingError", "cmd_relay", "frame_message", "upstreams"]
