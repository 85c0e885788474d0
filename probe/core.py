"""The probe that lives in the training process.

The training thread only takes timestamps and appends a tuple to a deque (a few
microseconds per step). Everything else -- building messages, msgpack, zmq sends, host
sampling -- runs on background daemon threads, and every failure is turned into one
warning and a degraded probe: nothing here may raise into, block or slow the loop.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import statistics
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gputop_dl.probe import discovery
from gputop_dl.probe.device_timing import CudaTimer, detect
from gputop_dl.probe.messages import Bye, Hello, LoaderInfo, StepRecord, Steps, System
from gputop_dl.probe.protocol import encode
from gputop_dl.probe.version import __version__

log = logging.getLogger("gputop.probe")

T = TypeVar("T")
ENV_LISTEN = "GPUTOP_LISTEN"
ENV_NAME = "GPUTOP_NAME"
ENV_DISABLE = "GPUTOP_DISABLE"
ENV_DATA_PATH = "GPUTOP_DATA_PATH"
MAX_BUFFERED_STEPS = 50_000  # ~ minutes of fast steps if the publisher thread stalls
IDLE_FLUSH_S = 0.5  # publisher period while no step arrives (agents, evaluation, hangs)
HELLO_EVERY_S = 2.0  # late subscribers learn who we are within this time
DEVICE_EVENT_TIMEOUT_S = 5.0

# Forked children (DataLoader workers) must never touch the parent's sockets or threads.
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)

# (index, t0, t1, t_next, samples, phases, ev_prev_end, ev_start, ev_end)
_Raw = tuple[int, float, float, float, Any, Any, Any, Any, Any]


class Phase:
    """Context manager timing one named part of a step (``with probe.phase("forward")``)."""

    __slots__ = ("_name", "_probe", "_t0")

    def __init__(self, probe: Probe, name: str) -> None:
        self._probe = probe
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> Phase:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        phases = self._probe._phases
        phases[self._name] = phases.get(self._name, 0.0) + time.perf_counter() - self._t0


class Probe:
    """Measures steps and publishes them over ZeroMQ.

    ``name``: run name shown by gputop (default: $GPUTOP_NAME or the script name).
    ``listen``: endpoint to bind (default: $GPUTOP_LISTEN, else a private ipc socket).
    ``sample_host``: run the node sampler here (default: only on local rank 0).
    """

    def __init__(
        self,
        name: str | None = None,
        listen: str | None = None,
        *,
        sample_host: bool | None = None,
        system_interval_s: float = 1.0,
        flush_interval_s: float = 0.1,
        data_path: str | None = None,
        role: str = "probe",
    ) -> None:
        self.role = role  # "agent": no training loop here, only node samples
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.source_id = f"{self.host}:{self.pid}"
        self.name = name or os.environ.get(ENV_NAME) or _script_name()
        self.started = time.time()
        self.enabled = not os.environ.get(ENV_DISABLE)
        self.error: str | None = None
        self.endpoint: str | None = None
        self._listen = listen or os.environ.get(ENV_LISTEN)
        self._flush_interval_s = flush_interval_s
        self._system_interval_s = system_interval_s
        self._data_path = data_path or os.environ.get(ENV_DATA_PATH)
        self._rank = _env_int("RANK")
        self._local_rank = _env_int("LOCAL_RANK")
        self._world_size = _env_int("WORLD_SIZE")
        self._sample_host = (self._local_rank in (None, 0)) if sample_host is None else sample_host

        # Training-thread state. Only the training thread writes these.
        self._steps: deque[_Raw] = deque()
        self._index = 0
        self._dropped_steps = 0
        self._open: tuple[float, float, Any, Any] | None = None  # t0, t1, samples, ev_start
        self._prev_end_event: Any = None
        self._phases: dict[str, float] = {}
        self._samples_override: int | None = None
        self._last_mark: float | None = None
        self._timer: CudaTimer | None = None
        self._timing = "host"
        self._timing_note: str | None = "no steps yet"
        self._timing_checks = 0
        self._loader_info: LoaderInfo | None = None
        self._framework: str | None = None
        self._loop: tuple[str, float | None, str | None] = ("not-started", None, None)

        self._hello_dirty = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._sampler: Any = None
        self._publisher: Any = None
        self._bye_reason = "exit"
        self._encode_warned = False
        if self.enabled:
            self._start()

    # ----------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        from gputop_dl.probe.transport import (  # zmq stays out of import time
            Publisher,
            TransportError,
        )

        try:
            endpoint = self._listen or discovery.ipc_endpoint(self.pid)
            self._publisher = Publisher(endpoint)
            self.endpoint = self._publisher.endpoint
        except (TransportError, discovery.DiscoveryError, OSError) as exc:
            self._degrade(f"{exc}")
            return
        try:
            discovery.register(
                discovery.Record(
                    endpoint=self.endpoint,
                    pid=self.pid,
                    host=self.host,
                    name=self.name,
                    role=self.role,
                    started=self.started,
                )
            )
        except (OSError, discovery.DiscoveryError) as exc:
            log.warning(
                "gputop probe: not discoverable (%s); connect with gputop %s", exc, self.endpoint
            )
        if self._system_interval_s > 0:
            self._sampler = _make_sampler(self)
        self._thread = threading.Thread(target=self._run, name="gputop-publisher", daemon=True)
        self._thread.start()
        _live_probes.add(self)

    def _degrade(self, reason: str) -> None:
        self.enabled = False
        self.error = reason
        log.warning("gputop probe disabled: %s. Training continues unmonitored.", reason)

    def close(self, reason: str = "closed") -> None:
        """Flush, say goodbye and release the socket. Safe to call twice or never."""
        if self._closed or _forked_child or os.getpid() != self.pid:
            return
        self._closed = True
        self.enabled = False
        self._bye_reason = reason
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                self._sampler.close()
        discovery.unregister(self.pid)

    # ----------------------------------------------------------------- hot path
    def watch(
        self,
        iterable: Iterable[T],
        *,
        samples: int | Callable[[T], int] | None = None,
        data_path: str | None = None,
    ) -> Iterable[T]:
        """``iterable`` as the training sees it, each pass over it timed (see watch.py).

        Without a working probe (disabled, forked child) it is ``iterable`` itself.
        """
        if not self.enabled or _forked_child:
            return iterable
        from gputop_dl.probe.watch import Watched

        return Watched(self, iterable, samples=samples, data_path=data_path or self._data_path)

    def _loop_entered(self, info: LoaderInfo | None, framework: str | None) -> None:
        """A watched pass (epoch) starts; ``info`` carries this epoch's worker pids."""
        self._loader_info = info
        self._framework = framework
        self._loop = ("in-loop", time.time(), None)
        if info is not None and info.dataset_path and self._sampler is not None:
            self._sampler.set_data_path(info.dataset_path)  # a store; checked off-thread
        self._hello_dirty.set()

    def _loop_left(self, how: str) -> None:
        """The watched pass ended: "exhausted", "break" or "exception:<Type>"."""
        self._open = None  # a step left open by `break` is dropped
        self._loop = ("outside", time.time(), how)
        self._hello_dirty.set()

    def worker_pids(self) -> frozenset[int]:
        """The DataLoader worker pids of the current pass (for the node sampler)."""
        info = self._loader_info
        return frozenset(info.worker_pids) if info is not None else frozenset()

    def _open_step(self, t0: float, t1: float, n: int | None) -> None:
        if self._timing_checks < 3:
            self._check_timing()
        self._open = (t0, t1, n, self._record_event())

    def _record_event(self) -> Any:
        if self._timer is None:
            return None
        try:
            return self._timer.record()
        except Exception as exc:  # a CUDA error must surface in the training, not here
            self._timer, self._timing = None, "host"
            self._timing_note = f"CUDA events failed ({exc}): step times are host-side"
            self._timing_checks = 3  # do not try again
            self._hello_dirty.set()
            return None

    def _close_step(self, t_next: float) -> None:
        t0, t1, n, ev_start = self._open  # type: ignore[misc]
        ev_end = self._record_event()
        if self._samples_override is not None:
            n = self._samples_override
            self._samples_override = None
        phases: dict[str, float] | None = self._phases
        if phases:
            self._phases = {}
        else:
            phases = None
        if len(self._steps) < MAX_BUFFERED_STEPS:
            self._steps.append(
                (self._index, t0, t1, t_next, n, phases, self._prev_end_event, ev_start, ev_end)
            )
        else:
            self._dropped_steps += 1
        self._prev_end_event = ev_end
        self._index += 1
        self._open = None

    def step(self, samples: int | None = None) -> None:
        """Mark the end of a step for loops that do not use :meth:`watch`.

        Inside a ``watch`` loop it only overrides the sample count of the current step.
        """
        if not self.enabled or _forked_child:
            return
        if self._open is not None:
            self._samples_override = _as_count(samples)
            return
        now = time.perf_counter()
        if self._last_mark is not None:
            if self._timing_checks < 3:
                self._check_timing()
            phases = self._phases or None
            self._phases = {}
            if len(self._steps) < MAX_BUFFERED_STEPS:
                # t1 < 0 says "no data-wait measurement" for explicitly marked steps
                self._steps.append(
                    (
                        self._index,
                        self._last_mark,
                        -1.0,
                        now,
                        _as_count(samples),
                        phases,
                        None,
                        None,
                        None,
                    )
                )
            else:
                self._dropped_steps += 1
            self._index += 1
        self._last_mark = now

    def phase(self, name: str) -> Phase:
        return Phase(self, name)

    def _check_timing(self) -> None:
        self._timing_checks += 1
        timer, timing, note = detect()
        if (timing, note) != (self._timing, self._timing_note):
            self._timer, self._timing, self._timing_note = timer, timing, note
            self._hello_dirty.set()

    # ----------------------------------------------------------- publisher thread
    def hello(self, progress: tuple[int, float | None, float | None] = (0, None, None)) -> Hello:
        """``progress``: (steps published, last step's end time, median recent period)."""
        torch = sys.modules.get("torch")
        return Hello(
            source_id=self.source_id,
            role=self.role,
            name=self.name,
            host=self.host,
            pid=self.pid,
            started=self.started,
            probe_version=__version__,
            rank=self._rank,
            local_rank=self._local_rank,
            world_size=self._world_size,
            torch_version=getattr(torch, "__version__", None) if torch else None,
            devices=_device_names(torch) if self._timing == "cuda-events" else (),
            timing=self._timing,
            timing_note=self._timing_note,
            loader=self._loader_info,
            host_sampler=self._sample_host,
            step_count=progress[0],
            last_step_end=progress[1],
            typical_period_s=progress[2],
            loop=self._loop[0],
            loop_since=self._loop[1],
            loop_exit=self._loop[2],
            framework=self._framework,
        )

    def _run(self) -> None:
        pub = self._publisher
        assert pub is not None
        sent = dropped = 0
        wall_offset = time.time() - time.perf_counter()
        pending: deque[tuple[_Raw, float]] = deque()  # waiting for CUDA events
        last_hello = 0.0
        published = 0
        last_end: float | None = None
        periods: deque[float] = deque(maxlen=30)
        busy = True

        def send(message: Any) -> None:
            nonlocal sent, dropped
            try:
                ok = pub.send(encode(message))
            except Exception as exc:  # serialization error: report once, keep going
                if not self._encode_warned:
                    self._encode_warned = True
                    log.warning(
                        "gputop probe: cannot encode a %s message: %s", type(message).__name__, exc
                    )
                ok = False
            if ok:
                sent += 1
            else:
                dropped += 1

        while True:
            # Each wake-up costs tens of microseconds of CPU: poll slower while idle.
            stopping = self._stop.wait(self._flush_interval_s if busy else IDLE_FLUSH_S)
            try:
                now = time.monotonic()
                records = self._drain(pending, wall_offset, force=stopping)
                busy = bool(records or pending or self._steps)
                if records:
                    published += len(records)
                    last_end = records[-1].end_time
                    periods.extend(r.period_s for r in records)
                if self._hello_dirty.is_set() or now - last_hello >= HELLO_EVERY_S:
                    self._hello_dirty.clear()
                    last_hello = now
                    typical = statistics.median(periods) if periods else None
                    send(self.hello((published, last_end, typical)))
                if records:
                    send(Steps(self.source_id, tuple(records), sent, dropped, self._dropped_steps))
                if self._sampler is not None:
                    for sample in self._sampler.take():
                        send(System(self.source_id, sample))
                if stopping:
                    send(Bye(self.source_id, self._bye_reason, self._index))
                    break
            except Exception as exc:  # never let the thread die silently with a live loop
                log.warning("gputop probe: publisher error: %s", exc)
                if stopping:
                    break
        # Give the I/O thread a moment to push the last frames out before closing.
        time.sleep(0.05)
        pub.close()

    def _drain(
        self, pending: deque[tuple[_Raw, float]], wall_offset: float, force: bool
    ) -> list[StepRecord]:
        steps = self._steps
        now = time.monotonic()
        while steps:
            pending.append((steps.popleft(), now))
        out: list[StepRecord] = []
        timer = self._timer
        while pending:
            raw, queued = pending[0]
            index, t0, t1, t_next, n, phases, ev_prev_end, ev_start, ev_end = raw
            device_s = idle_s = None
            if ev_end is not None and timer is not None:
                try:
                    done = timer.ready(ev_prev_end, ev_start, ev_end)
                except Exception:
                    done = True
                if not done and not force and now - queued < DEVICE_EVENT_TIMEOUT_S:
                    break  # keep order: later steps wait for this one
                if done:
                    with contextlib.suppress(Exception):
                        device_s = timer.elapsed_s(ev_start, ev_end)
                        idle_s = timer.elapsed_s(ev_prev_end, ev_start)
            pending.popleft()
            wait = None if t1 < 0 else t1 - t0
            out.append(
                StepRecord(
                    index=index,
                    end_time=t_next + wall_offset,
                    period_s=t_next - t0,
                    wait_s=wait,
                    samples=n,
                    device_s=device_s,
                    device_idle_s=idle_s,
                    phases=tuple(phases.items()) if phases else (),
                )
            )
        return out


# --------------------------------------------------------------------- helpers
_live_probes: weakref.WeakSet[Probe] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for p in list(_live_probes):
        with contextlib.suppress(Exception):
            p.close("process exit")


def _make_sampler(probe: Probe) -> Any:
    """Start the node sampler; a failure here only costs the system panels."""
    try:
        from gputop_dl.probe.collectors.sampler import NodeSampler

        sampler = NodeSampler(
            main_pid=probe.pid if probe.role == "probe" else None,
            interval_s=probe._system_interval_s,
            host=probe._sample_host,
            data_path=probe._data_path,
            worker_pids=probe.worker_pids,
        )
        sampler.start()
        return sampler
    except Exception as exc:
        log.warning("gputop probe: no system samples: %s", exc)
        return None


def _as_count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _device_names(torch: Any) -> tuple[str, ...]:
    try:
        return tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:
        return ()


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _script_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return os.path.basename(argv0) or "python"
