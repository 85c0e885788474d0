"""Where probes listen, and how ``gputop`` finds them without being told.

Each probe binds an ipc socket in a per-user runtime directory (mode 0700, so only the
same user on the same host can connect) and writes a small JSON record beside it.
``gputop`` with no argument reads the records of live processes. Records of dead
processes are removed by whoever finds them.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ENV_RUNTIME_DIR = "GPUTOP_RUNTIME_DIR"
RECORD_SUFFIX = ".json"


class DiscoveryError(Exception):
    pass


@dataclass(frozen=True)
class Record:
    endpoint: str
    pid: int
    host: str
    name: str
    role: str  # "probe" or "agent"
    started: float


def runtime_dir(create: bool = True) -> Path:
    """The per-user directory for sockets and records, created 0700 if missing.

    Refuses a directory that another user owns or that others can enter, because its
    sockets would then be reachable by them.
    """
    base = os.environ.get(ENV_RUNTIME_DIR)
    if base:
        path = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "gputop"
    else:
        path = Path(tempfile.gettempdir()) / f"gputop-{os.getuid()}"
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise DiscoveryError(f"cannot create {path}: {exc.strerror}") from None
    if path.exists():
        st = path.stat()
        if st.st_uid != os.getuid():
            raise DiscoveryError(f"{path} belongs to another user (uid {st.st_uid})")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise DiscoveryError(f"{path} is open to other users (mode {st.st_mode & 0o777:o})")
    return path


def ipc_endpoint(pid: int) -> str:
    return f"ipc://{runtime_dir() / f'{pid}.sock'}"


def register(record: Record) -> Path:
    """Write the record atomically (readers never see half a file)."""
    directory = runtime_dir()
    final = directory / f"{record.pid}{RECORD_SUFFIX}"
    tmp = directory / f".{record.pid}{RECORD_SUFFIX}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(record), f)
    os.replace(tmp, final)
    return final


def unregister(pid: int) -> None:
    with contextlib.suppress(OSError, DiscoveryError):
        directory = runtime_dir(create=False)
        (directory / f"{pid}{RECORD_SUFFIX}").unlink(missing_ok=True)
        (directory / f"{pid}.sock").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discover() -> list[Record]:
    """Records of live publishers on this host, oldest first; stale ones are removed."""
    try:
        directory = runtime_dir(create=False)
    except DiscoveryError:
        return []
    if not directory.is_dir():
        return []
    found = []
    for path in directory.glob(f"*{RECORD_SUFFIX}"):
        try:
            data = json.loads(path.read_text())
            record = Record(
                endpoint=str(data["endpoint"]),
                pid=int(data["pid"]),
                host=str(data["host"]),
                name=str(data["name"]),
                role=str(data.get("role", "probe")),
                started=float(data["started"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(record.pid):
            found.append(record)
        else:
            unregister(record.pid)
    return sorted(found, key=lambda r: r.started)
