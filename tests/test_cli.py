"""The command line as scripts and people use it: argument checks, endpoint checks, exit
status, closed pipes, a base install without Textual, and the demo's lifecycle. Through the
real entry point (``python -m gputop_dl``), real sockets and real processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gputop_dl.tui import endpoints
from gputop_dl.tui.cli import in_range

ENTRY = [sys.executable, "-m", "gputop_dl"]
TRAIN = [sys.executable, "-m", "gputop_dl.tui.demo.train"]
ORPHAN_BOUND_S = 30.0  # generous: worker shutdown on a loaded 2-core machine


def gputop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ENTRY, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ pure checks
@pytest.mark.parametrize(
    ("text", "listen", "error"),
    [
        ("ipc:///run/x.sock", False, None),
        ("tcp://127.0.0.1:5555", False, None),
        ("tcp://[::1]:5555", False, None),
        ("tcp://node7:1", False, None),
        ("tcp://127.0.0.1:*", True, None),
        ("tcp://127.0.0.1:*", False, "port must be a number"),
        ("foo", False, "is not an endpoint"),
        ("/run/x.sock", False, "is not an endpoint"),
        ("ipc://", False, "no socket path"),
        ("tcp://127.0.0.1", False, "no port"),
        ("tcp://:5555", False, "no host"),
        ("tcp://h:0", False, "port must be a number from 1 to 65535"),
        ("tcp://h:65536", False, "port must be"),
        ("tcp://h:-1", False, "port must be"),
        ("udp://h:1", False, "is not an endpoint"),
    ],
)
def test_endpoint_syntax(text: str, listen: bool, error: str | None) -> None:
    if error is None:
        assert endpoints.parse(text, listen=listen) == text
    else:
        with pytest.raises(endpoints.EndpointError, match=re.escape(error)):
            endpoints.parse(text, listen=listen)


@pytest.mark.parametrize(
    ("text", "ok"),
    [("2", True), ("0.1", True), ("10", True), ("0", False), ("-1", False), ("11", False),
     ("nan", False), ("inf", False), ("-inf", False), ("x", False), ("", False)],
)  # fmt: skip
def test_refresh_range(text: str, ok: bool) -> None:
    parse = in_range(0.1, 10.0)
    if ok:
        assert parse(text) == float(text)
    else:
        with pytest.raises(Exception, match=r"out of range|not a number|not a finite number"):
            parse(text)


def test_unreachable_names_what_is_wrong(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert endpoints.unreachable(f"tcp://127.0.0.1:{port}") is None
    assert endpoints.unreachable(f"tcp://127.0.0.1:{port}") == (
        f"nothing listens on tcp://127.0.0.1:{port}"
    )
    missing = tmp_path / "none.sock"
    assert endpoints.unreachable(f"ipc://{missing}") == f"no such socket: {missing}"
    plain = tmp_path / "file.sock"
    plain.write_text("")
    assert endpoints.unreachable(f"ipc://{plain}") == f"not a socket: {plain}"
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(stale))
        unix.listen()
        assert endpoints.unreachable(f"ipc://{stale}") is None
    # closed without unlinking: what a process killed with -9 leaves behind
    assert "nothing listens on ipc://" in str(endpoints.unreachable(f"ipc://{stale}"))


# ------------------------------------------------------------ exit status, CLI
@pytest.mark.parametrize(
    "args",
    [
        ["foo"],
        ["--refresh", "0"],
        ["--refresh", "-2"],
        ["--refresh", "nan"],
        ["--refresh", "1e9"],
        ["snapshot", "foo"],
        ["snapshot", "--wait", "-1"],
        ["snapshot", "--wait", "0"],
        ["snapshot", "--wait", "inf"],
        ["agent", "--listen", "foo"],
        ["agent", "--listen", "tcp://127.0.0.1:0"],
        ["agent", "--interval", "0"],
        ["demo", "--duration", "-5"],
        ["demo", "--scenario", "nope"],
    ],
)
def test_bad_command_lines_are_usage_errors(args: list[str]) -> None:
    out = gputop(*args)
    assert out.returncode == 2, out
    assert "error: argument" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_snapshot_of_a_port_nothing_listens_on_names_it_and_exits_1() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    out = gputop("snapshot", "--wait", "1", endpoint)
    assert out.returncode == 1
    assert out.stderr.strip() == f"gputop snapshot: nothing listens on {endpoint}"
    assert out.stdout == ""


def test_snapshot_of_a_missing_socket_says_no_such_socket(tmp_path: Path) -> None:
    path = tmp_path / "gone.sock"
    out = gputop("snapshot", f"ipc://{path}")
    assert out.returncode == 1
    assert f"no such socket: {path}" in out.stderr


def test_help_documents_exit_status_and_ranges() -> None:
    for args in (["--help"], ["snapshot", "--help"]):
        out = gputop(*args)
        assert out.returncode == 0
        text = " ".join(out.stdout.split())
        assert "0 a run was found" in text and "1 no run reachable" in text
        assert "2 usage error" in text and "128+n stopped by signal n" in text
    assert "0.1 to 10" in " ".join(gputop("--help").stdout.split())


def test_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen(
        [*ENTRY, "snapshot", "--wait", "0.5"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written (| head -0)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE
    assert err == ""


def test_snapshot_piped_into_head_prints_one_line_and_no_traceback() -> None:
    out = subprocess.run(
        ["sh", "-c", f"{' '.join(ENTRY)} snapshot --wait 0.5 | head -1"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert len(out.stdout.splitlines()) == 1
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread of another process (os.kill lets the kernel choose)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, sig) != 0:  # SYS_tgkill on x86-64
        raise OSError(ctypes.get_errno(), "tgkill")


def _blocks(pid: int, tid: int, sig: int) -> bool:
    """Whether thread ``tid`` of ``pid`` blocks ``sig`` (its SigBlk mask in /proc)."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
    reason="tgkill by syscall number: Linux x86-64",
)
def test_snapshot_ctrl_c_taken_by_another_thread_prints_at_once() -> None:
    """Ctrl-C ends the wait and prints what was gathered, whichever of the process's
    threads the kernel hands the signal to (a main thread asleep in time.sleep slept on
    until --wait ran out)."""
    proc = subprocess.Popen(
        [*ENTRY, "snapshot", "--wait", "120"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        others: list[int] = []
        while not others and time.monotonic() < deadline:
            time.sleep(0.2)
            others = [
                tid for tid in map(int, os.listdir(f"/proc/{proc.pid}/task")) if tid != proc.pid
            ]
        assert others, "the snapshot started no thread"
        time.sleep(1.0)  # its handlers are installed before its threads start
        # A thread the kernel could choose: one that does not block SIGINT (zmq's do).
        others = [tid for tid in others if not _blocks(proc.pid, tid, signal.SIGINT)]
        assert others, "every other thread blocks SIGINT"
        sent = time.monotonic()
        _tgkill(proc.pid, others[-1], signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took < 10, f"printed {took:.0f} s after Ctrl-C"
    assert "Traceback" not in err
    assert proc.returncode == 130  # interrupted (README's exit codes), not killed by it
    assert out.strip()


def test_agent_on_a_busy_port_says_it_could_not_bind() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = gputop("agent", "--listen", f"tcp://127.0.0.1:{port}", timeout=60)
    assert out.returncode == 1
    assert "could not start, nothing is published" in out.stderr
    assert "Address already in use" in out.stderr
    assert "Training continues" not in out.stderr
    assert "listening on" not in out.stderr  # it is not


# ------------------------------------------------- base install: no Textual
WITHOUT_TEXTUAL = (
    "import sys; sys.modules['textual'] = None\n"  # import textual -> ImportError
    "from gputop_dl.tui.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "assert 'textual' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]], 'imported'\n"
    "sys.exit(code)\n"
)


def without_textual(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TEXTUAL, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_textual_the_viewer_says_what_to_install() -> None:
    out = without_textual()
    assert out.returncode == 2
    assert out.stderr.strip() == "gputop: the viewer needs: pip install 'gputop-dl[viewer]'"


def test_without_textual_snapshot_and_list_work() -> None:
    snap = without_textual("snapshot", "--wait", "1")
    assert snap.returncode == 1, snap.stderr  # nothing runs here: no run found
    assert "no training run found" in snap.stdout and "memory:" in snap.stdout
    listed = without_textual("list")
    assert listed.returncode == 1 and "no probe running" in listed.stdout


def test_without_textual_the_agent_publishes() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_TEXTUAL, "agent", "--listen", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert f"publishing on {endpoint}" in proc.stdout.readline()
        snap = gputop("snapshot", "--json", "--wait", "2.5", endpoint)
        assert '"host"' in snap.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


# ----------------------------------------------------------------------- demo
@pytest.fixture
def children() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def demo_sockets(runtime: Path) -> list[Path]:
    return sorted(runtime.glob("demo-*.sock")) if runtime.exists() else []


def start_no_tui_demo(*args: str) -> tuple[subprocess.Popen[str], int, Path]:
    proc = subprocess.Popen(
        [*ENTRY, "demo", "--no-tui", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = re.search(r"training pid (\d+), log (.+)$", line)
    assert match, line
    return proc, int(match.group(1)), Path(match.group(2))


def wait_for_socket(runtime: Path, within: float = 90) -> Path:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if found := demo_sockets(runtime):
            return found[0]
        time.sleep(0.2)
    raise AssertionError("the demo's training never bound its socket")


@pytest.mark.e2e
def test_stall_scenario_honours_duration() -> None:
    """The hang is cut at --duration, counted from the process's start (it used to sleep
    an hour past it); a step or import still running then is interrupted."""
    started = time.monotonic()
    out = subprocess.run(
        [*TRAIN, "--scenario", "stall", "--duration", "8", "--stall-after", "0.5"],
        capture_output=True,
        text=True,
        timeout=90,  # the hang is 3600 s long: only the deadline ends it in time
        env={**os.environ, "GPUTOP_DISABLE": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    print(f"stall demo with --duration 8 took {time.monotonic() - started:.1f} s")


@pytest.mark.e2e
def test_demo_duration_ends_the_demo_and_leaves_nothing(
    runtime_dir: Path, children: list[int]
) -> None:
    proc, child, log = start_no_tui_demo("--scenario", "input-bound", "--duration", "6")
    children.append(child)
    assert proc.wait(timeout=120) == 0
    assert gone(child, ORPHAN_BOUND_S)
    assert demo_sockets(runtime_dir) == []
    assert not log.exists()  # a training that went well leaves no log in /tmp


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signalled_demo_stops_its_training_and_removes_its_socket(
    runtime_dir: Path, children: list[int], sig: signal.Signals
) -> None:
    proc, child, log = start_no_tui_demo("--scenario", "stall")
    children.append(child)
    try:
        sock = wait_for_socket(runtime_dir)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(child, ORPHAN_BOUND_S), "the training child outlived the demo"
    assert not sock.exists() and not log.exists()


@pytest.mark.e2e
def test_a_demo_killed_with_9_does_not_leave_its_training_publishing(
    runtime_dir: Path, children: list[int]
) -> None:
    proc, child, _ = start_no_tui_demo("--scenario", "stall")
    children.append(child)
    sock = wait_for_socket(runtime_dir)
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    # it notices within 0.5 s, then stops its DataLoader workers: ~3 s here, unloaded
    assert gone(child, ORPHAN_BOUND_S), "orphaned training still running"
    print(f"training stopped {time.monotonic() - killed:.1f} s after its demo was killed")
    assert not sock.exists()


def test_list_cleans_a_run_name_of_escape_sequences(
    runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's name is the process's own (argv, GPUTOP_NAME): `gputop list` printed it as
    it was, so a name could clear the screen, retitle the terminal or leave the
    alternate screen of the pane it was listed in."""
    from gputop_dl.probe import discovery
    from gputop_dl.tui.cli import cmd_list

    name = "\x1b[2J\x1b[31mRED\x1b]0;pwned\x07\x1b[?1049l\x9b31m\u202etab\there\nnext"
    discovery.register(
        discovery.Record(
            f"ipc://{runtime_dir}/{os.getpid()}.sock", os.getpid(), "h", name, "probe", time.time()
        )
    )
    assert cmd_list([]) == 0
    out = capsys.readouterr().out
    assert "RED" in out and "pwned" in out and "tab here next" in out
    line = out.rstrip("\n")
    assert "\n" not in line and all(c.isprintable() for c in line), repr(line)


def test_a_recording_that_is_not_there_is_said_to_be_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FILE is a recording only if it exists; a missing one read as a bad endpoint."""
    from gputop_dl.tui.cli import main

    for name in (str(tmp_path / "gone.gtrec"), "gone.gtrec"):
        with pytest.raises(SystemExit) as exc:
            main(["snapshot", name])
        assert exc.value.code == 2
        assert "nor is it a recording: no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["snapshto"], "did you mean the command: gputop snapshot?"),
        (["agnet"], "did you mean the command: gputop agent?"),
        (["127.0.0.1:5555"], "did you mean tcp://127.0.0.1:5555?"),
        (["snapshot", "localhost:5555"], "did you mean tcp://localhost:5555?"),
        (["nothing-like-it"], "ssh://[USER@]HOST[:PORT] and a recording FILE are read too"),
    ],
)
def test_a_mistyped_command_or_endpoint_gets_what_was_likely_meant(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gputop_dl.tui.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert hint in capsys.readouterr().err


def test_snapshot_at_without_a_recording_says_what_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gputop_dl.tui.cli import main

    assert main(["snapshot", "--at", "-30s"]) == 2
    assert "--at TIME reads a recording: gputop snapshot FILE --at TIME" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["snapshot", "--help"])
    assert "gputop snapshot FILE [--at TIME] [--json]" in capsys.readouterr().out
