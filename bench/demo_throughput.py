"""Demo training throughput with the probe vs without, interleaved repeats.

The ``bench`` demo scenario trains a small CNN on cached tensors: a ~10 ms CPU step,
where any probe cost would show. Each run trains the same number of steps in a fresh
process; throughput is measured inside the training process. Goal: >= 99.5 %.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 400
PAIRS = 7


def run(with_probe: bool, result: Path) -> float:
    cmd = [
        sys.executable,
        "-m",
        "gputop_dl.tui.demo.train",
        "--scenario",
        "bench",
        "--batch-size",
        "16",
        "--steps",
        str(STEPS),
        "--result",
        str(result),
    ]
    if not with_probe:
        cmd.append("--no-probe")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = json.loads(result.read_text())
    return float(data["samples"]) / float(data["seconds"])


def main() -> None:
    ratios, bare_rates, probe_rates = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        run(False, out)  # warm the page cache and torch's first-import cost
        for i in range(PAIRS):
            # alternate the order so drift on the machine does not favour one side
            first_probe = i % 2 == 1
            a = run(first_probe, out)
            b = run(not first_probe, out)
            with_probe, without = (a, b) if first_probe else (b, a)
            probe_rates.append(with_probe)
            bare_rates.append(without)
            ratios.append(with_probe / without)
    step_ms = 16 / statistics.median(bare_rates) * 1000
    print(
        f"demo throughput with probe: {100 * statistics.median(ratios):.2f} % of without "
        f"(pairs ranged {100 * min(ratios):.1f}-{100 * max(ratios):.1f} %) "
        f"(median of {PAIRS} interleaved pairs, {STEPS} steps of ~{step_ms:.1f} ms; "
        f"with {statistics.median(probe_rates):.0f}, "
        f"without {statistics.median(bare_rates):.0f} samples/s)"
    )


if __name__ == "__main__":
    main()
