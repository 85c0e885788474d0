"""Where a stalled training thread is stuck: its Python stack, taken from inside.

The probe's publisher thread (never the training thread) calls :meth:`StallWatch.due`
every time it wakes (at least every 0.5 s). When no step has ended for longer than the
viewer's stall threshold -- max(5 x the median period of the last 30 steps, 10 s),
docs/verdicts.md -- it takes the training thread's frames from ``sys._current_frames()``,
once per stall, bounded (:data:`MAX_FRAMES` innermost frames, each string cut to the
limits of the ``stack`` message). No ptrace, no signal, no code in the training thread:
reading another thread's frame objects under the GIL is all it costs (~50 us for 32
frames, plus a source line lookup per frame, cached by ``linecache``).
"""

from __future__ import annotations

import linecache
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import CodeType, FrameType, FunctionType, GeneratorType

from gputop_dl.probe.messages import Frame, Stack

# The viewer's rule (tui/analysis/thresholds.py STALL_FACTOR / STALL_MIN_S; a test keeps
# the two equal), so the stack arrives when the viewer starts to say "stalled".
STALL_FACTOR = 5.0
STALL_MIN_S = 10.0
MIN_STEPS = 5  # fewer steps: no typical period, the viewer says "warming up"
# With fewer, a stack once the loop has gone this long without a step (thresholds.py
# FIRST_STEPS_STALL_S, the viewer's warning): a first step that hangs (NCCL setup, a
# loader that cannot start) shows where; one that compiles shows that too.
FIRST_STEPS_STALL_S = 30.0
# A step this much longer than typical (and at least AWAY_PEEK_MIN_S) is looked at once,
# before it is a stall: a training thread found in its framework's evaluation or
# checkpoint code (AWAY_FRAMES) is away from the loop, and its stack is sent at once.
# Lightning validates between two fetches of a watched loader: without the callback the
# viewer showed the last verdict through the first 10 s of every validation.
AWAY_PEEK_FACTOR = 3.0
AWAY_PEEK_MIN_S = 2.0
MAX_FRAMES = 32
# The watched loop's own file: a frame of it on the training thread's stack is a fetch of
# the next batch in progress (between steps its generators are suspended, on no stack).
# Its C-timed steps leave no such frame: there the clock says it (``take_stack``'s
# ``fetching``). Imported from one directory, the two modules' paths share a prefix.
WATCH_FILE = os.path.join(os.path.dirname(__file__), "watch.py")
MAX_FILE = 256
MAX_FUNCTION = 128
MAX_CODE = 200


def typical_s(periods_us: Sequence[int]) -> float | None:
    """The typical step, in seconds: the median of ``periods_us``, recent step periods in
    microseconds as the publisher keeps them (no copy in seconds on every wake-up); None
    with too few steps to know it."""
    if len(periods_us) < MIN_STEPS:
        return None
    return statistics.median(periods_us) / 1e6


def stall_threshold(periods_us: Sequence[int]) -> float | None:
    """Seconds without a step after which the run counts as stalled; None with too few
    steps to know what is typical (:func:`typical_s`)."""
    typical = typical_s(periods_us)
    return None if typical is None else stall_limit(typical)


def stall_limit(typical_s: float) -> float:
    """The stall threshold for a typical step of ``typical_s`` seconds."""
    return max(STALL_FACTOR * typical_s, STALL_MIN_S)


def cut_head(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, keeping its end (a path's file name)."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def cut_tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# A framework's own evaluation or checkpoint code (file, qualified functions or None for
# any, what it is): a training thread found there after no step for a while is away
# from its loop, not stuck inside a step. Lightning validates inside the training epoch
# (before on_train_epoch_end, and mid-epoch with val_check_interval); the HF Trainer
# evaluates and saves between two steps; a loader that `watch` times sees neither. The
# viewer names it (framework_away, in tui/analyzer.py); the probe keeps such frames however
# deep, and sends such a stack before a stall (StallWatch.peek_due).
AWAY_FRAMES: tuple[tuple[str, frozenset[str] | None, str], ...] = (
    ("lightning/pytorch/loops/evaluation_loop.py", None, "Lightning's validation"),
    ("pytorch_lightning/loops/evaluation_loop.py", None, "Lightning's validation"),
    ("lightning/pytorch/callbacks/model_checkpoint.py", None, "Lightning's checkpoint"),
    ("pytorch_lightning/callbacks/model_checkpoint.py", None, "Lightning's checkpoint"),
    (
        "transformers/trainer.py",
        frozenset({"Trainer.evaluate", "Trainer.evaluation_loop", "Trainer.prediction_loop"}),
        "the HF Trainer's evaluation",
    ),
    (
        "transformers/trainer.py",
        frozenset({"Trainer._save_checkpoint", "Trainer.save_model"}),
        "the HF Trainer's checkpoint",
    ),
)
KEPT_AWAY = 2  # such frames kept past the innermost ones (a model's forward is deep)

# A framework's training loop with no hook for an exception that leaves it (file,
# function): the HF Trainer's. Its callback notes the frame's code as it starts an
# epoch; a training thread no longer in it has left the loop (a notebook keeps the
# process after the exception: it read "Stalled" for good).
LOOP_FRAMES: tuple[tuple[str, str], ...] = (("transformers/trainer.py", "_inner_training_loop"),)
LOOP_FRAME_DEPTH = 16  # how far up from the callback the loop's frame is looked for
# A framework's code that calls iter() on a loader that is no DataLoader only to check
# that it is iterable, and drops the iterator; a DataLoader's iter() it never calls:
# Lightning's fit (probe/watch.py leaves a watched DataLoader's iter() for later there).
ITERABLE_CHECK_FRAMES: tuple[tuple[str, str], ...] = (
    ("connectors/data_connector.py", "_check_dataloader_iterable"),
)


def code_in(code: CodeType, frames: tuple[tuple[str, str], ...]) -> bool:
    """Whether ``code`` is one of ``frames`` (file name's end, function name)."""
    return any(
        code.co_name == function and code.co_filename.replace("\\", "/").endswith(path)
        for path, function in frames
    )


def loop_code(frame: FrameType | None) -> CodeType | None:
    """The code of the framework's training loop (LOOP_FRAMES) ``frame`` runs inside."""
    for _ in range(LOOP_FRAME_DEPTH):
        if frame is None:
            return None
        if code_in(frame.f_code, LOOP_FRAMES):
            return frame.f_code
        frame = frame.f_back
    return None


def runs_code(
    thread_id: int,
    code: CodeType,
    current_frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
) -> bool:
    """Whether a frame of ``code`` is on thread ``thread_id``'s stack (False: the thread
    is gone, or left it)."""
    frames = current_frames()
    try:
        frame: FrameType | None = frames.get(thread_id)
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False
    finally:
        del frames  # a frame reference keeps every local of its thread alive


def away_in(file: str, function: str) -> str | None:
    """The framework code a frame of ``file`` running ``function`` (qualified) is in,
    away from the training loop (AWAY_FRAMES); None if it is none of it."""
    for path, functions, what in AWAY_FRAMES:
        if file.endswith(path) and (functions is None or function in functions):
            return what
    return None


def frames_of(frame: FrameType | None, limit: int = MAX_FRAMES) -> tuple[tuple[Frame, ...], int]:
    """The innermost ``limit`` frames from ``frame`` outwards (innermost first), and how
    many outer frames were left out. A frame of a framework's evaluation or checkpoint
    code beyond them takes the place of one of the outermost kept (at most KEPT_AWAY):
    inside a deep model's forward, Lightning's evaluation loop is 28-31 frames deep."""
    chain: list[FrameType] = []
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    kept = chain[:limit]
    if len(chain) > limit:
        away = [
            f
            for f in chain[limit:]
            if away_in(f.f_code.co_filename, getattr(f.f_code, "co_qualname", "")) is not None
        ][:KEPT_AWAY]
        if away:
            kept = chain[: limit - len(away)] + away
    out: list[Frame] = []
    for kept_frame in kept:
        code = kept_frame.f_code
        line = kept_frame.f_lineno or 0
        text = linecache.getline(code.co_filename, line).strip() if line else ""
        out.append(
            Frame(
                file=cut_head(code.co_filename, MAX_FILE),
                line=max(0, line),
                function=cut_tail(getattr(code, "co_qualname", code.co_name), MAX_FUNCTION),
                code=cut_tail(text, MAX_CODE) or None,
            )
        )
    return tuple(out), len(chain) - len(kept)


def runs_in(frame: FrameType | None, path: str) -> bool:
    """Whether any frame from ``frame`` outwards runs code of file ``path`` (all of the
    stack, not only the frames a ``stack`` message keeps)."""
    while frame is not None:
        if frame.f_code.co_filename == path:
            return True
        frame = frame.f_back
    return False


def capture(
    thread_id: int,
    current_frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
) -> tuple[tuple[Frame, ...], int, bool] | None:
    """The stack of thread ``thread_id`` now (see :func:`frames_of`) and whether a frame
    of the watched loop is on it (a fetch in progress); None if the thread is gone."""
    frame = current_frames().get(thread_id)
    if frame is None:
        return None
    try:
        return (*frames_of(frame), runs_in(frame, WATCH_FILE))
    finally:
        del frame  # a frame reference keeps every local of that thread alive


def fetch_code(iterator: object) -> CodeType | None:
    """The code that is on a thread's stack for as long as a fetch from ``iterator``
    runs: its generator's code, or its class's ``__next__`` where that is a plain Python
    function (a torch DataLoader's iterator); None for an iterator in C (a list's,
    ``map``), whose fetch leaves no frame of its own, or a ``__next__`` that is another
    kind of callable (a proxy that retries around the function it wraps would be off
    its frame while it waits)."""
    if isinstance(iterator, GeneratorType):
        return iterator.gi_code
    for kind in type(iterator).__mro__:
        method = vars(kind).get("__next__")
        if method is not None:
            return method.__code__ if type(method) is FunctionType else None
    return None


def fetch_under_way(
    fetcher: CodeType,
    current_frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
) -> bool:
    """Whether a fetch may be under way: a frame of ``fetcher`` (see :func:`fetch_code`)
    or of the watched loop is on any thread's stack (a pass's batches may be fetched by
    a thread pool's threads, or by the training thread). False for a C-timed fetch whose
    end the clock never read: the loader raised, and the training went on elsewhere
    without asking again."""
    frames = current_frames()
    try:
        for top in frames.values():
            frame: FrameType | None = top
            while frame is not None:
                code = frame.f_code
                if code is fetcher or code.co_filename == WATCH_FILE:
                    return True
                frame = frame.f_back
        return False
    finally:
        del frames  # a frame reference keeps every local of its thread alive


class StallWatch:
    """Decides when to take a stack: once per stall (a stall is identified by the index
    of the step that does not end), only inside the loop, only past the threshold."""

    def __init__(self) -> None:
        self.taken_for: int | None = None  # the step index of the last stall captured
        self.peeked_for: int | None = None  # the step index last looked at for away code

    def due(
        self,
        now: float,
        last_end: float | None,
        next_index: int,
        periods_us: Sequence[int],
        in_loop: bool,
    ) -> float | None:
        """Seconds stalled when a stack should be taken now, else None.

        ``last_end``: Unix time the last step ended, or the loop was entered if later
        (a pass after an evaluation waits from there); ``next_index``: the index of the
        step in progress (steps published so far); ``periods_us``: recent step periods."""
        stalled = _waited(now, last_end, in_loop, next_index, self.taken_for)
        if stalled is None or stalled <= STALL_MIN_S:  # usual: no median of the periods
            return None
        limit = stall_threshold(periods_us)
        if limit is None:  # no typical step yet: the first steps may take long
            limit = FIRST_STEPS_STALL_S
        if stalled <= limit:
            return None
        self.taken_for = next_index
        return stalled

    def peek_due(
        self, now: float, since: float | None, at: int, periods_us: Sequence[int], in_loop: bool
    ) -> float | None:
        """Seconds without a step when the training thread should be looked at for a
        framework's evaluation or checkpoint code (:func:`framework_away`), once a step: past
        AWAY_PEEK_FACTOR typical steps and AWAY_PEEK_MIN_S, before a stall (its stack is
        taken by :meth:`due`). None without a typical step (the first steps may take
        long for reasons of their own). ``since``, ``at``: :meth:`due`'s ``last_end``
        and ``next_index``."""
        stalled = _waited(now, since, in_loop, at, self.peeked_for)
        if stalled is None or stalled <= AWAY_PEEK_MIN_S:  # usual: no median of the periods
            return None
        typical = typical_s(periods_us)
        if typical is None:
            return None
        if stalled <= max(AWAY_PEEK_FACTOR * typical, AWAY_PEEK_MIN_S):
            return None
        if stalled > stall_limit(typical):
            return None  # a stall: due() takes its stack (a wake-up late past the look)
        self.peeked_for = at
        return stalled


def _waited(
    now: float, last_end: float | None, in_loop: bool, next_index: int, done_for: int | None
) -> float | None:
    """Seconds without a step; None outside the loop, before any step, or for the step
    ``done_for`` (already looked at)."""
    if not in_loop or last_end is None or done_for == next_index:
        return None
    return now - last_end


def framework_away(stack: Stack) -> tuple[str, Frame] | None:
    """What framework code the stack is in, away from the training loop, and its frame
    (the innermost such one); None if none of its frames is (the probe keeps such a
    frame among those it sends however deep it is: :func:`frames_of`), or if the thread
    is inside the watched loader's fetch (the loader's, whatever called it). For the
    probe (what to send before a stall) and the viewer (what it says) alike."""
    if stack.fetching:
        return None
    for frame in stack.frames:
        what = away_in(frame.file, frame.function)
        if what is not None:
            return what, frame
    return None


def take_stack(
    source_id: str, thread_id: int, stalled_s: float, step_index: int, fetching: bool = False
) -> Stack | None:
    """The ``stack`` message for thread ``thread_id`` now; None if it cannot be taken
    (the thread ended). ``fetching``: the clock of a C-timed segment says a fetch is in
    progress. Called by the publisher thread only."""
    taken = capture(thread_id)
    if taken is None:
        return None
    frames, left_out, in_watch = taken
    thread = next((t.name for t in threading.enumerate() if t.ident == thread_id), None)
    return Stack(
        source_id=source_id,
        time=time.time(),
        step_index=step_index,
        stalled_s=min(max(0.0, stalled_s), 1e7),
        frames=frames,
        left_out=left_out,
        thread=cut_tail(thread, 200) if thread else None,
        fetching=fetching or in_watch,
    )
