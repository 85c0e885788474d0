"""Steps/s of a Lightning ``fit`` and an HF ``Trainer.train`` with and without the probe.

Tiny model on the CPU, so the framework's own per-step overhead dominates and any cost
the probe adds would show. Runs alternate (without, with) x PAIRS in this process; each
run starts from the same seed, so the final losses must be equal. Prints steps/s and
whole-process CPU per step (all threads, including the probe's publisher and sampler):
median and spread (min-max) over the pairs.

    python bench/frameworks_throughput.py [--pairs 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from gputop_dl import probe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' set-ups
from tests.frameworks.setups import LIGHTNING_QUIET, DictData, hf_quiet_args

Run = Callable[[bool, int], float]  # (with probe, steps) -> final loss


def data(n: int) -> TensorDataset:
    xs = torch.linspace(-1, 1, n * 8).reshape(n, 8)
    return TensorDataset(xs, xs.sum(1, keepdim=True))


def lightning_run(with_probe: bool, steps: int) -> float:
    import lightning.pytorch as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
            self.last = float("nan")

        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.last = float(loss.detach())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    L.seed_everything(0, verbose=False)
    loader = DataLoader(data(steps * 4 // 2), batch_size=4, shuffle=True)  # 2 epochs
    model = Model()
    trainer = L.Trainer(max_epochs=2, **LIGHTNING_QUIET)
    trainer.fit(model, train_dataloaders=probe.watch(loader) if with_probe else loader)
    return model.last


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def hf_run(with_probe: bool, steps: int) -> float:
    import transformers

    class WatchedTrainer(transformers.Trainer):
        def get_train_dataloader(self) -> Any:
            return probe.watch(super().get_train_dataloader())

    transformers.set_seed(0)
    with tempfile.TemporaryDirectory() as out:
        args = hf_quiet_args(
            transformers, out, per_device_train_batch_size=4, num_train_epochs=2, learning_rate=0.01
        )
        cls = WatchedTrainer if with_probe else transformers.Trainer
        trainer = cls(model=Regressor(), args=args, train_dataset=DictData(data(steps * 4 // 2)))
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its metrics
            return float(trainer.train().training_loss)


def measure(name: str, run: Run, pairs: int, steps: int) -> None:
    run(False, 8)  # warm up imports and first-call costs outside the figures
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, set[float]] = {False: set(), True: set()}
    for _ in range(pairs):
        for with_probe in (False, True):
            if with_probe:
                probe._default = probe.Probe(name=f"bench-{name}")
            w0, c0 = time.perf_counter(), time.process_time()
            loss = run(with_probe, steps)
            wall, cpu_s = time.perf_counter() - w0, time.process_time() - c0
            if with_probe:
                probe.default().close()
                probe._default = None
            rates[with_probe].append(steps / wall)
            cpu[with_probe].append(cpu_s / steps * 1e6)
            losses[with_probe].add(loss)
    for with_probe, label in ((False, "without probe"), (True, "with probe   ")):
        r, c = rates[with_probe], cpu[with_probe]
        print(
            f"{name:9} {label}: {statistics.median(r):7.1f} steps/s "
            f"(min {min(r):.1f}, max {max(r):.1f}); CPU {statistics.median(c):7.0f} us/step "
            f"(min {min(c):.0f}, max {max(c):.0f}); final loss {sorted(losses[with_probe])}"
        )
    same = losses[False] == losses[True] and len(losses[False]) == 1
    print(f"{name:9} final losses equal with and without the probe: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="training steps per run")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # framework chatter would drown the figures
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print(f"{args.pairs} alternating pairs x {args.steps} steps, tiny MLP, CPU")
    measure("lightning", lightning_run, args.pairs, args.steps)
    measure("hf", hf_run, args.pairs, args.steps)


if __name__ == "__main__":
    main()
