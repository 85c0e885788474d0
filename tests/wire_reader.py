"""A subscriber written from docs/protocol.md alone: raw zmq + msgpack, no gputop code.

If this reader and the probe disagree, the protocol page is wrong or the probe is.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import msgpack
import zmq

# docs/protocol.md, "StepRecord": a record is an array in this field order; a reader
# takes the fields it knows and ignores trailing ones (a later minor may add some).
# Times are integer microseconds, the end one after the message's base_time.
STEP_FIELDS = (
    "index",
    "end_us",
    "period_us",
    "wait_us",
    "samples",
    "device_us",
    "device_idle_us",
    "phases",
    "device_caught_up",
)
DURATIONS = {"period_us": "period_s", "wait_us": "wait_s", "device_us": "device_s"}
DURATIONS["device_idle_us"] = "device_idle_s"
KNOWN_KINDS = {"hello", "steps", "system", "loop", "bye"}


class WireReader:
    open_readers: list[WireReader] = []  # closed by tests' teardown if a test failed

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"gputop.")
        self.sock.connect(endpoint)
        self.messages: list[dict[str, Any]] = []
        self.closed = False
        WireReader.open_readers.append(self)

    def pump(self, seconds: float, until: str | None = None) -> list[dict[str, Any]]:
        """Read for ``seconds`` (or until a message of kind ``until``); return the new
        messages as {"kind", "v", "body"} maps, step records turned into maps."""
        new = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                continue
            topic, payload = self.sock.recv_multipart()
            data = msgpack.unpackb(payload, raw=False)
            assert topic == b"gputop." + data["kind"].encode()
            assert data["v"][0] == 2
            if data["kind"] not in KNOWN_KINDS:
                continue  # the spec: skip kinds you do not know
            if data["kind"] == "steps":
                body = data["body"]
                body["records"] = [self.step(r, body["base_time"]) for r in body["records"]]
                for run in body.get("runs", []):
                    body["records"] += self.run_steps(run, body["base_time"], body["clock_ns"])
                body["records"].sort(key=lambda record: record["index"])
            new.append(data)
            if until is not None and data["kind"] == until:
                break
        self.messages.extend(new)
        return new

    @staticmethod
    def step(row: list[Any], base_time: float) -> dict[str, Any]:
        """A record as a map with the spec's derived fields in seconds and Unix time."""
        record = dict(zip(STEP_FIELDS, row, strict=False))
        record["end_time"] = base_time + record["end_us"] / 1e6
        for us, seconds in DURATIONS.items():
            value = record.get(us)
            record[seconds] = None if value is None else value / 1e6
        record["phases"] = [(name, v / 1e6) for name, v in record.get("phases", [])]
        return record

    @staticmethod
    def run_steps(run: list[Any], base_time: float, clock_ns: int) -> list[dict[str, Any]]:
        """A StepRun's steps as records: its readings are little-endian signed 64-bit
        integers; step j starts at reading 2j, its batch arrives at 2j+1, it ends at
        2j+2; each reading rounded to the nearest microsecond."""
        first, packed, samples = run[:3]
        readings = struct.unpack(f"<{len(packed) // 8}q", packed)
        us = [(r - clock_ns + 500) // 1000 for r in readings]
        return [
            WireReader.step(
                [first + j, us[2 * j + 2], us[2 * j + 2] - us[2 * j], us[2 * j + 1] - us[2 * j], n],
                base_time,
            )
            for j, n in enumerate(samples)
        ]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m["body"] for m in self.messages if m["kind"] == kind]

    def steps(self) -> list[dict[str, Any]]:
        return [r for body in self.of_kind("steps") for r in body["records"]]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.sock.close(0)
        self.ctx.term()
        WireReader.open_readers.remove(self)

    @classmethod
    def close_all(cls) -> None:
        """A reader left open is garbage-collected later, and pyzmq's context finalizer
        can then block the whole test session: close them deterministically."""
        for reader in list(cls.open_readers):
            reader.close()
