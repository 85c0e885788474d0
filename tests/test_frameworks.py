"""The contract with the frameworks people train with: watching the loader changes nothing.

With and without ``probe.watch`` the training sees the same batches in the same order,
the same number per epoch and per rank, and ends with the same loss (fixed seed, CPU).
Real Lightning, transformers, accelerate and torch.compile; tiny models and datasets.
"""

from __future__ import annotations

import copy as copy_module
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputop_dl import probe
from gputop_dl.probe import core
from gputop_dl.probe import loader as loader_mod

torch = pytest.importorskip("torch", reason="the frameworks train torch models")
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset  # noqa: E402

from tests.frameworks.setups import LIGHTNING_QUIET, DictData, hf_quiet_args, regressor_module  # noqa: E402
from tests.test_probe import attached  # noqa: E402

FRAMEWORKS = Path(__file__).parent / "frameworks"


@pytest.fixture
def p() -> Iterator[probe.Probe]:
    """The default probe, as a user's ``probe.watch`` reaches it; fresh for each test."""
    probe._default = probe.Probe(name="frameworks", system_interval_s=0)
    yield probe._default
    probe._default.close()
    probe._default = None


def dataset(n: int = 20) -> TensorDataset:
    xs = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 2) / n
    return TensorDataset(xs, xs.sum(1, keepdim=True))


# ------------------------------------------------------------------ plain loop
def test_plain_loop_wrapped_once_over_three_epochs(p: probe.Probe) -> None:
    def run(watch: bool) -> tuple[list[list[float]], float]:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader: Any = DataLoader(dataset(), batch_size=4, shuffle=True)
        if watch:
            loader = probe.watch(loader)  # wrapped once, before the epoch loop
        seen, loss = [], torch.tensor(0.0)
        for _ in range(3):
            for x, y in loader:
                seen.append(x[:, 0].tolist())
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
        return seen, float(loss.detach())

    plain, watched = run(False), run(True)
    assert len(plain[0]) == 15 and watched == plain
    assert p._index == 15


# ------------------------------------------------------------------ Lightning
def lightning_run(
    watch: bool, max_epochs: int = 2, callbacks: tuple[Any, ...] = ()
) -> tuple[list[list[float]], float]:
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")

    class Model(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen: list[list[float]] = []
            self.last = float("nan")

        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            self.seen.append(x[:, 0].tolist())
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.last = float(loss.detach())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    L.seed_everything(0, verbose=False)
    loader = DataLoader(dataset(), batch_size=2, shuffle=True)
    model = Model()
    trainer = L.Trainer(
        max_epochs=max_epochs,
        callbacks=list(callbacks),
        **LIGHTNING_QUIET,
    )
    trainer.fit(model, train_dataloaders=probe.watch(loader) if watch else loader)
    return model.seen, model.last


def test_lightning_fit_over_two_epochs(p: probe.Probe) -> None:
    # Why: with the generator watch, Lightning ran 11 of 20 steps (second epoch empty).
    plain = lightning_run(False)
    watched = lightning_run(True)
    assert len(plain[0]) == 20
    assert watched == plain
    # Each step timed once, in both epochs -- except the last of each epoch: Lightning
    # ends an epoch by count without asking for another batch, so that step has no end
    # the probe could see (timing it to the next epoch would add validation to it).
    assert p._index == 2 * (10 - 1)
    assert p._framework == "lightning"  # type: ignore[attr-defined]


class Augmented(Dataset[Any]):
    """Items with a random augmentation (drawn in the worker: its seed is the loader's)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([float(i)]) + torch.rand(1)


def lightning_draws(watch: bool) -> list[Any]:
    """Two fits of one Trainer over a shuffled loader with a worker, the module drawing
    from torch's generator at each epoch's start: what each draw and first batch gave."""
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    seen: list[Any] = []

    class Model(regressor_module(L)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def on_train_epoch_start(self) -> None:
            seen.append(torch.rand(1).item())

        def training_step(self, batch: Any, i: int) -> Any:
            if i == 0:
                seen.append(batch.flatten().tolist())
            return self.layer(batch).pow(2).mean()

    L.seed_everything(0, verbose=False)
    loader: Any = DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=1)
    if watch:
        loader = probe.watch(loader)
    trainer = L.Trainer(max_epochs=1, **LIGHTNING_QUIET)
    model = Model()
    trainer.fit(model, loader)
    trainer.fit_loop.max_epochs = 2
    trainer.fit(model, loader)
    return seen


def test_lightning_draws_the_same_numbers_through_a_watched_loader(p: probe.Probe) -> None:
    """A DataLoader draws its seed from torch's generator at iter(). The watched pass
    made the loader's iterator at its first batch: after the module's draw in
    on_train_epoch_start, which then differed (so did every augmentation); and not for
    the iterator Lightning makes and drops at a second fit (its shuffle differed). Nor
    may it make one where Lightning's check of a loader that is no DataLoader calls
    iter() on it only to see that it is iterable."""
    plain = lightning_draws(False)
    assert len(plain) == 4
    assert lightning_draws(True) == plain
    assert p._index > 0


def test_lightning_callback_times_every_step(p: probe.Probe) -> None:
    pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.lightning import GputopCallback

    plain = lightning_run(False)
    timed = lightning_run(False, callbacks=(GputopCallback(),))
    assert timed == plain and p._index == 20
    assert p._framework == "lightning" and p._loop == "outside"  # type: ignore[attr-defined]


def test_a_used_callback_with_its_own_probe_pickles_without_it(p: probe.Probe) -> None:
    """Lightning's ddp_spawn pickles the callbacks for each process it starts: a callback
    given a probe, or used by a fit, held one ("cannot pickle '_thread.RLock' object": the
    fit stopped). The copy times its own process's default probe."""
    pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    transformers = pytest.importorskip("transformers")
    from gputop_dl.probe.integrations import lightning as pl_integration
    from gputop_dl.probe.integrations import transformers as hf_integration

    given = pl_integration.GputopCallback(p)
    copy = pickle.loads(pickle.dumps(given))
    assert copy._timer._given is None  # its process's probe, once it runs
    plain = lightning_run(False)
    assert lightning_run(False, callbacks=(given,)) == plain and p._index == 20
    assert lightning_run(False, callbacks=(copy,)) == plain and p._index == 40
    # Used: Lightning sets the module's log methods on it (this test's module, a local
    # class, cannot be pickled; a script's can): its timer alone here.
    assert pickle.loads(pickle.dumps(given._timer))._given is None
    hf = hf_integration.GputopCallback(p)
    assert pickle.loads(pickle.dumps(hf))._timer._given is None
    assert copy_module.deepcopy(hf)._timer._given is p  # in-process: the same probe
    assert isinstance(hf, transformers.TrainerCallback)


class SlowItems(Dataset[Any]):
    """Pairs that each take ``delay`` seconds to load: a validation that lasts."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        return torch.zeros(2), torch.zeros(1)


def waits(p: probe.Probe, reader: Any) -> list[float]:
    """The data wait of every step ``reader`` got from ``p``, which it closes."""
    p.close()
    reader.pump(1.0)
    reader.close()
    return [r["wait_s"] for r in reader.steps() if r["wait_s"] is not None]


@pytest.mark.parametrize("interval", [0.5, 1.0], ids=["mid-epoch", "epoch-end"])
def test_lightning_validation_inside_an_epoch_is_outside_the_loop(
    interval: float, tmp_path: Path
) -> None:
    """Lightning validates inside the training epoch (before on_train_epoch_end, and
    mid-epoch with val_check_interval): a 13 s validation read "Stalled [critical]",
    and mid-epoch its time was the next step's data wait ("input-bound")."""
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.lightning import GputopCallback

    p = probe.Probe(name="pl-validation", system_interval_s=0, listen="tcp://127.0.0.1:*")
    reader = attached(p)
    states: list[tuple[str, str | None]] = []

    class Model(regressor_module(L)):  # type: ignore[misc]
        def validation_step(self, batch: Any, _i: int) -> None:
            states.append((p._loop, p._loop_exit))

    try:
        trainer = L.Trainer(
            max_epochs=1,
            callbacks=[GputopCallback(p)],
            val_check_interval=interval,
            num_sanity_val_steps=0,
            **LIGHTNING_QUIET,
        )
        trainer.fit(
            Model(),
            DataLoader(dataset(40), batch_size=2),
            DataLoader(SlowItems(8, 0.05), batch_size=2),
        )
        assert states and set(states) == {("outside", "marked:validation")}
        assert p._loop == "outside" and p._loop_exit == "exhausted"
        steps = waits(p, reader)
        assert len(steps) == 20 and max(steps) < 0.2  # 0.4 s of validation in no step
    finally:
        p.close()


def test_lightning_validation_with_watch_only_is_outside_the_loop_within_3_s() -> None:
    """`trainer.fit(model, probe.watch(loader))` without the callback: Lightning validates
    between two fetches of the watched pass, which stays open. The viewer showed the
    last verdict through the first 10 s of every validation (the stall threshold, when
    the probe took its stack); the probe now looks at a step 3x typical and past 2 s,
    and sends the stack at once when it is in Lightning's evaluation loop."""
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.messages import Stack
    from gputop_dl.probe.protocol import decode
    from gputop_dl.probe.stack import framework_away
    from gputop_dl.probe.transport import Subscriber

    class Model(regressor_module(L)):  # type: ignore[misc]
        def validation_step(self, batch: Any, _i: int) -> None:
            pass

    p = probe.Probe(name="pl-watch-only", system_interval_s=0, listen="tcp://127.0.0.1:*")
    sub = Subscriber()
    sub.connect(p.endpoint or "")
    time.sleep(0.3)
    try:
        trainer = L.Trainer(
            max_epochs=1, val_check_interval=0.5, num_sanity_val_steps=0, **LIGHTNING_QUIET
        )
        trainer.fit(
            Model(),
            p.watch(DataLoader(dataset(60), batch_size=2)),
            DataLoader(SlowItems(8, 0.4), batch_size=2),  # 3.2 s of validation, twice
        )
        p.close()
        stacks = [
            m for m in map(decode, sub.receive(1.0, max_messages=10_000)) if isinstance(m, Stack)
        ]
    finally:
        p.close()
        sub.close()
    assert len(stacks) == 2, stacks  # one a validation
    for stack in stacks:
        assert framework_away(stack) is not None and stack.stalled_s < 3.2, stack
        assert any("evaluation_loop.py" in f.file for f in stack.frames), stack.frames


def test_lightning_checkpoints_inside_an_epoch_are_outside_the_loop(tmp_path: Path) -> None:
    """ModelCheckpoint (last of the callbacks) saves after our batch end: its write was
    the next step's data wait ("input-bound"), and a stall once it lasted."""
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from gputop_dl.probe.integrations.lightning import GputopCallback

    p = probe.Probe(name="pl-checkpoint", system_interval_s=0, listen="tcp://127.0.0.1:*")
    reader = attached(p)
    states: list[tuple[str, str | None]] = []

    class SlowCheckpoint(ModelCheckpoint):  # type: ignore[misc]
        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            super()._save_checkpoint(trainer, filepath)  # on_save_checkpoint, the write
            states.append((p._loop, p._loop_exit))
            time.sleep(0.3)  # a large model's write

    Model = regressor_module(L)

    try:
        quiet = {**LIGHTNING_QUIET, "enable_checkpointing": True}
        trainer = L.Trainer(
            max_epochs=1,
            callbacks=[
                GputopCallback(p),
                SlowCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1),
            ],
            default_root_dir=tmp_path,
            **quiet,
        )
        trainer.fit(Model(), DataLoader(dataset(40), batch_size=2))
        assert len(states) >= 3 and set(states) == {("outside", "marked:checkpoint")}
        steps = waits(p, reader)
        assert max(steps) < 0.2  # the writes' 0.3 s in no step's wait
        assert 20 - len(steps) >= 3  # the steps after a write: no wait measured
    finally:
        p.close()


def test_lightning_ddp_each_rank_keeps_its_own_shard(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GPUTOP_NAME": "ddp-test"}
    env.pop("LOCAL_RANK", None)
    done = subprocess.run(
        [sys.executable, str(FRAMEWORKS / "lightning_ddp.py"), str(tmp_path)],
        env=env,
        check=True,
        timeout=240,
        capture_output=True,
        text=True,
    )
    runs = {
        (mode, rank): json.loads((tmp_path / f"{mode}-rank{rank}.json").read_text())
        for mode in ("plain", "watch")
        for rank in (0, 1)
    }
    for rank in (0, 1):
        assert runs["watch", rank]["seen"] == runs["plain", rank]["seen"]
        assert runs["watch", rank]["loss"] == runs["plain", rank]["loss"]
        assert len(runs["watch", rank]["seen"]) == 8  # 24 samples / 2 ranks / 3 per batch, x2
    # Each rank read its own half of every epoch (DistributedSampler still injected).
    for epoch in (slice(0, 4), slice(4, 8)):
        halves = [{v for b in runs["watch", r]["seen"][epoch] for v in b} for r in (0, 1)]
        assert not halves[0] & halves[1] and len(halves[0] | halves[1]) == 24
    # Lightning iterates the loader it re-created, not the watch: said once per rank, with
    # the way to get timings; nothing is timed rather than something made up.
    assert done.stderr.count("integrations.lightning.GputopCallback") == 2, done.stderr[-3000:]
    assert runs["watch", 0]["steps"] == runs["watch", 1]["steps"] == 0


# ------------------------------------------------------------------ Hugging Face
class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[list[float]] = []

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        self.seen.append(x[:, 0].tolist())
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class FailsAtStep7(Regressor):
    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        if len(self.seen) == 6:
            raise ValueError("bad batch")
        return super().forward(x, labels)


def hf_run(
    watch: bool,
    tmp_path: Path,
    callbacks: tuple[Any, ...] = (),
    model_class: type[Regressor] = Regressor,
    **args: Any,
) -> tuple[list[list[float]], float, Any]:
    transformers = pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")

    class WatchedTrainer(transformers.Trainer):  # type: ignore[misc,name-defined]
        def get_train_dataloader(self) -> Any:
            return probe.watch(super().get_train_dataloader())

    transformers.set_seed(0)
    model = model_class()
    targs = hf_quiet_args(
        transformers,
        str(tmp_path / ("w" if watch else "p")),
        per_device_train_batch_size=4,
        learning_rate=0.1,
        **args,
    )
    trainer_cls = WatchedTrainer if watch else transformers.Trainer
    trainer = trainer_cls(
        model=model, args=targs, train_dataset=DictData(dataset()), callbacks=list(callbacks)
    )
    out = trainer.train()
    return model.seen, out.training_loss, trainer


class Noisy(Dataset[Any]):
    """Each item drawn with noise from torch's generator: when the draws happen matters."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = torch.tensor([float(i), 1.0]) + 0.01 * torch.randn(2)
        return {"x": x, "labels": torch.tensor([float(i % 3)])}


def hf_resumed_inputs(watch: bool, out: Path) -> tuple[list[list[float]], list[float]]:
    """Three steps saved, then a new Trainer resumed from that mid-epoch checkpoint."""
    transformers = pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")

    class WatchedTrainer(transformers.Trainer):  # type: ignore[misc,name-defined]
        def get_train_dataloader(self) -> Any:
            return probe.watch(super().get_train_dataloader())

    trainer_cls = WatchedTrainer if watch else transformers.Trainer

    def trainer(max_steps: int) -> Any:
        transformers.set_seed(0)
        targs = hf_quiet_args(
            transformers,
            str(out),
            per_device_train_batch_size=4,
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=3,
        )
        return trainer_cls(model=Regressor(), args=targs, train_dataset=Noisy())

    trainer(3).train()
    resumed = trainer(12)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    return resumed.model.seen, resumed.model.layer.weight.flatten().tolist()


def test_an_hf_training_resumed_mid_epoch_draws_the_same_numbers(
    p: probe.Probe, tmp_path: Path
) -> None:
    """accelerate's skip_first_batches rebuilt a watched loader as a plain DataLoader (its
    own as a DataLoaderShard): the resumed epoch's noise differed from the 2nd batch on."""
    bare = hf_resumed_inputs(False, tmp_path / "bare")
    watched = hf_resumed_inputs(True, tmp_path / "watched")
    assert len(bare[0]) == 9 and watched == bare
    assert p._index_now() >= 9  # the resumed epoch was timed too


def test_hf_trainer_num_train_epochs(p: probe.Probe, tmp_path: Path) -> None:
    # Why: without __len__ the Trainer raised ValueError.
    plain = hf_run(False, tmp_path, num_train_epochs=2)
    watched = hf_run(True, tmp_path, num_train_epochs=2)
    assert len(plain[0]) == 10 and watched[:2] == plain[:2]
    assert p._framework == "transformers"  # type: ignore[attr-defined]
    info = p._loader_info
    assert info is not None and info.wrapper == "accelerate.DataLoaderShard"
    assert (info.kind, info.batch_size, info.num_workers) == ("torch.DataLoader", 4, 0)


def test_hf_trainer_max_steps_across_epochs(p: probe.Probe, tmp_path: Path) -> None:
    # Why: with the generator watch, max_steps=8 stopped at the end of the first epoch (5).
    plain = hf_run(False, tmp_path, max_steps=8)
    watched = hf_run(True, tmp_path, max_steps=8)
    assert len(plain[0]) == 8 and watched[:2] == plain[:2]


def test_hf_callback_times_every_step(p: probe.Probe, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.transformers import GputopCallback

    plain = hf_run(False, tmp_path, num_train_epochs=2)
    timed = hf_run(False, tmp_path, callbacks=(GputopCallback(),), num_train_epochs=2)
    assert timed[:2] == plain[:2] and p._index == 10
    assert p._framework == "transformers"  # type: ignore[attr-defined]
    info = p._loader_info
    assert info is not None and info.wrapper == "accelerate.DataLoaderShard"


def test_an_hf_training_that_raised_is_outside_its_loop_not_stalled(
    p: probe.Probe, tmp_path: Path
) -> None:
    """The HF Trainer has no callback event for an exception: a notebook that keeps the
    process after a failed train() was "in the loop", its step open, a stall (critical)
    for good. The probe sees the training thread leave the Trainer's loop."""
    pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.transformers import GputopCallback

    with pytest.raises(ValueError, match="bad batch"):
        hf_run(False, tmp_path, callbacks=(GputopCallback(),), model_class=FailsAtStep7)
    assert p._index == 6
    deadline = time.monotonic() + 3 * core.LEFT_FETCH_S + 2
    while p._loop != "outside" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "framework-exception", 0)
    # A train() again: timed as before.
    hf_run(False, tmp_path, callbacks=(GputopCallback(),), num_train_epochs=1)
    assert p._index == 6 + 5 and (p._loop, p._loop_exit) == ("outside", "exhausted")


class SlowSteps(Regressor):
    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        time.sleep(0.2)
        return super().forward(x, labels)


def test_an_hf_training_on_its_thread_is_not_seen_leaving_for_anothers_pass(
    p: probe.Probe, tmp_path: Path
) -> None:
    """The Trainer's loop was looked for on the thread that entered a loop last: a
    watched pass on the main thread beside a Trainer training on its own thread had
    the training "ended with an exception" while it went on (a review)."""
    pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.transformers import GputopCallback

    callback = GputopCallback()
    training = threading.Thread(
        target=hf_run,
        args=(False, tmp_path, (callback,), SlowSteps),
        kwargs={"num_train_epochs": 3},
    )
    training.start()
    while p._loop != "in-loop":
        time.sleep(0.01)
    assert list(p.watch(range(3))) == [0, 1, 2]  # a pass on this thread
    exits = set()
    while training.is_alive():
        exits.add(p._loop_exit)
        time.sleep(0.02)
    training.join()
    assert "framework-exception" not in exits, exits
    assert p._index >= 15  # (a step of each may merge: two loops at once)


@pytest.mark.parametrize("save", ["steps", "best"])
def test_hf_evaluation_and_checkpoint_inside_an_epoch_are_outside_the_loop(
    tmp_path: Path, save: str
) -> None:
    """The HF Trainer evaluates and saves after a step's end, inside the epoch (an
    evaluation strategy of "steps"): that time was the next step's data wait, and a
    stall once it lasted 10 s. Saving the best model, it decides to save after the
    evaluation's event."""
    transformers = pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.transformers import GputopCallback

    p = probe.Probe(name="hf-evaluation", system_interval_s=0, listen="tcp://127.0.0.1:*")
    reader = attached(p)
    states: list[tuple[str, str | None]] = []

    class Evaluated(Regressor):
        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            if not self.training:
                states.append((p._loop, p._loop_exit))
            return super().forward(x, labels)

    class SavedSlowly(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_save(self, *args: Any, **kwargs: Any) -> None:
            states.append(("saving", p._loop_exit))

    try:
        transformers.set_seed(0)
        args = hf_quiet_args(
            transformers,
            str(tmp_path / "hf"),
            per_device_train_batch_size=4,
            per_device_eval_batch_size=2,
            num_train_epochs=1,
            eval_strategy="steps",
            eval_steps=2,
        )
        if save == "best":
            args.save_strategy = transformers.trainer_utils.SaveStrategy.BEST
            args.metric_for_best_model = "loss"
        else:
            args.save_strategy = transformers.trainer_utils.SaveStrategy.STEPS
            args.save_steps = 4
        trainer = transformers.Trainer(
            model=Evaluated(),
            args=args,
            train_dataset=DictData(dataset(20)),
            eval_dataset=DictData(SlowItems(4, 0.05)),
            callbacks=[SavedSlowly(), GputopCallback(p)],
        )
        trainer.train()
        assert ("outside", "marked:evaluation") in states
        assert {s for s in states if s[0] != "saving"} == {("outside", "marked:evaluation")}
        assert ("saving", "marked:checkpoint") in states  # (called before ours)
        assert p._loop == "outside"
        steps = waits(p, reader)
        assert len(steps) == 5 and max(steps) < 0.1  # 0.2 s evaluations in no step
    finally:
        p.close()


# ------------------------------------------------------------------ accelerate
def test_accelerate_prepared_loader(p: probe.Probe) -> None:
    accelerate = pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")
    pytest.importorskip("transformers.trainer", reason="pip install gputop-dl[frameworks]")

    def run(watch: bool) -> tuple[list[list[float]], float]:
        accelerate.utils.set_seed(0)
        acc = accelerate.Accelerator(cpu=True)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(dataset(), batch_size=4, shuffle=True)
        model, opt, loader = acc.prepare(model, opt, loader)
        batches: Any = probe.watch(loader) if watch else loader
        seen, loss = [], torch.tensor(0.0)
        for _ in range(2):
            for x, y in batches:
                seen.append(x[:, 0].tolist())
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
        return seen, float(loss.detach())

    plain, watched = run(False), run(True)
    assert len(plain[0]) == 10 and watched == plain
    # The user's own loop drives accelerate: importing the HF Trainer does not change that.
    assert p._framework == "accelerate"  # type: ignore[attr-defined]
    info = p._loader_info
    assert info is not None and info.wrapper == "accelerate.DataLoaderShard"
    assert info.batch_size == 4  # read from accelerate's batch sampler


def test_watched_before_prepare_says_so_once(
    p: probe.Probe, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader sharded by type (accelerator.prepare) is not recognised once watched: the
    probe cannot fix that without changing the training, so it says so, once."""
    import importlib

    import torch.distributed as dist

    # The module, not the function ``probe.watch`` that shares its name.
    watch_mod = importlib.import_module("gputop_dl.probe.watch")

    monkeypatch.setattr(watch_mod, "_warned", set())
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)  # rank 0 of 2, no peer needed
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    watched = probe.watch(DataLoader(dataset(), batch_size=4))
    with caplog.at_level(logging.WARNING, logger="gputop.probe"):
        for _ in range(2):
            list(watched)
        list(probe.watch(DataLoader(dataset(), batch_size=4)))
    warnings = [r.getMessage() for r in caplog.records if "DistributedSampler" in r.getMessage()]
    assert len(warnings) == 1
    assert "integrations.lightning.GputopCallback" in warnings[0]
    assert "does not change your training" in warnings[0]


# ------------------------------------------------------------------ wrappers described
def test_wrappers_are_seen_through() -> None:
    accelerate = pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")
    from accelerate.data_loader import DataLoaderDispatcher, SkipDataLoader

    shard = accelerate.Accelerator(cpu=True).prepare(
        DataLoader(dataset(), batch_size=5, num_workers=1, pin_memory=False)
    )
    info = loader_mod.describe(shard)
    assert (info.wrapper, info.kind, info.batch_size, info.num_workers) == (
        "accelerate.DataLoaderShard",
        "torch.DataLoader",
        5,
        1,
    )
    assert info.prefetch_factor == 2 and info.pin_memory is False
    skip = SkipDataLoader(dataset(), skip_batches=1, batch_size=3)
    assert loader_mod.describe(skip).wrapper == "accelerate.SkipDataLoader"
    assert loader_mod.describe(skip).batch_size == 3
    dispatcher = DataLoaderDispatcher(dataset(), batch_size=2)
    assert loader_mod.describe(dispatcher).wrapper == "accelerate.DataLoaderDispatcher"
    # The worker pids of a generator-based wrapper appear once it has started.
    it = iter(shard)
    next(it)
    assert len(loader_mod.worker_pids(it)) == 1


def test_lightning_combined_loader_is_seen_through() -> None:
    pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from lightning.pytorch.utilities import CombinedLoader

    combined = CombinedLoader(DataLoader(dataset(), batch_size=7, persistent_workers=False))
    info = loader_mod.describe(combined)
    assert (info.wrapper, info.batch_size, info.num_workers, info.prefetch_factor) == (
        "lightning.CombinedLoader",
        7,
        0,
        None,  # no workers: prefetching means nothing, so it is not reported
    )
    assert loader_mod.framework(combined) == "lightning"
    # Several loaders combined: which one is "the" loader cannot be known.
    two = CombinedLoader({"a": DataLoader(dataset()), "b": DataLoader(dataset())})
    assert loader_mod.describe(two).num_workers is None


def test_torchdata_stateful_loader(p: probe.Probe) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata absent")
    loader = stateful.StatefulDataLoader(dataset(), batch_size=4, num_workers=1)
    watched: Any = probe.watch(loader)
    first = [b[0][:, 0].tolist() for b in watched]
    assert len(first) == 5
    info = p._loader_info
    assert info is not None and info.kind == "torchdata.StatefulDataLoader"
    assert info.num_workers == 1 and len(info.worker_pids) == 1
    # Stateful resume passes through the watch: stop after two batches, resume from there.
    it = iter(watched)
    next(it), next(it)
    state = watched.state_dict()
    it.close()
    resumed = stateful.StatefulDataLoader(dataset(), batch_size=4, num_workers=1)
    resumed.load_state_dict(state)
    assert [b[0][:, 0].tolist() for b in probe.watch(resumed)] == first[2:]


def test_iterable_dataset_with_workers(p: probe.Probe) -> None:
    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            start = info.id if info else 0
            step = info.num_workers if info else 1
            return iter(torch.arange(start, 12, step, dtype=torch.float32).unsqueeze(1))

    loader = DataLoader(Stream(), batch_size=3, num_workers=2)
    assert sorted(v for b in probe.watch(loader) for v in b[:, 0].tolist()) == list(range(12))
    info = p._loader_info
    assert info is not None and info.num_workers == 2 and len(info.worker_pids) == 2


# ------------------------------------------------------------------ torch.compile
def test_torch_compile_same_losses_and_compiler_children_are_not_workers(
    tmp_path: Path,
) -> None:
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile (inductor) on CPU needs a C++ compiler; none on PATH")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # compile for real: g++ runs
        "TORCHINDUCTOR_COMPILE_THREADS": "2",  # a pool of compile worker processes
    }
    out = subprocess.run(
        [sys.executable, str(FRAMEWORKS / "compiled.py")],
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["watched"] == result["plain"] and len(result["plain"]) == 6
    published = set(result["published_workers"])
    assert len(published) == 1
    roles = {int(pid): (name, set(r)) for pid, (name, r) in result["seen"].items()}
    assert all("worker" in roles[pid][1] for pid in published if pid in roles)
    others = {
        pid: name for pid, (name, r) in roles.items() if pid not in published and "main" not in r
    }
    assert others, roles  # compile workers / g++ ran as children of the training process
    for pid in others:
        assert roles[pid][1] == {"other"}, (pid, roles[pid])
