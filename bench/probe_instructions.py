"""What the probe adds to the training thread, in instructions a step: a count that no
other process, clock drift or memory layout moves.

On this project's VM the CPU time of a step moves by more than the probe's cost from one
process to the next and from one minute to the next (bench/probe_overhead.py needs 150
rounds in one process to resolve a few tenths of a microsecond, and over a torch
``DataLoader`` it did not). Valgrind's callgrind counts the instructions each thread
executes, the same from run to run within a few per step. Each loop runs in its own child
under callgrind, twice (N1 and N2 steps); counting is zeroed on entry to ``getresuid``
and dumped on entry to ``getresgid``, which the child calls just before and after the
timed loop, so imports, the probe's start and ``close()`` are not counted; a step is
(I(N2) - I(N1)) / (N2 - N1) of the main thread.

What it does not count: the cycles an instruction takes (a cache miss, a branch
mispredicted, the GIL handed over), so it ranks changes of the probe's own code, it does
not replace CPU time; and the probe's other threads, whose work under valgrind (about 50
times slower) is paid per wake-up of the clock, not per step: bench/probe_overhead.py
charges those.

    python bench/probe_instructions.py [list|dataloader|all]

Needs valgrind (``apt-get install valgrind``); without it, says so and exits 0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.probe_overhead import BATCHES, STEP_AND_FLOOR

CHILD = (
    r"""
import itertools, os, sys, time
import numpy as np
from gputop_dl import probe

loop_kind, source, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ADDITIONS = 0  # STEP_AND_FLOOR's step work, not run here: the loop is timed bare
"""
    + BATCHES
    + STEP_AND_FLOOR
    + r"""
batches = (make_dataloader if source == "dataloader" else make_list)(steps + 100)

# A probe in every child, as on a node's local rank 0 (its threads run in the bare
# children too: only the loop differs).
p = probe.Probe(name="bench", listen="tcp://127.0.0.1:*")
if loop_kind == "probe":
    loop = p.watch(batches)
elif loop_kind == "known":
    loop = p.watch(batches, samples=32)
elif loop_kind == "floor":
    loop = two_clock_reads(batches)
else:
    loop = batches
it = iter(loop)
for _ in range(100):  # the first steps, timed in Python, settle the method and counts
    next(it)

def timed(it, n):
    os.getresuid()  # callgrind: zero here
    for _ in itertools.islice(it, n):
        pass
    os.getresgid()  # callgrind: dump here

timed(it, steps)
p.close()
"""
)

# (loop, source, N1, N2): a DataLoader step is ~670,000 instructions (its collate), a
# list's ~300, so the DataLoader runs fewer steps.
RUNS = {
    "list": [
        ("bare", "list", 2_000, 6_000),
        ("floor", "list", 2_000, 6_000),
        ("known", "list", 2_000, 6_000),
        ("probe", "list", 2_000, 6_000),
    ],
    "dataloader": [("bare", "dataloader", 500, 1_500), ("probe", "dataloader", 500, 1_500)],
}
REPEATS = 3
LABELS = {
    "bare": "bare loop",
    "floor": "two clock reads around next() (the floor)",
    "known": "probe, counts given (samples=32)",
    "probe": "probe",
}


def main_thread_instructions(loop: str, source: str, steps: int, out: Path) -> int:
    """Instructions of the child's main thread in its timed loop, under callgrind."""
    out.mkdir(exist_ok=True)
    prefix = out / f"{loop}.{source}.{steps}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            "--zero-before=getresuid",
            "--dump-before=getresgid",
            f"--callgrind-out-file={prefix}.%p",
            sys.executable,
            "-c",
            CHILD,
            loop,
            source,
            str(steps),
        ],
        check=True,
        capture_output=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "GPUTOP_DISABLE"},
            "PYTHONHASHSEED": "0",  # one dict layout in every child
        },
    )
    # Part 1 is the dump at getresgid; thread 1 the main thread.
    (dump,) = out.glob(f"{prefix.name}.*.1-01")
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {dump}")


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if shutil.which("valgrind") is None:
        print("probe_instructions: valgrind is not installed: skipped (apt-get install valgrind)")
        return
    runs = [r for k, rs in RUNS.items() if which in (k, "all") for r in rs]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count()) as pool:
        jobs = {
            (loop, source, n, i): pool.submit(
                main_thread_instructions, loop, source, n, Path(tmp) / str(i)
            )
            for loop, source, n1, n2 in runs
            for n in (n1, n2)
            for i in range(REPEATS)
        }
        counts = {key: job.result() for key, job in jobs.items()}
    # A step from each repeat's pair of runs; the least is the figure: what varies adds
    # instructions (a thread that wanted the GIL, which the main thread then handed
    # over, is paid by the clock, not by the step: more of it in a step of a slow loop).
    per_step = {
        (loop, source): sorted(
            (counts[loop, source, n2, i] - counts[loop, source, n1, i]) / (n2 - n1)
            for i in range(REPEATS)
        )
        for loop, source, n1, n2 in runs
    }
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    print(
        f"training thread's instructions a step (callgrind, {version.strip()},"
        f" Python {sys.version.split()[0]}; the least of {REPEATS} runs, all in brackets):"
    )
    for source in ("list", "dataloader"):
        if (bare := per_step.get(("bare", source))) is None:
            continue
        name = "a list of numpy batches" if source == "list" else "a torch DataLoader"
        print(f"  over {name}: bare loop {bare[0]:,.0f} a step ({_all(bare)})")
        for loop in ("floor", "known", "probe"):
            if (steps := per_step.get((loop, source))) is not None:
                label = LABELS[loop] + (" (counts from torch)" if source != "list" else "") + ":"
                print(f"    {label:<44}{steps[0] - bare[0]:+,.0f} ({_all(steps)})")


def _all(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


if __name__ == "__main__":
    main()
