"""Length-prefixed msgpack frames."""

from __future__ import annotations

import msgpack
import pytest

from apportion.protocol.frames import (
    HEADER,
    HEADER_BYTES,
    ProtocolError,
    decode,
    encode,
    frame_length,
)


def _split(frame: bytes) -> tuple[bytes, bytes]:
    return frame[:HEADER_BYTES], frame[HEADER_BYTES:]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"op": "heartbeat"}],
        [{"op": "compute", "key": "k", "run_id": 3, "func": b"\x00\xff", "args": b""}],
        [{"op": "a"}, {"op": "b", "n": 1.5}, {"op": "c", "nested": {"x": [1, None, True]}}],
        [{"op": "unicode", "text": "GPU \u2713 \u00e9"}],
        [{"op": "big", "data": b"x" * 1_000_000}],
        [{"op": "int-keys", "map": {1: "one", 2: "two"}}],
    ],
)
def test_batch_round_trips(messages: list[dict]) -> None:
    header, payload = _split(encode(messages))
    assert frame_length(header, 1 << 30) == len(payload)
    assert decode(payload) == messages


def test_bytes_stay_bytes_and_strings_stay_strings() -> None:
    (message,) = decode(_split(encode([{"op": "x", "b": b"abc", "s": "abc"}]))[1])
    assert isinstance(message["b"], bytes)
    assert isinstance(message["s"], str)


def test_header_is_four_byte_little_endian_length() -> None:
    frame = encode([{"op": "x"}])
    assert HEADER_BYTES == 4
    assert int.from_bytes(frame[:4], "little") == len(frame) - 4


def test_several_frames_concatenated_split_at_their_announced_lengths() -> None:
    batches = [[{"op": "a", "i": i}] * (i + 1) for i in range(5)]
    stream = b"".join(encode(b) for b in batches)
    decoded = []
    while stream:
        length = frame_length(stream[:HEADER_BYTES], 1 << 20)
        decoded.append(decode(stream[HEADER_BYTES : HEADER_BYTES + length]))
        stream = stream[HEADER_BYTES + length :]
    assert decoded == batches


@pytest.mark.parametrize(("length", "limit"), [(11, 10), (2**32 - 1, 1 << 30), (1 << 31, 1)])
def test_oversize_frame_announcement_is_rejected_naming_both_sizes(length: int, limit: int) -> None:
    with pytest.raises(ProtocolError) as info:
        frame_length(HEADER.pack(length), limit)
    assert str(length) in str(info.value)
    assert str(limit) in str(info.value)
    assert "comm.max-frame-bytes" in str(info.value)


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    assert frame_length(HEADER.pack(10), 10) == 10


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # array of 2 with one element: truncated
        encode([{"op": "x"}])[HEADER_BYTES:-1],  # truncated
        encode([{"op": "x"}])[HEADER_BYTES:] + b"\x00",  # trailing garbage
        b"",
    ],
)
def test_non_msgpack_payload_is_a_protocol_error(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode(payload)


@pytest.mark.parametrize(
    ("value", "kind"),
    [({"op": "x"}, "dict"), ("hello", "str"), (5, "int"), (None, "NoneType")],
)
def test_payload_that_is_not_a_list_is_a_protocol_error(value: object, kind: str) -> None:
    with pytest.raises(ProtocolError, match=f"list of messages, got {kind}"):
        decode(msgpack.packb(value))


@pytest.mark.parametrize(
    "message",
    [{"key": "k"}, {"op": 5}, {"op": None}, {"op": b"bytes"}, "op", 7, ["op", "x"]],
)
def test_message_without_a_string_op_is_a_protocol_error(message: object) -> None:
    payload = msgpack.packb([{"op": "fine"}, message], use_bin_type=True)
    with pytest.raises(ProtocolError, match="string 'op'"):
        decode(payload)


def test_protocol_error_quotes_at_most_200_characters_of_a_bad_message() -> None:
    payload = msgpack.packb([{"data": "x" * 10_000}])
    with pytest.raises(ProtocolError) as info:
        decode(payload)
    assert len(str(info.value)) < 400
