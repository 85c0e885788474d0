"""The runtime directory and discovery records resist what another local user can plant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop_dl.probe import discovery


def record(directory: Path, pid: int, started: float | None = None) -> discovery.Record:
    return discovery.Record(
        f"ipc://{directory}/{pid}.sock",
        pid,
        "h",
        "run",
        "probe",
        time.time() if started is None else started,
    )


@pytest.fixture
def default_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """No $GPUTOP_RUNTIME_DIR: the defaults under a private fake /tmp and a fake home."""
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    monkeypatch.delenv("GPUTOP_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(discovery.tempfile, "gettempdir", lambda: str(tmp))
    monkeypatch.setenv("HOME", str(home))
    return tmp / f"gputop-{os.getuid()}", home


def test_default_dir_is_created_private(default_dirs: tuple[Path, Path]) -> None:
    default, _ = default_dirs
    assert discovery.runtime_dir() == default
    assert default.stat().st_mode & 0o777 == 0o700


def test_planted_symlink_dir_is_skipped_and_its_target_untouched(
    default_dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    default, home = default_dirs
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "precious").write_text("keep me")
    default.symlink_to(victim)  # another user's trap: /tmp/gputop-<uid> -> somewhere
    chosen = discovery.runtime_dir()
    assert chosen != default and chosen.is_relative_to(home)
    discovery.register(record(chosen, os.getpid()))
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert (victim / "precious").read_text() == "keep me"
    # a viewer on the same host finds the same fallback, without creating anything
    assert discovery.runtime_dir(create=False) == chosen
    assert [r.pid for r in discovery.discover()] == [os.getpid()]


def test_open_default_dir_is_skipped_with_the_reason(default_dirs: tuple[Path, Path]) -> None:
    default, home = default_dirs
    default.mkdir(mode=0o777)
    os.chmod(default, 0o777)
    assert discovery.runtime_dir().is_relative_to(home)


def test_explicit_dir_that_is_a_symlink_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv("GPUTOP_RUNTIME_DIR", str(link))
    with pytest.raises(discovery.DiscoveryError, match="symlink"):
        discovery.runtime_dir()
    assert discovery.runtime_dir_problem() == f"{link} is a symlink"
    assert discovery.discover() == []


def test_open_explicit_dir_reports_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    monkeypatch.setenv("GPUTOP_RUNTIME_DIR", str(open_dir))
    assert discovery.runtime_dir_problem() == f"{open_dir} is open to other users (mode 777)"


def test_register_never_writes_through_a_planted_symlink(runtime_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    pid = os.getpid()
    # the names the old code wrote to, planted as symlinks to the victim
    (runtime_dir / f".{pid}.json.tmp").symlink_to(victim)
    (runtime_dir / f"{pid}.json").symlink_to(victim)
    path = discovery.register(record(runtime_dir, pid))
    assert victim.read_text() == "keep me"
    assert not path.is_symlink() and json.loads(path.read_text())["pid"] == pid
    assert not [p for p in runtime_dir.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2, 3]",
        b'{"endpoint": "ipc:///x.sock"}',
        b'{"endpoint": "ipc:///x.sock", "pid": "x", "host": "h", "name": "n", "started": 1}',
        b'{"endpoint": "file:///etc/passwd", "pid": 1, "host": "h", "name": "n", "started": 1}',
        b'{"endpoint": "ipc:///x.sock", "pid": -5, "host": "h", "name": "n", "started": 1}',
        b'{"endpoint": "ipc:///x.sock", "pid": 1e400, "host": "h", "name": "n", "started": 1}',
        b'{"endpoint": "ipc:///x.sock", "pid": 1099511627776, "host": "h", "name": "n", '
        b'"started": 1}',
        b" " * (discovery.MAX_RECORD_BYTES + 1),
    ],
    ids=[
        "garbage",
        "list",
        "missing",
        "bad-pid",
        "bad-endpoint",
        "negative",
        "huge",
        "past-pid-max",
        "oversized",
    ],
)
def test_malformed_records_are_removed(runtime_dir: Path, content: bytes) -> None:
    bad = runtime_dir / "12345.json"
    bad.write_bytes(content)
    assert discovery.discover() == []
    assert not bad.exists()


def test_record_that_is_a_symlink_or_fifo_is_removed_not_followed(
    runtime_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(record(runtime_dir, os.getpid()).__dict__))
    (runtime_dir / "1.json").symlink_to(target)
    os.mkfifo(runtime_dir / "2.json")  # would block a plain open() forever
    assert discovery.discover() == []
    assert sorted(p.name for p in runtime_dir.iterdir()) == []
    assert target.exists()


def test_record_of_a_reused_pid_is_stale(runtime_dir: Path) -> None:
    # Our own pid is alive, but this record says its process started a day before it did.
    discovery.register(record(runtime_dir, os.getpid(), started=time.time() - 86_400))
    (runtime_dir / f"{os.getpid()}.sock").touch()
    assert discovery.discover() == []
    assert list(runtime_dir.iterdir()) == []


def test_dead_process_record_and_socket_are_removed(runtime_dir: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    discovery.register(record(runtime_dir, pid, started=time.time() - 10))
    (runtime_dir / f"{pid}.sock").touch()
    assert discovery.discover() == []
    assert list(runtime_dir.iterdir()) == []


@pytest.mark.parametrize("pid", [0, -1, 2**40])
def test_the_pid_check_never_signals_a_process_group(pid: int) -> None:
    assert discovery.process_alive(pid, None)


def test_the_pid_check_sees_a_dead_child_and_a_reused_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not discovery.process_alive(child.pid, None)
    assert discovery.process_alive(os.getpid(), None)
    # this process was created long after that start: its pid is another process's now
    assert not discovery.process_alive(os.getpid(), started=time.time() - 86_400)
    assert discovery.process_alive(os.getpid(), started=time.time())


@pytest.mark.parametrize(
    "name",
    ["x" * 10_000, "训" * 700, "\U0001f525" * 700, "\x1b" * 5_000],
    ids=["ascii", "cjk", "emoji", "escapes"],
)
def test_a_long_run_name_keeps_the_record_readable(runtime_dir: Path, name: str) -> None:
    """A record over MAX_RECORD_BYTES is refused (and removed) by every reader: a run
    named with 700 CJK characters vanished from `gputop list` and the viewer."""
    long_named = discovery.Record(
        f"ipc://{runtime_dir}/{os.getpid()}.sock", os.getpid(), "h", name, "probe", time.time()
    )
    path = discovery.register(long_named)
    assert path.stat().st_size <= discovery.MAX_RECORD_BYTES
    (found,) = discovery.discover()
    assert found.name == name[: discovery.MAX_RECORD_NAME]
