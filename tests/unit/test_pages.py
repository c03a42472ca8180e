"""FrameBuffer: a large frame's pages are made in bulk just ahead of what arrived."""

from __future__ import annotations

import os

from apportion.protocol.frames import decode, encode
from apportion.protocol.pages import MAX_WINDOW, MIN_WINDOW, FrameBuffer
from apportion.protocol.reader import FrameReader


def test_pages_are_made_ahead_of_the_bytes_and_never_far_ahead() -> None:
    length = 200 * MIN_WINDOW + 12_345
    buffer = FrameBuffer(length)
    filled, made = 0, []
    while filled < length:
        ready = buffer.room(filled)
        assert filled < ready <= length
        # Memory follows what arrived: at most twice it, plus one small window.
        assert ready <= max(2 * filled, filled + MAX_WINDOW) + MIN_WINDOW
        made.append(ready)
        step = min(ready, length) - filled
        buffer.map[filled : filled + step] = os.urandom(1) * step
        filled += step
    assert made == sorted(made) and made[-1] == length
    assert len(set(made)) < 40  # in windows, not page by page


def test_a_frame_fed_in_odd_chunks_across_many_windows_arrives_intact() -> None:
    data = os.urandom(1 << 16) * 100  # 6.5 MB
    stream = encode([{"op": "big", "data": data}]) + encode([{"op": "after"}])
    reader = FrameReader(max_frame=1 << 26)
    for start in range(0, len(stream), 300_007):
        reader.feed(stream[start : start + 300_007])
    frames = []
    while reader.frames:
        frames.append(decode(reader.pop()))
    assert frames == [[{"op": "big", "data": data}], [{"op": "after"}]]


def test_reading_straight_into_the_room_fills_the_frame() -> None:
    data = os.urandom(1 << 16) * 40
    stream = encode([{"op": "big", "data": data}])
    reader = FrameReader(max_frame=1 << 26)
    reader.feed(stream[:1000])
    position = 1000
    while reader.large is not None:
        room = reader.large_room()
        count = min(len(room), 777_777, len(stream) - position)
        room[:count] = stream[position : position + count]
        position += count
        reader.large_written(count)
    assert decode(reader.pop()) == [{"op": "big", "data": data}]
