"""Sample counts torch itself fixes are taken from the loader, not read off each batch.

``loader.batch_plan`` answers only where torch's own BatchSampler, sampler and
default_collate decide the count; everything else is counted batch by batch. The counts
are checked as a viewer reads them: over a real socket, decoded by tests/wire_reader.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gputop_dl import probe
from gputop_dl.probe.loader import batch_plan
from tests.wire_reader import WireReader

torch = pytest.importorskip("torch")
from torch.utils.data import (  # noqa: E402
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
    TensorDataset,
)

pytestmark = pytest.mark.usefixtures("no_probe_left_behind")


def tensors(n: int = 10) -> TensorDataset:
    xs = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return TensorDataset(xs, xs * 2)


class Strings(Dataset[str]):
    """Items default_collate turns into a list of strings: nothing to read a count from."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> str:
        return f"item {i}"


class Stream(IterableDataset[Any]):
    def __iter__(self) -> Iterator[Any]:
        return iter(torch.zeros(10, 1))


class LyingSampler(Sampler[int]):
    """Says 12 indices, yields 10: only a sampler torch wrote is trusted with len()."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(10))

    def __len__(self) -> int:
        return 12


class MyLoader(DataLoader[Any]):
    pass


def drop_one(batch: list[Any]) -> Any:
    return torch.stack([x for x, _ in batch[:-1]])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: DataLoader(tensors(), batch_size=4), (4, 2, 2)),
        (lambda: DataLoader(tensors(), batch_size=4, shuffle=True), (4, 2, 2)),
        (lambda: DataLoader(tensors(), batch_size=4, drop_last=True), (4, 1, 4)),
        (lambda: DataLoader(tensors(), batch_size=5), (5, 1, 5)),
        (
            lambda: DataLoader(
                tensors(), batch_size=2, sampler=DistributedSampler(tensors(), 2, 0)
            ),
            (2, 2, 1),
        ),
        (lambda: DataLoader(Strings(), batch_size=4), (4, 2, 2)),
        (lambda: DataLoader(tensors(), batch_size=10), None),  # one batch: it is counted
        (lambda: DataLoader(tensors(), batch_size=None), None),  # no batching
        (lambda: DataLoader(tensors(), batch_size=4, collate_fn=drop_one), None),
        (lambda: DataLoader(tensors(), batch_size=4, sampler=LyingSampler()), None),
        (lambda: DataLoader(Stream(), batch_size=4), None),
        (lambda: MyLoader(tensors(), batch_size=4), None),
        (lambda: [torch.zeros(4, 1)] * 3, None),
        (lambda: None, None),
    ],
)
def test_only_counts_torch_fixes_are_planned(make: Any, expected: Any) -> None:
    assert batch_plan(make()) == expected


def test_a_loader_whose_length_raises_is_counted_per_batch() -> None:
    loader = DataLoader(tensors(), batch_size=4)

    class NoLen:
        batch_size = 4
        drop_last = False
        sampler = loader.batch_sampler.sampler

        def __len__(self) -> int:
            raise TypeError("no len")

    NoLen.__name__, NoLen.__module__ = "BatchSampler", "torch.utils.data.sampler"
    object.__setattr__(loader, "batch_sampler", NoLen())
    assert batch_plan(loader) is None


def published_counts(loader: Any, epochs: int = 1, **watch: Any) -> list[int | None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    p = probe.Probe(name="plan", listen=endpoint, system_interval_s=0)
    reader = WireReader(endpoint)
    time.sleep(0.3)
    watched = p.watch(loader, **watch)
    for _ in range(epochs):
        for _ in watched:
            pass
    p.close()
    reader.pump(0.8)
    return [r["samples"] for r in reader.steps()]


@pytest.mark.parametrize(
    ("loader", "expected"),
    [
        (DataLoader(tensors(), batch_size=4), [4, 4, 2]),
        (DataLoader(tensors(), batch_size=4, drop_last=True), [4, 4]),
        (DataLoader(tensors(9), batch_size=3), [3, 3, 3]),
        # counted per batch: the collate function decides
        (DataLoader(tensors(), batch_size=4, collate_fn=drop_one), [3, 3, 1]),
        # torch's batching says 4 samples where the batch itself shows no array
        (DataLoader(Strings(), batch_size=4), [4, 4, 2]),
    ],
)
def test_published_counts_are_the_batches_samples(loader: Any, expected: list[Any]) -> None:
    assert published_counts(loader, epochs=2) == expected * 2


def test_a_first_batch_that_disagrees_with_the_plan_is_counted_batch_by_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A plan the batches contradict (a torch change, a case not foreseen): the counted
    # first batch wins and every batch of the pass is counted.
    monkeypatch.setattr("gputop_dl.probe.loader.batch_plan", lambda _loader: (5, 2, 5))
    assert published_counts(DataLoader(tensors(), batch_size=4)) == [4, 4, 2]


def test_a_fixed_samples_count_is_the_users_word() -> None:
    assert published_counts(DataLoader(tensors(), batch_size=4), samples=7) == [7, 7, 7]
