"""Cutting a byte stream into frames: pure, no I/O (the connection feeds it what arrives)."""

from __future__ import annotations

from collections import deque

from apportion.protocol.frames import HEADER_BYTES, frame_length

# A frame this large is collected in a buffer of its own size, allocated once.
LARGE_FRAME_BYTES = 256 * 1024

Payload = bytes | bytearray | memoryview


class FrameReader:
    """Feed it bytes as they arrive; whole frame payloads come out of ``frames`` in order.

    Each frame's announced length is checked before its bytes are kept: against
    ``first_frame_limit`` for the first (the handshake: an unauthenticated peer gets no
    large buffer) and ``max_frame`` for the rest. A frame over its limit raises
    ProtocolError, and the stream is unusable from then on.
    """

    def __init__(self, max_frame: int, first_frame_limit: int | None = None) -> None:
        self.max_frame = max_frame
        self.frames: deque[Payload] = deque()
        self.waiting_bytes = 0  # the size of the payloads in ``frames``
        self._limit = first_frame_limit or max_frame
        self._partial = bytearray()  # the start of a frame not yet whole
        self._large: bytearray | None = None  # a large frame being filled
        self._large_filled = 0

    def feed(self, data: bytes) -> None:
        if self._large is not None:
            data = self._fill_large(data)
            if not data:
                return
        if not self._partial and len(data) >= HEADER_BYTES:
            # The common case, nothing left over: frames are cut straight out of the chunk.
            self._cut(memoryview(data))
        else:
            self._partial += data
            self._cut(memoryview(bytes(self._partial)))

    def pop(self) -> Payload:
        payload = self.frames.popleft()
        self.waiting_bytes -= len(payload)
        return payload

    def _cut(self, view: memoryview) -> None:
        """Queue the whole frames at the start of ``view``; keep the rest for later."""
        start, size = 0, len(view)
        while size - start >= HEADER_BYTES:
            length = frame_length(view[start : start + HEADER_BYTES], self._limit)
            self._limit = self.max_frame
            end = start + HEADER_BYTES + length
            if end > size:
                if length >= LARGE_FRAME_BYTES:
                    self._start_large(view[start + HEADER_BYTES :], length)
                    start = size
                break
            self._queue(view[start + HEADER_BYTES : end])
            start = end
        self._partial = bytearray(view[start:]) if start < size else bytearray()

    def _queue(self, payload: Payload) -> None:
        self.frames.append(payload)
        self.waiting_bytes += len(payload)

    def _start_large(self, have: memoryview, length: int) -> None:
        self._large = bytearray(length)
        self._large[: len(have)] = have
        self._large_filled = len(have)

    def _fill_large(self, data: bytes) -> bytes:
        """Copy into the large frame being filled; returns the bytes past its end."""
        large = self._large
        assert large is not None
        take = min(len(large) - self._large_filled, len(data))
        large[self._large_filled : self._large_filled + take] = data[:take]
        self._large_filled += take
        if self._large_filled == len(large):
            self._large = None
            self._queue(large)
        return data[take:]
