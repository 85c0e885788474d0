"""What a data source hands the viewer. Produced on a background thread, applied to the
viewer state on the UI thread (see ``tui.source`` for the real source, tests use fakes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from gputop_dl.probe.messages import Message


class Received(msgspec.Struct, frozen=True, gc=False):
    """A decoded message. ``received`` is the viewer's Unix time of arrival.

    One per message, made on the source's thread: a Struct is made several times faster
    than a frozen dataclass. Not tracked by the garbage collector: a message holds no
    reference back to anything that could hold this.
    """

    message: Message
    received: float


@dataclass(frozen=True)
class BadInput:
    """Something arrived that could not be decoded. ``text`` says what, for the user.

    ``theirs`` is set for an incompatible protocol version: (major, minor) of the peer.
    """

    text: str
    received: float
    theirs: tuple[int, int] | None = None
    source_hint: str | None = None  # the peer's "<host>:<pid>" when it could be read


@dataclass(frozen=True)
class EndpointState:
    """The source started (or stopped) listening to an endpoint, or could not."""

    endpoint: str
    state: str  # "connecting", "detached", "error"
    detail: str = ""
    name: str | None = None  # run name from discovery, when known
    pid: int | None = None  # its process on this host, from discovery, when known


SourceEvent = Received | BadInput | EndpointState
Emit = Callable[[list[SourceEvent]], None]


class Source(Protocol):
    """A stream of events. ``start`` returns at once; ``emit`` is then called from a
    background thread with batches of events until ``stop``."""

    def start(self, emit: Emit) -> None: ...

    def stop(self) -> None: ...


class ThreadSource:
    """A source whose ``_run(emit)`` runs on one daemon thread until ``_stop`` is set."""

    thread_name = "gputop-source"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(emit,), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self, emit: Emit) -> None:
        raise NotImplementedError
