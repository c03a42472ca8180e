"""PacedWrites: buffers handed out a chunk at a time, in order, as views (no copies)."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.protocol.paced import PacedWrites


def _drain(paced: PacedWrites) -> list[list[memoryview]]:
    chunks = []
    while paced:
        chunks.append(paced.next_chunk())
    return chunks


@pytest.mark.parametrize("size", [1, 6, 7, 9, 10, 11, 30, 31])
def test_every_byte_comes_out_once_in_order_in_chunks_of_at_most_the_limit(size: int) -> None:
    paced = PacedWrites(chunk=10)
    data = bytes(range(size))
    paced.add(b"head")
    paced.add(data)
    paced.add(b"")  # nothing to write: not queued
    paced.add(b"tail")
    assert paced.pending_bytes == size + 8
    chunks = _drain(paced)
    assert b"".join(b"".join(chunk) for chunk in chunks) == b"head" + data + b"tail"
    assert all(0 < sum(piece.nbytes for piece in chunk) <= 10 for chunk in chunks)
    assert paced.pending_bytes == 0 and not paced


def test_small_buffers_go_together_and_a_large_one_alone_in_parts() -> None:
    paced = PacedWrites(chunk=10)
    for data in (b"ab", b"cd", b"efg", b"0123456789ABCDEF", b"xy"):
        paced.add(data)
    chunks = [[bytes(piece) for piece in chunk] for chunk in _drain(paced)]
    assert chunks == [[b"ab", b"cd", b"efg"], [b"0123456789"], [b"ABCDEF", b"xy"]]


def test_chunks_are_views_of_the_buffers_not_copies() -> None:
    array = np.arange(1000, dtype="f8")  # 8,000 bytes, a memoryview of format "d"
    paced = PacedWrites(chunk=3000)
    paced.add(memoryview(array))
    chunks = [piece for chunk in _drain(paced) for piece in chunk]
    assert [c.nbytes for c in chunks] == [3000, 3000, 2000]
    array[0] = 42.0  # written after the chunks were cut: they see it
    assert bytes(chunks[0][:8]) == np.float64(42.0).tobytes()


def test_take_all_hands_over_the_rest_and_empties_the_queue() -> None:
    paced = PacedWrites(chunk=4)
    paced.add(b"abcdefgh")
    paced.add(b"ij")
    assert [bytes(piece) for piece in paced.next_chunk()] == [b"abcd"]
    assert [bytes(p) for p in paced.take_all()] == [b"efgh", b"ij"]
    assert not paced and paced.pending_bytes == 0


def test_a_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PacedWrites(chunk=0)
