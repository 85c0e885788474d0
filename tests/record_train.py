"""A small CPU training with the probe and a fault injected: from ``--fault-after`` seconds
on, every batch takes ``--slow`` seconds to load (the loader becomes the bottleneck).
Used by tests/test_record.py: python -m tests.record_train --fault-after 20"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputop_dl import probe


class Slowable(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, fault_at: float, slow_s: float, batch: int) -> None:
        self.fault_at, self.per_sample = fault_at, slow_s / batch

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if time.time() >= self.fault_at:
            time.sleep(self.per_sample)  # a slow disk, a slow decode: the injected fault
        return torch.randn(128), i % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault-after", type=float, default=20.0)
    ap.add_argument("--slow", type=float, default=0.15, help="seconds per batch after the fault")
    ap.add_argument("--duration", type=float, default=120.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch = 32
    start = time.time()
    loader = DataLoader(Slowable(start + args.fault_after, args.slow, batch), batch_size=batch)
    model = nn.Sequential(
        nn.Linear(128, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(), nn.Linear(768, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in probe.watch(loader):
        for _ in range(4):  # ~30-60 ms of compute per step on one core
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if time.time() - start > args.duration:
            break


if __name__ == "__main__":
    main()
