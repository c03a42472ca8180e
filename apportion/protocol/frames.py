"""Length-prefixed msgpack frames; each frame carries a batch (list) of messages.

Layout: 4-byte little-endian payload length, then one msgpack array of maps,
each map holding at least ``"op"``. Binary payloads (pickled functions, data)
travel as msgpack ``bin``.

A frame whose messages hold ``Pickled`` values with out-of-band buffers has another
payload: the byte 0xC1 (never the start of a msgpack value), the 4-byte length of the
msgpack part, the msgpack part (each ``Pickled`` an ext of type 1: its pickle header and
the lengths of its buffers), then the buffers themselves in the order the exts appear,
each starting at a multiple of ``BUFFER_ALIGNMENT`` from the payload's start (zero bytes
between them). The sender writes them from where they are (``encode_frame``), and the
receiver's values are views into the received payload: no copy on either side. A large
payload is received into memory of its own that starts on a page (pages.py), so its
buffers are aligned in memory too: numpy takes an array on a misaligned buffer as
"unaligned" and copies it through a small buffer for every operation.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from apportion.errors import ApportionError
from apportion.serialize import BUFFER_ALIGNMENT, Pickled, aligned

HEADER = struct.Struct("<I")
HEADER_BYTES = HEADER.size
MAX_FRAME_LIMIT = (1 << 32) - 1
# Bumped on any incompatible change to messages; checked in the handshake.
PROTOCOL_VERSION = 2

Message = dict[str, Any]
Buffer = bytes | bytearray | memoryview

OUT_OF_BAND_MARK = 0xC1
_OUT_OF_BAND_HEAD = struct.Struct("<BI")
_PICKLED_EXT = 1
_PADDING = bytes(BUFFER_ALIGNMENT)


class ProtocolError(ApportionError):
    """A peer sent something that is not a valid apportion frame."""


def encode(messages: list[Message]) -> bytes:
    """One frame as one bytes object (for small frames and tests; see encode_frame)."""
    frame = encode_frame(messages)
    return frame if isinstance(frame, bytes) else b"".join(frame)


def encode_frame(messages: list[Message]) -> bytes | list[Buffer]:
    """One frame: a bytes object, or, when out-of-band buffers follow the messages, the
    pieces to write one after the other (each buffer from where it is, not copied)."""
    try:
        payload = msgpack.packb(messages, use_bin_type=True)
    except TypeError:  # a Pickled value: its buffers go out of band
        return _encode_out_of_band(messages)
    length = len(payload)
    if length > MAX_FRAME_LIMIT:
        raise ProtocolError(f"frame of {length} bytes exceeds the 4 GiB wire limit")
    return HEADER.pack(length) + payload


def _header(length: int) -> bytes:
    if length > MAX_FRAME_LIMIT:
        raise ProtocolError(f"frame of {length} bytes exceeds the 4 GiB wire limit")
    return HEADER.pack(length)


def _encode_out_of_band(messages: list[Message]) -> list[Buffer]:
    buffers: list[memoryview] = []

    def pickled_as_ext(value: Any) -> msgpack.ExtType:
        if not isinstance(value, Pickled):
            raise TypeError(f"can not serialize {type(value).__name__!r} object")
        buffers.extend(value.buffers)
        lengths = [b.nbytes for b in value.buffers]
        return msgpack.ExtType(_PICKLED_EXT, msgpack.packb([value.header, lengths]))

    packed = msgpack.packb(messages, use_bin_type=True, default=pickled_as_ext)
    head = _OUT_OF_BAND_HEAD.pack(OUT_OF_BAND_MARK, len(packed))
    parts: list[Buffer] = [b""]
    length = len(head) + len(packed)
    for buffer in buffers:
        padding = aligned(length) - length
        if padding:
            parts.append(_PADDING[:padding])
        parts.append(buffer)
        length += padding + buffer.nbytes
    parts[0] = _header(length) + head + packed
    return parts


def _decode_out_of_band(payload: Buffer) -> Any:
    """The messages of an out-of-band frame, their Pickled buffers views into payload."""
    view = memoryview(payload)
    if len(view) < _OUT_OF_BAND_HEAD.size:
        raise ValueError("out-of-band frame shorter than its head")
    _, packed_length = _OUT_OF_BAND_HEAD.unpack(view[: _OUT_OF_BAND_HEAD.size])
    start = _OUT_OF_BAND_HEAD.size
    cursor = start + packed_length
    if cursor > len(view):
        raise ValueError(f"out-of-band frame announces {packed_length} bytes of messages")

    def pickled_from_ext(code: int, data: bytes) -> Any:
        nonlocal cursor
        if code != _PICKLED_EXT:
            raise ValueError(f"unknown msgpack extension type {code}")
        header, lengths = msgpack.unpackb(data, raw=False)
        if not isinstance(header, bytes) or not isinstance(lengths, list):
            raise ValueError("a pickled value's extension must hold its header and lengths")
        buffers = []
        for length in lengths:
            cursor = aligned(cursor)
            if not isinstance(length, int) or length < 0 or cursor + length > len(view):
                raise ValueError("out-of-band buffers run past the end of their frame")
            buffers.append(view[cursor : cursor + length])
            cursor += length
        return Pickled(header, buffers)

    messages = msgpack.unpackb(
        view[start : start + packed_length],
        raw=False,
        strict_map_key=False,
        use_list=True,
        ext_hook=pickled_from_ext,
    )
    if cursor != len(view):
        raise ValueError(f"{len(view) - cursor} bytes after the last out-of-band buffer")
    return messages


def frame_length(header: bytes | bytearray | memoryview, limit: int) -> int:
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise ProtocolError(
            f"frame announces {length} bytes, more than the limit of {limit} bytes "
            "(raise comm.max-frame-bytes if this is legitimate)"
        )
    return length


def decode(payload: Buffer) -> list[Message]:
    try:
        if payload and payload[0] == OUT_OF_BAND_MARK:
            messages = _decode_out_of_band(payload)
        else:
            messages = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from None
    if not isinstance(messages, list):
        raise ProtocolError(f"frame must hold a list of messages, got {type(messages).__name__}")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolError(
                f"every message must be a map with a string 'op', got {str(message)[:200]}"
            )
    return messages
