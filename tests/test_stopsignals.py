"""The long-running commands' stop signals (tui/stopsignals.py), in a child process:
a handler that hangs would hang the test runner otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The handler runs in the main thread between two bytecodes: here, while that thread
# holds the event's own lock, as it does for an instant inside ``done.wait()``. A handler
# that called ``done.set()`` there waited for itself forever (an agent hung this way when
# SIGINT came just as it began to wait: CI, test_security).
SIGNAL_INSIDE_WAIT = """
import os, signal, sys
from gputop_dl.tui.stopsignals import StopSignals
signals = StopSignals()
with signals.done._cond:
    os.kill(os.getpid(), signal.{sig})
print(signals.done.wait(10), signals.exit_status(0))
"""

# The kernel may hand a process's signal to any thread; then nothing wakes a main thread
# asleep in ``done.wait()`` (Python runs handlers there only between bytecodes): an agent
# ignored SIGINT this way (CI, test_security). Here another thread takes it, on purpose.
SIGNAL_TO_ANOTHER_THREAD = """
import signal, threading, time
from gputop_dl.tui.stopsignals import StopSignals
signals = StopSignals()
def take_it():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.{sig})
threading.Thread(target=take_it).start()
print(signals.done.wait(10), signals.exit_status(0))
"""

# Other signals with a Python handler go down the same pipe: a flood of them neither
# stops the command nor blocks a handler; the stop signal after them still does.
FLOOD = """
import os, signal
from gputop_dl.tui.stopsignals import StopSignals
signals = StopSignals()
signal.signal(signal.SIGUSR1, lambda *_: None)
for _ in range(20_000):
    os.kill(os.getpid(), signal.SIGUSR1)
stopped_early = signals.done.wait(0.5)
os.kill(os.getpid(), signal.SIGTERM)
print(stopped_early, signals.done.wait(10), signals.exit_status(0))
"""

RESTORED = """
import os, signal, threading, time
from gputop_dl.tui.stopsignals import StopSignals
signals = StopSignals((signal.SIGTERM,))
signals.restore()
time.sleep(0.2)
alive = [t.name for t in threading.enumerate() if t.name == "gputop-stop-signals"]
print(signals.done.is_set(), alive, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def _run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 0), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_while_the_main_thread_holds_the_event_s_lock_stops_it(
    sig: str, status: int
) -> None:
    assert _run(SIGNAL_INSIDE_WAIT.format(sig=sig)) == f"True {status}"


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 0), ("SIGTERM", 143)])
def test_a_signal_taken_by_another_thread_wakes_the_waiting_main_thread(
    sig: str, status: int
) -> None:
    assert _run(SIGNAL_TO_ANOTHER_THREAD.format(sig=sig)) == f"True {status}"


def test_a_flood_of_other_signals_neither_stops_nor_blocks() -> None:
    assert _run(FLOOD) == "False True 143"


def test_restore_puts_the_handlers_back_and_ends_the_thread_without_stopping() -> None:
    assert _run(RESTORED) == "False [] True"
