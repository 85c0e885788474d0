"""Remote nodes over ssh: the fake ssh (tests/fakes/ssh, first on PATH) runs each
"node"'s relay on this machine, with a runtime directory of its own per host; the
probes are real probes whose host name is the node's. Where /usr/sbin/sshd exists, the
same stream also goes through a real sshd on a random port (test_real_sshd)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputop_dl.tui.events import EndpointState, SourceEvent
from gputop_dl.tui.remote import (
    AUTH_FAILED,
    LIVE,
    LOST,
    NOT_INSTALLED,
    UNREACHABLE,
    RemoteSource,
    Target,
    classify,
    parse_ssh_url,
    remote_targets,
    ssh_command,
)
from gputop_dl.tui.state import ViewerState

FAKES = Path(__file__).parent / "fakes"
NODE_PROBE = str(FAKES / "node_probe.py")
RELAY = f"{sys.executable} -m gputop_dl relay --stdio"


# ------------------------------------------------------------------ pure parts


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("ssh://node1", Target("node1")),
        ("ssh://alice@node1", Target("node1", "alice")),
        ("ssh://alice@node1:2222", Target("node1", "alice", 2222)),
        ("ssh://node1:22/", Target("node1", None, 22)),
        ("ssh://[::1]:2200", Target("::1", None, 2200)),
        ("ssh://a.b-c.example.org", Target("a.b-c.example.org")),
    ],
)
def test_parse_ssh_url(text: str, target: Target) -> None:
    assert parse_ssh_url(text) == target


@pytest.mark.parametrize(
    "text", ["ssh://", "ssh://-oProxyCommand=x", "ssh://@h", "ssh://h:0", "ssh://h:99999", "h"]
)
def test_parse_ssh_url_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ssh_url(text)


def test_ssh_command_is_the_users_ssh_in_batch_mode() -> None:
    cmd = ssh_command(Target("node1", "alice", 2222), "gputop relay --stdio", ssh="ssh")
    assert cmd[0] == "ssh" and "-T" in cmd and "BatchMode=yes" in cmd
    assert cmd[-3:] == ["--", "alice@node1", "gputop relay --stdio"]
    assert cmd[cmd.index("-p") + 1] == "2222"


@pytest.mark.parametrize(
    ("status", "stderr", "state", "words"),
    [
        (255, "alice@node1: Permission denied (publickey).\n", AUTH_FAILED, "Permission denied"),
        (255, "Host key verification failed.\n", AUTH_FAILED, "Host key verification"),
        (
            255,
            "ssh: connect to host node1 port 22: Connection refused\n",
            UNREACHABLE,
            "Connection refused",
        ),
        (
            255,
            "ssh: Could not resolve hostname node1: Name or service not known\n",
            UNREACHABLE,
            "Could not resolve",
        ),
        (255, "Connection to node1 closed by remote host.\n", LOST, "closed by remote host"),
        (
            127,
            "bash: line 1: gputop: command not found\n",
            NOT_INSTALLED,
            "pip install /path/to/gputop",
        ),
        (127, "sh: 1: gputop: not found\n", NOT_INSTALLED, "--remote-command"),
        (0, "", LOST, "relay exit status 0"),
        (1, "boom\n", LOST, "boom"),
    ],
)
def test_classify(status: int, stderr: str, state: str, words: str) -> None:
    got_state, detail = classify("node1", status, stderr, "gputop relay --stdio")
    assert got_state == state
    assert words in detail and detail.startswith("node1: ")


def test_hosts_from_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02],cpu7")
    assert [t.host for t in remote_targets([], "")] == ["gpu01", "gpu02", "cpu7"]
    assert [t.host for t in remote_targets(["ssh://x", "tcp://h:1"], "n[1-2]")] == [
        "x",
        "n1",
        "n2",
    ]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        remote_targets([], "")


# ------------------------------------------------------------- fake-ssh nodes


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Fake ssh first on PATH; each host's runtime directory under the returned root."""
    root = Path(tempfile.mkdtemp(prefix="gtn-"))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_ROOT", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def probes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_probe(
    root: Path,
    probes: list[subprocess.Popen[bytes]],
    host: str,
    name: str,
    rank: int = 0,
    world: int = 2,
    wait_s: float = 0.0,
) -> None:
    node = root / host
    node.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "GPUTOP_RUNTIME_DIR": str(node)}
    proc = subprocess.Popen(
        [sys.executable, NODE_PROBE, host, name, "0.02", str(rank), str(world), str(wait_s)],
        env=env,
        stdout=subprocess.PIPE,
    )
    probes.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"


class Viewer:
    """The viewer's pipeline without a screen: a source's events into ViewerState."""

    def __init__(self, source: RemoteSource) -> None:
        self.source = source
        self.state = ViewerState("viewer-host")
        self.events: list[SourceEvent] = []
        source.start(self.events.extend)

    def until(self, check: object, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.tick()
            if check():  # type: ignore[operator]
                return True
            time.sleep(0.2)
        return False

    def tick(self) -> None:
        events, self.events[:] = list(self.events), []
        self.state.apply_all(events)
        self.state.tick(time.time())

    def link(self, host: str) -> str | None:
        return next((link.state for link in self.state.links if link.host == host), None)

    def live_runs(self, host: str) -> set[str]:
        return {
            r.name
            for r in self.state.runs
            if r.host == host and not r.is_placeholder and r.connection.state == "live"
        }


def test_two_nodes_every_run_and_a_node_going_away(
    nodes: Path, probes: list[subprocess.Popen[bytes]]
) -> None:
    start_probe(nodes, probes, "node1", "job", 0)
    start_probe(nodes, probes, "node1", "job", 1)
    start_probe(nodes, probes, "node2", "job", 0)
    source = RemoteSource([Target("node1"), Target("node2")], command=RELAY)
    viewer = Viewer(source)
    try:
        assert viewer.until(
            lambda: (
                len(viewer.live_runs("node1")) == 1  # one name, two ranks
                and len([r for r in viewer.state.runs if r.host == "node1"]) == 2
                and viewer.live_runs("node2") == {"job"}
                and {"node1", "node2"} <= set(viewer.state.hosts)  # both nodes' panels
            )
        ), viewer.state.runs
        assert viewer.link("node1") == LIVE and viewer.link("node2") == LIVE
        # node2 goes away: its ssh session drops and the host no longer answers.
        (nodes / "node2.down").touch()
        node2 = source._hosts[1].proc
        assert node2 is not None
        node2.terminate()
        assert viewer.until(lambda: viewer.link("node2") == UNREACHABLE)
        assert "Connection refused" in " ".join(e.text for e in viewer.state.errors)

        def node1_steps() -> int:
            return max(r.step_count for r in viewer.state.runs if r.host == "node1")

        steps_before = node1_steps()
        assert viewer.until(lambda: node1_steps() > steps_before + 20)
        assert viewer.live_runs("node1")  # the other node is watched on
        # ... and comes back: reconnected (backoff), history replayed.
        (nodes / "node2.down").unlink()
        assert viewer.until(lambda: viewer.link("node2") == LIVE, timeout_s=40)
        assert viewer.until(lambda: viewer.live_runs("node2") == {"job"})
    finally:
        source.stop()


def test_failures_are_shown_in_ssh_words(nodes: Path) -> None:
    source = RemoteSource(
        [Target("denied1", "alice"), Target("unreachable1"), Target("node3")],
        command="gputop-missing relay --stdio",
    )
    viewer = Viewer(source)
    try:
        assert viewer.until(
            lambda: (
                viewer.link("denied1") == AUTH_FAILED
                and viewer.link("unreachable1") == UNREACHABLE
                and viewer.link("node3") == NOT_INSTALLED
            )
        )
        errors = " | ".join(e.text for e in viewer.state.errors)
        assert "alice@denied1: Permission denied (publickey)." in errors
        assert "ssh: connect to host unreachable1 port 22: Connection refused" in errors
        assert "node3: gputop-missing not found there" in errors
        assert "--remote-command" in errors
        placeholders = {r.name: r.connection for r in viewer.state.runs if r.is_placeholder}
        assert placeholders["denied1"].state == "error"
        assert "Permission denied" in placeholders["denied1"].text
        assert "3 hosts" not in viewer.state.link_summary()  # three hosts: each named
        assert "denied1 auth failed" in viewer.state.link_summary()
    finally:
        source.stop()


def test_dropped_mid_stream_is_lost_then_reconnected(
    nodes: Path, probes: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SSH_DROP_AFTER", "3")
    start_probe(nodes, probes, "dropping1", "flaky")
    source = RemoteSource([Target("dropping1")], command=RELAY)
    viewer = Viewer(source)
    seen: list[str] = []
    try:

        def states() -> bool:
            link = viewer.link("dropping1")
            if link and (not seen or seen[-1] != link):
                seen.append(link)
            return seen.count(LIVE) >= 2

        assert viewer.until(states, timeout_s=40), seen
        assert LOST in seen
        errors = " ".join(e.text for e in viewer.state.errors)
        assert "Connection to dropping1 closed by remote host." in errors
        assert viewer.live_runs("dropping1") == {"flaky"}
    finally:
        source.stop()


def test_snapshot_hosts_cli(nodes: Path, probes: list[subprocess.Popen[bytes]]) -> None:
    """``gputop snapshot --hosts node[1-2]``: both nodes and every run, as JSON."""
    start_probe(nodes, probes, "node1", "alpha")
    start_probe(nodes, probes, "node2", "beta")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputop_dl",
            "snapshot",
            "--wait",
            "8",
            "--json",
            "--hosts",
            "node[1-2]",
            "--remote-command",
            RELAY,
        ],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert {(r["host"], r["name"]) for r in snap["runs"]} == {("node1", "alpha"), ("node2", "beta")}
    assert {(h["host"], h["state"]) for h in snap["hosts"]} == {("node1", LIVE), ("node2", LIVE)}


def test_a_job_across_two_nodes_names_its_straggler(
    nodes: Path, probes: list[subprocess.Popen[bytes]]
) -> None:
    """Issue 9, done when: from one terminal, ``--hosts`` on two nodes shows every rank of
    the job and names the one that holds the others back (rank 3 on node2 waits 60 ms a
    step for its data; the others do not wait)."""
    for host, rank in (("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)):
        start_probe(nodes, probes, host, "job", rank, world=4, wait_s=0.06 if rank == 3 else 0.0)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputop_dl",
            "snapshot",
            "--wait",
            "10",
            "--json",
            "--hosts",
            "node[1-2]",
            "--remote-command",
            RELAY,
        ],
        capture_output=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job"]
    assert job is not None and job["world_size"] == 4
    assert sorted((r["host"], r["rank"]) for r in job["ranks"]) == [
        ("node1", 0),
        ("node1", 1),
        ("node2", 2),
        ("node2", 3),
    ]
    assert job["straggler"] is not None, job["verdict"]
    assert (job["straggler"]["rank"], job["straggler"]["host"]) == (3, "node2"), job


def test_snapshot_says_how_to_fix_a_missing_gputop(nodes: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--wait", "3", "ssh://node9"],
        capture_output=True,
        timeout=60,
        env={**os.environ, "GPUTOP_REMOTE_COMMAND": "no-such-gputop relay --stdio"},
    )
    text = out.stdout.decode()
    assert out.returncode == 1, text
    assert "host node9: not installed: node9: no-such-gputop not found there" in text
    assert "pip install /path/to/gputop" in text


def test_endpoint_events_name_the_host(nodes: Path) -> None:
    got: list[SourceEvent] = []
    source = RemoteSource([Target("denied2", port=2200)])
    source.start(got.extend)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            isinstance(e, EndpointState) and e.state == AUTH_FAILED for e in got
        ):
            time.sleep(0.1)
    finally:
        source.stop()
    states = [e for e in got if isinstance(e, EndpointState)]
    assert states[0].state == "connecting" and states[0].endpoint == "ssh://denied2:2200"
    assert states[-1].name == "denied2"


# --------------------------------------------------------------- a real sshd

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


@pytest.fixture
def real_sshd(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int]]:
    """sshd as this user on a random port: a temporary host key, authorized key and
    config; a private ssh config that makes node1/node2 reach it (no prompts)."""
    if SSHD is None:
        pytest.skip("no sshd on this machine (apt-get install openssh-server to run this)")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755)  # what the sshd service makes at boot
    tmp = Path(tempfile.mkdtemp(prefix="gts-"))
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host")], check=True
    )
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "user")], check=True
    )
    shutil.copy(tmp / "user.pub", tmp / "authorized_keys")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host'}\n"
        f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
        f"PasswordAuthentication no\nPidFile {tmp / 'sshd.pid'}\nPermitUserEnvironment no\n"
        "AcceptEnv GPUTOP_* FAKE_SSH_*\n"
    )
    (tmp / "ssh_config").write_text(
        "Host node1 node2\n  HostName 127.0.0.1\n"
        f"  Port {port}\n  IdentityFile {tmp / 'user'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {tmp / 'known_hosts'}\n  StrictHostKeyChecking no\n"
        "  LogLevel ERROR\n  SendEnv GPUTOP_RUNTIME_DIR\n"
    )
    sshd = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(tmp / "sshd_config")], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if sshd.poll() is not None:
            assert sshd.stderr is not None
            pytest.skip(f"sshd would not start here: {sshd.stderr.read().decode()[-300:]}")
        time.sleep(0.1)
    try:
        yield tmp, port
    finally:
        sshd.kill()
        sshd.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_real_sshd(real_sshd: tuple[Path, int], probes: list[subprocess.Popen[bytes]]) -> None:
    """The same stream through a real sshd: real ssh, real authentication, real channel."""
    tmp, _port = real_sshd
    root = tmp / "nodes"
    root.mkdir(mode=0o700)
    start_probe(root, probes, "node1", "real")
    # The remote side is a fresh login: it gets the test's PYTHONPATH and runtime dir
    # through the command line, as a user's --remote-command would name a venv.
    command = (
        f"env PYTHONPATH={os.environ.get('PYTHONPATH', '')} "
        f"GPUTOP_RUNTIME_DIR={root / 'node1'} {RELAY}"
    )
    ssh = f"ssh -F {tmp / 'ssh_config'}"
    source = RemoteSource([Target("node1"), Target("node2")], command=command, ssh=ssh)
    viewer = Viewer(source)
    try:
        # node2 reaches the same sshd and node directory: the run may arrive through
        # either link first, so wait for both.
        assert viewer.until(
            lambda: (
                viewer.live_runs("node1") == {"real"}
                and viewer.link("node1") == LIVE
                and viewer.link("node2") == LIVE
            )
        ), viewer.state.errors
    finally:
        source.stop()
    bad = RemoteSource([Target("node1", "nobody-here")], command=command, ssh=ssh)
    viewer = Viewer(bad)
    try:
        assert viewer.until(lambda: viewer.link("node1") == AUTH_FAILED)
        assert "Permission denied" in " ".join(e.text for e in viewer.state.errors)
    finally:
        bad.stop()


@pytest.mark.parametrize(
    ("endpoints", "summary"),
    [
        (["ssh://node1"], "ssh: node1 live"),
        (["ssh://node1", "ssh://node2:2222"], "ssh: node1 live, node2 live"),
        # One host, two ports (two containers behind one address): the addresses.
        (["ssh://node1:22", "ssh://node1:2222"], "ssh: node1:22 live, node1:2222 live"),
        (["ssh://a@node1", "ssh://b@node1"], "ssh: a@node1 live, b@node1 live"),
    ],
)
def test_the_link_summary_tells_apart_two_links_to_one_host(
    endpoints: list[str], summary: str
) -> None:
    state = ViewerState("viewer")
    for endpoint in endpoints:
        target = parse_ssh_url(endpoint)
        state.apply(EndpointState(target.endpoint, "live", "", target.host))
    assert state.link_summary() == summary


SLOW_HANDSHAKE = """#!/bin/sh
# An ssh whose handshake takes 0.4 s and then fails: notes how many are in flight.
touch "$DIR/$$"
ls "$DIR" | grep -c . >> "$DIR.log"
sleep 0.4
rm -f "$DIR/$$"
echo "ssh: connect to host node port 22: Connection timed out" >&2
exit 255
"""


def test_many_hosts_handshake_a_few_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--hosts 'zz[1-40]' starts at most 10 ssh handshakes at once (a jump
    host's sshd drops connections past MaxStartups' 10), and in time every host's."""
    ssh = tmp_path / "ssh"
    ssh.write_text(SLOW_HANDSHAKE)
    ssh.chmod(0o755)
    flight = tmp_path / "flight"
    flight.mkdir()
    monkeypatch.setenv("DIR", str(flight))
    source = RemoteSource([Target(f"zz{i}") for i in range(40)], command=RELAY, ssh=str(ssh))
    viewer = Viewer(source)
    log = Path(f"{flight}.log")
    try:
        assert viewer.until(
            lambda: sum(1 for link in viewer.state.links if link.state == UNREACHABLE) == 40
        ), viewer.state.link_summary()
    finally:
        source.stop()
    in_flight = [int(line) for line in log.read_text().split()]
    assert len(in_flight) >= 40
    assert max(in_flight) <= 10, in_flight  # sshd MaxStartups: drops past 10


BLACKHOLE = """#!/bin/sh
# An ssh to a host that drops packets: nothing, for a long time.
echo start >> "$DIR.log"
exec sleep 30
"""


def test_hosts_that_never_answer_do_not_hold_the_others_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten dead hosts took every handshake slot for the kernel's connect timeout
    (~2 min): a slot is given back after HANDSHAKE_HOLD_S whatever ssh does."""
    import gputop_dl.tui.remote as remote

    monkeypatch.setattr(remote, "HANDSHAKE_HOLD_S", 0.5)
    ssh = tmp_path / "ssh"
    ssh.write_text(BLACKHOLE)
    ssh.chmod(0o755)
    flight = tmp_path / "flight"
    monkeypatch.setenv("DIR", str(flight))
    source = RemoteSource([Target(f"dead{i}") for i in range(14)], command=RELAY, ssh=str(ssh))
    source.start(lambda events: None)
    log = Path(f"{flight}.log")
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if log.exists() and len(log.read_text().split()) == 14:
                break
            time.sleep(0.1)
        assert log.exists() and len(log.read_text().split()) == 14  # all 14 tried
    finally:
        source.stop()
    assert "ConnectTimeout=10" in remote.ssh_command(Target("h"), "x")
