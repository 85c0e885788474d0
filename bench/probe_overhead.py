"""Probe cost per step: whole-process CPU time (all threads) of a watched loop vs the
same bare loop, in separate subprocesses (one after the other, then at once on one
core), then in one process.

Each child runs STEPS steps of Python work (ADDITIONS integer additions, 1,200 by default:
18-74 us on this VM, whose speed varies from day to day; 4,800 make the ~100 us step the
goal was set with), over one of two loaders:

* ``list``: a list of batches (a tuple holding numpy arrays): the probe counts each
  batch's samples by looking at it;
* ``known``: the same list watched with ``samples=32``: the counts are given, the probe
  looks at no batch (what counting costs is ``list`` less this);
* ``dataloader``: a torch DataLoader (batch_size=32, default collate; its own work per
  batch, 60 us on a fast day here, is in both children): torch fixes every batch's
  count, so the probe looks only at the first batch (probe/loader.py, ``batch_plan``).

The probe child has a subscriber attached (in this parent process, so its cost is not
counted) and stops its clock only after ``probe.close()`` has flushed and sent
everything: the publisher thread's encoding and sending is counted. Goal: <= 1 us CPU
per step.

Each probe runs as on a node's local rank 0, by default: with its node sampler (psutil,
/proc, NVML, hl-smi: once a second while a viewer is connected, as here, every 5 s while
none is), whose thread is counted and shown as its own part. Until 2026-11-26 every
probe here ran without it (``system_interval_s=0``), which left out its ~2 ms of CPU a
second: about 0.2 us a step at ~100 us steps.

The probe child also reads every thread's CPU from /proc/self/task/*/schedstat, so the
whole-process figure splits into the training thread, the publisher thread and zmq's I/O
thread (read just before ``close()``), and the rest (the final flush in ``close()``).

Every child runs the same lines of script; only the loop it times differs. Each round's
three children share one memory layout and one hash seed, drawn at random for the round:
objects of random sizes kept, the loop run at a random call depth, ``PYTHONHASHSEED``. Two
things this replaced had made the probe look 2-4x dearer than it is (2026-11-26, 1,200
additions, 12 rounds each):

* children that ran different code around the same loop: a probe whose publisher thread
  did nothing at all, in the probe child's code path, cost 3.4-4.8 us a step; the same
  real probe with its publisher running, created in the bare child's path, -1.0 us;
* a hash seed per child: dicts and sets laid out differently moved two identical bare
  children apart by an IQR of -6.1..8.8 us a step; with the round's seed, -2.0..0.3.

Each round also runs a "floor" child: the same loop through a generator that only reads
the clock before and after ``next()``, the least any timing of the loop does; the probe's
own cost is what it adds above that.

Process-to-process differences stay large on this VM (an IQR of several us a step): the
host's speed drifts over seconds (the same bare child took 28-47 us a step from one run
to the next, over 20,000 steps or 100,000). So each kind of loop is measured twice: the
round's children one after the other, as above, then all three at once on one CPU (this
process, which reads the probe's messages, on the others): sharing the core in time,
they see the same host at the same moments, and the floor child's IQR falls to about
0.5 us. That is a harder place for the probe than a free core: its publisher thread
wakes on the training thread's core, between its steps (a wake-up that made a list of
int objects of the readings, before they were sent as bytes, cost the training thread
~0.6 ms of CPU: 1.6-1.9 us a step at 20 wake-ups a second, gone with the system
allocator, so through pymalloc, which the two threads share; measured with the
publisher's parts switched off one by one in children of 20,000 steps, 4-7 a round).

``in_one_process`` then runs the three loops in ONE probe process: 100-step blocks in a
shuffled order, back to back (1,000-step blocks until 2026-11-27: four times the
spread), each loop one pass taken a block at a time; the training thread's CPU is read
per block. The probe's other threads are read after the rounds, in a pass of watched
steps alone (10 s), as a training runs every step watched: the publisher's and zmq's CPU
from before it until its last steps were sent, less their per-second work over the
flush's wait, per step of it; the node sampler's CPU a second over the whole child (its
work follows the clock, not the steps: a sample a second, a walk of /proc every few)
over that pass's steps a second. Until 2026-11-27, 20:00 UTC (stop 39) they were charged
by time over the rounds instead: their CPU less their per-second work without steps over
the time the bare and floor blocks ran (still printed). But the publisher wakes at the
watched steps' pace through the bare and floor blocks too, and the fixed cost of each
wake-up and drain (its wait, the sends, the history's upkeep: ~0.4 ms, two a second)
fell on a third of the steps a training spreads it over; and the sampler's share came out
at -0.30 to 0.32 us a step from run to run. In six runs of 2026-11-27 (stop 39) that
charge gave the three threads 0.04-0.65 us a step, the pass alone 0.32-0.49, of it the
sampler 0.15-0.21 (docs/measurements.md). An earlier design idled 20 ms after every
block so that each block's publisher work could be read with it: every loop then paid a
cold start, the floor 1.4-3.0 us a step (0.10-0.12 back to back), which
made the probe's cost look 1-2 us dearer.

Since 2026-11-26 ``watch`` leaves a pass, after its first few steps, to C iterators
(probe/stamps.py). Against the Python loop before it, alternately in one harness (list
of batches, training thread, blocks back to back): 0.09 and 0.29 us a step against 0.50
and 0.58, the floor 0.10-0.12. What the publisher does with the clock readings is now
the larger part: 0.61-0.65 us a step in a run at 30,000 steps/s, of it the wire rows
0.40-0.42 (0.23 in a tight loop) and the garbage collections that their tuples trigger,
which traverse the large young lists of the drain, 0.15 (gc callbacks, 300,000 steps).
Since then the rows are msgspec structs that the collector does not track: the publisher
takes 0.50-0.51 us a step there. Since the same day such steps go on the wire as runs
(docs/protocol.md, "StepRun"): the slice of readings and the counts as they are, no row
and no arithmetic per step; in one process the publisher and zmq threads then take
0.26 us a step over the list (0.51-0.70 with rows). Since then the readings are 8-byte
integers in an array, sent as its bytes: no int object per reading, in either thread.

Two earlier ways to cut the publisher's work were measured and not kept (before the C
iterators): a ring of preallocated columns in place of a tuple per step (0.41 against
0.52-0.56 us a step in a harness), and the watch loop making each wire row itself (the
publisher fell to 0.26-0.30 us a step, the training thread rose by 0.7-1.7 us in a run).

The last section also profiles the probe's own parts in this process
(CPU time of the calling thread, repeated): the training-thread path between real ~100 us
steps (blocks of watched and bare steps in turn: caches as a real step leaves them) and
in a tight loop (what ``watch`` adds around ``next()``: two clock reads, the sample
count, the record), and the publisher's per-step work (drain to wire records, msgspec
encoding). Last, the publisher thread's share of a core when steps are slow (10 ms):
its per-wake-up cost.

    python bench/probe_overhead.py [pairs] [list|known|dataloader|both] [additions]
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from gputop_dl.probe.core import RECORDS_PER_MESSAGE, Probe, _DrainState
from gputop_dl.probe.history import messages
from gputop_dl.probe.loader import sample_counter
from gputop_dl.probe.protocol import encode_steps
from gputop_dl.probe.stamps import Segment
from gputop_dl.probe.transport import Subscriber

STEPS = 20_000
PAIRS = 12
ADDITIONS = 1_200  # a step's Python work (argv 3)
PARTS: dict[str, list[tuple[float, float, float]]] = {}  # publisher, zmq I/O, close + rest
KINDS = {
    "list": "a list of numpy batches, each one counted",
    "known": "a list of numpy batches, counts given (samples=32)",
    "dataloader": "a torch DataLoader, counts from torch's batching",
}

# A step's Python work and the floor loop, the same text in every bench child (this one's
# and bench/probe_window.py's): both need ADDITIONS, time.
STEP_AND_FLOOR = r"""
def work():  # ~100 us of Python
    x = 0
    for i in range(ADDITIONS):
        x += i
    return x

def two_clock_reads(batches):  # the floor: what any timing of next() must do
    perf = time.perf_counter
    for batch in batches:
        perf()
        yield batch
        perf()
"""

# The loops' batches, the same text in this bench's children and
# bench/probe_instructions.py's: a list of numpy batches, or a torch DataLoader (torch
# imported only for it) whose work per batch is its own collate.
BATCHES = r"""
def make_list(steps):
    return [(np.zeros((32, 3)), np.zeros(32))] * steps

def make_dataloader(steps):
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class Items(Dataset):
        item = (np.zeros(3), 0)

        def __len__(self):
            return steps * 32

        def __getitem__(self, i):
            return self.item

        def __getitems__(self, indices):
            return [self.item] * len(indices)

    return DataLoader(Items(), batch_size=32)
"""

CHILD = (
    r"""
import os, random, sys, time
if os.environ.get("GPUTOP_BENCH_CPU"):  # before any thread starts: all inherit it
    os.sched_setaffinity(0, {int(os.environ["GPUTOP_BENCH_CPU"])})
import numpy as np
from gputop_dl import probe

def sampler_tids(p):  # the node sampler's threads: its own and NVML's (a driver call's)
    nvml = getattr(p._sampler._nvml, "_thread", None)
    tids = {p._sampler._thread.native_id, nvml.native_id if nvml is not None else None}
    return {str(t) for t in tids if t is not None}

def threads():  # CPU ns of every thread of this process, by thread name (Linux)
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        if tid == str(os.getpid()):
            name = "main"
        elif PUBLISHER is not None and tid == str(PUBLISHER):
            name = "publisher"
        elif SAMPLER is not None and tid in SAMPLER:
            name = "sampler"
        out[name] = out.get(name, 0) + ns
    return out

"""
    + BATCHES
    + r"""
STEPS = int(sys.argv[2])
ADDITIONS = int(sys.argv[4])
IDLE_S = 5.0  # per-second work read over this: it covers the sampler's walk of /proc
WATCHED_ALONE_S = 10.0  # the probe's pass alone after the rounds (see blocks)
make_batches = make_dataloader if sys.argv[3] == "dataloader" else make_list
SAMPLES = 32 if sys.argv[3] == "known" else None  # None: the probe counts each batch

batches = make_batches(STEPS)
"""
    + STEP_AND_FLOOR
    + r"""
def timed(loop):
    c0, w0, m0 = time.process_time(), time.perf_counter(), time.thread_time()
    for _ in loop:
        work()
    return c0, w0, m0, time.perf_counter(), time.thread_time()

# This round's memory layout, the same in its three children: objects of random sizes
# kept (where pymalloc places the step's integers) and the loop run at a random call
# depth (where its frame sits). The same additions run up to 10 % faster or slower from
# one layout to another, and a child's layout is otherwise fixed by what it imported.
rng = random.Random(int(sys.argv[5]))
PAD = [bytearray(rng.randrange(1, 520)) for _ in range(rng.randrange(400))]
PAD += [float(i) for i in range(rng.randrange(200))]
PAD += [(i,) * rng.randrange(1, 9) for i in range(rng.randrange(200))]
DEPTH = rng.randrange(24)

def at_depth(depth, loop):
    return at_depth(depth - 1, loop) if depth else timed(loop)

# One process, one probe, one heap: blocks of STEPS steps of three loops in a shuffled
# order, back to back as a training runs them, the training thread's CPU read per block.
# Each loop is one pass over ROUNDS blocks, taken a block at a time (islice for all
# three), so a watched block holds no loop entry or exit. The publisher works at its own
# pace meanwhile. The other threads' CPU a watched step is printed three ways: all of
# the rounds', charged by time (the rounds' less what they take per second without
# steps, measured after beside the same busy loop, over the time the bare and floor
# blocks ran), and in a pass of watched steps alone after the rounds (see there: the
# figure). Then the per-round differences of the training thread from the bare block,
# and the bare steps.
def publishing(ns_by_thread, names=("publisher", "sampler"), zmq=True):  # zmq's I/O threads
    return sum(
        v for k, v in ns_by_thread.items() if k in names or (zmq and k.startswith("ZMQ"))
    )

def blocks(rounds):
    global PUBLISHER, SAMPLER
    import itertools
    p = probe.Probe(name="bench", listen="tcp://127.0.0.1:*")
    PUBLISHER, SAMPLER = p._thread.native_id, sampler_tids(p)
    print(p.endpoint, flush=True)
    sys.stdin.readline()
    time.sleep(0.5)
    def one_pass(loop, steps=STEPS * rounds):
        return iter(loop(make_batches(steps)))
    passes = {
        "bare": one_pass(lambda b: b),
        # and the watched-alone phase's steps after the rounds' (see below)
        "probe": one_pass(lambda b: p.watch(b, samples=SAMPLES), 2 * STEPS * rounds),
        "floor": one_pass(two_clock_reads),
    }
    main = {name: [] for name in passes}
    watched_s = 0.0  # wall time of the probe's blocks
    order = list(passes)
    before = threads()
    w_start = time.perf_counter()
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            block = itertools.islice(passes[name], STEPS)
            m0, w0 = time.thread_time(), time.perf_counter()
            for _ in block:
                work()
            main[name].append(time.thread_time() - m0)
            if name == "probe":
                watched_s += time.perf_counter() - w0
    def flushed():  # wake the publisher, wait for the last steps to be sent: the wait, s
        p._publisher.wake()
        start = time.perf_counter()
        time.sleep(1.0)
        assert not p._steps and all(s.taken == s.complete() for s in p._segments), "not drained"
        return time.perf_counter() - start
    flushed()
    after = threads()
    unwatched_s = time.perf_counter() - w_start - watched_s
    # Then the probe's pass alone for WATCHED_ALONE_S, every step watched as in a
    # training: the background threads' CPU from before it until its last steps were
    # sent, less their per-second work (read below) over the wait for that flush, per
    # step of it. In the rounds the publisher wakes at the pace of watched steps also
    # through the bare and floor blocks, and the fixed cost of each wake-up and drain
    # (its wait, the sends, the history's upkeep: ~0.4 ms) falls on a third of the steps
    # a training would spread it over.
    alone = 0
    alone_start = time.perf_counter()
    alone_end = alone_start + WATCHED_ALONE_S
    for _ in passes["probe"]:
        work()
        alone += 1
        if alone % 100 == 0 and time.perf_counter() >= alone_end:
            break
    alone_s = time.perf_counter() - alone_start
    flush_s = flushed()
    alone_after = threads()
    # The threads' work per second without steps, beside a busy training thread as in
    # the bare and floor blocks: a wake-up then has to take the GIL from it, which costs
    # more than idle (measured asleep, it charged the watched steps the difference over
    # the unwatched blocks' time, the sampler's above all).
    idle_end = time.perf_counter() + IDLE_S
    while time.perf_counter() < idle_end:
        work()
    idle = threads()
    idle_at = time.perf_counter()
    p.close()
    def per_second(names, zmq=True):
        return (publishing(idle, names, zmq) - publishing(alone_after, names, zmq)) / IDLE_S
    # The threads' CPU from start to end less their per-second work without steps over
    # idle_s, in us a step.
    def charged(start, end, names, idle_s, steps, zmq=True):
        run_ns = publishing(end, names, zmq) - publishing(start, names, zmq)
        return (run_ns - per_second(names, zmq) * idle_s) / steps / 1e3
    def by_time(names, zmq=True):  # the rounds less their unwatched blocks' time
        return charged(before, after, names, unwatched_s, rounds * STEPS, zmq)
    # The publisher's and zmq's CPU in the pass alone, less the flush's wait.
    watched_alone = charged(after, alone_after, ("publisher",), flush_s, alone)
    # The node sampler's work does not follow the steps (one sample a second, a walk of
    # /proc every few): its CPU a second over the whole child, beside the busy loop
    # throughout, over the steps a second of the phase. (Read over a 5 s phase, which
    # holds one walk or none, it came out at 0.61 us a step where this gives 0.15-0.21.)
    sampler = ("sampler",)
    sampler_ns_per_s = (
        publishing(idle, sampler, False) - publishing(before, sampler, False)
    ) / (idle_at - w_start)
    sampler_alone = sampler_ns_per_s / (alone / alone_s) / 1e3
    whole = (publishing(after) - publishing(before)) / (rounds * STEPS) / 1e3
    print(
        whole, by_time(("publisher", "sampler")), by_time(sampler, zmq=False),
        watched_alone + sampler_alone, sampler_alone, alone,
    )
    for name in ("probe", "floor"):
        print(*((a - b) / STEPS * 1e6 for a, b in zip(main[name], main["bare"])))
    print(*(b / STEPS * 1e6 for b in main["bare"]), flush=True)

if sys.argv[1] == "blocks":
    blocks(int(sys.argv[6]))
    sys.exit(0)

# Every kind of child runs the same lines from here on, whatever it times: only the
# loop differs. (Children that ran different code around the same loop measured up to
# 4 us a step apart, the probe doing nothing at all.)
mode = sys.argv[1]
PUBLISHER = SAMPLER = None
p = None
if mode == "probe":
    p = probe.Probe(name="bench", listen="tcp://127.0.0.1:*")
    PUBLISHER, SAMPLER = p._thread.native_id, sampler_tids(p)
    loop = p.watch(batches, samples=SAMPLES)
else:
    loop = two_clock_reads(batches) if mode == "floor" else batches
print(p.endpoint if p is not None else "-", flush=True)
sys.stdin.readline()  # the parent's subscriber is attached
time.sleep(0.5)
before = threads()
c0, w0, m0, w1, m1 = at_depth(DEPTH, loop)
# the publisher and zmq threads end in close(): read them just before
parts = {k: (v - before.get(k, 0)) / 1e9 for k, v in threads().items()}
if p is not None:
    p.close()
c1 = time.process_time()
print(c1 - c0, w1 - w0, m1 - m0, parts.get("publisher", 0.0),
      sum(v for k, v in parts.items() if k.startswith("ZMQ")), parts.get("sampler", 0.0),
      flush=True)
"""
)


def launch(
    mode: str, kind: str, steps: int, layout: int, *extra: object, cpu: int | None = None
) -> tuple[subprocess.Popen[str], Subscriber | None]:
    """A CHILD started in the round's layout (on CPU ``cpu`` alone if given), with a
    subscriber attached when it runs a probe; it waits for :func:`go`."""
    argv = (CHILD, mode, steps, kind, ADDITIONS, layout, *extra)
    env = {**os.environ, "PYTHONHASHSEED": str(layout)}
    env.pop("GPUTOP_BENCH_CPU", None)
    if cpu is not None:
        env["GPUTOP_BENCH_CPU"] = str(cpu)
    child = subprocess.Popen(
        [sys.executable, "-c", *map(str, argv)],
        # The round's hash seed, too: with each child's own, dicts and sets laid out
        # differently moved the same bare loop by +-8 us a step (at 28 us steps).
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    endpoint = child.stdout.readline().strip()
    sub = None
    if mode in ("probe", "blocks"):  # the children that run a probe
        sub = Subscriber()
        sub.connect(endpoint)
        time.sleep(0.3)
    return child, sub


def go(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()


def start(
    mode: str, kind: str, steps: int, layout: int, *extra: object
) -> tuple[subprocess.Popen[str], Subscriber | None]:
    """A CHILD launched and told to go."""
    child, sub = launch(mode, kind, steps, layout, *extra)
    go(child)
    return child, sub


def run(mode: str, kind: str, layout: int) -> tuple[float, float, float, int]:
    """A child's figures (CPU, wall, training thread's CPU, messages received)."""
    return finish_all(kind, {mode: start(mode, kind, STEPS, layout)})[mode]


def finish_all(
    kind: str, children: dict[str, tuple[subprocess.Popen[str], Subscriber | None]]
) -> dict[str, tuple[float, float, float, int]]:
    """Started children's figures, their subscribers read until they exit (a message still
    unread when its publisher closes is lost)."""
    received = dict.fromkeys(children, 0)
    lines: dict[str, str] = {}
    while len(lines) < len(children):
        subs = [(mode, sub) for mode, (_, sub) in children.items() if sub is not None]
        for mode, sub in subs:
            received[mode] += len(sub.receive(0.05 / len(subs), max_messages=100_000))
        if not subs:
            time.sleep(0.05)
        for mode, (child, _) in children.items():
            if mode not in lines and child.poll() is not None:
                assert child.stdout is not None
                lines[mode] = child.stdout.read().strip().splitlines()[-1]
    out = {}
    for mode, (child, sub) in children.items():
        if sub is not None:
            received[mode] += len(sub.receive(0.2, max_messages=100_000))
            sub.close()
        assert child.wait() == 0, f"the {mode} child failed"
        cpu, wall, main_cpu, publisher, zmq_io, sampler = map(float, lines[mode].split())
        rest = cpu - main_cpu - publisher - zmq_io - sampler
        PARTS.setdefault(f"{mode} {kind}", []).append((publisher, zmq_io, sampler, rest))
        out[mode] = (cpu, wall, main_cpu, received[mode])
    return out


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return (
        f"median {statistics.median(values):.2f} us "
        f"(IQR {q[0]:.2f}..{q[2]:.2f}, min {min(values):.2f}, max {max(values):.2f})"
    )


def per_call_us(fn: object, n: int, repeats: int = 15) -> list[float]:
    out = []
    for _ in range(repeats):
        c0 = time.thread_time()
        fn()  # type: ignore[operator]
        out.append((time.thread_time() - c0) / n * 1e6)
    return out


def components() -> None:
    import numpy as np

    os.environ["GPUTOP_DISABLE"] = "1"  # no publisher thread: parts are driven by hand
    p = Probe(name="parts")
    p.enabled = True  # watch() times the loop; nothing is published
    n = 20_000
    batch = (np.zeros((32, 3)), np.zeros(32))
    batches = [batch] * n

    def watched_loop() -> None:
        p._steps.clear()  # frees the last repeat's records (the publisher's work, counted)
        p._segments.clear()
        for _ in p.watch(batches):
            pass

    def known_loop() -> None:  # the path of a DataLoader's batch_plan, or samples=32
        p._steps.clear()
        p._segments.clear()
        for _ in p.watch(batches, samples=32):
            pass

    def bare_loop() -> None:
        for _ in batches:
            pass

    count = sample_counter()

    def sample_inference() -> None:
        for _ in range(n):
            count(batch)

    def publisher() -> None:
        # What watch's fast path leaves for the publisher: clock readings 30 us apart.
        segment = Segment(0, 0, (32, n, 32))
        t_ns = time.perf_counter_ns()
        segment.stamps.extend(range(t_ns, t_ns + 30_000 * (2 * n + 1), 30_000))
        segment.steps = n
        p._index = n  # as the training thread leaves it when the segment ends
        p._segments.clear()
        p._segments.append(segment)
        c0 = time.thread_time()
        batch = p._drain(_DrainState(), 0.0, force=False)
        assert batch is not None
        for m in messages([batch], RECORDS_PER_MESSAGE):
            encode_steps("host:1", m.base, m.rows, 0, 0, 0, m.runs, m.clock_ns)
        # the readings above are the training thread's work: keep them out of the figure
        publisher_s.append(time.thread_time() - c0)

    publisher_s: list[float] = []
    print("probe parts, CPU per step in this process (15 repeats of 20000)")
    in_context(p, batch)
    watched = per_call_us(watched_loop, n)
    bare = statistics.median(per_call_us(bare_loop, n))
    print(f"  training thread, watch() around next():    {spread([w - bare for w in watched])}")
    known = per_call_us(known_loop, n)
    print(f"  the same, counts known (DataLoader):       {spread([w - bare for w in known])}")
    inference = per_call_us(sample_inference, n)
    print(f"  of which sample inference (per loader):     {spread(inference)}")
    for _ in range(15):
        publisher()
    drained = [x / n * 1e6 for x in publisher_s]
    print(f"  publisher thread, drain + encode:          {spread(drained)}")


def two_clock_reads(batches: list[object]) -> Iterator[object]:
    """The floor: what any timing of next() must do, and nothing else."""
    perf = time.perf_counter
    for batch in batches:
        perf()
        yield batch
        perf()


def in_context(p: Probe, batch: object) -> None:
    """The training-thread cost between real work: blocks of 2000 steps of ~100 us of
    Python, each kind of loop in turn, in a shuffled order (one process: no
    process-to-process noise); caches are as cold as a real step leaves them, unlike the
    tight loops below. "two clock reads" is the floor any timing of next() pays."""
    n = 2_000
    batches = [batch] * n

    def work() -> int:
        x = 0
        for i in range(ADDITIONS):
            x += i
        return x

    loops: dict[str, Callable[[], Iterable[object]]] = {
        "bare": lambda: batches,
        "watched, each batch counted": lambda: p.watch(batches),
        "watched, counts known": lambda: p.watch(batches, samples=32),
        "two clock reads": lambda: two_clock_reads(batches),
    }
    spent: dict[str, list[float]] = {name: [] for name in loops}
    rounds = 40
    for _ in range(rounds):
        order = list(loops)
        random.shuffle(order)
        for name in order:
            p._steps.clear()
            loop = loops[name]()
            c0 = time.thread_time()
            for _ in loop:
                work()
            spent[name].append((time.thread_time() - c0) / n * 1e6)
    print(f"  training thread between ~100 us steps ({rounds} shuffled rounds, minus bare):")
    for name in list(loops)[1:]:
        diffs = [a - b for a, b in zip(spent[name], spent["bare"], strict=True)]
        print(f"    {name + ':':<37}{spread(diffs)}")


def other_cpus() -> tuple[int, set[int]] | None:
    """A CPU for a round's children and the rest for this process, or None on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[-1], set(cpus[:-1])) if len(cpus) > 1 else None


def pairs_of(kind: str, pairs: int, shared_core: bool = False) -> None:
    """Each round runs a bare child, a probe child and a "floor" child (a generator that
    only reads the clock before and after next(), as any timing of the loop must), in
    a rotating order; the costs are each child's CPU less its round's bare child's.

    ``shared_core``: the round's three children run at once, all on one CPU, this
    process (the probe's subscriber) on the others (see the module's docstring)."""
    cpus = other_cpus() if shared_core else None
    saved = os.sched_getaffinity(0)
    if cpus is not None:
        os.sched_setaffinity(0, cpus[1])
    cpu_costs, wall_costs, main_costs, bare_steps = [], [], [], []
    floor_cpu, floor_main = [], []
    modes = ("bare", "probe", "floor")
    for i in range(pairs):
        order = modes[i % 3 :] + modes[: i % 3]
        layout = random.randrange(2**32)
        if cpus is None:
            results = {mode: run(mode, kind, layout) for mode in order}
        else:
            children = {mode: launch(mode, kind, STEPS, layout, cpu=cpus[0]) for mode in order}
            for mode in order:
                go(children[mode][0])
            results = finish_all(kind, children)
        cpu_b, wall_b, main_b, _ = results["bare"]
        cpu_p, wall_p, main_p, got = results["probe"]
        cpu_f, _, main_f, _ = results["floor"]
        assert got > 0, "the subscriber received nothing"
        cpu_costs.append((cpu_p - cpu_b) / STEPS * 1e6)
        main_costs.append((main_p - main_b) / STEPS * 1e6)
        wall_costs.append((wall_p - wall_b) / STEPS * 1e6)
        floor_cpu.append((cpu_f - cpu_b) / STEPS * 1e6)
        floor_main.append((main_f - main_b) / STEPS * 1e6)
        bare_steps.append(cpu_b / STEPS * 1e6)
    os.sched_setaffinity(0, saved)
    print(f"probe cost per step over {KINDS[kind]}")
    how = (
        f"at once on CPU {cpus[0]}"
        if cpus is not None
        else "one after the other"
        if not shared_core
        else "one after the other (one CPU: none to share)"
    )
    print(
        f"{pairs} subprocess rounds (bare, probe, floor; {how}) x {STEPS} steps"
        f" of {ADDITIONS} additions, each round in its own memory layout"
    )
    print(f"  bare step (CPU):                       {statistics.median(bare_steps):.1f} us")
    print(f"  whole-process CPU, all threads, flushed: {spread(cpu_costs)}")
    print(f"  of which the training thread's CPU:      {spread(main_costs)}")
    print(f"  training-thread wall time:             {spread(wall_costs)}")
    print(f"  floor, two clock reads around next():  {spread(floor_cpu)}")
    print(f"    of which the training thread's CPU:  {spread(floor_main)}")
    parts = PARTS.pop(f"probe {kind}")
    names = ("publisher thread (loop)", "zmq I/O thread (loop)", "node sampler (loop)")
    for i, name in enumerate((*names, "close + rest")):
        print(f"  of which {name + ':':<31}{spread([x[i] / STEPS * 1e6 for x in parts])}")


def in_one_process(kind: str, rounds: int = 1_500, steps: int = 100) -> None:
    """The same three loops in one probe process (see ``blocks`` in CHILD): no
    process-to-process difference of layout or host speed between the arms. Each loop
    is one pass, as in a training; the publisher and zmq threads' CPU, charged by time
    (see ``blocks``), is added to the training thread's per watched step.

    Blocks of 100 steps (~20 ms): the host's speed drifts over seconds, and the closer in
    time a round's three blocks run, the less it moves them apart. On 2026-11-27, 4,800
    additions a step (214 us): a round's training-thread difference had an IQR of
    -5.6..8.2 us a step with 1,500 rounds of 100 steps, against -28.6..25.5 with 150 of
    1,000 (the design until then)."""
    child, sub = start("blocks", kind, steps, random.randrange(2**32), rounds)
    assert child.stdout is not None and sub is not None
    # Read meanwhile: its lines of per-round figures can outgrow the pipe's buffer, and a
    # child blocked writing them never exits.
    output: list[str] = []
    stdout = child.stdout
    reader = threading.Thread(target=lambda: output.append(stdout.read()))
    reader.start()
    received = 0
    while child.poll() is None:
        received += len(sub.receive(0.05, max_messages=100_000))
    sub.close()
    reader.join()
    assert child.returncode == 0 and received > 0, "the child failed or sent nothing"
    lines = output[0].splitlines()[-4:]
    whole_run_us, others_us, sampler_us, alone_us, alone_sampler_us, alone_steps = (
        float(x) for x in lines[0].split()
    )
    main_us, floor_us, bare_us = ([float(x) for x in line.split()] for line in lines[1:])
    print(f"the same in one process, over {KINDS[kind]}")
    print(
        f"{rounds} rounds of {steps}-step blocks (bare, probe, floor, shuffled, back to back)"
        f" of {ADDITIONS} additions; bare step {statistics.median(bare_us):.1f} us"
    )
    print(f"  whole-process CPU, all threads, flushed: {spread([m + alone_us for m in main_us])}")
    print(f"  of which the training thread's CPU:      {spread(main_us)}")
    print(
        f"  of which the publisher, sampler and zmq: {alone_us:.2f} us"
        f" (a pass of watched steps alone, {alone_steps:,.0f} steps), the sampler"
        f" {alone_sampler_us:.2f}"
    )
    print(
        f"  (charged by time over the rounds instead: {others_us:.2f} us, the sampler"
        f" {sampler_us:.2f}; {whole_run_us:.2f} all of the run's: the whole figure"
        f" {statistics.median([m + others_us for m in main_us]):.2f})"
    )
    print(f"  floor, two clock reads around next():  {spread(floor_us)}")


SLOW_CHILD = r"""
import os, sys, threading, time
from gputop_dl import probe
from gputop_dl.probe.transport import Subscriber

p = probe.Probe(name="slow", listen="tcp://127.0.0.1:*")
sub = Subscriber()
sub.connect(p.endpoint)
time.sleep(1.0)  # attached, the first hello and facts sent
seconds = float(sys.argv[1])
stop = time.monotonic() + seconds
def read():  # the subscriber's own CPU is this thread's, not the publisher's
    while time.monotonic() < stop + 1:
        sub.receive(0.05, max_messages=100_000)
threading.Thread(target=read, daemon=True).start()
def cpu(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9
nvml = p._sampler._nvml._thread.native_id  # the sampler's NVML reads: its CPU too
groups = ((p._thread.native_id,), (p._sampler._thread.native_id, nvml))
def cpus():
    return [sum(cpu(t) for t in group) for group in groups]
c0, t0 = cpus(), time.monotonic()
for _ in p.watch(range(10**9)):
    time.sleep(0.01)  # a 10 ms step: the GPU's, say
    if time.monotonic() > stop:
        break
elapsed = time.monotonic() - t0
print(*((c1 - c) / elapsed * 100 for c1, c in zip(cpus(), c0)))
"""


def slow_steps(repeats: int = 3, seconds: float = 10.0) -> None:
    """The publisher thread's and the node sampler's shares of a core when steps are slow
    (100 steps/s), a viewer attached: there each wake-up's and each node sample's fixed
    cost, not the per-step work, is what the probe costs."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", SLOW_CHILD, str(seconds)],
            capture_output=True,
            text=True,
            check=True,
            # components() switched this process's probe off: not the child's
            env={k: v for k, v in os.environ.items() if k != "GPUTOP_DISABLE"},
        ).stdout.split()[-2:]
        for _ in range(repeats)
    ]
    for i, name in enumerate(("publisher thread", "node sampler (a viewer attached)")):
        shares = [float(run[i]) for run in runs]
        print(f"{name} at 100 steps/s ({repeats} x {seconds:.0f} s): ", end="")
        print(f"median {statistics.median(shares):.2f} % of a core", end="")
        print(f" ({min(shares):.2f}..{max(shares):.2f})")


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else PAIRS
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    global ADDITIONS
    ADDITIONS = int(sys.argv[3]) if len(sys.argv) > 3 else ADDITIONS
    for kind in KINDS if which == "both" else (which,):
        pairs_of(kind, pairs)
        pairs_of(kind, pairs, shared_core=True)
        in_one_process(kind)
    components()
    slow_steps()


if __name__ == "__main__":
    main()
