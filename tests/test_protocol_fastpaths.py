"""The decoder's shortcuts keep the wire and the errors of the general path.

``steps`` payloads are decoded in one pass (envelope and plausible body); CpuCore is a
msgspec Struct. Neither may change a byte on the wire nor an error a reader reports.
"""

from __future__ import annotations

import dataclasses
import json
import math

import msgpack
import pytest

from gputop_dl.probe import protocol
from gputop_dl.probe.messages import Frame, Stack, StepRecord, Steps, System
from gputop_dl.probe.protocol import (
    PROTOCOL_MAJOR,
    IncompatibleVersion,
    MalformedMessage,
    ProtocolError,
    StepRows,
    decode,
    encode,
)
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.tui.snapshot import build_snapshot
from gputop_dl.tui.state import ViewerState
from tests.fakes_tui import T0, live_run
from tests.test_protocol import BYE, HELLO, LOOP, STEPS, SYSTEM

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


def outcome(frames: list[bytes]) -> object:
    """What decode gives: the message, or the error's type, text and peer details."""
    try:
        return decode(frames)
    except ProtocolError as exc:
        details = (getattr(exc, "theirs", None), getattr(exc, "source_id", None))
        return (type(exc), str(exc), details)


def envelope(
    kind: str, body: object, *, major: int = PROTOCOL_MAJOR, topic: str = ""
) -> list[bytes]:
    fields = {"v": [major, 0], "kind": kind, "body": body}
    return [b"gputop." + (topic or kind).encode(), msgpack.packb(fields)]


def wire_body(message: object) -> object:
    """The body of ``message`` as plain msgpack values."""
    return msgpack.unpackb(encode(message)[1])["body"]  # type: ignore[arg-type]


# Every kind under its own topic and the cases the one-pass decode must leave to the
# general path: each must give exactly what the general path alone gives.
ONE_PASS_CASES: dict[str, list[bytes]] = {
    **{f"{type(m).__name__}": encode(m) for m in (HELLO, STEPS, SYSTEM, LOOP, BYE)},
    "stack": encode(
        Stack("n:1", T0, 3, 2.0, (Frame("train.py", 10, "main", "x = 1"),), 0, "MainThread")
    ),
    "hello under the system topic": envelope("hello", wire_body(HELLO), topic="system"),
    "system under the hello topic": envelope("system", wire_body(SYSTEM), topic="hello"),
    "newer major, system": envelope("system", wire_body(SYSTEM), major=PROTOCOL_MAJOR + 1),
    "newer major, hello": envelope("hello", wire_body(HELLO), major=PROTOCOL_MAJOR + 1),
    "older major, bye": envelope("bye", wire_body(BYE), major=PROTOCOL_MAJOR - 1),
    "system without its sample": envelope("system", {"source_id": "n:1"}),
    "hello with a negative pid": envelope("hello", {**wire_body(HELLO), "pid": -1}),  # type: ignore[dict-item]
    "loop with an infinite time": envelope("loop", {**wire_body(LOOP), "time": math.inf}),  # type: ignore[dict-item]
    "bye as a list": envelope("bye", ["n:1", "exit", 3]),
    "unknown kind under its topic": envelope("later", {"source_id": "n:1"}),
    "envelope without a body": [
        b"gputop.bye",
        msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": "bye"}),
    ],
    "steps with an implausible row": envelope(
        "steps",
        {
            "source_id": "n:1",
            "base_time": T0,
            "records": [[0, 5, 90_000 * 10**6, None, None]],
            "sent": 0,
            "dropped": 0,
        },
    ),
}


@pytest.mark.parametrize("name", sorted(ONE_PASS_CASES))
def test_one_pass_decoding_gives_what_the_general_path_gives(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = ONE_PASS_CASES[name]
    fast = outcome(frames)
    monkeypatch.setattr(protocol, "_ONE_PASS", {})
    general = outcome(frames)
    assert fast == general
    if name in {"Hello", "Steps", "System", "Loop", "Bye", "stack"}:
        assert not isinstance(fast, tuple)  # these decode
