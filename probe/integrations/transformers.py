"""``Trainer(callbacks=[GputopCallback()])``: HF Trainer steps timed by gputop's probe.

The Trainer reports optimizer steps: with gradient accumulation one timed step covers
all its micro-batches, and no per-batch data wait is seen separately.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gputop_dl.probe.integrations._timer import HookTimer


class GputopCallback(TrainerCallback):
    """Times every training step; ``probe``: a Probe (default: the process-wide one)."""

    def __init__(self, probe: Any = None) -> None:
        self._timer = HookTimer(probe)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.epoch_start(kwargs.get("train_dataloader"), "transformers")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.batch_start(None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.batch_end()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.epoch_end()
