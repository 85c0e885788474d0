"""``gputop export``: the Chrome Trace Event JSON checked against the trace-event format
(slices nest, µs timestamps, named tracks), and the CSV tables read back."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe.messages import StepRecord, Steps
from gputop_dl.tui.cli import main
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.record.export import step_slices
from gputop_dl.tui.record.reader import load_timeline
from tests.fakes_tui import SOURCE_ID, T0, step_records, steps_events, systems_events
from tests.recordings import END, FAULT_AT, fault_run, write_events

PHASES = (("forward", 0.004), ("backward", 0.006), ("optimizer", 0.001))


def with_phases_and_replays() -> list[SourceEvent]:
    """The fault run, plus: steps with named phases, a history replay repeating earlier
    steps messages (as a probe does for a new subscriber), and GPUs in the samples."""
    events = []
    for event in fault_run():
        assert isinstance(event, Received)
        message = event.message
        if isinstance(message, Steps):
            records = tuple(
                StepRecord(r.index, r.end_time, r.period_s, r.wait_s, r.samples, phases=PHASES)
                if r.index % 2 == 0
                else r
                for r in message.records
            )
            message = Steps(message.source_id, records, message.sent, message.dropped)
        elif type(message).__name__ == "System":
            continue
        events.append(Received(message, event.received))
    events += systems_events(T0 + 1.0, END - 0.5, SOURCE_ID, gpu_count=2)
    replayed = [e for e in events if isinstance(e.message, Steps)][:20]  # type: ignore[union-attr]
    events += [Received(e.message, T0 + 30.0) for e in replayed]  # type: ignore[union-attr]
    events.sort(key=lambda e: e.received)  # type: ignore[union-attr]
    return events


@pytest.fixture
def exported(tmp_path: Path) -> tuple[dict[str, Any], Path, list[SourceEvent]]:
    events = with_phases_and_replays()
    path = tmp_path / "run.gtrec"
    write_events(path, events)
    out = tmp_path / "trace.json"
    folder = tmp_path / "csv"
    assert main(["export", str(path), "--perfetto", str(out), "--csv", str(folder)]) == 0
    return json.loads(out.read_text()), folder, events


def unique_steps(events: list[SourceEvent]) -> dict[int, StepRecord]:
    steps: dict[int, StepRecord] = {}
    for event in events:
        if isinstance(event, Received) and isinstance(event.message, Steps):
            for record in event.message.records:
                steps.setdefault(record.index, record)
    return steps


# -------------------------------------------------------------- the trace format


def check_nesting(slices: list[dict[str, Any]]) -> int:
    """Slices of one track either nest or follow each other; returns the deepest level."""
    ordered = sorted(slices, key=lambda e: (e["ts"], -e["dur"]))
    stack: list[int] = []  # end times
    deepest = 0
    for event in ordered:
        start, end = event["ts"], event["ts"] + event["dur"]
        while stack and stack[-1] <= start:
            stack.pop()
        assert not stack or end <= stack[-1], f"{event} overlaps its parent"
        stack.append(end)
        deepest = max(deepest, len(stack))
    return deepest


def test_the_trace_is_valid_trace_event_json(
    exported: tuple[dict[str, Any], Path, list[SourceEvent]],
) -> None:
    trace, _, _ = exported
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        assert {"name", "ph", "pid"} <= event.keys()
        assert event["ph"] in {"X", "C", "i", "M"}
        if event["ph"] == "M":
            assert isinstance(event["args"], dict)
            continue
        assert event["pid"] in named_pids  # every process has a readable name
        assert isinstance(event["ts"], int)  # µs, integer
        assert T0 * 1e6 - 1 <= event["ts"] <= END * 1e6 + 1e6  # µs, not s or ns
        if event["ph"] == "X":
            assert isinstance(event["dur"], int) and event["dur"] >= 0
            assert (event["pid"], event["tid"]) in named_threads
            tracks[(event["pid"], event["tid"])].append(event)
        elif event["ph"] == "C":
            assert event["args"] and all(isinstance(v, int | float) for v in event["args"].values())
        elif event["ph"] == "i":
            assert event["s"] in {"g", "p", "t"}
    assert len(tracks) == 1
    assert check_nesting(next(iter(tracks.values()))) == 3  # step > compute > phase


def test_one_slice_per_step_with_its_wait_compute_and_phases(
    exported: tuple[dict[str, Any], Path, list[SourceEvent]],
) -> None:
    trace, _, events = exported
    steps = unique_steps(events)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    step_slices_ = [e for e in slices if e["cat"] == "step"]
    assert len(step_slices_) == len(steps)  # history replays de-duplicated
    record = steps[10]
    mine = next(e for e in step_slices_ if e["args"]["index"] == 10)
    assert mine["ts"] == round(record.end_time * 1e6) - round(record.period_s * 1e6)
    assert mine["dur"] == round(record.period_s * 1e6)
    inside = [
        e
        for e in slices
        if mine["ts"] <= e["ts"] and e["ts"] + e["dur"] <= mine["ts"] + mine["dur"]
    ]
    names = [e["name"] for e in sorted(inside, key=lambda e: (e["ts"], -e["dur"]))]
    assert names == ["step 10", "data wait", "compute", "forward", "backward", "optimizer"]
    wait = next(e for e in inside if e["name"] == "data wait")
    assert wait["dur"] == round(record.wait_s * 1e6)  # type: ignore[operator]


def test_counters_and_verdict_changes(
    exported: tuple[dict[str, Any], Path, list[SourceEvent]],
) -> None:
    trace, _, _ = exported
    counters = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "C":
            counters[event["name"]].append(event)
    for name in ("samples/s", "CPU %", "memory bytes", "disk bytes/s", "network bytes/s"):
        assert counters[name], name
    assert counters["gpu0 util %"] and counters["gpu1 memory bytes"]
    rates = counters["samples/s"]
    before = [e["args"]["samples/s"] for e in rates if e["ts"] < (FAULT_AT - 5) * 1e6]
    after = [e["args"]["samples/s"] for e in rates if e["ts"] > (FAULT_AT + 5) * 1e6]
    assert 350 < sorted(before)[len(before) // 2] < 450
    assert 100 < sorted(after)[len(after) // 2] < 140
    assert set(counters["disk bytes/s"][0]["args"]) == {"read", "write"}
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    names = [e["name"] for e in sorted(instants, key=lambda e: e["ts"])]
    assert "compute-bound" in names and names[-1].startswith("input-bound")
    change = next(e for e in instants if e["name"].startswith("input-bound"))
    assert FAULT_AT * 1e6 <= change["ts"] <= (FAULT_AT + 30) * 1e6
    assert change["args"]["severity"] == "warning"


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        # (name, start offset µs, duration µs) relative to the step's start
        (
            StepRecord(0, 10.0, 1.0, 0.25, 8),
            [("step 0", 0, 1_000_000), ("data wait", 0, 250_000), ("compute", 250_000, 750_000)],
        ),
        (StepRecord(1, 10.0, 1.0, None, 8), [("step 1", 0, 1_000_000), ("compute", 0, 1_000_000)]),
        (  # a wait longer than the step (clock rounding): clamped, no compute
            StepRecord(2, 10.0, 1.0, 1.5, 8),
            [("step 2", 0, 1_000_000), ("data wait", 0, 1_000_000)],
        ),
        (  # phases longer than the compute: the last is cut at the step's end
            StepRecord(3, 10.0, 1.0, 0.5, 8, phases=(("fwd", 0.3), ("bwd", 0.4))),
            [
                ("step 3", 0, 1_000_000),
                ("data wait", 0, 500_000),
                ("compute", 500_000, 500_000),
                ("fwd", 500_000, 300_000),
                ("bwd", 800_000, 200_000),
            ],
        ),
    ],
)
def test_step_slices(record: StepRecord, expected: list[tuple[str, int, int]]) -> None:
    slices = list(step_slices(record, pid=1))
    start = slices[0]["ts"]
    assert [(e["name"], e["ts"] - start, e["dur"]) for e in slices] == expected
    check_nesting(slices)


# ------------------------------------------------------------------------- CSV


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def test_the_csv_tables_read_back(
    exported: tuple[dict[str, Any], Path, list[SourceEvent]],
) -> None:
    _, folder, events = exported
    steps = unique_steps(events)
    rows = read(folder / "steps.csv")
    assert len(rows) == len(steps)
    assert {"period_s", "wait_s", "end_time_unix_s", "samples"} <= rows[0].keys()
    for row in rows[:50]:
        record = steps[int(row["index"])]
        assert float(row["period_s"]) == record.period_s
        assert float(row["end_time_unix_s"]) == record.end_time
        assert row["device_idle_s"] == ""  # not reported: empty, never 0
        phases = json.loads(row["phases_s"]) if row["phases_s"] else {}
        assert phases == (dict(PHASES) if record.index % 2 == 0 else {})
    system = read(folder / "system.csv")
    assert len(system) == len(range(int(T0 + 1), int(END - 0.5) + 1))
    assert all(h.endswith(("_s", "_pct", "_bytes", "_per_s", "host", "_1m")) for h in system[0])
    assert float(system[0]["mem_used_bytes"]) > 0 and float(system[0]["disk_read_bytes_per_s"]) > 0
    devices = read(folder / "devices.csv")
    assert len(devices) == 2 * len(system) and {d["index"] for d in devices} == {"0", "1"}
    verdicts = read(folder / "verdicts.csv")
    kinds = [v["kind"] for v in verdicts]
    assert "compute-bound" in kinds and kinds[-1] == "input-bound"


def test_export_says_what_to_write_and_refuses_a_non_recording(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(SystemExit) as exc:
        main(["export", str(other)])
    assert exc.value.code == 2
    assert main(["export", str(other), "--csv", str(tmp_path / "out")]) == 1
    assert main(["export", str(tmp_path / "missing"), "--csv", str(tmp_path / "out")]) == 1


@pytest.mark.parametrize("span", [["--from", "1h"], ["--from", "30s", "--to", "10s"]])
def test_a_range_outside_the_recording_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], span: list[str]
) -> None:
    """It exported empty step tables and verdict rows stamped past the recording's end."""
    path = tmp_path / "r.gtrec"
    write_events(path, fault_run())
    out = tmp_path / "out"
    assert main(["export", str(path), "--csv", str(out), *span]) == 2
    assert "hold none of the recording" in capsys.readouterr().err
    assert not out.exists()


def test_export_refuses_a_fifo_without_waiting_for_a_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Opening a FIFO waits for a writer: `gputop export FIFO` hung for good."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["export", str(fifo), "--csv", str(tmp_path / "out")]) == 1
    assert "not a regular file" in capsys.readouterr().err


def test_an_empty_run_exports_an_empty_but_loadable_trace(tmp_path: Path) -> None:
    path = tmp_path / "quiet.gtrec"
    write_events(path, steps_events(step_records(T0, 0.0)) or [])
    out = tmp_path / "t.json"
    assert main(["export", str(path), "--perfetto", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"] == []


def test_a_stretch_of_the_recording(tmp_path: Path) -> None:
    path = tmp_path / "run.gtrec"
    write_events(path, with_phases_and_replays())
    folder = tmp_path / "csv"
    assert main(["export", str(path), "--csv", str(folder), "--from", "30s", "--to", "-20s"]) == 0
    start = T0 + 30.0
    end = load_timeline(path).end - 20.0
    steps = read(folder / "steps.csv")
    times = [float(row["end_time_unix_s"]) for row in steps]
    assert steps and start <= min(times) and max(times) <= end
    assert min(times) < start + 1 and max(times) > end - 1
    system = [float(row["time_unix_s"]) for row in read(folder / "system.csv")]
    assert start <= min(system) and max(system) <= end
    verdicts = read(folder / "verdicts.csv")
    assert float(verdicts[0]["time_unix_s"]) == start  # what was shown when it begins
    assert verdicts[0]["kind"] == "compute-bound" and verdicts[-1]["kind"] == "input-bound"
    assert main(["export", str(path), "--csv", str(folder), "--from", "later"]) == 2
