"""Where probes listen, and how ``gputop`` finds them without being told.

Each probe binds an ipc socket in a per-user runtime directory (mode 0700, so only the
same user on the same host can connect) and writes a small JSON record beside it.
``gputop`` with no argument reads the records of live processes. Records of dead
processes, of reused pids, and records that cannot be read are removed by whoever finds
them.

The directory may sit in a world-writable place (``/tmp``), so nothing here follows a
symlink: the directory is checked with ``lstat``, every file is opened with
``O_NOFOLLOW`` (and created with ``O_EXCL`` under an unpredictable name), and a default
directory that someone else has taken is skipped for a private fallback instead of used.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ENV_RUNTIME_DIR = "GPUTOP_RUNTIME_DIR"
RECORD_SUFFIX = ".json"
MAX_RECORD_BYTES = 4096  # a record is ~200 bytes; anything bigger is not ours
# Characters of a run's name kept in its record: more than a viewer shows of a name (200,
# cut the same way as the whole one in the hello). 12 bytes a character at most in JSON:
# the record stays in bounds.
MAX_RECORD_NAME = 256
MAX_RECORDS = 1024  # records read per scan; a directory stuffed with more is cut short
PID_REUSE_SLACK_S = 2.0  # a process created this long after the record's start is another one
PID_MAX_LIMIT = 4_194_304  # Linux's: every pid is below it
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


def _candidates() -> tuple[list[Path], bool]:
    """Runtime directories to try, best first; True when the user chose the only one."""
    base = os.environ.get(ENV_RUNTIME_DIR)
    if base:
        return [Path(base)], True
    paths = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        paths.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "gputop")
    paths.append(Path(tempfile.gettempdir()) / f"gputop-{os.getuid()}")
    # Last resort when /tmp/gputop-<uid> is taken by someone else: under the home
    # directory, which other users cannot plant anything in. Per host, because a home on
    # NFS is shared by nodes whose sockets are not.
    paths.append(Path.home() / ".cache" / "gputop" / f"run-{socket.gethostname()}")
    return paths, False


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a safe private directory (None: it is, or does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot inspect {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {st.st_uid})"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _make_private(path: Path) -> str | None:
    """Create ``path`` 0700 if missing; the reason it is unusable, or None."""
    problem = _problem(path)
    if problem is not None:
        return problem
    if not os.path.lexists(path):
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # created by a racing process: checked below like any other
        except OSError as exc:
            return f"cannot create {path}: {exc.strerror}"
    return _problem(path)


def runtime_dir(create: bool = True) -> Path:
    """The per-user directory for sockets and records, created 0700 if missing.

    Refuses a directory that is a symlink, that another user owns or that others can
    enter, because its sockets would then be reachable by them. A directory chosen with
    ``$GPUTOP_RUNTIME_DIR`` is used or refused; a default one that is taken is skipped.
    """
    paths, explicit = _candidates()
    reasons = []
    for path in paths:
        problem = _make_private(path) if create else _problem(path)
        if problem is None:
            return path
        reasons.append(problem)
        if explicit:
            break
    raise DiscoveryError("; ".join(reasons))


def runtime_dir_problem() -> str | None:
    """Why discovery finds nothing because of the directory itself (None: no problem)."""
    try:
        runtime_dir(create=False)
    except DiscoveryError as exc:
        return str(exc)
    return None


def ipc_endpoint(pid: int) -> str:
    return f"ipc://{runtime_dir() / f'{pid}.sock'}"


def register(record: Record) -> Path:
    """Write the record atomically (readers never see half a file).

    The temporary file has an unpredictable name and is created with O_EXCL|O_NOFOLLOW, so
    a planted file or symlink is never written through; ``os.replace`` swaps the name
    itself, never following a symlink at the final path.
    """
    directory = runtime_dir()
    if len(record.name) > MAX_RECORD_NAME:  # a long name made a record readers refuse
        record = replace(record, name=record.name[:MAX_RECORD_NAME])
    final = directory / f"{record.pid}{RECORD_SUFFIX}"
    tmp = directory / f".{record.pid}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(record), f)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return final


def unregister(pid: int) -> None:
    with contextlib.suppress(OSError, DiscoveryError):
        directory = runtime_dir(create=False)
        (directory / f"{pid}{RECORD_SUFFIX}").unlink(missing_ok=True)
        (directory / f"{pid}.sock").unlink(missing_ok=True)


def process_alive(pid: int, started: float | None) -> bool:
    """False only when process ``pid`` of this host is certainly gone, or when its pid
    now belongs to a process created more than PID_REUSE_SLACK_S after ``started`` (Unix
    time; None: not checked). Never signals a process group: ``pid`` <= 0 is "cannot
    tell", True. The discovery scan and the viewer's check of local runs both ask here."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except (OSError, OverflowError):
        return True  # cannot tell
    if started is None:
        return True
    try:
        import psutil
    except ImportError:
        return True
    try:
        return bool(psutil.Process(pid).create_time() <= started + PID_REUSE_SLACK_S)
    except psutil.NoSuchProcess:
        return False  # gone since the signal
    except Exception:
        return True


def left_running(pids: Sequence[int], started: float) -> tuple[int, ...]:
    """Those of ``pids`` (an ended run's DataLoader workers) still running here: alive,
    not a zombie, created after the run started (``started``, Unix time; an older
    process with a reused pid is another one). torch's worker watches its parent only
    once its ``worker_init_fn`` returned: a training killed meanwhile (``kill -9``, the
    OOM killer, a SIGTERM) leaves its workers running for good."""
    try:
        import psutil
    except ImportError:
        return ()
    left = []
    for pid in pids:
        if pid <= 0:
            continue
        try:
            process = psutil.Process(pid)
            if process.create_time() < started - PID_REUSE_SLACK_S:
                continue
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
        except Exception:  # gone, or not ours to read
            continue
        left.append(pid)
    return tuple(left)


def _read_record(path: Path) -> Record:
    """Parse one record file; ValueError/OSError for anything that is not a record."""
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_RECORD_BYTES:
            raise ValueError(f"{st.st_size} bytes")
        data = json.loads(f.read(MAX_RECORD_BYTES + 1))
    if not isinstance(data, dict):
        raise ValueError("not an object")
    record = Record(
        endpoint=str(data["endpoint"]),
        pid=int(data["pid"]),
        host=str(data["host"]),
        name=str(data["name"]),
        role=str(data.get("role", "probe")),
        started=float(data["started"]),
    )
    if not 0 < record.pid < PID_MAX_LIMIT or not record.endpoint.startswith(("ipc://", "tcp://")):
        raise ValueError("invalid pid or endpoint")
    return record


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def discover() -> list[Record]:
    """Records of live publishers on this host, oldest first; stale ones are removed."""
    try:
        directory = runtime_dir(create=False)
    except DiscoveryError:
        return []
    found = []
    try:
        names = [e.name for e in os.scandir(directory) if e.name.endswith(RECORD_SUFFIX)]
    except OSError:
        return []
    for name in names[:MAX_RECORDS]:
        path = directory / name
        try:
            record = _read_record(path)
        except (OSError, ValueError, KeyError, TypeError, OverflowError):
            _remove(path)  # unreadable now is unreadable at every later scan
            continue
        if process_alive(record.pid, record.started):
            found.append(record)
        else:
            _remove(path)
            if record.endpoint == f"ipc://{directory / f'{record.pid}.sock'}":
                _remove(directory / f"{record.pid}.sock")
    return sorted(found, key=lambda r: r.started)
