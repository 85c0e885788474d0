"""Host collectors on the real machine with load the tests create, plus pure parser tables.

No psutil mocks: CPU, disk, network and process figures are checked against work done
here (a spinning process, a fsync'ed file read back cold, bytes over loopback TCP).
Thresholds leave wide margins so a loaded 2-core CI VM still passes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gputop_dl.probe.collectors import processes
from gputop_dl.probe.collectors.cgroup import (
    CgroupReader,
    parse_cpu_max,
    parse_keyed_ints,
    parse_memory_limit,
    parse_proc_cgroup,
    parse_v1_cpu_quota,
    throttled_pct,
    throttled_stat,
)
from gputop_dl.probe.collectors.host import (
    HostCollector,
    HostReading,
    ProcessCollector,
    is_network_fs,
    parse_pressure,
    parse_vmstat_swap,
)
from gputop_dl.probe.collectors.processes import FULL_SCAN_EVERY, descendants_from_children_files
from gputop_dl.probe.messages import System
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.probe.samples import MAX_STR, ProcessSample, SystemSample, TrainingProcesses

REPO = Path(__file__).resolve().parent.parent

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def _spinner(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)])


def _status(reading: HostReading, source: str) -> str:
    found = [s for s in reading.statuses if s.source == source]
    assert len(found) == 1, reading.statuses
    return found[0].message


# --------------------------------------------------------------------------- first sample


def test_first_sample_rates_are_none_not_zero() -> None:
    hc = HostCollector(data_path=str(REPO))
    r = hc.sample()
    assert r.cpu is not None and r.cpu.cores
    assert all(c.busy_pct is None and c.idle_pct is None for c in r.cpu.cores)
    assert r.memory is not None and r.memory.total_bytes and r.memory.total_bytes > 0
    assert r.memory.swap_in_bps is None and r.memory.swap_out_bps is None
    assert r.disks, "no disks listed at all"
    assert all(d.read_bps is None and d.busy_pct is None for d in r.disks)
    assert any(n.interface == "lo" for n in r.nets)
    assert all(n.rx_bps is None and n.tx_bps is None for n in r.nets)
    if r.cgroup is not None:
        assert r.cgroup.throttled_pct is None

    time.sleep(0.05)
    r2 = hc.sample()
    assert r2.cpu is not None
    assert any(c.idle_pct is not None for c in r2.cpu.cores)
    assert all(n.rx_bps is not None for n in r2.nets if n.interface == "lo")
    assert r2.memory is not None and r2.memory.swap_in_bps is not None
    for d in r2.disks:
        assert d.read_bps is not None and d.read_bps >= 0
        assert d.busy_pct is not None and 0 <= d.busy_pct <= 100


def test_no_loop_ram_or_shadowed_partitions() -> None:
    r = HostCollector().sample()
    names = {d.device for d in r.disks}
    assert not any(n.startswith(("loop", "ram")) for n in names)
    for name in names:
        part = Path("/sys/class/block", name.replace("/", "!"), "partition")
        if part.exists():
            parent = Path(os.path.realpath(part.parent)).parent.name
            assert parent not in names, f"{name} listed next to its disk {parent}"


# --------------------------------------------------------------------------- cpu


def test_spinning_process_shows_as_busy_core() -> None:
    hc = HostCollector()
    proc = _spinner(2.0)
    try:
        time.sleep(0.2)  # let the interpreter start and reach the loop
        hc.sample()
        time.sleep(0.8)
        r = hc.sample()
    finally:
        proc.kill()
        proc.wait()
    assert r.cpu is not None
    busy = [c.busy_pct for c in r.cpu.cores if c.busy_pct is not None]
    assert busy
    # One spinner = one core's worth; it may migrate between cores, so check the sum,
    # and that at least one core carried a clear share of it.
    assert sum(busy) >= 70, busy
    assert max(busy) >= 40, busy
    for c in r.cpu.cores:
        parts = [c.user_pct, c.system_pct, c.iowait_pct, c.steal_pct, c.idle_pct]
        assert abs(sum(p or 0.0 for p in parts) - 100.0) < 1.0
    assert r.cpu.load_avg is not None and len(r.cpu.load_avg) == 3


# --------------------------------------------------------------------------- disk


def _block_backed_dir(tmp_path: Path) -> tuple[Path, str]:
    """A directory on a real block device: tmp_path, else the repo; skip if neither."""
    for candidate in (tmp_path, REPO):
        hc = HostCollector(data_path=str(candidate))
        r = hc.sample()
        if r.data_device is not None:
            return candidate, r.data_device
    pytest.skip(
        f"neither {tmp_path} nor {REPO} sits on a block device "
        f"(fs {r.data_fs_type}): no disk counters to check against"
    )


def test_fsynced_write_and_cold_read_seen_on_data_device(tmp_path: Path) -> None:
    directory, device = _block_backed_dir(tmp_path)
    size = 64 * 1024 * 1024
    target = directory / f".gputop-disk-test-{os.getpid()}"
    hc = HostCollector(data_path=str(directory))
    try:
        t0 = time.monotonic()
        hc.sample()
        _cold_file(target, size)  # the read below must hit the disk
        fd = os.open(target, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 4 * 1024 * 1024):
                pass
        finally:
            os.close(fd)
        r = hc.sample()
        outer = time.monotonic() - t0
    finally:
        target.unlink(missing_ok=True)
    assert r.data_device == device
    disk = next((d for d in r.disks if d.device == device), None)
    assert disk is not None, f"data device {device} not among {[d.device for d in r.disks]}"
    assert disk.read_bps is not None and disk.write_bps is not None
    # rate x (collector interval <= outer) = bytes seen; so rate x outer bounds it above.
    assert disk.write_bps * outer >= 0.8 * size, (disk, outer)
    assert disk.read_bps * outer >= 0.8 * size, (disk, outer)
    assert disk.write_iops is not None and disk.write_iops > 0
    assert disk.busy_pct is not None and disk.busy_pct > 0


def test_data_path_lookup() -> None:
    hc = HostCollector(data_path="/definitely/not/here")
    r = hc.sample()
    assert r.data_device is None and r.data_fs_type is None
    assert "not/here" in _status(r, "data_path")
    hc.set_data_path(str(REPO))
    r = hc.sample()
    assert r.data_fs_type is not None
    hc.set_data_path(None)
    r = hc.sample()
    assert r.data_device is None and r.data_fs_type is None
    assert not [s for s in r.statuses if s.source == "data_path"]
    if Path("/dev/shm").is_dir():
        hc.set_data_path("/dev/shm")
        r = hc.sample()
        assert r.data_fs_type == "tmpfs" and r.data_device is None


@pytest.mark.parametrize(
    ("fs", "network"),
    [
        ("nfs4", True),
        ("nfs", True),
        ("cifs", True),
        ("lustre", True),
        ("fuse.sshfs", True),
        ("fuse.gcsfuse", True),
        ("ext4", False),
        ("xfs", False),
        ("overlay", False),
        ("tmpfs", False),
        (None, False),
    ],
)
def test_is_network_fs(fs: str | None, network: bool) -> None:
    assert is_network_fs(fs) is network


# --------------------------------------------------------------------------- network


def test_loopback_traffic_seen_on_lo() -> None:
    size = 20 * 1024 * 1024
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = 0

    def drain() -> None:
        nonlocal received
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 20):
                received += len(data)

    reader = threading.Thread(target=drain)
    reader.start()
    hc = HostCollector()
    t0 = time.monotonic()
    hc.sample()
    with socket.create_connection(server.getsockname()) as client:
        payload = b"x" * (1 << 20)
        for _ in range(size // len(payload)):
            client.sendall(payload)
    reader.join(timeout=10)
    server.close()
    r = hc.sample()
    outer = time.monotonic() - t0
    assert received == size
    lo = next(n for n in r.nets if n.interface == "lo")
    assert lo.rx_bps is not None and lo.tx_bps is not None
    assert lo.rx_bps * outer >= 0.9 * size, (lo, outer)
    assert lo.tx_bps * outer >= 0.9 * size, (lo, outer)


# --------------------------------------------------------------------------- processes


def test_a_process_title_longer_than_the_wire_allows_is_cut(tmp_path: Path) -> None:
    """psutil names a process whose comm is cut at 15 characters by its argv[0], which
    setproctitle-style code makes as long as it likes; a node sample holding it would be
    refused whole by viewers (every node panel empty)."""
    exe = tmp_path / ("s" * 20)  # comm: the first 15 characters of this name
    exe.symlink_to("/bin/sleep")
    child = subprocess.Popen(["s" * 5000, "30"], executable=str(exe))
    try:
        time.sleep(0.2)
        sample = ProcessCollector(os.getpid(), worker_pids=lambda: {child.pid}).sample()
    finally:
        child.kill()
        child.wait()
    assert sample is not None
    titled = next(p for p in sample.processes if p.pid == child.pid)
    assert titled.name == "s" * MAX_STR
    system = System("h:1", SystemSample(time.time(), "h", 1.0, processes=sample))
    assert decode(encode(system)) == system  # the viewer's decoder takes it


def test_process_collector_sees_spinning_worker() -> None:
    hc = HostCollector()  # to tell a starved spinner from a wrong figure
    proc = _spinner(2.5)
    pc = ProcessCollector(os.getpid(), worker_pids=lambda: {proc.pid})
    try:
        time.sleep(0.2)
        first = pc.sample()
        hc.sample()
        assert first is not None
        me = next(p for p in first.processes if p.pid == os.getpid())
        assert me.role == "main" and me.cpu_pct is None  # first sight: no delta yet
        time.sleep(0.8)
        second = pc.sample()
        host = hc.sample()
    finally:
        proc.kill()
        proc.wait()
    assert second is not None
    worker = next((p for p in second.processes if p.pid == proc.pid), None)
    assert worker is not None, second
    assert worker.role == "worker"
    assert worker.rss_bytes is not None and worker.rss_bytes > 0
    assert worker.cpu_pct is not None
    assert worker.cpu_pct <= 110, worker  # one thread cannot use much more than one core
    assert host.cpu is not None
    idle = sum(c.idle_pct or 0.0 for c in host.cpu.cores) / len(host.cpu.cores)
    if idle > 10:
        assert worker.cpu_pct > 50, (worker, idle)
    else:
        # Every core busy (other jobs on a small CI VM): the spinner gets only its
        # share of the time, but must still show clearly.
        assert worker.cpu_pct > 15, (worker, idle)
    assert second.worker_count >= 1
    spinning = [w for w in second.processes if w.role == "worker" and (w.cpu_pct or 0) >= 90]
    assert second.saturated_workers == len(spinning)
    if worker.cpu_pct >= 90:  # the usual case; a starved CI core may fall short of 90 %
        assert second.saturated_workers >= 1


READER = (
    "import os, sys, time\n"
    "sys.stdin.readline()\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n"
    "while os.read(fd, 4 << 20):\n"
    "    pass\n"
    "os.close(fd)\n"
    "print('read', flush=True)\n"
    "time.sleep(30)\n"
)


def _read_bytes_of(pid: int) -> int:
    """``read_bytes`` of /proc/<pid>/io as the kernel counts it (0: not readable)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return 0


def _cold_file(path: Path, size: int) -> None:
    """``size`` bytes written and synced, their pages dropped: a read of them hits the disk."""
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(size // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("linux", [True, False], ids=["proc-io", "psutil"])
def test_process_collector_sees_a_worker_read_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linux: bool
) -> None:
    """A worker that reads a cold 50 MB file: its own read rate (/proc/<pid>/io read_bytes,
    or psutil's io_counters() where the children files are missing) shows the reads, so
    the analyzer can tell them from another process's on the node."""
    if not linux:
        monkeypatch.setattr(processes, "_children_files_supported", lambda root: False)
    size = 50 << 20
    target = tmp_path / "data.bin"
    _cold_file(target, size)
    child = subprocess.Popen(
        [sys.executable, "-c", READER, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        pc = ProcessCollector(os.getpid(), worker_pids=lambda: {child.pid})
        time.sleep(0.2)  # the child's imports are read before the first sample
        first = pc.sample()
        t0 = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "read"
        second = pc.sample()
        outer = time.monotonic() - t0
        time.sleep(0.3)
        third = pc.sample()
        counted = _read_bytes_of(child.pid)
    finally:
        child.kill()
        child.wait()
    assert first is not None and second is not None and third is not None

    def worker(tree: TrainingProcesses) -> ProcessSample:
        return next(p for p in tree.processes if p.pid == child.pid)

    assert worker(first).read_bps is None  # first sight: no delta yet, never a made-up 0
    rate = worker(second).read_bps
    if rate is None:  # only where the process's I/O counters cannot be read
        assert not os.access(f"/proc/{child.pid}/io", os.R_OK), second
        pytest.skip("/proc/<pid>/io is not readable here: no reads per process to check")
    assert rate >= 0.0
    if counted < 0.8 * size:  # e.g. a filesystem without block-layer accounting (tmpfs)
        pytest.skip(f"the kernel counted {counted} bytes of the cold 50 MB read: not checkable")
    # rate x (collector interval <= outer) = bytes seen: so rate x outer bounds it above.
    assert rate * outer >= 0.8 * size, (rate, outer)
    idle = worker(third).read_bps
    assert idle is not None and idle * 0.3 < 0.1 * size, idle  # done reading: about 0
    me = next(p for p in second.processes if p.pid == os.getpid())
    assert me.read_bps is not None and me.read_bps >= 0.0
    system = System("h:1", SystemSample(time.time(), "h", 1.0, processes=second))
    assert decode(encode(system)) == system  # it travels


def test_process_collector_forgets_the_reads_of_vanished_pids() -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pc = ProcessCollector(os.getpid(), worker_pids=lambda: {worker.pid})
    try:
        pc.sample()
        assert worker.pid in pc._prev_read
    finally:
        worker.kill()
        worker.wait()
    pc.sample()
    assert worker.pid not in pc._prev_read and os.getpid() in pc._prev_read


def test_process_collector_finds_grandchildren() -> None:
    # A loader worker that runs its own helper (a decoder): both count as the loader's;
    # a child the probe did not publish is "other" (compilers, tokenizers, loggers).
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(5)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild: int | None = None
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        tree = ProcessCollector(os.getpid(), worker_pids=lambda: {parent.pid}).sample()
        assert tree is not None
        roles = {p.pid: p.role for p in tree.processes}
        assert roles.get(parent.pid) == "worker"
        assert roles.get(grandchild) == "worker"
        assert tree.worker_count == 2
        unpublished = ProcessCollector(os.getpid()).sample()
        assert unpublished is not None and unpublished.worker_count == 0
        assert {p.role for p in unpublished.processes if p.pid != os.getpid()} == {"other"}
        if Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
            # the fast path (CONFIG_PROC_CHILDREN) agrees with what the collector reported
            assert set(descendants_from_children_files(os.getpid())) >= {parent.pid, grandchild}
    finally:
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_child_another_thread_forked_is_kept_between_full_scans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every thread's children file is read every FULL_SCAN_EVERY samples (a training
    process has ~100 threads), only main threads' between: a child a thread forked is
    found by the first sample, kept by the next ones, and gone once reaped; a new one
    shows up by the next full scan."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN)")
    children: list[subprocess.Popen[bytes]] = []
    done = threading.Event()

    def fork_and_stay() -> None:
        children.append(subprocess.Popen(["sleep", "30"]))
        done.wait(30)  # alive: the children of a thread that ended pass to the main one

    def fork_from_another_thread() -> int:
        count = len(children)
        threading.Thread(target=fork_and_stay, daemon=True).start()
        while len(children) == count:
            time.sleep(0.01)
        return children[-1].pid

    own_tasks = f"/proc/{os.getpid()}/task"
    listed: list[str] = []
    list_dir = processes.procfs.list_dir
    monkeypatch.setattr(
        processes.procfs, "list_dir", lambda path: listed.append(path) or list_dir(path)
    )
    try:
        first = fork_from_another_thread()
        collector = ProcessCollector(os.getpid())

        def pids() -> set[int]:
            tree = collector.sample()
            assert tree is not None
            return {p.pid for p in tree.processes}

        assert all(first in pids() for _ in range(FULL_SCAN_EVERY + 1))
        assert listed.count(own_tasks) == 2  # samples 1 and FULL_SCAN_EVERY + 1
        second = fork_from_another_thread()
        seen = [second in pids() for _ in range(FULL_SCAN_EVERY)]
        assert seen == [False] * (FULL_SCAN_EVERY - 1) + [True], seen
        children[0].kill()
        children[0].wait()
        assert first not in pids()  # a light scan: its stat is gone
        assert listed.count(own_tasks) == 3
    finally:
        done.set()
        for child in children:
            child.kill()
            child.wait()


def test_between_full_scans_a_child_is_kept_only_while_it_is_the_same_child(
    tmp_path: Path,
) -> None:
    """A fake /proc: a thread of the main process forked 1000, which forked 2000, and
    another thread forked 3000. Then 1000 ends: its pid goes to another user's job and
    2000 to init. The samples between two full scans keep 3000 alone (the review's
    case: they showed the stranger and the orphan as the run's for 4 samples)."""
    me, thread = os.getpid(), os.getpid() + 1

    def put(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    def stat(pid: int, name: str, ppid: int, start: int) -> None:
        fields = ["S", str(ppid), *["0"] * 17, str(start), "0", "100", *["0"] * 30]
        put(f"{pid}/stat", f"{pid} ({name}) {' '.join(fields)}\n")

    stat(me, "python", 1, 10)
    put(f"{me}/task/{me}/children", "")
    put(f"{me}/task/{thread}/children", "1000 3000")
    stat(1000, "helper", me, 50)
    put("1000/task/1000/children", "2000")
    stat(2000, "grandchild", 1000, 60)
    put("2000/task/2000/children", "")
    stat(3000, "logger", me, 70)
    put("3000/task/3000/children", "")
    collector = ProcessCollector(me, proc_root=str(tmp_path))

    def others() -> list[str]:
        tree = collector.sample()
        assert tree is not None
        return sorted(p.name for p in tree.processes if p.pid != me)

    assert others() == ["grandchild", "helper", "logger"]  # a full scan
    put(f"{me}/task/{thread}/children", "3000")
    stat(1000, "someone_else", 1, 999)  # the pid reused
    stat(2000, "grandchild", 1, 60)  # the orphan, now init's
    assert [others() for _ in range(FULL_SCAN_EVERY - 1)] == [["logger"]] * (FULL_SCAN_EVERY - 1)
    assert others() == ["logger"]  # the next full scan agrees


def test_process_collector_leaves_out_our_own_tool_children() -> None:
    # The hl-smi loop is a child of the training process but not a DataLoader worker.
    tool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = ProcessCollector(
            os.getpid(), exclude=lambda: {tool.pid}, worker_pids=lambda: {worker.pid}
        ).sample()
        assert tree is not None
        pids = {p.pid for p in tree.processes}
        assert worker.pid in pids and tool.pid not in pids
        assert tree.worker_count == 1
    finally:
        for proc in (tool, worker):
            proc.kill()
            proc.wait()


def test_only_published_loader_workers_are_workers() -> None:
    # Why: under torch.compile, g++/cc1plus children were shown as "DataLoader 2 workers".
    loader_worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    compiler = subprocess.Popen(["sleep", "30"])  # stands in for g++: any other child
    published: set[int] = set()
    try:
        pc = ProcessCollector(os.getpid(), worker_pids=lambda: published)
        before = pc.sample()
        assert before is not None and before.worker_count == 0  # nothing published yet
        published.add(loader_worker.pid)
        tree = pc.sample()
        assert tree is not None
        roles = {p.pid: p.role for p in tree.processes}
        assert roles[loader_worker.pid] == "worker" and roles[compiler.pid] == "other"
        assert tree.worker_count == 1

        def broken() -> set[int]:
            raise RuntimeError("probe state mid-update")

        survived = ProcessCollector(os.getpid(), worker_pids=broken).sample()
        assert survived is not None and survived.worker_count == 0
    finally:
        for proc in (loader_worker, compiler):
            proc.kill()
            proc.wait()


def test_process_collector_main_vanished() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pc = ProcessCollector(proc.pid)
    s = pc.sample()
    assert s is not None and s.processes[0].pid == proc.pid and s.worker_count == 0
    proc.kill()
    proc.wait()
    assert pc.sample() is None
    assert ProcessCollector(proc.pid).sample() is None


# --------------------------------------------------------------------------- pressure


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cpu before 5.13: only "some"
        ("some avg10=1.36 avg60=0.32 avg300=0.24 total=1879294\n", {"some": 1.36}),
        # cpu/io/memory on newer kernels: both lines
        (
            "some avg10=0.50 avg60=0.11 avg300=0.08 total=843930\n"
            "full avg10=0.25 avg60=0.10 avg300=0.08 total=775166\n",
            {"some": 0.5, "full": 0.25},
        ),
        ("some avg10=100.00 avg60=0.00 avg300=0.00 total=0\n", {"some": 100.0}),
        ("", {}),
        ("garbage line\n", {}),
    ],
)
def test_parse_pressure(text: str, expected: dict[str, float]) -> None:
    assert parse_pressure(text) == expected


def test_pressure_missing_gives_none_and_status(tmp_path: Path) -> None:
    hc = HostCollector(proc_root=str(tmp_path), cgroup_root=str(tmp_path / "cg"))
    r = hc.sample()  # must not raise
    assert r.pressure is None
    assert "PSI" in _status(r, "pressure")
    assert r.cgroup is None
    assert _status(r, "cgroup")
    assert r.cpu is not None  # psutil parts are unaffected
    assert r.memory is not None and r.memory.swap_in_bps is None


def test_pressure_partial_files(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text("some avg10=2.00 avg60=0 avg300=0 total=1\n")
    (tmp_path / "pressure" / "io").write_text(
        "some avg10=3.00 avg60=0 avg300=0 total=1\nfull avg10=1.50 avg60=0 avg300=0 total=1\n"
    )
    r = HostCollector(proc_root=str(tmp_path)).sample()
    assert r.pressure is not None
    assert (r.pressure.cpu_some, r.pressure.io_some, r.pressure.io_full) == (2.0, 3.0, 1.5)
    assert r.pressure.memory_some is None and r.pressure.memory_full is None
    assert "memory" in _status(r, "pressure")


def test_real_pressure_if_present() -> None:
    r = HostCollector().sample()
    if not Path("/proc/pressure").is_dir():
        assert r.pressure is None
        return
    assert r.pressure is not None and r.pressure.cpu_some is not None
    assert 0.0 <= r.pressure.cpu_some <= 100.0


# --------------------------------------------------------------------------- vmstat


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nr_free_pages 100\npswpin 12\npswpout 34\npgpgin 5\n", (12, 34)),
        ("pswpin 0\npswpout 0\n", (0, 0)),
        ("nr_free_pages 100\n", (None, None)),
        ("pswpout 7\n", (None, 7)),
        # a "pswpin_foo" style line must not be taken for pswpin
        ("pswpinx 9\npswpin 1\n", (1, None)),
    ],
)
def test_parse_vmstat_swap(text: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_vmstat_swap(text) == expected


def test_swap_rate_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pswpin 100\npswpout 200\n")
    hc = HostCollector(proc_root=str(tmp_path))
    assert hc.sample().memory is not None
    vmstat.write_text("pswpin 1100\npswpout 200\n")
    t0 = time.monotonic()
    time.sleep(0.1)
    m = hc.sample().memory
    assert m is not None and m.swap_in_bps is not None and m.swap_out_bps == 0.0
    page = os.sysconf("SC_PAGE_SIZE")
    # 1000 pages over ~0.1 s (a bit more: the first sample came before t0)
    assert 1000 * page / (time.monotonic() - t0 + 0.5) < m.swap_in_bps <= 1000 * page / 0.1


# --------------------------------------------------------------------------- cgroup parsers


@pytest.mark.parametrize(
    ("text", "unified", "controllers"),
    [
        ("0::/\n", "/", {}),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", "/user.slice/user-1000.slice/"
         "session-2.scope", {}),
        (
            "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
            None,
            {"memory": "/docker/abc", "cpu": "/docker/abc", "cpuacct": "/docker/abc",
             "name=systemd": "/docker/abc"},
        ),
        (  # hybrid: v1 controllers plus an empty v2 hierarchy
            "4:memory:/process_api/x\n1:cpu:/\n0::/\n",
            "/",
            {"memory": "/process_api/x", "cpu": "/"},
        ),
    ],
)  # fmt: skip
def test_parse_proc_cgroup(text: str, unified: str | None, controllers: dict[str, str]) -> None:
    pc = parse_proc_cgroup(text)
    assert pc.unified == unified
    assert pc.controllers == controllers


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2.0),
        ("50000 100000\n", 0.5),
        ("150000\n", 1.5),
        ("max\n", None),
    ],
)
def test_parse_cpu_max(text: str, cores: float | None) -> None:
    assert parse_cpu_max(text) == cores


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [("-1\n", "100000\n", None), ("400000\n", "100000\n", 4.0), ("25000", "50000", 0.5)],
)
def test_parse_v1_cpu_quota(quota: str, period: str, cores: float | None) -> None:
    assert parse_v1_cpu_quota(quota, period) == cores


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("max\n", None),
        ("9223372036854771712\n", None),  # v1 "unlimited" with 4 KiB pages
        ("9223372036854775807\n", None),  # LONG_MAX
        ("9223372036854710272\n", None),  # v1 "unlimited" with 64 KiB pages
        ("8589934592\n", 8 * 1024**3),
        ("0\n", 0),  # a real (if deadly) limit
    ],
)
def test_parse_memory_limit(text: str, limit: int | None) -> None:
    assert parse_memory_limit(text) == limit


@pytest.mark.parametrize(
    ("text", "version", "expected"),
    [
        (
            "usage_usec 5\nuser_usec 3\nsystem_usec 2\nnr_periods 10\nnr_throttled 4\n"
            "throttled_usec 9000\nnr_bursts 0\nburst_usec 0\n",
            2,
            (10, 4, 9000),
        ),
        ("usage_usec 5\nuser_usec 3\nsystem_usec 2\n", 2, (None, None, None)),  # no cpu ctrl
        ("nr_periods 7\nnr_throttled 1\nthrottled_time 2500000\n", 1, (7, 1, 2500)),
    ],
)
def test_throttled_stat(
    text: str, version: int, expected: tuple[int | None, int | None, int | None]
) -> None:
    assert throttled_stat(parse_keyed_ints(text), version) == expected


@pytest.mark.parametrize(
    ("prev", "cur", "pct"),
    [
        ((100, 10), (200, 35), 25.0),
        ((100, 10), (100, 10), None),  # no period ran: nothing measured
        ((100, 10), (50, 5), None),  # counters reset
        ((None, None), (10, 1), None),
        ((0, 0), (10, 10), 100.0),
    ],
)
def test_throttled_pct(
    prev: tuple[int | None, int | None], cur: tuple[int | None, int | None], pct: float | None
) -> None:
    assert throttled_pct(prev, cur) == pct


# --------------------------------------------------------------------------- cgroup trees


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, cgroup_text: str) -> Path:
    proc = tmp_path / "proc"
    _write(proc / "self" / "cgroup", cgroup_text)
    return proc


def test_cgroup_v2_tree(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    leaf = root / "kubepods" / "pod1"
    _write(root / "cgroup.controllers", "cpu memory io\n")
    _write(root / "kubepods" / "cpu.max", "400000 100000\n")  # parent: 4 cores
    _write(root / "kubepods" / "memory.max", "max\n")
    _write(leaf / "cpu.max", "max 100000\n")  # leaf itself unlimited: parent binds
    _write(leaf / "memory.max", "17179869184\n")
    _write(leaf / "memory.current", "1073741824\n")
    _write(leaf / "cpu.stat", "usage_usec 1\nnr_periods 100\nnr_throttled 10\nthrottled_usec 5\n")
    reader = CgroupReader(
        proc_root=str(_proc(tmp_path, "0::/kubepods/pod1\n")), cgroup_root=str(root)
    )
    s, status = reader.read()
    assert status.ok and "v2" in status.message
    assert s is not None
    assert s.cpu_quota_cores == 4.0
    assert s.memory_limit_bytes == 16 * 1024**3
    assert s.memory_used_bytes == 1024**3
    assert (s.nr_periods, s.nr_throttled, s.throttled_usec) == (100, 10, 5)
    assert s.throttled_pct is None  # first read
    _write(leaf / "cpu.stat", "usage_usec 1\nnr_periods 200\nnr_throttled 60\nthrottled_usec 9\n")
    s, _ = reader.read()
    assert s is not None and s.throttled_pct == 50.0


def test_cgroup_v2_namespace_root_without_limits(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "cpu.stat", "usage_usec 1\n")
    # Host path in /proc/self/cgroup that is not visible under our mount: use the root.
    reader = CgroupReader(
        proc_root=str(_proc(tmp_path, "0::/docker/deadbeef\n")), cgroup_root=str(root)
    )
    s, status = reader.read()
    assert status.ok
    assert s is not None
    assert s.cpu_quota_cores is None and s.memory_limit_bytes is None
    assert s.memory_used_bytes is None and s.nr_periods is None


def test_cgroup_v1_tree(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    cpu = root / "cpu,cpuacct" / "docker" / "abc"
    mem = root / "memory" / "docker" / "abc"
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    _write(cpu / "cpu.cfs_quota_us", "150000\n")
    _write(cpu / "cpu.cfs_period_us", "100000\n")
    _write(cpu / "cpu.stat", "nr_periods 40\nnr_throttled 4\nthrottled_time 3000000\n")
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(mem / "memory.limit_in_bytes", "4294967296\n")
    _write(mem / "memory.usage_in_bytes", "123456\n")
    text = "11:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    reader = CgroupReader(proc_root=str(_proc(tmp_path, text)), cgroup_root=str(root))
    s, status = reader.read()
    assert status.ok and "v1" in status.message
    assert s is not None
    assert s.cpu_quota_cores == 1.5
    assert s.memory_limit_bytes == 4 * 1024**3
    assert s.memory_used_bytes == 123456
    assert (s.nr_periods, s.nr_throttled, s.throttled_usec) == (40, 4, 3000)
    _write(cpu / "cpu.stat", "nr_periods 140\nnr_throttled 14\nthrottled_time 9000000\n")
    s, _ = reader.read()
    assert s is not None and s.throttled_pct == 10.0


def test_cgroup_v1_unlimited(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu" / "cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(root / "memory" / "memory.usage_in_bytes", "5\n")
    reader = CgroupReader(
        proc_root=str(_proc(tmp_path, "4:memory:/\n1:cpu:/\n0::/\n")), cgroup_root=str(root)
    )
    s, _ = reader.read()
    assert s is not None
    assert s.cpu_quota_cores is None and s.memory_limit_bytes is None
    s, _ = reader.read()
    assert s is not None and s.throttled_pct is None  # no period ran


def test_cgroup_broken_file_degrades(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu\n")
    _write(root / "cpu.max", "bogus 100000\n")
    reader = CgroupReader(proc_root=str(_proc(tmp_path, "0::/\n")), cgroup_root=str(root))
    s, status = reader.read()
    assert s is None and not status.ok and "bogus" in status.message


def test_real_cgroup_reads() -> None:
    r = HostCollector().sample()
    status = _status(r, "cgroup")
    if r.cgroup is None:
        pytest.skip(f"no cgroup here: {status}")
    assert status


# --------------------------------------------------------------------------- cost


# What a sample costs is measured in bench/sampler_cost.py, not asserted here by a timer.
# This checks what bounds it: a host sample reads a few whole kernel files, each once, and
# never a process's (the process table's walk of /proc has its own, spaced schedule).
MAX_HOST_FILES = 24  # 15 here: 5 counter files, 3 of pressure, 7 of the cgroup (v1)


def test_a_host_sample_reads_a_few_kernel_files_and_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gputop_dl.probe.collectors import procfs

    hc = HostCollector(data_path=str(REPO))
    hc.sample()  # the first one finds the data device, the cgroup, the pressure files
    read: list[str] = []
    listed: list[str] = []

    def logged(real: Callable[..., Any], paths: list[str]) -> Callable[..., Any]:
        def call(path: str, **kwargs: Any) -> Any:
            paths.append(path)
            return real(path, **kwargs)

        return call

    monkeypatch.setattr(procfs, "read_bytes", logged(procfs.read_bytes, read))
    monkeypatch.setattr(procfs, "read_single", logged(procfs.read_single, read))
    monkeypatch.setattr(procfs, "list_dir", logged(procfs.list_dir, listed))
    reading = hc.sample()
    assert reading.cpu is not None and reading.memory is not None  # it did sample
    assert "/proc/stat" in read and "/proc/meminfo" in read, read
    assert len(read) == len(set(read)) <= MAX_HOST_FILES, read
    assert not listed, listed
    assert not [p for p in read if p.split("/")[2:3] and p.split("/")[2].isdigit()], read


def test_a_worker_first_seen_has_its_share_over_its_life() -> None:
    """A DataLoader's workers start again each pass (torch's default): without a figure on
    first sight, each pass's first sample had no worker's CPU, and passes shorter than a
    sampling interval never any."""
    spin = (
        "import time\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('spun', flush=True)\ntime.sleep(30)"
    )
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen(["sleep", "30"])
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "spun\n"
        time.sleep(0.3)  # the idle one is older than MIN_LIFE_S too
        young = subprocess.Popen(["sleep", "30"])
        pc = ProcessCollector(os.getpid(), worker_pids=lambda: {busy.pid, idle.pid, young.pid})
        sample = pc.sample()
        # What psutil says of the busy one's life, just after
        proc = psutil.Process(busy.pid)
        times = proc.cpu_times()
        expected = 100.0 * (times.user + times.system) / (time.time() - proc.create_time())
    finally:
        for child in (busy, idle, young):
            child.kill()
            child.wait()
    assert sample is not None
    by_pid = {p.pid: p for p in sample.processes}
    assert by_pid[os.getpid()].cpu_pct is None  # its life holds its imports: no figure
    assert by_pid[young.pid].cpu_pct is None  # too young for a figure
    busy_pct, idle_pct = by_pid[busy.pid].cpu_pct, by_pid[idle.pid].cpu_pct
    assert busy_pct is not None and idle_pct is not None
    assert busy_pct == pytest.approx(expected, rel=0.2, abs=3.0), (busy_pct, expected)
    assert busy_pct > 10.0 and idle_pct < 2.0, (busy_pct, idle_pct)
