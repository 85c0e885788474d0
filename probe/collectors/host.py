"""Host collectors: CPU, memory, disks, network, PSI pressure, cgroup limits, data device.

:class:`HostCollector` turns cumulative kernel counters into rates over the interval
since its previous :meth:`HostCollector.sample` call. The first call has nothing to
compare with, so every rate is ``None`` there -- never zero. Each source degrades on
its own: a failure gives ``None`` for that part plus a :class:`SourceStatus` saying why,
and ``sample()`` itself never raises.

Cost matters (one sample per second inside the training process): whatever can be
cached is (the data device lookup, the mount table, which disks are partitions).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

from gputop_dl.probe.collectors import procfs, procstat
from gputop_dl.probe.collectors.cgroup import CgroupReader
from gputop_dl.probe.collectors.processes import ProcessCollector
from gputop_dl.probe.samples import (
    CgroupSample,
    CpuCore,
    CpuSample,
    DiskSample,
    MemorySample,
    NetSample,
    PressureSample,
    SourceStatus,
)

__all__ = [
    "NETWORK_FS_TYPES",
    "HostCollector",
    "HostReading",
    "ProcessCollector",
    "is_network_fs",
    "parse_pressure",
    "parse_vmstat_swap",
]

T = TypeVar("T")

# Filesystems whose data comes over the network (or from the hypervisor): no local block
# device to watch, so ``data_device`` stays None and the fs type tells the story.
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "ceph",
        "cephfs",
        "9p",
        "glusterfs",
        "beegfs",
        "afs",
        "virtiofs",
        "fuse",
        "weka",
        "wekafs",
    }
)

# Refresh a failed data-path lookup this often (the dataset may be mounted later).
_DATA_PATH_RETRY_S = 30.0


def is_network_fs(fs_type: str | None) -> bool:
    """True for network/FUSE filesystems (nfs4, cifs, lustre, fuse.sshfs, ...)."""
    if fs_type is None:
        return False
    return fs_type in NETWORK_FS_TYPES or fs_type.startswith("fuse.")


@dataclass(frozen=True)
class HostReading:
    """One host sample. Rates are over the interval since the previous sample."""

    cpu: CpuSample | None
    memory: MemorySample | None
    disks: tuple[DiskSample, ...]
    nets: tuple[NetSample, ...]
    pressure: PressureSample | None
    cgroup: CgroupSample | None
    data_device: str | None  # whole block device holding data_path ("sda", "nvme0n1")
    data_fs_type: str | None  # fs type of data_path ("ext4", "nfs4", "overlay", "tmpfs")
    statuses: tuple[SourceStatus, ...]


# --------------------------------------------------------------------------- parsers


def parse_pressure(text: str) -> dict[str, float]:
    """Parse a ``/proc/pressure/*`` file into ``{"some": avg10, "full": avg10}``.

    Kernels before 5.13 give only a "some" line for cpu; newer ones add a "full" line
    (all zeros at system level). A line that is missing is simply absent from the dict.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for kv in parts[1:]:
            key, _, value = kv.partition("=")
            if key == "avg10":
                out[parts[0]] = float(value)
                break
    return out


def parse_vmstat_swap(text: str) -> tuple[int | None, int | None]:
    """(pswpin, pswpout) page counts from ``/proc/vmstat``; None where a line is missing."""
    # /proc/vmstat has ~180 lines; two find() calls beat splitting all of them.
    text = "\n" + text
    out: list[int | None] = []
    for key in ("\npswpin ", "\npswpout "):
        start = text.find(key)
        if start < 0:
            out.append(None)
            continue
        start += len(key)
        end = text.find("\n", start)
        out.append(int(text[start:end] if end >= 0 else text[start:]))
    return out[0], out[1]


def _rate(cur: float | None, prev: float | None, dt: float) -> float | None:
    """Counter delta per second; None without a previous value or when it went backwards
    (device re-created, counter reset) -- an honest gap rather than a bogus spike."""
    if cur is None or prev is None or dt <= 0:
        return None
    d = cur - prev
    if d < 0:
        return None
    return d / dt


# --------------------------------------------------------------------------- data device


def _block_name_from_sysfs(dev: int, sys_root: str = "/sys") -> str | None:
    """Whole-disk kernel name for a device number, or None (no block device behind it).

    ``/sys/dev/block/MAJ:MIN`` links into ``/sys/devices/.../block/<disk>[/<partition>]``;
    a partition directory has a ``partition`` file and its parent is the whole disk.
    """
    link = os.path.join(sys_root, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}")
    if not os.path.exists(link):
        return None
    real = os.path.realpath(link)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    # sysfs spells "/" in names like "cciss/c0d0" as "!"; /proc/diskstats uses "/".
    return os.path.basename(real).replace("!", "/")


def _mount_for(path: str, partitions: list[Any]) -> Any | None:
    """The mount entry with the longest mountpoint that contains ``path``."""
    best = None
    best_len = -1
    for part in partitions:
        mp = part.mountpoint
        inside = path == mp or mp == "/" or path.startswith(mp.rstrip("/") + "/")
        if inside and len(mp) > best_len:
            best, best_len = part, len(mp)
    return best


def resolve_data_path(path: str, partitions: list[Any]) -> tuple[str | None, str | None]:
    """(whole block device, fs type) of ``path``. Raises OSError if ``path`` is missing."""
    real = os.path.realpath(path)
    st = os.stat(real)
    mount = _mount_for(real, partitions)
    fs_type: str | None = mount.fstype if mount is not None else None
    if is_network_fs(fs_type):
        return None, fs_type
    device = _block_name_from_sysfs(st.st_dev)
    # btrfs, zfs and similar give files an anonymous device number; the mount source
    # ("/dev/nvme0n1p2") still names the real disk.
    if device is None and mount is not None and mount.device.startswith("/dev/"):
        try:
            device = _block_name_from_sysfs(os.stat(mount.device).st_rdev)
        except OSError:
            device = None
    return device, fs_type


@dataclass(frozen=True)
class _DataPathState:
    path: str | None
    device: str | None
    fs_type: str | None
    status: SourceStatus | None
    resolved_at: float  # monotonic time of the lookup


def _resolve_state(path: str | None) -> _DataPathState:
    """Look ``path`` up once (mount table + sysfs); never raises."""
    now = time.monotonic()
    if path is None:
        return _DataPathState(None, None, None, None, now)
    try:
        # The mount table is read here only: it changes rarely and costs ~50 us.
        device, fs_type = resolve_data_path(path, psutil.disk_partitions(all=True))
    except OSError as exc:
        status = SourceStatus("data_path", False, f"{path}: {exc.strerror or exc}")
        return _DataPathState(path, None, None, status, now)
    except Exception as exc:  # psutil or sysfs oddities must not break sampling
        return _DataPathState(
            path, None, None, SourceStatus("data_path", False, f"{path}: {exc!r}"), now
        )
    if device is not None:
        status = SourceStatus("data_path", True, f"{path} on {device} ({fs_type})")
    elif is_network_fs(fs_type):
        status = SourceStatus("data_path", True, f"{path} on network filesystem {fs_type}")
    else:
        status = SourceStatus(
            "data_path", False, f"{path}: no block device behind it (fs {fs_type})"
        )
    return _DataPathState(path, device, fs_type, status, now)


# --------------------------------------------------------------------------- collector


class HostCollector:
    """Host-wide sampler. Call :meth:`sample` from one thread; :meth:`set_data_path` from any."""

    def __init__(
        self,
        *,
        data_path: str | None = None,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
    ) -> None:
        self._proc_root = proc_root
        # Linux: the node's counters parsed from /proc (procstat.py), without psutil
        self._linux = os.path.exists(os.path.join(proc_root, "stat"))
        # A kernel has PSI or not for as long as it runs: looked at once (a stat lets go
        # of the GIL, see procfs.py).
        self._psi = os.path.isdir(os.path.join(proc_root, "pressure"))
        self._page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._cgroup = CgroupReader(proc_root=proc_root, cgroup_root=cgroup_root)

        self._prev_cpu: list[Any] | None = None
        self._layout: _CoreLayout | None = None
        self._prev_swap: tuple[int | None, int | None, float] | None = None
        self._prev_disk: tuple[dict[str, Any], float] | None = None
        self._prev_net: tuple[dict[str, Any], float] | None = None

        # name -> True if it is a partition whose whole disk is also listed, or a
        # loop/ram device; recomputed only for names not seen before.
        self._disk_skip: dict[str, bool] = {}

        # Everything about the data path lives in one immutable record, swapped in one
        # assignment: set_data_path() may run on another thread than sample().
        self._data = _DataPathState(None, None, None, None, 0.0)
        self.set_data_path(data_path)

    # ---------------------------------------------------------------- data path

    def set_data_path(self, path: str | None) -> None:
        """Watch the device holding ``path`` (a dataset directory); None to stop."""
        self._data = _resolve_state(path)

    # ---------------------------------------------------------------- sources

    def _read(self, name: str) -> str | None:
        """A /proc file's text, read holding the GIL; None off Linux (psutil then)."""
        if not self._linux:
            return None
        return procfs.read_text(os.path.join(self._proc_root, name))

    def _cpu_times(self) -> tuple[tuple[str, ...], list[Any]]:
        text = self._read("stat")
        if text is not None:
            return procstat.parse_cpu_times(text)
        times = psutil.cpu_times(percpu=True)
        return (tuple(times[0]._fields) if times else ()), times

    def _cpu(self) -> CpuSample:
        fields, times = self._cpu_times()
        prev, self._prev_cpu = self._prev_cpu, times
        try:
            load: tuple[float, float, float] | None = os.getloadavg()
        except (OSError, AttributeError):
            load = None
        if prev is None or len(prev) != len(times):  # first call, or a core hot-plugged
            cores = tuple(CpuCore(i, None, None, None, None, None) for i in range(len(times)))
            return CpuSample(cores=cores, load_avg=load)
        if self._layout is None or self._layout.fields != fields:
            self._layout = _CoreLayout(fields)
        core = self._layout.core
        return CpuSample(
            cores=tuple(core(i, p, c) for i, (p, c) in enumerate(zip(prev, times, strict=True))),
            load_avg=load,
        )

    def _memory_figures(self) -> procstat.Memory:
        text = self._read("meminfo")
        parsed = procstat.parse_meminfo(text) if text is not None else None
        if parsed is not None:
            return parsed
        vm, sw = psutil.virtual_memory(), psutil.swap_memory()
        cached = getattr(vm, "cached", None)  # not on every platform
        return procstat.Memory(vm.total, vm.available, vm.used, cached, sw.total, sw.used)

    def _memory(self) -> MemorySample:
        m = self._memory_figures()
        now = time.monotonic()
        pin: int | None = None
        pout: int | None = None
        # Not Linux: swap totals still come from psutil, the rates stay None.
        with contextlib.suppress(OSError, ValueError):
            pin, pout = parse_vmstat_swap(procfs.read_text(os.path.join(self._proc_root, "vmstat")))
        prev, self._prev_swap = self._prev_swap, (pin, pout, now)
        swap_in = swap_out = None
        if prev is not None:
            dt = now - prev[2]
            ps = self._page_size
            swap_in = _rate(pin * ps if pin is not None else None, _mul(prev[0], ps), dt)
            swap_out = _rate(pout * ps if pout is not None else None, _mul(prev[1], ps), dt)
        return MemorySample(
            total_bytes=m.total,
            used_bytes=m.used,
            available_bytes=m.available,
            cached_bytes=m.cached,
            swap_total_bytes=m.swap_total,
            swap_used_bytes=m.swap_used,
            swap_in_bps=swap_in,
            swap_out_bps=swap_out,
        )

    def _skip_disk(self, name: str, listed: dict[str, Any]) -> bool:
        skip = self._disk_skip.get(name)
        if skip is None:
            skip = _is_hidden_disk(name, listed)
            self._disk_skip[name] = skip
        return skip

    def _disks(self) -> tuple[DiskSample, ...]:
        text = self._read("diskstats")
        counters: dict[str, Any] = (
            procstat.parse_diskstats(text)
            if text is not None
            else psutil.disk_io_counters(perdisk=True) or {}
        )
        now = time.monotonic()
        prev, self._prev_disk = self._prev_disk, (counters, now)
        prev_counters, dt = (prev[0], now - prev[1]) if prev is not None else ({}, 0.0)
        data_device = self._data.device
        out: list[DiskSample] = []
        for name, c in counters.items():
            # The data device is always shown, even a loop device (squashfs datasets).
            if name != data_device and self._skip_disk(name, counters):
                continue
            p = prev_counters.get(name)
            busy: float | None = None
            if p is not None and dt > 0:
                busy_ms = _rate(getattr(c, "busy_time", None), getattr(p, "busy_time", None), dt)
                busy = min(100.0, busy_ms / 10.0) if busy_ms is not None else None  # ms/s -> %
            out.append(
                DiskSample(
                    device=name,
                    read_bps=_rate(c.read_bytes, p.read_bytes if p else None, dt),
                    write_bps=_rate(c.write_bytes, p.write_bytes if p else None, dt),
                    read_iops=_rate(c.read_count, p.read_count if p else None, dt),
                    write_iops=_rate(c.write_count, p.write_count if p else None, dt),
                    busy_pct=busy,
                )
            )
        return tuple(out)

    def _nets(self) -> tuple[NetSample, ...]:
        # "lo" is kept on purpose: local data loaders and tests talk over loopback;
        # the UI decides whether to hide it.
        text = self._read("net/dev")
        counters: dict[str, Any] = (
            procstat.parse_net_dev(text)
            if text is not None
            else psutil.net_io_counters(pernic=True)
        )
        now = time.monotonic()
        prev, self._prev_net = self._prev_net, (counters, now)
        prev_counters, dt = (prev[0], now - prev[1]) if prev is not None else ({}, 0.0)
        out = []
        for name, c in counters.items():
            p = prev_counters.get(name)
            out.append(
                NetSample(
                    interface=name,
                    rx_bps=_rate(c.bytes_recv, p.bytes_recv if p else None, dt),
                    tx_bps=_rate(c.bytes_sent, p.bytes_sent if p else None, dt),
                )
            )
        return tuple(out)

    def _pressure(self) -> tuple[PressureSample | None, SourceStatus]:
        base = os.path.join(self._proc_root, "pressure")
        if not self._psi:
            return None, SourceStatus("pressure", False, f"no {base} (kernel without PSI)")
        values: dict[str, dict[str, float]] = {}
        errors: list[str] = []
        for res in ("cpu", "io", "memory"):
            try:
                values[res] = parse_pressure(procfs.read_text(os.path.join(base, res)))
            except OSError as exc:
                # EOPNOTSUPP here means PSI is compiled in but disabled (psi=0 boot option).
                errors.append(f"{res}: {exc.strerror or exc}")
            except ValueError as exc:
                errors.append(f"{res}: unparsable ({exc})")
        if not values:
            return None, SourceStatus("pressure", False, "; ".join(errors))
        sample = PressureSample(
            cpu_some=values.get("cpu", {}).get("some"),
            io_some=values.get("io", {}).get("some"),
            io_full=values.get("io", {}).get("full"),
            memory_some=values.get("memory", {}).get("some"),
            memory_full=values.get("memory", {}).get("full"),
        )
        return sample, SourceStatus("pressure", not errors, "; ".join(errors))

    # ---------------------------------------------------------------- sample

    def sample(self) -> HostReading:
        """One reading; rates since the previous call (None on the first). Never raises."""
        statuses: list[SourceStatus] = []
        cpu = _guard("cpu", self._cpu, statuses)
        memory = _guard("memory", self._memory, statuses)
        disks = _guard("disk", self._disks, statuses) or ()
        nets = _guard("net", self._nets, statuses) or ()

        pressure_status = _guard("pressure", self._pressure, statuses)
        pressure = None
        if pressure_status is not None:
            pressure, status = pressure_status
            statuses.append(status)

        cgroup: CgroupSample | None = None
        try:
            cgroup, cg_status = self._cgroup.read()
        except Exception as exc:  # the reader catches I/O errors; this is a last net
            cg_status = SourceStatus("cgroup", False, f"{type(exc).__name__}: {exc}")
        statuses.append(cg_status)

        data = self._data
        if (
            data.path is not None
            and data.status is not None
            and not data.status.ok
            and time.monotonic() - data.resolved_at >= _DATA_PATH_RETRY_S
        ):
            data = self._data = _resolve_state(data.path)  # maybe mounted by now
        if data.status is not None:
            statuses.append(data.status)

        return HostReading(
            cpu=cpu,
            memory=memory,
            disks=disks,
            nets=nets,
            pressure=pressure,
            cgroup=cgroup,
            data_device=data.device,
            data_fs_type=data.fs_type,
            statuses=tuple(statuses),
        )


# --------------------------------------------------------------------------- helpers


def _guard(source: str, fn: Callable[[], T], statuses: list[SourceStatus]) -> T | None:
    """Run one source; on any error record a status and give None instead of raising."""
    try:
        result = fn()
    except Exception as exc:
        statuses.append(SourceStatus(source, False, f"{type(exc).__name__}: {exc}"))
        return None
    if source != "pressure":  # pressure reports its own, more specific status
        statuses.append(SourceStatus(source, True))
    return result


def _mul(value: int | None, factor: int) -> int | None:
    return value * factor if value is not None else None


# Fields psutil counts inside "user"/"nice" on Linux; adding them again would double count.
_GUEST_FIELDS = ("guest", "guest_nice")

# CpuCore field -> the psutil cpu_times fields summed into it.
_CORE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("user", "nice"),
    ("system", "irq", "softirq"),
    ("iowait",),
    ("steal",),
    ("idle",),
)


class _CoreLayout:
    """Index lists into a cpu_times tuple, built once per field set.

    The per-sample work is then plain tuple arithmetic: this runs for every core every
    second, and a 192-core node should still cost well under a millisecond.
    """

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields
        self.total = tuple(i for i, f in enumerate(fields) if f not in _GUEST_FIELDS)
        # None for a group the platform lacks entirely (iowait/steal on macOS).
        self.groups = tuple(
            tuple(fields.index(f) for f in group if f in fields) or None for group in _CORE_GROUPS
        )

    def core(self, index: int, prev: tuple[float, ...], cur: tuple[float, ...]) -> CpuCore:
        # Kernels can step idle/iowait backwards on NOHZ cores: clamp deltas at zero.
        delta = [max(0.0, c - p) for c, p in zip(cur, prev, strict=True)]
        total = sum(delta[i] for i in self.total)
        if total <= 0:  # no tick elapsed on this core: nothing measured
            return CpuCore(index, None, None, None, None, None)
        scale = 100.0 / total
        user, system, iowait, steal, idle = (
            None if g is None else sum(delta[i] for i in g) * scale for g in self.groups
        )
        return CpuCore(index, user, system, iowait, steal, idle)


def _is_hidden_disk(name: str, listed: dict[str, Any]) -> bool:
    """Hide loop/ram devices and partitions whose whole disk is listed too.

    A partition's I/O is already counted in its disk's counters; showing both would
    double it in any sum and clutter the panel.
    """
    if name.startswith(("loop", "ram")):
        return True
    sys_name = name.replace("/", "!")
    block = os.path.join("/sys/class/block", sys_name)
    if not os.path.exists(os.path.join(block, "partition")):
        return False
    parent = os.path.basename(os.path.dirname(os.path.realpath(block))).replace("!", "/")
    return parent in listed
