"""End to end: a real training subprocess with the real probe, the real app attached over
a real ZeroMQ socket; the step counter and samples/s must advance on screen."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from gputop_dl.tui.app import GputopApp
from gputop_dl.tui.source import ZmqSource

TRAIN = """
from gputop_dl import probe; import time, numpy
batches = [numpy.zeros((8, 3))] * 100000   # 8 samples per batch
for batch in probe.watch(batches):
    time.sleep(0.02)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def screen_text(app: GputopApp) -> str:
    """What a person would read: the rendered screen, without styling."""
    svg = app.export_screenshot()
    text = re.sub(r"<[^>]+>", "", svg)
    return text.replace("&#160;", " ").replace("&nbsp;", " ")


async def test_app_attached_to_a_real_probe_shows_steps_advancing() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAIN],
        env={**os.environ, "GPUTOP_LISTEN": endpoint, "GPUTOP_NAME": "e2e-run"},
    )
    try:
        app = GputopApp(
            ZmqSource([endpoint], discover=False, local_sampler=False),
            local_host=socket.gethostname(),
        )
        async with app.run_test(size=(120, 36)) as pilot:
            counts = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(counts) < 2:
                await pilot.pause(1.0)
                run = app.state.selected
                moving = run is not None and run.step_count > 0 and run.rate_now is not None
                if moving and (not counts or run.step_count > counts[-1] + 10):
                    counts.append(run.step_count)
            assert len(counts) == 2, "the step counter did not advance"
            run = app.state.selected
            assert run is not None
            assert run.name == "e2e-run" and run.connection.state == "live"
            # 8 samples per ~20 ms step: about 400 samples/s
            assert run.rate_now is not None and 200 < run.rate_now < 450, run.rate_now
            screen = screen_text(app)
            assert "e2e-run" in screen
            assert f"{run.step_count:,}" in screen or str(run.step_count) in screen
            assert "samples/s" in screen
    finally:
        trainer.kill()
        trainer.wait()


@pytest.mark.parametrize(
    "garbage", [[b"gputop.steps", b"\xc1"], [b"gputop.bye", b"\x93\x01\x02\x03"]]
)
async def test_malformed_messages_are_shown_and_the_app_keeps_running(garbage: list[bytes]) -> None:
    import zmq  # the test plays a broken publisher

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    try:
        app = GputopApp(
            ZmqSource([endpoint], discover=False, local_sampler=False), local_host="here"
        )
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not app.state.errors:
                pub.send_multipart(garbage)
                await pilot.pause(0.3)
            assert app.state.errors and "malformed" in app.state.errors[-1].text
            await pilot.pause(0.6)
            assert "malformed" in screen_text(app)
            assert app.is_running
    finally:
        pub.close()
        ctx.term()
