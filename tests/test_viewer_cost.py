"""What the viewer skips or keeps to stay cheap must never change what it shows.

Each shortcut taken for CPU's sake (figures kept per node sample, text built without
Rich's sanitizing copy, panels not rebuilt, the analyzer not re-run) has a test here
that fails when the shortcut shows something stale or different.
"""

from __future__ import annotations

import dataclasses

import pytest
from fakes_tui import HOST, LONG_INPUT_BOUND, T0, FakeSource, live_run, system_sample
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text

from gputop_dl.probe.samples import CpuCore, CpuSample
from gputop_dl.tui import state as tui_state
from gputop_dl.tui.analysis import host
from gputop_dl.tui.analysis.host import Scope, figures_of, host_stats, sample_figures
from gputop_dl.tui.analyzer import Verdict, Window
from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.state import SAMPLES_UNIT, ThroughputPoint
from gputop_dl.tui.widgets.banner import Banner
from gputop_dl.tui.widgets.base import line_segments, same_line, trusted_text
from gputop_dl.tui.widgets.throughput import _scrolled

WIDE = (200, 50)


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


def test_span_styles_kept_across_lines_give_the_segments_of_a_fresh_combination() -> None:
    """A panel keeps its span styles combined with its base style from line to line; a
    line with a style of its own is combined afresh (the kept ones would miss it)."""
    base = Style(color="white", bgcolor="black")
    dim, bold = Style(dim=True), Style(bold=True)
    lines = [
        Text("cpu 0 ███  12%", spans=[Span(0, 5, dim), Span(6, 9, bold)]),
        Text(" 1 █  3%", spans=[Span(0, 3, dim), Span(3, 4, bold), Span(6, 99, "red")]),
        Text("all lost", "italic", spans=[Span(4, 8, dim)]),
        Text("tabs\there", spans=[Span(0, 2, dim)]),
        Text("overlap", spans=[Span(0, 4, dim), Span(2, 6, bold)]),
        Text(""),
    ]
    kept: dict[Style | str, Style | None] = {}
    for line in lines:
        assert line_segments(line, base, kept) == line_segments(line, base)
    assert line_segments(lines[2], base, kept) == [
        Segment("all ", base + Style(italic=True)),
        Segment("lost", base + Style(italic=True) + dim),
    ]
    assert set(kept) == {dim, bold, "red"}  # from the lines without a style of their own


def _screen_text(panel: Banner) -> str:
    return "\n".join(line.plain for line in panel.lines(panel.size.width))


async def test_the_banner_is_rebuilt_only_when_what_it_shows_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run summary changes at every refresh; the banner's lines only when the verdict,
    the connection or the verdict's age (as shown: "for 2.0s") do."""

    def analyze(window: Window, previous: Verdict | None = None) -> Verdict:
        return LONG_INPUT_BOUND

    monkeypatch.setattr(tui_state, "analyze", analyze)
    now = [T0 + 60.0]
    source = FakeSource()
    app = GputopApp(source, local_host=HOST, clock=lambda: now[0], refresh_hz=0)
    builds = 0
    build = Banner.build

    def counting(self: Banner, width: int) -> list[Text]:
        nonlocal builds
        builds += 1
        return build(self, width)

    monkeypatch.setattr(Banner, "build", counting)
    async with app.run_test(size=WIDE) as pilot:
        source.push(live_run(now[0]))
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        assert "for " not in _screen_text(app.banner)  # shown less than a second
        before = builds
        app._show()  # nothing new: the same run summary, the same clock
        app._show()
        assert builds == before
        now[0] += 2.0  # no message, but the verdict has now held for 2 s: it says so
        app.state.tick(now[0])
        app._show()
        await pilot.pause()
        assert "for 2.0s" in _screen_text(app.banner)
        assert builds == before + 1


async def test_a_bar_is_styled_again_only_for_the_same_look() -> None:
    app = GputopApp(FakeSource(), local_host=HOST, clock=lambda: T0, refresh_hz=0)
    async with app.run_test(size=WIDE):
        cpu = app.cpu
        half = cpu.bar_parts([0.5, 0.1], 8, ["cpu--user", "cpu--system"])
        assert cpu.bar_parts([0.501, 0.1], 8, ["cpu--user", "cpu--system"]) is half  # same eighths
        more = cpu.bar_parts([0.52, 0.1], 8, ["cpu--user", "cpu--system"])
        assert "".join(text for text, _ in more) != "".join(text for text, _ in half)
        other = cpu.bar_parts([0.5, 0.1], 8, ["cpu--system", "cpu--user"])  # other colours
        assert [style for _, style in other] != [style for _, style in half]
        cpu.notify_style_update()  # a theme change: styled again with the new styles
        assert cpu.bar_parts([0.5, 0.1], 8, ["cpu--user", "cpu--system"]) is not half


def _point(k: int, rate: float | None, wait: float | None = 0.2) -> ThroughputPoint:
    return ThroughputPoint(T0 + 0.5 * k, rate, None if rate is None else rate / 32, wait, 0.5)


def _fresh(points: tuple[ThroughputPoint, ...], key: tuple[float, int, str]) -> tuple[object, ...]:
    glyphs = _scrolled(None, key, points, [p.samples_per_s for p in points])
    return glyphs.rows, glyphs.waits


def test_a_scrolled_graph_is_the_graph_drawn_afresh() -> None:
    """The glyphs kept from the last build, for the points still shown, are those a full
    redraw gives: after a scroll, a replaced point, a new scale, a jump, a gap."""
    key = (4000.0, 6, SAMPLES_UNIT)
    points = tuple(_point(k, 1000.0 + 97.0 * (k % 7), 0.1 * (k % 4)) for k in range(30))
    replaced = _point(24, 3900.0, None)  # the newest bucket, completed since: new object
    unknown = _point(31, None, None)
    cases = [
        (points[:20], key),
        (points[1:21], key),  # scrolled by one
        (points[4:24], key),  # by three
        ((*points[5:24], replaced), key),  # the last point replaced
        ((*points[6:24], replaced, unknown), key),  # an unknown rate (blank column)
        ((*points[6:24], replaced, unknown), (8000.0, 6, SAMPLES_UNIT)),  # a new scale
        (points[10:30], (8000.0, 6, SAMPLES_UNIT)),  # jumped past the replaced point
        (points[12:30], (8000.0, 4, SAMPLES_UNIT)),  # fewer rows (the screen shrank)
        (points[29:30], (8000.0, 4, SAMPLES_UNIT)),
    ]
    glyphs = None
    for shown, case_key in cases:
        glyphs = _scrolled(glyphs, case_key, shown, [p.samples_per_s for p in shown])
        assert (glyphs.rows, glyphs.waits) == _fresh(shown, case_key)
        assert all(len(row) == len(shown) for row in glyphs.rows)


async def test_the_cpu_grid_draws_kept_bars_as_a_fresh_grid_would() -> None:
    app = GputopApp(FakeSource(), local_host=HOST, clock=lambda: T0, refresh_hz=0)
    async with app.run_test(size=WIDE):
        cpu = app.cpu
        width = 96
        before = system_sample(T0).cpu
        after = _with_busy(system_sample(T0), 50.0).cpu  # type: ignore[attr-defined]
        cpu.show(before, None, None)
        first = cpu.build(width)
        cpu.show(after, None, None)
        kept = cpu.build(width)  # bars of the first sample kept, some reused
        cpu._core_bars.clear()
        cpu._bars.clear()
        fresh = cpu.build(width)
        assert len(kept) == len(fresh) == len(first)
        assert all(same_line(a, b) for a, b in zip(kept, fresh, strict=True))
        assert not same_line(first[1], kept[1])  # the cores changed: so did their row
        assert "█" * 4 in kept[1].plain  # 50 % of an 8-cell bar
