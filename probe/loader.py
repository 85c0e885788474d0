"""What the probe can learn about the iterable it wraps, without importing torch or
reading a file (it runs on the training thread, once per epoch)."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Hashable
from dataclasses import replace
from types import GeneratorType
from typing import Any, TypeVar

from gputop_dl.probe.messages import LoaderInfo

_PATH_ATTRS = ("root", "data_dir", "path", "directory", "folder", "img_dir", "data_path")
_MAX_DEPTH = 4

# Wrappers that hold the real DataLoader, by (module prefix, class name): the attribute
# that leads to it and the name shown as LoaderInfo.wrapper.
_WRAPPERS: dict[str, tuple[str, str]] = {
    "DataLoaderShard": ("base_dataloader", "accelerate.DataLoaderShard"),
    "DataLoaderDispatcher": ("base_dataloader", "accelerate.DataLoaderDispatcher"),
    "SkipDataLoader": ("base_dataloader", "accelerate.SkipDataLoader"),
    "CombinedLoader": ("iterables", "lightning.CombinedLoader"),
}


def _get(obj: Any, name: str) -> Any:
    """getattr that never raises: properties of third-party loaders may raise anything."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def is_torch_loader(cls: type) -> bool:
    return any(
        c.__name__ in ("DataLoader", "StatefulDataLoader")
        and c.__module__.startswith(("torch.utils.data", "torchdata"))
        for c in cls.__mro__
    )


def map_style(dataloader: Any) -> bool:
    """Whether a torch DataLoader reads a map-style dataset (its iterator's length is
    its own then; over an IterableDataset, len() of its iterator raises)."""
    kind = _get(dataloader, "_dataset_kind")
    return isinstance(kind, int) and kind == 0  # torch's _DatasetKind.Map


def unwrap(iterable: Any) -> tuple[Any, str | None]:
    """The DataLoader inside known wrappers, and the wrapper's name (None: not wrapped).

    ``type()``, not ``isinstance``: accelerate's loaders pretend to be their inner
    DataLoader's class through a ``__class__`` property.
    """
    wrapper: str | None = None
    inner = iterable
    for _ in range(_MAX_DEPTH):
        cls = type(inner)
        entry = _WRAPPERS.get(cls.__name__)
        if entry is None:
            if hasattr(cls, "wrapped") and cls.__module__.startswith("gputop_dl"):
                inner = _get(inner, "wrapped")
                continue
            break
        attr, name = entry
        wrapper = wrapper or name
        nxt = _get(inner, attr)
        if isinstance(nxt, dict | list | tuple):  # CombinedLoader: one iterable inside
            values = list(nxt.values()) if isinstance(nxt, dict) else list(nxt)
            nxt = values[0] if len(values) == 1 else None
        if nxt is None:
            return inner, wrapper
        inner = nxt
    return inner, wrapper


def identity(inner: Any) -> Hashable:
    """What stays the same over the passes of one loop and tells it from another loop's
    (``inner``: the loader inside known wrappers, as ``unwrap`` gives it):
    its dataset (a DataLoader built again every epoch wraps the same one; a dataset that
    grows between epochs stays one) with what splits a dataset between loaders (the
    sampler's type and the index list a subset sampler draws from: a training split's
    and a validation split's SubsetRandomSampler; the batch size; the workers); else the
    loader object itself."""
    dataset = _get(inner, "dataset")
    if dataset is None:
        return id(inner)
    sampler = _get(inner, "sampler")
    indices = _get(sampler, "indices") if sampler is not None else None
    return (
        id(dataset),
        type(sampler).__name__,
        None if indices is None else id(indices),
        _int_or_none(_get(inner, "batch_size")),
        _int_or_none(_get(inner, "num_workers")),
    )


def describe(iterable: Any, data_path: str | None = None) -> LoaderInfo:
    """Read a DataLoader's settings by duck typing, through known wrappers.

    Anything that cannot be read stays None. Touches no file: ``dataset_path`` is the
    candidate the dataset names; the sampler thread checks that it exists.
    """
    inner, wrapper = unwrap(iterable)
    cls = type(inner)
    if not is_torch_loader(cls):
        return LoaderInfo(
            kind=cls.__name__,
            dataset_path=data_path or dataset_path(_get(inner, "dataset")),
            wrapper=wrapper,
        )
    batch_size = _int_or_none(_get(inner, "batch_size"))
    if batch_size is None:  # accelerate builds its loaders around a batch sampler
        batch_sampler = _get(inner, "batch_sampler")
        batch_size = _int_or_none(_get(batch_sampler, "batch_size"))
    num_workers = _int_or_none(_get(inner, "num_workers"))
    prefetch = _int_or_none(_get(inner, "prefetch_factor"))
    return LoaderInfo(
        kind="torchdata.StatefulDataLoader"
        if cls.__name__ == "StatefulDataLoader"
        else "torch.DataLoader",
        num_workers=num_workers,
        pin_memory=_bool_or_none(_get(inner, "pin_memory")),
        batch_size=batch_size,
        # torch keeps prefetch_factor=2 on the object even with no workers, where it means nothing
        prefetch_factor=prefetch if num_workers else None,
        persistent_workers=_bool_or_none(_get(inner, "persistent_workers")),
        dataset_path=data_path or dataset_path(_get(inner, "dataset")),
        wrapper=wrapper,
    )


def framework(iterable: Any) -> str | None:
    """Which framework drives the loop: the loader's own types, then the caller's stack.

    Called once per watched loader, from inside its first ``next()``, so the stack is the
    code driving the loop. Rule: a Lightning type in the wrapper chain, or Lightning code
    on the stack -> "lightning"; ``transformers.trainer`` on the stack -> "transformers"
    (the HF Trainer builds its loader with accelerate); an accelerate loader otherwise ->
    "accelerate"; else None (a plain loop). Importing a framework decides nothing.
    """
    names = []
    inner = iterable
    for _ in range(_MAX_DEPTH):
        cls = type(inner)
        names.append(cls.__module__)
        entry = _WRAPPERS.get(cls.__name__)
        if entry is None:
            break
        nxt = _get(inner, entry[0])
        if not isinstance(nxt, dict | list | tuple) and nxt is not None:
            inner = nxt
        else:
            break
    if any(n.startswith(("lightning", "pytorch_lightning")) for n in names):
        return "lightning"
    if _called_from(("lightning.pytorch.", "pytorch_lightning.")):
        return "lightning"
    if _called_from(("transformers.trainer",)):
        return "transformers"
    if any(n.startswith("accelerate") for n in names):
        return "accelerate"
    return None


def _called_from(prefixes: tuple[str, ...], depth: int = 12) -> bool:
    """Whether a module with one of these prefixes is on the caller's stack (once per epoch)."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith(prefixes):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def worker_pids(iterator: Any, iterable: Any = None) -> tuple[int, ...]:
    """PIDs of the loader's worker processes for this pass (private torch attributes).

    Looks in the iterator (torch's ``_workers``), in the locals of a generator iterator
    (accelerate keeps the DataLoader's iterator there once started), and in the
    persistent iterator of the loader or of the loader inside its wrappers.
    """
    candidates = [iterator]
    if isinstance(iterator, GeneratorType) and iterator.gi_frame is not None:
        # Its locals as the collector sees them: reading ``gi_frame.f_locals`` stores a
        # copy of them in the frame for its life (Python 3.11), which kept accelerate's
        # first two batches (on the device) until the pass ended.
        candidates.extend(gc.get_referents(iterator))
    if iterable is not None:
        inner, _ = unwrap(iterable)
        candidates.extend((_get(iterable, "_iterator"), _get(inner, "_iterator")))
    for candidate in candidates:
        pids = _pids_of(candidate)
        if pids:
            return pids
    return ()


def _pids_of(iterator: Any) -> tuple[int, ...]:
    workers = _get(iterator, "_workers")
    if not isinstance(workers, list):
        return ()
    pids = []
    for worker in workers:
        pid = _get(worker, "pid")
        if isinstance(pid, int) and not isinstance(pid, bool):
            pids.append(pid)
    return tuple(pids)


def with_pids(info: LoaderInfo | None, pids: tuple[int, ...]) -> LoaderInfo | None:
    if info is None or info.worker_pids == pids:
        return info
    return replace(info, worker_pids=pids)


def is_sharded(iterable: Any) -> bool | None:
    """Whether the loader reads a per-rank shard (None: cannot tell)."""
    inner, wrapper = unwrap(iterable)
    if wrapper is not None and wrapper.startswith("accelerate"):
        return True  # accelerate shards through its batch sampler or dispatches
    if not is_torch_loader(type(inner)):
        return None
    samplers = [_get(inner, "sampler"), _get(_get(inner, "batch_sampler"), "sampler")]
    names = {c.__name__ for s in samplers if s is not None for c in type(s).__mro__}
    if names & {"DistributedSampler", "DistributedSamplerWrapper"}:
        return True
    dataset = _get(inner, "dataset")
    if dataset is not None and any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__):
        return None  # an IterableDataset may shard itself
    return False


def dataset_path(dataset: Any, depth: int = 0) -> str | None:
    """The directory or file the dataset names, from common attribute names (unchecked).

    Follows ``.dataset`` through wrappers such as Subset. Used to find the block device
    and filesystem holding the data, so the analyzer can blame the right disk. Reads no
    file: called on the training thread.
    """
    if dataset is None or depth > 3:
        return None
    for attr in _PATH_ATTRS:
        value = _get(dataset, attr)
        if isinstance(value, str | os.PathLike) and os.fspath(value):
            return os.path.abspath(os.fspath(value))
    files = _get(dataset, "files") or _get(dataset, "samples")
    if isinstance(files, list | tuple) and files:
        first = files[0]
        if isinstance(first, tuple) and first:
            first = first[0]
        if isinstance(first, str | os.PathLike) and os.fspath(first):
            return os.path.dirname(os.path.abspath(os.fspath(first)))
    return dataset_path(_get(dataset, "dataset"), depth + 1)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def infer_samples(batch: Any) -> int | None:
    """Leading dimension of the first array-like found in the batch (None if none).

    Called once per step on the training thread, so it stays tiny: a few attribute
    lookups, no imports, no copies.
    """
    x = batch
    for _ in range(4):
        shape = getattr(x, "shape", None)
        if shape is not None:
            try:
                return int(shape[0]) if len(shape) else None
            except (TypeError, ValueError, IndexError):
                return None
        if isinstance(x, list | tuple):
            if not x:
                return None
            x = x[0]
        elif isinstance(x, dict):
            if not x:
                return None
            x = next(iter(x.values()))
        else:
            return None
    return None


T = TypeVar("T")

# How counting() reaches the array in a batch: the batch itself, its first item
# (list, tuple), or its first value (dict).
_SELF, _FIRST_ITEM, _FIRST_VALUE = 0, 1, 2

Route = tuple[type, int, type, bool]  # what _route says
# The route a watched loader's counter learned, read by its C-timed loop (quick_way):
# a one-item list.
Learned = list[Route | None]


def _route(batch: Any) -> Route | None:
    """(batch type, how to reach the array, array type, leading dimension is ``len``)
    when the first array sits at most one container deep and the way there depends on
    types alone, else None.

    Exact built-in containers have no instance attributes, so whether they have a
    ``shape`` is a matter of their type; any other container is walked every time.
    """
    outer = type(batch)
    if getattr(batch, "shape", None) is not None:
        how, x = _SELF, batch
    elif outer is list or outer is tuple:
        if not batch:
            return None
        how, x = _FIRST_ITEM, batch[0]
    elif outer is dict:
        if not batch:
            return None
        how, x = _FIRST_VALUE, next(iter(batch.values()))
    else:
        return None
    if how != _SELF and getattr(x, "shape", None) is None:
        return None
    inner = type(x)
    # numpy's len() is its leading dimension (TypeError when 0-d), and 3x cheaper than
    # .shape[0]; torch's __len__ is Python code, so tensors keep .shape[0].
    is_ndarray = inner.__module__ == "numpy" and inner.__name__ == "ndarray"
    return outer, how, inner, is_ndarray


def counting(
    append: Callable[[int | None], object], learned: Learned | None = None
) -> Callable[[T], T]:
    """A function that passes each batch on as it is and appends its count (what
    :func:`infer_samples` says) with ``append``: one loader's batches, counted faster.

    A loader yields batches of one structure: the way to the array is learned from a
    batch and, while two type checks confirm it, taken directly (no failing attribute
    lookups, no isinstance); any other batch goes through ``infer_samples``. What it
    learns goes in ``learned`` (a one-item list), where watch's C-timed loop reads it
    to count the batches in its own frame (:func:`quick_way`); it calls this counter
    for a batch that does not fit. It never raises.
    """
    memo: Learned = [None] if learned is None else learned
    route: Any = memo[0]  # Any: no narrowing by type(x) is

    def counted(batch: T) -> T:
        nonlocal route
        if route is not None and type(batch) is route[0]:
            try:
                how = route[1]
                array: Any = (
                    batch
                    if how == _SELF
                    else batch[0]  # type: ignore[index]
                    if how == _FIRST_ITEM
                    else next(iter(batch.values()))  # type: ignore[attr-defined]
                )
                if type(array) is route[2]:
                    if route[3]:
                        try:
                            append(len(array))
                        except TypeError:  # a 0-d array
                            append(None)
                        return batch
                    shape = array.shape
                    if shape is not None:
                        append(int(shape[0]) if len(shape) else None)
                        return batch
            except Exception:
                pass  # not what was learned: the general way below says what it is
        n: int | None
        try:
            route = memo[0] = _route(batch)
            n = infer_samples(batch)
        except Exception:  # a property that raises: no count, and never an error
            route = memo[0] = None
            n = None
        append(n)
        return batch

    return counted


class _NoBatch:
    """A type no batch has: the quick way of a loader whose structure is not learned."""


def quick_way(learned: Learned) -> tuple[Any, bool, Any, bool]:  # Any: no narrowing
    """(batch type, array is its first item, array type, count by ``len``) of the
    structure ``learned``, for watch's C-timed loop to count batches in its own frame;
    a way that fits no batch when none is learned or the array is a dict's value."""
    route = learned[0]
    if route is None or route[1] == _FIRST_VALUE:
        return _NoBatch, False, _NoBatch, False
    return route[0], route[1] == _FIRST_ITEM, route[2], route[3]


def sample_counter(learned: Learned | None = None) -> Callable[[Any], int | None]:
    """:func:`infer_samples` for one loader, with the same answers, faster: a
    :func:`counting` that keeps one count at a time (the Python-timed steps of watch)."""
    last: list[int | None] = []
    counted = counting(last.append, learned)

    def count(batch: Any) -> int | None:
        counted(batch)
        return last.pop()

    return count


def batch_plan(iterable: Any) -> tuple[int, int, int] | None:
    """(batch size, position of the last batch, samples in the last batch) for the coming
    pass of a torch DataLoader whose counts are fixed by torch itself, else None.

    torch's own ``BatchSampler`` over a sized sampler yields ``len(batch_sampler)``
    batches of ``batch_size`` indices, only the last one possibly short, and
    ``default_collate`` stacks each index's sample along a new first dimension: every
    batch but the last holds ``batch_size`` samples, a fact, without looking at the
    batch (looking costs a few microseconds per step between real steps:
    bench/probe_overhead.py). A custom collate function, sampler or batch sampler, a
    DataLoader subclass, an IterableDataset or ``in_order=False`` may change the count or
    the order: those are counted per batch.
    Reads attributes only (training thread, once per pass); never raises.
    """
    try:
        cls = type(iterable)
        if cls.__name__ != "DataLoader" or cls.__module__ != "torch.utils.data.dataloader":
            return None
        if _get(iterable, "_dataset_kind") != 0:  # torch's _DatasetKind.Map
            return None
        collate = _get(iterable, "collate_fn")
        if (
            _get(collate, "__name__") != "default_collate"
            or _get(collate, "__module__") != "torch.utils.data._utils.collate"
        ):
            return None
        batch_sampler = _get(iterable, "batch_sampler")
        sampler_cls = type(batch_sampler)
        if sampler_cls.__name__ != "BatchSampler" or sampler_cls.__module__ != (
            "torch.utils.data.sampler"
        ):
            return None
        # torch's samplers report their length exactly; another one may not, and a short
        # batch before the last would then be counted as full.
        sampler_module = type(_get(batch_sampler, "sampler")).__module__
        if not sampler_module.startswith("torch.utils.data."):
            return None
        if _get(iterable, "in_order") is False:  # workers' batches in any order: which is short?
            return None
        size = _int_or_none(_get(batch_sampler, "batch_size"))
        if size is None or size <= 0:
            return None
        samples = len(batch_sampler.sampler)
        batches = len(batch_sampler)
        if batches < 2:  # the first batch is counted anyway
            return None
        short = samples - (batches - 1) * size  # drop_last: len() left the rest out
        return size, batches - 1, short if 0 < short < size else size
    except Exception:  # a sampler without len(), a property that raises: count per batch
        return None
