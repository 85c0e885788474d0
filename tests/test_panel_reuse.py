"""Panels reuse what they built for figures that did not change, and show the same as a
panel that builds everything anew (the viewer's refresh cost, without a timer)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fakes_tui import FakeSource, live_run, system_sample
from rich.control import strip_control_codes
from rich.text import Text

from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.widgets import accelerators
from gputop_dl.tui.widgets.accelerators import AcceleratorsPanel, Device
from gputop_dl.tui.widgets.base import Part, trusted_copy

NOW = 1_700_000_060.0
WIDE = (200, 50)


def looks(lines: list[Text]) -> list[tuple[str, list[object]]]:
    return [(line.plain, list(line.spans)) for line in lines]


async def test_accelerator_rows_rebuilt_only_for_changed_devices_and_show_the_same() -> None:
    source = FakeSource()
    app = GputopApp(source, local_host="node-a", clock=lambda: NOW)
    async with app.run_test(size=WIDE) as pilot:
        source.push(live_run(NOW))
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        panel = app.query_one(AcceleratorsPanel)
        width = panel.content_size.width
        built: list[Device] = []
        row = panel._row

        def counting_row(device: Device, width: int, show_name: bool) -> Text:
            built.append(device)
            return row(device, width, show_name)

        panel._row = counting_row  # type: ignore[method-assign]
        sample = system_sample(NOW + 1)
        gpus = list(sample.gpus)
        gpus[3] = replace(gpus[3], util_pct=(gpus[3].util_pct or 0.0) / 2 + 1.0)
        changed = replace(sample, gpus=tuple(gpus))
        panel.show(changed)
        first = looks(panel.lines(width))
        before = len(built)
        # One device changed since the last build: only its row is formatted again.
        gpus[3] = replace(gpus[3], util_pct=99.0)
        panel.show(replace(changed, gpus=tuple(gpus)))
        second = looks(panel.lines(width))
        assert [device.index for device in built[before:]] == [3]
        # The same as a panel that builds every row anew.
        panel._rows = {}
        panel._lines_key = None
        assert looks(panel.lines(width)) == second
        assert first != second
        assert "99%" in second[3][0]


NAMES = [
    "NVIDIA H100 80GB HBM3",
    "Intel Gaudi 3",
    "",
    "bell\x07 and back\x08space",
    "carriage\rreturn",
    "\x1b[31mred\x1b[0m",
    "form\x0cfeed\x0bvtab",
]


@pytest.mark.parametrize("name", NAMES)
async def test_an_accelerator_row_is_sanitized_as_rich_sanitizes_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row is made without Rich's sanitizing copy only when its one string from the
    wire, the device name, holds no control code: the same row as Rich's either way."""
    source = FakeSource()
    app = GputopApp(source, local_host="node-a", clock=lambda: NOW)
    async with app.run_test(size=WIDE) as pilot:
        source.push(live_run(NOW))
        await pilot.pause()
        panel = app.query_one(AcceleratorsPanel)
        device = Device("GPU", 3, name, None, None, 42.0, 10 << 30, 80 << 30, 300.0, 700.0, 90.0)
        device = replace(device, throttle=("thermal",))
        plain_assemble = accelerators.assemble

        def sanitizing(parts: list[Part], trusted: bool = False) -> Text:
            return plain_assemble(parts)  # Rich sanitizes whatever the row says

        for width in (200, 100, 50):
            got = panel._row(device, width, True)
            with monkeypatch.context() as patched:
                patched.setattr(accelerators, "assemble", sanitizing)
                want = panel._row(device, width, True)
            assert (got.plain, got.spans, got.style) == (want.plain, want.spans, want.style)
            assert strip_control_codes(got.plain) == got.plain
            copy = trusted_copy(got)
            assert (copy.plain, copy.spans, copy.style, copy.end) == (
                got.plain,
                got.spans,
                got.style,
                got.end,
            )
