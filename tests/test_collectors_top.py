"""The node's busiest processes: real psutil on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop_dl.probe.collectors.sampler import NodeSampler, samples_between_walks
from gputop_dl.probe.collectors.top import Row, TopCollector, busiest
from gputop_dl.probe.samples import TOP_EVERY, TopProcess


def proc(pid: int, cpu: float | None, rss: int | None) -> Row:
    return (pid, 1, f"p{pid}", cpu, rss)


@pytest.mark.parametrize(
    ("processes", "by_cpu", "by_memory", "expected"),
    [
        ([], 3, 1, []),
        # the busiest by CPU first, busiest first
        ([proc(1, 5.0, 10), proc(2, 50.0, 10), proc(3, 20.0, 10)], 2, 0, [2, 3]),
        # then the largest resident sets not already in, even idle or without a figure
        ([proc(1, 5.0, 10), proc(2, 50.0, 10), proc(3, None, 900)], 1, 1, [2, 3]),
        # a tie in CPU goes to the bigger process
        ([proc(1, 10.0, 5), proc(2, 10.0, 50)], 1, 0, [2]),
        # no CPU figure yet (first sight): never ranked as if it were 0 %
        ([proc(1, None, 10), proc(2, 0.0, 10)], 2, 0, [2]),
        # unknown memory counts as none
        ([proc(1, None, None), proc(2, None, 7)], 0, 1, [2]),
    ],
)
def test_busiest(processes: list[Row], by_cpu: int, by_memory: int, expected: list[int]) -> None:
    chosen = busiest(processes, by_cpu, by_memory)
    assert [p.pid for p in chosen] == expected
    assert all(type(p) is TopProcess for p in chosen)  # what a sample carries


def test_a_busy_process_tops_the_list_from_the_second_sample() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        collector = TopCollector(by_cpu=10, by_memory=0)
        first = collector.sample()
        assert first is not None
        assert all(p.cpu_pct is not None for p in first)  # none ranked without a figure
        assert spin.pid not in {p.pid for p in first}  # no figure yet: not ranked by CPU
        deadline = time.monotonic() + 20.0
        found: TopProcess | None = None
        while found is None or (found.cpu_pct or 0.0) < 30.0:
            assert time.monotonic() < deadline, "the spinning child never showed up busy"
            time.sleep(0.5)
            found = next((p for p in collector.sample() or () if p.pid == spin.pid), None)
        assert found.ppid is not None and found.rss_bytes and found.rss_bytes > 0
        assert found.name.startswith("python")
    finally:
        spin.kill()
        spin.wait()


def test_a_process_gone_between_samples_is_dropped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    collector = TopCollector(by_cpu=1000, by_memory=0)
    collector.sample()
    time.sleep(0.3)
    assert child.pid in {p.pid for p in collector.sample() or ()}
    child.kill()
    child.wait()
    assert child.pid not in {p.pid for p in collector.sample() or ()}


def stat_line(pid: int, name: str, ppid: int, utime: int, stime: int, start: int, rss: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss ...
    return (
        f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 "
        f"{start} 1000 {rss} 0 0"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (stat_line(7, "python", 1, 150, 50, 99, 10), ("python", 1, 2.0, 10 * 4096, 99)),
        # a name with spaces and parentheses: everything up to the last ")"
        (stat_line(7, "a) (b c", 3, 0, 0, 5, 1), ("a) (b c", 3, 0.0, 4096, 5)),
        ("7 (python S 1", None),  # no closing parenthesis
        ("7 (x) S", None),  # cut short
        ("7 (x) S one 1 1 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5 1000 1", None),  # not a number
    ],
)
def test_parse_stat(text: str, expected: tuple[str, int, float, int, int] | None) -> None:
    import gputop_dl.probe.collectors.top as top

    if expected is not None and (top.TICKS, top._PAGE) != (100, 4096):
        pytest.skip("the table assumes 100 ticks a second and 4 KiB pages")
    assert top.parse_stat(text) == expected


def test_cpu_share_over_the_interval_and_a_reused_pid_starts_over(tmp_path: Path) -> None:
    now = [100.0]

    def write(pid: int, utime: int, start: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "stat").write_text(stat_line(pid, "w", 1, utime, 0, start, 5))

    write(10, 0, start=1)
    write(11, 0, start=1)
    (tmp_path / "self").mkdir()  # not a pid: skipped
    collector = TopCollector(proc_root=str(tmp_path), clock=lambda: now[0])
    assert {p.pid: p.cpu_pct for p in collector.sample() or ()} == {10: None, 11: None}
    ticks = os.sysconf("SC_CLK_TCK")
    write(10, ticks // 2, start=1)  # half a second of CPU in 2 s: 25 %
    write(11, ticks, start=2)  # a new process under the same pid: no figure yet
    now[0] = 102.0
    top = {p.pid: p.cpu_pct for p in collector.sample() or ()}
    assert top[10] == pytest.approx(25.0, abs=1.0) and top[11] is None


def test_without_proc_nothing_is_reported(tmp_path: Path) -> None:
    assert TopCollector(proc_root=str(tmp_path / "missing")).sample() is None


@pytest.mark.parametrize(
    ("walk_cpu_s", "pace_s", "expected"),
    [
        (0.001, 1.0, TOP_EVERY),  # a container's 60 processes: every TOP_EVERY samples
        (0.020, 1.0, 20),  # 1,000 processes: 20 ms spread over 20 s is 1 ms a second
        (0.0201, 1.0, 21),  # rounded up: never over the share
        (0.020, 5.0, TOP_EVERY),  # nobody watching, a sample every 5 s: 20 ms in 25 s
        (0.100, 0.5, 200),
        (0.0, 1.0, TOP_EVERY),
        (float("nan"), 1.0, TOP_EVERY),  # a clock that said nothing useful
        (0.020, 0.0, TOP_EVERY),
        (0.020, -1.0, TOP_EVERY),
        (0.020, float("nan"), TOP_EVERY),
        (0.020, float("inf"), TOP_EVERY),
        (0.01, 5e-324, 1_000_000_000),  # a pace near zero: capped, not ZeroDivisionError
        (0.01, 1e-310, 1_000_000_000),  # nor OverflowError
        (float("inf"), 1.0, 1_000_000_000),
    ],
)
def test_walks_of_proc_are_spaced_by_their_cost(
    walk_cpu_s: float, pace_s: float, expected: int
) -> None:
    assert samples_between_walks(walk_cpu_s, pace_s) == expected


class SlowWalk:
    """A process table whose walk takes ``cpu_s`` of this thread's CPU, as a node of
    thousands of processes does."""

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s
        self.walks = 0

    def sample(self) -> tuple[TopProcess, ...]:
        self.walks += 1
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return (TopProcess(1, 0, "init", 0.0, 1),)


def test_a_costly_walk_of_proc_runs_less_often_and_its_table_is_repeated_between() -> None:
    sampler = NodeSampler(main_pid=None, interval_s=1.0, host=True, accelerators=False)
    slow = sampler._top = SlowWalk(0.012)  # just over 12 ms a walk: one in 13 samples at 1 s
    samples = [sampler.sample() for _ in range(30)]
    assert slow.walks == 3  # samples 1, 14 and 27 (1, 13 and 25 if it took 12 ms exactly)
    assert all(s.top is not None and s.top[0].name == "init" for s in samples)
    # Each sample says when its table was read: at the sample that walked, repeated after.
    walked = [i for i, s in enumerate(samples) if s.top_time == s.time]
    assert len(walked) == 3 and walked[0] == 0
    for i, s in enumerate(samples):
        last_walk = max(w for w in walked if w <= i)
        assert s.top_time == samples[last_walk].time
    cheap = sampler._top = SlowWalk(0.0)
    sampler.pace(0.5)  # a faster pace (a viewer attached): a walk at once, then every 5
    for _ in range(11):
        sampler.sample()
    assert cheap.walks == 3
