"""Encode and decode gputop messages: msgpack maps in two ZeroMQ frames.

Frame 1 is the topic (``b"gputop.<kind>"``), frame 2 the msgpack payload
``{"v": [major, minor], "kind": str, "body": {...}}``. Decoding never unpickles and
never trusts input: every field is type-checked against the dataclass it belongs to,
sizes are bounded, and anything wrong becomes a :class:`ProtocolError` -- never a crash.
See ``docs/protocol.md``.
"""

from __future__ import annotations

import dataclasses
import math
import types
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgpack

from gputop_dl.probe import messages, samples
from gputop_dl.probe.messages import Bye, Hello, Loop, Message, Steps, System

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0
TOPIC_PREFIX = b"gputop."
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_ITEMS = 100_000  # any list
MAX_STR = 4096

KINDS: dict[str, type[Any]] = {
    "hello": Hello,
    "steps": Steps,
    "system": System,
    "loop": Loop,
    "bye": Bye,
}
KIND_OF: dict[type[Any], str] = {cls: kind for kind, cls in KINDS.items()}


class ProtocolError(Exception):
    """Input that is not a valid gputop message."""


class MalformedMessage(ProtocolError):
    pass


class IncompatibleVersion(ProtocolError):
    """A peer speaks a major protocol version this reader does not know."""

    def __init__(self, theirs: tuple[int, int], source_id: str | None = None) -> None:
        self.theirs = theirs
        self.source_id = source_id  # read opportunistically from the body, may be None
        super().__init__(
            f"incompatible protocol version {theirs[0]}.{theirs[1]}"
            f" (this gputop reads {PROTOCOL_MAJOR}.x, speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR})"
        )


def topic(kind: str) -> bytes:
    return TOPIC_PREFIX + kind.encode()


def encode(message: Message) -> list[bytes]:
    """Return the frames for ``message``."""
    kind = KIND_OF[type(message)]
    payload = {"v": [PROTOCOL_MAJOR, PROTOCOL_MINOR], "kind": kind, "body": _to_wire(message)}
    return [topic(kind), msgpack.packb(payload, use_bin_type=True)]


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _to_wire(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, tuple | list):
        return [_to_wire(v) for v in value]
    return value


@cache
def _field_names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def decode(frames: list[bytes]) -> Message:
    """Decode the frames of one message or raise :class:`ProtocolError`."""
    if len(frames) != 2:
        raise MalformedMessage(f"expected 2 frames (topic, payload), got {len(frames)}")
    topic_frame, payload = frames
    if not topic_frame.startswith(TOPIC_PREFIX):
        raise MalformedMessage(f"unknown topic {topic_frame[:40]!r}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedMessage(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        data = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_STR * 4,
            max_bin_len=0,
            max_array_len=MAX_ITEMS,
            max_map_len=MAX_ITEMS,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, ...)
        raise MalformedMessage(f"not msgpack: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedMessage("payload is not a map")
    version = data.get("v")
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in version)
    ):
        raise MalformedMessage("missing or invalid protocol version 'v'")
    if version[0] != PROTOCOL_MAJOR:
        body = data.get("body")
        sid = body.get("source_id") if isinstance(body, dict) else None
        raise IncompatibleVersion(
            (version[0], version[1]), sid if isinstance(sid, str) and len(sid) < 256 else None
        )
    kind = data.get("kind")
    if kind not in KINDS:
        raise MalformedMessage(f"unknown message kind {kind!r}")
    if topic_frame != topic(kind):
        raise MalformedMessage(f"topic {topic_frame!r} does not match kind {kind!r}")
    body = data.get("body")
    result: Message = _from_wire(KINDS[kind], body, kind)
    return result


@cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    return get_type_hints(cls, vars(messages) | vars(samples))


def _from_wire(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _from_wire(arg, value, path)
            except MalformedMessage as exc:
                errors.append(str(exc))
        raise MalformedMessage(errors[0] if errors else f"{path}: invalid value")
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, list):
            raise MalformedMessage(f"{path}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_wire(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise MalformedMessage(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(
            _from_wire(a, v, f"{path}[{i}]")
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise MalformedMessage(f"{path}: expected a map, got {type(value).__name__}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _from_wire(_hints(tp)[f.name], value[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MalformedMessage(f"{path}: missing field {f.name!r}")
        # Unknown keys are ignored on purpose: a newer minor version may add fields.
        return tp(**kwargs)
    if tp is bool:
        if not isinstance(value, bool):
            raise MalformedMessage(f"{path}: expected a boolean")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise MalformedMessage(f"{path}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MalformedMessage(f"{path}: expected a number")
        if not math.isfinite(value):
            raise MalformedMessage(f"{path}: number is not finite")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise MalformedMessage(f"{path}: expected a string")
        if len(value) > MAX_STR:
            raise MalformedMessage(f"{path}: string longer than {MAX_STR}")
        return value
    raise MalformedMessage(f"{path}: unsupported type {tp!r}")  # pragma: no cover


__all__ = [
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "IncompatibleVersion",
    "MalformedMessage",
    "ProtocolError",
    "decode",
    "encode",
]
