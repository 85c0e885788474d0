"""Render screenshots/ from the real app attached to real demo training runs.

    python tools/screenshots.py screenshots

Each picture is the real GputopApp (headless, fixed terminal size) attached over ZeroMQ
to a real CPU training started with ``gputop demo``'s launcher, saved once the analyzer
has a verdict. The ``simulated-*`` set runs the same training with the test fakes in
place of the accelerators (8 NVIDIA GPUs through the fake NVML, 8 Gaudi HPUs through the
fake ``hl-smi``), because no machine here has either: their figures are made up, the rest
of the screen is real.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop_dl.tui.app import GputopApp  # noqa: E402
from gputop_dl.tui.cli import start_demo, stop_child  # noqa: E402
from gputop_dl.tui.source import ZmqSource  # noqa: E402

SIZES = ((80, 24), (120, 36), (200, 50))
# The demo child imports this before training when simulating accelerators.
SIMULATE = """
import runpy, sys
sys.path.insert(0, {root!r})
from tests.fakes.fake_nvml import FakeNvml
with FakeNvml(8).installed():
    sys.argv = ["train"] + sys.argv[1:]
    runpy.run_module("gputop_dl.tui.demo.train", run_name="__main__")
"""


async def shoot(endpoint: str, out: Path, name: str, settle_s: float) -> None:
    for width, height in SIZES:
        source = ZmqSource([endpoint], discover=False, local_sampler=False)
        app = GputopApp(source, local_host=socket.gethostname())
        async with app.run_test(size=(width, height)) as pilot:
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline:
                await pilot.pause(0.5)
                run = app.state.selected
                verdict = run.verdict if run is not None else None
                settled = time.monotonic() > deadline - settle_s / 2
                if verdict is not None and verdict.kind != "warming-up" and settled:
                    break
            await pilot.pause(1.1)  # one more refresh (app.refresh_view: once a second)
            path = out / f"{name}-{width}x{height}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            print(f"wrote {path}", flush=True)


def run(scenario: str, out: Path, name: str, simulate: bool = False) -> None:
    env_backup = dict(os.environ)
    if simulate:
        fakes = [str(ROOT / "tests" / "fakes"), str(Path(sys.executable).parent)]
        os.environ["PATH"] = os.pathsep.join([*fakes, os.environ["PATH"]])
        os.environ["FAKE_HLSMI_MODEL"] = "HL-225"
    launcher = [sys.executable, "-c", SIMULATE.format(root=str(ROOT))] if simulate else None
    child, endpoint, log = start_demo(scenario, launcher=launcher)
    try:
        asyncio.run(shoot(endpoint, out, name, settle_s=30.0))
    finally:
        stop_child(child)
        log.unlink(missing_ok=True)  # the demo's own exit does this; not left in /tmp
        os.environ.clear()
        os.environ.update(env_backup)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    run("input-bound", out, "demo-input-bound")
    run("compute-bound", out, "demo-compute-bound")
    run("balanced", out, "simulated-8gpu-8hpu-balanced", simulate=True)


if __name__ == "__main__":
    main()
