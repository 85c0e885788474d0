"""Textual's Linux driver, made safe for a viewer left running on a training node.

Two guards, both without touching site-packages:

- **End of input.** Textual's input thread loops on ``select`` + ``read``; when stdin
  reaches EOF (an SSH connection that dropped without SIGHUP, a closed pty) ``select``
  returns at once and ``read`` gives ``b""`` for ever: 100 % of a core. Here the input loop
  stops on EOF or a read error (EBADF, EIO) and asks the app to exit. Drop this override
  when Textual ships the fix (upstream Textualize/textual PR #6690) and raise the
  ``viewer`` extra's lower bound in pyproject.toml to that release.
- **Idle input.** Upstream's input thread wakes ten times a second to poll an idle
  terminal. Here it sleeps until a key, a shutdown (``exit_event`` also writes to a wake
  pipe) or, only while the parser may hold a lone ESC, its escape delay.
- **Signals.** SIGTERM, SIGHUP and SIGINT exit the app through its normal shutdown, so the
  terminal is restored (alternate screen off, mouse tracking off, cursor shown), with exit
  status 128 + the signal number. A second signal while that shutdown hangs restores the
  terminal by hand and exits at once. The output thread is stopped with a bounded wait: a
  viewer whose pane tmux destroyed (SIGHUP, then SIGCONT) hung in its shutdown for ever.
- **Job control.** Ctrl-Z suspends the viewer as in ``top`` (the terminal is given back to
  the shell) and ``fg`` redraws it in full. A viewer started in the background (``gputop
  &``) stops on its first touch of the terminal (SIGTTOU, as upstream) and sets up its
  screen on the SIGCONT of ``fg``. A SIGCONT restarts the screen only when it is not up
  (after a suspend, or a start that found no terminal) and no exit has begun, so a stray
  one (tmux destroying a pane, systemd after SIGTERM) never starts a second writer. The
  SIGCONT is taken through the event loop's signal pipe, after any exit signal sent with
  it (``kill %1`` sends SIGTERM then SIGCONT to a stopped job), and the exit signals stay
  handled while the screen is down, so a stopped or background viewer ends quietly too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import selectors
import signal
import threading
import weakref
from codecs import getincrementaldecoder
from collections.abc import Callable
from typing import Any

from textual import constants, events
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
# What stop_application_mode writes, for the case where it cannot run: mouse tracking off
# (every mode Textual turns on), bracketed paste off, line wrap on, alternate screen off,
# cursor shown.
RESTORE = (
    "\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?1016l"
    "\x1b[?2004l\x1b[?7h\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l"
)
INPUT_ENDED = 0  # exit status when the terminal's input ends (a clean stop, nothing failed)
CLOSE_WAIT_S = 1.0  # at most this long for the output thread to take its stop, and to end
POLL_S = 0.1  # upstream's select timeout: kept only while the parser may wait for a key
STOP_AGAIN_S = 0.25  # continued in the background: time for a signal sent with the SIGCONT


class WakingEvent(threading.Event):
    """An Event whose ``set`` also makes a pipe readable, so that a thread blocked in
    ``select`` on :attr:`wake_fd` sees it at once (``clear`` empties the pipe again)."""

    def __init__(self) -> None:
        super().__init__()
        self.wake_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close_fds, self.wake_fd, self._write_fd)

    def set(self) -> None:
        super().set()
        with contextlib.suppress(OSError):  # full: already readable
            os.write(self._write_fd, b"x")

    def clear(self) -> None:
        super().clear()
        with contextlib.suppress(OSError):  # empty
            while os.read(self.wake_fd, 4096):
                pass


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class GuardedDriver(LinuxDriver):
    """LinuxDriver that stops reading at end of input, exits on SIGTERM/SIGHUP/SIGINT and
    suspends on Ctrl-Z (see the module's docstring)."""

    exit_signal: int | None = None
    _previous_handlers: dict[int, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exit_event = WakingEvent()  # wakes the input thread on shutdown
        self._previous_handlers = {}
        self._suspending = False  # stop_application_mode called by a suspend, not the exit
        self._finished = False  # the app's own stop_application_mode ran: never resume

    @property
    def in_application_mode(self) -> bool:
        """Whether the screen is up: an output thread runs. It is down before the start,
        after a start that found no terminal (a background job: SIGTTOU), during a suspend
        and after :meth:`close`."""
        return self._writer_thread is not None

    def start_application_mode(self) -> None:
        # The handlers first: a viewer started in the background stops (SIGTTOU) inside
        # upstream's start, and a signal sent to it there must find them.
        self._install_signal_handlers()
        super().start_application_mode()

    def _install_signal_handlers(self) -> None:
        if self._previous_handlers:  # a resume: still in place from the first start
            return
        loop = asyncio.get_running_loop()
        for sig in (*EXIT_SIGNALS, signal.SIGCONT):
            self._previous_handlers[sig] = signal.getsignal(sig)
            handler = self._on_sigcont if sig == signal.SIGCONT else self._on_exit_signal
            loop.add_signal_handler(sig, handler, sig)

    def stop_application_mode(self) -> None:
        if not self._suspending:  # the app's exit: the handlers go with the screen
            self._finished = True
            self._remove_signal_handlers()
        if self.in_application_mode:  # else nothing was set up, and nothing can be written
            super().stop_application_mode()

    def _remove_signal_handlers(self) -> None:
        previous, self._previous_handlers = self._previous_handlers, {}
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                # remove_signal_handler leaves SIG_DFL: put back what was there before,
                # so a signal during the caller's own cleanup is handled as it expects.
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def suspend_application_mode(self) -> None:
        """Ctrl-Z (through :meth:`_sigtstp_application`) or ``App.suspend``: the screen
        goes down, the exit signals stay handled."""
        self._suspending = True
        try:
            super().suspend_application_mode()
        finally:
            self._suspending = False

    def _sigtstp_application(self, *args: Any) -> None:
        if self.in_application_mode and not self._finished:
            super()._sigtstp_application(*args)  # suspend, then SIGSTOP
        else:  # no screen to take down (not up yet, or the exit has begun): just stop
            os.kill(os.getpid(), signal.SIGSTOP)

    def _sigcont_application(self, *args: Any) -> None:
        # Upstream's SIGCONT handler, run by Python in the middle of whatever the main
        # thread was doing, started application mode again on every SIGCONT. SIGCONT is
        # taken by the loop instead (_on_sigcont); this one only runs before the first
        # start, when there is nothing to resume.
        return

    def _on_sigcont(self, _sig: int) -> None:
        """On the loop: set the screen up again if it is down and the app is not on its
        way out, once the viewer is in the foreground (``fg``). Continued in the
        background (``bg``, or ``kill %1``: bash sends SIGCONT and SIGTERM in either
        order), it stops again after :data:`STOP_AGAIN_S`, unless a signal that came with
        the SIGCONT has begun the exit by then. Upstream's start would stop at once on
        SIGTTOU, before that signal is seen: stopped for ever, SIGTERM pending."""
        if not self._may_resume():
            return
        foreground = _in_foreground(self.fileno)
        if foreground:
            self.resume_application_mode()
            if self.in_application_mode:
                # A new alternate screen is blank: paint it all, not only what changed.
                self._app.refresh(layout=True)
        elif foreground is False:
            self._loop.call_later(STOP_AGAIN_S, self._stop_if_background)
        # None: the terminal is gone (a pane destroyed: SIGHUP comes too); nothing to do.

    def _may_resume(self) -> bool:
        return not (
            self.in_application_mode
            or not self._auto_restart  # App.suspend: the app resumes itself
            or self._finished
            or self.exit_signal is not None
            or self._app._exit
        )

    def _stop_if_background(self) -> None:
        if self._may_resume() and _in_foreground(self.fileno) is False:
            os.kill(os.getpid(), signal.SIGSTOP)  # as upstream's start does on SIGTTOU

    def disable_input(self) -> None:
        # Only with the screen up: down, no input thread runs, and upstream's tcflush from
        # a background job stops it on SIGTTOU (a stopped `gputop &` sent SIGTERM stopped
        # again in its shutdown, for ever).
        if self.in_application_mode:
            super().disable_input()

    def write(self, data: str) -> None:
        """Upstream's write, dropped while the screen is down (upstream asserts): the app
        may paint before a start that found no terminal is retried, and the resume
        repaints everything."""
        writer = self._writer_thread
        if writer is not None:
            writer.write(data)

    def process_message(self, message: Message) -> None:
        # Upstream leaves Ctrl-Z to an app binding; this viewer suspends on it as top does.
        # Called on the input thread: the suspend joins that thread, so the loop runs it.
        if isinstance(message, events.Key) and message.key == "ctrl+z":
            self._loop.call_soon_threadsafe(self._app.action_suspend_process)
            return
        super().process_message(message)

    def close(self) -> None:
        """Stop the output thread, waiting a bounded time: a writer whose terminal is gone
        (its thread ended on EIO, or blocks in write) would never take the stop from its
        full queue. The thread is a daemon: the process exits without it."""
        writer = self._writer_thread
        if writer is None:
            return
        self._writer_thread = None
        with contextlib.suppress(queue.Full):
            writer._queue.put(None, timeout=CLOSE_WAIT_S)  # what WriterThread.stop puts
        writer.join(CLOSE_WAIT_S)

    def _on_exit_signal(self, sig: int) -> None:
        if self.exit_signal is not None:  # the first one's shutdown is stuck: leave now
            _restore_terminal()
            os._exit(128 + sig)
        self.exit_signal = sig
        self._app.exit(return_code=128 + sig)

    def run_input_thread(self) -> None:
        """Upstream's input loop, ending at EOF or on a read error instead of spinning,
        and asleep while there is nothing to read (see :func:`select_timeout`)."""
        exit_event = self.exit_event
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        # Without a wake pipe, upstream's timeout polls for the exit event.
        wakes = isinstance(exit_event, WakingEvent)
        if isinstance(exit_event, WakingEvent):
            selector.register(exit_event.wake_fd, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode: Callable[..., str] = getincrementaldecoder("utf-8")().decode
        fed_at = ticked_at = get_time()
        try:
            while not exit_event.is_set():
                timeout = select_timeout(fed_at, ticked_at, wakes)
                ready = [key for key, _ in selector.select(timeout) if key.fd == self.fileno]
                if ready:
                    try:
                        data = os.read(self.fileno, 4096)
                    except OSError:
                        data = b""
                    if not data:
                        self._end_of_input()
                        return
                    for event in parser.feed(decode(data)):
                        self.process_message(event)
                    fed_at = get_time()
                ticked_at = get_time()
                for event in parser.tick():
                    self.process_message(event)
        finally:
            selector.close()
            with contextlib.suppress(Exception):
                for _ in parser.feed(""):
                    pass

    def _end_of_input(self) -> None:
        """Called on the input thread: nobody can type any more, so exit (never block)."""
        self._loop.call_soon_threadsafe(self._app.exit, None, INPUT_ENDED)


def select_timeout(fed_at: float, ticked_at: float, wakes: bool) -> float | None:
    """How long the input thread may wait for input: for ever (None) once the parser's
    ``tick`` has run ESCAPE_DELAY after the last input (a lone ESC it held is out by then,
    nothing else is pending), else POLL_S as upstream. Without a wake pipe the shutdown
    is only seen by polling: POLL_S."""
    if wakes and ticked_at >= fed_at + constants.ESCAPE_DELAY:
        return None
    return POLL_S


def _in_foreground(fd: int) -> bool | None:
    """Whether this process's group owns the terminal ``fd`` (True when ``fd`` is not a
    terminal: upstream's start then runs as it is); None when the terminal is gone."""
    try:
        if not os.isatty(fd):
            return True
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return None


def _restore_terminal() -> None:
    for fd in (2, 1):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                os.write(fd, RESTORE.encode())
                return
