"""What the framework tests and ``bench/frameworks_throughput.py`` set up alike: a quiet
Lightning ``Trainer`` on one CPU, HF ``TrainingArguments`` that save, log and print
nothing, and the ``{"x", "labels"}`` items the HF ``Trainer`` feeds a model."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

# Lightning: one CPU device; no logger, checkpoint, progress bar or model summary.
LIGHTNING_QUIET: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def hf_quiet_args(transformers: Any, output_dir: str, **args: Any) -> Any:
    """``TrainingArguments`` on the CPU, seed 0, that save (unless ``args`` say so), log
    and report nothing."""
    quiet = {
        "use_cpu": True,
        "seed": 0,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
    }
    return transformers.TrainingArguments(output_dir=output_dir, **{**quiet, **args})


class DictData(Dataset[Any]):
    """An ``(x, y)`` dataset's items as ``{"x": x, "labels": y}``."""

    def __init__(self, pairs: Any) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x, y = self.pairs[i]
        return {"x": x, "labels": y}


def regressor_module(L: Any) -> Any:
    """A ``LightningModule`` class (``L``: ``lightning.pytorch``) fitting one linear layer
    by SGD, with no validation step."""

    class Regression(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regression
