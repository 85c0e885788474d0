"""Job control of the real viewer in a real terminal: a shell in a private tmux server.

``gputop &`` stops on its first touch of the terminal (SIGTTOU) and must set its screen up
on the ``fg`` that follows; Ctrl-Z must give the terminal back to the shell and ``fg``
redraw the screen in full; a stopped viewer must end quietly on a signal. The viewer runs
with ``--no-local`` (no source: nothing beyond this machine), in the private, mode-700
GPUTOP_RUNTIME_DIR that conftest's ``runtime_dir`` gives every test.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is needed to run the viewer under job control"
)

VIEWER = shlex.join([sys.executable, "-m", "gputop_dl", "--no-local"])
PROMPT = "jobctl$ "
START_TIMEOUT_S = 60.0  # Textual's first paint on a loaded 2-core machine
EXIT_BOUND_S = 10.0  # generous for a loaded machine
DRAWN = "Screenshot"  # the footer's last key: drawn once the first screen is complete


class TmuxShell:
    """An interactive bash (job control on) in a 100x30 pane of a tmux server of its own."""

    def __init__(self, socket: Path) -> None:
        self.tmux = ["tmux", "-S", str(socket), "-f", "/dev/null"]
        env = {**os.environ, "TERM": "xterm-256color"}
        env.pop("TMUX", None)  # a tmux around the test run is not this one
        env.pop("TEXTUAL_ALLOW_SIGNALS", None)
        env.pop("NO_COLOR", None)
        rc = socket.with_name("bashrc")  # bash takes PS1 from its rc file, not from env
        rc.write_text(f"PS1={shlex.quote(PROMPT)}\nunset PROMPT_COMMAND\n")
        shell = shlex.join(["bash", "--noprofile", "--rcfile", str(rc), "-i"])
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-x", "100", "-y", "30", shell],
            check=True,
            env=env,
        )

    def screen(self) -> str:
        """What the pane shows now (the alternate screen while the viewer has it)."""
        out = subprocess.run(
            [*self.tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True
        )
        return out.stdout

    def history(self) -> str:
        """Everything the normal screen showed, scrollback included."""
        out = subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-S", "-", "-a"],
            capture_output=True,
            text=True,
            check=False,
        )
        normal = subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-S", "-"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout + normal.stdout

    def type(self, line: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-l", line], check=True)
        subprocess.run([*self.tmux, "send-keys", "Enter"], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", *keys], check=True)

    def wait_for(
        self, done: Callable[[str], bool], what: str, timeout: float = START_TIMEOUT_S
    ) -> str:
        end = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if done(screen):
                return screen
            if time.monotonic() > end:
                pytest.fail(f"no {what} after {timeout:.0f} s; the pane shows:\n{screen}")
            time.sleep(0.1)

    def wait_drawn(self) -> str:
        return self.wait_for(lambda s: DRAWN in s and "gputop" in s, "viewer screen")

    def wait_prompt_back(self, timeout: float = EXIT_BOUND_S) -> str:
        """The viewer's screen is gone and the shell waits for a command."""
        return self.wait_for(
            lambda s: DRAWN not in s and s.rstrip().endswith(PROMPT.rstrip()),
            "shell prompt",
            timeout,
        )

    def exit_status(self) -> int:
        """$? of the last command (``fg``, ``wait``), read from the shell."""
        self.type('echo "EXIT=$?"')
        screen = self.wait_for(lambda s: "EXIT=" in s.replace('"EXIT=$?"', ""), "$?")
        value = screen.replace('"EXIT=$?"', "").split("EXIT=")[-1].split()[0]
        return int(value)

    def kill(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)


@pytest.fixture
def shell(runtime_dir: Path) -> Iterator[TmuxShell]:
    """The socket in conftest's short runtime dir (a socket's path is at most ~107
    bytes); the server and any viewer left are killed at the end."""
    sh = TmuxShell(runtime_dir / "tmux.sock")
    try:
        sh.wait_for(lambda screen: screen.rstrip().endswith(PROMPT.rstrip()), "a prompt")
        yield sh
    finally:
        left = viewers()
        sh.kill()
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=5)


def viewers() -> list[psutil.Process]:
    """The viewers this test started: ``python -m gputop_dl`` in this test's runtime dir."""
    mine = os.environ["GPUTOP_RUNTIME_DIR"]
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if (
                cmdline[1:3] == ["-m", "gputop_dl"]
                and proc.environ().get("GPUTOP_RUNTIME_DIR") == mine
            ):
                found.append(proc)
        except (psutil.Error, IndexError):
            continue
    return found


def the_viewer(timeout: float = START_TIMEOUT_S) -> psutil.Process:
    end = time.monotonic() + timeout
    while not (found := viewers()):
        if time.monotonic() > end:
            pytest.fail("the viewer never started")
        time.sleep(0.1)
    assert len(found) == 1, found
    return found[0]


def wait_stopped(proc: psutil.Process, timeout: float = START_TIMEOUT_S) -> None:
    end = time.monotonic() + timeout
    while proc.status() != psutil.STATUS_STOPPED:
        if time.monotonic() > end:
            pytest.fail(f"the viewer is {proc.status()}, not stopped, after {timeout:.0f} s")
        time.sleep(0.1)


def start_in_background_and_wait_stopped(shell: TmuxShell) -> psutil.Process:
    """``gputop &``: it runs until its start touches the terminal, then stops (SIGTTOU)."""
    shell.type(f"{VIEWER} & P=$!")  # $P: `wait $P` gives its status even once reaped
    proc = the_viewer()
    wait_stopped(proc)
    before = proc.cpu_times()
    time.sleep(1.0)
    after = proc.cpu_times()
    assert proc.status() == psutil.STATUS_STOPPED
    assert after.user + after.system == before.user + before.system  # no CPU in the background
    return proc


def wait_gone(proc: psutil.Process) -> None:
    """The viewer ended (its status is the shell's to read: it is bash's child)."""
    try:
        proc.wait(EXIT_BOUND_S)
    except psutil.TimeoutExpired:
        pytest.fail(f"the viewer is still {proc.status()} {EXIT_BOUND_S:.0f} s on")


def assert_quiet(shell: TmuxShell) -> None:
    history = shell.history()
    assert "Traceback" not in history, history
    assert "AssertionError" not in history, history


def test_started_in_the_background_then_fg_draws_the_screen_and_q_quits(
    shell: TmuxShell,
) -> None:
    """The reviewer's ``gputop & sleep 3; fg``: after ``fg`` no screen was drawn, the
    terminal stayed cooked (``q`` echoed) and Ctrl-C printed AssertionErrors."""
    proc = start_in_background_and_wait_stopped(shell)
    shell.type("fg")
    shell.wait_drawn()
    shell.keys("p")  # keys reach the viewer: the terminal is in its mode, not cooked
    shell.wait_for(lambda s: "paused" in s.lower(), "pause shown")
    shell.keys("q")
    shell.wait_prompt_back()
    wait_gone(proc)
    assert shell.exit_status() == 0
    assert_quiet(shell)


def test_ctrl_z_suspends_like_top_and_fg_redraws_in_full(shell: TmuxShell) -> None:
    shell.type(VIEWER)
    shell.wait_drawn()
    proc = the_viewer()
    shell.keys("C-z")
    screen = shell.wait_prompt_back()
    assert "Stopped" in screen
    wait_stopped(proc, EXIT_BOUND_S)
    shell.type("stty -a | tr ';' '\\n' | grep -wE 'icanon|echo' | tr -d ' '")
    shell.wait_for(lambda s: "icanon" in s.replace("grep", ""), "the shell's stty")
    screen = shell.screen()  # the terminal was given back as it was: cooked, echoing
    assert "-icanon" not in screen and "-echo\n" not in screen, screen
    shell.type("fg")
    shell.wait_drawn()  # a fresh alternate screen, painted in full
    shell.keys("C-z")  # a second time: the resumed viewer reads its keys again
    shell.wait_prompt_back()
    wait_stopped(proc, EXIT_BOUND_S)
    shell.type("fg")
    shell.wait_drawn()
    shell.keys("q")
    shell.wait_prompt_back()
    wait_gone(proc)
    assert shell.exit_status() == 0
    assert_quiet(shell)


def ended_quietly(shell: TmuxShell, proc: psutil.Process, status: int) -> None:
    """The viewer is gone, the prompt back, its exit status ``status``, no traceback."""
    wait_gone(proc)
    shell.wait_prompt_back()
    assert shell.exit_status() == status
    assert_quiet(shell)


def test_a_stopped_background_viewer_ends_quietly_on_sigterm(shell: TmuxShell) -> None:
    """``kill %1`` sends SIGTERM then SIGCONT to a stopped job: the SIGCONT must not set
    the screen up (in the background it would stop again, for ever)."""
    proc = start_in_background_and_wait_stopped(shell)
    shell.type("kill -TERM %1")
    wait_gone(proc)
    shell.wait_prompt_back()
    shell.type("wait $P")  # not at once after the kill: bash would give the stop's 147
    assert shell.exit_status() == 128 + 15
    assert_quiet(shell)


def test_a_stopped_background_viewer_sent_sigint_ends_quietly_on_fg(
    shell: TmuxShell,
) -> None:
    """bash sends no SIGCONT with SIGINT: it waits for ``fg``, then ends, no traceback."""
    proc = start_in_background_and_wait_stopped(shell)
    shell.type("kill -INT %1")
    time.sleep(0.5)
    assert proc.status() == psutil.STATUS_STOPPED
    shell.type("fg")
    ended_quietly(shell, proc, 128 + 2)


def test_a_viewer_drawn_after_fg_ends_on_sigterm_with_the_terminal_restored(
    shell: TmuxShell,
) -> None:
    proc = start_in_background_and_wait_stopped(shell)
    shell.type("fg")
    shell.wait_drawn()
    proc.terminate()
    ended_quietly(shell, proc, 128 + 15)
    shell.type("echo typed")  # echo on again: the shell's terminal is back
    shell.wait_for(lambda s: "\ntyped" in s, "echo")
    assert_quiet(shell)
