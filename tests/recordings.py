"""Synthetic recordings for the record/replay/export tests: the events the fakes build,
encoded as a probe would send them and written by the real RecordWriter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gputop_dl.probe.messages import Hello
from gputop_dl.probe.protocol import decode, encode
from gputop_dl.tui.events import Received, SourceEvent
from gputop_dl.tui.record.format import CODEC_ZSTD
from gputop_dl.tui.record.writer import RecordWriter
from tests.fakes_tui import HOST, SOURCE_ID, T0, hello, step_records, steps_events, systems_events

FAULT_AT = T0 + 60.0  # the loader turns slow here
END = T0 + 120.0


def write_events(
    path: Path,
    events: Sequence[SourceEvent],
    *,
    codec: int = CODEC_ZSTD,
    max_size: int | None = None,
    chunk_every: int = 50,
) -> RecordWriter:
    """Write ``events`` (Received only) with their receive times; a chunk every
    ``chunk_every`` messages (the real writer cuts one a second)."""
    writer = RecordWriter(path, host=HOST, codec=codec, max_size=max_size)
    for count, event in enumerate(events, 1):
        assert isinstance(event, Received)
        writer.add(encode(event.message), event.received)
        if count % chunk_every == 0:
            writer.flush()
    writer.close()
    return writer


def fault_run(start: float = T0, fault_at: float = FAULT_AT, end: float = END) -> list[SourceEvent]:
    """A run on one host: compute-bound (2 % data wait) until ``fault_at``, then its loader
    slows down: input-bound (70 % data wait, fewer samples/s). Hellos every 2 s."""
    before = step_records(start, fault_at - start, samples_per_s=400.0, wait_share=0.02)
    after = step_records(
        fault_at,
        end - fault_at - 0.05,
        samples_per_s=120.0,
        wait_share=0.7,
        first_index=len(before),
    )
    events: list[SourceEvent] = []
    at = start
    while at < end:
        message: Hello = hello(started=start, num_workers=4)
        events.append(Received(message, at))
        at += 2.0
    events += steps_events(before + after)
    events += systems_events(start + 1.0, end - 0.5, SOURCE_ID, gpu_count=0)
    events.sort(key=lambda e: e.received if isinstance(e, Received) else 0.0)
    # As the wire carries them (step times in whole microseconds): what a live viewer
    # applies is exactly what a recording of it gives back.
    return [
        Received(decode(encode(e.message)), e.received) if isinstance(e, Received) else e
        for e in events
    ]
