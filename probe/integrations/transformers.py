"""``Trainer(callbacks=[GputopCallback()])``: HF Trainer steps timed by gputop's probe.

The Trainer reports optimizer steps: with gradient accumulation one timed step covers
all its micro-batches, and no per-batch data wait is seen separately. Phases, from the
Trainer's events: ``forward-backward`` (step begin to ``on_pre_optimizer_step``: every
micro-batch's forward and backward, and gradient clipping; the Trainer has no event
between forward and backward) and ``optimizer`` (``on_pre_optimizer_step`` to
``on_optimizer_step``). Rank, local rank and world size come from ``TrainingArguments``
(``process_index``, ``local_process_index``, ``world_size``) when the environment does
not set RANK / LOCAL_RANK / WORLD_SIZE.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gputop_dl.probe.integrations._timer import HookTimer, attr_int


class GputopCallback(TrainerCallback):
    """Times every training step; ``probe``: a Probe (default: the process-wide one)."""

    def __init__(self, probe: Any = None) -> None:
        self._timer = HookTimer(probe)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ranks = (
            attr_int(args, "process_index"),
            attr_int(args, "local_process_index"),
            attr_int(args, "world_size"),
        )
        self._timer.epoch_start(kwargs.get("train_dataloader"), "transformers", ranks)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.batch_start(None, "forward-backward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.phase("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.phase(None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.batch_end()
        # The Trainer evaluates and saves after this event, inside the epoch (an
        # evaluation strategy of "steps"): away, not the next step's wait or a stall.
        # Its flags are set by now (DefaultFlowCallback's on_step_end runs first).
        self._away_for(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.back()
        # A checkpoint may follow: the flag says so, or, saving the best model, the
        # Trainer decides after this event (it ends at on_save, or at the next step).
        best = getattr(getattr(args, "save_strategy", None), "value", None) == "best"
        self._away_for(control, evaluated=True, best=best)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.back()

    def _away_for(self, control: Any, evaluated: bool = False, best: bool = False) -> None:
        if not evaluated and getattr(control, "should_evaluate", False) is True:
            self._timer.away("evaluation")
        elif best or getattr(control, "should_save", False) is True:
            self._timer.away("checkpoint")

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.epoch_end()
