"""Length-prefixed msgpack frames; each frame carries a batch (list) of messages.

Layout: 4-byte little-endian payload length, then one msgpack array of maps,
each map holding at least ``"op"``. Binary payloads (pickled functions, data)
travel as msgpack ``bin``.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from apportion.errors import ApportionError

HEADER = struct.Struct("<I")
HEADER_BYTES = HEADER.size
MAX_FRAME_LIMIT = (1 << 32) - 1
# Bumped on any incompatible change to messages; checked in the handshake.
PROTOCOL_VERSION = 1

Message = dict[str, Any]


class ProtocolError(ApportionError):
    """A peer sent something that is not a valid apportion frame."""


def encode(messages: list[Message]) -> bytes:
    payload = msgpack.packb(messages, use_bin_type=True)
    if len(payload) > MAX_FRAME_LIMIT:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the 4 GiB wire limit")
    return HEADER.pack(len(payload)) + payload


def frame_length(header: bytes | bytearray | memoryview, limit: int) -> int:
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise ProtocolError(
            f"frame announces {length} bytes, more than the limit of {limit} bytes "
            "(raise comm.max-frame-bytes if this is legitimate)"
        )
    return length


def decode(payload: bytes | bytearray | memoryview) -> list[Message]:
    try:
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
