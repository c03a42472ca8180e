"""Cutting a byte stream into frames: pure, no I/O (the connection feeds it what arrives)."""

from __future__ import annotations

from collections import deque

from apportion.protocol.frames import HEADER_BYTES, ProtocolError, frame_length
from apportion.protocol.pages import FrameBuffer, MapRecycler

# A frame this large is collected in a buffer of its own: an anonymous memory map of the
# announced length, whose pages are made just ahead of the bytes written to them (see
# pages.py), so memory grows with what arrives (and the buffer never moves as it grows).
LARGE_FRAME_BYTES = 256 * 1024


Payload = bytes | bytearray | memoryview

# The maps of large frames received in this process, taken again once their values are
# gone (pages.MapRecycler). One per process: connections come and go, values outlive them.
RECYCLER = MapRecycler()


class FrameReader:
    """Feed it bytes as they arrive; whole frame payloads come out of ``frames`` in order.

    Until ``trust()`` is called (the peer authenticated), everything held (whole frames
    and the start of the next) must fit in ``handshake_limit``: an unauthenticated peer
    costs no more memory than that, whatever its headers announce. With
    ``trust_after_first_frame`` the limit applies to the first frame only (a server's
    welcome, read by the side that connected). Once trusted, each frame's announced length
    is checked against ``max_frame``, and a large frame's buffer grows with the bytes that
    actually arrive, not with the length its header announces. A violation raises
    ProtocolError, and the stream is unusable from then on.
    """

    def __init__(
        self,
        max_frame: int,
        handshake_limit: int | None = None,
        trust_after_first_frame: bool = False,
    ) -> None:
        self.max_frame = max_frame
        self.frames: deque[Payload] = deque()
        self.waiting_bytes = 0  # the size of the payloads in ``frames``
        self._handshake_limit = handshake_limit
        self._trust_after_first_frame = trust_after_first_frame and handshake_limit is not None
        # What the next frame header is checked against.
        self._limit = max_frame if handshake_limit is None else handshake_limit
        self._partial = bytearray()  # the start of a frame not yet whole
        # A large frame being filled (the connection may read into it directly: large_room).
        self.large: FrameBuffer | None = None
        self.large_length = 0  # what its header announced
        self._filled = 0  # how much of it arrived
        self._maps = RECYCLER

    @property
    def trusted(self) -> bool:
        return self._handshake_limit is None

    def trust(self) -> None:
        """The peer authenticated: frames up to ``max_frame`` are accepted from now on."""
        self._handshake_limit = None
        self._trust_after_first_frame = False
        self._limit = self.max_frame

    def drop_incomplete(self) -> None:
        """Drop the frame not yet whole (the stream ended or failed: it never will be);
        whole frames stay to be read."""
        self._partial = bytearray()
        if self.large is not None:
            self.large.stop()
        self.large = None

    def feed(self, data: bytes | memoryview) -> None:
        if self.large is not None:
            data = self._fill_large(data)
            if not data:
                return
        if not self._partial and len(data) >= HEADER_BYTES:
            # The common case, nothing left over: frames are cut straight out of the chunk.
            self._cut(memoryview(data))
        else:
            self._partial += data
            self._cut(memoryview(bytes(self._partial)))
        limit = self._handshake_limit
        if limit is not None and self.waiting_bytes + len(self._partial) > limit:
            self.drop_incomplete()
            raise ProtocolError(
                f"more than {limit} bytes sent before authentication: only a handshake "
                "is accepted until then"
            )

    def pop(self) -> Payload:
        payload = self.frames.popleft()
        self.waiting_bytes -= len(payload)
        return payload

    def _cut(self, view: memoryview) -> None:
        """Queue the whole frames at the start of ``view``; keep the rest for later."""
        start, size = 0, len(view)
        while size - start >= HEADER_BYTES:
            length = frame_length(view[start : start + HEADER_BYTES], self._limit)
            if self._trust_after_first_frame:
                self.trust()
            end = start + HEADER_BYTES + length
            if end > size:
                if length >= LARGE_FRAME_BYTES:
                    self.large = self._maps.frame_buffer(length)
                    self.large_length, self._filled = length, 0
                    self._fill_large(view[start + HEADER_BYTES :])
                    start = size
                break
            self._queue(view[start + HEADER_BYTES : end])
            start = end
        self._partial = bytearray(view[start:]) if start < size else bytearray()

    def _queue(self, payload: Payload) -> None:
        self.frames.append(payload)
        self.waiting_bytes += len(payload)

    def _fill_large(self, data: bytes | memoryview) -> bytes | memoryview:
        """Append to the large frame being filled; returns the bytes past its end."""
        large = self.large
        assert large is not None
        take = min(self.large_length - self._filled, len(data))
        taken = 0
        while taken < take:
            end = min(self._room(), self._filled + take - taken)
            large.map[self._filled : end] = memoryview(data)[taken : taken + end - self._filled]
            taken += end - self._filled
            self._filled = end
        self._complete_large()
        return data[take:]

    def _room(self) -> int:
        """Where the made pages of the large frame end (more are made as needed)."""
        assert self.large is not None
        try:
            return self.large.room(self._filled)
        except MemoryError as exc:
            self.drop_incomplete()  # its pages may be gone: never touched again
            raise ProtocolError(str(exc)) from None

    def large_room(self) -> memoryview:
        """The part of the large frame being filled that is ready for the bytes still to
        arrive: a socket may read straight into it (then call ``large_written``)."""
        assert self.large is not None
        return memoryview(self.large.map)[self._filled : self._room()]

    def large_written(self, count: int) -> None:
        """``count`` bytes were read into ``large_room()``."""
        self._filled += count
        self._complete_large()

    def _complete_large(self) -> None:
        if self.large is not None and self._filled == self.large_length:
            self.large.stop()
            # (a map taken again may be a little larger than the frame)
            self._queue(memoryview(self.large.map)[: self.large_length])
            self.large = None
