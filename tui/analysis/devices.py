"""Accelerator conditions over the recent samples: memory nearly full, clocks throttled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.probe.messages import DeviceRef
from gputop_dl.probe.samples import GpuSample, HpuSample, SystemSample
from gputop_dl.tui.analysis.thresholds import (
    BUSY_UTIL_PCT,
    SYSTEM_WINDOW_S,
    THROTTLE_POWER_CAP_REASONS,
    THROTTLE_SAMPLE_SHARE,
    THROTTLE_SLOWDOWN_REASONS,
)


@dataclass(frozen=True)
class DeviceState:
    """The newest state of one accelerator of this run."""

    label: str  # "GPU 0", "HPU 3", with the host when the run spans several
    util_pct: float | None
    mem_share: float | None  # used / total
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    slowdown: tuple[str, ...]  # thermal / hardware reasons seen in most recent samples
    power_capped: bool  # sw_power_cap while busy in most recent samples
    power_w: float | None
    power_limit_w: float | None


def _mem_share(used: int | None, total: int | None) -> float | None:
    return used / total if used is not None and total else None


def _ours(gpu: GpuSample) -> bool:
    """A GPU on the node that the run holds no memory on is someone else's."""
    return gpu.state == "ok" and gpu.training_mem_bytes != 0


def _reasons(samples: Sequence[GpuSample]) -> tuple[tuple[str, ...], bool]:
    """Slowdown reasons present in at least THROTTLE_SAMPLE_SHARE of the samples."""
    reported = [g for g in samples if g.throttle_reasons is not None]
    if not reported:
        return (), False
    need = THROTTLE_SAMPLE_SHARE * len(reported)
    counts: dict[str, int] = {}
    capped = 0
    for g in reported:
        names = {r.lower() for r in g.throttle_reasons or ()}
        for name in names & THROTTLE_SLOWDOWN_REASONS:
            counts[name] = counts.get(name, 0) + 1
        busy = g.util_pct is not None and g.util_pct >= BUSY_UTIL_PCT
        if busy and names & THROTTLE_POWER_CAP_REASONS:
            capped += 1
    slowdown = tuple(sorted(n for n, c in counts.items() if c >= need))
    return slowdown, capped >= need


def own_device(
    systems: Sequence[SystemSample], device: DeviceRef | None
) -> tuple[tuple[str, int] | None, str | None]:
    """The (kind, index) of the run's own accelerator in the samples, and a note when it
    cannot be matched (then every accelerator the run holds memory on is judged).

    The uuid decides when both sides have one (indices differ under CUDA_VISIBLE_DEVICES);
    else the physical index the probe reported.
    """
    if device is None:
        return None, None
    kind = "GPU" if device.kind == "cuda" else "HPU"
    for s in reversed(systems):
        listed: Sequence[GpuSample | HpuSample] = s.gpus if kind == "GPU" else s.hpus
        for d in listed:
            if device.uuid is not None and d.uuid is not None:
                if d.uuid == device.uuid:
                    return (kind, d.index), None
            elif device.index is not None and d.index == device.index:
                return (kind, d.index), None
    which = device.uuid or (f"{kind} {device.index}" if device.index is not None else kind)
    return None, f"own device {which} not in the node sample: all {kind}s of the run judged"


def device_states(
    systems: Sequence[SystemSample], now: float, own: tuple[str, int] | None = None
) -> list[DeviceState]:
    """The run's accelerators; only its own one when ``own`` (kind, index) is given."""
    recent = [s for s in systems if s.time >= now - SYSTEM_WINDOW_S]
    hosts = {s.host for s in recent}
    gpus: dict[tuple[str, int], list[GpuSample]] = {}
    hpus: dict[tuple[str, int], HpuSample] = {}
    for s in recent:
        for g in s.gpus:
            gpus.setdefault((s.host, g.index), []).append(g)
        for h in s.hpus:
            hpus[(s.host, h.index)] = h  # samples are oldest first: newest wins

    def label(kind: str, host: str, index: int) -> str:
        return f"{kind} {index}" if len(hosts) < 2 else f"{host} {kind} {index}"

    states: list[DeviceState] = []
    for (host, index), seen in sorted(gpus.items()):
        newest = seen[-1]
        if own is not None and own != ("GPU", index):
            continue
        if own is None and not _ours(newest):
            continue
        slowdown, capped = _reasons(seen)
        states.append(
            DeviceState(
                label=label("GPU", host, index),
                util_pct=newest.util_pct,
                mem_share=_mem_share(newest.mem_used_bytes, newest.mem_total_bytes),
                mem_used_bytes=newest.mem_used_bytes,
                mem_total_bytes=newest.mem_total_bytes,
                slowdown=slowdown,
                power_capped=capped,
                power_w=newest.power_w,
                power_limit_w=newest.power_limit_w,
            )
        )
    for (host, index), h in sorted(hpus.items()):
        # A lost HPU, or one whose figures hl-smi stopped updating, is not judged on the
        # figures it had: a hung hl-smi's last "util 0 %" is no starved device.
        if h.state != "ok" or (own is not None and own != ("HPU", index)):
            continue
        states.append(
            DeviceState(
                label=label("HPU", host, index),
                util_pct=h.util_pct,
                mem_share=_mem_share(h.mem_used_bytes, h.mem_total_bytes),
                mem_used_bytes=h.mem_used_bytes,
                mem_total_bytes=h.mem_total_bytes,
                slowdown=(),
                power_capped=False,
                power_w=h.power_w,
                power_limit_w=h.power_max_w,
            )
        )
    return states
