"""What the viewer skips or keeps to stay cheap must never change what it shows.

Each shortcut taken for CPU's sake (figures kept per node sample, text built without
Rich's sanitizing copy, panels not rebuilt, the analyzer not re-run) has a test here
that fails when the shortcut shows something stale or different.
"""

from __future__ import annotations

import dataclasses

from fakes_tui import T0, system_sample
from rich.style import Style
from rich.text import Span, Text

from gputop_dl.probe.samples import CpuCore, CpuSample
from gputop_dl.tui.analysis import host
from gputop_dl.tui.analysis.host import Scope, figures_of, host_stats, sample_figures
from gputop_dl.tui.widgets.base import line_segments, same_line, trusted_text


def _with_busy(sample: object, busy: float) -> object:
    """The same sample with every core ``busy`` % busy (a new object, equal fields but these)."""
    cpu = sample.cpu  # type: ignore[attr-defined]
    cores = tuple(CpuCore(c.index, busy, 0.0, 0.0, 0.0, 100.0 - busy) for c in cpu.cores)
    return dataclasses.replace(sample, cpu=CpuSample(cores, cpu.load_avg))  # type: ignore[type-var]


def test_figures_are_kept_per_sample_and_scope() -> None:
    sample = system_sample(T0)
    scope = Scope(affinity=frozenset({0, 1, 2, 3}))
    first = figures_of(sample, scope)
    assert figures_of(sample, scope) is first  # kept
    assert first == sample_figures(sample, scope)
    other = figures_of(sample, Scope())  # another rank's scope on the same sample
    assert other.usable_cores == 64 and first.usable_cores == 4


def test_a_new_sample_is_never_judged_on_the_figures_of_an_old_one() -> None:
    idle = _with_busy(system_sample(T0), 5.0)
    busy = _with_busy(system_sample(T0), 95.0)
    scope = Scope()
    assert figures_of(idle, scope).pinned_cores == 0  # type: ignore[arg-type]
    assert figures_of(busy, scope).pinned_cores == 64  # type: ignore[arg-type]
    # The window moves on: the stats follow the samples in it, not the memo.
    before = host_stats([idle, idle], None, T0 + 1)  # type: ignore[list-item]
    after = host_stats([busy, busy], None, T0 + 1)  # type: ignore[list-item]
    assert before.free_cores is not None and before.free_cores > 60
    assert after.free_cores is not None and after.free_cores < 4
    assert after.pinned_cores == 64


def test_host_stats_are_the_same_whether_kept_or_computed() -> None:
    samples = [system_sample(T0 + k) for k in range(6)]
    scope = Scope(affinity=frozenset(range(8)), quota_cores=6.0, worker_pids=frozenset({4301}))
    host._memo.clear()
    cold = host_stats(samples, None, T0 + 6, scope)
    warm = host_stats(samples, None, T0 + 6, scope)
    assert cold == warm
    assert warm.idlest_core is not None and warm.n_cores == 8 and warm.worker_count == 1


def test_the_memo_is_bounded() -> None:
    host._memo.clear()
    for k in range(host.MAX_MEMO + 10):
        figures_of(system_sample(T0 + k, core_count=1, gpu_count=0), Scope())
    assert 0 < len(host._memo) <= host.MAX_MEMO


def test_trusted_text_is_the_text_rich_would_build() -> None:
    bold = Style(bold=True)
    plain = "12 ┤▆▆█▇ wait"
    spans = [Span(4, 8, bold)]
    ours = trusted_text(plain, list(spans), "dim")
    rich = Text(plain, "dim", spans=list(spans))
    assert same_line(ours, rich)
    assert ours.cell_len == rich.cell_len and len(ours) == len(rich)
    assert line_segments(ours, Style()) == line_segments(rich, Style())
    ours.append(" more", bold)  # and it stays a working Text
    rich.append(" more", bold)
    assert same_line(ours, rich)
