"""``Trainer(callbacks=[GputopCallback()])``: Lightning steps timed by gputop's probe."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from gputop_dl.probe.integrations._timer import HookTimer


class GputopCallback(Callback):
    """Times every training batch; ``probe``: a Probe (default: the process-wide one)."""

    def __init__(self, probe: Any = None) -> None:
        self._timer = HookTimer(probe)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._timer.epoch_start(getattr(trainer, "train_dataloader", None), "lightning")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self._timer.batch_start(batch)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
    ) -> None:
        self._timer.batch_end()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._timer.epoch_end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._timer.epoch_end(f"exception:{type(exception).__name__}")
