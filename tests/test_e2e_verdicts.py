"""End to end: a real PyTorch training on the CPU with the real probe, the truth set by
construction, and ``gputop snapshot --json`` (the real CLI) must name it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from gputop_dl.tui.cli import start_demo, stop_child
from tests.wire_reader import WireReader

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def snapshot(endpoint: str, wait: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--json", "--wait", str(wait), endpoint],
        capture_output=True,
        text=True,
        timeout=wait + 60,
    )
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def wait_for_steps(endpoint: str, count: int, timeout: float) -> None:
    """Block until the training has published ``count`` steps (data set up, warm)."""
    reader = WireReader(endpoint)
    deadline = time.monotonic() + timeout
    try:
        while len(reader.steps()) < count:
            assert time.monotonic() < deadline, "the demo training published no steps"
            reader.pump(0.5)
    finally:
        reader.close()


def verdict_of(snap: dict[str, Any]) -> dict[str, Any]:
    runs = [r for r in snap["runs"] if r["state"] == "live"]
    assert len(runs) == 1, snap["runs"]
    verdict: dict[str, Any] = runs[0]["verdict"]
    assert verdict is not None
    return verdict


@pytest.mark.parametrize(
    ("scenario", "kind", "causes"),
    [
        ("input-bound", "input-bound", {"few-workers"}),
        ("compute-bound", "compute-bound", {None}),
        ("disk-bound", "input-bound", {"disk"}),
    ],
)
def test_scenario_gives_the_right_verdict(
    scenario: str, kind: str, causes: set[str | None]
) -> None:
    child, endpoint, log = start_demo(scenario)
    try:
        wait_for_steps(endpoint, 3, timeout=180)
        verdict = verdict_of(snapshot(endpoint, wait=10))
    finally:
        stop_child(child)
    assert verdict["kind"] == kind, (verdict, log.read_text()[-2000:])
    assert verdict["cause"] in causes, verdict
    assert verdict["evidence"], verdict
    if kind == "input-bound":
        assert verdict["advice"] and verdict["headroom"], verdict


def test_a_hung_step_is_reported_as_stalled_with_its_length() -> None:
    child, endpoint, _ = start_demo("stall", extra=["--stall-after", "6"])
    try:
        wait_for_steps(endpoint, 3, timeout=180)
        time.sleep(8)  # past the hang's start
        verdict = verdict_of(snapshot(endpoint, wait=15))
    finally:
        stop_child(child)
    assert verdict["kind"] == "stalled", verdict
    assert verdict["severity"] == "critical"
    assert "no step for" in verdict["headline"], verdict
