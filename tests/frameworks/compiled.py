"""A torch.compile'd model trained with and without watch, while the probe's process
collector samples the tree (inductor's compile workers and g++ are children too).

Prints one JSON line: the losses of both runs, and every (pid, name, role) seen.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from gputop_dl import probe
from gputop_dl.probe.collectors.processes import ProcessCollector

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
INITIAL = {k: v.clone() for k, v in MODEL.state_dict().items()}
COMPILED = torch.compile(MODEL)  # compiled once: the second run reuses the compiled code


def train(p: probe.Probe | None) -> list[float]:
    model, step_fn = MODEL, COMPILED
    model.load_state_dict(INITIAL)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = torch.linspace(-1, 1, 48).reshape(12, 4)
    loader = DataLoader(
        TensorDataset(xs, xs.sum(1, keepdim=True)),
        batch_size=4,
        shuffle=True,
        num_workers=1,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    watched: Any = p.watch(loader) if p is not None else loader
    losses = []
    for _ in range(2):
        for x, y in watched:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(step_fn(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return losses


def main() -> None:
    p = probe.Probe(name="compiled", system_interval_s=0)
    collector = ProcessCollector(os.getpid(), worker_pids=p.worker_pids)
    seen: dict[int, tuple[str, set[str]]] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            tree = collector.sample()
            for proc in tree.processes if tree else ():
                seen.setdefault(proc.pid, (proc.name, set()))[1].add(proc.role)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    plain = train(None)
    watched = train(p)
    workers = sorted(p.worker_pids())
    stop.set()
    thread.join()
    p.close()
    print(
        json.dumps(
            {
                "plain": plain,
                "watched": watched,
                "published_workers": workers,
                "seen": {str(k): [name, sorted(roles)] for k, (name, roles) in seen.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
