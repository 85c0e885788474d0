"""How the long-running commands (agent, relay, exporter, record) are stopped.

SIGINT is how people stop them by hand (exit 0); SIGTERM and SIGHUP come from a
supervisor or a lost terminal and give 128 + n, as for any process ended by a signal.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Handlers for ``signals`` that set :attr:`done`; the first signal decides the exit
    status. Install before telling anyone the command is up: a signal sent on reading
    that line must find these handlers, not Python's KeyboardInterrupt."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.done = threading.Event()
        self.received: int | None = None
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in signals}

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = sig
        self.done.set()

    def exit_status(self, ok: int = 0) -> int:
        """``ok`` when stopped by hand (SIGINT) or not by a signal, else 128 + n."""
        if self.received is None or self.received == signal.SIGINT:
            return ok
        return 128 + self.received

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
