"""Ctrl-C and a watched loop: the training's KeyboardInterrupt reaches it wherever it
lands, the script still dies of SIGINT, and a Ctrl-C the training catches leaves no loop
open in the probe (an audit sent SIGINT to bare and watched loops side by side, and
raised KeyboardInterrupt at each line of the probe's code).

Where the interrupt lands in the probe's lines is forced with a trace function that
raises KeyboardInterrupt there, as the signal handler would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from gputop_dl import probe

pytestmark = pytest.mark.usefixtures("no_probe_left_behind", "small_segments")

ROOT = Path(__file__).resolve().parent.parent

# A loop that breaks off, a Ctrl-C landing in the probe's first line named AT as the
# pass is let go of: the training's own line would have taken it.
AT_BREAK = """
import signal, sys, threading, time
import numpy as np
from gputop_dl import probe

calls = []

def handler(signum, frame):  # the training's own: "Ctrl-C twice to quit at once"
    calls.append(signum)
    print(f"handler called {len(calls)}", flush=True)
    raise KeyboardInterrupt

# A terminal's Ctrl-C (a job started in the background, as CI's may be, ignores SIGINT)
own = sys.argv[3] == "own"
signal.signal(signal.SIGINT, handler if own else signal.default_int_handler)

probe.Probe(name="interrupt", system_interval_s=0)
loader = probe.watch([np.zeros((4, 2))] * 60)  # counted: C-timed past the first steps
fired = []

def local(frame, event, arg):
    if event == "line" and not fired:
        fired.append(1)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)  # raises, as a Ctrl-C's

def tracer(frame, event, arg):
    return local if frame.f_code.co_name == sys.argv[1] else None

for epoch in range(3):
    it = iter(loader)
    for i, batch in enumerate(it):
        if i == 40:
            sys.settrace(tracer)
            if sys.argv[2] == "close":
                it.close()  # raises it, as a bare generator's close() would
            break
    del it
    sys.settrace(None)
    start = time.monotonic()
    try:  # the interrupt comes here, a few milliseconds late (it ends the wait), or never
        threading.Event().wait(5)
    finally:
        print(f"waited {time.monotonic() - start:.2f} s", flush=True)
    print(f"epoch {epoch}: the training went on", flush=True)
"""


def run(script: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.mark.parametrize(
    ("at", "how", "handler"),
    [
        ("_loop_left", "break", "default"),
        ("_counted", "break", "default"),
        ("_loop_left", "close", "default"),
        ("_loop_left", "break", "own"),
        ("_counted", "break", "own"),
    ],
)
def test_a_ctrl_c_in_the_probes_lines_as_a_pass_is_let_go_of_reaches_the_training(
    at: str, how: str, handler: str
) -> None:
    """The pass let go of at `break` is closed by its finalizer, which prints any
    exception and drops it: a Ctrl-C landing in the probe's lines there was lost ("Exception
    ignored in: <generator object Watched._stretches>"), and the training went on. Sent
    again, it ends a blocking wait as the first would have; an explicit close() raises
    it, as a generator's does. A SIGINT handler of the training's own is not called a
    second time (one that counts Ctrl-Cs read one as two): its exception is raised
    again in the main thread, after the wait."""
    child = run(AT_BREAK, at, how, handler)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGINT, (out, err)
    assert "went on" not in out and "Exception ignored" not in err, (out, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    if how == "close":
        assert "waited" not in out, (out, err)  # raised by close(), before the wait
    elif handler == "own":
        assert out.count("handler called") == 1 and "handler called 2" not in out, out
        assert "waited" in out, out  # a wait is not cut short: it came just after
    else:
        assert float(out.split()[-2]) < 2.5, out  # of 5 s: it came in the wait


@pytest.mark.parametrize("interval", ["0", "0.2"], ids=["no-sampler", "sampler"])
def test_the_probes_threads_import_nothing_once_it_started(interval: str) -> None:
    """An import on the publisher's thread (its first facts: the cgroup reader) made
    dataclasses, whose exec() in CPython 3.11 clears the mark of a main thread ending on
    Ctrl-C: a script stopped in the probe's first ~0.1 s exited with status 1 in 7 of 10
    runs, not by SIGINT, and a shell loop over runs went on to the next."""
    script = """
    import sys, threading, time
    from gputop_dl import probe
    from tests.test_probe import attached

    imported = []

    class Spy:  # told of each module imported for the first time
        def find_spec(self, name, path=None, target=None):
            if threading.current_thread() is not threading.main_thread():
                imported.append((threading.current_thread().name, name))

    sys.meta_path.insert(0, Spy())
    interval = float(sys.argv[1])
    p = probe.Probe(name="imports", listen="tcp://127.0.0.1:*", system_interval_s=interval)
    reader = attached(p)  # a hello, the replay, node samples
    for _ in p.watch(list(range(20_000))):
        pass
    time.sleep(1.5)
    p.close()
    reader.close()
    print(imported)
    """
    child = run(script, interval)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.splitlines()[-1] == "[]", out


def raising_at(name: str) -> Callable[[FrameType, str, Any], Any]:
    """A trace function that raises KeyboardInterrupt at the first line run in a
    function called ``name``."""
    fired: list[int] = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_name == name else None

    return tracer


@pytest.mark.parametrize("at", ["_note_pass_start", "_loop_entered", "_leave_pending"])
def test_a_ctrl_c_caught_as_a_pass_starts_leaves_no_loop_open(p: probe.Probe, at: str) -> None:
    """A notebook, or `except KeyboardInterrupt: save()` that goes on: a Ctrl-C landing
    in the pass's entry left the probe counting a loop that was not there (the next
    epochs untimed in C, the loop shown "in-loop" for good)."""
    loader = p.watch([np.zeros((4, 2))] * 100)
    sys.settrace(raising_at(at))
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                pass
    finally:
        sys.settrace(None)
    assert (p._passes, p._loop) in ((0, "outside"), (0, "not-started"))
    segments = len(p._segments)
    assert sum(1 for _ in loader) == 100
    assert len(p._segments) > segments  # C-timed again: the only pass
    assert (p._passes, p._loop, p._loop_exit) == (0, "outside", "exhausted")


class RaisingAtInstruction:
    """A trace function that raises KeyboardInterrupt before the ``n``-th instruction
    (1-based) run in the calls of a function called ``name``, counted together: a signal handler's
    exception comes between any two instructions, not only at a line's start."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n, self.ran = name, n, 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name != self.name or self.ran >= self.n:
            return None
        frame.f_trace_lines, frame.f_trace_opcodes = False, True
        return self.local

    def local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.ran += 1
            if self.ran == self.n:
                raise KeyboardInterrupt
        return self.local


def instructions_run(name: str, run: Callable[[], Any]) -> int:
    """How many instructions the calls of ``name`` run inside ``run()``."""
    counter = RaisingAtInstruction(name, 10**9)
    sys.settrace(counter)
    try:
        run()
    finally:
        sys.settrace(None)
    assert 0 < counter.ran < counter.n
    return counter.ran


def test_a_ctrl_c_at_any_instruction_as_a_segment_begins_leaves_the_publisher_going(
    p: probe.Probe,
) -> None:
    """The training thread let go of old segments under a lock it took without waiting;
    a Ctrl-C between that acquire and its try left it held, and the publisher, which
    waits for it, published nothing more (and hung at close). Each instruction in turn."""
    loader = p.watch([np.zeros((4, 2))] * 200)  # counted, C-timed: many small segments
    at = "_drop_oldest_segments"
    n_run = instructions_run(at, lambda: sum(1 for _ in loader))
    for n in range(1, n_run + 1):
        trap = RaisingAtInstruction(at, n)
        sys.settrace(trap)
        try:
            for _ in loader:
                pass
        except KeyboardInterrupt:
            assert trap.ran == n
        finally:
            sys.settrace(None)
    steps = p._index_now()
    assert sum(1 for _ in loader) == 200
    # The publisher lets go of every segment it finished publishing, within a flush.
    deadline = time.monotonic() + 5
    while len(p._segments) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(p._segments) == 0, f"{n_run} instructions; publisher stuck"
    assert p._index_now() == steps + 200
