"""The viewer's ingest shortcuts give what the general paths give.

The decoder looks at a row's phases only when some row has them; the throughput buckets
take a step wholly inside the current bucket by a short branch. Each case below feeds the
same records through the shortcut and through the general path and compares.
"""

from __future__ import annotations

import math

import pytest

from gputop_dl.probe.messages import StepRecord, Steps
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.tui.state.throughput import BUCKET_S, Throughput

T0 = 1_700_000_000.0


def rec(
    index: int,
    end: float,
    period: float,
    *,
    wait: float | None = None,
    samples: int | None = 8,
    device: float | None = None,
) -> StepRecord:
    return StepRecord(index, end, period, wait, samples, device)


def test_phases_reach_only_the_rows_that_carry_them() -> None:
    records = (
        rec(1, T0 + 0.01, 0.01),
        StepRecord(2, T0 + 0.02, 0.01, None, 8, phases=(("forward", 0.004), ("backward", 0.005))),
        rec(3, T0 + 0.03, 0.01, wait=0.002, device=0.007),
    )
    decoded = decode(encode(Steps("h:1", records, 0, 0)))
    assert isinstance(decoded, Steps)
    assert [r.phases for r in decoded.records] == [
        (),
        (("forward", 0.004), ("backward", 0.005)),
        (),
    ]
    assert decoded.records[2].wait_s == 0.002 and decoded.records[2].device_s == 0.007
    assert [r.index for r in decoded.records] == [1, 2, 3]


def steady(
    count: int,
    period: float,
    *,
    wait: float | None = None,
    samples: int | None = 8,
    device: float | None = None,
) -> list[StepRecord]:
    return [
        rec(i, T0 + (i + 1) * period, period, wait=wait, samples=samples, device=device)
        for i in range(count)
    ]


CASES: dict[str, list[StepRecord]] = {
    "steady, many per bucket": steady(300, 1 / 150, wait=0.002, device=0.004),
    "no wait, no device, no batch size": steady(120, 0.01, samples=None),
    "device longer than the period is cut to it": steady(100, 0.01, device=0.05),
    "steps across bucket boundaries": steady(40, 0.13, wait=0.05),
    "zero periods are skipped": [
        rec(i, T0 + 0.01 * i, 0.0 if i % 3 == 0 else 0.01) for i in range(1, 90)
    ],
    "some report a wait, some do not": [
        rec(i, T0 + 0.01 * i, 0.01, wait=0.003 if i % 2 else None) for i in range(1, 120)
    ],
    "one step longer than the whole history": [
        *steady(20, 0.01),
        rec(20, T0 + 30.0, 29.0, wait=1.0),
        rec(21, T0 + 30.01, 0.01),
    ],
}


def points(batches: list[list[StepRecord]], max_points: int = 40) -> list[tuple[float, ...]]:
    throughput = Throughput(max_points)
    for batch in batches:
        throughput.add(batch)
        assert throughput.last_end is not None
        throughput.finish_until(throughput.last_end)
    return [
        (
            p.end,
            p.samples_per_s or 0.0,
            p.steps_per_s or 0.0,
            -1.0 if p.wait_share is None else p.wait_share,
            -1.0 if p.device_share is None else p.device_share,
            p.covered_s,
        )
        for p in throughput.points
    ]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("batch", [15, 4, 1000])
def test_batches_give_the_points_of_one_step_at_a_time(name: str, batch: int) -> None:
    records = CASES[name]
    one_by_one = points([[r] for r in records])  # each step alone: the general branch
    batched = points([records[i : i + batch] for i in range(0, len(records), batch)])
    assert len(batched) == len(one_by_one) > 0
    for got, expected in zip(batched, one_by_one, strict=True):
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_a_step_in_one_bucket_counts_whole_and_its_shares_are_exact() -> None:
    throughput = Throughput(10)
    base = math.floor(T0 / BUCKET_S) * BUCKET_S
    # Ten steps of 0.04 s inside one bucket, a wait of 0.01 and device time of 0.03 each.
    batch = [rec(i, base + 0.04 * (i + 1), 0.04, wait=0.01, device=0.03) for i in range(10)]
    throughput.add(batch)
    throughput.finish_until(base + 2 * BUCKET_S)
    first = throughput.points[0]
    assert first.covered_s == pytest.approx(0.4)  # the run's first bucket: what steps covered
    assert first.steps_per_s == pytest.approx(10 / 0.4)
    assert first.samples_per_s == pytest.approx(80 / 0.4)
    assert first.wait_share == pytest.approx(0.25, rel=1e-12)
    assert first.device_share == pytest.approx(0.75, rel=1e-12)
