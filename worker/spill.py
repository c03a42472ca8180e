"""The results a worker holds, in memory or spilled to its local disk.

``SpillBuffer`` is the worker's result store: a mapping of key to value, as a dict would
be, whose values may live on disk. The least recently used values are written to disk
(``evict``) when the memory manager asks (worker/memory.py), and read back on first use,
transparently: a reader gets the value either way.

A spilled value is pickled (cloudpickle, as results may be of classes made at run time)
with protocol 5: the buffers of numpy arrays (and bytearrays) go out of band, written to
the file straight from their own memory (no copy into one pickle), and are read back into
one new buffer the rebuilt value's arrays are views of. (A ``bytes`` result is copied into
its pickle: Python pickles bytes in band.)
A file is removed when its key is released; a value read back keeps its file (results are
not changed in place), so that evicting it again costs no write. So when memory is wanted,
values that have their file still are dropped first (least recently used first), and only
then are values written out: a pass over results larger than memory reads them back one
after another without writing out the ones that never left memory. A value is written to
its file without the store's lock held: readers, writers and the worker's state (which
stores results under its own lock) never wait for the disk. Each worker spills into a
directory of its own, named after its process and removed when it stops; directories
left by workers that died are removed by the next worker to start on the host.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, NamedTuple

import cloudpickle

logger = logging.getLogger("apportion.worker")

# Every worker's directory is under this one, named "<pid>-<random>".
SPILL_ROOT_NAME = "apportion-spill"


class Spilled(NamedTuple):
    """Where a spilled value is: its file, the size of its pickle and of each of its
    out-of-band buffers, in the order they follow the pickle in the file."""

    path: str
    pickle_bytes: int
    buffers: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.pickle_bytes + sum(self.buffers)


def size_of(value: Any) -> int:
    """What ``value`` weighs in memory, cheaply: its buffer's size for arrays and bytes,
    else Python's own size of the object."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value) if not isinstance(value, memoryview) else value.nbytes
    return sys.getsizeof(value)


class SpillBuffer(MutableMapping[str, Any]):
    """Results by key: the recently used in memory, the rest in files. Thread-safe."""

    def __init__(self, directory: str | Path, target: int | None = None) -> None:
        self.directory = Path(directory)
        # Bytes in memory beyond which values that have their file still are dropped as
        # soon as a value is stored or read back (dropping them costs no write, so it is
        # done at once, under the lock); None: only when asked (``evict``).
        self.target = target
        self._lock = threading.Lock()
        # In memory, least recently used first; with each one's weight.
        self.fast: OrderedDict[str, Any] = OrderedDict()
        self.weights: dict[str, int] = {}
        self.fast_bytes = 0
        self.slow: dict[str, Spilled] = {}
        # The files of values read back and in memory again: still right (results are not
        # changed in place), so evicting such a value again writes nothing.
        self.copies: dict[str, Spilled] = {}
        # Held in memory for good: they do not pickle (not tried again, nor logged again).
        self.unspillable: set[str] = set()
        self._made = False
        self._closed = False
        self._names = itertools.count()  # file names (next() is atomic: threads may write)
        # Being written to their files now, by a thread not holding the lock.
        self._writing: set[str] = set()
        # Since the start: values written out, read back, and their bytes.
        self.spilled_count = 0
        self.spilled_total = 0
        self.unspilled_count = 0
        self.unspilled_total = 0
        # Seconds spent writing values to their files, in all (whichever thread wrote).
        self.write_seconds = 0.0

    # ------------------------------------------------------------ the mapping
    def __getitem__(self, key: str) -> Any:
        fast = self.fast
        if key in fast:  # without the lock: each step is atomic, and an eviction meanwhile
            try:  # leaves the value in slow, read below
                fast.move_to_end(key)
                return fast[key]
            except KeyError:
                pass
        with self._lock:
            if key in fast:
                return fast[key]
            spilled = self.slow[key]  # KeyError: not held
            value = self._read(spilled)
            # Read back: in memory again, the most recently used; its file is kept.
            del self.slow[key]
            self.copies[key] = spilled
            self._keep(key, value)
            self.unspilled_count += 1
            self.unspilled_total += spilled.nbytes
            return value

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._discard(key)
            self._keep(key, value)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            if key not in self.fast and key not in self.slow:
                raise KeyError(key)
            self._discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self.fast or key in self.slow

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter([*self.fast, *self.slow])

    def __len__(self) -> int:
        return len(self.fast) + len(self.slow)

    # ---------------------------------------------------------------- spilling
    @property
    def spilled_bytes(self) -> int:
        """Bytes on disk now."""
        return sum(spilled.nbytes for spilled in self.slow.values())

    def evict(self, nbytes: int) -> int:
        """Free at least ``nbytes`` of memory (or all that can be freed): values that still
        have their file first, least recently used first, as dropping them costs nothing;
        then the least recently used of the others, written out. Returns the bytes freed. A
        value that cannot be pickled stays in memory (logged once), and the next is tried."""
        freed = 0
        tried: set[str] = set()  # written, or failed to be: not tried again in this call
        while freed < nbytes:
            with self._lock:
                key = self._victim(tried)
                if key is None:
                    break
                copy = self.copies.pop(key, None)
                if copy is not None:  # on disk already: only dropped from memory
                    freed += self._to_disk(key, copy)
                    continue
                value = self.fast[key]
                self._writing.add(key)
                tried.add(key)
            try:
                started = time.perf_counter()
                spilled = self._write(key, value)  # without the lock: nobody waits for the disk
                with self._lock:
                    self.write_seconds += time.perf_counter() - started
                    if self.fast.get(key) is not value:
                        # Released (or replaced) while it was written: the file is not wanted.
                        if spilled is not None:
                            _remove(spilled.path)
                    elif spilled is not None:
                        self.spilled_count += 1
                        self.spilled_total += self.weights[key]
                        freed += self._to_disk(key, spilled)
            finally:
                self._writing.discard(key)
                del value
        return freed

    def _victim(self, tried: set[str]) -> str | None:
        """The value to drop next (the lock held): the least recently used that has its
        file still, else the least recently used that can be written and was not ``tried``
        (None: none is left)."""
        for key in self._oldest_copies():
            return key
        writing, unspillable = self._writing, self.unspillable
        for key in self.fast:
            if key not in unspillable and key not in writing and key not in tried:
                return key
        return None

    def _oldest_copies(self) -> Iterator[str]:
        """The values in memory that have their file still, least recently used first (the
        lock held): dropping them costs no write."""
        copies = self.copies
        return (key for key in self.fast if key in copies) if copies else iter(())

    def _write(self, key: str, value: Any) -> Spilled | None:
        """Pickle ``value`` into a new file; None if it cannot be (marked so, or kept as the
        most recently used when the disk failed). Called without the lock."""
        buffers: list[pickle.PickleBuffer] = []
        try:
            # cloudpickle: results may be of classes defined in __main__, as task results are.
            header = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception as exc:
            logger.warning("result %s cannot be spilled (kept in memory): %r", key, exc)
            with self._lock:
                if key in self.fast:
                    self.unspillable.add(key)
            return None
        views = [buffer.raw() for buffer in buffers]
        path = None
        try:
            path = self._path_for()
            with open(path, "wb") as file:
                file.write(header)
                for view in views:  # from the value's own memory: no copy
                    file.write(view)
        except OSError as exc:  # the disk is full, or gone: keep it in memory
            if path is not None:
                _remove(str(path))
            with self._lock:
                if key not in self.fast:
                    return None  # released meanwhile (or the store closed): nothing lost
                self.fast.move_to_end(key)
            logger.warning("result %s cannot be spilled to %s (kept in memory): %r", key, path, exc)
            return None
        return Spilled(str(path), len(header), tuple(view.nbytes for view in views))

    def _to_disk(self, key: str, spilled: Spilled) -> int:
        weight = self.weights.pop(key)
        del self.fast[key]
        self.fast_bytes -= weight
        self.slow[key] = spilled
        return weight

    def _read(self, spilled: Spilled) -> Any:
        # One new buffer for the whole file: the out-of-band buffers are views of it.
        data = bytearray(spilled.nbytes)
        view = memoryview(data)
        with open(spilled.path, "rb") as file:
            got = file.readinto(view)
        if got != spilled.nbytes:
            raise OSError(f"spill file {spilled.path} is {got} bytes, not {spilled.nbytes}")
        start = spilled.pickle_bytes
        buffers = []
        for size in spilled.buffers:
            buffers.append(view[start : start + size])
            start += size
        return pickle.loads(view[: spilled.pickle_bytes], buffers=buffers)

    # ---------------------------------------------------------------- internals
    def _keep(self, key: str, value: Any) -> None:
        weight = size_of(value)
        self.fast[key] = value
        self.weights[key] = weight
        self.fast_bytes += weight
        if self.target is not None and self.fast_bytes > self.target and self.copies:
            self._drop_copies(self.fast_bytes - self.target, but=key)

    def _drop_copies(self, nbytes: int, but: str) -> int:
        """Drop values that have their file still, least recently used first, other than
        ``but``, until ``nbytes`` are freed; returns the bytes freed (the lock held)."""
        freed = 0
        for key in [key for key in self._oldest_copies() if key != but]:
            if freed >= nbytes:
                break
            freed += self._to_disk(key, self.copies.pop(key))
        return freed

    def _discard(self, key: str) -> None:
        if key in self.fast:
            del self.fast[key]
            self.fast_bytes -= self.weights.pop(key)
        self.unspillable.discard(key)
        spilled = self.slow.pop(key, None) or self.copies.pop(key, None)
        if spilled is not None:
            _remove(spilled.path)

    def _path_for(self) -> Path:
        if self._closed:  # (a spill begun as the worker stopped: no directory made again)
            raise OSError(f"the spill directory {self.directory} is closed")
        if not self._made:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True
        # Keys are free text: the file is named by a counter, the key lives in self.slow.
        return self.directory / f"{next(self._names)}.pkl"

    def close(self) -> None:
        """Drop every value and remove the directory (the worker stops), and those of
        workers of this host that died since the last worker started here: a worker killed
        last, whose successor never started (its cluster closed first), left one."""
        with self._lock:
            self._closed = True
            self.fast.clear()
            self.weights.clear()
            self.fast_bytes = 0
            self.slow.clear()
            self.copies.clear()
            self.unspillable.clear()
            shutil.rmtree(self.directory, ignore_errors=True)
        remove_stale_directories(self.directory.parent)


class SpillWriter:
    """Writes results out on a thread of its own, down to a level it is given: a task
    thread hands it the spilling a stored result calls for and starts its next task while
    the older result is written, rather than after (a write of 64 MB takes longer than
    many tasks do). Each value is written under ``lock`` (the worker's one spill at a
    time: the monitor's measure follows each write, not one half done), one at a time,
    so that a thread waiting for room goes on as soon as there is some."""

    def __init__(
        self,
        store: SpillBuffer,
        lock: threading.Lock,
        after: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self._lock = lock
        self._after = after  # called after each round of writes (the worker's pause check)
        self._changed = threading.Condition()
        self._goal: int | None = None  # the level asked for and not yet taken up
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        # Seconds threads waited for room in ``wait_below``, in all (counted under the lock).
        self.waited_seconds = 0.0

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def spill_to(self, level: int) -> None:
        """Bring the bytes of results in memory down to ``level``, in the background (the
        thread starts on the first call)."""
        with self._changed:
            self._goal = level if self._goal is None else min(self._goal, level)
            self._changed.notify_all()
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._loop, name="apportion-spill", daemon=True
                )
                self._thread.start()

    def wait_below(self, level: int) -> float:
        """Return once the results in memory are at ``level`` or under, or nothing more is
        being spilled (what is left cannot be); returns the seconds waited."""
        store, changed = self.store, self._changed
        if store.fast_bytes <= level:
            return 0.0
        started = time.perf_counter()
        with changed:
            while (
                store.fast_bytes > level
                and (self._busy or self._goal is not None)
                and not self._stopped
            ):
                changed.wait()
            waited = time.perf_counter() - started
            self.waited_seconds += waited
        return waited

    def _loop(self) -> None:
        store, changed = self.store, self._changed
        while True:
            with changed:
                while self._goal is None and not self._stopped:
                    changed.wait()
                goal = self._goal
                if self._stopped or goal is None:
                    return
                self._goal, self._busy = None, True
            try:
                while True:
                    with self._lock:
                        freed = store.evict(1) if store.fast_bytes > goal else 0
                    with changed:
                        changed.notify_all()  # a thread waiting for room may go on
                        if self._goal is not None:  # asked again meanwhile: the lower level
                            goal, self._goal = min(goal, self._goal), None
                    if not freed or self._stopped:
                        break
            except Exception:
                logger.exception("spilling results failed")
            finally:
                with changed:
                    self._busy = False
                    changed.notify_all()
            if self._after is not None:
                try:
                    self._after()
                except Exception:  # this thread must go on: task threads wait on it
                    logger.exception("after spilling results")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def spill_root(base: str | None = None) -> Path:
    """The directory under which every worker on this host spills."""
    return Path(base or tempfile.gettempdir()) / SPILL_ROOT_NAME


def new_spill_directory(base: str | None = None) -> Path:
    """A directory name of this worker's own (made on first spill), after removing the
    directories of workers on this host that are no longer alive."""
    root = spill_root(base)
    remove_stale_directories(root)
    return root / f"{os.getpid()}-{os.urandom(4).hex()}"


def remove_stale_directories(root: Path) -> list[Path]:
    """Remove the spill directories under ``root`` whose worker process is gone; returns
    them. (A directory is named after its worker's process id.)"""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        pid_text = entry.name.split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
