"""hl-smi parsing (reference samples verbatim) and the collector against the fake hl-smi.

The fake (tests/fakes/hl-smi) is a real executable put first on PATH, so these tests run
the collector's real subprocess, pipe, timeout and kill paths.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gputop_dl.probe.collectors import hlsmi
from gputop_dl.probe.collectors.hlsmi import (
    HlSmiCollector,
    HlSmiParseError,
    LoopSplitter,
    hpu_sample_from_row,
    parse_hlsmi_csv,
)
from gputop_dl.probe.samples import HpuSample, SourceStatus

FAKES = Path(__file__).parent / "fakes"
MIB = 1 << 20

# -- reference samples, verbatim from /work/shared/reference/hl-smi.md -------------------

GAUDI1_FIELDS = [
    "name",
    "uuid",
    "power.draw",
    "temperature.aip",
    "utilization.aip",
    "memory.used",
    "memory.total",
]
GAUDI1_HEADER_NOUNITS = """\
name, uuid, power.draw [W], temperature.aip [C], utilization.aip [%], memory.used [MiB], memory.total [MiB]
HL-205, 00P1-HL2000A1-14-P64W99-13-05-03, 103, 36, 15, 512, 32768
"""  # noqa: E501 - verbatim
GAUDI3_FIELDS = [
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "power.draw",
    "power.max",
    "temperature.aip",
    "utilization.aip",
]
GAUDI3_NOHEADER_UNITS = """\
0, 01P4-HL3090A0-18-U4V193-22-07-00, HL-325L, 1.22.1-97ec1a4, 131072 MiB, 672 MiB, 130400 MiB, 226 W, 850 W, 36 C, 0 %
1, 01P4-HL3090A0-18-U4V298-03-04-04, HL-325L, 1.22.1-97ec1a4, 131072 MiB, 672 MiB, 130400 MiB, 230 W, 850 W, 39 C, 0 %
"""  # noqa: E501 - verbatim


def test_parse_reference_header_nounits() -> None:
    rows = parse_hlsmi_csv(GAUDI1_HEADER_NOUNITS, GAUDI1_FIELDS)
    assert rows == [
        {
            "name": "HL-205",
            "uuid": "00P1-HL2000A1-14-P64W99-13-05-03",
            "power.draw": "103 W",  # the unit comes from the header
            "temperature.aip": "36 C",
            "utilization.aip": "15 %",
            "memory.used": "512 MiB",
            "memory.total": "32768 MiB",
        }
    ]


def test_parse_reference_noheader_units() -> None:
    rows = parse_hlsmi_csv(GAUDI3_NOHEADER_UNITS, GAUDI3_FIELDS)
    assert len(rows) == 2
    assert rows[0] == {
        "index": "0",
        "uuid": "01P4-HL3090A0-18-U4V193-22-07-00",
        "name": "HL-325L",
        "driver_version": "1.22.1-97ec1a4",  # not a field we convert: passed through
        "memory.total": "131072 MiB",
        "memory.used": "672 MiB",
        "memory.free": "130400 MiB",
        "power.draw": "226 W",
        "power.max": "850 W",
        "temperature.aip": "36 C",
        "utilization.aip": "0 %",
    }
    s = hpu_sample_from_row(rows[1])
    assert s == HpuSample(
        index=1,
        name="HL-325L",
        uuid="01P4-HL3090A0-18-U4V298-03-04-04",
        util_pct=0.0,  # a real 0 %, printed by the tool
        mem_used_bytes=672 * MIB,
        mem_total_bytes=131072 * MIB,
        power_w=230.0,
        power_max_w=850.0,
        temperature_c=39.0,
    )


@pytest.mark.parametrize(
    ("text", "fields", "expected"),
    [
        # noheader + nounits: bare numbers; memory still taken as MiB when converted
        ("3, HL-225, 512, 98304", ["index", "name", "memory.used", "memory.total"],
         [{"index": "3", "name": "HL-225", "memory.used": "512", "memory.total": "98304"}]),
        # N/A (with or without a unit) and empty cells are "not reported"
        ("0, N/A, , 226 W, N/A W", ["index", "uuid", "name", "power.draw", "power.max"],
         [{"index": "0", "uuid": None, "name": None, "power.draw": "226 W", "power.max": None}]),
        # plain "," separators and CRLF line ends are tolerated
        ("0,HL-225,36 C\r\n1,HL-225,37 C\r\n", ["index", "name", "temperature.aip"],
         [{"index": "0", "name": "HL-225", "temperature.aip": "36 C"},
          {"index": "1", "name": "HL-225", "temperature.aip": "37 C"}]),
        # a header with units in the middle of loop output, then nounits rows
        ("index, power.draw [W]\n0, 100\nindex, power.draw [W]\n0, 101\n", ["index", "power.draw"],
         [{"index": "0", "power.draw": "100 W"}, {"index": "0", "power.draw": "101 W"}]),
        # a field this module does not know is kept as text
        ("0, 1600 MHz", ["index", "clocks.limit.tpc"],
         [{"index": "0", "clocks.limit.tpc": "1600 MHz"}]),
        ("\n\n", ["index"], []),
    ],
)  # fmt: skip
def test_parse_table(text: str, fields: list[str], expected: list[dict[str, str | None]]) -> None:
    assert parse_hlsmi_csv(text, fields) == expected


@pytest.mark.parametrize(
    "text",
    [
        "+-----------------------------------------------------------------------------+",
        "0, HL-225",  # too few cells
        "0, HL-225, 1, 2, 3",  # too many
    ],
)
def test_parse_garbage_raises(text: str) -> None:
    with pytest.raises(HlSmiParseError) as info:
        parse_hlsmi_csv(text, ["index", "name", "memory.used"])
    assert info.value.line == text


@pytest.mark.parametrize(
    ("row", "field", "expected"),
    [
        ({"index": "0", "memory.used": "512"}, "mem_used_bytes", 512 * MIB),  # nounits: MiB
        ({"index": "0", "memory.used": "2 GiB"}, "mem_used_bytes", 2 << 30),
        ({"index": "0", "memory.used": "12 parsecs"}, "mem_used_bytes", None),
        ({"index": "0", "power.draw": "226500 mW"}, "power_w", 226.5),
        ({"index": "0", "temperature.aip": "97 F"}, "temperature_c", None),  # not guessed
        ({"index": "0", "utilization.aip": "ERR!"}, "util_pct", None),
        ({"index": "0", "utilization.aip": None}, "util_pct", None),
        ({"index": "0"}, "power_max_w", None),  # not queried: unknown, not zero
    ],
)
def test_conversions(row: dict[str, str | None], field: str, expected: object) -> None:
    assert getattr(hpu_sample_from_row(row), field) == expected


def test_row_without_index_is_unparseable() -> None:
    (row,) = parse_hlsmi_csv(GAUDI1_HEADER_NOUNITS, GAUDI1_FIELDS)
    with pytest.raises(HlSmiParseError):
        hpu_sample_from_row(row)


def test_loop_splitter_on_repeated_first_index() -> None:
    # Loop output: the next sample's rows follow with no separator.
    text = GAUDI3_NOHEADER_UNITS + GAUDI3_NOHEADER_UNITS.replace("226 W", "227 W")
    splitter = LoopSplitter()
    done = [
        d
        for r in parse_hlsmi_csv(text, GAUDI3_FIELDS)
        if (d := splitter.add(hpu_sample_from_row(r)))
    ]
    assert len(done) == 1 and [s.index for s in done[0]] == [0, 1]
    assert done[0][0].power_w == 226.0
    last = splitter.ready()  # the pipe went quiet: the next one is whole, handed early
    assert last is not None and last[0].power_w == 227.0
    assert splitter.ready() is None  # once


def rows(*indices: int, watts: int = 226) -> list[HpuSample]:
    return [
        HpuSample(i, "HL-325L", f"01P{i}", power_w=float(watts), util_pct=50.0) for i in indices
    ]


def test_loop_splitter_never_hands_out_part_of_the_node() -> None:
    """hl-smi cut short mid-sample, or rows printed one at a time: the sample read so
    far is given early only once it holds every device the last whole one had; a
    device that a whole sample lacks is shown lost, not dropped (hl-smi.md: a new
    sample starts when the first device appears again)."""
    splitter = LoopSplitter()
    for sample in rows(0):
        splitter.add(sample)
    assert [s.index for s in splitter.ready() or ()] == [0]  # before any whole: as read
    for sample in rows(1, 2, 3):
        splitter.add(sample)
    assert [s.index for s in splitter.ready() or ()] == [0, 1, 2, 3]  # more of it
    (whole,) = [d for s in rows(0, 1) if (d := splitter.add(s))]  # device 0 again
    assert [s.index for s in whole] == [0, 1, 2, 3]
    assert splitter.ready() is None  # 2 of 4: a part, held
    assert splitter.add(rows(2)[0]) is None and splitter.ready() is None  # 3 of 4
    assert splitter.add(rows(3)[0]) is None
    early = splitter.ready()
    assert early is not None and [s.index for s in early] == [0, 1, 2, 3]
    # Device 2 stops being listed: the next whole sample says so.
    # (the first done is the early one, whole again: published twice, the same rows)
    again, gone = [d for s in rows(0, 1, 3, 0) if (d := splitter.add(s))]
    assert again == early
    assert [(s.index, s.state) for s in gone] == [(0, "ok"), (1, "ok"), (2, "lost"), (3, "ok")]
    assert gone[2].error == "hl-smi no longer lists it" and gone[2].util_pct is None


# -- the fake hl-smi itself --------------------------------------------------------------


def run_fake(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAKES / "hl-smi"), *args],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, **env},
        check=False,
    )


def test_fake_prints_reference_formats() -> None:
    out = run_fake(
        ["-Q", ",".join(GAUDI1_FIELDS), "-f", "csv,nounits"], FAKE_HLSMI_MODEL="HL-205"
    ).stdout
    lines = out.splitlines()
    assert lines[0] == GAUDI1_HEADER_NOUNITS.splitlines()[0]  # byte for byte
    assert re.fullmatch(
        r"HL-205, 00P1-HL2000A1-14-P64W99-13-05-0\d, \d+, \d+, \d+, \d+, 32768", lines[1]
    )
    assert len(lines) == 9

    out = run_fake(
        ["-Q", ",".join(GAUDI3_FIELDS), "--format", "csv,noheader"],
        FAKE_HLSMI_MODEL="HL-325L",
        FAKE_HLSMI_DEVICES="2",
    ).stdout
    shape = (
        r"\d, [0-9A-Z-]+, HL-325L, 1\.22\.1-97ec1a4, "
        r"\d+ MiB, \d+ MiB, \d+ MiB, \d+ W, 850 W, \d+ C, \d+ %"
    )
    ref = GAUDI3_NOHEADER_UNITS.splitlines()
    assert all(re.fullmatch(shape, line) for line in ref)  # the pattern fits the reference
    assert all(re.fullmatch(shape, line) for line in out.splitlines())  # and the fake
    assert out.splitlines()[0].startswith(ref[0][:35])

    long_form = run_fake(["--query-aip=index,power.draw", "--format=csv,noheader,nounits"]).stdout
    assert long_form.splitlines()[0] == "0, 100"


# -- the collector with the fake ---------------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Fake hl-smi first on PATH; no fallback dirs; pid and argv logs in tmp_path.

    This interpreter's directory comes next, so the fake's ``#!/usr/bin/env python3``
    starts this Python directly instead of through a slow version-manager shim.
    """
    path = os.pathsep.join([str(FAKES), os.path.dirname(sys.executable), os.environ["PATH"]])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setattr(hlsmi, "SEARCH_DIRS", ())
    monkeypatch.setenv("FAKE_HLSMI_PIDFILE", str(tmp_path / "pids"))
    monkeypatch.setenv("FAKE_HLSMI_ARGVLOG", str(tmp_path / "argv"))
    for key in ("FAKE_HLSMI_MODE", "FAKE_HLSMI_DEVICES", "FAKE_HLSMI_MODEL"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def make(timeout_s: float = 1.0) -> HlSmiCollector:
    col = HlSmiCollector(interval_s=0.2, timeout_s=timeout_s)
    col.min_loop_s = 0.2  # the real tool takes whole seconds; keep the tests fast
    col.restart_backoff_s = 0.05
    return col


Latest = tuple[tuple[HpuSample, ...], SourceStatus]


# A latest() that waited for hl-smi would wait out a hung child: HANG_TIMEOUT_S in the
# hang test. A bound of a few ms (0.05 s until 2026-11-27) is also met by such a call
# between two runs of the fake, and a loaded CI machine can stall any call that long.
BLOCKED_S = 0.25
HANG_TIMEOUT_S = 1.0


def wait_for(col: HlSmiCollector, pred: Callable[[Latest], bool], timeout: float = 4.0) -> Latest:
    """Poll latest() like a sampler would; also checks that it never blocks."""
    end = time.monotonic() + timeout
    while True:
        t0 = time.perf_counter()
        got = col.latest()
        assert time.perf_counter() - t0 < BLOCKED_S, "latest() blocked"
        if pred(got):
            return got
        if time.monotonic() > end:
            raise AssertionError(f"condition not met; last latest() = {got[1]}")
        time.sleep(0.01)


def pids(tmp: Path) -> list[int]:
    path = tmp / "pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def argvs(tmp: Path) -> list[list[str]]:
    path = tmp / "argv"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ok_loop_child(env: Path) -> None:
    col = make()
    assert col.latest() == ((), SourceStatus("hl-smi", False, "hl-smi not started", "starting"))
    col.start()
    try:
        hpus, status = wait_for(col, lambda g: g[1].ok)
        assert status == SourceStatus("hl-smi", True, "")
        assert [h.index for h in hpus] == list(range(8))
        h = hpus[3]
        assert h.name == "HL-225" and h.uuid == "01P0-HL2080A0-15-TNQ0B4-21-04-03"
        assert h.state == "ok" and h.error is None
        assert h.mem_total_bytes == 98304 * MIB
        assert h.mem_used_bytes is not None and h.mem_used_bytes % MIB == 0
        assert h.power_max_w == 600.0 and h.temperature_c == 39.0
        assert h.power_w is not None and 100 <= h.power_w < 120
        first = hpus
        wait_for(col, lambda g: g[0] != first)  # later samples of the same child arrive
        time.sleep(0.3)
        assert len(pids(env)) == 1  # one long-lived child, not a spawn per sample
        assert argvs(env)[0] == [
            "-Q",
            "index,uuid,name,memory.used,memory.total,power.draw,power.max,"
            "temperature.aip,utilization.aip",
            "-f",
            "csv,noheader",
            "-l",
            "0.2",
        ]
    finally:
        col.close()
    assert not alive(pids(env)[0])


def test_na_fields_are_none(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "na")
    col = make()
    col.start()
    try:
        hpus, _ = wait_for(col, lambda g: g[1].ok)
        assert hpus[0].power_max_w == 600.0 and hpus[0].temperature_c == 36.0
        assert hpus[1].power_max_w is None and hpus[1].temperature_c is None
        assert hpus[1].power_w is not None
        assert hpus[2].util_pct is None and hpus[2].temperature_c == 38.0
        assert hpus[3].mem_used_bytes is None and hpus[3].mem_total_bytes is None
        assert hpus[3].power_w is None and hpus[3].util_pct is not None
        four = hpus[4]  # empty cells: not reported, never a 0
        assert (four.util_pct, four.mem_used_bytes, four.power_w, four.name) == (None,) * 4
        assert four.mem_total_bytes is not None and four.state == "ok"
    finally:
        col.close()


def test_hang_times_out_without_delaying_callers(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "hang")
    col = make(timeout_s=HANG_TIMEOUT_S)
    t0 = time.perf_counter()
    col.start()
    assert time.perf_counter() - t0 < BLOCKED_S  # start() returns at once
    try:
        hpus, status = col.latest()
        assert hpus == () and not status.ok
        hpus, status = wait_for(col, lambda g: "timed out" in g[1].message and bool(pids(env)))
        assert status == SourceStatus("hl-smi", False, "hl-smi timed out after 1 s", "failing")
        assert hpus == ()
    finally:
        t0 = time.perf_counter()
        col.close()
        assert time.perf_counter() - t0 < HANG_TIMEOUT_S  # the hung child killed, not waited for
    assert pids(env) and not any(alive(p) for p in pids(env))  # hung children were killed


def test_default_timeout_message() -> None:
    col = HlSmiCollector()
    assert col._describe(hlsmi._Outcome("timeout")) == "hl-smi timed out after 2 s"


def test_fail_reports_first_stderr_line(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "fail")
    col = make()
    col.start()
    try:
        _, status = wait_for(col, lambda g: "exited" in g[1].message)
        assert status == SourceStatus(
            "hl-smi",
            False,
            "hl-smi exited with code 1: fake hl-smi: failure requested (mode=fail)",
            "failing",
        )
    finally:
        col.close()
    queries = [a[1] for a in argvs(env)]
    # tried without the version-dependent power.max, then asked for it again
    assert "power.max" in queries[0] and "power.max" not in queries[1]
    assert len(queries) < 3 or "power.max" in queries[2]


def test_unknown_field_retries_without_power_max(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "unknown-field")
    col = make()
    col.start()
    try:
        hpus, _ = wait_for(col, lambda g: g[1].ok)
        assert len(hpus) == 8 and all(h.power_max_w is None for h in hpus)
        assert all(h.power_w is not None for h in hpus)
    finally:
        col.close()
    queries = [a[1] for a in argvs(env)]
    assert "power.max" in queries[0] and "power.max" not in queries[1]


def test_garbage_output(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "garbage")
    col = make()
    col.start()
    try:
        hpus, status = wait_for(col, lambda g: "unparseable" in g[1].message)
        assert hpus == ()
        assert status.message == (
            "hl-smi printed unparseable output: +" + "-" * 59  # first 60 characters
        )
    finally:
        col.close()


def test_stalled_loop_is_marked_stale_then_restarted(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "stall")  # one sample, then silence
    col = make(timeout_s=0.5)
    col.start()
    try:
        wait_for(col, lambda g: g[1].ok)
        hpus, status = wait_for(col, lambda g: "stale" in g[1].message)
        assert not status.ok and status.message.startswith("hl-smi data stale: no update for")
        assert len(hpus) == 8 and {h.state for h in hpus} == {"stale"}
        assert all((h.error or "").startswith("stale: no update for") for h in hpus)
        wait_for(col, lambda g: len(pids(env)) >= 2 and g[1].ok)  # killed and restarted
    finally:
        col.close()
    assert not any(alive(p) for p in pids(env))


def test_dying_child_is_restarted(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "die")  # one sample, then exit 1
    col = make()
    col.start()
    try:
        wait_for(col, lambda g: len(pids(env)) >= 3)
        hpus, _ = col.latest()
        assert len(hpus) == 8
    finally:
        col.close()
    assert all("power.max" in a[1] for a in argvs(env))  # it worked with power.max


def test_block_buffered_loop_falls_back_to_one_shot(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "buffered")
    col = make(timeout_s=0.4)
    col.start()
    try:
        hpus, _ = wait_for(col, lambda g: g[1].ok)
        assert len(hpus) == 8
        wait_for(col, lambda g: len(argvs(env)) >= 3)
    finally:
        col.close()
    calls = argvs(env)
    assert "-l" in calls[0] and all("-l" not in a for a in calls[1:])


def test_not_installed(env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    col = make()
    col.start()
    assert col.latest() == ((), SourceStatus("hl-smi", False, "hl-smi not installed", "absent"))
    col.close()
    col.close()

    col = HlSmiCollector(executable=str(tmp_path / "nope" / "hl-smi"))
    col.start()
    _, status = col.latest()
    assert not status.ok and status.message.startswith("hl-smi not installed")
    col.close()


def test_found_in_fallback_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hlsmi, "SEARCH_DIRS", ("/nonexistent", str(FAKES)))
    assert hlsmi.find_hlsmi() == str(FAKES / "hl-smi")
    assert hlsmi.find_hlsmi(str(FAKES / "hl-smi")) == str(FAKES / "hl-smi")


def test_child_killed_at_interpreter_exit(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "hang")
    script = f"""
import os, time
from gputop_dl.probe.collectors.hlsmi import HlSmiCollector
col = HlSmiCollector(timeout_s=30)
col.start()
end = time.monotonic() + 15  # a loaded CI host once took over 5 s to start the fake
while not os.path.exists({str(env / "pids")!r}) and time.monotonic() < end:
    time.sleep(0.01)
# exit without close()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    assert pids(env), "the fake hl-smi never started (so its kill at exit is not tested)"
    time.sleep(0.4)  # long enough for a wrongly respawned child to log its pid
    assert not any(alive(p) for p in pids(env))


@pytest.mark.parametrize("mode", ["partial-exit", "partial-hang", "drop-device", "slow-rows"])
def test_never_part_of_the_node_as_the_whole(
    env: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hl-smi cut short mid-sample (killed, failing, hung) or rows trickling out: no
    published sample holds fewer devices than the node's, as ok or lost."""
    monkeypatch.setenv("FAKE_HLSMI_MODE", mode)
    monkeypatch.setenv("FAKE_HLSMI_DEVICES", "4")
    monkeypatch.setenv("FAKE_HLSMI_ROW_GAP_S", "0.2")  # over quiet_s: each row alone
    col = make(timeout_s=0.6)
    published: list[tuple[HpuSample, ...]] = []
    real_publish = col._publish

    def publish(samples: tuple[HpuSample, ...]) -> None:
        published.append(samples)
        real_publish(samples)

    col._publish = publish  # type: ignore[method-assign]
    col.start()
    try:
        time.sleep(2.5)
        got, status = col.latest()
    finally:
        col.close()
    assert published, status
    # Before a first whole sample the collector knows no count: the first sample of a
    # child whose rows trickle out is published as it grows (then whole, at the next).
    whole = [p for p in published if len(p) == 4]
    assert whole, published
    after_first_whole = published[published.index(whole[0]) :]
    assert all(len(p) == 4 for p in after_first_whole), [len(p) for p in published]
    if mode == "drop-device":
        assert [(s.index, s.state) for s in got][-1] == (3, "lost")
        assert got[-1].error == "hl-smi no longer lists it"


def test_one_hung_first_call_does_not_mean_a_process_a_sample_for_ever(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hl-smi.md: a long-running loop child avoids a process spawn per sample. A first
    call that hung (a busy device at start) switches to one-shot calls for a while,
    then a loop child is tried again, and kept once it works."""
    monkeypatch.setenv("FAKE_HLSMI_MODE", "hang-first")
    monkeypatch.setenv("FAKE_HLSMI_MARK", str(env / "mark"))
    col = make(timeout_s=0.4)
    col.loop_retry_s = 0.8
    col.start()
    try:
        wait_for(col, lambda g: g[1].ok and len(g[0]) == 8)
        wait_for(col, lambda g: any("-l" in a for a in argvs(env)[1:]), timeout=6.0)
        spawned = len(argvs(env))
        time.sleep(1.0)  # five samples at 0.2 s
        assert len(argvs(env)) == spawned  # one loop child, no more spawns
        assert col.latest()[1].ok
    finally:
        col.close()
    calls = argvs(env)
    assert "-l" in calls[0] and "-l" not in calls[1] and "-l" in calls[-1]
