"""A pass over a watched loader iterated by more than one thread, as a thread-safe loader
allows: every batch reaches one of them once, no thread ends early or hangs, nothing
crashes, and a pass handed from thread to thread (an executor's) stays timed.

Each case runs in a child process: a second thread made the chain free the C stretch
the first was fetching in (a segmentation fault, which would take pytest with it), or
ended the pass early for both ("generator already executing")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from gputop_dl import probe

watch = sys.modules["gputop_dl.probe.watch"]  # (probe.watch is the function)

class Slow:  # thread-safe, and lets go of the GIL in every fetch
    def __init__(self, n, paired):
        self.i, self.n, self.lock, self.paired = 0, n, threading.Lock(), paired
    def __iter__(self):
        return self
    def __next__(self):
        if self.paired is not None:
            self.paired.wait()  # fetches in lockstep across two threads
        time.sleep(0.0002)
        with self.lock:
            if self.i >= self.n:
                raise StopIteration
            self.i += 1
            return self.i

class Batches:
    def __init__(self, n, paired=None):
        self.n, self.paired = n, paired
    def __iter__(self):
        return Slow(self.n, self.paired)

n, alone, counts, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
p = probe.Probe(name="threads", system_interval_s=0)
left = []
p._loop_left = lambda how, *rest, left_=p._loop_left: (left.append(how), left_(how, *rest))
samples = None if counts == "counted" else 1
paired = threading.Barrier(2, timeout=20) if how == "lockstep" else None
it = iter(p.watch(Batches(n, paired), samples=samples))
got, errors = [], []
def run():
    try:
        for b in it:
            got.append(b)
    except Exception as exc:
        errors.append(repr(exc))
if how == "handed over":  # one thread at a time, a different one each step
    pools = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    while True:
        try:
            got.append(pools[len(got) % 2].submit(next, it).result())
        except StopIteration:
            break
else:
    got += [next(it) for _ in range(alone)]  # alone first: the pass C-timed by then
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    if how == "owner goes on":
        run()
    for t in threads:
        t.join()
p.close()
print(json.dumps({"got": len(got), "unique": len(set(got)), "errors": errors,
                  "left": left, "shared": getattr(watch, "SHARED_HOW", None)}))
"""

WARNING = "two threads iterate a watched pass at once"


def shared_pass(
    n: int, alone: int, how: str = "threads", counts: str = "given"
) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(alone), counts, how],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stderr


CASES = {
    # (batches the main thread takes alone first, how the threads take turns)
    "both from the first batch (steps timed in Python)": (0, "threads"),
    "in the C-timed steps": (20, "threads"),
    "the owner goes on beside two more": (50, "owner goes on"),
    "fetches in lockstep across the threads": (0, "lockstep"),
}


@pytest.mark.parametrize(("alone", "how"), list(CASES.values()), ids=list(CASES))
def test_threads_share_a_pass_as_they_share_the_loader(alone: int, how: str) -> None:
    """The owner going on in its C-timed steps beside another thread segfaulted after
    the first fix (its generator let go of the stretch the other was fetching in); a
    loader whose threads fetch in lockstep waited forever on the pass's lock."""
    result, stderr = shared_pass(5000 if how != "lockstep" else 1000, alone, how)
    assert result["errors"] == [], result
    assert result["got"] == result["unique"] == (5000 if how != "lockstep" else 1000), result
    # the loop marked as left, untimed: a viewer does not wait for its steps as a stall
    assert result["left"] == [result["shared"]], result
    assert WARNING in stderr, stderr[-2000:]


def test_a_pass_handed_from_thread_to_thread_stays_timed() -> None:
    """An executor's threads take turns, never two at once: the pass is theirs in turn,
    timed to its end, and nobody is warned."""
    result, stderr = shared_pass(3000, 0, "handed over")
    assert result["got"] == result["unique"] == 3000, result
    assert result["left"] == ["exhausted"], result
    assert WARNING not in stderr, stderr[-2000:]


def test_a_shared_pass_counted_by_the_probe_loses_no_batch() -> None:
    """A pass whose batches the probe counts itself hands them over in a generator, which
    one thread at a time may run: another thread that asks while one is inside it gets
    "generator already executing" (as from a generator loader; README), but no batch is
    lost or repeated and nothing crashes."""
    result, _ = shared_pass(5000, 20, "threads", "counted")
    assert result["got"] == result["unique"] == 5000, result
    assert all("generator already executing" in e for e in result["errors"]), result
