"""The buffer a large frame is received into: its pages made ahead of the bytes, in bulk.

A fresh anonymous memory map costs nothing until written to; then every 4 KiB page costs
a page fault when the kernel first copies bytes into it, and on virtual machines those
faults are most of what receiving into new memory costs (a 400 MB frame: about 100,000
of them, more kernel time than the copies themselves). Mapping a window of the buffer
again with ``MAP_POPULATE`` makes its pages in one call instead, at about half the
kernel time, before the socket's bytes are read into it. Windows grow with what arrived
(doubling, up to ``MAX_WINDOW``), so the memory a frame holds still follows the bytes
that arrived, not the length its header announced.

Only where the C library's ``mmap`` can be called (Linux); elsewhere pages come by fault.
(ctypes is imported on the first large frame: most processes never receive one.)
"""

from __future__ import annotations

import functools
import mmap
import sys
from typing import Any

MIN_WINDOW = 1 << 20
MAX_WINDOW = 32 << 20
_MAP_FIXED = 0x10  # Linux's value on every architecture


@functools.cache
def _libc_mmap() -> Any:
    """The C library's mmap, or None where it cannot be called this way."""
    if sys.platform != "linux" or not hasattr(mmap, "MAP_POPULATE"):
        return None
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).mmap
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return function


_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | getattr(mmap, "MAP_POPULATE", 0)
_PROT = mmap.PROT_READ | mmap.PROT_WRITE


class FrameBuffer:
    """An anonymous memory map of ``length`` bytes, to be written from the start on;
    ``room(filled)`` makes pages ahead of the ``filled`` bytes written so far."""

    __slots__ = ("_base", "length", "map", "ready")

    def __init__(self, length: int) -> None:
        self.map = mmap.mmap(-1, length)
        self.length = length
        self._base = 0
        if length and _libc_mmap() is not None:
            import ctypes

            pointer = ctypes.c_char.from_buffer(self.map)
            self._base = ctypes.addressof(pointer)
            del pointer  # (held, it would keep the map from being closed)
        # Pages exist up to here; without bulk mapping, everything is left to faults.
        self.ready = 0 if self._base else length

    def room(self, filled: int) -> int:
        """Where the made pages end, after making more when little is left beyond
        ``filled`` (never over bytes written: only pages past ``ready`` are mapped)."""
        ready = self.ready
        if ready < self.length:
            window = min(MAX_WINDOW, max(MIN_WINDOW, filled)) // mmap.PAGESIZE * mmap.PAGESIZE
            if ready - filled < window // 2:
                size = min(window, self.length - ready)
                address = _libc_mmap()(self._base + ready, size, _PROT, _FLAGS, -1, 0)
                if address != self._base + ready:
                    # The range may be unmapped now: this buffer must not be touched again.
                    import ctypes

                    errno = ctypes.get_errno()
                    raise MemoryError(
                        f"could not map {size} bytes for a frame of {self.length} bytes "
                        f"(errno {errno})"
                    )
                self.ready = ready = ready + size
        return ready
