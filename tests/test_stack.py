"""The stack of a stuck step: taken by the probe's publisher thread once per stall,
bounded, decoded totally, kept by the viewer, named in the stalled verdict and in
``snapshot --json``; py-spy advised only where it could attach."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from gputop_dl.probe import stack as stacks
from gputop_dl.probe.messages import Frame, Hello, LoaderInfo, Stack, StepRecord, Steps
from gputop_dl.probe.protocol import MalformedMessage, decode, encode
from gputop_dl.tui.analysis import stuck, thresholds
from gputop_dl.tui.analyzer import Window, analyze
from gputop_dl.tui.events import Received
from gputop_dl.tui.ptrace import judge
from gputop_dl.tui.state import ViewerState
from gputop_dl.tui.widgets import banner

T0 = 1_700_000_000.0


# ------------------------------------------------------------------ the rule
def test_the_probe_uses_the_viewers_stall_rule() -> None:
    assert stacks.STALL_FACTOR == thresholds.STALL_FACTOR
    assert stacks.STALL_MIN_S == thresholds.STALL_MIN_S
    assert stacks.MIN_STEPS == thresholds.MIN_STEPS
    assert stacks.FIRST_STEPS_STALL_S == thresholds.FIRST_STEPS_STALL_S


@pytest.mark.parametrize(
    ("periods", "expected"),
    [
        ([], None),
        ([100_000] * 4, None),  # too few steps to know what is typical
        ([100_000] * 5, 10.0),  # 5 x 0.1 s < 10 s
        ([3_000_000] * 30, 15.0),  # 5 x 3 s
        ([100_000] * 3 + [100_000_000] * 2, 10.0),  # the median, not the mean
    ],
)
def test_stall_threshold(periods: list[int], expected: float | None) -> None:
    assert stacks.stall_threshold(periods) == expected


def test_a_stack_is_due_once_per_stall_inside_the_loop_past_the_threshold() -> None:
    watch = stacks.StallWatch()
    periods = [100_000] * 30  # microseconds, as the publisher keeps them
    due = watch.due
    assert due(T0 + 5, T0, 7, periods, True) is None  # 5 s: not yet
    assert due(T0 + 11, T0, 7, periods, False) is None  # outside the loop: never
    assert due(T0 + 11, None, 7, periods, True) is None  # no step yet
    assert due(T0 + 11, T0, 7, periods[:3], True) is None  # warming up
    # ... but a first step that takes over FIRST_STEPS_STALL_S shows where it is
    assert due(T0 + 31, T0, 7, periods[:3], True) == pytest.approx(31.0)
    watch = stacks.StallWatch()
    due = watch.due
    assert due(T0 + 11, T0, 7, periods, True) == pytest.approx(11.0)
    assert due(T0 + 60, T0, 7, periods, True) is None  # the same stall: once
    assert due(T0 + 80, T0 + 70, 8, periods, True) is None  # a step ended: not stalled
    assert due(T0 + 90, T0 + 70, 8, periods, True) == pytest.approx(20.0)  # a new stall


@pytest.mark.parametrize(
    ("now", "last_end", "periods", "in_loop", "expected"),
    [
        (T0 + 1.5, T0, [100_000] * 30, True, None),  # under AWAY_PEEK_MIN_S
        (T0 + 2.5, T0, [100_000] * 30, True, 2.5),  # 25 typical steps, 2.5 s
        (T0 + 2.5, T0, [100_000] * 30, False, None),  # outside the loop
        (T0 + 2.5, None, [100_000] * 30, True, None),  # no step yet
        (T0 + 2.5, T0, [100_000] * 4, True, None),  # no typical step yet
        (T0 + 2.5, T0, [1_000_000] * 30, True, None),  # 2.5 typical 1 s steps: a step
        (T0 + 3.5, T0, [1_000_000] * 30, True, 3.5),
        (T0 + 11, T0, [100_000] * 30, True, None),  # a stall: due() takes that one
    ],
)
def test_a_long_step_is_looked_at_for_away_code_before_a_stall(
    now: float, last_end: float | None, periods: list[int], in_loop: bool, expected: float | None
) -> None:
    watch = stacks.StallWatch()
    assert watch.peek_due(now, last_end, 7, periods, in_loop) == (
        None if expected is None else pytest.approx(expected)
    )


def test_a_step_is_looked_at_once_and_its_stall_still_gets_its_stack() -> None:
    watch = stacks.StallWatch()
    periods = [100_000] * 30
    assert watch.peek_due(T0 + 3, T0, 7, periods, True) == pytest.approx(3.0)
    assert watch.peek_due(T0 + 4, T0, 7, periods, True) is None  # once a step
    assert watch.due(T0 + 11, T0, 7, periods, True) == pytest.approx(11.0)  # still taken
    assert watch.peek_due(T0 + 13, T0 + 10, 8, periods, True) == pytest.approx(3.0)  # next


# ------------------------------------------------------------------ capture
def _sleeper(ready: threading.Event, stop: threading.Event) -> None:
    ready.set()
    stop.wait(30)  # SLEEPER LINE


def test_capture_names_another_threads_line_innermost_first() -> None:
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=_sleeper, args=(ready, stop), name="trainer")
    thread.start()
    ready.wait()
    time.sleep(0.05)
    try:
        assert thread.ident is not None
        message = stacks.take_stack("h:1", thread.ident, 12.5, 42)
    finally:
        stop.set()
        thread.join()
    assert message is not None and message.thread == "trainer" and message.step_index == 42
    ours = [f for f in message.frames if f.function == "_sleeper"]
    assert len(ours) == 1 and ours[0].file == __file__
    line = next(
        i
        for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
        if "SLEEPER LINE" in t and "stop.wait" in t
    )
    assert ours[0].line == line and ours[0].code == "stop.wait(30)  # SLEEPER LINE"
    assert message.frames[0].function.endswith("wait")  # innermost first: threading's wait
    assert message.frames[-1].function == "Thread._bootstrap"
    assert decode(encode(message)) == message


def test_capture_of_a_thread_that_is_gone_is_none() -> None:
    assert stacks.capture(123456789, lambda: {}) is None


def _deep(n: int) -> FrameType:
    if n == 0:
        return sys._getframe()
    return _deep(n - 1)


EVALUATION_LOOP = "/x/site-packages/lightning/pytorch/loops/evaluation_loop.py"


def test_a_frameworks_evaluation_frame_is_kept_however_deep() -> None:
    """Inside a model's forward, Lightning's evaluation loop is 28-31 frames deep: past
    the 32 innermost, the viewer read "Stalled [critical]" for a validation."""
    namespace: dict[str, Any] = {"_deep": _deep}
    source = "class _EvaluationLoop:\n    def run(self, n):\n        return _deep(n)\n"
    exec(compile(source, EVALUATION_LOOP, "exec"), namespace)
    frames, left_out = stacks.frames_of(namespace["_EvaluationLoop"]().run(60))
    assert len(frames) == stacks.MAX_FRAMES and frames[0].function == "_deep"
    assert frames[-1].file == EVALUATION_LOOP and frames[-1].function == "_EvaluationLoop.run"
    assert all(f.function == "_deep" for f in frames[:-1])
    assert left_out > 60 - stacks.MAX_FRAMES
    assert stacks.framework_away(stack(*frames)) == ("Lightning's validation", frames[-1])
    assert stacks.framework_away(stack(*frames, fetching=True)) is None  # the loader's
    shallow, _ = stacks.frames_of(_deep(60))
    assert stacks.framework_away(stack(*shallow)) is None


def test_frames_are_bounded() -> None:
    frames, left_out = stacks.frames_of(_deep(100))
    assert len(frames) == stacks.MAX_FRAMES and frames[0].function == "_deep"
    assert left_out > 100 - stacks.MAX_FRAMES
    long = stacks.cut_head("/x" * 300 + "/train.py", stacks.MAX_FILE)
    assert len(long) == 256 and long.endswith("/train.py") and long.startswith("…")
    assert len(stacks.cut_tail("f" * 500, stacks.MAX_FUNCTION)) == 128


@pytest.mark.parametrize(
    "change",
    [
        {"frames": tuple(Frame("a.py", 1, "f") for _ in range(33))},
        {"frames": (Frame("a" * 257, 1, "f"),)},
        {"frames": (Frame("a.py", 1, "f" * 129),)},
        {"frames": (Frame("a.py", 1, "f", "x" * 201),)},
        {"stalled_s": float("nan")},
        {"time": -1.0},
    ],
)
def test_the_decoder_rejects_a_stack_beyond_its_limits(change: dict[str, object]) -> None:
    base = {"source_id": "h:1", "time": T0, "step_index": 1, "stalled_s": 1.0, "frames": ()}
    import msgspec

    payload = msgspec.msgpack.encode({"v": [2, 1], "kind": "stack", "body": {**base, **change}})
    with pytest.raises(MalformedMessage):
        decode([b"gputop.stack", payload])


# ------------------------------------------------------------------ viewer side
USER = Frame("/home/u/train.py", 57, "train", "time.sleep(3600)")
LIB = Frame("/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1, "next", "x")


LIB_SHOWN = f"  at …{LIB.file[-59:]}:1 in next(): x"  # the path's end, 60 characters


def stack(*frames: Frame, index: int = 10, fetching: bool = False) -> Stack:
    return Stack("h:1", T0 + 40, index, 20.0, frames, thread="MainThread", fetching=fetching)


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ((USER,), ["  at /home/u/train.py:57 in train(): time.sleep(3600)"]),
        (
            (LIB, LIB, LIB, USER),
            [
                LIB_SHOWN,
                LIB_SHOWN,
                LIB_SHOWN,
                "  your code: /home/u/train.py:57 in train(): time.sleep(3600)",
            ],
        ),
    ],
)
def test_stack_evidence(frames: tuple[Frame, ...], expected: list[str]) -> None:
    lines = stuck.stack_evidence(stack(*frames))
    assert lines[0].startswith("training thread (MainThread) stack after 20 s without a step")
    assert lines[1:] == expected


HEAD = "training thread (MainThread) stack after 20 s without a step, innermost first:"


@pytest.mark.parametrize(
    ("evidence", "items"),
    [
        ([], []),
        (["a", "b"], [("a", []), ("b", [])]),
        (
            ["last step ended 28 s ago", HEAD, "  at x.py:1 in f(): y", "  your code: t.py:2"],
            [
                ("last step ended 28 s ago", []),
                (HEAD, ["at x.py:1 in f(): y", "your code: t.py:2"]),
            ],
        ),
        (["  at x.py:1 in f()", "b"], [("  at x.py:1 in f()", []), ("b", [])]),  # no head: its own
    ],
)
def test_a_stacks_frames_belong_to_its_evidence_line(
    evidence: list[str], items: list[tuple[str, list[str]]]
) -> None:
    assert banner.evidence_items(evidence) == items


@pytest.mark.parametrize(
    ("details", "shown"),
    [
        ([], []),
        (["at a", "at b", "at c"], ["at a", "at b"]),  # the innermost frames
        (["at a", "at b", "at c", "your code: t"], ["at a", "your code: t"]),  # and the user's
        (["at a"], ["at a"]),
    ],
)
def test_the_banner_shows_the_innermost_frame_and_the_users(
    details: list[str], shown: list[str]
) -> None:
    assert banner.shown_details(details) == shown


def test_only_the_stall_in_progress_has_its_stack_shown() -> None:
    s = stack(USER, index=10)
    assert stuck.current(s, 9) is s and stuck.current(s, None) is s
    assert stuck.current(s, 10) is None and stuck.current(None, 3) is None


@pytest.mark.parametrize(
    ("scope", "mine", "theirs", "cap", "allowed", "why"),
    [
        (0, 1000, 1000, False, True, ""),
        (None, 1000, 1000, False, True, ""),  # no Yama: classic rules
        (1, 1000, 1000, False, False, "ptrace_scope is 1"),
        (1, 1000, 1000, True, True, ""),
        (2, 1000, 1000, False, False, "ptrace_scope is 2"),
        (2, 1000, 1000, True, True, ""),
        (3, 0, 0, True, False, "ptrace_scope is 3"),
        (0, 1000, 1001, False, False, "another user"),
        (0, 1000, 1001, True, True, ""),
    ],
)
def test_ptrace_rules(
    scope: int | None, mine: int, theirs: int, cap: bool, allowed: bool, why: str
) -> None:
    verdict = judge(scope, mine, theirs, cap)
    assert verdict.allowed is allowed and why in verdict.why


@pytest.mark.parametrize(
    ("access", "expected"),
    [
        (stuck.Ptrace(True, ""), "py-spy dump --native --pid 77"),
        (stuck.Ptrace(False, "kernel.yama.ptrace_scope is 1"), "py-spy cannot attach from here"),
        (None, "py-spy dump --native --pid 77 on node3 (needs ptrace rights there)"),
    ],
)
def test_pyspy_advice(access: stuck.Ptrace | None, expected: str) -> None:
    assert expected in stuck.pyspy_advice(77, "node3", access)


def hello() -> Hello:
    return Hello("h:1", "probe", "train", "h", 77, T0, "0", loop="in-loop", loop_since=T0)


def steps(n: int = 10) -> tuple[StepRecord, ...]:
    return tuple(StepRecord(i, T0 + 0.1 * (i + 1), 0.1, 0.0, 4) for i in range(n))


def test_the_stalled_verdict_names_the_line_and_advises_by_access() -> None:
    window = Window(T0 + 60, steps(), (), hello(), stack(LIB, USER), stuck.Ptrace(False, "no"))
    verdict = analyze(window)
    assert verdict.kind == "stalled"
    text = "\n".join(verdict.evidence)
    assert "  at /home/u/train.py:57 in train(): time.sleep(3600)" in text
    assert verdict.advice[1] == "py-spy cannot attach from here: no"
    # A stack of an earlier stall (a step ended since) is not shown.
    old = Window(T0 + 60, steps(), (), hello(), stack(USER, index=3), None)
    assert "train.py" not in "\n".join(analyze(old).evidence)


WATCH = Frame("/work/main/gputop_dl/probe/watch.py", 192, "__iter__", "yield from segment")
LOOP = Frame("/home/u/train.py", 96, "main", "for x, y in it:")


def test_a_stall_in_the_loaders_next_says_the_loop_waits_for_a_batch() -> None:
    """Workers hung in __getitem__: the training thread sits in the watched loader's
    next(). Its frame is gputop's, not the user's code (an editable install is not under
    site-packages), and the advice is the loader's, with its workers to py-spy -- not
    "an evaluation inside a step clears by itself"."""
    loader = LoaderInfo("torch.DataLoader", 2, False, 32, 2, True, worker_pids=(4001, 4002))
    h = replace(hello(), loader=loader)
    allowed = stuck.Ptrace(True, "")
    fetch = stack(LIB, LIB, WATCH, LOOP, fetching=True)
    window = Window(T0 + 60, steps(), (), h, fetch, allowed)
    verdict = analyze(window)
    assert verdict.kind == "stalled"
    assert verdict.headline.startswith("Stalled: no batch for"), verdict.headline
    text = "\n".join(verdict.evidence)
    assert "your code: /home/u/train.py:96 in main(): for x, y in it:" in text, text
    assert "your code: /work/main/gputop_dl" not in text
    assert verdict.advice[0].startswith("the loop waits for its next batch")
    assert (
        verdict.advice[1] == "see where the workers are: py-spy dump --pid N for each of 4001, 4002"
    )
    far = analyze(replace(window, ptrace=None, hello=replace(h, host="node7")))
    assert far.advice[1].endswith("4001, 4002 on node7 (needs ptrace rights there)"), far.advice
    barred = analyze(replace(window, ptrace=stuck.Ptrace(False, "ptrace_scope is 1")))
    assert barred.advice[1] == (
        "py-spy cannot attach to the workers (4001, 4002) from here: ptrace_scope is 1"
    )
    # In the step body (no watch frame): the step's advice, as before.
    body = analyze(Window(T0 + 60, steps(), (), h, stack(LIB, USER), None))
    assert body.headline.startswith("Stalled: no step for")


SITE = "/usr/lib/python3.11/site-packages/"
MODULE = Frame(SITE + "torch/nn/modules/module.py", 1, "Module._call_impl", "x")
AWAY_CASES = {
    "Lightning's validation, watch()": (
        (
            MODULE,
            Frame(
                SITE + "lightning/pytorch/loops/evaluation_loop.py", 1, "_EvaluationLoop.run", "x"
            ),
        ),
        "Lightning's validation",
    ),
    "Lightning 1.x's": (
        (Frame(SITE + "pytorch_lightning/loops/evaluation_loop.py", 1, "run", "x"),),
        "Lightning's validation",
    ),
    "Lightning's checkpoint": (
        (
            Frame(
                SITE + "lightning/pytorch/callbacks/model_checkpoint.py",
                1,
                "ModelCheckpoint._save_checkpoint",
                "x",
            ),
        ),
        "Lightning's checkpoint",
    ),
    "the HF Trainer's evaluation": (
        (MODULE, Frame(SITE + "transformers/trainer.py", 1, "Trainer.evaluation_loop", "x")),
        "the HF Trainer's evaluation",
    ),
    "the HF Trainer's checkpoint": (
        (Frame(SITE + "transformers/trainer.py", 1, "Trainer._save_checkpoint", "x"),),
        "the HF Trainer's checkpoint",
    ),
    "the HF Trainer's training step: stuck": (
        (MODULE, Frame(SITE + "transformers/trainer.py", 1, "Trainer.training_step", "x")),
        None,
    ),
    "a user's evaluation_loop.py: stuck": (
        (Frame("/home/u/evaluation_loop.py", 1, "run", "x"),),
        None,
    ),
}


@pytest.mark.parametrize(("frames", "what"), AWAY_CASES.values(), ids=AWAY_CASES.keys())
def test_a_stall_in_a_frameworks_evaluation_is_the_loop_left(
    frames: tuple[Frame, ...], what: str | None
) -> None:
    """Lightning validates inside its training epoch, where a pass that `watch` times
    stays open; the HF Trainer evaluates and saves between two steps: 13 s of it read
    "Stalled [critical]"."""
    verdict = analyze(Window(T0 + 60, steps(), (), hello(), stack(*frames), None))
    if what is None:
        assert (verdict.kind, verdict.severity) == ("stalled", "critical")
        return
    assert (verdict.kind, verdict.severity) == ("outside-loop", "info")
    assert verdict.headline == f"Outside the training loop for 59 s: {what} (the probe's stack)"
    assert f"the training thread is in {what}: at " in verdict.evidence[0]
    # Inside the watched loader's fetch (the probe's fact): the loader, not the framework.
    fetching = analyze(Window(T0 + 60, steps(), (), hello(), stack(*frames, fetching=True), None))
    assert fetching.kind == "stalled"


@pytest.mark.parametrize(("frames", "what"), AWAY_CASES.values(), ids=AWAY_CASES.keys())
def test_away_code_before_a_stall_is_the_loop_left_at_once(
    frames: tuple[Frame, ...], what: str | None
) -> None:
    """Lightning validates between two fetches of a watched loader: the probe looks at a
    step 3x typical (probe.stack.AWAY_PEEK_FACTOR) and sends the stack only if it is in
    such code. The viewer showed the last verdict through the first 10 s (the stall
    threshold) of every validation; now "outside the loop" as the stack comes."""
    early = Stack("h:1", T0 + 4, 10, 3.0, frames, thread="MainThread")
    verdict = analyze(Window(T0 + 4.0, steps(), (), hello(), early, None))
    if what is None:  # (never sent before a stall; if it were: no verdict of it)
        assert verdict.kind not in ("outside-loop", "stalled"), verdict
        return
    assert (verdict.kind, verdict.severity) == ("outside-loop", "info"), verdict
    assert verdict.headline == f"Outside the training loop for 3.0 s: {what} (the probe's stack)"
    # Not for a stack of an earlier step, nor one in the loader's fetch.
    old = analyze(Window(T0 + 4.0, steps(), (), hello(), replace(early, step_index=5), None))
    fetching = replace(early, fetching=True)
    assert old.kind != "outside-loop" and analyze(
        Window(T0 + 4.0, steps(), (), hello(), fetching, None)
    ).kind not in ("outside-loop", "stalled")


def test_the_viewer_keeps_the_newest_stack_cleaned() -> None:
    state = ViewerState("h", pid_alive=False)
    dirty = Frame("/t/x.py", 3, "f\x1b[2J", "sleep()\x07")
    state.apply(Received(hello(), T0))
    state.apply(Received(Steps("h:1", steps(), 1, 0), T0 + 1))
    state.apply(Received(stack(dirty), T0 + 40))
    state.tick(T0 + 41)
    (run,) = state.runs
    assert run.stack is not None and run.stack.frames[0].function == "f[2J"
    assert run.stack.frames[0].code == "sleep()"
    assert run.verdict is not None and run.verdict.kind == "stalled"
    assert any("/t/x.py:3" in e for e in run.verdict.evidence)


# ------------------------------------------------------------------ a real stall
TRAINING = textwrap.dedent(
    """
    import json, sys, threading, time
    import torch
    from gputop_dl import probe
    from gputop_dl.probe import stack as stacks

    calls = []
    real = stacks.take_stack
    def spy(*args, **kwargs):
        calls.append([threading.get_ident(), threading.current_thread().name])
        return real(*args, **kwargs)
    stacks.take_stack = spy  # core.py calls it through the module

    p = probe.Probe(name="stuck", listen=sys.argv[1], system_interval_s=0.5)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    print("up", flush=True)
    for i, (x, y) in enumerate(p.watch(loader)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
        if i == 20:
            print("stalling", flush=True)
            time.sleep(float(sys.argv[2]))  # STUCK HERE
    p.close()
    print(json.dumps({"calls": calls, "training": threading.get_ident()}), flush=True)
    """
)


def test_a_stalled_training_names_the_line_it_sleeps_on(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the training is a real torch model")
    script = tmp_path / "stuck.py"
    script.write_text(TRAINING)
    line = next(i for i, t in enumerate(TRAINING.splitlines(), 1) if "# STUCK HERE" in t)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    train = subprocess.Popen(
        [sys.executable, str(script), endpoint, "16"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert train.stdout is not None
        assert train.stdout.readline() == "up\n"
        assert train.stdout.readline() == "stalling\n"
        time.sleep(10.5)  # the stall threshold is 10 s (steps of ~10 ms)
        snap = subprocess.run(
            [
                sys.executable,
                "-m",
                "gputop_dl.tui.cli",
                "snapshot",
                "--json",
                "--wait",
                "2.5",
                endpoint,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert snap.returncode == 0, snap.stderr
        (run,) = json.loads(snap.stdout)["runs"]
        assert run["verdict"]["kind"] == "stalled"
        innermost = run["stack"]["frames"][0]
        assert innermost == {
            "file": str(script),
            "line": line,
            "function": "<module>",
            "code": "time.sleep(float(sys.argv[2]))  # STUCK HERE",
        }
        assert run["stack"]["step_index"] == 20 and run["stack"]["stalled_s"] >= 10.0
        assert any(f"stuck.py:{line} in <module>()" in e for e in run["verdict"]["evidence"])
        out, _ = train.communicate(timeout=40)
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
    result = json.loads(out.strip().splitlines()[-1])
    # Twice a stall (once looked at for a framework's evaluation, past 3 typical steps
    # and 2 s, not sent; once taken at the threshold), and never on the training thread:
    # on the publisher thread.
    assert len(result["calls"]) == 2
    for ident, name in result["calls"]:
        assert ident != result["training"] and name == "gputop-publisher"


def test_a_first_step_that_hangs_gets_its_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no step yet there was no stall to take a stack for: a hang in the first step
    (NCCL setup, a loader that cannot start) never showed where it was. It waits from
    the loop's entry (thresholds shortened here: 30 s in use)."""
    monkeypatch.setattr(stacks, "STALL_MIN_S", 0.5)
    monkeypatch.setattr(stacks, "FIRST_STEPS_STALL_S", 1.0)

    def train(p: Any) -> None:
        for i in p.watch(range(2)):
            if i == 0:
                time.sleep(2.5)  # FIRST STEP HANGS HERE

    (stack,) = stacks_sent(train)
    assert stack.step_index == 0 and stack.stalled_s >= 1.0, stack
    assert any(f.code.endswith("# FIRST STEP HANGS HERE") for f in stack.frames), stack.frames
    assert not stack.fetching  # the step's compute hangs, not the loader


def _sleep_deep(depth: int, seconds: float) -> None:
    if depth:
        _sleep_deep(depth - 1, seconds)
    else:
        time.sleep(seconds)


def _hangs_at(n: int, seconds: float) -> Iterator[int]:
    """A loader with no length (counted, not planned) whose batch ``n`` hangs, deeper
    than the frames a stack message keeps."""
    for i in range(400):
        if i == n:
            _sleep_deep(stacks.MAX_FRAMES, seconds)
        yield i


@pytest.mark.parametrize(
    ("hanging", "first_steps"),
    [(0, True), (3, True), (200, False)],  # Python-timed steps; then a counting segment
)
def test_a_hang_in_a_fetch_with_the_probes_frame_on_the_stack_is_a_fetch(
    monkeypatch: pytest.MonkeyPatch, hanging: int, first_steps: bool
) -> None:
    """The probe says "fetching" from its own frame on the stack, all of it (not only the
    frames the message keeps): the viewer reads that one fact."""
    monkeypatch.setattr(stacks, "STALL_MIN_S", 0.5)
    monkeypatch.setattr(stacks, "FIRST_STEPS_STALL_S", 1.0)

    def train(p: Any) -> None:
        for i in p.watch(_hangs_at(hanging, 3.0)):
            time.sleep(0.002)
            if i == 30:
                assert p._segment is not None  # C-timed by now

    (stack,) = stacks_sent(train)
    assert {f.function for f in stack.frames} == {"_sleep_deep"} and stack.left_out > 0
    assert stack.fetching
    assert (stack.step_index < 5) == first_steps, stack.step_index


def test_a_hang_in_a_dataloaders_fetch_between_c_timed_steps_is_a_fetch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torch DataLoader's batches pass from the probe's C chain to the training with no
    frame of the probe's on the stack: the stack says the loader is fetching from the
    probe's clock (a fetch begun, not returned), so the verdict is the loader's hang."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class Hangs(Dataset[Any]):
        def __len__(self) -> int:
            return 400

        def __getitem__(self, i: int) -> Any:
            if i == 200:
                time.sleep(3.0)  # SAMPLE 200 HANGS HERE
            return torch.zeros(1)

    monkeypatch.setattr(stacks, "STALL_MIN_S", 0.5)

    def train(p: Any) -> None:
        for i, _ in enumerate(p.watch(DataLoader(Hangs(), batch_size=4))):
            time.sleep(0.002)
            if i == 30:
                assert p._segment is not None  # C-timed by now

    (stack,) = stacks_sent(train)
    assert any(f.code.endswith("# SAMPLE 200 HANGS HERE") for f in stack.frames), stack.frames
    assert not any(f.file == stacks.WATCH_FILE for f in stack.frames)
    assert stack.fetching
    window = Window(stack.time, steps(50), (), hello(), stack, None)
    assert analyze(window).headline.startswith("Stalled: no batch for")


def stacks_sent(train: Callable[[Any], None]) -> list[Stack]:
    """The stack messages a real probe sends while ``train(probe)`` runs, to a subscriber
    attached before it starts."""
    from gputop_dl import probe
    from gputop_dl.probe.protocol import decode
    from gputop_dl.probe.transport import Subscriber

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    p = probe.Probe(name="stalls", listen=endpoint, system_interval_s=0)
    sub = Subscriber()
    try:
        sub.connect(endpoint)
        time.sleep(0.3)
        train(p)
        p.close()
        deadline = time.monotonic() + 5.0
        read: list[Stack] = []
        while time.monotonic() < deadline and not read:
            for frames in sub.receive(0.2):
                message = decode(frames)
                if isinstance(message, Stack):
                    read.append(message)
    finally:
        p.close()
        sub.close()
    return read


def _validates(seconds: float) -> None:
    """Stands for Lightning's validation, run between two fetches of a watched loader."""
    namespace: dict[str, Any] = {"time": time}
    source = "class _EvaluationLoop:\n    def run(self, s):\n        time.sleep(s)\n"
    exec(compile(source, EVALUATION_LOOP, "exec"), namespace)
    namespace["_EvaluationLoop"]().run(seconds)


@pytest.mark.parametrize("away", [True, False], ids=["validation", "a long step"])
def test_the_probe_sends_a_long_steps_stack_before_a_stall_only_from_away_code(
    away: bool,
) -> None:
    """A 3 s break in a loop of 50 ms steps, under the 10 s stall threshold: in
    Lightning's evaluation loop the probe sends its stack (the viewer says "outside the
    loop" at once); in the training's own code it sends none (no news before a stall)."""

    def train(p: Any) -> None:
        for i in p.watch(range(40)):
            time.sleep(0.05)
            if i == 20:
                _validates(3.0) if away else time.sleep(3.0)

    sent = stacks_sent(train)
    if not away:
        assert sent == []
        return
    (stack,) = sent
    assert stack.step_index == 20 and 2.0 < stack.stalled_s < 3.0, stack  # the step in it
    assert stacks.framework_away(stack) is not None  # (None inside the loader's fetch)
    # The viewer, that long after its last step (steps(20) end at T0 + 2 s): under the
    # stall threshold, outside the loop.
    verdict = analyze(Window(T0 + 2.0 + stack.stalled_s, steps(20), (), hello(), stack, None))
    assert verdict.kind == "outside-loop", verdict
