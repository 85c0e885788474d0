"""gputop's probe: a few lines in a training script publish its step timings.

    from gputop_dl import probe
    for batch in probe.watch(loader):   # starts a default probe on first use
        ...                              # the training step, unchanged

Importing this package needs neither torch nor Textual, binds nothing and starts no
thread; the default probe starts on the first call to :func:`watch` or :func:`step`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from gputop_dl.probe.core import Outside, Phase, Probe, current
from gputop_dl.probe.version import __version__

# Imported before ``def watch`` below on purpose: loading the submodule binds the package
# attribute ``watch`` to it, and the function defined afterwards must win that name.
from gputop_dl.probe.watch import Watched

T = TypeVar("T")
_default: Probe | None = None  # the last probe default() made, live or not
_default_lock = threading.Lock()


def default() -> Probe:
    """The process's probe: the one the script made with ``Probe(...)``, else one created
    now from the environment. A disabled or failed probe (which ``current()`` does not
    return) is kept too, so that it warns once rather than at every call."""
    global _default
    live = current()
    if live is not None:
        return live
    with _default_lock:
        live = current()
        if live is not None:
            return live
        if _default is None or _default._closed or _default.pid != os.getpid():
            _default = Probe()
        return _default


def watch(
    iterable: Iterable[T],
    *,
    samples: int | Callable[[T], int] | None = None,
    data_path: str | None = None,
) -> Iterable[T]:
    """``iterable`` unchanged for the training, with every pass over it timed.

    The result is re-iterable (each ``for`` over it is an epoch), has the loader's
    ``len()`` and attributes, pickles, and can be handed to a Lightning or HF Trainer.
    With the probe disabled it is ``iterable`` itself.

    ``samples``: samples per batch (int) or a function of the batch; by default the leading
    dimension of the first tensor/array in the batch. ``data_path``: where the
    dataset lives, if the probe cannot tell from the loader.
    """
    return default().watch(iterable, samples=samples, data_path=data_path)


def step(samples: int | None = None) -> None:
    """Mark the end of a training step (for loops that do not use :func:`watch`)."""
    default().step(samples)


def phase(name: str) -> Phase:
    """Time a named part of the step: ``with probe.phase("h2d"): x = x.cuda()``."""
    return default().phase(name)


def outside(what: str = "evaluation") -> Outside:
    """Mark a stretch without steps: ``with probe.outside("evaluation"): evaluate()``.
    Viewers show "outside the training loop" instead of a stall. ``watch`` knows when its
    loop is left by itself; loops timed with :func:`step` need this."""
    return default().outside(what)


__all__ = [
    "Outside",
    "Phase",
    "Probe",
    "Watched",
    "__version__",
    "default",
    "outside",
    "phase",
    "step",
    "watch",
]
