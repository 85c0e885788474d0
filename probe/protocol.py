"""Encode and decode gputop messages: msgpack in two ZeroMQ frames, via msgspec.

Frame 1 is the topic (``b"gputop.<kind>"``), frame 2 the msgpack payload
``{"v": [major, minor], "kind": str, "body": {...}}``. Decoding is total: every input
either becomes a typed message whose fields passed the limits in the message types
(lengths, finite numbers, ranges) or raises :class:`ProtocolError` -- never anything
else. Nothing is ever unpickled. See ``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from gputop_dl.probe.messages import Bye, Hello, Loop, Message, Stack, Steps, System

PROTOCOL_MAJOR = 2
PROTOCOL_MINOR = 0
TOPIC_PREFIX = b"gputop."
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_TOPIC_BYTES = 64

KINDS: dict[str, type[Any]] = {
    "hello": Hello,
    "steps": Steps,
    "system": System,
    "loop": Loop,
    "bye": Bye,
    "stack": Stack,
}
KIND_OF: dict[type[Any], str] = {cls: kind for kind, cls in KINDS.items()}
_VERSION = (PROTOCOL_MAJOR, PROTOCOL_MINOR)


class ProtocolError(Exception):
    """Input that is not a valid gputop message."""


class MalformedMessage(ProtocolError):
    pass


class UnknownKind(MalformedMessage):
    """A well-formed message of a kind this reader does not know (a newer minor version
    may add kinds): readers skip it silently."""


class IncompatibleVersion(ProtocolError):
    """A peer speaks a major protocol version this reader does not know."""

    def __init__(self, theirs: tuple[int, int], source_id: str | None = None) -> None:
        self.theirs = theirs
        self.source_id = source_id  # read opportunistically from the body, may be None
        super().__init__(
            f"incompatible protocol version {theirs[0]}.{theirs[1]}"
            f" (this gputop reads {PROTOCOL_MAJOR}.x, speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR})"
        )


_Short = Annotated[str, msgspec.Meta(max_length=64)]
_Version = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class _Envelope(msgspec.Struct):
    v: tuple[_Version, _Version]
    kind: _Short
    body: msgspec.Raw


class _SourceOnly(msgspec.Struct):
    source_id: Annotated[str, msgspec.Meta(max_length=255)] | None = None


_encoder = msgspec.msgpack.Encoder()
_envelope = msgspec.msgpack.Decoder(_Envelope)
_source_only = msgspec.msgpack.Decoder(_SourceOnly)
_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
    kind: msgspec.msgpack.Decoder(cls) for kind, cls in KINDS.items()
}
_TOPICS = {kind: TOPIC_PREFIX + kind.encode() for kind in KINDS}


def topic(kind: str) -> bytes:
    return TOPIC_PREFIX + kind.encode()


def encode(message: Message) -> list[bytes]:
    """Return the frames for ``message``."""
    kind = KIND_OF[type(message)]
    return [_TOPICS[kind], _encoder.encode({"v": _VERSION, "kind": kind, "body": message})]


def encode_steps(
    source_id: str, records: Sequence[Sequence[Any]], sent: int, dropped: int, dropped_steps: int
) -> list[bytes]:
    """Frames of a ``steps`` message whose records are given as arrays in
    :class:`StepRecord` field order -- exactly their wire form, so the publisher never
    builds record objects (``encode(Steps(...))`` gives the same bytes)."""
    body = {
        "source_id": source_id,
        "records": records,
        "sent": sent,
        "dropped": dropped,
        "dropped_steps": dropped_steps,
    }
    return [_TOPICS["steps"], _encoder.encode({"v": _VERSION, "kind": "steps", "body": body})]


def decode(frames: Sequence[bytes]) -> Message:
    """Decode the frames of one message or raise :class:`ProtocolError` (only)."""
    try:
        return _decode(frames)
    except ProtocolError:
        raise
    except Exception as exc:  # the decoder is total: nothing else may escape
        raise MalformedMessage(f"invalid message: {type(exc).__name__}: {exc}") from None


def _decode(frames: Sequence[bytes]) -> Message:
    if len(frames) != 2:
        raise MalformedMessage(f"expected 2 frames (topic, payload), got {len(frames)}")
    topic_frame, payload = bytes(frames[0]), frames[1]
    if len(topic_frame) > MAX_TOPIC_BYTES or not topic_frame.startswith(TOPIC_PREFIX):
        raise MalformedMessage(f"unknown topic {topic_frame[:40]!r}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedMessage(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        env = _envelope.decode(payload)
    except msgspec.MsgspecError as exc:
        raise MalformedMessage(f"not a gputop envelope: {exc}") from None
    if env.v[0] != PROTOCOL_MAJOR:
        try:
            sid = _source_only.decode(env.body).source_id
        except msgspec.MsgspecError:
            sid = None
        raise IncompatibleVersion(env.v, sid)
    decoder = _decoders.get(env.kind)
    if decoder is None:
        raise UnknownKind(f"unknown message kind {env.kind!r}")
    if topic_frame != _TOPICS[env.kind]:
        raise MalformedMessage(f"topic {topic_frame!r} does not match kind {env.kind!r}")
    try:
        message: Message = decoder.decode(env.body)
    except msgspec.MsgspecError as exc:
        raise MalformedMessage(f"{env.kind}: {exc}") from None
    return message


__all__ = [
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "IncompatibleVersion",
    "MalformedMessage",
    "ProtocolError",
    "UnknownKind",
    "decode",
    "encode",
    "encode_steps",
]
