"""A pass over a watched loader iterated by two threads at once, as a thread-safe loader
allows: every batch reaches one of them once, no thread ends early, nothing crashes.

Each case runs in a child process: before, the second thread made the chain free the C
stretch the first was fetching in (a segmentation fault, which would take pytest with
it), or ended the pass early for both ("generator already executing")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import json, sys, threading, time
from gputop_dl import probe

watch = sys.modules["gputop_dl.probe.watch"]  # (probe.watch is the function)

class Slow:  # thread-safe, and lets go of the GIL in every fetch
    def __init__(self, n):
        self.i, self.n, self.lock = 0, n, threading.Lock()
    def __iter__(self):
        return self
    def __next__(self):
        time.sleep(0.0002)
        with self.lock:
            if self.i >= self.n:
                raise StopIteration
            self.i += 1
            return self.i

class Batches:
    def __init__(self, n):
        self.n = n
    def __iter__(self):
        return Slow(self.n)

n, alone, counts = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
p = probe.Probe(name="threads", system_interval_s=0)
left = []
p._loop_left = lambda how, left_=p._loop_left: (left.append(how), left_(how))
samples = None if counts == "counted" else 1
it = iter(p.watch(Batches(n), samples=samples))
got = [next(it) for _ in range(alone)]  # alone first: the pass C-timed by then
errors = []
def run():
    try:
        for b in it:
            got.append(b)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=run) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
p.close()
print(json.dumps({"got": len(got), "unique": len(set(got)), "errors": errors,
                  "left": left, "shared": getattr(watch, "SHARED_HOW", None)}))
"""


def shared_pass(n: int, alone: int, counts: str = "given") -> dict[str, object]:
    env = {**os.environ, "GPUTOP_RUNTIME_DIR": os.environ.get("GPUTOP_RUNTIME_DIR", "")}
    env = {k: v for k, v in env.items() if v}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(alone), counts],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "a second thread iterates a watched pass" in done.stderr, done.stderr[-2000:]
    return result


@pytest.mark.parametrize(
    "alone",
    [0, 20],
    ids=["both from the first batch (steps timed in Python)", "in the C-timed steps"],
)
def test_two_threads_share_a_pass_as_they_share_the_loader(alone: int) -> None:
    result = shared_pass(5000, alone)
    assert result["errors"] == [], result
    assert result["got"] == result["unique"] == 5000, result
    # the loop marked as left, untimed: a viewer does not wait for its steps as a stall
    assert result["left"] == [result["shared"]], result


def test_a_shared_pass_counted_by_the_probe_ends_no_thread_early() -> None:
    """A pass whose batches the probe counts itself hands them over in a generator, which
    one thread at a time may run: the other gets "generator already executing" while the
    first is inside it (as from a generator loader), but no batch is lost or repeated and
    nothing crashes."""
    result = shared_pass(5000, 20, "counted")
    assert result["got"] == result["unique"] == 5000, result
    assert all("generator already executing" in e for e in result["errors"]), result
