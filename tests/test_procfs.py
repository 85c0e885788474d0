"""Reading /proc holding the GIL (procfs.py) and psutil's counters parsed from it
(procstat.py): the same bytes and figures as Python's files and psutil, and a node sample
that no longer hands the GIL to a busy training thread at every system call."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from gil import progress_during

from gputop_dl.probe.collectors import procfs, procstat
from gputop_dl.probe.collectors.sampler import NodeSampler

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc")


@linux
@pytest.mark.parametrize("name", ["stat", "meminfo", "diskstats", "net/dev", "self/stat"])
def test_a_proc_file_reads_as_pythons_own_read_of_it(name: str) -> None:
    path = f"/proc/{name}"
    held = procfs.read_bytes(path)
    with open(path, "rb") as f:
        plain = f.read()
    # The counters move between the two reads; the layout does not.
    assert [line.split()[:1] for line in held.splitlines()] == [
        line.split()[:1] for line in plain.splitlines()
    ]
    text = procfs.read_text(path)  # read again: compared by layout too
    assert [line.split()[:1] for line in text.splitlines()] == [
        line.split()[:1] for line in held.decode().splitlines()
    ]


READS = [procfs.read_bytes, procfs.read_single]


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("size", [0, 1, procfs.CHUNK - 1, procfs.CHUNK, procfs.CHUNK * 3 + 17])
def test_a_file_of_any_length_comes_whole(
    read: Callable[[str], bytes], size: int, tmp_path: Path
) -> None:
    data = os.urandom(size)
    path = tmp_path / "file"
    path.write_bytes(data)
    assert read(str(path)) == data
    assert procfs._read_unheld(str(path)) == data


class CountingLibc:
    """libc as procfs calls it, its reads counted."""

    def __init__(self, libc: Any) -> None:
        self.libc = libc
        self.reads = 0

    def open(self, *args: Any) -> int:
        return int(self.libc.open(*args))

    def read(self, *args: Any) -> int:
        self.reads += 1
        return int(self.libc.read(*args))

    def close(self, *args: Any) -> int:
        return int(self.libc.close(*args))


@linux
def test_a_one_record_proc_file_reads_whole_in_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/<pid>/stat is one seq_file record: one read takes it whole, so read_single
    reads what read_bytes does (only the CPU counters move between the two) in one read
    where read_bytes makes two (the second finds the end)."""
    if procfs._LIBC is None:
        pytest.skip("no libc through ctypes: os.read is used")
    libc = CountingLibc(procfs._LIBC)
    monkeypatch.setattr(procfs, "_LIBC", libc)
    for path in ("/proc/self/stat", f"/proc/{os.getppid()}/stat", "/proc/self/statm"):
        libc.reads = 0
        single = procfs.read_single(path)
        assert libc.reads == 1, path
        whole = procfs.read_bytes(path)
        assert libc.reads == 3, path
        assert single.endswith(b"\n") and len(single.split()) == len(whole.split()), path


@pytest.mark.parametrize("read", READS)
def test_errors_are_the_oserrors_open_raises(read: Callable[[str], bytes], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        read(str(tmp_path / "gone"))
    assert missing.value.errno == errno.ENOENT and missing.value.filename.endswith("gone")
    with pytest.raises(IsADirectoryError):
        read(str(tmp_path))
    (tmp_path / "a").write_bytes(b"not this one")
    with pytest.raises(ValueError):  # C would have read "a"
        read(str(tmp_path / "a\0b"))
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(OSError):
        read(f"/proc/{dead.pid}/stat")


@linux
def test_a_node_sample_hands_the_gil_to_a_busy_training_thread_a_few_times() -> None:
    """Every system call of a Python file read lets go of the GIL, and a thread in pure
    Python then loses it to the sampler at each one: before procfs, a whole node sample
    cost the training thread ~96 voluntary context switches here (2 CPUs)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a released GIL is not taken by the other thread at once")
    sampler = NodeSampler(main_pid=os.getpid(), interval_s=0.2, host=True)
    sampler.pace(1e9)  # the first, priming sample only
    sampler.start()
    time.sleep(0.5)

    def switches() -> int:
        with open("/proc/thread-self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt"))

    n0, s0, t0 = sampler.taken, switches(), time.monotonic()
    sampler.pace(0.2)
    while time.monotonic() - t0 < 3.0:
        x = 0
        for i in range(5_000):  # a training step's Python
            x += i
    samples, handed = sampler.taken - n0, switches() - s0
    sampler.close()
    assert samples >= 10, f"{samples} samples in 3 s ({handed} switches)"
    assert handed / samples < 25, f"{handed} switches for {samples} samples"


def test_a_directory_lists_as_os_listdir_lists_it(tmp_path: Path) -> None:
    """Names as os.listdir gives them, over more than one getdents64 buffer (3,000 long
    names: ~330 KB of entries), undecodable bytes as surrogates, "." and ".." left out."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(3_000):
        (many / f"{i:05d}-{'x' * 90}").touch()
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in (b"caf\xc3\xa9", b"\xff\xfe bytes", b"new\nline", b"..."):
        (odd / os.fsdecode(name)).touch()
    (tmp_path / "link").symlink_to(odd)
    (tmp_path / "empty").mkdir()
    for directory in (many, odd, tmp_path / "link", tmp_path / "empty", tmp_path):
        listed = procfs.list_dir(str(directory))
        assert sorted(listed) == sorted(os.listdir(directory)), directory
        assert len(listed) == len(set(listed))
    assert len(procfs.list_dir(str(many))) == 3_000
    if Path("/sys/block").is_dir():
        assert sorted(procfs.list_dir("/sys/block")) == sorted(os.listdir("/sys/block"))
    assert str(os.getpid()) in procfs.list_dir("/proc")


def test_a_directory_that_cannot_be_listed_raises_as_os_listdir_does(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for path, error in (
        (tmp_path / "missing", FileNotFoundError),
        (tmp_path / "file", NotADirectoryError),
    ):
        with pytest.raises(error):
            os.listdir(path)
        with pytest.raises(error):
            procfs.list_dir(str(path))
    with pytest.raises(ValueError):
        procfs.list_dir(str(tmp_path / "a\0b"))


@linux
@pytest.mark.parametrize(
    "record",
    [
        struct.pack("=QqHB", 1, 0, 0, 0) + b"name\0",  # a length of 0: would loop forever
        struct.pack("=QqHB", 1, 0, 24, 0) + b"no-nul-in-24",  # a name without its NUL
        struct.pack("=QqHB", 1, 0, 200, 0) + b"name\0",  # longer than what was read
        struct.pack("=Qq", 1, 0),  # cut before its length
    ],
)
def test_a_malformed_directory_entry_is_an_error_not_a_hang(
    record: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if procfs._GETDENTS is None:
        pytest.skip("no getdents64 in this libc: os.listdir is used")
    calls = []

    def getdents(fd: int, buf: object, size: int) -> int:
        calls.append(fd)
        if len(calls) > 1:
            return 0
        ctypes.memmove(buf, record, len(record))
        return len(record)

    monkeypatch.setattr(procfs, "_GETDENTS", getdents)
    with pytest.raises(OSError, match="malformed"):
        procfs.list_dir(str(tmp_path))


@linux
def test_listing_a_directory_keeps_the_gil_from_a_busy_thread(tmp_path: Path) -> None:
    """os.listdir lets go of the GIL around each entry it reads: a thread running Python
    takes it there (the node sampler lists /proc and each training process's threads).
    list_dir keeps it: the busy thread makes no progress while a listing runs.
    (os.listdir: it did in 5 of 5.)"""
    for i in range(2_000):
        (tmp_path / str(i)).touch()
    listed: list[int] = []
    moved = progress_during(lambda: listed.append(len(procfs.list_dir(str(tmp_path)))))
    assert listed == [2_000] * 5
    assert moved == [0] * 5, f"the busy thread ran during listings: {moved}"


# ------------------------------------------------------------------------ procstat


STAT = """cpu  10 20 30 40 50 60 70 80 90 100
cpu0 1 2 3 4 5 6 7 8 9 10
cpu1 11 12 13 14 15 16 17 18 19 20
intr 1 2 3
ctxt 5
"""


def test_cpu_times_are_the_per_core_lines_in_psutils_fields() -> None:
    fields, rows = procstat.parse_cpu_times(STAT)
    assert fields == procstat.CPU_FIELDS
    assert rows == [tuple(range(1, 11)), tuple(range(11, 21))]
    old = "cpu  1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n"  # a kernel before steal and guest
    assert procstat.parse_cpu_times(old) == (procstat.CPU_FIELDS[:7], [(1, 2, 3, 4, 5, 6, 7)])


MEMINFO = """MemTotal:       16000 kB
MemFree:         2000 kB
MemAvailable:    9000 kB
Buffers:          100 kB
Cached:          5000 kB
SwapCached:         0 kB
SReclaimable:     300 kB
SwapTotal:       4000 kB
SwapFree:        3000 kB
HugePages_Total:    0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MEMINFO, procstat.Memory(16000, 9000, 7000, 5300, 4000, 1000)),
        # a container whose MemAvailable exceeds its MemTotal: psutil takes MemFree
        (
            MEMINFO.replace("MemAvailable:    9000", "MemAvailable:   99000"),
            procstat.Memory(16000, 2000, 14000, 5300, 4000, 1000),
        ),
        # no Cached line: not reported (psutil would say 0)
        (
            MEMINFO.replace("Cached:          5000 kB\n", ""),
            procstat.Memory(16000, 9000, 7000, None, 4000, 1000),
        ),
        # before 3.14, or zero: psutil estimates it; so do we, by asking psutil
        (MEMINFO.replace("MemAvailable:    9000 kB\n", ""), None),
        (MEMINFO.replace("MemAvailable:    9000", "MemAvailable:       0"), None),
    ],
)
def test_meminfo_as_psutils_virtual_and_swap_memory(
    text: str, expected: procstat.Memory | None
) -> None:
    got = procstat.parse_meminfo(text)
    if expected is None:
        assert got is None
    else:
        assert got == procstat.Memory(*(None if x is None else x * 1024 for x in expected))


DISKSTATS = (
    "   8       0 sda 100 5 2000 30 200 6 4000 50 0 70 80 0 0 0 0 0 0\n"  # 4.18+: 18+
    "   8       1 sda1 1 0 8 0 2 0 16 0 0 3 3\n"  # 14 fields
    "   8       2 9 sdb 1 3 0 4 0 6 0 0 10 0 0\n"  # 15 fields: the count before the name
    "   8       3 sdb1 1 2 3 4\n"  # a 2.6 partition: 7 fields
    "   8       4 bad 1 2\n"  # a layout psutil does not know: skipped
    "   8       5 odd x 0 0 0 0 0 0 0 0 0 0\n"  # not a number: skipped, the rest kept
)


def test_diskstats_as_psutils_disk_io_counters() -> None:
    assert procstat.parse_diskstats(DISKSTATS) == {
        "sda": procstat.DiskCounters(100, 200, 2000 * 512, 4000 * 512, 70),
        "sda1": procstat.DiskCounters(1, 2, 8 * 512, 16 * 512, 3),
        "sdb": procstat.DiskCounters(9, 4, 3 * 512, 6 * 512, 10),
        "sdb1": procstat.DiskCounters(1, 3, 2 * 512, 4 * 512, 0),
    }


NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets
    lo: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0
  eth0:3000 30 0 0 0 0 0 0 4000 40 0 0 0 0 0 0
 short: 1 2 3
"""


def test_net_dev_as_psutils_net_io_counters() -> None:
    assert procstat.parse_net_dev(NET_DEV) == {
        "lo": procstat.NetCounters(1000, 2000),
        "eth0": procstat.NetCounters(3000, 4000),
    }


@linux
def test_on_this_machine_the_parsed_figures_are_psutils() -> None:
    fields, rows = procstat.parse_cpu_times(procfs.read_text("/proc/stat"))
    cores = psutil.cpu_times(percpu=True)
    assert fields == cores[0]._fields and len(rows) == len(cores)
    tick = os.sysconf("SC_CLK_TCK")
    for row, core in zip(rows, cores, strict=True):  # read apart: a few ticks may pass
        assert abs(row[fields.index("user")] / tick - core.user) < 1.0

    memory = procstat.parse_meminfo(procfs.read_text("/proc/meminfo"))
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    assert memory is not None
    assert (memory.total, memory.swap_total) == (vm.total, swap.total)
    assert abs(memory.available - vm.available) < 64 << 20
    assert abs(memory.cached - vm.cached) < 64 << 20

    disks = procstat.parse_diskstats(procfs.read_text("/proc/diskstats"))
    assert set(disks) == set(psutil.disk_io_counters(perdisk=True))
    nets = procstat.parse_net_dev(procfs.read_text("/proc/net/dev"))
    assert set(nets) == set(psutil.net_io_counters(pernic=True))
