"""``probe.watch(loader)`` is the loader as far as the training can tell.

Real Probes (publishing on a real socket), real DataLoaders with real worker processes.
The probe is a thin recording subclass so the calls the loop makes can be checked.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from gputop_dl import probe
from gputop_dl.probe import loader as loader_mod
from gputop_dl.probe.messages import LoaderInfo
from gputop_dl.probe.watch import Watched

torch = pytest.importorskip("torch", reason="watch is tested on real torch DataLoaders")
from torch.utils.data import (  # noqa: E402
    DataLoader,
    Dataset,
    IterableDataset,
    SubsetRandomSampler,
    TensorDataset,
)


class Recording(probe.Probe):
    """A real probe that also remembers the loop events it was told about."""

    def __init__(self) -> None:
        super().__init__(name="watch-test", system_interval_s=0)
        self.events: list[tuple[str, Any]] = []

    def _loop_entered(self, info: LoaderInfo | None, *rest: Any) -> None:
        if info is not None:  # (an outermost pass is described once iter() made it)
            self.events.append(("entered", info))
        super()._loop_entered(info, *rest)

    def _loop_described(self, info: LoaderInfo | None, *rest: Any) -> None:
        self.events.append(("entered", info))
        super()._loop_described(info, *rest)

    def _loop_left(self, how: str, *rest: Any) -> None:
        self.events.append(("left", how))
        super()._loop_left(how, *rest)


@pytest.fixture
def p() -> Iterator[Recording]:
    rec = Recording()
    assert rec.enabled, rec.error
    yield rec
    rec.close()


def tensor_loader(n: int = 20, batch: int = 4, **kw: Any) -> DataLoader[Any]:
    xs = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return DataLoader(TensorDataset(xs, xs * 2), batch_size=batch, **kw)


def values(batches: Any) -> list[list[float]]:
    return [b[0].squeeze(1).tolist() for b in batches]


def test_wrapping_once_gives_every_epoch_all_its_batches(p: Recording) -> None:
    # Why: the old generator watch ran out after the first epoch (Lightning trained 11 of 20).
    base = tensor_loader()
    watched = p.watch(base)
    epochs = [values(watched) for _ in range(3)]
    assert epochs == [values(base)] * 3
    assert p._index == 3 * 5  # every step of every epoch timed, once
    assert [e[0] for e in p.events] == ["entered", "left"] * 3
    assert [e[1] for e in p.events if e[0] == "left"] == ["exhausted"] * 3


def test_len_and_attributes_are_the_loaders(p: Recording) -> None:
    # Why: HF Trainer raised ValueError with num_train_epochs (no __len__).
    base = tensor_loader(n=18, batch=4)
    watched: Any = p.watch(base)
    assert len(watched) == len(base) == 5
    assert watched.batch_size == 4
    assert watched.dataset is base.dataset and watched.sampler is base.sampler
    assert watched.num_workers == 0 and watched.wrapped is base
    with pytest.raises(AttributeError):
        _ = watched.no_such_attribute
    # No len on the loader: the same TypeError the loader gives.
    gen_watched = p.watch(x for x in range(3))
    with pytest.raises(TypeError):
        len(gen_watched)  # type: ignore[arg-type]


def test_a_pass_has_its_iterators_len(p: Recording) -> None:
    """``len(iter(loader))`` works on a torch DataLoader (a progress bar's total over
    the iterator): a pass gave TypeError."""
    base = tensor_loader(n=18, batch=4)
    it: Any = iter(p.watch(base))
    assert len(it) == len(iter(base)) == 5  # before its first batch
    next(it)
    assert len(it) == 5 and len(list(it)) == 4
    with pytest.raises(TypeError):
        len(iter(p.watch([1, 2, 3])))  # type: ignore[arg-type]  # as len(iter([1, 2, 3]))
    listed: Any = iter(p.watch([1, 2, 3]))
    next(listed)
    with pytest.raises(TypeError):
        len(listed)


class StatefulLoader:
    """A loader with the epoch/state hooks frameworks call (set_epoch, state_dict)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]

    def __iter__(self) -> Iterator[int]:
        for i in range(self.position, 4):
            self.position = i + 1
            yield self.epoch * 10 + i


def test_stateful_hooks_reach_the_loader(p: Recording) -> None:
    base = StatefulLoader()
    watched: Any = p.watch(base)
    watched.set_epoch(2)
    assert list(watched) == [20, 21, 22, 23]
    assert watched.state_dict() == {"position": 4}
    watched.load_state_dict({"position": 2})
    assert list(watched) == [22, 23]


class RaisingProperties:
    """A loader whose attributes raise something other than AttributeError when read."""

    @property
    def dataset(self) -> Any:
        raise KeyError("dataset not ready")

    @property
    def _iterator(self) -> Any:
        raise RuntimeError("no iterator")

    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def test_a_raising_loader_property_never_escapes_the_probe(p: Recording) -> None:
    watched: Any = p.watch(RaisingProperties())
    assert list(watched) == [0, 1, 2, 3]  # describing it did not break the loop
    info = p.events[0][1]
    assert info is not None and info.kind == "RaisingProperties" and info.dataset_path is None
    with pytest.raises(KeyError):  # the user asking gets the loader's own answer
        _ = watched.dataset


def test_a_one_shot_iterator_works_once(p: Recording) -> None:
    watched = p.watch(iter(range(5)))
    assert list(watched) == [0, 1, 2, 3, 4]
    assert list(watched) == []


def test_wrapping_twice_times_each_step_once(p: Recording) -> None:
    base = tensor_loader()
    twice: Any = p.watch(p.watch(base))
    assert twice.wrapped is base
    assert len(list(twice)) == 5
    assert p._index == 5
    assert [e[0] for e in p.events] == ["entered", "left"]


class Exploding(Dataset[Any]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        if i == 5:
            raise ValueError(f"bad sample {i}")
        return torch.tensor([float(i)])


def test_loader_errors_keep_their_type_and_traceback(p: Recording) -> None:
    watched = p.watch(DataLoader(Exploding(), batch_size=2))
    seen = 0
    with pytest.raises(ValueError, match="bad sample 5") as info:
        for _ in watched:
            seen += 1
    assert seen == 2
    exc = info.value
    assert exc.__cause__ is None and exc.__context__ is None  # not wrapped or chained
    frames = traceback.extract_tb(exc.__traceback__)
    assert frames[-1].name == "__getitem__"  # raised where the user's dataset raised it
    assert p.events[-1] == ("left", "exception:ValueError")


def test_break_and_exhaustion_are_told_apart(p: Recording) -> None:
    watched = p.watch(tensor_loader())
    for i, _ in enumerate(watched):
        if i == 1:
            break
    assert p.events[-1] == ("left", "break")
    assert p._open is None  # the step left open by break is dropped
    list(watched)
    assert p.events[-1] == ("left", "exhausted")
    assert p._index == 1 + 5


def test_nested_watched_loops_do_not_break_training(p: Recording) -> None:
    train, val = p.watch(tensor_loader()), p.watch(tensor_loader(n=8))
    got = []
    for batch in train:
        got.append(batch[0].shape[0])
        for _ in val:  # validation inside the training loop, also watched
            pass
    assert got == [4] * 5


def test_each_epoch_tells_its_own_worker_pids(p: Recording) -> None:
    watched = p.watch(tensor_loader(num_workers=2))
    for _ in range(2):
        for _ in watched:
            pass
    infos = [e[1] for e in p.events if e[0] == "entered"]
    assert all(i.num_workers == 2 and len(i.worker_pids) == 2 for i in infos)
    assert set(infos[0].worker_pids) != set(infos[1].worker_pids)  # respawned each epoch
    assert p.worker_pids() == frozenset(infos[1].worker_pids)


def test_iterable_dataset_loader_is_described(p: Recording) -> None:
    class Stream(IterableDataset[Any]):
        root = "/nonexistent/gputop-data"

        def __iter__(self) -> Iterator[Any]:
            return iter(torch.zeros(6, 1))

    watched = p.watch(DataLoader(Stream(), batch_size=3, num_workers=1, persistent_workers=True))
    assert len(list(watched)) == 2
    info = p.events[0][1]
    assert (info.kind, info.batch_size, info.num_workers, info.persistent_workers) == (
        "torch.DataLoader",
        3,
        1,
        True,
    )
    assert info.prefetch_factor == 2 and len(info.worker_pids) == 1
    # The candidate path is handed on unchecked; the sampler thread checks it.
    assert info.dataset_path == "/nonexistent/gputop-data"


def test_describe_reads_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_fs(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("filesystem touched on the training thread")

    ds = TensorDataset(torch.zeros(4, 1))
    ds.root = str(tmp_path)  # type: ignore[attr-defined]
    monkeypatch.setattr(os.path, "exists", no_fs)
    monkeypatch.setattr(os, "stat", no_fs)
    info = loader_mod.describe(DataLoader(ds, batch_size=2))
    assert info.dataset_path == str(tmp_path) and info.prefetch_factor is None


def test_disabled_probe_returns_the_loader_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTOP_DISABLE", "1")
    base = tensor_loader()
    off = probe.Probe(name="off")
    assert off.watch(base) is base


def test_pickles_as_the_loader_and_reattaches(p: Recording) -> None:
    base = tensor_loader()
    watched = p.watch(base, samples=4)
    clone: Any = pickle.loads(pickle.dumps(watched))
    try:
        assert isinstance(clone, Watched) and clone._gputop_probe is probe.default()
        assert clone._gputop_samples == 4 and values(clone) == values(base)
    finally:
        probe.default().close()
        probe._default = None


def _child_iterates(watched: Any, queue: Any) -> None:
    queue.put((type(watched).__name__, values(watched), values(watched)))


@pytest.mark.parametrize("disabled", [False, True])
def test_a_spawned_process_gets_a_working_loader(
    p: Recording, monkeypatch: pytest.MonkeyPatch, disabled: bool
) -> None:
    if disabled:
        monkeypatch.setenv("GPUTOP_DISABLE", "1")  # inherited by the spawned child
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    base = tensor_loader()
    child = ctx.Process(target=_child_iterates, args=(p.watch(base), queue))
    child.start()
    kind, first, second = queue.get(timeout=120)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert kind == ("DataLoader" if disabled else "Watched")
    assert first == second == values(base)


def test_sampler_checks_the_data_path_on_its_own_thread(tmp_path: Path) -> None:
    from gputop_dl.probe.collectors.sampler import NodeSampler

    sampler = NodeSampler(main_pid=None, host=True, accelerators=False)
    try:
        sampler.set_data_path("/nonexistent/gputop-data")  # a store, nothing resolved yet
        first = sampler.sample()
        assert not any(s.source == "data_path" for s in first.statuses)  # ignored: not here
        sampler.set_data_path(str(tmp_path))
        second = sampler.sample()
        status = next(s for s in second.statuses if s.source == "data_path")
        assert str(tmp_path) in status.message
    finally:
        sampler.close()


def test_an_inner_loop_leaves_the_training_loader_described(p: Recording) -> None:
    """An evaluation loop watched inside a training step described its own loader in the
    hello for the rest of the epoch: its workers (gone) judged as the training's, and the
    training's pass starts with the evaluation loader's settings (a review)."""
    train = p.watch(tensor_loader(n=40, num_workers=2, persistent_workers=True))
    val = p.watch(tensor_loader(n=8))
    during = after = None
    for i, _ in enumerate(train):
        if i == 3:
            for _ in val:
                during = p.hello().loader
            after = p.hello().loader
    assert during == after, (during, after)
    assert after is not None and after.num_workers == 2 and len(after.worker_pids) == 2, after
    assert p.worker_pids() == frozenset(after.worker_pids)


def test_each_loaders_pass_starts_are_listed_apart(p: Recording) -> None:
    """A training loop and an evaluation loop after each epoch, both outermost: the hello
    lists each loader's pass starts with its own settings, the current one last (it listed
    only the current loader's: a viewer judged the training's starts during training and
    the evaluation's during evaluation, and the verdict flipped between them)."""
    train, val = tensor_loader(n=20, num_workers=2), tensor_loader(n=8, batch=2)
    for _ in range(3):
        for _ in p.watch(train):  # a new wrapper each epoch, as scripts write it
            pass
        training = p.hello()
        for _ in p.watch(val):
            pass
        evaluation = p.hello()
    assert training.loader is not None and training.loader.batch_size == 4
    assert evaluation.loader is not None and evaluation.loader.batch_size == 2
    by_batch = {
        (lp.loader.batch_size if lp.loader else None): lp.starts for lp in evaluation.passes
    }
    assert by_batch == {4: (0, 9, 18), 2: (5, 14, 23)}, evaluation.passes  # 5 + 4 steps an epoch
    assert [lp.starts for lp in training.passes] == [(5, 14), (0, 9, 18)], training.passes
    assert not any(lp.rebuilt for lp in evaluation.passes)  # one DataLoader each, reused
    # Worker pids change each pass of workers not kept: only the hello's loader has them.
    assert training.loader.worker_pids and evaluation.passes[0].loader is not None
    assert evaluation.passes[0].loader.num_workers == 2
    assert evaluation.passes[0].loader.worker_pids == ()


def train_then_evaluate(p: probe.Probe, train: Any, val: Any, epochs: int) -> None:
    """``epochs`` passes over ``train``, each followed by one over ``val`` (both watched)."""
    for _ in range(epochs):
        for _ in p.watch(train):
            pass
        for _ in p.watch(val):
            pass


def test_an_empty_pass_leaves_its_first_step_to_the_next_loader(p: Recording) -> None:
    """An evaluation loader found empty, then the training's next pass: both began at one
    step index, which is the training's (listed under both, a viewer could take the
    training's first step for the evaluation's)."""
    train, empty = tensor_loader(n=20), tensor_loader(n=0, batch=2)
    train_then_evaluate(p, train, empty, 2)
    assert [lp.starts for lp in p.hello().passes] == [(0, 5), (10,)]  # the next step's
    for _ in p.watch(train):
        pass
    by_batch = {(lp.loader.batch_size if lp.loader else None): lp.starts for lp in p.hello().passes}
    assert by_batch == {2: (), 4: (0, 5, 10)}, by_batch


def test_a_loader_built_again_every_epoch_keeps_its_pass_starts(p: Recording) -> None:
    """``for epoch: loader = DataLoader(dataset, ...)``: a new loader each pass over one
    dataset is one loop's passes (keyed by the loader object, each epoch was a loop of its
    own, its one start all the hello listed: no restart cost could be seen)."""
    dataset = TensorDataset(torch.arange(20, dtype=torch.float32).unsqueeze(1))
    for _ in range(3):
        for _ in p.watch(DataLoader(dataset, batch_size=4)):
            pass
    (listed,) = p.hello().passes
    assert listed.starts == (0, 5, 10) and listed.rebuilt, listed  # a new object each pass


def test_every_start_from_the_oldest_listed_on_is_listed(p: Recording) -> None:
    """A training of 2-step passes and an evaluation every 8 of them: the training's list
    (16 starts) reaches back 16 passes, the evaluation's further. The evaluation's older
    starts go with the training's forgotten ones, or a viewer counted the forgotten
    training passes' steps as the evaluation's, their restarts as any other wait (a
    review: "cause unknown" where each pass restarted its workers)."""
    train, val = tensor_loader(n=8), tensor_loader(n=4, batch=2)
    for epoch in range(40):
        for _ in p.watch(train):
            pass
        if epoch % 8 == 7:
            for _ in p.watch(val):
                pass
    listed = {(lp.loader.batch_size if lp.loader else None): lp.starts for lp in p.hello().passes}
    assert len(listed[4]) == 16 and len(listed[2]) <= 3, listed  # 5 run, 2-3 since
    # From the oldest listed start on, every pass's start is listed: 2 steps each.
    merged = sorted(listed[4] + listed[2])
    assert all(b - a == 2 for a, b in pairwise(merged)), merged


def test_loaders_splitting_one_dataset_are_listed_apart(p: Recording) -> None:
    """``DataLoader(ds, sampler=SubsetRandomSampler(train_idx))`` and the same over
    ``val_idx``: one dataset, two loaders (keyed by the dataset alone, they were one,
    with whichever's settings ran last, and the verdict flipped with it)."""
    ds = TensorDataset(torch.arange(40, dtype=torch.float32).unsqueeze(1))
    train = DataLoader(ds, batch_size=4, sampler=SubsetRandomSampler(range(32)))
    val = DataLoader(ds, batch_size=4, sampler=SubsetRandomSampler(range(32, 40)))
    train_then_evaluate(p, train, val, 3)
    assert [lp.starts for lp in p.hello().passes] == [(0, 10, 20), (8, 18, 28)]


def test_a_dataset_that_grows_between_epochs_stays_one_loader(p: Recording) -> None:
    """A replay buffer, active learning: the dataset's length changes every epoch (keyed
    by its sampler's length, each epoch was a loader of its own: every start a first,
    the 8 loaders kept evicted in turn)."""

    class Growing(Dataset[Any]):
        def __init__(self) -> None:
            self.n = 8

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> Any:
            return torch.zeros(1)

    ds = Growing()
    train = DataLoader(ds, batch_size=4, shuffle=True)
    for _ in range(3):
        for _ in p.watch(train):
            pass
        ds.n += 4
    assert [lp.starts for lp in p.hello().passes] == [(0, 2, 5)]


def test_the_hello_never_misses_the_loader_of_a_pass_being_started(p: Recording) -> None:
    """The hello is built on the publisher's thread while the training thread notes a
    pass's start: that loader's entry must never be out of the table meanwhile (it was
    popped and put back: a hello in between left it out, its steps counted as the
    previous pass's)."""
    ops: list[str] = []

    class Watching(OrderedDict):  # type: ignore[type-arg]
        def pop(self, *args: Any) -> Any:
            ops.append("pop")
            return super().pop(*args)

        def __delitem__(self, key: Any) -> None:
            ops.append("del")
            super().__delitem__(key)

    p._pass_starts = Watching()
    train_then_evaluate(p, tensor_loader(n=8), tensor_loader(n=4, batch=2), 3)
    assert len(p.hello().passes) == 2 and ops == [], ops


def test_an_outermost_pass_is_in_the_loop_while_iter_runs(p: Recording) -> None:
    """iter() of a DataLoader with workers forks them and runs the sampler's __iter__
    (a shuffle of a large index: seconds): that time is the pass's start, in the loop (it
    read "outside the training loop", info, a hang there hidden for good). A loader that
    cannot start leaves the loop on its exception."""
    seen: list[str] = []

    class SlowStart:
        def __iter__(self) -> Iterator[int]:
            seen.append(p._loop)
            return iter(range(3))

    class Broken:
        def __iter__(self) -> Iterator[int]:
            seen.append(p._loop)
            raise RuntimeError("cannot open the shards")

    for _ in p.watch(SlowStart()):
        pass
    assert seen == ["in-loop"] and p._loop == "outside"
    with pytest.raises(RuntimeError, match="shards"):
        for _ in p.watch(Broken()):
            pass
    assert seen == ["in-loop", "in-loop"]
    assert (p._loop, p._loop_exit, p._passes) == ("outside", "exception:RuntimeError", 0)


def test_a_pass_being_started_keeps_its_loaders_description(p: Recording) -> None:
    """Entered before iter(), described after it: meanwhile the hello describes the
    loader as its last pass did, not as None (a viewer judged its starts with no workers
    during every start: "pass-start" where it was "worker-restarts")."""
    described: list[LoaderInfo | None] = []

    class Loader:
        def __iter__(self) -> Iterator[int]:
            described.append(p.hello().passes[-1].loader)
            return iter(range(3))

    loader = Loader()
    for _ in range(2):
        for _ in p.watch(loader):
            pass
    assert described[0] is None  # its first pass: nothing known yet
    assert described[1] is not None and described[1].kind == "Loader", described
