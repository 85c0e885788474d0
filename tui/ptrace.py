"""Could this user attach a debugger (py-spy) to a local pid? Read from /proc, cached.

The rules (Documentation/admin-guide/LSM/Yama.rst, ptrace(2)): ``kernel.yama.
ptrace_scope`` 0 lets a process trace any process of the same user; 1 only its
descendants (so ``py-spy dump --pid`` from another shell fails) unless it has
CAP_SYS_PTRACE; 2 needs CAP_SYS_PTRACE; 3 forbids attaching. Another user's process
always needs CAP_SYS_PTRACE. Containers usually drop that capability.
"""

from __future__ import annotations

import os
from pathlib import Path

from gputop_dl.tui.analysis.stuck import Ptrace

CAP_SYS_PTRACE = 19
_cache: dict[int, Ptrace] = {}
MAX_CACHED = 1024


def judge(scope: int | None, my_uid: int, their_uid: int | None, has_cap: bool) -> Ptrace:
    """The rules above as a table (pure)."""
    if scope == 3:
        return Ptrace(False, "kernel.yama.ptrace_scope is 3: no process may be attached")
    if has_cap:
        return Ptrace(True, "")
    if their_uid is not None and their_uid != my_uid:
        return Ptrace(False, "the run belongs to another user and this one lacks CAP_SYS_PTRACE")
    if scope == 2:
        return Ptrace(False, "kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may attach")
    if scope == 1:
        return Ptrace(
            False,
            "kernel.yama.ptrace_scope is 1 (only a parent may attach) and this user lacks "
            "CAP_SYS_PTRACE; sudo py-spy, or `sysctl kernel.yama.ptrace_scope=0`",
        )
    return Ptrace(True, "")


def ptrace_access(pid: int) -> Ptrace:
    """Whether this process's user may ptrace ``pid`` (a process on this host)."""
    known = _cache.get(pid)
    if known is not None:
        return known
    result = judge(_scope(), os.geteuid(), _uid_of(pid), _has_cap_sys_ptrace())
    if len(_cache) >= MAX_CACHED:
        _cache.clear()
    _cache[pid] = result
    return result


def _scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None  # no Yama: classic rules (same user may attach)


def _status(pid: int | str) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _uid_of(pid: int) -> int | None:
    uids = _status(pid).get("Uid", "").split()
    return int(uids[1]) if len(uids) > 1 and uids[1].isdigit() else None  # effective uid


def _has_cap_sys_ptrace() -> bool:
    try:
        caps = int(_status("self").get("CapEff", "0").strip(), 16)
    except ValueError:
        return False
    return bool(caps >> CAP_SYS_PTRACE & 1)
