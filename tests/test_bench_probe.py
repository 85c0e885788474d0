"""``make bench`` keeps working: the probe's cost bench, run small, measures what it says.

The bench reaches into the probe (its step buffer, its publisher) to count the
publisher's work; a change there must not leave the bench broken until someone runs it.
"""

from __future__ import annotations

import re
import sys

import pytest

from bench import probe_overhead, probe_window, publisher_gil


def test_the_probe_cost_bench_runs_its_children_and_reports_every_figure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe_overhead, "STEPS", 300)
    monkeypatch.setattr(probe_overhead, "ADDITIONS", 50)
    probe_overhead.pairs_of("list", 2)  # two: the spread needs two points
    probe_overhead.pairs_of("list", 2, shared_core=True)
    probe_overhead.in_one_process("list", rounds=2, steps=100)
    out = capsys.readouterr().out
    for figure in (
        "bare step (CPU)",
        "whole-process CPU, all threads, flushed",
        "of which the training thread's CPU",
        "floor, two clock reads around next()",
        "of which publisher thread (loop)",
        "of which node sampler (loop)",
        "of which the publisher, sampler and zmq",
        "a pass of watched steps alone",
        "charged by time over the rounds instead",
        "the same in one process",
        "at once on CPU",
    ):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    # Every figure is a number (a child that failed would leave none, or a nan).
    medians = re.findall(r"median (-?\d+\.\d+) us", out)
    assert len(medians) >= 15 and "nan" not in out
    # The other threads are read over watched steps alone: some ran (the pass outlasts
    # the rounds' blocks).
    (alone,) = re.findall(r"a pass of watched steps alone, ([\d,]+) steps", out)
    assert int(alone.replace(",", "")) > 0


def test_the_window_bench_reports_each_kind_from_children_held_to_one_window(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe_window, "WINDOW", (0.3, 1.3, 1.5))
    monkeypatch.setattr(sys, "argv", ["probe_window.py", "2"])
    probe_window.main()
    out = capsys.readouterr().out
    assert "held to one window" in out
    for kind in probe_window.KINDS[1:]:
        assert re.search(rf"{kind}: +median -?\d+\.\d+ us", out), f"{kind} missing:\n{out}"
    assert "nan" not in out


def test_the_publisher_gil_bench_reports_both_arms(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["publisher_gil.py", "1", "0.5", "300"])
    publisher_gil.main()
    out = capsys.readouterr().out
    for arm in ("held", "pyzmq"):
        figures = re.search(rf"{arm} +(\d+) .* (\d+\.\d) \(.*switches/s; publisher (\d+\.\d+)", out)
        assert figures is not None, f"{arm} missing:\n{out}"
        assert int(figures[1]) > 0, f"{arm}: no steps:\n{out}"
    assert "nan" not in out
