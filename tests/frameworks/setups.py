"""What the framework tests and ``bench/frameworks_throughput.py`` set up alike: a quiet
Lightning ``Trainer`` on one CPU, HF ``TrainingArguments`` that save, log and print
nothing, and the ``{"x", "labels"}`` items the HF ``Trainer`` feeds a model."""

from __future__ import annotations

from typing import Any

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
    """``TrainingArguments`` on the CPU, seed 0, that save, log and report nothing."""
    return transformers.TrainingArguments(
        output_dir=output_dir,
        use_cpu=True,
        seed=0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **args,
    )


class DictData(Dataset[Any]):
    """An ``(x, y)`` dataset's items as ``{"x": x, "labels": y}``."""

    def __init__(self, pairs: Any) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x, y = self.pairs[i]
        return {"x": x, "labels": y}
