"""Step timing from framework hooks: the calls ``Watched`` makes, driven by callbacks.

A step runs from the end of the previous one (the framework starts fetching the next
batch) to its own end; the wait is the part before the framework hands over the batch.
Inside the step, :class:`PhaseClock` turns the framework's hooks into named phases
(``forward``, ``backward``, ``optimizer``...): each hook ends the phase running and
starts the next (or none), and the phases are logged into the open step with the
probe's phase log, as ``with probe.phase(name)`` would log them.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from gputop_dl.probe import loader
from gputop_dl.probe import stack as stacks


class PhaseClock:
    """The phase running inside a step and the time each phase took so far (pure)."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.since = 0.0
        self.totals: dict[str, float] = {}

    def mark(self, name: str | None, now: float) -> None:
        """The phase running from ``now`` on is ``name`` (None: an unnamed part)."""
        if self.current is not None:
            self.totals[self.current] = self.totals.get(self.current, 0.0) + max(
                0.0, now - self.since
            )
        self.current, self.since = name, now

    def finish(self, now: float) -> dict[str, float]:
        """The step ended: every phase's time in it; the clock starts empty again."""
        self.mark(None, now)
        totals, self.totals = self.totals, {}
        return totals


class HookTimer:
    def __init__(self, probe: Any = None) -> None:
        self._given = probe
        self._t_prev: float | None = None
        self.phases = PhaseClock()
        self._away: Any = None  # the probe's Outside while the framework is away

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (Lightning's ddp_spawn sends the callbacks to each process it starts):
        no probe goes along, nor a step under way. A probe is its own process's
        (sockets, threads, locks: "cannot pickle '_thread.RLock' object" stopped the
        fit); the copy uses its process's default probe."""
        return {
            **self.__dict__,
            "_given": None,
            "_t_prev": None,
            "_away": None,
            "phases": PhaseClock(),
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> HookTimer:
        """A copy in this process (a framework's deepcopy of its callbacks): the same
        probe, no step under way."""
        return HookTimer(self._given)

    def _probe(self) -> Any:
        if self._given is None:
            from gputop_dl import probe

            self._given = probe.default()
        return self._given

    def epoch_start(
        self,
        dataloader: Any,
        framework: str,
        ranks: tuple[int | None, int | None, int | None] = (None, None, None),
    ) -> None:
        """``ranks``: (rank, local rank, world size) as the framework knows them, used
        where the environment does not say."""
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
        if any(r is not None for r in ranks):
            p._set_ranks(*ranks)
        instance = loader.unwrap(dataloader)[0] if dataloader is not None else None
        key = loader.identity(instance) if instance is not None else None
        p._loop_entered(info, framework, key, instance)
        # The framework's loop frame, where it has no hook for an exception (HF): the
        # probe sees the loop left when the training thread is no longer in it.
        code = stacks.loop_code(sys._getframe(1))
        p._loop_code = (code, threading.get_ident()) if code is not None else None
        self._t_prev = time.perf_counter()

    def away(self, what: str) -> None:
        """The framework left its training loop inside the epoch (a validation, an
        evaluation, a checkpoint): viewers show "outside the training loop: <what>", not
        a stall once it lasts, and its time is in no step (it was the next step's wait:
        "input-bound"). Until :meth:`back`, or the next batch."""
        p = self._probe()
        if p.enabled and self._t_prev is not None and self._away is None:
            self._away = p.outside(what)
            self._away.__enter__()

    def back(self) -> None:
        """Back in the training loop: the next step's wait starts now."""
        if self._leave_away():
            self._t_prev = time.perf_counter()

    def _leave_away(self) -> bool:
        """Ends the time away, if any. True: there was one."""
        away, self._away = self._away, None
        if away is None:
            return False
        away.__exit__(None, None, None)
        return True

    def batch_start(self, batch: Any, phase: str | None = None) -> None:
        """The batch arrived; ``phase``: the phase it starts with (e.g. "forward")."""
        p = self._probe()
        if not p.enabled or self._t_prev is None:
            return
        now = t1 = time.perf_counter()
        if self._leave_away():  # no hook said it was back: from here on, a step
            # Whatever ended it (a checkpoint's write: Lightning has no hook after it)
            # is in this step's wait: not a wait for data, none measured.
            t1 = -1.0
        try:
            n = loader.infer_samples(batch)
        except Exception:
            n = None
        p._open_step(self._t_prev, t1, n)
        self.phases.finish(now)  # nothing of an earlier, unfinished step is kept
        self.phases.mark(phase, now)

    def phase(self, name: str | None) -> None:
        """A hook inside the step: ``name`` runs from now on (None: an unnamed part)."""
        if self._t_prev is not None:
            self.phases.mark(name, time.perf_counter())

    def batch_end(self) -> None:
        p = self._probe()
        now = time.perf_counter()
        totals = self.phases.finish(now)
        if p.enabled and p._open is not None:
            for name, seconds in totals.items():
                p._log_phase(name, seconds)
            p._close_step(now)
        self._t_prev = now

    def epoch_end(self, how: str = "exhausted") -> None:
        p = self._probe()
        self.back()
        if p.enabled and self._t_prev is not None:
            p._loop_left(how)
        self._t_prev = None


def attr_int(obj: Any, name: str) -> int | None:
    """``obj.name`` when it is an int (a rank, a world size), else None."""
    try:
        value = getattr(obj, name, None)
    except Exception:  # a property that needs a distributed setup that is not there
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
