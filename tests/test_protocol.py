"""The wire codec: round trips, every malformed input gives a typed error, fuzzing."""

from __future__ import annotations

import contextlib
import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe.messages import Bye, Hello, LoaderInfo, StepRecord, Steps, System
from gputop_dl.probe.protocol import (
    PROTOCOL_MAJOR,
    IncompatibleVersion,
    MalformedMessage,
    ProtocolError,
    decode,
    encode,
)
from gputop_dl.probe.samples import (
    CgroupSample,
    CpuCore,
    CpuSample,
    DiskSample,
    GpuSample,
    HpuSample,
    MemorySample,
    NetSample,
    PressureSample,
    ProcessSample,
    SourceStatus,
    SystemSample,
    TrainingProcesses,
)

HELLO = Hello(
    source_id="node1:42",
    role="probe",
    name="resnet",
    host="node1",
    pid=42,
    started=1700000000.5,
    probe_version="0.1.0",
    rank=3,
    local_rank=1,
    world_size=8,
    torch_version="2.13.0",
    devices=("NVIDIA H100",),
    timing="cuda-events",
    loader=LoaderInfo("torch.DataLoader", 4, True, 256, 2, True, (100, 101), "/data"),
)
STEPS = Steps(
    "node1:42",
    (
        StepRecord(0, 1700000001.0, 0.25, 0.2, 256, 0.04, 0.19, (("h2d", 0.01),)),
        StepRecord(1, 1700000001.3, 0.3, None, None),
    ),
    sent=10,
    dropped=2,
    dropped_steps=1,
)
SYSTEM = System(
    "node1:42",
    SystemSample(
        time=1700000002.0,
        host="node1",
        interval_s=1.0,
        cpu=CpuSample((CpuCore(0, 10.0, 5.0, 1.0, None, 84.0),), (1.0, 0.5, 0.25)),
        memory=MemorySample(8 << 30, 4 << 30, 3 << 30, 1 << 30, 0, 0, 0.0, None),
        disks=(DiskSample("nvme0n1", 1e6, 0.0, 10.0, 0.0, 12.5),),
        nets=(NetSample("eth0", 1e3, 2e3),),
        pressure=PressureSample(1.0, 2.0, 0.5, None, None),
        cgroup=CgroupSample(2.0, 100, 5, 1000, 5.0, None, None),
        processes=TrainingProcesses((ProcessSample(42, "main", "python", 99.0, 1 << 30),), 0, 0),
        gpus=(GpuSample(0, "H100", "GPU-1", util_pct=99.0, throttle_reasons=("sw_power_cap",)),),
        hpus=(HpuSample(0, "HL-225", None, state="lost", error="device lost"),),
        statuses=(SourceStatus("nvml", True, ""),),
        data_device="nvme0n1",
        data_fs_type="ext4",
    ),
)
BYE = Bye("node1:42", "process exit", 1234)


@pytest.mark.parametrize("message", [HELLO, STEPS, SYSTEM, BYE], ids=lambda m: type(m).__name__)
def test_round_trip(message: object) -> None:
    assert decode(encode(message)) == message  # type: ignore[arg-type]


def test_topic_names_the_kind() -> None:
    assert encode(STEPS)[0] == b"gputop.steps"
    assert encode(SYSTEM)[0] == b"gputop.system"


def payload(kind: str = "bye", v: object = (PROTOCOL_MAJOR, 0), **body: object) -> list[bytes]:
    base = {"source_id": "h:1", "reason": "x", "steps": 1} if kind == "bye" else {}
    data = {"v": list(v) if isinstance(v, tuple) else v, "kind": kind, "body": base | body}
    return [b"gputop." + kind.encode(), msgpack.packb(data)]


def test_newer_minor_version_with_unknown_fields_is_read() -> None:
    frames = payload(v=(PROTOCOL_MAJOR, 7), new_field={"x": 1})
    assert decode(frames) == Bye("h:1", "x", 1)


def test_missing_optional_fields_take_defaults() -> None:
    data = {
        "v": [PROTOCOL_MAJOR, 0],
        "kind": "steps",
        "body": {"source_id": "a", "records": [], "sent": 0, "dropped": 0},
    }
    message = decode([b"gputop.steps", msgpack.packb(data)])
    assert isinstance(message, Steps) and message.dropped_steps == 0


def test_unknown_major_version_is_a_clear_error_with_both_versions() -> None:
    with pytest.raises(IncompatibleVersion) as info:
        decode(payload(v=(3, 3)))
    assert info.value.theirs == (3, 3)
    assert info.value.source_id == "h:1"
    assert "3.3" in str(info.value) and f"{PROTOCOL_MAJOR}." in str(info.value)


MALFORMED = {
    "one frame": [b"gputop.bye"],
    "three frames": [b"gputop.bye", b"", b""],
    "foreign topic": [b"other", msgpack.packb({})],
    "not msgpack": [b"gputop.bye", b"\xc1\xc1\xc1"],
    "trailing bytes": [b"gputop.bye", msgpack.packb({"v": [PROTOCOL_MAJOR, 0]}) + b"\x00"],
    "pickle": [b"gputop.bye", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01a\x94."],
    "not a map": [b"gputop.bye", msgpack.packb([1, 2])],
    "no version": [b"gputop.bye", msgpack.packb({"kind": "bye", "body": {}})],
    "version not ints": [b"gputop.bye", msgpack.packb({"v": ["1", "0"], "kind": "bye"})],
    "bool version": [b"gputop.bye", msgpack.packb({"v": [True, 0], "kind": "bye"})],
    "unknown kind": payload(kind="shout"),
    "topic/kind mismatch": [b"gputop.steps", payload()[1]],
    "body not a map": [b"gputop.bye", msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": "bye", "body": 3})],
    "missing field": [
        b"gputop.bye",
        msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": "bye", "body": {"source_id": "a"}}),
    ],
    "wrong type": payload(steps="many"),
    "bool for int": payload(steps=True),
    "nan": payload(
        kind="steps",
        source_id="a",
        sent=0,
        dropped=0,
        records=[
            {"index": 0, "end_time": math.nan, "period_s": 1.0, "wait_s": None, "samples": None}
        ],
    ),
    "string too long": payload(reason="x" * 5000),
    "binary blob": payload(reason=b"bytes"),
    "map keys not str": [b"gputop.bye", msgpack.packb({1: 2})],
    "tuple of wrong length": payload(
        kind="system",
        source_id="a",
        sample={
            "time": 1.0,
            "host": "h",
            "interval_s": None,
            "cpu": {"cores": [], "load_avg": [1.0, 2.0]},
        },
    ),
    "huge payload": [b"gputop.bye", b"\x00" * (4 * 1024 * 1024 + 1)],
}


@pytest.mark.parametrize("frames", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_is_a_typed_error(frames: list[bytes]) -> None:
    with pytest.raises(MalformedMessage):
        decode(frames)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=3))
def test_fuzz_arbitrary_frames_only_raise_protocol_errors(frames: list[bytes]) -> None:
    # Anything but a ProtocolError (or no error) fails the test.
    with contextlib.suppress(ProtocolError):
        decode(frames)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(["hello", "steps", "system", "bye"]), body=json_like)
def test_fuzz_structured_bodies_only_raise_protocol_errors(kind: str, body: object) -> None:
    frames = [b"gputop." + kind.encode(), msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": kind, "body": body})]
    # Anything but a ProtocolError (or no error) fails the test.
    with contextlib.suppress(ProtocolError):
        decode(frames)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        StepRecord,
        index=st.integers(0, 2**40),
        end_time=st.floats(0, 2e9),
        period_s=st.floats(0, 1e4),
        wait_s=st.none() | st.floats(0, 1e4),
        samples=st.none() | st.integers(0, 2**31),
    )
)
def test_round_trip_any_step(record: StepRecord) -> None:
    message = Steps("h:1", (record,), 0, 0)
    assert decode(encode(message)) == message
