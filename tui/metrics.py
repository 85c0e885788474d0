"""Prometheus metric families from what the viewer knows (pure: no I/O, no clock).

``gputop exporter`` (tui/exporter.py) mirrors the viewer state: it does not count events
of its own, so it is a custom collector whose ``collect()`` builds these families from
the newest :class:`Figures`. Names follow Prometheus rules: the ``gputop_`` prefix, base
units in the name (``_seconds``, ``_bytes``, ``_ratio`` 0-1, ``_hertz``, ``_watts``,
``_celsius``), counters ending in ``_total``; labels identify (run, rank, host, pid,
device), never carry values. A figure the source did not report is left out, never
exported as 0. The verdict is the one the screen shows (``RunSummary.verdict``): this
module reads it and never judges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)

from gputop_dl.probe.messages import StepRecord
from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.state import SAMPLES_UNIT, RunSummary

# Step durations from a 1 ms launch-bound step to a 2 min one (a huge model, a hang).
STEP_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
# Every verdict kind the analyzer gives (docs/verdicts.md), one state each.
VERDICT_KINDS = (
    "warming-up",
    "outside-loop",
    "starting-pass",
    "stalled",
    "input-bound",
    "compute-bound",
    "h2d-copies",
    "host-overhead",
    "throttling",
    "gpu-memory-full",
    "cpu-quota",
    "unknown",
    "error",
)
SEVERITY_LEVEL = {"ok": 0, "info": 1, "warning": 2, "critical": 3}
LOOP_STATES = ("not-started", "in-loop", "outside")
CONNECTION_STATES = ("connecting", "live", "stale", "lost", "exited", "incompatible")
RUN_LABELS = ("run", "rank", "host", "pid")


@dataclass
class StepTotals:
    """Cumulative figures of one run's steps since the exporter first saw it.

    Fed with each step once (de-duplicated by index: a probe replays its history to every
    new subscriber). A restarted run (indices going back) starts from zero again, which
    Prometheus reads as a counter reset."""

    counts: list[int] = field(default_factory=lambda: [0] * len(STEP_BUCKETS_S))
    count: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    samples: int = 0
    samples_known: bool = False
    last_index: int | None = None

    def add(self, steps: Sequence[StepRecord]) -> None:
        if steps and self.last_index is not None and steps[-1].index < self.last_index:
            self._reset()  # the run restarted: a counter reset
        last = self.last_index
        for step in steps:
            if last is not None and step.index <= last:
                continue
            last = step.index
            self.count += 1
            self.seconds += step.period_s
            self.wait_seconds += step.wait_s or 0.0
            if step.samples is not None:
                self.samples += step.samples
                self.samples_known = True
            for i, bound in enumerate(STEP_BUCKETS_S):
                if step.period_s <= bound:
                    self.counts[i] += 1
                    break
        self.last_index = last

    def _reset(self) -> None:
        fresh = StepTotals()
        self.counts, self.count, self.seconds = fresh.counts, 0, 0.0
        self.wait_seconds, self.samples, self.samples_known = 0.0, 0, False
        self.last_index = None

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative buckets in the exposition's form, ``+Inf`` last."""
        out, running = [], 0
        for bound, n in zip(STEP_BUCKETS_S, self.counts, strict=True):
            running += n
            out.append((repr(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


@dataclass(frozen=True)
class RunFigures:
    summary: RunSummary
    totals: StepTotals
    framework: str | None = None
    stalled_s: float = 0.0  # how long the shown verdict has been "stalled" (0: not stalled)


@dataclass(frozen=True)
class Figures:
    """One coherent view: what ``collect()`` turns into metric families."""

    runs: tuple[RunFigures, ...] = ()
    nodes: tuple[SystemSample, ...] = ()
    sources: tuple[tuple[str, int], ...] = ()  # (kind, publishers): ViewerState.source_kinds
    errors: int = 0


def run_labels(run: RunSummary) -> list[str]:
    rank = "" if run.rank is None else str(run.rank)
    pid = "" if run.pid is None else str(run.pid)
    return [run.name, rank, run.host or "", pid]


def families(figures: Figures) -> list[Metric]:
    return [*run_families(figures.runs), *node_families(figures.nodes), *_self(figures)]


def run_families(runs: Iterable[RunFigures]) -> Iterator[Metric]:
    L = list(RUN_LABELS)
    info = InfoMetricFamily(
        "gputop_run", "A training run (one process) gputop sees", labels=[*L, "world_size"]
    )
    connection = StateSetMetricFamily(
        "gputop_run_connection", "Its publisher's state as the viewer sees it", labels=L
    )
    loop = StateSetMetricFamily(
        "gputop_run_loop", "Whether the training thread is inside its watched loop", labels=L
    )
    steps = CounterMetricFamily("gputop_run_steps", "Steps the probe measured", labels=L)
    samples = CounterMetricFamily(
        "gputop_run_samples", "Samples in the steps seen since the exporter attached", labels=L
    )
    wait = CounterMetricFamily(
        "gputop_run_data_wait_seconds",
        "Time spent waiting for the next batch, over the steps seen",
        labels=L,
    )
    hist = HistogramMetricFamily(
        "gputop_run_step_duration_seconds",
        "Step period (batch arrival to next batch arrival), over the steps seen",
        labels=L,
    )
    rate_samples = GaugeMetricFamily(
        "gputop_run_samples_per_second", "Throughput over the last seconds (samples)", labels=L
    )
    rate_steps = GaugeMetricFamily(
        "gputop_run_steps_per_second",
        "Throughput over the last seconds, when the probe reports no batch size",
        labels=L,
    )
    wait_ratio = GaugeMetricFamily(
        "gputop_run_data_wait_ratio", "Share of recent step time spent waiting for data", labels=L
    )
    device_ratio = GaugeMetricFamily(
        "gputop_run_device_busy_ratio", "Share of recent step time the device was busy", labels=L
    )
    verdict = StateSetMetricFamily(
        "gputop_run_verdict", "What limits the run (the verdict gputop shows)", labels=L
    )
    severity = GaugeMetricFamily(
        "gputop_run_verdict_severity",
        "Severity of the shown verdict: 0 ok, 1 info, 2 warning, 3 critical",
        labels=L,
    )
    cause = InfoMetricFamily(
        "gputop_run_verdict_cause", "Why an input-bound run waits (the shown cause)", labels=L
    )
    stalled = GaugeMetricFamily(
        "gputop_run_stalled_seconds",
        "How long the run has been shown as stalled (0: not)",
        labels=L,
    )
    dropped = CounterMetricFamily(
        "gputop_run_dropped_steps",
        "Step records the probe dropped since the viewer attached",
        labels=L,
    )
    for fig in runs:
        run = fig.summary
        if run.is_placeholder:
            continue
        labels = run_labels(run)
        world = "" if run.world_size is None else str(run.world_size)
        info.add_metric(
            labels,
            {
                "world_size": world,
                "timing": run.timing or "",
                "framework": fig.framework or "",
            },
        )
        connection.add_metric(labels, _states(CONNECTION_STATES, run.connection.state))
        if run.loop is not None:
            loop.add_metric(labels, _states(LOOP_STATES, run.loop))
        steps.add_metric(labels, float(run.step_count))
        totals = fig.totals
        if totals.samples_known:
            samples.add_metric(labels, float(totals.samples))
        if run.wait_share_now is not None or totals.wait_seconds:
            wait.add_metric(labels, totals.wait_seconds)
        hist.add_metric(labels, totals.buckets(), totals.seconds)
        if run.rate_now is not None:
            target = rate_samples if run.unit == SAMPLES_UNIT else rate_steps
            target.add_metric(labels, run.rate_now)
        if run.wait_share_now is not None:
            wait_ratio.add_metric(labels, run.wait_share_now)
        if run.device_busy_now is not None:
            device_ratio.add_metric(labels, run.device_busy_now)
        if run.verdict is not None:
            verdict.add_metric(labels, _states(VERDICT_KINDS, run.verdict.kind))
            severity.add_metric(labels, float(SEVERITY_LEVEL.get(run.verdict.severity, 0)))
            if run.verdict.cause is not None:
                cause.add_metric(labels, {"cause": run.verdict.cause})
        stalled.add_metric(labels, fig.stalled_s)
        dropped.add_metric(labels, float(run.lost_steps))
    yield from (info, connection, loop, steps, samples, wait, hist, rate_samples, rate_steps)
    yield from (wait_ratio, device_ratio, verdict, severity, cause, stalled, dropped)


def _states(states: Sequence[str], current: str) -> dict[str, bool]:
    """A state set over the known states, plus ``current`` when it is a new one."""
    values = {state: state == current for state in states}
    values.setdefault(current, True)
    return values


class _Gauges:
    """Gauge families by name, created on first use, so a node without GPUs exports no
    GPU family at all (not one with no samples)."""

    def __init__(self) -> None:
        self.families: dict[str, GaugeMetricFamily] = {}

    def set(
        self, name: str, doc: str, labels: dict[str, str], value: float | None, scale: float = 1.0
    ) -> None:
        if value is None:
            return  # not reported: no sample, never a made-up zero
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), value * scale)


PCT = 0.01  # percent -> ratio
MHZ = 1e6  # MHz -> Hz


def node_families(nodes: Iterable[SystemSample]) -> Iterator[Metric]:
    g = _Gauges()
    for s in nodes:
        host = {"host": s.host}
        if s.cpu is not None:
            cores = s.cpu.cores
            g.set("gputop_node_cpu_cores", "Logical cores sampled", host, float(len(cores)))
            busy = [c.busy_pct for c in cores if c.busy_pct is not None]
            if busy:
                g.set(
                    "gputop_node_cpu_busy_ratio",
                    "Mean busy share of the cores",
                    host,
                    sum(busy) / len(busy),
                    PCT,
                )
            iowait = [c.iowait_pct for c in cores if c.iowait_pct is not None]
            if iowait:
                g.set(
                    "gputop_node_cpu_iowait_ratio",
                    "Mean iowait share of the cores",
                    host,
                    sum(iowait) / len(iowait),
                    PCT,
                )
            for c in cores:
                g.set(
                    "gputop_node_cpu_core_busy_ratio",
                    "Busy share of one core",
                    {**host, "core": str(c.index)},
                    c.busy_pct,
                    PCT,
                )
            if s.cpu.load_avg is not None:
                g.set("gputop_node_load1", "Load average over 1 minute", host, s.cpu.load_avg[0])
        if (m := s.memory) is not None:
            g.set("gputop_node_memory_total_bytes", "Physical memory", host, _f(m.total_bytes))
            g.set("gputop_node_memory_used_bytes", "Memory in use", host, _f(m.used_bytes))
            g.set(
                "gputop_node_memory_available_bytes",
                "Memory available",
                host,
                _f(m.available_bytes),
            )
            g.set("gputop_node_swap_used_bytes", "Swap in use", host, _f(m.swap_used_bytes))
            g.set("gputop_node_swap_in_bytes_per_second", "Swap-in rate", host, m.swap_in_bps)
            g.set("gputop_node_swap_out_bytes_per_second", "Swap-out rate", host, m.swap_out_bps)
        for d in s.disks:
            dev = {**host, "device": d.device}
            g.set("gputop_node_disk_read_bytes_per_second", "Disk read rate", dev, d.read_bps)
            g.set("gputop_node_disk_write_bytes_per_second", "Disk write rate", dev, d.write_bps)
            g.set(
                "gputop_node_disk_busy_ratio",
                "Share of time with I/O in flight",
                dev,
                d.busy_pct,
                PCT,
            )
        for n in s.nets:
            nic = {**host, "interface": n.interface}
            g.set("gputop_node_network_receive_bytes_per_second", "Receive rate", nic, n.rx_bps)
            g.set("gputop_node_network_transmit_bytes_per_second", "Transmit rate", nic, n.tx_bps)
        if (p := s.pressure) is not None:
            for resource, scope, value in (
                ("cpu", "some", p.cpu_some),
                ("io", "some", p.io_some),
                ("io", "full", p.io_full),
                ("memory", "some", p.memory_some),
                ("memory", "full", p.memory_full),
            ):
                g.set(
                    "gputop_node_pressure_ratio",
                    "Linux PSI avg10 stall share",
                    {**host, "resource": resource, "scope": scope},
                    value,
                    PCT,
                )
        if (cg := s.cgroup) is not None:
            g.set(
                "gputop_node_cgroup_cpu_quota_cores",
                "Container CPU limit",
                host,
                cg.cpu_quota_cores,
            )
            g.set(
                "gputop_node_cgroup_cpu_throttled_ratio",
                "Share of CPU periods throttled",
                host,
                cg.throttled_pct,
                PCT,
            )
            g.set(
                "gputop_node_cgroup_memory_limit_bytes",
                "Container memory limit",
                host,
                _f(cg.memory_limit_bytes),
            )
        for gpu in s.gpus:
            dev = {**host, "gpu": str(gpu.index), "uuid": gpu.uuid or "", "name": gpu.name or ""}
            g.set(
                "gputop_gpu_up",
                "1: the GPU answers, 0: lost",
                dev,
                1.0 if gpu.state == "ok" else 0.0,
            )
            g.set("gputop_gpu_utilization_ratio", "NVML utilization", dev, gpu.util_pct, PCT)
            g.set(
                "gputop_gpu_memory_used_bytes", "Device memory in use", dev, _f(gpu.mem_used_bytes)
            )
            g.set("gputop_gpu_memory_total_bytes", "Device memory", dev, _f(gpu.mem_total_bytes))
            g.set(
                "gputop_gpu_training_memory_bytes",
                "Memory held by the watched training",
                dev,
                _f(gpu.training_mem_bytes),
            )
            g.set("gputop_gpu_power_watts", "Power draw", dev, gpu.power_w)
            g.set("gputop_gpu_power_limit_watts", "Power limit", dev, gpu.power_limit_w)
            g.set("gputop_gpu_temperature_celsius", "Temperature", dev, gpu.temperature_c)
            g.set("gputop_gpu_sm_clock_hertz", "SM clock", dev, gpu.sm_clock_mhz, MHZ)
            g.set(
                "gputop_gpu_pcie_receive_bytes_per_second",
                "PCIe receive rate",
                dev,
                gpu.pcie_rx_bps,
            )
            g.set(
                "gputop_gpu_pcie_transmit_bytes_per_second",
                "PCIe transmit rate",
                dev,
                gpu.pcie_tx_bps,
            )
            for reason in gpu.throttle_reasons or ():
                g.set(
                    "gputop_gpu_throttle_active",
                    "1 for each active throttle reason",
                    {**dev, "reason": reason},
                    1.0,
                )
        for hpu in s.hpus:
            dev = {**host, "hpu": str(hpu.index), "uuid": hpu.uuid or "", "name": hpu.name or ""}
            g.set(
                "gputop_hpu_up",
                "1: the HPU answers, 0: lost",
                dev,
                1.0 if hpu.state == "ok" else 0.0,
            )
            g.set("gputop_hpu_utilization_ratio", "hl-smi utilization", dev, hpu.util_pct, PCT)
            g.set(
                "gputop_hpu_memory_used_bytes", "Device memory in use", dev, _f(hpu.mem_used_bytes)
            )
            g.set("gputop_hpu_memory_total_bytes", "Device memory", dev, _f(hpu.mem_total_bytes))
            g.set("gputop_hpu_power_watts", "Power draw", dev, hpu.power_w)
            g.set("gputop_hpu_temperature_celsius", "Temperature", dev, hpu.temperature_c)
    yield from g.families.values()


def _self(figures: Figures) -> Iterator[Metric]:
    sources = GaugeMetricFamily(
        "gputop_exporter_sources",
        "Publishers the exporter tracks, by kind: run (a training process; an ended one"
        " for a minute after its end), node (an agent, or a sampler of this host),"
        " incompatible (messages it cannot read)",
        labels=["kind"],
    )
    for kind, count in figures.sources:
        sources.add_metric([kind], float(count))
    yield sources
    yield CounterMetricFamily(
        "gputop_exporter_errors", "Problems with received input", value=figures.errors
    )


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)
