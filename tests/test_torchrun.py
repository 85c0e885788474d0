"""A real two-rank DDP job under torchrun (gloo, CPU): rank 1's data turns slow and
``gputop snapshot --json`` names it as the job's straggler, with every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gputop_dl.probe import discovery
from gputop_dl.tui.snapshot import render_text

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    from gputop_dl import probe

    SLOW, STOP = Path(sys.argv[1]), Path(sys.argv[2])
    RANK = int(os.environ["RANK"])


    class Data(Dataset):
        def __len__(self):
            return 10**6

        def __getitem__(self, i):
            if RANK == 1 and SLOW.exists():
                time.sleep(0.005)  # rank 1's storage turns slow: 40 ms a batch of 8
            return torch.randn(16), torch.randn(1)


    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=8, num_workers=0)
    for x, y in probe.watch(loader):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces here: rank 0 waits for rank 1 inside it
        opt.step()
        time.sleep(0.02)  # the step's own compute
        stop = torch.tensor([float(STOP.exists())])
        dist.all_reduce(stop)  # both ranks leave at the same step
        if stop.item() > 0:
            break
    dist.destroy_process_group()
    """
)


def snapshot(wait: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gputop_dl", "snapshot", "--json", "--wait", str(wait)],
        capture_output=True,
        text=True,
        timeout=wait + 60,
    )
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_torchrun_job_names_the_slow_rank(tmp_path: Path) -> None:
    script = tmp_path / "train_ddp.py"
    script.write_text(TRAIN)
    slow, stop = tmp_path / "slow", tmp_path / "stop"
    log = (tmp_path / "torchrun.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPUTOP_NAME": "ddp"}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(slow),
            str(stop),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while len([r for r in discovery.discover() if r.role == "probe"]) < 2:
            assert child.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the two ranks never registered"
            time.sleep(0.2)

        before = snapshot(wait=2)["job"]
        assert before is not None, "no job grouped"
        assert before["verdict"]["kind"] in ("alike", "waiting"), before["verdict"]
        assert before["straggler"] is None

        slow.touch()  # from now on, rank 1 waits 40 ms a step for its data
        snap = snapshot(wait=4)  # steps of the 4 s after the condition began
        job = snap["job"]
        stop.touch()
        assert child.wait(timeout=60) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        log.close()
    assert job["id"].startswith("torchrun:"), job["id"]
    assert job["world_size"] == 2
    assert [row["rank"] for row in job["ranks"]] == [0, 1]
    assert {row["local_rank"] for row in job["ranks"]} == {0, 1}
    verdict = job["verdict"]
    assert verdict["kind"] == "straggler", verdict
    assert job["straggler"]["rank"] == 1
    assert verdict["headline"].startswith(f"rank 1 on {job['straggler']['host']} is "), verdict
    assert verdict["cause"].startswith("input-bound"), verdict
    slow_row, fast_row = job["ranks"][1], job["ranks"][0]
    assert slow_row["slow"] and not fast_row["slow"]
    assert slow_row["wait_share"] > 0.3 > fast_row["wait_share"]
    # In DDP the fast rank waits inside the collective: both step at the same pace
    assert slow_row["step_s"] == pytest.approx(fast_row["step_s"], rel=0.3)
    (line,) = [line for line in render_text(snap).splitlines() if line.startswith("job ")]
    assert line.startswith(f"job {job['id']} (2 of 2 ranks on 1 host) straggler: rank 1 on")
