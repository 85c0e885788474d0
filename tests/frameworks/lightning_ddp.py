"""Lightning DDP on 2 CPU ranks (gloo): each rank writes the batches it trained on.

Usage: python lightning_ddp.py OUT_DIR. Fits twice in the same ranks, first without and
then with ``probe.watch`` (one launch: DDP start-up is most of the cost). Lightning re-runs
this script for rank 1, so everything happens under ``__main__``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from gputop_dl import probe


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[list[float]] = []
        self.last_loss = float("nan")

    def training_step(self, batch: Any, _index: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(x[:, 0].tolist())
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.last_loss = float(loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(out_dir: str, mode: str) -> None:
    L.seed_everything(0, verbose=False)
    xs = torch.arange(24, dtype=torch.float32).unsqueeze(1).repeat(1, 2)
    loader = DataLoader(TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=3, shuffle=True)
    model = Model()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=probe.watch(loader) if mode == "watch" else loader)
    rank = trainer.global_rank
    steps = probe.default()._index if mode == "watch" else None
    with open(os.path.join(out_dir, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump({"seen": model.seen, "loss": model.last_loss, "steps": steps}, f)


def main() -> None:
    for mode in ("plain", "watch"):
        fit(sys.argv[1], mode)


if __name__ == "__main__":
    main()
