"""Container limits of this process: cgroup v2 (unified) or v1, read from the filesystem.

The pure ``parse_*`` functions take file text and are tested with table cases; the
:class:`CgroupReader` finds this process's cgroup once and then reads a handful of small
files per sample. "No limit" is always ``None`` -- never a huge number, never a zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gputop_dl.probe.collectors import procfs
from gputop_dl.probe.samples import CgroupSample, SourceStatus

# cgroup v1 reports "no memory limit" as PAGE_COUNTER_MAX * page size
# (9223372036854771712 with 4 KiB pages) or LONG_MAX; anything this large (4 EiB) is
# no limit on any real machine.
_NO_LIMIT_THRESHOLD = 1 << 62


# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class ProcCgroup:
    """What ``/proc/<pid>/cgroup`` says: the v2 path and the v1 path per controller."""

    unified: str | None  # path of the "0::" line, None if absent
    controllers: dict[str, str]  # v1: controller name ("cpu", "memory", ...) -> path


def parse_proc_cgroup(text: str) -> ProcCgroup:
    """Parse ``/proc/self/cgroup`` lines ``hierarchy-ID:controller-list:path``."""
    unified: str | None = None
    controllers: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrl_list, path = parts
        if hier == "0" and ctrl_list == "":
            unified = path
            continue
        for ctrl in ctrl_list.split(","):
            if ctrl:
                controllers[ctrl] = path
    return ProcCgroup(unified, controllers)


def parse_keyed_ints(text: str) -> dict[str, int]:
    """Parse flat keyed files such as ``cpu.stat`` ("nr_periods 12\\n...")."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def parse_cpu_max(text: str) -> float | None:
    """v2 ``cpu.max`` ("max 100000" or "200000 100000") -> quota in cores, None = no limit."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = int(parts[0])
    period = int(parts[1]) if len(parts) > 1 else 100_000  # kernel default period
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_v1_cpu_quota(quota_text: str, period_text: str) -> float | None:
    """v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` -> cores; quota -1 means no limit."""
    quota = int(quota_text.strip())
    period = int(period_text.strip())
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_limit(text: str) -> int | None:
    """v2 ``memory.max`` ("max" or bytes) or v1 ``memory.limit_in_bytes`` -> bytes or None."""
    value = text.strip()
    if value == "max" or value == "":
        return None
    limit = int(value)
    if limit < 0 or limit >= _NO_LIMIT_THRESHOLD:
        return None
    return limit


def throttled_stat(stat: dict[str, int], version: int) -> tuple[int | None, int | None, int | None]:
    """(nr_periods, nr_throttled, throttled_usec) from a parsed ``cpu.stat``.

    v2 reports ``throttled_usec``; v1 reports ``throttled_time`` in nanoseconds.
    """
    periods = stat.get("nr_periods")
    throttled = stat.get("nr_throttled")
    if version == 2:
        usec = stat.get("throttled_usec")
    else:
        ns = stat.get("throttled_time")
        usec = ns // 1000 if ns is not None else None
    return periods, throttled, usec


def throttled_pct(
    prev: tuple[int | None, int | None], cur: tuple[int | None, int | None]
) -> float | None:
    """Share of enforcement periods throttled between two (nr_periods, nr_throttled) reads.

    None when a counter is missing, went backwards (cgroup re-created), or no period ran
    in the interval: with no period there is nothing measured, so no made-up 0 %.
    """
    (p0, t0), (p1, t1) = prev, cur
    if p0 is None or t0 is None or p1 is None or t1 is None:
        return None
    dp, dt = p1 - p0, t1 - t0
    if dp <= 0 or dt < 0:
        return None
    return min(100.0, 100.0 * dt / dp)


# --------------------------------------------------------------------------- reader


def _read(path: str) -> str | None:
    try:
        return procfs.read_text(path)
    except OSError:
        return None


def _ancestors(mount: str, leaf: str) -> list[str]:
    """Directories from ``leaf`` up to ``mount`` (inclusive), leaf first.

    Limits are hierarchical: a parent's limit binds its children, so the effective limit
    is the smallest one on the way up.
    """
    dirs = [leaf]
    cur = leaf
    mount = mount.rstrip("/") or "/"
    while cur != mount and len(cur) > len(mount):
        cur = os.path.dirname(cur)
        dirs.append(cur)
    return dirs


def _leaf_dir(mount: str, cg_path: str) -> str:
    """Directory of our cgroup under ``mount``.

    Without a cgroup namespace a container sees a host path ("/docker/<id>") in
    /proc/self/cgroup while its own cgroup is mounted at the root; fall back to the
    mount root then.
    """
    candidate = os.path.join(mount, cg_path.lstrip("/")).rstrip("/")
    if os.path.isdir(candidate):
        return candidate
    return mount.rstrip("/") or "/"


def _min_opt(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


class CgroupReader:
    """Finds this process's cgroup (v2, else v1) once; :meth:`read` samples it."""

    def __init__(self, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> None:
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._discovered = False
        self._version: int | None = None
        self._cpu_dirs: list[str] = []  # leaf first
        self._mem_dirs: list[str] = []
        self._describe = ""
        self._prev_counts: tuple[int | None, int | None] | None = None

    def _discover(self) -> None:
        self._discovered = True
        text = _read(os.path.join(self._proc_root, "self", "cgroup"))
        if text is None:
            self._describe = f"cannot read {self._proc_root}/self/cgroup (not Linux?)"
            return
        pc = parse_proc_cgroup(text)
        root = self._cgroup_root
        # Unified mode: the v2 hierarchy is mounted at the root itself.
        if pc.unified is not None and os.path.exists(os.path.join(root, "cgroup.controllers")):
            leaf = _leaf_dir(root, pc.unified)
            self._version = 2
            self._cpu_dirs = self._mem_dirs = _ancestors(root, leaf)
            self._describe = f"cgroup v2 at {leaf}"
            return
        # v1 (or hybrid, where the v2 tree under "unified" carries no controllers):
        # each controller is its own mount; "cpu" may be co-mounted as "cpu,cpuacct".
        cpu_mount = next(
            (
                os.path.join(root, n)
                for n in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                if os.path.isdir(os.path.join(root, n))
            ),
            None,
        )
        mem_mount = os.path.join(root, "memory")
        if cpu_mount is not None and "cpu" in pc.controllers:
            self._cpu_dirs = _ancestors(cpu_mount, _leaf_dir(cpu_mount, pc.controllers["cpu"]))
        if os.path.isdir(mem_mount) and "memory" in pc.controllers:
            self._mem_dirs = _ancestors(mem_mount, _leaf_dir(mem_mount, pc.controllers["memory"]))
        if self._cpu_dirs or self._mem_dirs:
            self._version = 1
            parts = []
            if self._cpu_dirs:
                parts.append(f"cpu {self._cpu_dirs[0]}")
            if self._mem_dirs:
                parts.append(f"memory {self._mem_dirs[0]}")
            self._describe = "cgroup v1 (" + ", ".join(parts) + ")"
        else:
            self._describe = f"no cgroup v2 or v1 cpu/memory controller under {root}"

    def read(self) -> tuple[CgroupSample | None, SourceStatus]:
        """One sample; never raises (a broken read gives None and a status saying why)."""
        try:
            if not self._discovered:
                self._discover()
            if self._version is None:
                return None, SourceStatus("cgroup", False, self._describe)
            sample = self._read_v2() if self._version == 2 else self._read_v1()
            return sample, SourceStatus("cgroup", True, self._describe)
        except (OSError, ValueError) as exc:
            return None, SourceStatus("cgroup", False, f"{self._describe}: {exc}")

    def _finish(
        self,
        quota: float | None,
        stat: dict[str, int],
        mem_limit: int | None,
        mem_used: int | None,
    ) -> CgroupSample:
        periods, throttled, usec = throttled_stat(stat, self._version or 2)
        counts = (periods, throttled)
        pct = throttled_pct(self._prev_counts, counts) if self._prev_counts else None
        self._prev_counts = counts
        return CgroupSample(
            cpu_quota_cores=quota,
            nr_periods=periods,
            nr_throttled=throttled,
            throttled_usec=usec,
            throttled_pct=pct,
            memory_limit_bytes=mem_limit,
            memory_used_bytes=mem_used,
        )

    def _read_v2(self) -> CgroupSample:
        quotas: list[float | None] = []
        limits: list[float | None] = []
        for d in self._cpu_dirs:
            text = _read(os.path.join(d, "cpu.max"))  # absent at the root and without cpu ctrl
            quotas.append(parse_cpu_max(text) if text is not None else None)
            text = _read(os.path.join(d, "memory.max"))
            limits.append(parse_memory_limit(text) if text is not None else None)
        leaf = self._cpu_dirs[0]
        stat_text = _read(os.path.join(leaf, "cpu.stat"))
        stat = parse_keyed_ints(stat_text) if stat_text is not None else {}
        used_text = _read(os.path.join(leaf, "memory.current"))
        used = int(used_text) if used_text and used_text.strip() else None
        limit = _min_opt(limits)
        return self._finish(_min_opt(quotas), stat, int(limit) if limit is not None else None, used)

    def _read_v1(self) -> CgroupSample:
        quotas: list[float | None] = []
        for d in self._cpu_dirs:
            q = _read(os.path.join(d, "cpu.cfs_quota_us"))
            p = _read(os.path.join(d, "cpu.cfs_period_us"))
            quotas.append(parse_v1_cpu_quota(q, p) if q is not None and p is not None else None)
        stat: dict[str, int] = {}
        if self._cpu_dirs:
            stat_text = _read(os.path.join(self._cpu_dirs[0], "cpu.stat"))
            stat = parse_keyed_ints(stat_text) if stat_text is not None else {}
        limits: list[float | None] = []
        for d in self._mem_dirs:
            text = _read(os.path.join(d, "memory.limit_in_bytes"))
            limits.append(parse_memory_limit(text) if text is not None else None)
        used: int | None = None
        if self._mem_dirs:
            used_text = _read(os.path.join(self._mem_dirs[0], "memory.usage_in_bytes"))
            used = int(used_text) if used_text and used_text.strip() else None
        limit = _min_opt(limits)
        return self._finish(_min_opt(quotas), stat, int(limit) if limit is not None else None, used)
