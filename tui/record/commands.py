"""``gputop record``, ``gputop export``, and what ``gputop FILE`` / ``gputop snapshot FILE``
do with a recording."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputop_dl.tui.format import fmt_duration
from gputop_dl.tui.record.format import CODEC_NAMES, NotARecording
from gputop_dl.tui.record.writer import MIN_MAX_SIZE
from gputop_dl.tui.stopsignals import StopSignals

if TYPE_CHECKING:
    from gputop_dl.tui.record.reader import Timeline

EXIT_OK, EXIT_NO_RUN, EXIT_USAGE = 0, 1, 2
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_OFFSET = re.compile(r"^\s*(-?)(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_OFFSET_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def size_arg(text: str) -> int:
    """A size in bytes: 500000, 64k, 100M, 2G (powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 100M, 2G)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < MIN_MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text} is too small: at least {MIN_MAX_SIZE // 1024}k")
    return size


def parse_moment(text: str, start: float, end: float) -> float:
    """A moment of a recording: ``90s``/``5m``/``1.5h`` after its start, ``-30s`` before
    its end, or an ISO time (``2026-11-23T03:00:00``, local time unless it has a zone).
    Raises ValueError."""
    match = _OFFSET.match(text)
    if match is not None:
        sign, number, unit = match.groups()
        offset = float(number) * _OFFSET_UNITS[unit]
        return end - offset if sign else start + offset
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r} is not a moment: an offset (90s, 5m, -30s from the end) or an ISO time"
        ) from None


# ------------------------------------------------------------------------ record
def cmd_record(argv: list[str]) -> int:
    from gputop_dl.tui.cli import (
        EXIT_CODES_RECORD,
        HelpFormatter,
        endpoint_arg,
        in_range,
        reachable,
    )

    ap = argparse.ArgumentParser(
        prog="gputop record",
        formatter_class=HelpFormatter,
        epilog=EXIT_CODES_RECORD,
        description="Record every message the viewer would receive (every probe on this "
        "host, or the ENDPOINTs) to FILE, until Ctrl-C. Replay with: gputop FILE",
    )
    ap.add_argument("file", metavar="FILE", help="the recording to write (never overwritten)")
    ap.add_argument("endpoints", nargs="*", type=endpoint_arg, metavar="ENDPOINT")
    ap.add_argument(
        "--max-size",
        type=size_arg,
        metavar="SIZE",
        help="start a new part when a file reaches SIZE (e.g. 100M): FILE, FILE.1, FILE.2, ...",
    )
    ap.add_argument(
        "--duration",
        type=in_range(0.0, 1e9, low_open=True),
        metavar="SECONDS",
        help="stop after this long",
    )
    ap.add_argument(
        "--no-local", action="store_true", help="do not sample this host when no probe does"
    )
    args = ap.parse_args(argv)
    targets = args.endpoints
    if targets:
        targets = reachable("gputop record", targets)
        if not targets:
            return EXIT_NO_RUN
    from gputop_dl.tui.record.recorder import TapRecorder
    from gputop_dl.tui.record.writer import RecordWriter
    from gputop_dl.tui.source import ZmqSource

    try:
        writer = RecordWriter(args.file, host=socket.gethostname(), max_size=args.max_size)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and exc.filename != args.file else ""
        print(
            f"gputop record: cannot create {args.file}: {exc.strerror or exc}{where}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    recorder = TapRecorder(writer)
    only_remote = bool(targets) and all(e.startswith("tcp://") for e in targets)
    source = ZmqSource(
        targets,
        discover=not targets,
        local_sampler=not args.no_local and not only_remote,
        raw_tap=recorder.tap,
    )
    signals = StopSignals()  # SIGHUP too: a dropped ssh session must not lose the last chunk
    print(
        f"gputop record: recording to {args.file} ({CODEC_NAMES[writer.codec]}); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    source.start(lambda events: None)  # the tap sees every frame; decoded events unused
    try:
        signals.done.wait(args.duration)
    finally:
        source.stop()
        recorder.close()
        signals.restore()
    parts = writer.part + 1
    lost = writer.frames - writer.saved
    repeated = recorder.repeated
    print(
        f"gputop record: {writer.saved} messages, {writer.bytes_written} bytes"
        f"{f' in {parts} parts' if parts > 1 else ''}: {args.file}"
        f"{f' (the last {lost} not saved)' if lost else ''}"
        f"{f'; {repeated} repeats of history replays left out' if repeated else ''}",
        file=sys.stderr,
        flush=True,
    )
    if recorder.error is not None:
        print(f"gputop record: {recorder.error}", file=sys.stderr)
        return EXIT_NO_RUN
    return signals.exit_status(EXIT_OK)


# ----------------------------------------------------------- replay and snapshot
def load(path: str, command: str) -> Any:
    """The recording's timeline, or None (the reason printed)."""
    from gputop_dl.tui.record.reader import load_timeline

    try:
        timeline = load_timeline(path)
    except (OSError, NotARecording) as exc:
        print(f"{command}: {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return None
    for note in timeline.notes.notes:
        print(f"{command}: {path}: {note}", file=sys.stderr)
    if timeline.notes.count > len(timeline.notes.notes):
        print(f"{command}: {path}: {timeline.notes.count} problems in all", file=sys.stderr)
    return timeline


def snapshot_recording(path: str, at: str | None, as_json: bool) -> int:
    """``gputop snapshot FILE [--at TIME] [--json]``: the verdict at the end of the
    recording (or at TIME), from the same state and analyzer as live."""
    from gputop_dl.tui.record.replay import replay_state
    from gputop_dl.tui.snapshot import build_snapshot, render_text

    timeline = load(path, "gputop snapshot")
    if timeline is None:
        return EXIT_NO_RUN
    moment = timeline.end
    if at is not None:
        try:
            moment = parse_moment(at, timeline.start, timeline.end)
        except ValueError as exc:
            print(f"gputop snapshot: {exc}", file=sys.stderr)
            return EXIT_USAGE
    shown = min(timeline.end, max(timeline.start, moment))
    if shown != moment:  # a typo must not pass for the recording's edge
        edge = "end" if moment > timeline.end else "start"
        where = "past the recording's end" if edge == "end" else "before the recording's start"
        length = fmt_duration(timeline.end - timeline.start)
        print(
            f"gputop snapshot: --at {at} is {where} (it lasts {length}): showing its {edge}",
            file=sys.stderr,
        )
    moment = shown
    replayer = replay_state(timeline, moment)
    snap = build_snapshot(replayer.state)
    snap["recording"] = {
        "file": path,
        "at": moment,
        "start": timeline.start,
        "end": timeline.end,
        # When its first training run speaks (None: it holds none): before it, the
        # snapshot has no run because none had started, not because there is none.
        "first_run": first_run_at(timeline),
        "skipped": timeline.notes.notes,
    }
    print(json.dumps(snap, indent=2) if as_json else render_text(snap), flush=True)
    return EXIT_OK if snap["runs"] else EXIT_NO_RUN


def first_run_at(timeline: Timeline) -> float | None:
    """When the recording's first training run speaks (a probe's hello or steps), if any."""
    from gputop_dl.probe.messages import Hello, Steps
    from gputop_dl.tui.events import Received

    for event, t in zip(timeline.events, timeline.times, strict=True):
        message = event.message if isinstance(event, Received) else None
        if isinstance(message, Steps) or (isinstance(message, Hello) and message.role != "agent"):
            return t
    return None


def recording_arg(argv: list[str]) -> str | None:
    """The file among the arguments (``gputop FILE``, ``gputop snapshot FILE``), if any: an
    existing regular file (an ipc socket is not one), recording or not (then it is said)."""
    for arg in argv:
        if not arg.startswith("-") and "://" not in arg and os.path.isfile(arg):
            return arg
    return None


def cmd_view_recording(argv: list[str]) -> int:
    """``gputop FILE [--refresh HZ]``."""
    from gputop_dl.tui.cli import REFRESH_HZ, HelpFormatter, in_range

    ap = argparse.ArgumentParser(
        prog="gputop",
        formatter_class=HelpFormatter,
        description="Replay a recording in the viewer: space pauses, + and - change the "
        "speed (x1 to x60), left and right arrows seek by 10 s.",
    )
    ap.add_argument("file", metavar="FILE")
    ap.add_argument("--refresh", type=in_range(*REFRESH_HZ), default=2.0, metavar="HZ")
    args = ap.parse_args(argv)
    return view_recording(args.file, args.refresh)


def cmd_snapshot_recording(argv: list[str]) -> int:
    """``gputop snapshot FILE [--at TIME] [--json]``."""
    from gputop_dl.tui.cli import HelpFormatter

    ap = argparse.ArgumentParser(
        prog="gputop snapshot",
        formatter_class=HelpFormatter,
        description="The runs, host and verdict of a recording, at its end or at --at.",
    )
    ap.add_argument("file", metavar="FILE", help="a recording")
    ap.add_argument(
        "--at",
        metavar="TIME",
        help="a moment: 90s or 5m after the start, -30s before the end, or an ISO time",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(_glue_negative(argv, "--at"))
    return snapshot_recording(args.file, args.at, args.json)


def _glue_negative(argv: list[str], option: str) -> list[str]:
    """``--at -30s`` as ``--at=-30s``: argparse would take ``-30s`` for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == option and arg.startswith("-"):
            out[-1] = f"{option}={arg}"
        else:
            out.append(arg)
    return out


def view_recording(path: str, refresh_hz: float) -> int:
    """``gputop FILE``: the recording in the viewer."""
    from gputop_dl.tui.cli import viewer_unavailable

    if (problem := viewer_unavailable("replay it headless with: gputop snapshot FILE")) is not None:
        print(f"gputop: {problem}", file=sys.stderr)
        return EXIT_USAGE
    timeline = load(path, "gputop")
    if timeline is None:
        return EXIT_NO_RUN
    from gputop_dl.tui.record.replay_app import ReplayApp

    app = ReplayApp(timeline, refresh_hz=refresh_hz, title=Path(path).name)
    app.run()
    return app.return_code or EXIT_OK


# ------------------------------------------------------------------------ export
def cmd_export(argv: list[str]) -> int:
    from gputop_dl.tui.cli import EXIT_CODES_EXPORT, HelpFormatter

    ap = argparse.ArgumentParser(
        prog="gputop export",
        formatter_class=HelpFormatter,
        epilog=EXIT_CODES_EXPORT,
        description="Convert a recording: a Chrome trace for ui.perfetto.dev or "
        "chrome://tracing (--perfetto), CSV tables for pandas (--csv).",
    )
    ap.add_argument("file", metavar="FILE", help="a recording (gputop record, or r in the viewer)")
    ap.add_argument("--perfetto", metavar="OUT.json", help="write a Chrome Trace Event JSON file")
    ap.add_argument(
        "--csv", metavar="DIR", help="write steps.csv, system.csv, devices.csv, verdicts.csv"
    )
    ap.add_argument("--from", dest="start", metavar="TIME", help="from this moment (as --at)")
    ap.add_argument("--to", dest="end", metavar="TIME", help="up to this moment")
    args = ap.parse_args(_glue_negative(_glue_negative(argv, "--from"), "--to"))
    if not args.perfetto and not args.csv:
        ap.error("say what to write: --perfetto OUT.json and/or --csv DIR")
    timeline = load(args.file, "gputop export")
    if timeline is None:
        return EXIT_NO_RUN
    from gputop_dl.tui.record.export import write_csv, write_perfetto

    try:
        span = (
            parse_moment(args.start, timeline.start, timeline.end) if args.start else 0.0,
            parse_moment(args.end, timeline.start, timeline.end) if args.end else float("inf"),
        )
    except ValueError as exc:
        print(f"gputop export: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # A range that holds none of the recording wrote empty tables, and verdict rows of
    # moments it does not have: refused, with what the recording holds.
    if span[0] >= span[1] or span[0] > timeline.end or span[1] < timeline.start:
        length = fmt_duration(timeline.end - timeline.start)
        print(
            f"gputop export: --from/--to hold none of the recording (it lasts {length}; "
            "--from 0s to --to -0s is all of it)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.perfetto:
            count = write_perfetto(timeline, Path(args.perfetto), span)
            print(f"gputop export: {count} trace events: {args.perfetto}", file=sys.stderr)
        if args.csv:
            for name, rows in write_csv(timeline, Path(args.csv), span).items():
                print(f"gputop export: {rows} rows: {Path(args.csv) / name}", file=sys.stderr)
    except OSError as exc:
        print(f"gputop export: {exc}", file=sys.stderr)
        return EXIT_NO_RUN
    return EXIT_OK
