"""Large buffers travel out of band: pickled without copying them, written from where
they are, and rebuilt as views into the received frame (one copy in all: the receive)."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.protocol.frames import (
    BUFFER_ALIGNMENT,
    HEADER_BYTES,
    Buffer,
    Message,
    ProtocolError,
    decode,
    encode,
    encode_frame,
)
from apportion.protocol.reader import FrameReader
from apportion.serialize import (
    OUT_OF_BAND_MIN_BYTES,
    Pickled,
    dumps_args,
    dumps_data,
    loads_args,
    loads_value,
    tokenize,
)


class Dep:
    def __init__(self, key: str) -> None:
        self.key = key


def encode_parts(messages: list[Message]) -> list[Buffer]:
    """One frame as the list of pieces a connection writes (one piece for a plain frame)."""
    frame = encode_frame(messages)
    return [frame] if isinstance(frame, bytes) else frame


def received(parts: list) -> bytearray:
    """The frame's payload as a reader collects it from the socket."""
    reader = FrameReader(max_frame=1 << 30)
    for part in parts:
        reader.feed(bytes(part))
    (payload,) = reader.frames
    return payload


def test_a_large_array_is_pickled_without_copying_its_data() -> None:
    array = np.arange(1_000_000, dtype="f8")
    pickled = dumps_data(array)
    assert isinstance(pickled, Pickled)
    (buffer,) = pickled.buffers
    assert np.shares_memory(np.frombuffer(buffer, dtype="f8"), array)
    assert len(pickled.header) < 1000
    assert len(pickled) == len(pickled.header) + array.nbytes


def test_small_values_stay_plain_bytes() -> None:
    small = np.arange(OUT_OF_BAND_MIN_BYTES // 8 - 1, dtype="f8")
    assert isinstance(dumps_data(small), bytes)
    assert isinstance(dumps_data({"a": [1, 2, 3]}), bytes)
    assert isinstance(dumps_args((1, "x"), {}, Dep)[0], bytes)


def test_a_frame_writes_the_buffers_from_where_they_are() -> None:
    array = np.arange(1_000_000, dtype="f8")
    parts = encode_parts([{"op": "data", "data": {"k": dumps_data(array)}, "small": b"s"}])
    assert len(parts) <= 3  # the messages, zero bytes up to an aligned start, the array
    assert np.shares_memory(np.frombuffer(parts[-1], dtype="f8"), array)
    assert sum(memoryview(p).nbytes for p in parts) < array.nbytes + 1000
    assert encode_parts([{"op": "x", "data": b"y"}]) == [encode([{"op": "x", "data": b"y"}])]


def test_received_values_are_views_of_the_frame_and_writable() -> None:
    array = np.arange(1_000_000, dtype="f8")
    payload = received(encode_parts([{"op": "data", "data": {"k": dumps_data(array)}}]))
    (message,) = decode(payload)
    value = loads_value(message["data"]["k"])
    np.testing.assert_array_equal(value, array)
    assert np.shares_memory(value, np.frombuffer(payload, dtype="u1"))
    value[0] = -1  # writable, as after an in-band pickle
    assert value[0] == -1


@pytest.mark.parametrize("name", ["k", "a-longer-key", "kk"])
def test_received_large_arrays_are_aligned_in_memory(name: str) -> None:
    # Misaligned, numpy copies the array through a small buffer for every operation
    # (and some libraries refuse it): each buffer starts at an aligned offset of a
    # payload that itself starts on a page, whatever the length of what precedes it.
    arrays = [np.arange(100_000, dtype="f8"), np.arange(3, 50_003, dtype="i2")]
    values = {name: dumps_data(arrays[0]), "second": dumps_data(arrays[1])}
    parts = encode_parts([{"op": "data", "data": values}])
    payload = received(parts)
    (message,) = decode(payload)
    for key, array in zip([name, "second"], arrays, strict=True):
        value = loads_value(message["data"][key])
        np.testing.assert_array_equal(value, array)
        assert value.flags.aligned and value.ctypes.data % BUFFER_ALIGNMENT == 0
        assert np.shares_memory(value, np.frombuffer(payload, dtype="u1"))


def test_a_small_frame_with_out_of_band_buffers_gives_writable_copies() -> None:
    # A frame below the reader's large-frame size is cut from read-only bytes.
    array = np.arange(OUT_OF_BAND_MIN_BYTES // 8, dtype="f8")
    frame = encode([{"op": "data", "value": dumps_data(array)}])
    (message,) = decode(memoryview(frame)[HEADER_BYTES:])
    value = loads_value(message["value"])
    value[0] = 5
    assert value[0] == 5 and array[0] == 0


def test_arguments_with_large_arrays_and_futures_round_trip() -> None:
    array = np.ones(500_000)
    args, deps = dumps_args((array, Dep("k")), {"scale": array[:100_000]}, Dep)
    assert isinstance(args, Pickled) and deps == ["k"]
    payload = received(encode_parts([{"op": "compute", "args": args}]))
    (message,) = decode(payload)
    (got, dep), kwargs = loads_args(message["args"], lambda key: f"value of {key}")
    np.testing.assert_array_equal(got, array)
    np.testing.assert_array_equal(kwargs["scale"], array[:100_000])
    assert dep == "value of k"


def test_tokens_of_equal_pickles_are_equal() -> None:
    assert tokenize(dumps_data(np.ones(100_000))) == tokenize(dumps_data(np.ones(100_000)))
    assert tokenize(dumps_data(np.ones(100_000))) != tokenize(dumps_data(np.zeros(100_000)))


def test_large_pickles_are_hashed_at_memory_speed_not_with_blake2b(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 1 MB argument's key took 1.3 ms of its 2.4 ms submit call in BLAKE2b.
    import xxhash

    import apportion.serialize as serialize

    big, other = dumps_data(np.ones(200_000)), dumps_data(np.zeros(200_000))
    assert serialize.large_pickle(big) and not serialize.large_pickle(dumps_data(1))
    pieces = big.parts() if isinstance(big, Pickled) else [big]
    expected = xxhash.xxh3_128(b"".join(bytes(piece) for piece in [b"f", *pieces])).hexdigest()

    def no_blake2b(*args: object, **kwargs: object) -> None:
        raise AssertionError("BLAKE2b used for a large pickle")

    monkeypatch.setattr(serialize.hashlib, "blake2b", no_blake2b)
    assert tokenize(b"f", big, large=True) == expected
    assert tokenize(b"f", big, large=True) != tokenize(b"f", other, large=True)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p[:-1],  # the last buffer cut short
        lambda p: p + b"\x00",  # bytes after the last buffer
        lambda p: p[:3],  # shorter than its head
        lambda p: p[:1] + b"\xff\xff\xff\x7f" + p[5:],  # messages past the end
    ],
)
def test_a_malformed_out_of_band_frame_is_a_protocol_error(tamper) -> None:  # type: ignore[no-untyped-def]
    frame = b"".join(
        bytes(p) for p in encode_parts([{"op": "data", "value": dumps_data(np.ones(10_000))}])
    )
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode(tamper(frame[HEADER_BYTES:]))
