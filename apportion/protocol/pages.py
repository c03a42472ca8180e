"""The buffer a large frame is received into: its pages made ahead of the bytes, in bulk.

A fresh anonymous memory map costs nothing until written to; then every page costs a
page fault when the kernel first copies bytes into it, and on virtual machines those
faults are most of what receiving into new memory costs. So pages are made in bulk
(``MADV_POPULATE_WRITE``: one call for many pages instead of one fault per page), into a
private map (``mmap.mmap(-1, n)``'s default, a shared one, lives in shared memory, which
costs more to make and gets no huge pages), ahead of the bytes:

- A frame of ``THREAD_FROM`` bytes or more has a thread of its own making its pages, a
  ``STEP`` at a time, while the connection copies bytes into the pages made before: the
  kernel makes pages on one CPU while it copies on the other, instead of one after the
  other. The thread leads the bytes by as much again as arrived (from one step to
  ``AHEAD``, plus the step it is making), so the memory a frame holds follows what
  arrived, not the length its header announced. It calls ``madvise`` through ctypes,
  which lets go of the GIL. The thread must lead: made only up to where the reads go,
  it made pages the reads were faulting in already, and gained nothing (400 MB arrays
  on a local cluster, medians of 5: worker to worker 1,262 -> 1,804 MB/s, gather 1,229
  -> 2,203, submit 1,071 -> 1,603 against pages made between reads). It starts with a
  probe of one huge page and goes on in huge pages while they come fast, else in small
  ones, probing again every ``THREAD_PROBE_EVERY`` bytes. On a virtual machine whose
  host takes back free memory (free page reporting, in free blocks of 2 MiB: the
  kernel's ``page_reporting_order`` 9), a huge page made from such a block costs the
  host 512 faults: such huge pages came at 0.4-0.8 GB/s, small ones at about 3 GB/s
  (CPU time of the thread). Huge pages the host still had came at 5-11 GB/s, and cost
  the receiving process 35-45 ms less CPU time per 100 MB than small ones (one fault
  and one zeroing per 2 MiB instead of 512 of each).
- Smaller frames make their pages between reads, a window at a time (doubling with what
  arrived, up to ``MAX_WINDOW``), in transparent huge pages (``MADV_HUGEPAGE``: one
  fault and one zeroing per 2 MiB) while those come fast: after a window of huge pages
  made slower than ``SLOW_HUGE_PAGES`` bytes a second, windows are made of small pages,
  each starting with one huge page as a probe, until a probe is fast again.
- A frame's thread judges how fast pages came by the CPU time it spent making them, not
  by the wall clock: a host slow to hand back memory shows there (its faults are spent
  inside the thread's call), while other processes holding the machine's cores do not
  (judged by the wall clock, a loaded machine turned frames to small pages, which cost
  more).

Where the system lacks either advice (not Linux, a kernel before 5.14, huge pages off),
pages come by fault as before: slower, never wrong.
"""

from __future__ import annotations

import errno
import functools
import mmap
import sys
import threading
import time
import weakref
from collections.abc import Callable

MIN_WINDOW = 1 << 20
MAX_WINDOW = 32 << 20
HUGE_PAGE = 2 << 20  # windows end on huge-page boundaries: none is made twice over
# Below what small pages come at (about 1.9 GB/s there), leaving room for the fixed cost
# of one call on a probe of 2 MiB (hot probes: 1.6-2.6 GB/s; taken back: 0.4-0.8).
SLOW_HUGE_PAGES = 1.2e9
# The same for a frame's thread, which judges by its CPU time (see above): small pages
# come at 2.1-3.5 GB/s by that measure, the first probes of huge pages the host still had
# at 2.1-3.0 GB/s and the steps after them at 8-12; huge pages the host took back at
# 0.4-1.0 GB/s, and others at 1.2-2.0: slower than small ones, and costing more.
SLOW_HUGE_PAGES_ON_THREAD = 2.0e9
# Smaller frames make their pages between reads (see above): they are mostly made of
# memory freed moments before (whose huge pages come fast), and a thread did not pay for
# them. On the development machine, worker to worker at 10 MB: 981-1,027 MB/s between
# reads, 696-731 with a thread; at 30 MB 1,530 and 1,094, but in memory the host had
# taken back 1,246 and 1,217 (gather 715 and 1,536); at 100 MB there, 788-879 and
# 1,379-1,424.
THREAD_FROM = 64 << 20
STEP = 8 << 20  # one call of the thread's: short, so that it stops soon after its frame
AHEAD = 32 << 20
# Once a frame's thread turned to small pages, it probes one huge page at the start of
# every this many bytes (a step in eight), not every step: where huge pages are slow,
# each probe costs several times what small pages would.
THREAD_PROBE_EVERY = 64 << 20
# Frames below this many bytes may be received into the map of one whose values are gone
# (MapRecycler), each process watching this many bytes of such maps at most.
RECYCLE_BELOW = THREAD_FROM
RECYCLE_BYTES = 32 << 20
_IDLE_CHECK_S = 1.0  # how often a waiting thread looks whether its frame was dropped
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14 (not in Python 3.11's mmap module)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
# What making pages fails with when the system has no memory for them (the frame fails);
# anything else (EINVAL: an older kernel) leaves the pages to faults.
_NO_MEMORY = (errno.ENOMEM, errno.EFAULT)

# Cleared on the first kernel that refuses it (EINVAL): it will not accept it later.
_populate = hasattr(mmap, "MADV_HUGEPAGE")


def _new_map(length: int, huge: bool) -> tuple[mmap.mmap, bool | None]:
    """The map, and True if it asked for huge pages (None: it did not, or could not)."""
    if not _PRIVATE:  # (Windows: every anonymous map is private)
        return mmap.mmap(-1, length), None
    memory = mmap.mmap(-1, length, flags=_PRIVATE)
    if huge and length and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
            return memory, True
        except OSError:  # huge pages not built into this kernel: small ones, by fault
            pass
    return memory, None


@functools.cache
def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """The C library's madvise, through ctypes (which lets go of the GIL), or None."""
    import ctypes  # (here: most processes never receive a frame this large)

    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return function


def _address_of(memory: mmap.mmap) -> int:
    import ctypes

    pointer = ctypes.c_char.from_buffer(memory)
    try:
        return ctypes.addressof(pointer)
    finally:
        del pointer  # (held, it would keep the map from being closed)


def huge_pages_pay(size: int, seconds: float, bar: float = SLOW_HUGE_PAGES) -> bool:
    """Whether huge pages made at this pace (``size`` bytes in ``seconds``) are worth
    asking for in the next window (see the module's docstring)."""
    return size < HUGE_PAGE or size >= bar * seconds


class FrameBuffer:
    """A private anonymous memory map of ``length`` bytes, to be written from the start
    on; ``room(filled)`` says how far the writer may go after the ``filled`` bytes written
    so far, with pages made there; ``stop()`` once no more bytes will come."""

    __slots__ = (
        "__weakref__",
        "_address",
        "_failed",
        "_filled",
        "_maker",
        "_stopped",
        "huge",
        "length",
        "map",
        "ready",
        "thread",
    )

    def __init__(self, length: int, memory: mmap.mmap | None = None) -> None:
        """``memory``: a map of at least ``length`` bytes whose pages are all made (one
        freed by the values received into it before, see ``MapRecycler``)."""
        # huge: whether the next window (or step) is made of huge pages (None: never)
        threaded = (
            memory is None and length >= THREAD_FROM and _populate and _libc_madvise() is not None
        )
        if memory is None:
            self.map, self.huge = _new_map(length, huge=True)
            if threaded and self.huge:
                # Its first step starts with a probe of one huge page (see _make): where
                # huge pages come slowly, a whole step of them cost several times that.
                self.huge = False
        else:
            self.map, self.huge = memory, None
        self.length = length
        # Pages exist up to here; without bulk making, everything is left to faults.
        self.ready = 0 if _populate and memory is None else length
        self._filled = 0  # what the writer said it wrote (the thread's pace)
        self._stopped = False
        self._failed = 0  # the errno that stopped the thread (ENOMEM: no memory)
        self._maker: threading.Condition | None = None
        self._address: int | None = None
        self.thread: threading.Thread | None = None
        if threaded:
            self._address = _address_of(self.map)
            self._maker = threading.Condition()
            self.thread = threading.Thread(
                target=_make_ahead,
                args=(weakref.ref(self), self._maker),
                name="apportion-pages",
                daemon=True,
            )
            self.thread.start()

    def room(self, filled: int) -> int:
        """Where the writer may write up to, ``filled`` bytes being written: the end of the
        made pages, and at least a small window further (pages the thread has not made
        yet come by fault). Raises MemoryError when the system has no memory for them."""
        if self._maker is None:
            return self._room_between_reads(filled)
        if self._failed in _NO_MEMORY:
            raise MemoryError(
                f"no memory for the pages of a frame of {self.length} bytes at byte {self.ready}"
            )
        if filled > self._filled:
            with self._maker:
                self._filled = filled
                self._maker.notify()
        return min(self.length, max(self.ready, filled + MIN_WINDOW))

    def stop(self) -> None:
        """No more bytes will come (the frame is whole, or dropped): its thread ends."""
        self._stopped = True
        if self._maker is not None:
            with self._maker:
                self._maker.notify()

    def _room_between_reads(self, filled: int) -> int:
        """``room`` without a thread: makes the next window when little is left."""
        global _populate
        ready = self.ready
        if ready < self.length:
            window = min(MAX_WINDOW, max(MIN_WINDOW, filled))
            if ready - filled < window // 2:
                aligned = (ready + window) // HUGE_PAGE * HUGE_PAGE
                end = min(self.length, max(aligned, ready + MIN_WINDOW))
                try:
                    self._make(start=ready, end=end)
                except OSError as exc:
                    if exc.errno in _NO_MEMORY:
                        raise MemoryError(
                            f"no memory for the {end - ready} bytes of a frame of "
                            f"{self.length} bytes at byte {ready}"
                        ) from None
                    _populate = False  # EINVAL: an older kernel; pages come by fault
                    end = self.length
                self.ready = ready = end
        return ready

    def _make(self, start: int, end: int, probe: bool = True) -> None:
        """Make the pages of ``start:end``: huge ones while they come fast, else small
        ones, after a probe of one huge page (which may find them fast again) if
        ``probe``."""
        if self.huge is False and probe and end - start > HUGE_PAGE:
            self.huge = self._made_fast(start, start + HUGE_PAGE)
            start += HUGE_PAGE
        if self.huge is False:
            self.map.madvise(mmap.MADV_NOHUGEPAGE, start, end - start)
        made_fast = self._made_fast(start, end)
        if self.huge:
            self.huge = made_fast

    def _made_fast(self, start: int, end: int) -> bool:
        """Make the pages of ``start:end``; whether huge pages came fast enough there."""
        if self._address is None:  # between reads, by the wall clock
            began = time.perf_counter()
            self.map.madvise(_MADV_POPULATE_WRITE, start, end - start)
            return huge_pages_pay(end - start, time.perf_counter() - began)
        # On the frame's thread, without the GIL, by the CPU time the thread spent.
        madvise = _libc_madvise()
        assert madvise is not None
        began = time.thread_time()
        if madvise(self._address + start, end - start, _MADV_POPULATE_WRITE) != 0:
            import ctypes

            code = ctypes.get_errno()
            raise OSError(code, errno.errorcode.get(code, "madvise failed"))
        spent = time.thread_time() - began
        return huge_pages_pay(end - start, spent, SLOW_HUGE_PAGES_ON_THREAD)


class MapRecycler:
    """The maps of received frames below ``below`` bytes, watched (``budget`` bytes of
    them at most) so that a later frame takes one whose values are all gone, pages made,
    instead of a new map whose pages must be made again: on a virtual machine, making the
    pages of a 1 MB frame costs several times the copy of its bytes into them (see
    docs/data-plane.md). What it watches stays mapped until taken again or pushed out by a
    newer map (``budget`` bytes per process at most); the others are freed with their
    values, as before. Thread-safe (a process may receive on several event loops)."""

    def __init__(self, below: int = RECYCLE_BELOW, budget: int = RECYCLE_BYTES) -> None:
        self.below = below
        self.budget = budget
        self._maps: list[mmap.mmap] = []  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # how many frames took a map freed before

    def frame_buffer(self, length: int) -> FrameBuffer:
        """The buffer of a frame of ``length`` bytes: on a free watched map that fits (no
        more than a quarter larger), else on a new one, watched if it is small enough."""
        if length >= self.below or length >= THREAD_FROM:
            return FrameBuffer(length)
        with self._lock:
            maps = self._maps
            for index in range(len(maps)):
                if length <= len(maps[index]) <= length + length // 4 and self._free(index):
                    memory = maps.pop(index)
                    maps.append(memory)  # the newest again
                    self.reused += 1
                    return FrameBuffer(length, memory)
            buffer = FrameBuffer(length)
            self._watch(buffer.map)
            return buffer

    def _free(self, index: int) -> bool:
        """Whether nothing but this list holds the map at ``index``: every view of a map
        (a frame's payload, the values made on it) holds a reference to it."""
        return sys.getrefcount(self._maps[index]) <= 2  # the list's, and this call's

    def _watch(self, memory: mmap.mmap) -> None:
        size = len(memory)
        if size > self.budget:
            return
        maps = self._maps
        index = 0
        while self._bytes + size > self.budget and index < len(maps):
            if self._free(index):  # pushed out: unmapped now
                self._bytes -= len(maps.pop(index))
            else:
                index += 1  # a value still lives on it: it goes with the value
        if self._bytes + size <= self.budget:
            maps.append(memory)
            self._bytes += size

    def watched_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def clear(self) -> None:
        """Watch nothing (free maps are unmapped now, the others with their values)."""
        with self._lock:
            self._maps.clear()
            self._bytes = 0


def _ahead(filled: int) -> int:
    """How far the thread may make pages beyond ``filled`` arrived bytes: as far again
    as what arrived, from one step to ``AHEAD`` (a frame that stops coming costs little)."""
    return min(AHEAD, max(STEP, filled))


def _make_ahead(frame: weakref.ref[FrameBuffer], maker: threading.Condition) -> None:
    """A frame's thread: make its pages a step at a time, ahead of what arrived (see
    ``_ahead``), until they are all made or the frame is stopped or dropped. It holds the
    frame only while making pages (its map stays mapped meanwhile)."""
    global _populate
    while True:
        with maker:
            while True:
                buffer = frame()
                if buffer is None or buffer._stopped or buffer.ready >= buffer.length:
                    return
                if buffer.ready - buffer._filled < _ahead(buffer._filled):
                    break
                del buffer  # waiting must not keep a dropped frame alive
                maker.wait(_IDLE_CHECK_S)
        start = buffer.ready
        end = min(buffer.length, start + STEP)
        try:
            buffer._make(start, end, probe=start % THREAD_PROBE_EVERY == 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                _populate = False  # an older kernel; pages come by fault
            buffer._failed = exc.errno or errno.EINVAL
            return  # the writer reads on past the made pages: they fault in
        buffer.ready = end
        del buffer
