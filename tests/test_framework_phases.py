"""The framework callbacks mark the phases of a step, and take the ranks from the framework.

Real Lightning ``fit`` and HF ``Trainer.train`` loops on the CPU, with a tiny model whose
forward, backward and optimizer step each take a known extra time (a sleep), read back
from the probe's own wire stream. Skipped, with the reason, when a package is absent.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputop_dl import probe
from gputop_dl.probe.integrations._timer import PhaseClock
from tests.wire_reader import WireReader

torch = pytest.importorskip("torch", reason="the frameworks train torch models")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from tests.frameworks.setups import (  # noqa: E402
    LIGHTNING_QUIET,
    DictData,
    hf_quiet_args,
    regressor_module,
)

FORWARD_S, BACKWARD_S, OPTIMIZER_S = 0.02, 0.01, 0.005


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def wire() -> Iterator[WireReader]:
    """The default probe on a TCP port, and a reader of what it publishes."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    probe._default = probe.Probe(name="phases", listen=endpoint, system_interval_s=0)
    reader = WireReader(endpoint)
    time.sleep(0.3)  # subscribed before the first step
    yield reader
    reader.close()
    if probe._default is not None:
        probe._default.close()
    probe._default = None


def published(reader: WireReader) -> list[dict[str, Any]]:
    assert probe._default is not None
    probe._default.close()
    reader.pump(1.0, until="bye")
    by_index = {r["index"]: r for r in reader.steps()}  # history replays repeat records
    return [by_index[i] for i in sorted(by_index)]


def slow_backward(x: Any) -> Any:
    """``x``, whose gradient takes BACKWARD_S longer to compute."""
    if x.requires_grad:
        x.register_hook(lambda grad: (time.sleep(BACKWARD_S), grad)[1])
    return x


class SlowSGD(torch.optim.SGD):  # type: ignore[misc]
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None  # Lightning's closure first
        time.sleep(OPTIMIZER_S)
        super().step()
        return loss


def dataset(n: int = 16) -> TensorDataset:
    xs = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 2) / n
    return TensorDataset(xs, xs.sum(1, keepdim=True))


def check_phases(records: list[dict[str, Any]], names: set[str]) -> list[dict[str, float]]:
    """Every record's phases are among ``names`` and fit in its period."""
    phases = [dict(r["phases"]) for r in records]
    for record, named in zip(records, phases, strict=True):
        assert set(named) <= names, named
        assert sum(named.values()) <= record["period_s"] + 1e-6
    return phases


# ------------------------------------------------------------------ pure clock
def test_phase_clock_credits_each_phase_until_the_next_mark() -> None:
    clock = PhaseClock()
    clock.mark("forward", 10.0)
    clock.mark("backward", 10.5)
    clock.mark(None, 10.7)  # an unnamed part is not credited
    clock.mark("backward", 10.8)  # a second backward adds up
    clock.mark("optimizer", 11.0)
    assert clock.finish(11.25) == pytest.approx(
        {"forward": 0.5, "backward": 0.4, "optimizer": 0.25}
    )
    assert clock.finish(12.0) == {}  # it starts empty again
    clock.mark("forward", 13.0)
    assert clock.finish(12.0) == {"forward": 0.0}  # a clock going back never gives < 0


# ------------------------------------------------------------------ Lightning
def lightning_fit(accumulate: int = 1) -> None:
    L = pytest.importorskip("lightning.pytorch", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.lightning import GputopCallback

    class Model(regressor_module(L)):  # type: ignore[misc]
        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            time.sleep(FORWARD_S)
            return torch.nn.functional.mse_loss(slow_backward(self.layer(x)), y)

        def configure_optimizers(self) -> Any:
            return SlowSGD(self.parameters(), lr=0.1)

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        callbacks=[GputopCallback()],
        **LIGHTNING_QUIET,
    )
    trainer.fit(Model(), train_dataloaders=DataLoader(dataset(), batch_size=2))


def test_lightning_marks_forward_backward_optimizer(wire: WireReader) -> None:
    lightning_fit()
    records = published(wire)
    assert len(records) == 8
    for named in check_phases(records, {"forward", "backward", "optimizer"}):
        assert set(named) == {"forward", "backward", "optimizer"}
        assert named["forward"] >= FORWARD_S
        assert named["backward"] >= BACKWARD_S
        assert named["optimizer"] >= OPTIMIZER_S
    # Ranks from the Trainer: the environment set none (tests clear RANK, WORLD_SIZE).
    hello = wire.of_kind("hello")[-1]
    assert (hello["rank"], hello["local_rank"], hello["world_size"]) == (0, 0, 1)
    assert hello["framework"] == "lightning"


def test_lightning_accumulating_batches_have_no_optimizer_phase(wire: WireReader) -> None:
    lightning_fit(accumulate=2)
    records = published(wire)
    phases = check_phases(records, {"forward", "backward", "optimizer"})
    with_step = ["optimizer" in named for named in phases]
    assert with_step == [i % 2 == 1 for i in range(len(records))]  # every second batch


@pytest.fixture
def ranks_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")


def test_the_environment_wins_over_the_framework(ranks_in_env: None, wire: WireReader) -> None:
    lightning_fit()
    published(wire)
    hello = wire.of_kind("hello")[-1]
    # RANK and WORLD_SIZE from the environment; LOCAL_RANK, which it lacks, from Lightning.
    assert (hello["rank"], hello["local_rank"], hello["world_size"]) == (3, 0, 8)


# ------------------------------------------------------------------ Hugging Face
class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        time.sleep(FORWARD_S)
        out = slow_backward(self.layer(x))
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def hf_train(tmp_path: Path, **args: Any) -> None:
    transformers = pytest.importorskip("transformers", reason="pip install gputop-dl[frameworks]")
    pytest.importorskip("accelerate", reason="pip install gputop-dl[frameworks]")
    from gputop_dl.probe.integrations.transformers import GputopCallback

    transformers.set_seed(0)
    model = Regressor()
    targs = hf_quiet_args(
        transformers,
        str(tmp_path / "out"),
        per_device_train_batch_size=2,
        learning_rate=0.1,
        num_train_epochs=1,
        **args,
    )
    optimizer = SlowSGD(model.parameters(), lr=0.1)
    trainer = transformers.Trainer(
        model=model,
        args=targs,
        train_dataset=DictData(dataset()),
        callbacks=[GputopCallback()],
        optimizers=(optimizer, None),
    )
    trainer.train()


def test_hf_marks_forward_backward_and_optimizer(wire: WireReader, tmp_path: Path) -> None:
    hf_train(tmp_path)
    records = published(wire)
    assert len(records) == 8
    for named in check_phases(records, {"forward-backward", "optimizer"}):
        assert set(named) == {"forward-backward", "optimizer"}
        assert named["forward-backward"] >= FORWARD_S + BACKWARD_S
        assert named["optimizer"] >= OPTIMIZER_S
    hello = wire.of_kind("hello")[-1]
    assert (hello["rank"], hello["local_rank"], hello["world_size"]) == (0, 0, 1)
    assert hello["framework"] == "transformers"


def test_hf_accumulation_puts_every_micro_batch_in_one_step(
    wire: WireReader, tmp_path: Path
) -> None:
    hf_train(tmp_path, gradient_accumulation_steps=2)
    records = published(wire)
    assert len(records) == 4
    for named in check_phases(records, {"forward-backward", "optimizer"}):
        assert named["forward-backward"] >= 2 * (FORWARD_S + BACKWARD_S)
