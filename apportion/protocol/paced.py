"""Bytes waiting to be handed to a TLS transport a chunk at a time: pure, no I/O.

A TLS transport (uvloop's, and asyncio's since Python 3.11) encrypts all it is given at
once into its outgoing memory buffer, then copies that out as one bytes object for the
socket: a 100 MB frame handed over whole holds two more copies of itself in the sending
process until the kernel took the last byte, and the peer cannot start decrypting before
all of it was encrypted. Handed over a chunk at a time, each chunk once the transport took
the one before, the sender holds a chunk or two more, and encrypting the next chunk here
overlaps with decrypting the last one over there.
"""

from __future__ import annotations

from collections import deque

from apportion.protocol.frames import Buffer

# Large enough that the loop's work per chunk (a write, a pause and a resume) is small
# beside encrypting it, small enough that the chunks in flight cost little memory and the
# peer starts decrypting early.
TLS_CHUNK_BYTES = 1 << 20


class PacedWrites:
    """A queue of buffers to write in order, taken out ``chunk`` bytes at most at a time:
    views of the buffers (nothing is joined or copied), several small ones together."""

    def __init__(self, chunk: int = TLS_CHUNK_BYTES) -> None:
        if chunk <= 0:
            raise ValueError(f"chunk must be a positive number of bytes, got {chunk}")
        self.chunk = chunk
        self._pieces: deque[memoryview] = deque()
        self.pending_bytes = 0

    def __bool__(self) -> bool:
        return bool(self._pieces)

    def add(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes:
            self._pieces.append(view)
            self.pending_bytes += view.nbytes

    def next_chunk(self) -> list[memoryview]:
        """The next at most ``chunk`` bytes (at least one byte: call only while something
        waits): a part of the first buffer waiting, or as many whole buffers as fit."""
        pieces = self._pieces
        first = pieces[0]
        if first.nbytes > self.chunk:
            taken, pieces[0] = first[: self.chunk], first[self.chunk :]
            self.pending_bytes -= taken.nbytes
            return [taken]
        batch, size = [], 0
        while pieces and size + pieces[0].nbytes <= self.chunk:
            piece = pieces.popleft()
            batch.append(piece)
            size += piece.nbytes
        self.pending_bytes -= size
        return batch

    def take_all(self) -> list[memoryview]:
        """Everything still waiting, in order; the queue is empty afterwards."""
        pieces, self._pieces = list(self._pieces), deque()
        self.pending_bytes = 0
        return pieces
