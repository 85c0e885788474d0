"""The decoder's shortcuts keep the wire and the errors of the general path.

``steps`` payloads are decoded in one pass (envelope and plausible body); CpuCore is a
msgspec Struct. Neither may change a byte on the wire nor an error a reader reports.
"""

from __future__ import annotations

import dataclasses
import json

import msgpack
import pytest

from gputop_dl.probe.messages import StepRecord, Steps, System
from gputop_dl.probe.protocol import (
    PROTOCOL_MAJOR,
    IncompatibleVersion,
    MalformedMessage,
    StepRows,
    decode,
    encode,
)
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.tui.snapshot import build_snapshot
from gputop_dl.tui.state import ViewerState
from tests.fakes_tui import T0, live_run

CORE_FIELDS = ["index", "user_pct", "system_pct", "iowait_pct", "steal_pct", "idle_pct"]


def test_a_core_is_the_same_map_on_the_wire() -> None:
    cores = (CpuCore(0, 10.0, 5.0, 1.0, None, 84.0), CpuCore(1, None, None, None, None, None))
    sample = SystemSample(time=T0, host="n", interval_s=1.0, cpu=CpuSample(cores, None))
    topic, payload = encode(System("n:1", sample))
    body = msgpack.unpackb(payload)["body"]["sample"]
    assert list(body) == [f.name for f in dataclasses.fields(SystemSample)]
    assert body["cpu"]["cores"] == [
        dict(zip(CORE_FIELDS, (0, 10.0, 5.0, 1.0, None, 84.0), strict=True)),
        dict(zip(CORE_FIELDS, (1, None, None, None, None, None), strict=True)),
    ]
    # Byte for byte what a writer of plain maps sends (field order included).
    plain = msgpack.unpackb(payload)
    assert msgpack.packb(plain) == payload
    back = decode([topic, payload])
    assert isinstance(back, System) and back.sample.cpu is not None
    assert back.sample.cpu.cores == cores
    assert back.sample.cpu.cores[0].busy_pct == pytest.approx(15.0)
    assert back.sample.cpu.cores[1].busy_pct is None  # not reported stays None


def test_a_snapshot_with_cores_is_json() -> None:
    state = ViewerState("viewer-host", pid_alive=None)
    state.apply_all(live_run(duration_s=5.0))
    state.tick(T0 + 60.0)
    snap = json.loads(json.dumps(build_snapshot(state)))
    assert snap["system"]["cpu"]["cores"][0].keys() == set(CORE_FIELDS)


def steps_frames(**envelope: object) -> list[bytes]:
    body = {
        "source_id": "h:7",
        "base_time": T0,
        "records": [[3, 10, 10, 2, 8, None, None, [], None]],
        "sent": 0,
        "dropped": 0,
    }
    fields = {"v": [PROTOCOL_MAJOR, 0], "kind": "steps", "body": body, **envelope}
    return [b"gputop.steps", msgpack.packb(fields)]


def test_a_steps_payload_decodes_in_one_pass_as_in_two() -> None:
    message = decode(steps_frames(extra={"a newer": "key"}))
    assert isinstance(message, Steps) and isinstance(message.records, StepRows)
    assert message.records == (StepRecord(3, T0 + 1e-5, 1e-5, 2e-6, 8),)


def test_a_newer_major_under_the_steps_topic_is_still_an_incompatible_version() -> None:
    with pytest.raises(IncompatibleVersion) as info:
        decode(steps_frames(v=[PROTOCOL_MAJOR + 1, 0]))
    assert info.value.theirs == (PROTOCOL_MAJOR + 1, 0)
    assert info.value.source_id == "h:7"


def test_another_kind_under_the_steps_topic_is_malformed() -> None:
    with pytest.raises(MalformedMessage, match="does not match"):
        decode(steps_frames(kind="bye"))
