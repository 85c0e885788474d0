"""Panels reuse what they built for figures that did not change, and show the same as a
panel that builds everything anew (the viewer's refresh cost, without a timer)."""

from __future__ import annotations

from dataclasses import replace

from fakes_tui import FakeSource, live_run, system_sample
from rich.text import Text

from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.widgets.accelerators import AcceleratorsPanel, Device

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
