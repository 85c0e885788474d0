"""``Trainer(callbacks=[GputopCallback()])``: Lightning steps timed by gputop's probe.

Phases of each training batch, from Lightning's hooks: ``forward`` (batch start to the
first ``on_before_backward``: the training step, and ``zero_grad`` in automatic
optimization), ``backward`` (``on_before_backward`` to ``on_after_backward``, every
backward of the batch summed) and ``optimizer`` (``on_before_optimizer_step`` to the
next hook or the batch end: gradient clipping and the optimizer step). A batch that
only accumulates gradients has no ``optimizer`` phase. Rank, local rank and world size
come from the Trainer when the environment does not set RANK / LOCAL_RANK / WORLD_SIZE.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from gputop_dl.probe.integrations._timer import HookTimer, attr_int


class GputopCallback(Callback):
    """Times every training batch; ``probe``: a Probe (default: the process-wide one)."""

    def __init__(self, probe: Any = None) -> None:
        self._timer = HookTimer(probe)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        ranks = (
            attr_int(trainer, "global_rank"),
            attr_int(trainer, "local_rank"),
            attr_int(trainer, "world_size"),
        )
        self._timer.epoch_start(getattr(trainer, "train_dataloader", None), "lightning", ranks)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self._timer.batch_start(batch, "forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._timer.phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._timer.phase(None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._timer.phase("optimizer")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
    ) -> None:
        self._timer.batch_end()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        # Inside the training epoch (val_check_interval, or the epoch's end: Lightning
        # validates before on_train_epoch_end): a 13 s validation read "Stalled".
        self._timer.away("validation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._timer.back()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        # Called as the checkpoint is made, before it is written (ModelCheckpoint, last
        # of the callbacks, saves after our batch or validation end): away until the
        # next batch, whose data wait is then not measured.
        self._timer.away("checkpoint")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._timer.epoch_end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._timer.epoch_end(f"exception:{type(exception).__name__}")
