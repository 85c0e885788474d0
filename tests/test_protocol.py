"""The wire codec: round trips, every malformed input gives a typed error, fuzzing."""

from __future__ import annotations

import contextlib
import math
import os
import random

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop_dl.probe.messages import (
    Bye,
    DeviceRef,
    Hello,
    LoaderInfo,
    Loop,
    StepRecord,
    Steps,
    System,
)
from gputop_dl.probe.protocol import (
    PROTOCOL_MAJOR,
    IncompatibleVersion,
    MalformedMessage,
    ProtocolError,
    UnknownKind,
    decode,
    encode,
    encode_steps,
    wire_rows,
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
    loop="outside",
    loop_since=1700000003.0,
    loop_exit="exception:ValueError",
    framework="lightning",
    cpu_affinity=(0, 1, 2, 3),
    cpu_quota_cores=2.5,
    device=DeviceRef("cuda", 3, "GPU-abc"),
)
LOOP = Loop("node1:42", "outside", 1700000003.0, 17, "break")
STEPS = Steps(
    "node1:42",
    (
        StepRecord(0, 1700000001.0, 0.25, 0.2, 256, 0.04, 0.19, (("h2d", 0.01),), True),
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


@pytest.mark.parametrize(
    "message", [HELLO, STEPS, SYSTEM, LOOP, BYE], ids=lambda m: type(m).__name__
)
def test_round_trip(message: object) -> None:
    assert decode(encode(message)) == message  # type: ignore[arg-type]


def test_topic_names_the_kind() -> None:
    assert encode(STEPS)[0] == b"gputop.steps"
    assert encode(SYSTEM)[0] == b"gputop.system"


def payload(kind: str = "bye", v: object = (PROTOCOL_MAJOR, 0), **body: object) -> list[bytes]:
    base = {"source_id": "h:1", "reason": "x", "steps": 1} if kind == "bye" else {}
    data = {"v": list(v) if isinstance(v, tuple) else v, "kind": kind, "body": base | body}
    return [b"gputop." + kind.encode(), msgpack.packb(data)]


def steps_payload(records: list[object], base_time: float = 1.0) -> list[bytes]:
    return payload(
        kind="steps", source_id="a", base_time=base_time, sent=0, dropped=0, records=records
    )


def test_newer_minor_version_with_unknown_fields_is_read() -> None:
    frames = payload(v=(PROTOCOL_MAJOR, 7), new_field={"x": 1})
    assert decode(frames) == Bye("h:1", "x", 1)


def test_missing_optional_fields_take_defaults() -> None:
    data = {
        "v": [PROTOCOL_MAJOR, 0],
        "kind": "steps",
        "body": {"source_id": "a", "base_time": 1.0, "records": [], "sent": 0, "dropped": 0},
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
    "topic/kind mismatch": [b"gputop.steps", payload()[1]],
    "body not a map": [
        b"gputop.bye",
        msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": "bye", "body": 3}),
    ],
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
        records=[[0, math.nan, 1.0, None, None]],
    ),
    "kind not a string": [b"gputop.bye", msgpack.packb({"v": [2, 0], "kind": [1], "body": {}})],
    "time far in the future": payload(
        kind="system", source_id="a", sample={"time": 1e308, "host": "h", "interval_s": None}
    ),
    "infinite reading": payload(
        kind="system",
        source_id="a",
        sample={"time": 1.0, "host": "h", "interval_s": 1.0, "nets": [["lo", math.inf, 0.0]]},
    ),
    "negative duration": steps_payload([[0, 0, -5, None, None]]),
    "negative wait": steps_payload([[0, 0, 5, -1, None]]),
    "negative end offset": steps_payload([[0, -1, 5, None, None]]),
    "duration in float seconds": steps_payload([[0, 0, 0.5, None, None]]),
    "end after 1e10": steps_payload([[0, 10**13, 5, None, None]], base_time=9.999e9),
    "duration over 1e7 s": steps_payload([[0, 0, 10**13 + 1, None, None]]),
    "phase in float seconds": steps_payload([[0, 0, 5, None, None, None, None, [["x", 0.5]]]]),
    "no base time": payload(kind="steps", source_id="a", sent=0, dropped=0, records=[]),
    "record as a map": steps_payload(
        [{"index": 0, "end_us": 0, "period_us": 1, "wait_us": None, "samples": 1}]
    ),
    "too many records": steps_payload([[0, 0, 100, None, None]] * 20_001),
    "too many cores": payload(
        kind="system",
        source_id="a",
        sample={
            "time": 1.0,
            "host": "h",
            "interval_s": None,
            "cpu": {"cores": [[0, 1, 1, 1, 1, 1]] * 100_001, "load_avg": None},
        },
    ),
    "negative pid": payload(kind="bye", steps=-1),
    "deeply nested": [b"gputop.bye", b"\x91" * 100_000 + b"\xc0"],
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
    frames = [
        b"gputop." + kind.encode(),
        msgpack.packb({"v": [PROTOCOL_MAJOR, 0], "kind": kind, "body": body}),
    ]
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
    # Times travel in whole microseconds: a record comes back within half of one (plus
    # the float rounding of a Unix time near 2e9, a quarter of a microsecond).
    (back,) = decode(encode(Steps("h:1", (record,), 0, 0))).records  # type: ignore[union-attr]
    assert back.index == record.index and back.samples == record.samples
    assert abs(back.end_time - record.end_time) <= 1e-6
    assert abs(back.period_s - record.period_s) <= 0.5e-6
    assert (back.wait_s is None) == (record.wait_s is None)
    if record.wait_s is not None:
        assert back.wait_s is not None and abs(back.wait_s - record.wait_s) <= 0.5e-6


def test_whole_microsecond_steps_round_trip_exactly() -> None:
    # The probe's own records: ends and durations in whole microseconds after the base.
    records = tuple(
        StepRecord(i, 1700000001.0 + i * 0.012345, 0.012345, 0.000678, 64, 0.011, 0.0001)
        for i in range(100)
    )
    message = Steps("h:1", records, 3, 0)
    assert decode(encode(message)) == message


def test_unknown_kind_is_its_own_error_so_readers_can_skip_it() -> None:
    with pytest.raises(UnknownKind):
        decode(payload(kind="shout"))


def test_encode_steps_from_wire_tuples_gives_the_same_bytes() -> None:
    base, rows = wire_rows(STEPS.records)
    assert base == 1700000001.0  # the earliest end: every offset is >= 0
    assert rows[0] == (0, 0, 250_000, 200_000, 256, 40_000, 190_000, (("h2d", 10_000),), True)
    assert rows[1] == (1, 300_000, 300_000, None, None, None, None, (), None)
    frames = encode_steps(
        STEPS.source_id, base, rows, STEPS.sent, STEPS.dropped, STEPS.dropped_steps
    )
    assert frames == encode(STEPS)


def test_a_step_record_is_a_short_array_on_the_wire() -> None:
    # A CUDA-timed record with index near a million, 12 ms steps, 100 ms into its message:
    # integers in microseconds, far below the 56 bytes of floats in seconds.
    record = StepRecord(999_999, 1700000001.1, 0.0123, 0.0021, 256, 0.0101, 0.0004, (), True)
    first = StepRecord(999_990, 1700000001.0, 0.0123, 0.0021, 256)
    _base, rows = wire_rows((first, record))
    packed = msgspec.msgpack.encode(rows[1])
    assert msgpack.unpackb(packed) == [999_999, 100_000, 12_300, 2_100, 256, 10_100, 400, [], True]
    assert len(packed) <= 40
    body = msgpack.unpackb(encode(Steps("h:1", (first, record), 0, 0))[1])["body"]
    assert body["base_time"] == 1700000001.0


def test_an_older_minor_record_without_the_trailing_fields_decodes() -> None:
    message = decode(steps_payload([[3, 2_000_000, 1_000_000, 500_000, 8]], base_time=3.0))
    assert isinstance(message, Steps)
    assert message.records == (StepRecord(3, 5.0, 1.0, 0.5, 8),)


def test_a_process_read_rate_travels_and_older_samples_read_as_not_reported() -> None:
    """ProcessSample.read_bps, added at its end with a default (a minor change): it
    round-trips; a sample of an older probe, without it, reads as None (not reported,
    never 0); a reader that predates it ignores it."""
    procs = (
        ProcessSample(42, "main", "python", 99.0, 1 << 30, 2.5e6),
        ProcessSample(43, "worker", "python", 20.0, 1 << 28, 0.0),
        ProcessSample(44, "worker", "python", 20.0, 1 << 28),
    )
    sample = SystemSample(1.0, "h", 1.0, processes=TrainingProcesses(procs, 0, 2))
    sent = System("h:42", sample)
    frames = encode(sent)
    assert decode(frames) == sent
    body = msgpack.unpackb(frames[1])["body"]
    assert [p.get("read_bps") for p in body["sample"]["processes"]["processes"]] == [
        2.5e6,
        0.0,
        None,
    ]
    old = {"pid": 42, "role": "main", "name": "python", "cpu_pct": 9.0, "rss_bytes": 1}
    older = payload(
        kind="system",
        source_id="h:42",
        sample={
            "time": 1.0,
            "host": "h",
            "interval_s": 1.0,
            "processes": {"processes": [old], "saturated_workers": 0, "worker_count": 0},
        },
    )
    message = decode(older)
    assert isinstance(message, System) and message.sample.processes is not None
    assert message.sample.processes.processes == (ProcessSample(42, "main", "python", 9.0, 1),)
    assert message.sample.processes.processes[0].read_bps is None

    class OldProcessSample(msgspec.Struct, frozen=True):  # a reader from before the field
        pid: int
        role: str
        name: str
        cpu_pct: float | None
        rss_bytes: int | None

    first = msgspec.msgpack.decode(
        msgpack.packb(body["sample"]["processes"]["processes"][0]), type=OldProcessSample
    )
    assert first == OldProcessSample(42, "main", "python", 99.0, 1 << 30)


def test_an_infinite_read_rate_is_refused() -> None:
    """The limits of any reading hold for it: no infinity reaches the viewer's sums."""
    proc = {"pid": 1, "role": "main", "name": "p", "cpu_pct": None, "rss_bytes": None}
    frames = payload(
        kind="system",
        source_id="h:1",
        sample={
            "time": 1.0,
            "host": "h",
            "interval_s": 1.0,
            "processes": {
                "processes": [proc | {"read_bps": math.inf}],
                "saturated_workers": 0,
                "worker_count": 0,
            },
        },
    )
    with pytest.raises(MalformedMessage):
        decode(frames)


def test_a_newer_minor_record_with_more_fields_decodes() -> None:
    row = [3, 5, 1, 0, 8, None, None, [], None, "future", 42]
    message = decode(steps_payload([row]))
    assert isinstance(message, Steps) and message.records[0].index == 3


# ------------------------------------------------------------------- mutation fuzz
# `make fuzz` runs 1,000,000 mutated payloads (GPUTOP_FUZZ_N); the normal run 20,000.
FUZZ_N = int(os.environ.get("GPUTOP_FUZZ_N", "20000"))
FUZZ_SEED = 20261123
NASTY: list[object] = [
    None,
    True,
    -1,
    2**64 - 1,
    -(2**63),
    1e308,
    -1e308,
    math.nan,
    math.inf,
    -0.0,
    "",
    "x" * 5000,
    "\x1b[2J",
    b"bin",
    [],
    {},
    [1],
    {"a": 1},
    [[0, 1.0, 1.0, None, None]],
]


def _mutate_tree(rng: random.Random, node: object) -> object:
    """Replace one randomly chosen node of a decoded msgpack tree."""
    if isinstance(node, dict) and node and rng.random() < 0.8:
        key = rng.choice(list(node))
        if rng.random() < 0.1:
            return {k: v for k, v in node.items() if k != key}  # drop a field
        return node | {key: _mutate_tree(rng, node[key])}
    if isinstance(node, list) and node and rng.random() < 0.8:
        i = rng.randrange(len(node))
        return [*node[:i], _mutate_tree(rng, node[i]), *node[i + 1 :]]
    return rng.choice(NASTY)


def _mutate_bytes(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 1:  # insert
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 2:  # delete
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 3:  # truncate
            del b[pos:]
        elif op == 4:  # splice another valid payload
            other = rng.choice(corpus)
            b[pos:] = other[rng.randrange(len(other) + 1) :]
        else:  # duplicate a chunk
            b[pos:pos] = b[max(0, pos - 16) : pos]
    return bytes(b)


def fuzz(n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    corpus = [encode(m) for m in (HELLO, STEPS, SYSTEM, LOOP, BYE)]
    payloads = [frames[1] for frames in corpus]
    outcome = {"decoded": 0, "protocol-error": 0}
    for _ in range(n):
        topic_frame, data = rng.choice(corpus)
        if rng.random() < 0.5:
            mutated = _mutate_bytes(rng, data, payloads)
        else:
            tree = msgpack.unpackb(data)
            try:
                mutated = msgpack.packb(_mutate_tree(rng, tree))
            except (TypeError, ValueError, OverflowError):
                continue
        if rng.random() < 0.05:
            topic_frame = rng.choice(corpus)[0]
        try:
            message = decode([topic_frame, mutated])
        except ProtocolError:
            outcome["protocol-error"] += 1
        else:
            assert isinstance(message, (Hello, Steps, System, Loop, Bye))
            outcome["decoded"] += 1
    return outcome


def test_fuzz_mutated_payloads_only_raise_protocol_errors() -> None:
    # Any exception but a ProtocolError escapes and fails the test.
    outcome = fuzz(FUZZ_N, FUZZ_SEED)
    assert outcome["decoded"] > 0 and outcome["protocol-error"] > 0
    assert sum(outcome.values()) >= FUZZ_N * 0.9
