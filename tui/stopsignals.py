"""How the long-running commands (agent, relay, exporter, record) are stopped.

SIGINT is how people stop them by hand (exit 0); SIGTERM and SIGHUP come from a
supervisor or a lost terminal and give 128 + n, as for any process ended by a signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Handlers for ``signals`` that set :attr:`done`; the first signal decides the exit
    status. Install before telling anyone the command is up: a signal sent on reading
    that line must find these handlers, not Python's KeyboardInterrupt. Call from the
    main thread.

    Python runs a handler only in the main thread, and only once that thread runs
    bytecode again; the kernel may deliver the signal to any thread, and then a main
    thread asleep in ``done.wait()`` is never woken (an agent ignored SIGINT this way).
    So the signal's number goes down a pipe (``signal.set_wakeup_fd``, written by the C
    handler in whichever thread took the signal) and a thread asleep on that pipe sets
    :attr:`done`. Neither handler takes a lock: the main thread may hold the event's."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.done = threading.Event()
        self.received: int | None = None
        self._signals = frozenset(int(sig) for sig in signals)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a flood of signals never blocks a handler
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in signals}
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        threading.Thread(
            target=self._relay, args=(self._read_fd,), name="gputop-stop-signals", daemon=True
        ).start()

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        # No ``done.set()`` here: the pipe's thread does it (see the class's docstring).
        if self.received is None:
            self.received = sig

    def _relay(self, read_fd: int) -> None:
        """Stop on the first of our signals; end quietly when the pipe is closed."""
        try:
            while chunk := os.read(read_fd, 64):
                ours = [sig for sig in chunk if sig in self._signals]
                if ours:
                    if self.received is None:
                        self.received = ours[0]
                    self.done.set()
                    return
        except OSError:
            pass
        finally:
            os.close(read_fd)

    def exit_status(self, ok: int = 0) -> int:
        """``ok`` when stopped by hand (SIGINT) or not by a signal, else 128 + n."""
        if self.received is None or self.received == signal.SIGINT:
            return ok
        return 128 + self.received

    def restore(self) -> None:
        """Put back the handlers and the wake-up pipe that were there before (the pipe's
        thread then ends)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        with contextlib.suppress(OSError):
            os.close(self._write_fd)
