"""Intel Gaudi HPUs through the ``hl-smi`` command-line tool.

This is the only module in the project that runs ``hl-smi``. Formats are those recorded in
/work/shared/reference/hl-smi.md. One hl-smi call costs tens to hundreds of milliseconds,
so it never runs on the caller's thread: :meth:`HlSmiCollector.start` launches a
background thread that keeps a long-lived ``hl-smi ... -l N`` child and reads its rows
line by line; :meth:`HlSmiCollector.latest` only copies the last complete sample under a
lock, so it never blocks and never raises.

Failure handling, all reported through ``SourceStatus`` in words a user can act on:

* not installed -> "hl-smi not installed" (nothing is started);
* no row within ``timeout_s`` -> "hl-smi timed out after 2 s", the child is killed and
  restarted with exponential backoff;
* non-zero exit -> the first line of its stderr; if ``power.max`` was queried (a
  version-dependent field) the query is retried once without it;
* output that is not the CSV we asked for -> "hl-smi printed unparseable output: ...";
* the loop child goes quiet for more than 3 intervals -> its last rows are sent with
  ``state="stale"`` (a fact for the viewer, which neither shows nor judges them as live), and a
  little later the child is killed and restarted;
* a loop child whose output never arrives (a tool that block-buffers a pipe) -> fall back
  to one timed call per interval, which gets its output at exit.

Children are started from an argv list (no shell) and killed at ``close()`` and at
interpreter exit; should the interpreter die without running ``atexit`` the loop child
gets SIGPIPE on its next write into our closed pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import selectors
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputop_dl.probe.samples import ABSENT, FAILING, STARTING, HpuSample, SourceStatus

SOURCE = "hl-smi"

#: Queried fields, ``index`` first so loop-mode samples can be split on it.
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.max",
    "temperature.aip",
    "utilization.aip",
)
#: Seen in real use but version-dependent: dropped if this hl-smi rejects it.
OPTIONAL_FIELD = "power.max"
#: Where hl-smi lives when it is not on PATH (sudo/cron/containers trim PATH).
SEARCH_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/local/bin", "/opt/habanalabs/bin")

# Cells meaning "not reported" (compared lower-case): never turned into zero.
_NOT_REPORTED = {"", "n/a", "[n/a]", "na", "not supported", "[not supported]"}
_HEADER_CELL = re.compile(r"^(?P<name>.*?)\s*\[(?P<unit>[^\]]*)\]$")
_BYTES_PER_UNIT = {
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_WATTS_PER_UNIT = {"w": 1.0, "mw": 1e-3, "kw": 1e3}


class HlSmiParseError(ValueError):
    """A line that is not a CSV row of the queried fields."""

    def __init__(self, line: str) -> None:
        super().__init__(f"unparseable hl-smi output: {line[:60]!r}")
        self.line = line


# -- parsing (pure) ---------------------------------------------------------------------


def _split(line: str, n: int) -> list[str]:
    # hl-smi separates with ", "; plain "," is accepted too (no queried value has commas).
    cells = line.split(", ")
    if len(cells) != n:
        cells = line.split(",")
    if len(cells) != n:
        raise HlSmiParseError(line)
    return [c.strip() for c in cells]


class _CsvDecoder:
    """Decodes CSV lines one at a time (a loop child delivers them one at a time).

    Remembers the ``[unit]`` suffixes of a header line, so ``nounits`` values get the
    same ``"<number> <unit>"`` shape as values printed with units.
    """

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = list(fields)
        self.units: list[str | None] = [None] * len(self.fields)

    def feed(self, line: str) -> dict[str, str | None] | None:
        text = line.strip()
        if not text:
            return None
        cells = _split(text, len(self.fields))
        if self._is_header(cells):
            self.units = [self._header_unit(c) for c in cells]
            return None
        row: dict[str, str | None] = {}
        for name, cell, unit in zip(self.fields, cells, self.units, strict=True):
            if cell.lower() in _NOT_REPORTED or cell.split()[0].lower() == "n/a":
                row[name] = None
            elif unit and " " not in cell:
                row[name] = f"{cell} {unit}"
            else:
                row[name] = cell
        return row

    def _is_header(self, cells: list[str]) -> bool:
        first = _HEADER_CELL.match(cells[0])
        name = first.group("name") if first else cells[0]
        return name.strip().lower() == self.fields[0].lower()

    @staticmethod
    def _header_unit(cell: str) -> str | None:
        match = _HEADER_CELL.match(cell)
        return match.group("unit").strip() or None if match else None


def parse_hlsmi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Rows of ``hl-smi -Q <fields> -f csv[,noheader][,nounits]`` output, keyed by field.

    * header or not: a line whose first cell is the first field's name is a header;
      its ``[unit]`` suffixes are remembered;
    * units or not: a value becomes ``"<number> <unit>"`` when a unit is known (printed
      with the value, or from the header), else the bare text (``"672"``);
    * ``N/A``, empty and similar cells become ``None`` (not reported -- never zero);
    * ``", "`` separated (plain ``","`` tolerated); fields this module does not know
      are passed through as text.

    Raises :class:`HlSmiParseError` for a line that does not have one cell per field.
    """
    decoder = _CsvDecoder(fields)
    rows: list[dict[str, str | None]] = []
    for line in text.splitlines():
        row = decoder.feed(line)
        if row is not None:
            rows.append(row)
    return rows


def _number(value: str | None) -> tuple[float, str] | None:
    if value is None:
        return None
    parts = value.split(None, 1)
    try:
        number = float(parts[0])
    except (ValueError, IndexError):
        return None  # e.g. a driver's error token in one cell: that field is unknown
    unit = parts[1].strip().lower() if len(parts) > 1 else ""
    return number, unit


def _to_bytes(value: str | None) -> int | None:
    parsed = _number(value)
    if parsed is None:
        return None
    number, unit = parsed
    factor = _BYTES_PER_UNIT.get(unit or "mib")  # hl-smi reports memory in MiB
    return None if factor is None else int(number * factor)


def _to_watts(value: str | None) -> float | None:
    parsed = _number(value)
    if parsed is None:
        return None
    number, unit = parsed
    factor = _WATTS_PER_UNIT.get(unit or "w")
    return None if factor is None else number * factor


def _plain(value: str | None, units: tuple[str, ...]) -> float | None:
    parsed = _number(value)
    if parsed is None or (parsed[1] and parsed[1] not in units):
        return None  # an unexpected unit: better unknown than wrong
    return parsed[0]


def hpu_sample_from_row(row: dict[str, str | None]) -> HpuSample:
    """One parsed row -> :class:`HpuSample` (MiB -> bytes). Needs a numeric ``index``."""
    raw_index = row.get("index")
    try:
        index = int(raw_index or "")
    except ValueError:
        raise HlSmiParseError(", ".join(str(v) for v in row.values())) from None
    return HpuSample(
        index=index,
        name=row.get("name"),
        uuid=row.get("uuid"),
        util_pct=_plain(row.get("utilization.aip"), ("%",)),
        mem_used_bytes=_to_bytes(row.get("memory.used")),
        mem_total_bytes=_to_bytes(row.get("memory.total")),
        power_w=_to_watts(row.get("power.draw")),
        power_max_w=_to_watts(row.get("power.max")),
        temperature_c=_plain(row.get("temperature.aip"), ("c", "°c")),
    )


MISSING_TEXT = "hl-smi no longer lists it"


class LoopSplitter:
    """Groups a loop child's rows into samples.

    Rows of the next sample follow with no separator; a new sample starts when a device
    index shows up again (hl-smi.md: "a new sample starts when the first queried device
    appears again"): that ends the one before, whole. The devices of the last whole
    sample are the node's: :meth:`ready` gives the sample being read early, once it
    holds every one of them (the pipe gone quiet: not held back a whole interval), never
    a part of it (an hl-smi that stopped mid-sample, rows printed one at a time). A
    device a whole sample lacks is reported lost, not dropped.
    """

    def __init__(self, known: set[int] | None = None) -> None:
        self._rows: dict[int, HpuSample] = {}
        # The devices of the whole samples so far (the collector's, kept across children).
        self._known: set[int] = known if known is not None else set()
        self._given = False  # ready() looked at the rows being read: wait for more

    @property
    def pending(self) -> bool:
        return bool(self._rows) and not self._given

    def add(self, sample: HpuSample) -> tuple[HpuSample, ...] | None:
        """Take a row; the sample it ended, whole, if it starts the next one."""
        done = None
        if sample.index in self._rows:
            done = self._whole()
            self._rows = {}
        self._rows[sample.index] = sample
        self._given = False
        return done

    def ready(self) -> tuple[HpuSample, ...] | None:
        """The sample being read, early, if it has all the node's devices (before a
        first whole sample says how many there are, as read: rows given one at a time
        then come as growing samples, until the next sample begins); else None, and not
        asked again before another row comes."""
        if not self._rows or self._given:
            return None
        self._given = True
        return self._sorted(self._rows) if self._known <= self._rows.keys() else None

    def finish(self) -> tuple[HpuSample, ...] | None:
        """The rows read, whole: a one-shot call that exited cleanly printed them all."""
        if not self._rows:
            return None
        done = self._whole()
        self._rows, self._given = {}, True
        return done

    def _whole(self) -> tuple[HpuSample, ...]:
        self._known |= self._rows.keys()
        rows = dict(self._rows)
        for index in self._known - rows.keys():
            rows[index] = HpuSample(index, None, None, state="lost", error=MISSING_TEXT)
        return self._sorted(rows)

    @staticmethod
    def _sorted(rows: dict[int, HpuSample]) -> tuple[HpuSample, ...]:
        return tuple(sorted(rows.values(), key=lambda s: s.index))


def find_hlsmi(executable: str | None = None) -> str | None:
    """Path of the hl-smi to run: the given one, else PATH, else the usual install dirs."""
    if executable:
        if os.sep in executable:
            return executable if _is_executable(executable) else None
        return shutil.which(executable)
    found = shutil.which("hl-smi")
    if found:
        return found
    for directory in SEARCH_DIRS:
        candidate = os.path.join(directory, "hl-smi")
        if _is_executable(candidate):
            return candidate
    return None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


# -- children that must not outlive us --------------------------------------------------

_live_lock = threading.Lock()
_live: set[subprocess.Popen[bytes]] = set()
_exiting = False  # set at interpreter exit: no new children from then on


def _kill_live_children() -> None:
    global _exiting
    with _live_lock:
        # Under the lock: a thread about to spawn either registered its child already
        # (killed below) or will see the flag and not spawn. Without this a collector
        # thread would "restart" the child we kill here, after atexit has run.
        _exiting = True
        procs = list(_live)
    for proc in procs:
        _kill(proc)


atexit.register(_kill_live_children)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)  # reap it: no zombie left behind


# -- the collector ----------------------------------------------------------------------


@dataclass
class _Outcome:
    kind: str  # stopped | done | timeout | exit | garbage | stalled | missing | spawn
    got_rows: bool = False
    rc: int | None = None
    detail: str = ""


class HlSmiCollector:
    """Keeps the latest hl-smi reading of every Gaudi device, fetched on its own thread."""

    #: First restart delay after a failure; doubles up to ``max_backoff_s``.
    restart_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    #: Pipe silence that ends a loop-mode sample (hl-smi prints a sample in one burst).
    quiet_s: float = 0.15
    #: Smallest ``-l`` argument. hl-smi documents whole seconds; tests lower it for speed.
    min_loop_s: float = 1.0
    #: One-shot calls (a process a sample) after a loop child gave nothing in time: try
    #: a loop child again after this long (the first call may have hung on a busy device).
    loop_retry_s: float = 60.0

    def __init__(
        self, *, interval_s: float = 1.0, timeout_s: float = 2.0, executable: str | None = None
    ) -> None:
        self._interval_s = max(0.05, float(interval_s))
        self._timeout_s = float(timeout_s)
        self._executable = executable
        self._fields = list(QUERY_FIELDS)
        self._without_optional_unconfirmed = False
        self._mode = "loop"  # or "oneshot" after a loop child never delivered output
        self._loop_again_at = 0.0  # monotonic time to try a loop child again
        self._loop_retries = 0  # loop children that gave nothing in time, in a row
        self._loop_ever_worked = False
        self._known: set[int] = set()  # the devices hl-smi listed in a whole sample

        self._lock = threading.Lock()  # guards everything below
        self._samples: tuple[HpuSample, ...] = ()
        self._published_at: float | None = None
        self._problem: str | None = None
        self._problem_state = FAILING  # ABSENT: hl-smi is not installed
        self._started = False
        self._proc: subprocess.Popen[bytes] | None = None

        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    # -- public API -------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (and its hl-smi child). Returns at once."""
        with self._lock:
            if self._started:
                return
            self._started = True
        exe = find_hlsmi(self._executable)
        if exe is None:
            where = f" ({self._executable} not found)" if self._executable else ""
            self._set_problem(f"hl-smi not installed{where}", ABSENT)
            return
        # A pipe that close() writes to, so the reader's select() wakes at once.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(
            target=self._main, args=(exe,), name="gputop-hl-smi", daemon=True
        )
        self._thread.start()

    def child_pids(self) -> set[int]:
        """PIDs of the hl-smi children we run (not training processes)."""
        proc = self._proc
        return {proc.pid} if proc is not None and proc.poll() is None else set()

    def latest(self) -> tuple[tuple[HpuSample, ...], SourceStatus]:
        """The last complete sample and the source's health. Never blocks, never raises."""
        try:
            with self._lock:
                samples, published_at = self._samples, self._published_at
                problem, problem_state, started = self._problem, self._problem_state, self._started
            if not started:
                return (), SourceStatus(SOURCE, False, "hl-smi not started", STARTING)
            if published_at is not None:
                age = time.monotonic() - published_at
                if age > 3 * self._period_s():
                    stale = f"no update for {age:.0f} s"
                    message = f"hl-smi data stale: {stale}" + (f" ({problem})" if problem else "")
                    marked = tuple(
                        replace(s, state="stale", error=f"stale: {stale}") if s.state == "ok" else s
                        for s in samples
                    )
                    return marked, SourceStatus(SOURCE, False, message, FAILING)
            if problem:
                return samples, SourceStatus(SOURCE, False, problem, problem_state)
            if published_at is None:
                return (), SourceStatus(SOURCE, False, "waiting for hl-smi", STARTING)
            return samples, SourceStatus(SOURCE, True, "")
        except Exception as exc:  # never let a monitor bug reach the caller
            return (), SourceStatus(SOURCE, False, f"hl-smi collector error: {exc}", FAILING)

    def close(self) -> None:
        """Kill the child and join the thread. Safe to call twice or before start()."""
        self._stop.set()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        with self._lock:
            proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._timeout_s + 2.0)
            if thread.is_alive():
                return  # leave the pipe open for it; it is a daemon thread anyway
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1

    # -- state shared with latest() -----------------------------------------------------

    def _period_s(self) -> float:
        return self._loop_s() if self._mode == "loop" else self._interval_s

    def _loop_s(self) -> float:
        return max(self.min_loop_s, float(round(self._interval_s)))

    def _publish(self, samples: tuple[HpuSample, ...]) -> None:
        with self._lock:
            self._samples = samples
            self._published_at = time.monotonic()
            self._problem = None

    def _set_problem(self, message: str, state: str = FAILING) -> None:
        with self._lock:
            self._problem, self._problem_state = message, state

    # -- background thread --------------------------------------------------------------

    def _main(self, exe: str) -> None:
        backoff = self.restart_backoff_s
        while not self._stop.is_set():
            loop = self._mode == "loop"
            run_started = time.monotonic()
            try:
                outcome = self._run_child(exe, loop)
            except Exception as exc:  # a bug here must not kill the thread silently
                outcome = _Outcome("spawn", detail=f"hl-smi collector error: {exc}")
            if outcome.kind == "stopped" or self._stop.is_set() or _exiting:
                return  # the child died because we killed it: nothing to report
            if outcome.got_rows:
                backoff = self.restart_backoff_s
                self._without_optional_unconfirmed = False  # the reduced query works
                if loop:
                    self._loop_ever_worked = True
                    self._loop_retries = 0
            if outcome.kind == "done":
                elapsed = time.monotonic() - run_started
                self._stop.wait(max(0.0, self._interval_s - elapsed))
                if time.monotonic() >= self._loop_again_at:
                    self._mode = "loop"  # one child instead of a process a sample
                continue
            if not outcome.got_rows and self._retry_without_optional(outcome):
                continue
            self._set_problem(
                self._describe(outcome), ABSENT if outcome.kind == "missing" else FAILING
            )
            if outcome.kind == "missing":
                return  # uninstalled under us; nothing will change by retrying
            if outcome.kind == "timeout" and loop and not self._loop_ever_worked:
                # Perhaps this hl-smi block-buffers its output into a pipe, so a loop
                # child's rows never arrive; a one-shot call flushes at exit. Or its
                # first call hung: a loop child is tried again in loop_retry_s.
                # (An hl-smi that does buffer: tried less and less often, to an hour.)
                self._mode = "oneshot"
                wait = min(self.loop_retry_s * 2**self._loop_retries, 3600.0)
                self._loop_again_at = time.monotonic() + wait
                self._loop_retries += 1
                continue
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _retry_without_optional(self, outcome: _Outcome) -> bool:
        """Drop ``power.max`` after a failure that may be this version rejecting it."""
        if self._without_optional_unconfirmed:
            # Failed without it too: it was not the field's fault; ask for it again.
            self._fields = list(QUERY_FIELDS)
            self._without_optional_unconfirmed = False
            return False
        suspicious = outcome.kind == "exit" or (
            outcome.kind == "garbage" and OPTIONAL_FIELD in outcome.detail
        )
        if suspicious and OPTIONAL_FIELD in self._fields:
            self._fields.remove(OPTIONAL_FIELD)
            self._without_optional_unconfirmed = True
            return True
        return False

    def _describe(self, outcome: _Outcome) -> str:
        if outcome.kind == "timeout":
            return f"hl-smi timed out after {self._timeout_s:g} s"
        if outcome.kind == "garbage":
            return f"hl-smi printed unparseable output: {outcome.detail[:60]}"
        if outcome.kind == "stalled":
            return f"hl-smi stopped printing for {outcome.detail} s; restarting it"
        if outcome.kind == "missing":
            return "hl-smi not installed"
        if outcome.kind == "spawn":
            return f"cannot run hl-smi: {outcome.detail}"
        # exit
        if outcome.rc == 0:
            return f"hl-smi exited: {outcome.detail}" if outcome.detail else "hl-smi exited"
        text = f"hl-smi exited with code {outcome.rc}"
        return f"{text}: {outcome.detail}" if outcome.detail else text

    def _argv(self, exe: str, loop: bool) -> list[str]:
        argv = [exe, "-Q", ",".join(self._fields), "-f", "csv,noheader"]
        if loop:
            argv += ["-l", f"{self._loop_s():g}"]
        return argv

    def _run_child(self, exe: str, loop: bool) -> _Outcome:
        with _live_lock:  # spawn and register atomically w.r.t. _kill_live_children
            if _exiting or self._stop.is_set():
                return _Outcome("stopped")
            try:
                proc = subprocess.Popen(
                    self._argv(exe, loop),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            except FileNotFoundError:
                return _Outcome("missing")
            except OSError as exc:
                return _Outcome("spawn", detail=str(exc))
            _live.add(proc)
        with self._lock:
            self._proc = proc
        try:
            return self._read(proc, loop)
        finally:
            with self._lock:
                self._proc = None
            _kill(proc)
            with _live_lock:
                _live.discard(proc)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def _read(self, proc: subprocess.Popen[bytes], loop: bool) -> _Outcome:
        assert proc.stdout is not None and proc.stderr is not None
        decoder = _CsvDecoder(self._fields)
        splitter = LoopSplitter(self._known)
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        started = time.monotonic()
        last_data_at = started
        last_row_at: float | None = None
        stall_s = 3 * self._loop_s() + self._timeout_s
        out_buf = b""
        err_buf = b""
        open_fds = {out_fd, err_fd}

        def take_lines(lines: list[bytes]) -> _Outcome | None:
            nonlocal last_row_at
            for raw in lines:
                line = raw.decode("utf-8", errors="replace").rstrip("\r")
                try:
                    row = decoder.feed(line)
                    if row is None:
                        continue
                    sample = hpu_sample_from_row(row)
                except HlSmiParseError as exc:
                    return _Outcome("garbage", last_row_at is not None, detail=exc.line.strip())
                last_row_at = time.monotonic()
                done = splitter.add(sample)
                if done:
                    self._publish(done)
            return None

        with selectors.DefaultSelector() as sel:
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while open_fds:
                if self._stop.is_set():
                    return _Outcome("stopped")
                now = time.monotonic()
                got_rows = last_row_at is not None
                # One-shot: the whole call must finish in time. Loop: the first row must
                # come in time, later a silence of > 3 intervals (+ timeout) is a stall.
                if not loop or last_row_at is None:
                    deadline = started + self._timeout_s
                    if now >= deadline:
                        return _Outcome("timeout", got_rows)
                else:
                    deadline = last_row_at + stall_s
                    if now >= deadline:
                        return _Outcome("stalled", True, detail=f"{now - last_row_at:.0f}")
                if splitter.pending:
                    flush_at = last_data_at + self.quiet_s
                    if now >= flush_at:
                        done = splitter.ready()
                        if done:
                            self._publish(done)
                        continue
                    deadline = min(deadline, flush_at)
                for key, _ in sel.select(max(0.0, deadline - now)):
                    fd = key.fd
                    if fd == self._wake_r:
                        continue  # close() wants us out; checked at the top of the loop
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(fd)
                        open_fds.discard(fd)
                    elif fd == err_fd:
                        err_buf = (err_buf + data)[:8192]  # keep the start: the reason
                    else:
                        last_data_at = time.monotonic()
                        *lines, out_buf = (out_buf + data).split(b"\n")
                        bad = take_lines(lines)
                        if bad is not None:
                            return bad

        # Both pipes closed: the child is exiting. A one-shot call that exits cleanly
        # printed its sample whole; otherwise (a loop child cut short, a failed call)
        # the rows read count only if they hold every device: never a part of the node.
        bad = take_lines([out_buf]) if out_buf.strip() else None
        if bad is not None:
            return bad
        try:
            rc: int | None = proc.wait(
                timeout=max(0.1, started + self._timeout_s - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            rc = None
        done = splitter.finish() if rc == 0 and not loop else splitter.ready()
        if done:
            self._publish(done)
        if rc is None:
            return _Outcome("timeout", last_row_at is not None)
        got_rows = last_row_at is not None
        if rc == 0 and got_rows and not loop:
            return _Outcome("done", True, rc=0)
        detail = _first_line(err_buf)
        if not detail and not got_rows:
            detail = _first_line(out_buf) or "no output"
        return _Outcome("exit", got_rows, rc=rc, detail=detail)


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""
