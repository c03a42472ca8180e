"""PacedWrites: buffers handed out a chunk at a time, in order, as views (no copies)."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.protocol.paced import PacedWrites


def _drain(paced: PacedWrites) -> list[memoryview]:
    chunks = []
    while paced:
        chunks.append(paced.next_chunk())
    return chunks


@pytest.mark.parametrize("size", [1, 9, 10, 11, 30, 31])
def test_every_byte_comes_out_once_in_order_in_chunks_of_at_most_the_limit(size: int) -> None:
    paced = PacedWrites(chunk=10)
    data = bytes(range(size))
    paced.add(b"head")
    paced.add(data)
    paced.add(b"")  # nothing to write: not queued
    paced.add(b"tail")
    assert paced.pending_bytes == size + 8
    chunks = _drain(paced)
    assert b"".join(chunks) == b"head" + data + b"tail"
    assert all(0 < c.nbytes <= 10 for c in chunks)
    # A chunk never spans two buffers: each is a view of one of them.
    assert [bytes(c) for c in chunks[:1]] == [b"head"] and bytes(chunks[-1]) == b"tail"
    assert paced.pending_bytes == 0 and not paced


def test_chunks_are_views_of_the_buffers_not_copies() -> None:
    array = np.arange(1000, dtype="f8")  # 8,000 bytes, a memoryview of format "d"
    paced = PacedWrites(chunk=3000)
    paced.add(memoryview(array))
    chunks = _drain(paced)
    assert [c.nbytes for c in chunks] == [3000, 3000, 2000]
    array[0] = 42.0  # written after the chunks were cut: they see it
    assert bytes(chunks[0][:8]) == np.float64(42.0).tobytes()


def test_take_all_hands_over_the_rest_and_empties_the_queue() -> None:
    paced = PacedWrites(chunk=4)
    paced.add(b"abcdefgh")
    paced.add(b"ij")
    assert bytes(paced.next_chunk()) == b"abcd"
    assert [bytes(p) for p in paced.take_all()] == [b"efgh", b"ij"]
    assert not paced and paced.pending_bytes == 0


def test_a_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PacedWrites(chunk=0)
