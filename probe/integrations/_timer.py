"""Step timing from framework hooks: the calls ``Watched`` makes, driven by callbacks.

A step runs from the end of the previous one (the framework starts fetching the next
batch) to its own end; the wait is the part before the framework hands over the batch.
"""

from __future__ import annotations

import time
from typing import Any

from gputop_dl.probe import loader


class HookTimer:
    def __init__(self, probe: Any = None) -> None:
        self._given = probe
        self._t_prev: float | None = None

    def _probe(self) -> Any:
        if self._given is None:
            from gputop_dl import probe

            self._given = probe.default()
        return self._given

    def epoch_start(self, dataloader: Any, framework: str) -> None:
        p = self._probe()
        if not p.enabled:
            return
        info = None
        try:
            if dataloader is not None:
                info = loader.describe(dataloader)
                info = loader.with_pids(info, loader.worker_pids(None, dataloader))
        except Exception:  # describing is best effort
            info = None
        p._loop_entered(info, framework)
        self._t_prev = time.perf_counter()

    def batch_start(self, batch: Any) -> None:
        p = self._probe()
        if not p.enabled or self._t_prev is None:
            return
        now = time.perf_counter()
        try:
            n = loader.infer_samples(batch)
        except Exception:
            n = None
        p._open_step(self._t_prev, now, n)

    def batch_end(self) -> None:
        p = self._probe()
        now = time.perf_counter()
        if p.enabled and p._open is not None:
            p._close_step(now)
        self._t_prev = now

    def epoch_end(self, how: str = "exhausted") -> None:
        p = self._probe()
        if p.enabled and self._t_prev is not None:
            p._loop_left(how)
        self._t_prev = None
