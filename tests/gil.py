"""Whether a call lets go of the GIL: a busy thread that runs Python makes progress
during the call only if it does (used by the tests of the probe's GIL-held reads and
sends)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import pytest


def progress_during(call: Callable[[], object], times: int = 5) -> list[int]:
    """How far a busy Python thread got during each of ``times`` calls of ``call``. The
    switch interval is set longer than a call, so no forced switch happens inside one:
    the thread runs during a call only where the call lets go of the GIL."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a released GIL is not taken by the other thread at once")
    stop = threading.Event()
    progress = [0]

    def busy() -> None:
        while not stop.is_set():
            progress[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    thread = threading.Thread(target=busy)
    thread.start()
    moved = []
    try:
        for _ in range(times):
            time.sleep(0.06)  # the busy thread runs; this one then takes the GIL back
            before = progress[0]
            call()
            moved.append(progress[0] - before)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    return moved
