"""The in-process probe: what it measures, what it publishes, and that it never harms
training. Real DataLoaders, real ZeroMQ sockets on loopback/ipc, a real model."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from gputop_dl import probe
from gputop_dl.probe import core, discovery
from gputop_dl.probe.loader import counting, infer_samples, sample_counter
from gputop_dl.probe.messages import Hello, Loop, Steps
from gputop_dl.probe.protocol import decode
from gputop_dl.probe.transport import Subscriber
from tests.wire_reader import WireReader

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_probe_left_behind")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SleepyDataset(Dataset[Any]):
    """Each item costs ``delay`` seconds of wall time in the worker."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        return torch.full((3, 8, 8), float(i)), i % 10


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (np.zeros((32, 3)), 32),
        ((np.zeros((7, 2)), np.zeros(7)), 7),
        ([np.zeros((5,))], 5),
        ({"image": np.zeros((9, 3)), "label": np.zeros(9)}, 9),
        ([[np.zeros((4, 1))]], 4),
        (np.float32(1.0), None),  # 0-d array: no leading dimension
        ([1, 2, 3], None),
        ([], None),
        ({}, None),
        ("text", None),
        (None, None),
    ],
)
def test_samples_are_the_leading_dimension_of_the_first_array(
    batch: Any, expected: int | None
) -> None:
    assert infer_samples(batch) == expected


class _Shaped:
    """A batch type whose ``shape`` is per instance (None on some)."""

    def __init__(self, shape: tuple[int, ...] | None) -> None:
        self.shape = shape


# Each batch after the first meets what the counter learned from the one before:
# same types with other contents, other types, empty containers, 0-d arrays.
BATCHES: list[Any] = [
    (np.zeros((7, 2)), np.zeros(7)),
    (np.zeros((3, 2)), np.zeros(3)),  # the last, smaller batch
    np.zeros((8, 2)),  # an array as the batch: len() where one was learned
    (np.float32(1.0), np.zeros(3)),  # same container, other element type
    (np.zeros(()), np.zeros(3)),  # a 0-d array where an array was
    ([1, 2, 3], np.zeros(5)),  # a list where an array was: no count, not len() 3
    (),
    [np.zeros((5,))],
    [[np.zeros((4, 1))]],  # two levels deep: never learned, always walked
    [[np.zeros((6, 1))]],
    {"image": np.zeros((9, 3)), "label": np.zeros(9)},
    {"label": [1, 2], "image": np.zeros((9, 3))},  # the first value is no array now
    {},
    torch.zeros(11, 2),
    torch.zeros(()),
    torch.zeros(12, 2),
    _Shaped((13, 1)),
    _Shaped(None),
    _Shaped(()),
    [torch.zeros(2), np.zeros(3)],
    [np.zeros(4), torch.zeros(2)],
    "text",
    None,
]


def test_the_per_loader_counter_answers_as_infer_samples_whatever_the_batches_do() -> None:
    count = sample_counter()
    for batch in BATCHES + BATCHES[::-1]:
        assert count(batch) == infer_samples(batch), batch


class _Flaky:
    """A batch whose ``shape`` raises once its type is learned: the fast way fails
    half-way, after the type check."""

    reads = 0

    @property
    def shape(self) -> tuple[int, ...]:
        _Flaky.reads += 1
        if _Flaky.reads > 2:
            raise RuntimeError("shape went away")
        return (4, 1)


def test_counting_passes_each_batch_on_and_appends_exactly_one_count_for_it() -> None:
    # watch's C-timed loop maps counting() over the steps: a batch that breaks the
    # learned way half-way, or a count that cannot be taken, must still give one count
    # (else every later step is paired with another step's count) and never an error.
    _Flaky.reads = 0  # a rerun in the same process starts from the same state
    same = np.zeros((3, 2))
    data: list[Any] = [
        (np.zeros((7, 1)),),
        (np.zeros(()),),  # learned tuple -> ndarray, but 0-d: len() raises
        (np.ma.zeros((4, 1)),),  # an ndarray subclass where an ndarray was learned
        _Flaky(),
        _Flaky(),  # shape raises after the type check passed
        _Flaky(),
        same,
        same,
        None,
        {"x": torch.zeros(5, 2)},
        {"x": [1, 2]},  # learned dict -> tensor; the first value is a list now
        _Shaped(None),
        _Shaped(()),
        [],
    ]
    counts: list[int | None] = []
    counted = counting(counts.append)
    passed = [counted(batch) for batch in data]
    assert all(a is b for a, b in zip(passed, data, strict=True))
    assert counts == [7, None, 4, 4, None, None, 3, 3, None, 5, None, None, None, None]
    steady = [(c, b) for c, b in zip(counts, data, strict=True) if not isinstance(b, _Flaky)]
    assert all(c == infer_samples(b) for c, b in steady)


def test_step_samples_inside_a_watched_loop_overrides_the_count() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    p = probe.Probe(name="override", listen=endpoint, system_interval_s=0)
    reader = WireReader(endpoint)
    time.sleep(0.3)
    for i, _ in enumerate(p.watch([np.zeros((8, 1))] * 10)):
        if i % 2:
            p.step(samples=3)  # e.g. packed sequences: the user knows better
    p.close()
    reader.pump(0.8)
    assert [r["samples"] for r in reader.steps()] == [8, 3] * 5


@pytest.mark.parametrize(
    "samples",
    [
        10**30,  # past msgpack's 64 bits: every steps message holding it failed to encode
        2**63,  # encodable, but past the wire's Count: viewers refused whole messages
        lambda _batch: 2**64,
    ],
)
def test_a_count_the_wire_cannot_carry_is_a_step_without_a_count(samples: Any) -> None:
    p = tcp_probe("huge", system_interval_s=0)
    reader = attached(p)
    for i, _ in enumerate(p.watch(range(10), samples=samples)):
        if i == 9:
            p.step(samples=2**63)  # the same through probe.step
    p.close()
    reader.pump(0.8)
    assert [r["index"] for r in reader.steps()] == list(range(10))  # none lost
    assert {r["samples"] for r in reader.steps()} == {None}


def test_what_a_user_hands_the_probe_past_the_wire_limits_is_clipped_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run name or phase name over 4,096 characters, over 64 phases in a step, a phase
    named by a number, a launcher's rank past 64 bits, a loader's exception type with a
    long name: each used to make every hello, steps or loop message fail the viewer's
    decoder (the run unnamed, its steps lost). Read here with the viewer's own decoder,
    which enforces the limits."""
    monkeypatch.setenv("RANK", str(10**20))
    p = tcp_probe("n" * 5000, system_interval_s=0)
    sub = Subscriber()
    sub.connect(p.endpoint or "")
    long_error = type("E" * 5000, (Exception,), {})

    def failing() -> Any:
        yield 1
        raise long_error

    frames: list[list[bytes]] = []
    try:
        deadline = time.monotonic() + 2.0
        while not frames and time.monotonic() < deadline:
            frames += sub.receive(0.1)
        for _ in p.watch(range(5)):
            with p.phase("p" * 5000):
                pass
            for k in range(100):
                with p.phase(f"part{k}"):
                    pass
            with p.phase(7):  # type: ignore[arg-type]
                pass
        with pytest.raises(long_error):
            for _ in p.watch(failing()):
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            frames += sub.receive(0.1)
    finally:
        p.close()
        sub.close()
    messages = [decode(f) for f in frames]  # MalformedMessage here: something refused
    hellos = [m for m in messages if isinstance(m, Hello)]
    assert hellos and {h.name for h in hellos} == {"n" * 4096}
    assert {h.rank for h in hellos} == {None}
    assert hellos[-1].loop_exit == ("exception:" + "E" * 5000)[:4096]
    exits = [m.how for m in messages if isinstance(m, Loop) and m.state == "outside"]
    assert exits[-1] == hellos[-1].loop_exit
    records = [r for m in messages if isinstance(m, Steps) for r in m.records]
    assert [r.index for r in records] == [0, 1, 2, 3, 4, 5]
    for r in records[:5]:
        names = [name for name, _ in r.phases]
        assert len(names) == 64
        assert "(other phases)" in names
        assert len(set(names)) == 64
        assert sum(seconds for _, seconds in r.phases) <= r.period_s + 64e-6  # rounding


def test_import_probe_needs_neither_torch_nor_textual(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None      # any import of these now fails
        sys.modules["textual"] = None
        from gputop_dl import probe
        p = probe.Probe(name="bare")
        for _ in p.watch(range(20)):
            pass
        p.close()
        assert "textual" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok", p.endpoint)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ipc://")


def test_dataloader_wait_tracks_injected_sleep_and_a_doc_only_subscriber_decodes_it() -> None:
    # Two workers each need 4 x 25 ms per batch; the step computes for 10 ms.
    # Steady state: a batch is ready every 50 ms, so the loop waits ~40 ms per step.
    batch, delay, compute = 4, 0.025, 0.010
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    p = probe.Probe(name="sleepy", listen=endpoint, system_interval_s=0)
    reader = WireReader(endpoint)
    time.sleep(0.3)  # let the subscription reach the publisher
    loader = DataLoader(SleepyDataset(160, delay), batch_size=batch, num_workers=2)
    # The loop's own clock, independent of the probe: when each body began and ended.
    began: list[float] = []
    ended: list[float] = []
    for _ in p.watch(loader):
        began.append(time.perf_counter())
        time.sleep(compute)
        ended.append(time.perf_counter())
    p.close()
    reader.pump(1.0)
    reader.close()

    records = reader.steps()
    assert [r["index"] for r in records] == list(range(len(loader)))
    # Skip worker start-up. Means, not medians: the two workers finish in phase, so
    # batches arrive in pairs. The expectation is what the loop itself saw, not the
    # nominal 50 ms: on a loaded CI host the workers' sleeps and collation run late.
    # Step k runs from asking for batch k (the end of body k-1) to asking for k+1.
    steady = range(5, len(loader))
    wait = statistics.mean(records[k]["wait_s"] for k in steady)
    period = statistics.mean(records[k]["period_s"] for k in steady)
    seen_wait = statistics.mean(began[k] - ended[k - 1] for k in steady)
    seen_period = statistics.mean(ended[k] - ended[k - 1] for k in steady)
    assert wait == pytest.approx(seen_wait, rel=0.05, abs=0.001)
    assert period == pytest.approx(seen_period, rel=0.05, abs=0.001)
    # And the loop was data-bound as built: ~40 ms of every ~50 ms spent waiting.
    assert wait > 0.6 * period and period >= 0.9 * batch * delay / 2
    assert {r["samples"] for r in records} == {batch}

    hello = reader.of_kind("hello")[-1]
    assert hello["name"] == "sleepy" and hello["pid"] == os.getpid()
    assert hello["loader"]["num_workers"] == 2 and hello["loader"]["batch_size"] == batch
    assert len(hello["loader"]["worker_pids"]) == 2
    assert hello["timing"] == "host" and "CUDA" in hello["timing_note"]
    bye = reader.of_kind("bye")
    assert bye and bye[-1]["steps"] == len(loader)
    last = reader.of_kind("steps")[-1]
    assert last["dropped"] == 0 and last["sent"] > 0


class ForkProbingDataset(SleepyDataset):
    """Calls the probe from inside DataLoader workers: it must do nothing there."""

    def __getitem__(self, i: int) -> Any:
        probe.step(samples=1)
        list(probe.watch([1, 2]))
        return super().__getitem__(i)


def test_forked_workers_never_touch_the_parents_socket() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    p = probe.Probe(name="fork", listen=endpoint, system_interval_s=0)
    probe._default = p  # the workers' probe.step()/watch() resolve to this forked copy
    try:
        reader = WireReader(endpoint)
        time.sleep(0.3)
        loader = DataLoader(
            ForkProbingDataset(40, 0.001),
            batch_size=4,
            num_workers=2,
            multiprocessing_context="fork",
        )
        total = sum(int(y.sum()) for _, y in p.watch(loader))
        p.close()
        reader.pump(1.0)
        reader.close()
    finally:
        probe._default = None
    assert total == sum(i % 10 for i in range(40))
    ids = {m["body"]["source_id"] for m in reader.messages}
    assert ids == {p.source_id}
    assert [r["index"] for r in reader.steps()] == list(range(10))


TRAIN = textwrap.dedent(
    """
    import json, sys, torch, probe
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    xs, ys = torch.randn(512, 16), torch.randint(0, 4, (512,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = DataLoader(TensorDataset(xs, ys), batch_size=16, num_workers=0)
    use_probe = sys.argv[1] == "probe"
    import time
    for epoch in range(int(sys.argv[2])):
        for x, y in (probe.watch(batches) if use_probe else batches):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(float(sys.argv[3]))
    print(json.dumps({"loss": float(loss), "w": float(model[0].weight.sum())}))
    """
)


def run_training(
    mode: str, epochs: int = 3, sleep: float = 0.0, env: dict[str, str] | None = None
) -> tuple[dict[str, float], str]:
    out = subprocess.run(
        [sys.executable, "-c", TRAIN, mode, str(epochs), str(sleep)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    import json

    return json.loads(out.stdout), out.stderr


@pytest.fixture(scope="module")
def reference_result() -> dict[str, float]:
    return run_training("bare")[0]


def test_no_subscriber_ever_changes_nothing(reference_result: dict[str, float]) -> None:
    result, stderr = run_training("probe")
    assert result == reference_result
    assert "Traceback" not in stderr


def test_address_in_use_warns_once_and_training_is_unchanged(
    reference_result: dict[str, float],
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result, stderr = run_training("probe", env={"GPUTOP_LISTEN": f"tcp://127.0.0.1:{port}"})
    assert result == reference_result
    assert stderr.count("gputop probe disabled") == 1
    assert "Address already in use" in stderr
    assert "Traceback" not in stderr
    assert "listening on" not in stderr  # it is not (it said so, then that it could not)


def test_unwritable_runtime_dir_degrades_without_raising(
    reference_result: dict[str, float], tmp_path: Path
) -> None:
    foreign = tmp_path / "open"
    foreign.mkdir(mode=0o777)
    foreign.chmod(0o777)  # open to others: the probe must refuse to put a socket there
    result, stderr = run_training("probe", env={"GPUTOP_RUNTIME_DIR": str(foreign)})
    assert result == reference_result
    assert "open to other users" in stderr


def test_killed_subscriber_changes_nothing(
    reference_result: dict[str, float], tmp_path: Path
) -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    sub = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from tests.wire_reader import WireReader; WireReader({endpoint!r}).pump(60)",
        ],
        cwd=Path(__file__).parent.parent,
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAIN, "probe", "3", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GPUTOP_LISTEN": endpoint},
    )
    time.sleep(2.0)
    sub.send_signal(signal.SIGKILL)
    sub.wait()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    import json

    assert json.loads(stdout) == run_training("bare", 3, 0.01)[0]


def test_step_and_phase_without_a_loader() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    p = probe.Probe(name="manual", listen=endpoint, system_interval_s=0)
    reader = WireReader(endpoint)
    time.sleep(0.3)
    p.step()  # first mark starts the clock
    for _ in range(5):
        with p.phase("forward"):
            time.sleep(0.02)
        with p.phase("h2d"):
            time.sleep(0.005)
        p.step(samples=64)
    p.close()
    reader.pump(0.8)
    records = reader.steps()
    assert len(records) == 5
    for r in records:
        assert r["wait_s"] is None  # not measured, not made up
        assert r["samples"] == 64
        phases = dict(r["phases"])
        assert phases["forward"] == pytest.approx(0.02, abs=0.01)
        assert phases["h2d"] == pytest.approx(0.005, abs=0.005)
        assert r["period_s"] >= phases["forward"] + phases["h2d"]


def test_bad_sample_counter_is_ignored_not_raised() -> None:
    p = probe.Probe(name="odd", listen=f"tcp://127.0.0.1:{free_port()}", system_interval_s=0)

    def explode(_: Any) -> int:
        raise RuntimeError("user bug")

    assert list(p.watch([1, 2, 3], samples=explode)) == [1, 2, 3]
    assert list(p.watch(["a"], samples=lambda b: "many")) == ["a"]  # type: ignore[arg-type,return-value]
    p.close()


class _ShapeRaises:
    """A batch type with a bug: its ``shape`` raises something no counter expects."""

    @property
    def shape(self) -> tuple[int, ...]:
        raise RuntimeError("broken batch type")


def test_a_batch_that_cannot_be_counted_is_a_step_without_a_count() -> None:
    p = tcp_probe("uncountable", system_interval_s=0)
    reader = attached(p)
    batches: list[Any] = [_ShapeRaises(), [_ShapeRaises()], np.zeros((4, 1)), _ShapeRaises()]
    assert list(p.watch(batches)) == batches  # the training goes on
    p.close()
    reader.pump(0.8)
    assert [r["samples"] for r in reader.steps()] == [None, None, 4, None]


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTOP_DISABLE", "1")
    p = probe.Probe()
    assert not p.enabled and p.endpoint is None
    assert list(p.watch(range(3))) == [0, 1, 2]


def test_discovery_record_is_private_and_removed_at_close(runtime_dir: Path) -> None:
    p = probe.Probe(name="found", system_interval_s=0)
    records = discovery.discover()
    assert [(r.pid, r.name, r.endpoint) for r in records] == [(os.getpid(), "found", p.endpoint)]
    assert p.endpoint == f"ipc://{runtime_dir}/{os.getpid()}.sock"
    assert (runtime_dir / f"{os.getpid()}.json").stat().st_mode & 0o777 == 0o600
    assert runtime_dir.stat().st_mode & 0o777 == 0o700
    p.close()
    assert discovery.discover() == []
    assert list(runtime_dir.iterdir()) == []


def test_stale_records_of_dead_processes_are_removed(runtime_dir: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    discovery.register(
        discovery.Record(f"ipc://{runtime_dir}/{pid}.sock", pid, "h", "gone", "probe", 1.0)
    )
    assert discovery.discover() == []
    assert not (runtime_dir / f"{pid}.json").exists()


def test_failure_inside_probe_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.PUB)
    squatter.bind(f"tcp://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, logger="gputop.probe"):
        second = probe.Probe(listen=f"tcp://127.0.0.1:{port}", system_interval_s=0)
        assert list(second.watch(range(3))) == [0, 1, 2]
    squatter.close(0)
    ctx.term()
    assert not second.enabled and "Address already in use" in (second.error or "")
    assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1


def test_failing_device_timer_falls_back_to_host_timing() -> None:
    class BrokenTimer:
        def record(self) -> Any:
            raise RuntimeError("CUDA error: device-side assert triggered")

    p = probe.Probe(name="cuda", listen=f"tcp://127.0.0.1:{free_port()}", system_interval_s=0)
    p._timing_checks = 3  # keep the broken timer: detection would find no CUDA here
    p._timer = BrokenTimer()  # type: ignore[assignment]
    assert list(p.watch(range(5))) == [0, 1, 2, 3, 4]
    hello = p.hello()
    p.close()
    assert p._timer is None and hello.timing == "host"
    assert hello.timing_note is not None and "CUDA events failed" in hello.timing_note


# ---------------------------------------------------------------- protocol 2 facts
def tcp_probe(name: str, **kwargs: Any) -> probe.Probe:
    return probe.Probe(name=name, listen=f"tcp://127.0.0.1:{free_port()}", **kwargs)


def attached(p: probe.Probe) -> WireReader:
    """A doc-only reader whose subscription the probe has seen (it answers with a hello)."""
    reader = WireReader(p.endpoint or "")
    reader.pump(2.0, until="hello")
    return reader


def test_a_subscriber_that_attaches_just_before_close_gets_every_step() -> None:
    """A viewer attached after the steps, before the publisher's first drain, the probe
    closed at once (a short run's end): its replay was due and the last wake-up skipped
    it, sending only that wake-up's steps live. The earlier steps were lost."""
    p = tcp_probe("attach-at-end", system_interval_s=0)
    for _ in p.watch(range(38)):
        pass
    reader = attached(p)  # the publisher drains the 38 steps as it admits it
    for _ in p.watch(range(40)):
        pass
    p.close()
    reader.pump(1.0, until="bye")
    reader.close()
    assert sorted(r["index"] for r in reader.steps()) == list(range(78))


def test_a_late_subscriber_gets_the_history_and_a_hello_within_a_second() -> None:
    p = tcp_probe("late", system_interval_s=0)
    for _ in p.watch(range(500)):
        time.sleep(0.0002)
    time.sleep(0.5)  # published to nobody: PUB/SUB alone would have lost all of it
    reader = WireReader(p.endpoint or "")
    deadline = time.monotonic() + 1.0
    seen: set[int] = set()
    while time.monotonic() < deadline and len(seen) < 500:
        reader.pump(0.05)
        seen = {r["index"] for r in reader.steps()}
    kinds = [m["kind"] for m in reader.messages]
    p.close()
    reader.close()
    assert seen == set(range(500))
    assert "hello" in kinds and kinds.index("hello") < kinds.index("steps")
    hello = reader.of_kind("hello")[0]
    assert hello["name"] == "late" and hello["step_count"] == 500


def test_a_late_subscriber_gets_the_replay_before_any_newer_live_step() -> None:
    """The viewer takes only steps newer than the last it holds (a replay repeats
    indices), so a new subscriber must get the history before any live step: when the
    wake-up that saw the subscription sent its new steps first, the viewer dropped the
    replayed past, and `gputop snapshot --wait 2` said "Warming up: 3 of 5 steps" of a
    run of 25 (two attaches in four, at 0.7 s steps; nearly every one of a fast run)."""
    p = tcp_probe("order", system_interval_s=0)
    stop = threading.Event()

    def train() -> None:
        for _ in p.watch(itertools.count()):
            time.sleep(0.004)
            if stop.is_set():
                break

    trainer = threading.Thread(target=train)
    trainer.start()
    firsts = []
    try:
        time.sleep(1.0)
        for _ in range(6):
            reader = WireReader(p.endpoint or "")
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not reader.steps():
                reader.pump(0.05, until="steps")
            steps = reader.of_kind("steps")
            reader.close()
            assert steps, "no steps within 2 s of attaching"
            firsts.append(min(r["index"] for r in steps[0]["records"]))
            time.sleep(0.3)
    finally:
        stop.set()
        trainer.join()
        p.close()
    # A subscriber libzmq admits between the probe's last look and its send still gets
    # one live message first: a window of microseconds, unless the publisher is
    # preempted there (once in six attaches on a loaded CI host, before the steps were
    # encoded ahead of that look). Before the fix every attach saw a live step first.
    assert firsts.count(0) >= 5, f"first step index each attach saw first: {firsts}"


def test_a_probe_nobody_watches_samples_the_node_slower_until_a_viewer_attaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each node sample costs the training process ~2 ms of CPU, and with nobody connected
    it only fills the history: the probe samples every UNWATCHED_SAMPLE_S then. A viewer
    attaching gets a sample of now within a second and the probe's own pace after; when
    the last one leaves, the slow pace is back."""
    monkeypatch.setattr(core, "UNWATCHED_SAMPLE_S", 1.0)
    p = tcp_probe("pace", system_interval_s=0.1)

    def sample_times(reader: WireReader, seconds: float) -> list[float]:
        reader.pump(seconds)
        return sorted(m["sample"]["time"] for m in reader.of_kind("system"))

    time.sleep(3.3)  # nobody connected: ~3 samples, not ~33
    attached_at = time.time()
    reader = WireReader(p.endpoint or "")
    times = sample_times(reader, 2.0)
    reader.close()
    left_at = time.time()
    replayed = [t for t in times if t < attached_at]
    live = [t for t in times if t >= attached_at]
    assert 2 <= len(replayed) <= 4, replayed
    assert live and live[0] - attached_at < 1.0
    assert len(live) >= 10  # the probe's 0.1 s pace while watched

    time.sleep(3.3)  # the last viewer gone: the slow pace again
    reader = WireReader(p.endpoint or "")
    times = sample_times(reader, 1.0)
    reader.close()
    p.close()
    unwatched = [t for t in times if left_at + 0.5 < t < left_at + 3.3]
    assert 1 <= len(unwatched) <= 4, unwatched


def test_a_full_history_reaches_a_late_subscriber_whole() -> None:
    """The biggest replay a probe sends: HISTORY_SYSTEMS node samples and HISTORY_MAX_STEPS
    steps (ten steps messages), in one burst from the publisher thread. None of it may be
    dropped by the socket's per-subscriber queue, and the steps least of all: they are what
    the late viewer's graph and verdict are made of (with a queue of 64 messages, the
    samples went first and most runs lost part of the steps)."""
    from gputop_dl.probe.core import HISTORY_MAX_STEPS, HISTORY_SYSTEMS

    p = tcp_probe("full", system_interval_s=0.05)
    total = HISTORY_MAX_STEPS + 5_000
    for _ in p.watch(range(total)):
        pass
    watcher = attached(p)  # counts the node samples the probe keeps, as they go out
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline and len(watcher.of_kind("system")) <= HISTORY_SYSTEMS:
        watcher.pump(0.2)
    watcher.close()
    reader = WireReader(p.endpoint or "")
    expected = set(range(total - HISTORY_MAX_STEPS, total))
    seen: set[int] = set()
    samples = 0
    deadline = time.monotonic() + 5.0
    # Until the whole replay is in: its node samples come after the steps, so stopping at
    # the last step could leave them unread (a race of the test, not a loss).
    while time.monotonic() < deadline and not (expected <= seen and samples >= HISTORY_SYSTEMS):
        reader.pump(0.1)
        seen = {r["index"] for r in reader.steps()}
        samples = len(reader.of_kind("system"))
    p.close()
    reader.close()
    missing = len(expected - seen)
    assert missing == 0, f"{missing} of the history's {len(expected)} steps missing"
    assert samples >= HISTORY_SYSTEMS


STALLED_SUBSCRIBER = """
import sys, time, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.SUB)
sock.setsockopt(zmq.RCVHWM, 1)
sock.setsockopt(zmq.RCVBUF, 4096)
sock.setsockopt(zmq.SUBSCRIBE, b"")
sock.connect(sys.argv[1])
print("up", flush=True)
time.sleep(120)
"""


def test_stalled_subscribers_hold_a_bounded_share_of_the_training_process() -> None:
    """Subscribers stopped (SIGSTOP: a suspended ssh, a frozen laptop) while replays of a
    full history keep going out to them: each holds at most its queue (core.SEND_QUEUE
    messages, a replay's worth) in the training process, which keeps its memory and never blocks."""
    p = tcp_probe("stalled", system_interval_s=0.05)
    for _ in p.watch(range(25_000)):
        pass
    time.sleep(1.0)

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def subscriber() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", STALLED_SUBSCRIBER, p.endpoint or ""],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        return proc

    stalled = [subscriber() for _ in range(8)]
    try:
        time.sleep(1.0)
        for proc in stalled:
            proc.send_signal(signal.SIGSTOP)
        before = rss_mib()
        for _ in range(24):  # each attach replays the history to everyone, the stalled too
            again = subscriber()
            time.sleep(0.6)
            again.kill()
            again.wait()
        grown = rss_mib() - before
        started = time.monotonic()
        steps = sum(1 for _ in p.watch(range(1_000)))  # sends never block the training
        assert steps == 1_000 and time.monotonic() - started < 10.0  # a hang, not a speed
    finally:
        for proc in stalled:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
        p.close()
    # Without the bound the queues take ~9 MiB here (the kernel's socket buffers hold the
    # first few MB of each stalled peer); with it, ~1.7.
    assert grown < 5, f"the probe's process grew {grown:.1f} MiB"


def test_history_replay_repeats_steps_with_their_own_indices() -> None:
    p = tcp_probe("twice", system_interval_s=0)
    first = attached(p)
    for _ in p.watch(range(50)):
        pass
    # The steps reach the first subscriber live before the second attaches (steps not yet
    # sent then wait for the replay, which gives them to both once: see
    # test_a_late_subscriber_gets_the_replay_before_any_newer_live_step).
    deadline = time.monotonic() + 5.0
    while len({r["index"] for r in first.steps()}) < 50 and time.monotonic() < deadline:
        first.pump(0.1)
    second = attached(p)  # its subscription replays the history to both
    first.pump(1.0)
    second.pump(0.3)
    p.close()
    indices = [r["index"] for r in first.steps()]
    first.close()
    second.close()
    assert sorted(set(indices)) == list(range(50)) and len(indices) >= 100  # duplicates
    assert {r["index"] for r in second.steps()} == set(range(50))


def test_the_first_mark_of_a_step_loop_says_the_loop_began() -> None:
    """A script timed by probe.step() alone read "not-started" for good: a viewer said
    "Setting up: the training loop has not started yet" through its first recorded step,
    and had no loop to call a first step that never ends a hang in."""
    p = tcp_probe("marked", system_interval_s=0)
    reader = attached(p)
    assert reader.of_kind("hello")[-1]["loop"] == "not-started"
    p.step()  # the end of step 0, unrecorded: the loop has begun
    reader.pump(1.0, until="loop")
    loops = reader.of_kind("loop")
    assert [(m["state"], m["how"], m["step_index"]) for m in loops] == [("in-loop", None, 0)]
    for _ in range(3):
        p.step()
    reader.pump(1.0)
    p.close()
    reader.pump(0.3)
    reader.close()
    assert len(reader.of_kind("loop")) == 1  # once, at the first mark
    assert [r["index"] for r in reader.steps()] == [0, 1, 2]
    assert reader.of_kind("hello")[-1]["loop"] == "in-loop"


@pytest.mark.parametrize(
    ("body", "how"),
    [
        ("for _ in p.watch(range(5)):\n    pass", "exhausted"),
        ("for i in p.watch(range(5)):\n    if i == 2:\n        break", "break"),
        (
            "def items():\n    yield 0\n    yield 1\n    raise ValueError('bad file')\n"
            "try:\n    for i in p.watch(items()):\n        pass\nexcept ValueError:\n    pass",
            "exception:ValueError",
        ),
    ],
    ids=["exhausted", "break", "exception"],
)
def test_loop_entered_and_left_are_published_with_how(body: str, how: str) -> None:
    p = tcp_probe("loop", system_interval_s=0)
    reader = attached(p)
    assert reader.of_kind("hello")[-1]["loop"] == "not-started"
    exec(body, {"p": p})
    reader.pump(1.0)
    p.close()
    reader.pump(0.3)
    reader.close()
    loops = reader.of_kind("loop")
    assert [(m["state"], m["how"]) for m in loops] == [("in-loop", None), ("outside", how)]
    assert loops[1]["step_index"] == (5 if how == "exhausted" else 2)
    hello = reader.of_kind("hello")[-1]
    assert (hello["loop"], hello["loop_exit"]) == ("outside", how)
    assert hello["loop_since"] == pytest.approx(loops[1]["time"])


def test_a_loop_timed_with_step_marks_its_evaluation_outside() -> None:
    """probe.step has no loop to watch leave: probe.outside says it, to the wire (and so
    to every viewer: "outside the training loop", not a critical stall)."""
    p = tcp_probe("stepped", system_interval_s=0)
    reader = attached(p)
    for _ in range(5):
        p.step(8)
    with p.outside("evaluation"):
        reader.pump(0.6)  # the publisher sends the change while it lasts
        with p.outside("checkpoint"):  # nested: the outer one goes on after it
            pass
    for _ in range(3):
        p.step(8)
    reader.pump(1.0)
    p.close()
    reader.pump(0.3)
    reader.close()
    loops = [(m["state"], m["how"]) for m in reader.of_kind("loop")]
    # The first mark began the loop (test_the_first_mark_of_a_step_loop_says_the_loop_began)
    assert loops[:2] == [("in-loop", None), ("outside", "marked:evaluation")], loops
    assert ("outside", "marked:checkpoint") in loops
    assert loops[-1] == ("in-loop", None), loops
    records = reader.steps()
    assert {r["index"] for r in records} == set(range(7))  # 8 marks: 7 steps
    # The evaluation (0.6 s) is in no step: the next one starts where it ended.
    assert max(r["period_s"] for r in records) < 0.3, records


@pytest.mark.parametrize("at", [1, 40], ids=["python-timed-step", "c-timed-step"])
def test_an_evaluation_inside_a_watched_step_is_in_no_step(at: int) -> None:
    """``with probe.outside()`` inside a watched loop's step (an evaluation every N
    batches): its time leaves that step's period, as between probe.step steps. Counted
    as the step's own work, a 10 s evaluation made a data-bound run read compute-bound
    and its average a quarter of what it was (a new user's audit, 2026-12-07)."""
    p = tcp_probe("eval-inside", system_interval_s=0)
    reader = attached(p)
    for i, _ in enumerate(p.watch(range(60))):
        time.sleep(0.002)  # the step's own work
        if i == at:
            with p.outside("evaluation"):
                time.sleep(0.4)
    reader.pump(1.0)
    p.close()
    reader.pump(0.3)
    reader.close()
    records = {r["index"]: r for r in reader.steps()}
    assert set(records) == set(range(60))
    step = records[at]
    assert 0.002 <= step["period_s"] < 0.1, step  # its own work, not the 0.4 s outside
    assert step["period_s"] >= step["wait_s"]
    # The time is in no step: the step starts that much after the one before it ended.
    before = records[at - 1]
    gap = (step["end_time"] - step["period_s"]) - before["end_time"]
    assert gap == pytest.approx(0.4, abs=0.1), (before, step)
    assert max(r["period_s"] for i, r in records.items() if i != at) < 0.1
    loops = [(m["state"], m["how"]) for m in reader.of_kind("loop")]
    assert ("outside", "marked:evaluation") in loops


def test_a_watched_loop_inside_an_evaluation_mark_keeps_its_own_steps() -> None:
    """An evaluation that iterates a watched loader of its own inside probe.outside():
    its steps are its own (new indices), so the outer step is left as it was: nothing is
    taken twice, no step's period goes below its wait."""
    p = tcp_probe("eval-loop", system_interval_s=0)
    reader = attached(p)
    for i, _ in enumerate(p.watch(range(10))):
        if i == 3:
            with p.outside("evaluation"):
                for _ in p.watch(range(4)):
                    time.sleep(0.01)
    reader.pump(1.0)
    p.close()
    reader.pump(0.3)
    reader.close()
    records = reader.steps()
    # 10 + 4 steps less the outer step that held the inner loop (a loop entered inside
    # another's step ends that step unpublished: tests/test_watch_segments.py).
    assert sorted(r["index"] for r in records) == list(range(13))
    assert all(r["period_s"] >= r["wait_s"] >= 0 for r in records)


def test_short_passes_send_their_loop_changes_not_a_hello_each() -> None:
    # Viewers apply Loop messages to the hello they hold (tui/state/run.py,
    # window_hello): a hello a pass cost the publisher ~0.25 ms each, 2-5 a second for
    # the epochs of a small dataset (bench/short_passes.py). A hello still goes out for
    # a new loader and every HELLO_EVERY_S (2 s; attached just now).
    p = tcp_probe("passes", system_interval_s=0)
    reader = attached(p)
    reader.pump(0.3)  # the attach's hellos (one may follow the replay)
    before = len(reader.of_kind("hello"))
    loader = p.watch(list(range(20)))
    passes, start = 0, time.monotonic()
    while time.monotonic() - start < 2.5:
        for _ in loader:
            time.sleep(0.001)
        passes += 1
    reader.pump(0.4)
    p.close()  # its last flush: the last pass's end may not have been sent before
    reader.pump(0.3)
    reader.close()
    assert passes >= 40
    # The first pass's (a loader and a timing method, both new) and the periodic one
    # (a hello a pass: one each flush, 6-8).
    assert len(reader.of_kind("hello")) - before <= 2
    loops = reader.of_kind("loop")
    assert loops and (loops[-1]["state"], loops[-1]["how"]) == ("outside", "exhausted")
    assert loops[-1]["step_index"] == 20 * passes


def test_each_epochs_new_workers_are_sent_in_a_hello() -> None:
    p = tcp_probe("epochs", system_interval_s=0)
    reader = attached(p)
    loader = DataLoader(SleepyDataset(8, 0.0), batch_size=4, num_workers=1)
    watched = p.watch(loader)
    for _ in range(2):  # each epoch starts its worker anew (persistent_workers=False)
        for _ in watched:
            pass
        reader.pump(0.7)
    p.close()
    reader.close()
    pids = [tuple(h["loader"]["worker_pids"]) for h in reader.of_kind("hello") if h["loader"]]
    epochs = list(dict.fromkeys(pid for pid in pids if pid))
    assert len(epochs) == 2 and epochs[0] != epochs[1]


def test_loop_facts_and_worker_pids_from_the_watch_api() -> None:
    p = tcp_probe("api", system_interval_s=0)
    info = probe.messages.LoaderInfo("torch.DataLoader", num_workers=2, worker_pids=(11, 12))
    p._loop_entered(info, "lightning")
    assert p.worker_pids() == frozenset({11, 12})
    hello = p.hello()
    p._loop_left("exception:KeyboardInterrupt")
    left = p.hello()
    p.close()
    assert (hello.loop, hello.framework, hello.loader) == ("in-loop", "lightning", info)
    assert (left.loop, left.loop_exit) == ("outside", "exception:KeyboardInterrupt")


def test_hello_carries_the_process_affinity_and_quota() -> None:
    from gputop_dl.probe.collectors.cgroup import CgroupReader

    p = tcp_probe("facts", system_interval_s=0)
    reader = attached(p)
    p.close()
    reader.close()
    hello = reader.of_kind("hello")[-1]
    assert hello["cpu_affinity"] == sorted(os.sched_getaffinity(0))
    sample, _ = CgroupReader().read()
    assert hello["cpu_quota_cores"] == (sample.cpu_quota_cores if sample else None)
    assert hello["device"] is None  # no accelerator here: not guessed


def test_a_second_probe_in_the_process_is_the_first(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "_default", None)
    named = tcp_probe("named", system_interval_s=0)
    reader = attached(named)
    with caplog.at_level(logging.WARNING, logger="gputop.probe"):
        again = probe.Probe(name="other")
        assert list(probe.watch(range(4))) == [0, 1, 2, 3]  # the README's way
    assert again is named and probe.default() is named
    assert any("already has a probe" in r.getMessage() for r in caplog.records)
    reader.pump(1.0)
    named.close()
    reader.close()
    assert {r["index"] for r in reader.steps()} == {0, 1, 2, 3}
    assert {h["name"] for h in reader.of_kind("hello")} == {"named"}
    fresh = tcp_probe("after-close", system_interval_s=0)  # a closed probe is replaced
    assert fresh is not named
    fresh.close()


def test_a_large_backlog_is_split_into_small_messages() -> None:
    p = tcp_probe("backlog", system_interval_s=0)
    reader = attached(p)
    t = time.perf_counter()
    raws = [(i, t, t, t + 0.001, 1, None, None) for i in range(10_000)]
    p._steps.extend(raws)  # as if the publisher had stalled for a while
    p._index = 10_000
    reader.pump(2.0)
    p.close()
    reader.close()
    bodies = reader.of_kind("steps")
    assert {r["index"] for r in reader.steps()} == set(range(10_000))
    assert max(len(b["records"]) for b in bodies) <= 2_000


@pytest.mark.parametrize(
    ("steps_per_s", "period"),
    [
        (0.0, 0.2),  # idle
        (99.9, 0.2),
        (100.0, 0.5),
        (150.0, 0.5),
        (25_000.0, 0.5),  # a 0.5 s batch: a quarter of the 50,000-step buffer
        (25_001.0, 0.2),  # a tight loop of tiny steps: flushed often, nothing dropped
        (1e9, 0.2),
    ],
)
def test_flush_period_batches_fast_steps_but_never_a_quarter_of_the_buffer(
    steps_per_s: float, period: float
) -> None:
    from gputop_dl.probe.core import MAX_BUFFERED_STEPS, flush_period

    assert MAX_BUFFERED_STEPS == 50_000
    assert flush_period(steps_per_s) == period


@pytest.mark.parametrize(
    ("step_s", "fewest", "most", "widest_s"),
    [
        # ~25 steps/s: a message every 0.2 s (~13 in 2.5 s), each holding ~0.2 s of steps.
        (0.04, 8, 16, 0.35),
        # ~190 steps/s: a message every 0.5 s (~6 in 2.5 s; every 0.2 s there were ~13).
        (0.005, 3, 8, 0.75),
    ],
    ids=["slow-steps-every-0.2s", "fast-steps-every-0.5s"],
)
def test_steps_go_out_soon_and_fast_steps_in_fewer_messages(
    step_s: float, fewest: int, most: int, widest_s: float
) -> None:
    """A viewer pays ~20 us per message whatever its size: from 100 steps/s on the probe
    batches the steps of 0.5 s (half the viewer's refresh period), below that it sends every
    0.2 s. No step is lost either way, and none is held past its period: the steps of one
    message span at most a period. (Measured by the steps' own end times, not by when they
    arrive: a pause of the whole process, a GC or the VM's, delays both threads alike; a
    message arriving 1.03 s after its oldest step of a 0.5 s period failed a fresh CI.)"""
    p = tcp_probe("cadence", system_interval_s=0)
    reader = attached(p)
    bodies: list[dict[str, Any]] = []
    stop = time.monotonic() + 2.5
    for _ in p.watch(range(100_000)):
        for message in reader.pump(step_s):  # the step: reading what arrives meanwhile
            if message["kind"] == "steps":
                bodies.append(message["body"])
        if time.monotonic() >= stop:
            break
    sent = p._index
    p.close()
    bodies += [m["body"] for m in reader.pump(1.0) if m["kind"] == "steps"]
    reader.close()
    indices = [r["index"] for body in bodies for r in body["records"]]
    assert sorted(indices) == list(range(sent))
    live = [body["records"] for body in bodies if body["records"]]
    assert fewest <= len(live) <= most, [len(records) for records in live]
    # Each message but the one close() sent holds the steps of one period, from the last
    # drain; the first, those since the loop began, within the publisher's idle wait.
    spans = [records[-1]["end_time"] - records[0]["end_time"] for records in live[:-1]]
    assert spans[0] < core.IDLE_FLUSH_S, spans
    assert max(spans[1:]) < widest_s, spans


def test_a_persistent_publisher_error_is_logged_once_not_every_flush(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenSampler:
        def take(self) -> list[Any]:
            raise OSError("disk gone")

        def close(self) -> None:
            pass

    p = tcp_probe("noisy", system_interval_s=0)
    p._sampler = BrokenSampler()
    with caplog.at_level(logging.WARNING, logger="gputop.probe"):
        for _ in p.watch(range(100)):
            time.sleep(0.01)  # ~10 publisher flushes, each failing
        p.close()
    errors = [r for r in caplog.records if "publisher error" in r.getMessage()]
    assert len(errors) == 1


def test_a_subscription_bomb_does_not_grow_the_training_process() -> None:
    import psutil
    import zmq

    me = psutil.Process()
    p = tcp_probe("bomb", system_interval_s=0)
    for _ in p.watch(range(20_000)):  # a full history to replay
        pass
    time.sleep(0.3)
    ctx = zmq.Context()
    rss_before = me.memory_info().rss
    steps_before = p._index
    for _ in range(300):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b"gputop.")
        s.connect(p.endpoint or "")
        s.close()
    for _ in p.watch(range(1000)):  # training goes on meanwhile
        pass
    time.sleep(1.5)
    grown = me.memory_info().rss - rss_before
    p.close()
    ctx.term()
    assert p._index == steps_before + 1000
    assert grown < 64 * 1024 * 1024, f"RSS grew by {grown / 1e6:.0f} MB"


def test_a_full_buffer_drops_the_oldest_steps_and_counts_them() -> None:
    from collections import deque

    p = tcp_probe("overflow", system_interval_s=0)
    reader = attached(p)
    p._steps = deque(maxlen=100)
    t = time.perf_counter()
    p._steps.extend((i, t, t, t + 0.001, 1, None, None) for i in range(150))
    p._index = 150
    reader.pump(1.0)
    p.close()
    reader.close()
    assert {r["index"] for r in reader.steps()} == set(range(50, 150))
    assert reader.of_kind("steps")[-1]["dropped_steps"] == 50


CRASHING = """
import sys, time
from gputop_dl import probe
for i in probe.watch(range(1000)):
    time.sleep(0.01)
    if i == {at}:
        {raise_}
"""


@pytest.mark.parametrize(
    ("raise_", "reason"),
    [
        (
            'raise RuntimeError("boom inside the loop")',
            "crashed (RuntimeError: boom inside the loop)",
        ),
        ("raise KeyboardInterrupt", "interrupted (Ctrl-C)"),
        ("sys.exit(3)", "process exit"),
        ("break", "process exit"),
    ],
    ids=["exception", "ctrl-c", "sys-exit", "finished"],
)
def test_a_run_that_dies_of_an_exception_says_so_in_its_bye(raise_: str, reason: str) -> None:
    """An exception in the loop's body ends the process through the exit handlers, as a
    clean end does: the bye said "process exit" for both, and a crashed run read as one
    that finished."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    reader = WireReader(endpoint)
    code = CRASHING.format(at=30, raise_=raise_)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUTOP_LISTEN": endpoint},
    )
    assert proc.returncode != 0 or raise_ == "break", proc.stderr
    reader.pump(1.0)
    (bye,) = reader.of_kind("bye")
    assert bye["reason"] == reason


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    ("last", "interactive", "reason"),
    [
        (None, False, "process exit"),
        (ValueError("bad value"), False, "crashed (ValueError: bad value)"),
        (ValueError(), False, "crashed (ValueError)"),
        (ValueError("x" * 500), False, "crashed (ValueError: " + "x" * 159 + "…)"),
        (_Unprintable(), False, "crashed (_Unprintable)"),
        (KeyboardInterrupt(), False, "interrupted (Ctrl-C)"),
        # the REPL (python -i, code.interact) keeps an error the session went on after
        (ZeroDivisionError("division by zero"), True, "process exit"),
    ],
    ids=["none", "error", "no-text", "long", "unprintable", "ctrl-c", "interactive"],
)
def test_the_exit_reason(
    monkeypatch: pytest.MonkeyPatch, last: BaseException | None, interactive: bool, reason: str
) -> None:
    from gputop_dl.probe.core import exit_reason

    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    if last is None:
        monkeypatch.delattr(sys, "last_value", raising=False)
    else:
        monkeypatch.setattr(sys, "last_value", last, raising=False)
    if interactive:
        monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    else:
        monkeypatch.delattr(sys, "ps1", raising=False)
    assert exit_reason() == reason
