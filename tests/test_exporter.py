"""``gputop exporter``: a real probe, a real exporter process, a real HTTP scrape parsed
with prometheus_client's own parser; the access rules; a port in use; the dashboard."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the exporter needs pip install gputop-dl[viewer]")
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gputop_dl.probe.messages import StepRecord
from gputop_dl.probe.samples import (
    CgroupSample,
    CpuCore,
    CpuSample,
    DiskSample,
    GpuSample,
    HpuSample,
    MemorySample,
    NetSample,
    PressureSample,
    SystemSample,
)
from gputop_dl.tui import metrics
from gputop_dl.tui.exporter import ListenError, parse_listen
from gputop_dl.tui.state import SAMPLES_UNIT, STEPS_UNIT, Connection, RunSummary

DASHBOARD = Path(__file__).parent.parent / "contrib" / "grafana" / "gputop.json"
TRAINING = textwrap.dedent(
    """
    import sys, time
    from gputop_dl import probe
    p = probe.Probe(name="scraped", listen=sys.argv[1], system_interval_s=0.5)
    print("up", flush=True)
    for i, _batch in enumerate(p.watch(range(10**9), samples=8)):
        time.sleep(0.02 if i % 2 else 0.005)  # the loop's own work
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exporter(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputop_dl.tui.cli", "exporter", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def url_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"serving (http://\S+)", line)
    assert found, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return found.group(1)


def scrape(url: str) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


@pytest.fixture
def training() -> Iterator[str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINING, endpoint], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    yield endpoint
    proc.kill()
    proc.wait()


SCRAPED_FAMILIES = (
    "gputop_run_samples_per_second",
    "gputop_run_data_wait_ratio",
    "gputop_node_cpu_cores",
    "gputop_node_cpu_busy_ratio",
    "gputop_node_memory_total_bytes",
)


def test_a_real_scrape_carries_the_run_its_verdict_and_the_node(training: str) -> None:
    proc = exporter("--listen", "127.0.0.1:0", training)
    try:
        url = url_of(proc)
        deadline = time.monotonic() + 30
        fams: dict[str, list[Sample]] = {}
        while time.monotonic() < deadline:
            fams = scrape(url)
            verdicts = [s for s in fams.get("gputop_run_verdict", []) if s.value == 1]
            # The verdict can come from the first steps before the first throughput
            # bucket closes (the rate is unknown until then, and not exported), and before
            # the first node sample: wait for every family read below.
            present = all(fams.get(family) for family in SCRAPED_FAMILIES)
            if present and verdicts and verdicts[0].labels["gputop_run_verdict"] != "warming-up":
                break
            time.sleep(0.5)
        (info,) = fams["gputop_run_info"]
        assert info.name == "gputop_run_info" and info.labels["run"] == "scraped"
        labels = {k: info.labels[k] for k in ("run", "rank", "host", "pid")}
        assert labels["rank"] == "" and labels["host"] == socket.gethostname()

        def one(family: str, suffix: str = "") -> float:
            found = [
                s.value
                for s in fams[family]
                if s.name == family + suffix
                and all(s.labels.get(k) == v for k, v in labels.items())
            ]
            assert len(found) == 1, (family, fams.get(family))
            return found[0]

        # The verdict: exactly one state set, the analyzer's (a loop that never waits).
        shown = [s for s in fams["gputop_run_verdict"] if s.value == 1]
        assert [s.labels["gputop_run_verdict"] for s in shown] == ["compute-bound"]
        assert one("gputop_run_verdict_severity") == 0
        assert one("gputop_run_stalled_seconds") == 0
        loop = [s.labels["gputop_run_loop"] for s in fams["gputop_run_loop"] if s.value == 1]
        assert loop == ["in-loop"]
        # Steps: the counter, the histogram and the samples agree with each other.
        steps = one("gputop_run_steps", "_total")
        count = one("gputop_run_step_duration_seconds", "_count")
        assert 5 <= count <= steps + 1
        assert one("gputop_run_samples", "_total") == 8 * count
        mean = one("gputop_run_step_duration_seconds", "_sum") / count
        assert 0.005 < mean < 1.0
        buckets = [
            s for s in fams["gputop_run_step_duration_seconds"] if s.name.endswith("_bucket")
        ]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
        values = [s.value for s in buckets]
        assert values == sorted(values)  # cumulative
        assert one("gputop_run_samples_per_second") > 0
        assert 0 <= one("gputop_run_data_wait_ratio") < 0.2
        # The node, from the probe's own host sampler: base units.
        host = {"host": socket.gethostname()}
        (cores,) = [s.value for s in fams["gputop_node_cpu_cores"] if s.labels == host]
        assert cores >= 1
        (busy,) = [s.value for s in fams["gputop_node_cpu_busy_ratio"] if s.labels == host]
        assert 0 <= busy <= 1
        (total,) = [s.value for s in fams["gputop_node_memory_total_bytes"] if s.labels == host]
        assert total > 2**20
        # One probe read: one run, nothing else (a local sampler only runs when no probe
        # samples this host, and the probe does).
        kinds = {s.labels["kind"]: s.value for s in fams["gputop_exporter_sources"]}
        assert kinds == {"run": 1, "node": 0, "incompatible": 0}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


def test_a_stalled_run_is_exported_as_stalled() -> None:
    """A probe whose loop hangs: the exporter says stalled, with the seconds."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    hang = TRAINING.replace(
        "time.sleep(0.02 if i % 2 else 0.005)", "time.sleep(0.01 if i < 60 else 3600)"
    )
    train = subprocess.Popen(
        [sys.executable, "-c", hang, endpoint], stdout=subprocess.PIPE, text=True
    )
    try:
        # The exporter checks its endpoint once, at start: only once the probe listens.
        assert train.stdout is not None and train.stdout.readline() == "up\n"
        proc = exporter("--listen", "127.0.0.1:0", "--no-local", endpoint)
        try:
            url = url_of(proc)
            deadline = time.monotonic() + 40
            stalled, seconds = None, 0.0
            while time.monotonic() < deadline:
                fams = scrape(url)
                shown = [s for s in fams.get("gputop_run_verdict", []) if s.value == 1]
                stalled = shown[0].labels["gputop_run_verdict"] if shown else None
                if stalled == "stalled":
                    seconds = fams["gputop_run_stalled_seconds"][0].value
                    if seconds > 0:
                        break
                time.sleep(0.5)
            assert stalled == "stalled" and seconds > 0
            assert fams["gputop_run_verdict_severity"][0].value == 3
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        train.kill()
        train.wait()


def test_a_port_in_use_is_a_clear_error_and_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = exporter("--listen", f"127.0.0.1:{port}", "--no-local")
        _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in err


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.1:9477", "example.org:9477"])
def test_a_network_address_is_refused_without_insecure(listen: str) -> None:
    proc = exporter("--listen", listen, "--no-local")
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert "refused" in err and "--insecure" in err


def test_keys_do_not_open_the_network_to_plain_http(capsys: pytest.CaptureFixture[str]) -> None:
    """CURVE keys (gputop keys) let a probe listen on the network: they protect its ZMQ
    stream. The exporter took the same rule, and served /metrics to the network."""
    from gputop_dl.tui.cli import main

    assert main(["keys"]) == 0
    capsys.readouterr()
    proc = exporter("--listen", "0.0.0.0:0", "--no-local")
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "plain HTTP" in err and "--insecure" in err


def test_insecure_allows_a_wildcard_and_warns() -> None:
    proc = exporter("--listen", "0.0.0.0:0", "--insecure", "--no-local")
    try:
        url = url_of(proc).replace("0.0.0.0", "127.0.0.1")
        assert "gputop_exporter_sources" in scrape(url)
    finally:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=10) == 128 + signal.SIGHUP
    assert proc.stderr is not None and "anyone who can reach" in proc.stderr.read()


def test_an_endpoint_nothing_listens_on_exits_1() -> None:
    proc = exporter("--listen", "127.0.0.1:0", f"tcp://127.0.0.1:{free_port()}")
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "nothing listens" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9477", ("127.0.0.1", 9477)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:80", ("localhost", 80)),
        ("9477", None),
        (":9477", None),
        ("127.0.0.1:http", None),
        ("127.0.0.1:70000", None),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int] | None) -> None:
    if expected is None:
        with pytest.raises(ListenError):
            parse_listen(text)
    else:
        assert parse_listen(text) == expected


# ------------------------------------------------------------------ pure parts
def step(
    index: int, period: float, wait: float | None = 0.0, samples: int | None = 4
) -> StepRecord:
    return StepRecord(index, 1000.0 + index, period, wait, samples)


def test_step_totals_count_each_step_once_and_reset_on_restart() -> None:
    t = metrics.StepTotals()
    t.add([step(0, 0.004), step(1, 0.2, 0.1)])
    t.add([step(0, 0.004), step(1, 0.2, 0.1), step(2, 200.0)])  # a history replay, one new
    assert t.count == 3 and t.samples == 12 and t.wait_seconds == pytest.approx(0.1)
    buckets = dict(t.buckets())
    assert buckets["0.005"] == 1 and buckets["0.25"] == 2 and buckets["120.0"] == 2
    assert buckets["+Inf"] == 3
    t.add([step(0, 1.0)])  # indices went back: the process restarted
    assert t.count == 1 and t.last_index == 0 and dict(t.buckets())["+Inf"] == 1


def test_unknown_batch_size_exports_no_samples_counter() -> None:
    t = metrics.StepTotals()
    t.add([step(0, 0.1, samples=None)])
    fig = metrics.RunFigures(summary(None), t)
    names = {m.name for m in metrics.run_families([fig]) if m.samples}
    assert "gputop_run_samples" not in names and "gputop_run_steps" in names
    assert "gputop_run_data_wait_ratio" not in names  # not reported: no sample, not 0


def summary(wait_share: float | None) -> RunSummary:
    return RunSummary(
        key="h:1",
        label="r",
        name="r",
        host="h",
        pid=1,
        rank=0,
        world_size=2,
        uptime_s=1.0,
        step_count=1,
        unit="steps/s",
        rate_now=None,
        rate_avg=None,
        wait_share_now=wait_share,
        device_busy_now=None,
        connection=Connection("live", "live"),
        verdict=None,
        loop="in-loop",
    )


def every_metric_name() -> set[str]:
    """Every series name the exporter can serve, from figures with every kind of device."""
    gpu = GpuSample(0, "A100", "GPU-1", util_pct=50.0, mem_used_bytes=1, mem_total_bytes=2,
                    power_w=1.0, power_limit_w=2.0, temperature_c=50.0, sm_clock_mhz=1.0,
                    pcie_rx_bps=1.0, pcie_tx_bps=1.0, throttle_reasons=("hw_slowdown",),
                    training_mem_bytes=1)  # fmt: skip
    hpu = HpuSample(0, "HL-225", "x", util_pct=1.0, mem_used_bytes=1, mem_total_bytes=2,
                    power_w=1.0, temperature_c=1.0)  # fmt: skip
    node = SystemSample(
        time=1.0,
        host="h",
        interval_s=1.0,
        cpu=CpuSample((CpuCore(0, 1.0, 1.0, 1.0, 0.0, 97.0),), (1.0, 1.0, 1.0)),
        memory=MemorySample(1, 1, 1, 1, 1, 1, 1.0, 1.0),
        disks=(DiskSample("sda", 1.0, 1.0, 1.0, 1.0, 1.0),),
        nets=(NetSample("eth0", 1.0, 1.0),),
        pressure=PressureSample(1.0, 1.0, 1.0, 1.0, 1.0),
        cgroup=CgroupSample(2.0, 1, 1, 1, 1.0, 1, 1),
        gpus=(gpu,),
        hpus=(hpu,),
    )
    t = metrics.StepTotals()
    t.add([step(0, 0.1)])
    runs = tuple(
        metrics.RunFigures(dataclasses.replace(_with_verdict(), unit=unit), t)
        for unit in (SAMPLES_UNIT, STEPS_UNIT)
    )
    figures = metrics.Figures(runs, (node,))
    names: set[str] = set()
    for family in metrics.families(figures):
        names.update(s.name for s in family.samples)
    return names


def _with_verdict() -> RunSummary:
    from gputop_dl.tui.analyzer import Verdict

    verdict = Verdict("input-bound", "warning", 1.0, "x", cause="disk")
    return dataclasses.replace(summary(0.5), rate_now=1.0, device_busy_now=0.5, verdict=verdict)


def test_the_grafana_dashboard_reads_only_metrics_the_exporter_serves() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    served = every_metric_name()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) >= 15
    used = {name for e in exprs for name in re.findall(r"\bgputop_[a-z0-9_]+", e)}
    assert used and used <= served, used - served
    for name in served:  # Prometheus naming: base units, counters end in _total
        assert re.fullmatch(r"gputop_[a-z0-9_]+", name)
        assert not re.search(r"_(percent|pct|mhz|kb|mb|ms)(_|$)", name), name


class NoSource:
    def start(self, emit: object) -> None: ...

    def stop(self) -> None: ...


def test_the_exporter_forgets_a_run_that_left_the_viewer() -> None:
    from gputop_dl.probe.messages import Bye, Hello, Steps
    from gputop_dl.tui.events import Received
    from gputop_dl.tui.exporter import Exporter

    t0 = 1_700_000_000.0
    exp = Exporter(NoSource(), local_host="elsewhere")
    hello = Hello("n:1", "probe", "r", "n", 1, t0, "0", rank=2, world_size=4)
    records = tuple(StepRecord(i, t0 + 0.1 * (i + 1), 0.1, 0.05, 8) for i in range(20))
    exp._emit([Received(hello, t0), Received(Steps("n:1", records, 1, 0), t0 + 2)])
    figures = exp.update(t0 + 2.1)
    (run,) = figures.runs
    assert run.totals.count == 20 and run.totals.samples == 160
    assert run.summary.rank == 2 and run.totals.wait_seconds == pytest.approx(1.0)
    names = {s.name for f in exp.collect() for s in f.samples}
    assert "gputop_run_step_duration_seconds_bucket" in names
    exp._emit([Received(Bye("n:1", "done", 20), t0 + 3)])
    exp.update(t0 + 3)
    assert exp.update(t0 + 70).runs == () and exp._totals == {}  # gone a minute after
