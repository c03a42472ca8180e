"""FrameReader: however the stream is chunked, the same frames come out, each checked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_the_first_frame_has_its_own_limit_and_the_rest_the_usual_one() -> None:
    reader = FrameReader(max_frame=10_000, first_frame_limit=100)
    with pytest.raises(ProtocolError, match="limit of 100 bytes"):
        reader.feed(encode([{"op": "hello", "pad": b"x" * 200}]))
    reader = FrameReader(max_frame=10_000, first_frame_limit=100)
    reader.feed(encode([{"op": "hello"}]) + encode([{"op": "x", "pad": b"x" * 5_000}]))
    assert [m[0]["op"] for m in _drain(reader)] == ["hello", "x"]
    with pytest.raises(ProtocolError, match="limit of 10000 bytes"):
        reader.feed(encode([{"op": "x", "pad": b"x" * 20_000}])[:4])  # refused by its header
