"""Futures: handles on remote results, and ``wait`` / ``as_completed``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, NamedTuple

from apportion.errors import CancelledError, TimeoutError
from apportion.serialize import loads_exception, loads_value

_MISSING = object()
# Shared, never changed: what a state holds until it has something of its own. A client
# keeps a state per wanted future, and every container a state owns is one more object
# the garbage collector traverses in each collection of its generation (the collector's
# cost, not memory, is what these save: see test_future_state_gc.py).
_NO_DEPS: list[Any] = []  # most tasks have no dependencies
_NO_HOLDERS: list[str] = []  # until finished
_NO_CALLBACKS: list[Any] = []  # most futures get no callback
# A state's lock guards a few assignments, never while another state's is held, and is
# held for microseconds: states share a fixed set of locks rather than owning one each
# (a lock is an object the collector tracks).
_LOCKS = tuple(threading.Lock() for _ in range(64))


# What a wait for unfinished futures does around itself: inside a task, the thread is given
# back to its worker meanwhile (set by apportion/worker_client.py), so that a task waiting
# for tasks it submitted cannot hold the very thread they need.
_blocking_wait: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext


def set_blocking_wait(hook: Callable[[], AbstractContextManager[Any]]) -> None:
    global _blocking_wait
    _blocking_wait = hook


def blocking_wait() -> AbstractContextManager[Any]:
    """Wrap a wait for unfinished futures (``Future.result``, ``gather``, ``wait``)."""
    return _blocking_wait()


class FutureState:
    """What the client knows of one key; shared by every Future of that key."""

    __slots__ = (
        "_done",
        "_event",
        "_reason",
        "_shared",
        "_spec",
        "_value",
        "arguments",
        "callbacks",
        "data",
        "deps",
        "error",
        "key",
        "refs",
        "status",
        "who_has",
    )

    def __init__(self, key: str) -> None:
        self.key = key
        self.status = "pending"
        # Done flag, and an Event made only once someone blocks on a pending state: most
        # futures are never waited on while pending (chains, map then gather).
        self._done = False
        self._event: threading.Event | None = None
        self.data: bytes | None = None
        self._value: Any = _MISSING
        self.error: tuple[bytes, str] | None = None
        # Why it was cancelled. Kept as a template only: what the client raises is always a
        # fresh copy (see exception()).
        self._reason: BaseException | None = None
        self.who_has: list[str] = _NO_HOLDERS
        # How many Futures hold this state (counted by the client's future table).
        self.refs = 0
        self.callbacks: list[Callable[[], None]] = _NO_CALLBACKS
        # Lineage, for a new scheduler after a restart (see apportion/lineage.py): the
        # message the task was submitted with (``spec``), and the states of its
        # dependencies. The tasks of one map() keep only their pickled arguments here,
        # and share the rest of their message (see ``submitted_with``).
        self._spec: dict[str, Any] | bytes | None = None
        self._shared: dict[str, Any] | None = None
        self.deps: list[FutureState] = _NO_DEPS

    @property
    def lock(self) -> threading.Lock:
        """The lock guarding this state's few assignments (one of a fixed set, by key)."""
        return _LOCKS[hash(self.key) & 63]

    @property
    def spec(self) -> dict[str, Any] | None:
        """The message this task was submitted with (its lineage), or None."""
        spec = self._spec
        shared = self._shared
        if shared is None or spec is None:
            return spec  # type: ignore[return-value]  # a dict, or None
        return {"key": self.key, **shared, "args": spec}

    @spec.setter
    def spec(self, spec: dict[str, Any] | None) -> None:
        self._spec = spec
        self._shared = None

    def submitted_with(self, shared: dict[str, Any], args: bytes) -> None:
        """Keep as lineage a task whose message is ``shared`` (every field but its key
        and arguments, the same object for every task of a map) with ``args``: a map's
        futures need not each keep a message of their own."""
        self._spec = args
        self._shared = shared

    # Set only for a task with large arguments stored on a worker (apportion/stored_args.py):
    # their futures, held as long as this state, so that released means freed.
    arguments: tuple[Any, ...]

    # Called on the client's event-loop thread.
    def finish(self, who_has: list[str], data: bytes | None) -> None:
        self.who_has = who_has
        if data is not None:
            self.data = data
        self._set("finished")

    def fail(self, exception: bytes, traceback: str) -> None:
        self.error = (exception, traceback)
        self._set("error")

    def cancel(self, reason: BaseException | None = None) -> None:
        self._reason = reason or CancelledError(f"task {self.key!r} was cancelled")
        self._set("cancelled")

    def lose(self) -> None:
        """Its data vanished with a worker; the scheduler recomputes it."""
        with self.lock:
            if self.has_value():
                return
            self.status = "pending"
            self._done = False
            if self._event is not None:
                self._event.clear()

    def restart(self) -> None:
        """It runs again (``Future.retry``): pending, its error forgotten."""
        with self.lock:
            self.status = "pending"
            self.error = None
            self._done = False
            if self._event is not None:
                self._event.clear()

    def _set(self, status: str) -> None:
        with self.lock:
            self.status = status
            self._done = True
            callbacks, self.callbacks = self.callbacks, _NO_CALLBACKS
            event = self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        with self.lock:
            if not self._done:
                if self.callbacks is _NO_CALLBACKS:
                    self.callbacks = [callback]
                else:
                    self.callbacks.append(callback)
                return
        callback()

    def is_done(self) -> bool:
        return self._done

    @property
    def event(self) -> threading.Event:
        """An Event set while the state is done (created on first use)."""
        with self.lock:
            if self._event is None:
                self._event = threading.Event()
                if self._done:
                    self._event.set()
            return self._event

    def wait(self, timeout: float | None) -> bool:
        """Block until done; False if ``timeout`` passed first."""
        if self._done:
            return True
        return self.event.wait(timeout)

    # Called on user threads.
    def has_value(self) -> bool:
        return self._value is not _MISSING or self.data is not None

    def value(self) -> Any:
        if self._value is _MISSING:
            if self.data is None:
                raise LookupError(self.key)
            self._value = loads_value(self.data)
            self.data = None
        return self._value

    def store(self, data: bytes) -> None:
        if self._value is _MISSING:
            self.data = data

    def exception(self) -> BaseException:
        """A new exception object on every call, never one kept here: a raised exception
        holds its traceback, whose frames hold the Future that raised it, and a kept one
        would keep that Future (and so its task on the cluster) alive for good."""
        if self.status == "error" and self.error is not None:
            return loads_exception(*self.error)
        reason = self._reason or CancelledError(self.key)
        fresh = copy.copy(reason)
        fresh.__traceback__ = None
        return fresh


class Future:
    """A handle on the result of a task. Holding it keeps the result on the cluster."""

    __slots__ = ("__weakref__", "_state", "client", "key")

    def __init__(self, key: str, client: Any, state: FutureState) -> None:
        """``client``: the Client (or AsyncClient) whose future table holds ``state``."""
        self.key = key
        self.client = client
        self._state = state
        client.future_table.retain(state)

    @classmethod
    def counted(cls, key: str, client: Any, state: FutureState) -> Future:
        """A future the caller has counted in ``state.refs`` already (many at once, under
        the future table's lock)."""
        future = cls.__new__(cls)
        future.key = key
        future.client = client
        future._state = state
        return future

    @property
    def status(self) -> str:
        return self._state.status

    def done(self) -> bool:
        return self._state.is_done()

    def result(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait(timeout)
        if self._state.status == "finished":
            return self.client.future_table.value_of(self, deadline)
        raise self._exception()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return None if self._state.status == "finished" else self._exception()

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        """The traceback of the task's error, as a traceback object of its frames on the
        worker (``traceback.format_tb`` and debuggers take it); None if it did not fail."""
        self._wait(timeout)
        error = self._state.error
        if error is None:
            return None
        return remote_traceback(error[1])

    def retry(self) -> None:
        """Run the task again if it failed (and the failed tasks it needs)."""
        self.client.retry([self])

    def cancel(self) -> bool:
        """Cancel the task (and tasks that depend on it); False if it already finished."""
        if self.done():
            return False
        self.client.cancel([self])
        return True

    def cancelled(self) -> bool:
        return self._state.status == "cancelled"

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(future)`` once done (on the client's I/O thread: keep it short)."""
        self._state.add_callback(lambda: fn(self))

    def __await__(self) -> Generator[Any, None, Any]:
        """``await future``: its result, without blocking the running event loop."""
        return self.client.future_table.result_async(self).__await__()

    def _wait(self, timeout: float | None) -> None:
        if self._state.is_done():
            return
        with blocking_wait():
            if not self._state.wait(timeout):
                raise TimeoutError(f"task {self.key!r} not done after {timeout}s")

    def _exception(self) -> BaseException:
        return self._state.exception()

    def __del__(self) -> None:
        try:
            self.client.future_table.release(self._state)
        except Exception:
            pass  # interpreter shutting down

    def __repr__(self) -> str:
        return f"<Future: {self.status}, key: {self.key}>"

    # Dask reads a future inside a collection or a delayed call as a reference to its key
    # (dask._task_spec); its token is its key.
    __dask_future__ = True

    def __dask_tokenize__(self) -> tuple[str, str]:
        return ("apportion.Future", self.key)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a Future cannot be pickled on its own; pass it directly as a task argument "
            "(in a list, dict or object) and the worker receives its result"
        )


async def wait_state(state: FutureState) -> None:
    """Wait in the running loop until a future's state is done (never blocking it)."""
    if state.is_done():
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def from_io_thread() -> None:
        loop.call_soon_threadsafe(wake)

    state.add_callback(from_io_thread)
    await done


def futures_of(obj: Any) -> list[Future]:
    """The futures in ``obj``: a future, lists, tuples, sets and dicts of them (nested), and
    Dask collections persisted on the cluster (the futures of their chunks), as Dask's
    ``futures_of``; each once, in the order found."""
    found: dict[Future, None] = {}
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, Future):
            found[item] = None
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(reversed(list(item)))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif _is_dask_collection(item):
            graph = item.__dask_graph__()
            stack.extend(reversed([v for v in graph.values() if isinstance(v, Future)]))
    return list(found)


def _is_dask_collection(obj: Any) -> bool:
    # Without importing Dask: a collection is what has a graph method (Dask's own test).
    return not isinstance(obj, type) and callable(getattr(obj, "__dask_graph__", None))


def remote_traceback(text: str) -> TracebackType | None:
    """A traceback object rebuilt from the text of a traceback on a worker (its last
    "Traceback (most recent call last):" block: the frames of the error raised)."""
    import tblib

    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    try:
        return tblib.Traceback.from_string(text[start:]).as_traceback()
    except (ValueError, TypeError):  # not a traceback's text after all
        return None


def states_of(futures: Iterable[Future]) -> list[FutureState]:
    """The client's states of ``futures`` (shared by every future of a key)."""
    return [future._state for future in futures]


def _only_futures(obj: Any) -> bool:
    """Whether ``obj`` is a plain list of futures and nothing else (what a map returns)."""
    return type(obj) is list and all(type(item) is Future for item in obj)


def collect_futures(obj: Any) -> list[Future]:
    """The futures in ``obj`` (a future, or lists, tuples, sets and dicts of them, nested).
    A list of futures only (a map's) is returned as it is, not copied: callers read it."""
    if _only_futures(obj):
        return obj
    out: list[Future] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, Future):
            out.append(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return out


def rebuild(obj: Any, resolve: Callable[[Future], Any], skipped: object) -> Any:
    """``obj`` with each future replaced by ``resolve(future)``; ``skipped`` ones left out."""
    if isinstance(obj, Future):
        return resolve(obj)
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [rebuild(item, resolve, skipped) for item in obj]
        if type(obj) is list and not any(item is skipped for item in items):
            return items  # the usual case: not copied again
        return type(obj)(item for item in items if item is not skipped)
    if isinstance(obj, dict):
        pairs = {k: rebuild(v, resolve, skipped) for k, v in obj.items()}
        return {k: v for k, v in pairs.items() if v is not skipped}
    return obj


class DoneAndNotDone(NamedTuple):
    done: set[Future]
    not_done: set[Future]


FIRST_COMPLETED = "FIRST_COMPLETED"
ALL_COMPLETED = "ALL_COMPLETED"


def wait(fs: Any, timeout: float | None = None, return_when: str = ALL_COMPLETED) -> DoneAndNotDone:
    """Wait until all (or the first of) the futures in ``fs`` are done: a future, a list
    (or other container) of futures, persisted Dask collections, or a mix (see
    ``futures_of``); raises TimeoutError on timeout."""
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED):
        raise ValueError(
            f"return_when must be {ALL_COMPLETED!r} or {FIRST_COMPLETED!r}, got {return_when!r}"
        )
    # A list of futures only (a map's) needs no search for futures inside it: a set of
    # a million is made once, not after a dict of them as well.
    ordered = fs if _only_futures(fs) else futures_of(fs)
    futures = set(ordered)
    if all(f.done() for f in futures):
        return DoneAndNotDone(futures, set())
    with blocking_wait():
        return _wait(futures, ordered, timeout, return_when)


def _wait(
    futures: set[Future], ordered: list[Future], timeout: float | None, return_when: str
) -> DoneAndNotDone:
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == FIRST_COMPLETED and futures:
        signal = threading.Event()
        for future in futures:
            future._state.add_callback(signal.set)
        if not signal.wait(timeout):
            raise TimeoutError(f"none of {len(futures)} futures finished within {timeout}s")
    else:
        # The last submitted usually finishes last: waited for first, it is the one wait
        # that blocks, where waiting in order would block (and make an Event) for each.
        for future in reversed(ordered):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not future._state.wait(left):
                pending = sum(not f.done() for f in futures)
                raise TimeoutError(f"{pending} of {len(futures)} futures not done after {timeout}s")
    if all(f.done() for f in futures):
        return DoneAndNotDone(futures, set())
    done = {f for f in futures if f.done()}
    return DoneAndNotDone(done, futures - done)


class as_completed(Iterator[Any]):
    """Iterate over futures in the order they finish; ``with_results=True`` yields pairs."""

    def __init__(
        self,
        futures: Iterable[Future] = (),
        with_results: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._queue: queue.Queue[Future] = queue.Queue()
        self._pending = 0
        self.with_results = with_results
        self.timeout = timeout
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None
        for future in futures:
            self.add(future)

    def add(self, future: Future) -> None:
        with self._lock:
            self._pending += 1
        future._state.add_callback(lambda: self._done(future))

    def update(self, futures: Iterable[Future]) -> None:
        """Add several futures."""
        for future in futures:
            self.add(future)

    def has_ready(self) -> bool:
        """Whether a finished future is waiting to be taken."""
        return not self._queue.empty()

    def is_empty(self) -> bool:
        """Whether every future added was taken."""
        return self.count() == 0

    def next_batch(self, block: bool = True) -> list[Any]:
        """Every finished future not taken yet (waiting for at least one if ``block`` and
        any is left); pairs with their results under ``with_results``."""
        batch: list[Any] = []
        if block and not self.is_empty() and not self.has_ready():
            batch.append(next(self))
        while self.has_ready():
            batch.append(next(self))
        return batch

    def batches(self) -> Iterator[list[Any]]:
        """Iterate over lists of futures: each time, all those finished since the last."""
        while not self.is_empty():
            yield self.next_batch(block=True)

    def _done(self, future: Future) -> None:
        self._queue.put(future)
        wake = self._wake  # an ``async for`` waiting in its loop
        if wake is not None:
            wake()

    def __next__(self) -> Any:
        with self._lock:
            if self._pending == 0:
                raise StopIteration
            self._pending -= 1
        try:
            future = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(f"no future finished within {self.timeout}s") from None
        return (future, future.result()) if self.with_results else future

    def __iter__(self) -> as_completed:
        return self

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._async_iter()

    async def _async_iter(self) -> AsyncIterator[Any]:
        """``async for``: the same order, waiting in the running loop instead of a thread."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(ready.set)

        self._wake = wake
        try:
            while True:
                with self._lock:
                    if self._pending == 0:
                        return
                try:
                    future = self._queue.get_nowait()
                except queue.Empty:
                    ready.clear()
                    if self._queue.empty():
                        await asyncio.wait_for(ready.wait(), self.timeout)
                    continue
                with self._lock:
                    self._pending -= 1
                yield (future, await future) if self.with_results else future
        except asyncio.TimeoutError:
            raise TimeoutError(f"no future finished within {self.timeout}s") from None
        finally:
            self._wake = None

    def count(self) -> int:
        with self._lock:
            return self._pending
