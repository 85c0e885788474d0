"""The viewer in a real pseudo-terminal, started through the real entry point
(``python -m gputop_dl``): no terminal, input that ends, signals, colour.

The terminal's final modes are read back from what the process wrote to the pty: the last
alternate-screen, mouse-tracking and cursor sequences must be the "off"/"shown" ones."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gputop_dl.tui.driver import INPUT_ENDED

ENTRY = [sys.executable, "-m", "gputop_dl"]
START_TIMEOUT_S = 60.0  # Textual's first paint on a loaded 2-core machine
EXIT_BOUND_S = 5.0  # generous for a loaded machine; the real figure is ~0.2 s


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTOP_SCREENSHOT_DIR", str(tmp_path / "shots"))
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TEXTUAL_ALLOW_SIGNALS", raising=False)


class PtyViewer:
    """``gputop`` with stdin, stdout and stderr on a new 80x24 pty (not its controlling
    terminal, so closing the master ends the input without a SIGHUP, as an SSH connection
    that drops silently does)."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.proc = subprocess.Popen(
            [*ENTRY, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        os.close(slave)
        self.output = b""
        self.master_open = True

    def pump(self, seconds: float, until: bytes | None = None) -> None:
        end = time.monotonic() + seconds
        while self.master_open and time.monotonic() < end:
            if until is not None and until in self.output:
                return
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # EIO: the process closed its side
                    return
                if not data:
                    return
                self.output += data

    def wait_started(self) -> None:
        # The footer's last key is drawn once the first screen is complete.
        self.pump(START_TIMEOUT_S, until=b"Screenshot")
        assert b"\x1b[?1049h" in self.output, self.output[-500:]
        assert b"Screenshot" in self.output, self.output[-500:]

    def wait_exit(self, timeout: float) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.pump(0.3)  # the last bytes written before exit
                return self.proc.returncode
            self.pump(0.05)
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.master_open:
            os.close(self.master)
            self.master_open = False


@pytest.fixture
def viewer() -> Iterator[list[PtyViewer]]:
    started: list[PtyViewer] = []
    yield started
    for v in started:
        v.close()


def last_mode(output: bytes, mode: str) -> str | None:
    """'h' or 'l': the last set/reset of a DEC private mode in the output."""
    found = re.findall(rb"\x1b\[\?" + mode.encode() + rb"([hl])", output)
    return found[-1].decode() if found else None


def assert_terminal_restored(output: bytes) -> None:
    assert last_mode(output, "1049") == "l"  # alternate screen off
    for mouse in ("1000", "1003", "1006"):
        assert last_mode(output, mouse) in (None, "l"), mouse  # mouse tracking off
    assert last_mode(output, "1000") == "l"
    assert last_mode(output, "25") == "h"  # cursor shown


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_exit_signals_restore_the_terminal_and_exit_128_plus_n(
    viewer: list[PtyViewer], sig: signal.Signals
) -> None:
    v = PtyViewer("--no-local")
    viewer.append(v)
    v.wait_started()
    assert last_mode(v.output, "1000") == "h" and last_mode(v.output, "25") == "l"
    v.proc.send_signal(sig)
    assert v.wait_exit(EXIT_BOUND_S) == 128 + sig
    assert_terminal_restored(v.output)


def test_ctrl_c_quits_like_top(viewer: list[PtyViewer]) -> None:
    v = PtyViewer("--no-local")
    viewer.append(v)
    v.wait_started()
    os.write(v.master, b"\x03")
    assert v.wait_exit(EXIT_BOUND_S) == 0
    assert_terminal_restored(v.output)


def test_input_that_ends_mid_run_ends_the_viewer_and_its_cpu_use(
    viewer: list[PtyViewer],
) -> None:
    v = PtyViewer("--no-local")
    viewer.append(v)
    v.wait_started()
    proc = psutil.Process(v.proc.pid)
    before = proc.cpu_times()
    closed = time.monotonic()
    os.close(v.master)  # the terminal goes away; no SIGHUP (not the controlling tty)
    v.master_open = False
    try:
        code = v.proc.wait(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        after = proc.cpu_times()
        spent = after.user + after.system - before.user - before.system
        pytest.fail(
            f"still running {EXIT_BOUND_S} s after its input ended, "
            f"{spent:.2f} CPU-s used since (unguarded Textual spins at ~100 %)"
        )
    print(f"exited {time.monotonic() - closed:.2f} s after its input ended")
    assert code == 0


def test_a_stray_sigcont_neither_restarts_the_screen_nor_hangs_the_exit(
    viewer: list[PtyViewer],
) -> None:
    """Only a resume after Ctrl+Z restarts the screen: a second output thread started by
    a stray SIGCONT on a terminal that was gone hung a viewer's shutdown for ever."""
    v = PtyViewer("--no-local")
    viewer.append(v)
    v.wait_started()
    v.proc.send_signal(signal.SIGCONT)
    v.pump(1.0)
    assert v.output.count(b"\x1b[?1049h") == 1  # the alternate screen entered once
    v.proc.send_signal(signal.SIGTERM)
    assert v.wait_exit(EXIT_BOUND_S) == 128 + signal.SIGTERM
    assert_terminal_restored(v.output)


def test_a_pane_destroyed_as_tmux_does_it_ends_the_viewer(viewer: list[PtyViewer]) -> None:
    """tmux closes the pane's terminal and sends SIGHUP, then SIGCONT."""
    v = PtyViewer("--no-local")
    viewer.append(v)
    v.wait_started()
    os.close(v.master)
    v.master_open = False
    v.proc.send_signal(signal.SIGHUP)
    v.proc.send_signal(signal.SIGCONT)
    try:
        code = v.proc.wait(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_BOUND_S} s after its pane was destroyed")
    assert code in (INPUT_ENDED, 128 + signal.SIGHUP)  # whichever came first


def test_no_terminal_is_a_usage_error_that_names_the_alternatives() -> None:
    out = subprocess.run(
        [*ENTRY, "--no-local"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    line = out.stderr.strip()
    assert "\n" not in line
    assert "needs a terminal" in line and "input (stdin) is not one" in line
    assert "ssh -t" in line and "gputop snapshot" in line


def refused_on_a_pty(*, stdout_on_pty: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    """The viewer run with its stdin on a pty, and its stdout there too or captured, its
    stderr captured or sent away: its result and what the pty showed."""
    master, slave = os.openpty()
    try:
        out = subprocess.run(
            [*ENTRY, "--no-local"],
            stdin=slave,
            stdout=slave if stdout_on_pty else subprocess.PIPE,
            stderr=subprocess.DEVNULL if stdout_on_pty else subprocess.PIPE,
            timeout=60,
            text=True,
        )
        ready = select.select([master], [], [], 5.0)[0] if stdout_on_pty else []
        seen = os.read(master, 65536).decode(errors="replace") if ready else ""
    finally:
        os.close(slave)
        os.close(master)
    return out, seen


def test_output_not_a_terminal_is_refused_too(viewer: list[PtyViewer]) -> None:
    out, _ = refused_on_a_pty(stdout_on_pty=False)
    assert out.returncode == 2
    assert "output (stdout) is not one" in out.stderr


def test_stderr_sent_away_is_refused_on_the_terminal(viewer: list[PtyViewer]) -> None:
    """``gputop 2>/dev/null`` in a terminal: Textual draws on stderr, so it is refused,
    and the reason went where it could not be seen: an exit 2 and a blank line."""
    out, seen = refused_on_a_pty(stdout_on_pty=True)
    assert out.returncode == 2
    assert "error output (stderr, which Textual draws on) is not one" in seen, seen


def test_nohup_in_the_background_exits_2_at_once(tmp_path: Path) -> None:
    """``nohup gputop &``: stdin unreadable, output to nohup.out; no EBADF, no exit 0."""
    out = subprocess.run(
        ["sh", "-c", f"cd {tmp_path} && nohup {' '.join(ENTRY)} --no-local & wait $!"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    log = (tmp_path / "nohup.out").read_text() if (tmp_path / "nohup.out").exists() else ""
    text = out.stderr + log
    assert "needs a terminal" in text and "EBADF" not in text and "Traceback" not in text


def sgr_colours(output: bytes) -> tuple[int, int]:
    """(24-bit colour codes, any colour codes) in the output's SGR sequences (39 and 49,
    the terminal's default colours, are no colour)."""
    sgrs = re.findall(rb"\x1b\[([0-9;]*)m", output)
    truecolour = sum(b"38;2;" in s or b"48;2;" in s for s in sgrs)
    colour = sum(bool(re.search(rb"(^|;)(3[0-8]|4[0-8]|9[0-7]|10[0-7])(;|$)", s)) for s in sgrs)
    return truecolour, colour


@pytest.mark.parametrize(
    ("env", "want_24bit", "want_colour"),
    [
        ({"TERM": "xterm-256color", "COLORTERM": "truecolor"}, True, True),
        ({"TERM": "dumb", "COLORTERM": "truecolor"}, False, False),
        ({"TERM": "xterm-256color", "COLORTERM": "truecolor", "NO_COLOR": "1"}, False, False),
    ],
)
def test_colour_follows_term_and_no_color(
    viewer: list[PtyViewer], env: dict[str, str], want_24bit: bool, want_colour: bool
) -> None:
    v = PtyViewer("--no-local", env=env)
    viewer.append(v)
    v.wait_started()
    v.pump(1.0)
    v.proc.send_signal(signal.SIGTERM)
    assert v.wait_exit(EXIT_BOUND_S) == 128 + signal.SIGTERM
    truecolour, colour = sgr_colours(v.output)
    assert (truecolour > 0) == want_24bit, truecolour
    assert (colour > 0) == want_colour, colour


def test_an_endpoint_nothing_listens_on_is_refused_at_start(viewer: list[PtyViewer]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    v = PtyViewer(f"tcp://127.0.0.1:{port}")
    viewer.append(v)
    assert v.wait_exit(60) == 1
    assert f"nothing listens on tcp://127.0.0.1:{port}".encode() in v.output
    assert b"\x1b[?1049h" not in v.output  # refused before the screen was taken


def test_a_missing_ipc_socket_is_refused_at_start(viewer: list[PtyViewer], tmp_path: Path) -> None:
    path = tmp_path / "nobody.sock"
    v = PtyViewer(f"ipc://{path}")
    viewer.append(v)
    assert v.wait_exit(60) == 1
    assert f"no such socket: {path}".encode() in v.output


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_demo_in_the_terminal_stops_its_training_on_a_signal(
    viewer: list[PtyViewer], runtime_dir: Path, sig: signal.Signals
) -> None:
    v = PtyViewer("demo", "--scenario", "stall")
    viewer.append(v)
    v.wait_started()
    match = re.search(rb"training pid (\d+)", v.output)
    assert match, v.output[:300]
    child = int(match.group(1))
    runtime = runtime_dir
    end = time.monotonic() + 90
    while not list(runtime.glob("demo-*.sock")) and time.monotonic() < end:
        v.pump(0.2)
    sockets = list(runtime.glob("demo-*.sock"))
    assert sockets, "the training never bound its socket"
    v.proc.send_signal(sig)
    assert v.wait_exit(30) == 128 + sig
    assert_terminal_restored(v.output)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    assert not sockets[0].exists()


def test_s_saves_the_screenshot_in_the_documented_folder(
    viewer: list[PtyViewer], tmp_path: Path
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    v = PtyViewer("--no-local", cwd=cwd)
    viewer.append(v)
    v.wait_started()
    os.write(v.master, b"s")
    v.pump(10, until=b"Screenshot saved")
    os.write(v.master, b"q")
    assert v.wait_exit(EXIT_BOUND_S) == 0
    assert [p.suffix for p in (tmp_path / "shots").iterdir()] == [".svg"]
    assert list(cwd.iterdir()) == []


def test_a_real_hang_up_of_the_controlling_terminal_ends_the_viewer() -> None:
    """The terminal closes (ssh dies with SIGHUP): the viewer ends at once. The kernel sends
    SIGHUP (129) and the input fails at the same moment; whichever the viewer sees first
    ends it (end of input exits 0), so both are right -- what is wrong is staying alive."""
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader, the pty is its controlling terminal
        os.execv(sys.executable, [*ENTRY, "--no-local"])
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        output, end = b"", time.monotonic() + START_TIMEOUT_S
        while b"Screenshot" not in output and time.monotonic() < end:
            if select.select([master], [], [], 0.1)[0]:
                output += os.read(master, 65536)
        assert b"Screenshot" in output
    finally:
        os.close(master)
    end = time.monotonic() + EXIT_BOUND_S
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) in (0, 128 + signal.SIGHUP)
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"still running {EXIT_BOUND_S} s after its terminal hung up")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_closing_with_a_dead_output_thread_does_not_wait_for_ever() -> None:
    """The output thread ended (EIO on a terminal that is gone) with its queue full:
    Textual's close() would put the stop into that queue for ever."""
    import errno
    import io
    import threading

    from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

    from gputop_dl.tui.driver import CLOSE_WAIT_S, GuardedDriver

    class GoneTerminal(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

    driver = GuardedDriver.__new__(GuardedDriver)  # only close() and its writer are used
    writer = WriterThread(GoneTerminal())
    writer.start()
    writer.write("frame")  # the thread ends on EIO
    writer.join(5)
    assert not writer.is_alive()
    for _ in range(MAX_QUEUED_WRITES):
        writer.write("frame")
    driver._writer_thread = writer
    failed: list[BaseException] = []

    def close() -> None:
        try:
            driver.close()
        except BaseException as exc:  # reported below, not lost in a thread
            failed.append(exc)

    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    closing.join(CLOSE_WAIT_S * 2 + 3)
    assert not closing.is_alive()
    assert failed == []
    assert driver._writer_thread is None


def _wakeups(thread_id: int) -> int:
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    return int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status)[1])  # type: ignore[index]


def test_the_idle_input_thread_sleeps_yet_sees_a_lone_escape_and_the_shutdown() -> None:
    """Upstream polls the terminal ten times a second. Here the input thread blocks until
    input or shutdown; a lone ESC (which the parser holds for ESCAPE_DELAY in case a
    sequence follows) still comes out, and setting ``exit_event`` ends a blocked thread."""
    import threading

    from textual import events

    from gputop_dl.tui.driver import GuardedDriver, WakingEvent

    read_fd, write_fd = os.pipe()
    driver = GuardedDriver.__new__(GuardedDriver)  # only the input loop is used
    driver._debug = False
    driver.fileno = read_fd
    driver.exit_event = WakingEvent()
    received: list[object] = []
    driver.process_message = received.append  # type: ignore[method-assign]
    thread = threading.Thread(target=driver.run_input_thread, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # past the first escape delay: asleep from here on
        assert thread.native_id is not None
        before = _wakeups(thread.native_id)
        time.sleep(1.0)
        assert _wakeups(thread.native_id) - before <= 2  # upstream: ~10
        os.write(write_fd, b"\x1b")
        end = time.monotonic() + EXIT_BOUND_S
        while not received and time.monotonic() < end:
            time.sleep(0.02)
        assert [e.key for e in received if isinstance(e, events.Key)] == ["escape"]
        time.sleep(0.5)
        driver.exit_event.set()
        thread.join(EXIT_BOUND_S)
        assert not thread.is_alive()
        driver.exit_event.clear()  # as disable_input does: the pipe is emptied
        assert select.select([driver.exit_event.wake_fd], [], [], 0)[0] == []
    finally:
        driver.exit_event.set()
        thread.join(EXIT_BOUND_S)
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.parametrize(
    ("ticked_after", "wakes", "expected"),
    [  # ticked_after: in escape delays after the last input
        (0.0, True, 0.1),  # just fed: the parser may hold an ESC
        (0.5, True, 0.1),  # within the escape delay
        (1.0, True, None),  # ticked after the delay: nothing pending, sleep
        (50.0, True, None),
        (50.0, False, 0.1),  # no wake pipe: poll for the shutdown as upstream
    ],
)
def test_select_timeout(ticked_after: float, wakes: bool, expected: float | None) -> None:
    from textual import constants

    from gputop_dl.tui.driver import select_timeout

    fed_at = 1000.0
    ticked_at = fed_at + ticked_after * constants.ESCAPE_DELAY
    assert select_timeout(fed_at, ticked_at, wakes) == expected
