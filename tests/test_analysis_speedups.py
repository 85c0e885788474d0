"""The analyzer's hot helpers were rewritten for speed (no list built step by step, no
call per step to ``min``, no ``statistics.median`` per core): each must give exactly what
its plain form gave, kept here as the reference, on any input (NaN and infinities too)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe.messages import StepRecord
from gputop_dl.tui.analysis import host, steps
from gputop_dl.tui.analysis.thresholds import CHUNK_S, CONFIDENCE_HORIZON_S, SKIP_FIRST_STEPS


def agreeing_time_reference(
    records: Sequence[StepRecord], agrees: Callable[[Sequence[StepRecord]], bool]
) -> float:
    total = 0.0
    chunk: list[StepRecord] = []
    chunk_s: float = 0
    for step in reversed(records):
        if total + chunk_s >= CONFIDENCE_HORIZON_S:
            break
        chunk.append(step)
        chunk_s += step.period_s
        if chunk_s >= CHUNK_S:
            if not agrees(chunk):
                return total
            total += chunk_s
            chunk, chunk_s = [], 0
    if chunk and agrees(chunk):
        total += chunk_s
    return total


def _share(parts: Sequence[float], wholes: Sequence[float]) -> float | None:
    whole = sum(wholes)
    return sum(parts) / whole if parts and whole > 0 else None


def lost_share_reference(records: Sequence[StepRecord]) -> float | None:
    both = [s for s in records if s.device_idle_s is not None and s.wait_s is not None]
    if both:
        return _share(
            [min(s.device_idle_s or 0.0, s.wait_s or 0.0) for s in both],
            [s.period_s for s in both],
        )
    waited = [s for s in records if s.wait_s is not None]
    return _share([min(s.wait_s or 0.0, s.period_s) for s in waited], [s.period_s for s in waited])


def usable_reference(records: Sequence[StepRecord]) -> list[StepRecord]:
    return [
        s
        for s in records
        if s.index >= SKIP_FIRST_STEPS and s.period_s > 0 and math.isfinite(s.period_s)
    ]


def idlest_reference(idle: dict[int, list[float]]) -> tuple[int, float] | None:
    if not idle:
        return None
    index, values = max(idle.items(), key=lambda kv: (statistics.median(kv[1]), -kv[0]))
    return index, statistics.median(values)


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (the reference's result must be reproduced bit for bit)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return a == b


seconds = st.one_of(
    st.floats(min_value=0.0, max_value=3.0),
    st.sampled_from([0.0, -0.0, math.nan, math.inf, -1.0, 1e-9]),
)
records = st.lists(
    st.builds(
        StepRecord,
        index=st.integers(0, 5),
        end_time=st.just(100.0),
        period_s=seconds,
        wait_s=st.one_of(st.none(), seconds),
        device_idle_s=st.one_of(st.none(), seconds),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(records, st.floats(0.0, 1.0))
def test_agreeing_time_and_lost_share_are_the_plain_forms(
    recs: list[StepRecord], threshold: float
) -> None:
    seen: list[list[StepRecord]] = []
    seen_reference: list[list[StepRecord]] = []

    def agrees(into: list[list[StepRecord]], share: Callable[..., float | None]) -> Callable:
        def check(chunk: Sequence[StepRecord]) -> bool:
            into.append(list(chunk))
            value = share(chunk)
            return value is not None and value >= threshold

        return check

    got = steps.agreeing_time(recs, agrees(seen, steps.lost_share))
    want = agreeing_time_reference(recs, agrees(seen_reference, lost_share_reference))
    assert same(got, want)
    assert seen == seen_reference  # the same chunks, in the same order
    for chunk in seen:
        assert same(steps.lost_share(chunk), lost_share_reference(chunk))


@settings(max_examples=300, deadline=None)
@given(records)
def test_usable_steps_and_step_stats_are_the_plain_forms(recs: list[StepRecord]) -> None:
    assert steps.usable_steps(recs) == usable_reference(recs)
    usable = usable_reference(recs)
    if usable:
        stats = steps.step_stats(usable)
        kept = steps.trim_outlier(steps.recent(usable), usable[-300:])
        waited = [s for s in kept if s.wait_s is not None]
        waits = [min(s.wait_s or 0.0, s.period_s) for s in waited]
        assert same(stats.wait_share, _share(waits, [s.period_s for s in waited]))
        assert same(stats.mean_wait_s, sum(waits) / len(waits) if waits else None)
        both = [s for s in kept if s.device_idle_s is not None and s.wait_s is not None]
        idle = [min(s.device_idle_s or 0.0, s.wait_s or 0.0) for s in both]
        assert same(stats.idle_share, _share(idle, [s.period_s for s in both]) if both else None)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 63),
        st.lists(st.floats(0.0, 100.0), min_size=1, max_size=7),
        max_size=64,
    )
)
def test_idlest_core_is_the_plain_form(idle: dict[int, list[float]]) -> None:
    figures = [
        host.SampleFigures(
            **{**_EMPTY, "idle": tuple((i, v[k]) for i, v in idle.items() if k < len(v))}
        )
        for k in range(7)
    ]
    expected_idle: dict[int, list[float]] = {}
    for f in figures:
        for index, value in f.idle:
            expected_idle.setdefault(index, []).append(value)
    assert host._idlest_of(figures) == idlest_reference(expected_idle)


_EMPTY = {field: None for field in host.SampleFigures.__dataclass_fields__}
