"""FrameReader: however the stream is chunked, the same frames come out, each checked."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.protocol import pages
from apportion.protocol.frames import ProtocolError, decode, encode
from apportion.protocol.reader import LARGE_FRAME_BYTES, FrameReader

BATCHES = st.lists(
    st.lists(
        st.fixed_dictionaries({"op": st.text(max_size=5), "data": st.binary(max_size=300)}),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=6,
)


def _drain(reader: FrameReader) -> list[list[dict]]:
    out = []
    while reader.frames:
        out.append(decode(reader.pop()))
    return out


@settings(max_examples=200, deadline=None)
@given(batches=BATCHES, cuts=st.lists(st.integers(min_value=1, max_value=64), max_size=40))
def test_any_chunking_yields_the_frames_in_order(batches: list, cuts: list[int]) -> None:
    stream = b"".join(encode(batch) for batch in batches)
    reader = FrameReader(max_frame=1 << 20)
    got: list = []
    position = 0
    for cut in cuts:
        reader.feed(stream[position : position + cut])
        position += cut
        got += _drain(reader)
    reader.feed(stream[position:])
    got += _drain(reader)
    assert got == batches
    assert reader.waiting_bytes == 0


def test_a_large_frame_is_collected_in_one_buffer_across_chunks() -> None:
    big = [{"op": "big", "data": bytes(range(256)) * (LARGE_FRAME_BYTES // 128)}]
    stream = encode([{"op": "small"}]) + encode(big) + encode([{"op": "after"}])
    reader = FrameReader(max_frame=1 << 26)
    for start in range(0, len(stream), 100_000):
        reader.feed(stream[start : start + 100_000])
    assert _drain(reader) == [[{"op": "small"}], big, [{"op": "after"}]]


def test_before_trust_every_frame_and_all_that_is_held_fit_the_handshake_limit() -> None:
    reader = FrameReader(max_frame=10_000, handshake_limit=100)
    with pytest.raises(ProtocolError, match="limit of 100 bytes"):
        reader.feed(encode([{"op": "hello", "pad": b"x" * 200}]))
    # Small frames each within the limit, but more than it in all: refused too.
    reader = FrameReader(max_frame=10_000, handshake_limit=100)
    reader.feed(encode([{"op": "a", "pad": b"x" * 40}]))
    with pytest.raises(ProtocolError, match="more than 100 bytes sent before authentication"):
        reader.feed(encode([{"op": "b", "pad": b"x" * 40}]) * 2)
    # An empty frame does not open the door to a large one (an empty frame was enough
    # to make a server allocate what the next header announced).
    reader = FrameReader(max_frame=1 << 30, handshake_limit=100)
    with pytest.raises(ProtocolError, match="limit of 100 bytes"):
        reader.feed(struct.pack("<I", 0) + struct.pack("<I", 1 << 29))


def test_after_trust_frames_up_to_max_frame_are_accepted() -> None:
    reader = FrameReader(max_frame=10_000, handshake_limit=100)
    reader.feed(encode([{"op": "hello"}]))
    reader.trust()
    reader.feed(encode([{"op": "x", "pad": b"x" * 5_000}]))
    assert [m[0]["op"] for m in _drain(reader)] == ["hello", "x"]
    with pytest.raises(ProtocolError, match="limit of 10000 bytes"):
        reader.feed(encode([{"op": "x", "pad": b"x" * 20_000}])[:4])  # refused by its header


def test_the_connecting_side_trusts_after_the_first_frame() -> None:
    reader = FrameReader(max_frame=10_000, handshake_limit=100, trust_after_first_frame=True)
    reader.feed(encode([{"op": "welcome"}]) + encode([{"op": "x", "pad": b"x" * 5_000}]))
    assert [m[0]["op"] for m in _drain(reader)] == ["welcome", "x"]


def test_a_large_frame_buffer_grows_with_what_arrives_not_what_is_announced() -> None:
    reader = FrameReader(max_frame=1 << 30)
    tracemalloc.start()
    try:
        reader.feed(struct.pack("<I", (1 << 30) - 1) + b"x" * LARGE_FRAME_BYTES)
        for _ in range(4):
            reader.feed(b"y" * LARGE_FRAME_BYTES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * LARGE_FRAME_BYTES, f"peak {peak} bytes for 5 chunks of 256 KiB"
    reader.drop_incomplete()
    assert reader.large is None and not reader.frames


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_the_memory_of_a_large_frame_grows_with_what_arrives() -> None:
    reader = FrameReader(max_frame=1 << 30)
    start = _rss_bytes()
    reader.feed(struct.pack("<I", (1 << 30) - 1) + b"x" * LARGE_FRAME_BYTES)
    for _ in range(4):
        reader.feed(b"y" * LARGE_FRAME_BYTES)
    received = 5 * LARGE_FRAME_BYTES
    large = reader.large
    assert large is not None
    # Its thread makes pages ahead of what arrived, then waits for more to arrive.
    deadline = time.monotonic() + 30
    while large.ready < received + pages.STEP:
        assert time.monotonic() < deadline, "the frame's thread made no pages ahead"
        time.sleep(0.001)
    grown = _rss_bytes() - start
    # What arrived, as much again made ahead of it, and the step its thread was making.
    bound = 2 * received + 2 * pages.STEP
    assert grown < bound, f"RSS grew {grown} bytes for 1.25 MiB received"
    reader.drop_incomplete()
    assert reader.large is None and not reader.frames
