"""The recording file: the protocol's own frames with their receive time, in chunks.

Layout (all integers little-endian)::

    header  b"GPUTOPREC\\n"  u16 format version  u32 n  n bytes of JSON (RecordingHeader)
    chunk   b"\\x89GCK"  u8 codec  u32 compressed length  u32 raw length
            u32 CRC-32 of the 13 bytes before it and the compressed bytes,  compressed bytes
    raw chunk = entries: f64 received (Unix s)  u8 frame count  (u32 length, bytes) per frame

Each chunk is compressed on its own (zstandard when importable, else zlib/gzip's deflate;
the header and every chunk say which), so a reader can skip a damaged one and go on: it
looks for the next chunk marker whose CRC checks. A recorder killed mid-write leaves a
truncated last chunk, which a reader skips with a note. Frames are stored undecoded: the
reader decodes them with ``probe.protocol.decode``, so a recording made by one version
replays through whatever decoder reads it (docs/protocol.md: readers skip what they do not
know). Sizes are bounded on read (MAX_CHUNK_BYTES, the protocol's own frame limits).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from gputop_dl.probe.protocol import MAX_PAYLOAD_BYTES, MAX_TOPIC_BYTES

MAGIC = b"GPUTOPREC\n"
FORMAT_VERSION = 1
CHUNK_MAGIC = b"\x89GCK"
_HEAD = struct.Struct("<HI")  # format version, header JSON length
_CHUNK = struct.Struct("<4sBII")  # marker, codec, compressed length, raw length
_CRC = struct.Struct("<I")
_ENTRY = struct.Struct("<dB")  # received, frame count
_FRAME = struct.Struct("<I")
CODEC_ZLIB, CODEC_ZSTD = 1, 2
CODEC_NAMES = {CODEC_ZLIB: "gzip", CODEC_ZSTD: "zstd"}
MAX_HEADER_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 32 * 1024 * 1024  # compressed and raw, each; a writer cuts at 4 MiB
MAX_FRAMES = 8  # a protocol message has 2; room for a later one, no more
MAX_FRAME_BYTES = MAX_PAYLOAD_BYTES + MAX_TOPIC_BYTES


class NotARecording(Exception):
    """The file does not start like a recording (or its header is unreadable)."""


@dataclass(frozen=True)
class RecordingHeader:
    """What a recording says about itself. ``protocol`` is the wire version of the reader
    that recorded it; ``host`` the recorder's host (the replay's "this host");
    ``recording`` a random id shared by the parts of one rotated recording."""

    protocol: tuple[int, int]
    codec: str
    created: float
    host: str
    gputop: str
    recording: str
    part: int = 0
    origin: str = "record"  # "record" (gputop record) or "viewer" (key r in the TUI)
    extra: dict[str, Any] = field(default_factory=dict)


def encode_header(header: RecordingHeader) -> bytes:
    body = json.dumps(asdict(header), sort_keys=True).encode()
    return MAGIC + _HEAD.pack(FORMAT_VERSION, len(body)) + body


def read_header(stream: BinaryIO) -> RecordingHeader:
    """Read and check the header at the start of ``stream`` (left just after it)."""
    start = stream.read(len(MAGIC) + _HEAD.size)
    if len(start) < len(MAGIC) + _HEAD.size or not start.startswith(MAGIC):
        raise NotARecording("not a gputop recording (no header)")
    version, length = _HEAD.unpack_from(start, len(MAGIC))
    if version != FORMAT_VERSION:
        raise NotARecording(f"recording format {version}, this gputop reads {FORMAT_VERSION}")
    if length > MAX_HEADER_BYTES:
        raise NotARecording(f"recording header of {length} bytes is too large")
    body = stream.read(length)
    try:
        data = json.loads(body)
        protocol = data["protocol"]
        return RecordingHeader(
            protocol=(int(protocol[0]), int(protocol[1])),
            codec=str(data["codec"]),
            created=float(data["created"]),
            host=str(data["host"])[:255],
            gputop=str(data["gputop"])[:64],
            recording=str(data["recording"])[:64],
            part=int(data.get("part", 0)),
            origin=str(data.get("origin", "record"))[:32],
            extra=dict(data.get("extra") or {}),
        )
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise NotARecording(f"unreadable recording header ({type(exc).__name__})") from None


def is_recording(path: str) -> bool:
    """True when the file at ``path`` starts with the recording magic."""
    try:
        with open(path, "rb") as stream:
            return stream.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


# ------------------------------------------------------------------- compression
def default_codec() -> int:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return CODEC_ZLIB
    return CODEC_ZSTD


def compress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    return zlib.compress(data, 6)


class CodecMissing(ValueError):
    """A chunk this install cannot decompress: every such chunk, one note."""


def decompress(codec: int, data: bytes, raw_length: int) -> bytes:
    """Decompress at most ``raw_length`` bytes (the chunk's claim, itself bounded):
    a chunk that inflates beyond what it claims is corrupt, not a reason to run out of
    memory. Raises ValueError on any failure."""
    if codec == CODEC_ZSTD:
        try:
            import zstandard
        except ImportError:
            raise CodecMissing(
                "zstd chunks skipped: zstandard is not installed (pip install 'gputop-dl[viewer]')"
            ) from None
        try:  # a reader, so that no more than raw_length + 1 bytes are ever produced
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
                out = reader.read(raw_length + 1)
        except zstandard.ZstdError as exc:
            raise ValueError(f"zstd: {exc}") from None
    elif codec == CODEC_ZLIB:
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(data, raw_length + 1)
        except zlib.error as exc:
            raise ValueError(f"zlib: {exc}") from None
    else:
        raise ValueError(f"unknown codec {codec}")
    if len(out) != raw_length:
        raise ValueError(f"chunk inflates to {len(out)} bytes, says {raw_length}")
    return out


def encode_chunk(codec: int, raw: bytes) -> bytes:
    packed = compress(codec, raw)
    head = _CHUNK.pack(CHUNK_MAGIC, codec, len(packed), len(raw))
    crc = zlib.crc32(packed, zlib.crc32(head))
    return head + _CRC.pack(crc) + packed


def encode_entry(frames: list[bytes], received: float) -> bytes:
    parts = [_ENTRY.pack(received, len(frames))]
    for frame in frames:
        parts.append(_FRAME.pack(len(frame)))
        parts.append(bytes(frame))
    return b"".join(parts)


# ------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Entry:
    received: float
    frames: list[bytes]


MAX_NOTES = 20


@dataclass
class ReadNotes:
    """What a reader skipped, for the user: damaged chunks, a truncated tail (the first
    MAX_NOTES notes, and how many there were)."""

    notes: list[str] = field(default_factory=list)
    count: int = 0
    skipped_bytes: int = 0

    def add(self, text: str, skipped: int) -> None:
        self.count += 1
        self.skipped_bytes += skipped
        if len(self.notes) < MAX_NOTES and text not in self.notes:
            self.notes.append(text)


def iter_chunks(stream: BinaryIO, notes: ReadNotes, block: int = 1 << 20) -> Iterator[bytes]:
    """The raw (decompressed) chunks after the header; damaged ones are skipped (noted)
    by searching for the next marker whose CRC checks. Never raises on bad content."""
    buf = b""
    pos = 0  # of buf[0] in the stream, after the header
    eof = False

    def fill(need: int) -> bool:
        nonlocal buf, eof
        while len(buf) < need and not eof:
            more = stream.read(max(block, need - len(buf)))
            if not more:
                eof = True
            buf += more
        return len(buf) >= need

    def skip(count: int, why: str) -> None:
        nonlocal buf, pos
        notes.add(why, count)
        buf, pos = buf[count:], pos + count

    head_size = _CHUNK.size + _CRC.size
    while True:
        if not fill(head_size):
            if buf:
                skip(len(buf), f"truncated tail of {len(buf)} bytes skipped")
            return
        if not buf.startswith(CHUNK_MAGIC):
            found = buf.find(CHUNK_MAGIC, 1)
            count = found if found > 0 else max(1, len(buf) - len(CHUNK_MAGIC) + 1)
            skip(count, f"{count} unreadable bytes skipped")
            continue
        _, codec, packed_len, raw_len = _CHUNK.unpack_from(buf)
        (crc,) = _CRC.unpack_from(buf, _CHUNK.size)
        if packed_len > MAX_CHUNK_BYTES or raw_len > MAX_CHUNK_BYTES:
            skip(1, f"chunk at byte {pos} claims {max(packed_len, raw_len)} bytes: skipped")
            continue
        if not fill(head_size + packed_len):
            skip(len(buf), f"truncated last chunk ({len(buf)} bytes) skipped")
            return
        packed = buf[head_size : head_size + packed_len]
        if zlib.crc32(packed, zlib.crc32(buf[: _CHUNK.size])) != crc:
            skip(1, f"damaged chunk at byte {pos} skipped (checksum)")
            continue
        try:
            raw = decompress(codec, packed, raw_len)
        except CodecMissing as exc:
            skip(head_size + packed_len, str(exc))
            continue
        except ValueError as exc:
            skip(head_size + packed_len, f"chunk at byte {pos} skipped: {exc}")
            continue
        buf, pos = buf[head_size + packed_len :], pos + head_size + packed_len
        yield raw


def iter_entries(raw: bytes, notes: ReadNotes) -> Iterator[Entry]:
    """The entries of one raw chunk; a malformed entry ends the chunk (noted)."""
    view = memoryview(raw)
    offset, end = 0, len(raw)
    while offset < end:
        try:
            received, count = _ENTRY.unpack_from(view, offset)
            offset += _ENTRY.size
            if count > MAX_FRAMES or not 0.0 <= received <= 1e10:
                raise ValueError("bad entry")
            frames = []
            for _ in range(count):
                (length,) = _FRAME.unpack_from(view, offset)
                offset += _FRAME.size
                if length > MAX_FRAME_BYTES or offset + length > end:
                    raise ValueError("bad frame length")
                frames.append(bytes(view[offset : offset + length]))
                offset += length
        except (struct.error, ValueError):
            notes.add(f"malformed entry in a chunk: {end - offset} bytes skipped", end - offset)
            return
        yield Entry(received, frames)
