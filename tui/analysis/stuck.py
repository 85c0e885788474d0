"""Where a stalled run is stuck: evidence lines from the probe's stack, and the py-spy
advice only where py-spy could attach (pure: the ptrace facts are gathered elsewhere,
``tui/ptrace.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import Frame, Stack
from gputop_dl.tui.analysis import fmt

SHOWN_FRAMES = 3  # innermost frames in the evidence (the JSON carries all of them)
SHOWN_PATH = 60  # characters of a path in the evidence, its end kept
# Paths that are libraries, not the user's code: the innermost frame *outside* them is
# where the user's code waits, named too when it is not among the innermost frames.
# gputop's own frames too (an editable install or a checkout is not under site-packages).
LIBRARY_MARKS = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "/gputop_dl/")
USER_FRAME = "your code: "  # leads the line of the user's innermost frame


@dataclass(frozen=True)
class Ptrace:
    """Whether this viewer's user could attach py-spy to the run's pid, and why not."""

    allowed: bool
    why: str  # "" when allowed; else a sentence: "kernel.yama.ptrace_scope is 1 ..."


def is_library(frame: Frame) -> bool:
    return any(mark in frame.file for mark in LIBRARY_MARKS)


def where(frame: Frame) -> str:
    path = frame.file if len(frame.file) <= SHOWN_PATH else "…" + frame.file[-(SHOWN_PATH - 1) :]
    code = f": {frame.code}" if frame.code else ""
    return f"{path}:{frame.line} in {frame.function}(){code}"


def current(stack: Stack | None, last_index: int | None) -> Stack | None:
    """``stack`` if it belongs to the stall in progress (no step ended after it)."""
    if stack is None or (last_index is not None and last_index >= stack.step_index):
        return None
    return stack


def stack_evidence(stack: Stack) -> list[str]:
    """Evidence lines: the innermost frames, then the user's innermost frame if deeper."""
    if not stack.frames:
        return ["the probe took the training thread's stack, but it had no Python frame"]
    thread = f" ({stack.thread})" if stack.thread else ""
    lines = [
        f"training thread{thread} stack after {fmt.dur(stack.stalled_s)} without a step, "
        "innermost first:"
    ]
    shown = stack.frames[:SHOWN_FRAMES]
    lines += [f"  at {where(frame)}" for frame in shown]
    user = next((f for f in stack.frames if not is_library(f)), None)
    if user is not None and user not in shown:
        lines.append(f"  {USER_FRAME}{where(user)}")
    return lines


def pyspy_advice(pid: int | None, host: str | None, access: Ptrace | None) -> str:
    """py-spy for native frames (C extensions, NCCL, CUDA) where it can attach."""
    command = f"py-spy dump --native --pid {pid}" if pid is not None else "py-spy dump --native"
    if access is None:  # another host, or not known here
        on = f" on {host}" if host else ""
        return f"native frames too: {command}{on} (needs ptrace rights there)"
    if access.allowed:
        return f"native frames too (C extensions, NCCL, CUDA): {command}"
    return f"py-spy cannot attach from here: {access.why}"


def workers_pyspy_advice(workers: Sequence[int], host: str | None, access: Ptrace | None) -> str:
    """Where the loader's workers are, one py-spy call each (it takes one pid), where
    py-spy can attach (the same rules as for the main process: pyspy_advice)."""
    pids = ", ".join(map(str, workers))
    if access is not None and not access.allowed:
        return f"py-spy cannot attach to the workers ({pids}) from here: {access.why}"
    on = f" on {host} (needs ptrace rights there)" if access is None and host else ""
    return f"see where the workers are: py-spy dump --pid N for each of {pids}{on}"
