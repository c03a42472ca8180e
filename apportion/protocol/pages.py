"""The buffer a large frame is received into: its pages made ahead of the bytes, in bulk.

A fresh anonymous memory map costs nothing until written to; then every page costs a
page fault when the kernel first copies bytes into it, and on virtual machines those
faults are most of what receiving into new memory costs. Two things make them cheap:

- The map is private and asks for transparent huge pages (``MADV_HUGEPAGE``): one fault
  and one zeroing per 2 MiB instead of per 4 KiB. Measured on the development machine,
  400 MB of new touched memory: 380 ms page by page, 180 ms with ``MAP_POPULATE``, 50 ms
  in huge pages. (A shared anonymous map, ``mmap.mmap(-1, n)``'s default, lives in
  shared memory, which gets no huge pages: it must be private.)
- Each window of pages is made in one call (``MADV_POPULATE_WRITE``) before the socket's
  bytes are read into it, instead of fault by fault inside the copy.

Huge pages have one cost that small ones do not: on a virtual machine whose host takes
back free memory (free page reporting, which reports free blocks of 2 MiB: the kernel's
``page_reporting_order`` 9), a huge page made from such a block costs the host 512
faults. Those windows were made at 0.55 GB/s on the development machine, against 5-9
GB/s for huge pages the host still had and about 1.9 GB/s for small pages, and they come
in stretches (a few hundred MB in a row). So the time each window takes is watched: after
a window of huge pages made slower than ``SLOW_HUGE_PAGES`` bytes a second, windows are
made of small pages, each starting with one huge page as a probe, until a probe is fast
again.

Windows grow with what arrived (doubling, up to ``MAX_WINDOW``), so the memory a frame
holds follows the bytes that arrived, not the length its header announced. Where the
system lacks either advice (not Linux, a kernel before 5.14, huge pages off), pages come
by fault as before: slower, never wrong.
"""

from __future__ import annotations

import errno
import mmap
import time

MIN_WINDOW = 1 << 20
MAX_WINDOW = 32 << 20
HUGE_PAGE = 2 << 20  # windows end on huge-page boundaries: none is made twice over
# Below what small pages come at (about 1.9 GB/s there), leaving room for the fixed cost
# of one call on a probe of 2 MiB (hot probes: 1.6-2.6 GB/s; taken back: 0.4-0.8).
SLOW_HUGE_PAGES = 1.2e9
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14 (not in Python 3.11's mmap module)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)

# Cleared on the first kernel that refuses it (EINVAL): it will not accept it later.
_populate = hasattr(mmap, "MADV_HUGEPAGE")


def _new_map(length: int) -> tuple[mmap.mmap, bool | None]:
    """The map, and True if it asked for huge pages (None: it could not)."""
    if not _PRIVATE:  # (Windows: every anonymous map is private)
        return mmap.mmap(-1, length), None
    memory = mmap.mmap(-1, length, flags=_PRIVATE)
    if length and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
            return memory, True
        except OSError:  # huge pages not built into this kernel: small ones, by fault
            pass
    return memory, None


def huge_pages_pay(size: int, seconds: float) -> bool:
    """Whether huge pages made at this pace (``size`` bytes in ``seconds``) are worth
    asking for in the next window (see the module's docstring)."""
    return size < HUGE_PAGE or size >= SLOW_HUGE_PAGES * seconds


class FrameBuffer:
    """A private anonymous memory map of ``length`` bytes, to be written from the start
    on; ``room(filled)`` makes pages ahead of the ``filled`` bytes written so far."""

    __slots__ = ("huge", "length", "map", "ready")

    def __init__(self, length: int) -> None:
        # huge: whether the next window is made of huge pages (None: never)
        self.map, self.huge = _new_map(length)
        self.length = length
        # Pages exist up to here; without bulk making, everything is left to faults.
        self.ready = 0 if _populate else length

    def room(self, filled: int) -> int:
        """Where the made pages end, after making more when little is left beyond
        ``filled``; raises MemoryError when the system has no memory for them."""
        global _populate
        ready = self.ready
        if ready < self.length:
            window = min(MAX_WINDOW, max(MIN_WINDOW, filled))
            if ready - filled < window // 2:
                aligned = (ready + window) // HUGE_PAGE * HUGE_PAGE
                end = min(self.length, max(aligned, ready + MIN_WINDOW))
                try:
                    self._make(ready, end)
                except OSError as exc:
                    if exc.errno in (errno.ENOMEM, errno.EFAULT):
                        raise MemoryError(
                            f"no memory for the {end - ready} bytes of a frame of "
                            f"{self.length} bytes at byte {ready}"
                        ) from None
                    _populate = False  # EINVAL: an older kernel; pages come by fault
                    end = self.length
                self.ready = ready = end
        return ready

    def _make(self, start: int, end: int) -> None:
        """Make the pages of ``start:end``: huge ones while they come fast, else small
        ones after a probe of one huge page (which may find them fast again)."""
        if self.huge is False and end - start > HUGE_PAGE:
            self.huge = self._made_fast(start, start + HUGE_PAGE)
            start += HUGE_PAGE
        if self.huge is False:
            self.map.madvise(mmap.MADV_NOHUGEPAGE, start, end - start)
        made_fast = self._made_fast(start, end)
        if self.huge:
            self.huge = made_fast

    def _made_fast(self, start: int, end: int) -> bool:
        """Make the pages of ``start:end``; whether huge pages came fast enough there."""
        began = time.perf_counter()
        self.map.madvise(_MADV_POPULATE_WRITE, start, end - start)
        return huge_pages_pay(end - start, time.perf_counter() - began)
