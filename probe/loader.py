"""What the probe can learn about the iterable it wraps, without importing torch."""

from __future__ import annotations

import os
from typing import Any

from gputop_dl.probe.messages import LoaderInfo

_PATH_ATTRS = ("root", "data_dir", "path", "directory", "folder", "img_dir", "data_path")


def describe(iterable: Any, data_path: str | None = None) -> LoaderInfo:
    """Read a DataLoader's settings by duck typing; anything missing stays None."""
    cls = type(iterable)
    is_torch_loader = cls.__module__.startswith("torch.utils.data") or any(
        c.__name__ == "DataLoader" for c in cls.__mro__
    )
    if not is_torch_loader:
        return LoaderInfo(kind=cls.__name__, dataset_path=data_path)
    return LoaderInfo(
        kind="torch.DataLoader",
        num_workers=_int_or_none(getattr(iterable, "num_workers", None)),
        pin_memory=_bool_or_none(getattr(iterable, "pin_memory", None)),
        batch_size=_int_or_none(getattr(iterable, "batch_size", None)),
        prefetch_factor=_int_or_none(getattr(iterable, "prefetch_factor", None)),
        persistent_workers=_bool_or_none(getattr(iterable, "persistent_workers", None)),
        dataset_path=data_path or dataset_path(getattr(iterable, "dataset", None)),
    )


def worker_pids(iterator: Any) -> tuple[int, ...]:
    """PIDs of a torch multiprocessing loader iterator's workers (private attribute)."""
    workers = getattr(iterator, "_workers", None)
    if not isinstance(workers, list):
        return ()
    pids = []
    for worker in workers:
        pid = getattr(worker, "pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return tuple(pids)


def dataset_path(dataset: Any, depth: int = 0) -> str | None:
    """A directory or file the dataset reads, from common attribute names.

    Follows ``.dataset`` through wrappers such as Subset. Used to find the block device
    and filesystem holding the data, so the analyzer can blame the right disk.
    """
    if dataset is None or depth > 3:
        return None
    for attr in _PATH_ATTRS:
        value = getattr(dataset, attr, None)
        if isinstance(value, str | os.PathLike) and os.path.exists(value):
            return os.path.abspath(os.fspath(value))
    files = getattr(dataset, "files", None) or getattr(dataset, "samples", None)
    if isinstance(files, list | tuple) and files:
        first = files[0]
        if isinstance(first, tuple) and first:
            first = first[0]
        if isinstance(first, str | os.PathLike) and os.path.exists(first):
            return os.path.dirname(os.path.abspath(os.fspath(first)))
    return dataset_path(getattr(dataset, "dataset", None), depth + 1)


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
