"""The in-process probe: what it measures, what it publishes, and that it never harms
training. Real DataLoaders, real ZeroMQ sockets on loopback/ipc, a real model."""

from __future__ import annotations

import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from gputop_dl import probe
from gputop_dl.probe import discovery
from gputop_dl.probe.loader import infer_samples
from tests.wire_reader import WireReader

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


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
    computed = []  # the loop body's own time, measured independently of the probe
    for _ in p.watch(loader):
        t0 = time.perf_counter()
        time.sleep(compute)
        computed.append(time.perf_counter() - t0)
    p.close()
    reader.pump(1.0)
    reader.close()

    records = reader.steps()
    assert [r["index"] for r in records] == list(range(len(loader)))
    steady = records[5:]  # skip worker start-up
    # Means, not medians: the two workers finish in phase, so batches arrive in pairs.
    wait = statistics.mean(r["wait_s"] for r in steady)
    period = statistics.mean(r["period_s"] for r in steady)
    expected_period = batch * delay / 2
    assert wait == pytest.approx(expected_period - statistics.mean(computed[5:]), rel=0.10)
    assert period == pytest.approx(expected_period, rel=0.10)
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
