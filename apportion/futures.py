"""Futures: handles on remote results, and ``wait`` / ``as_completed``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import pickle
import queue
import struct
import threading
import time
from array import array
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


# The rows of a piece of a map (client.map submits a piece at a time).
PIECE_ROWS = 10_000
# Row numbers, one object each, shared by every piece (a state keeps its row: an int of
# its own would cost more than the arguments it stands for).
_ROWS = tuple(range(PIECE_ROWS))
# The arguments of a map's task kept in its piece's buffer when they pickle to at most
# this many bytes, and likewise a result that rides with its completion message: what a
# released task kept stays there until its whole piece is gone, so larger ones are kept
# by their own state.
PIECE_ARGS_MAX_BYTES = 256
PIECE_RESULT_MAX_BYTES = 256
# How a small pickle begins: PROTO 5, then a FRAME of the rest's length (11 bytes of a
# result of 17). A piece keeps the rest only: a pickle needs neither (FRAME only says how
# much to read at once; PROTO only asks for Python 2's names, which fix_imports=False
# declines too), and pickle.loads ignores what follows the pickle's end, so a result kept
# in one buffer with others needs no length of its own either.
_PICKLE_HEAD = b"\x80\x05\x95"
_PICKLE_HEAD_BYTES = 11
_PROTO = 0x80
# The head of a pickle: PROTO 5, FRAME and the frame's length.
_HEAD = struct.Struct("<3sQ")


class MapPiece:
    """What the tasks of one piece of a map without dependencies keep in common, so that
    each task's state keeps only its row here (``FutureState.submitted_with``): the
    message they share (every field but the key and the arguments), their pickled
    arguments one after the other in one buffer (their lineage), and likewise their small
    pickled results until loaded.

    Results are added on the client's loop thread and read on users' threads, each step a
    single operation under the interpreter's lock: no lock of its own."""

    __slots__ = (
        "_args",
        "_ends",
        "_headless",
        "_result_at",
        "_results",
        "rows",
        "shared",
    )

    def __init__(self, shared: dict[str, Any]) -> None:
        self.shared = shared
        self.rows = 0
        self._args = b""
        self._ends = array("I")
        self._headless = False  # the arguments kept without their pickle's head
        # Per row: where its result starts in ``_results``, plus one (0: none here); made
        # with the first result.
        self._result_at: array[int] | None = None
        self._results = bytearray()

    def keep(self, states: list[FutureState], arguments: list[bytes]) -> None:
        """Keep ``arguments`` (pickled) as the lineage of ``states``, row by row: each
        state keeps its row here (``FutureState.submitted_with``). Once per piece."""
        rows = _ROWS
        for row, state in enumerate(states):
            state._spec = rows[row] if row < PIECE_ROWS else row
            state._with = self
        self.rows = len(states)
        headless = _headless(arguments)
        self._headless = headless is not None
        kept = arguments if headless is None else headless
        self._args = b"".join(kept)
        self._ends = array("I", itertools.accumulate(map(len, kept)))

    def spec(self, key: str, row: int) -> dict[str, Any]:
        """The message of the task of ``key`` at ``row``, as it was submitted."""
        ends = self._ends
        start = ends[row - 1] if row else 0
        args = self._args[start : ends[row]]
        if self._headless:  # the same bytes as sent
            args = _PICKLE_HEAD + len(args).to_bytes(8, "little") + args
        return {"key": key, **self.shared, "args": args}

    def keep_result(self, row: int, data: Any) -> bool:
        """Keep the pickled result of ``row``; False (nothing kept) when it is not a small
        pickle, to keep elsewhere. On the loop thread only, without the lock: it only adds
        (what ``loaded`` lets go is for rows loaded already)."""
        if type(data) is not bytes or len(data) > PIECE_RESULT_MAX_BYTES:
            return False
        at = self._result_at
        if at is None:
            at = self._result_at = array("I", bytes(4 * self.rows))
        results = self._results
        at[row] = len(results) + 1
        results += data[_PICKLE_HEAD_BYTES:] if data[:3] == _PICKLE_HEAD else data
        return True

    def result(self, row: int) -> bytearray | None:
        """The pickled result of ``row`` kept here, if any (with what follows it: see
        ``load``)."""
        results = self._results  # (before the rows: see loaded)
        at = self._result_at
        if at is None or not at[row]:
            return None
        start = at[row] - 1
        return results[start : start + PIECE_RESULT_MAX_BYTES]

    def has_result(self, row: int) -> bool:
        at = self._result_at
        return at is not None and at[row] != 0

    def loaded(self, row: int) -> None:
        """The result of ``row`` was loaded (its state keeps the value): not needed here
        any longer. Once the last row's is, and no row's is kept, the buffer is let go (a
        result added meanwhile is lost to it: its future fetches it from its worker)."""
        at = self._result_at
        if at is None:
            return
        at[row] = 0
        if row == self.rows - 1 and at.count(0) == len(at):
            # The rows first: a reader that took the old buffer finds no row in it.
            self._result_at = None
            self._results = bytearray()


def _headless(pickles: list[bytes]) -> list[bytes] | None:
    """``pickles`` without their heads, when each has the head ``MapPiece.spec`` puts
    back (PROTO 5, and one FRAME of all the rest); else None."""
    out = []
    unpack, head, head_bytes = _HEAD.unpack_from, _PICKLE_HEAD, _PICKLE_HEAD_BYTES
    for data in pickles:
        if len(data) < head_bytes or unpack(data) != (head, len(data) - head_bytes):
            return None
        out.append(data[head_bytes:])
    return out


class _Rare:
    """What few states ever get, kept apart so that the others need no slot for it: the
    callbacks to call once done (one, or a list), the Event of a blocking wait, the
    reason of a cancellation, the task's error, and large arguments stored on a worker."""

    __slots__ = ("arguments", "callbacks", "error", "event", "reason")

    def __init__(self) -> None:
        self.callbacks: Callable[[], None] | list[Callable[[], None]] | None = None
        self.event: threading.Event | None = None
        # Why it was cancelled. Kept as a template only: what the client raises is always a
        # fresh copy (see FutureState.exception()).
        self.reason: BaseException | None = None
        self.error: tuple[bytes, str] | None = None
        self.arguments: tuple[Any, ...] | None = None


class _Unloaded:
    """A result as it came (pickled), until loaded: what a state's ``_result`` holds
    between the two (a class of its own: a task's value may be bytes too)."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data


class FutureState:
    """What the client knows of one key; shared by every Future of that key.

    A client keeps one per wanted key, a million for a map of a million, so it keeps few
    slots: what only some states need lives in a ``_Rare`` made on first use, and a map's
    tasks keep their lineage and their small results in the piece of the map they came
    with (``MapPiece``)."""

    __slots__ = ("_rare", "_result", "_spec", "_with", "key", "refs", "status", "who_has")

    def __init__(self, key: str) -> None:
        self.key = key
        # Done is any status but pending.
        self.status = "pending"
        # Nothing yet (_MISSING), the result as it came (_Unloaded), or its value.
        self._result: Any = _MISSING
        self.who_has: list[str] = _NO_HOLDERS
        # How many Futures hold this state (counted by the client's future table).
        self.refs = 0
        self._rare: _Rare | None = None
        # Lineage, for a new scheduler after a restart (see apportion/lineage.py): the
        # message the task was submitted with (``_spec``: a dict), and in ``_with`` the
        # states of its dependencies (a list); or, for a task of a map, ``_spec`` its row
        # and ``_with`` its piece (see ``submitted_with``).
        self._spec: dict[str, Any] | int | None = None
        self._with: Any = _NO_DEPS

    @property
    def lock(self) -> threading.Lock:
        """The lock guarding this state's few assignments (one of a fixed set, by key)."""
        return _LOCKS[hash(self.key) & 63]

    def _rare_fields(self) -> _Rare:
        rare = self._rare
        if rare is None:
            with self.lock:  # (the loop thread and a waiting thread may both get here)
                rare = self._rare
                if rare is None:
                    rare = self._rare = _Rare()
        return rare

    @property
    def spec(self) -> dict[str, Any] | None:
        """The message this task was submitted with (its lineage), or None."""
        spec = self._spec
        if type(spec) is int:
            return self._with.spec(self.key, spec)
        return spec  # type: ignore[return-value]  # a dict, or None

    @spec.setter
    def spec(self, spec: dict[str, Any] | None) -> None:
        if type(self._spec) is int:
            self._with = _NO_DEPS
        self._spec = spec

    def has_lineage(self) -> bool:
        """Whether the message this task was submitted with is known (``spec``)."""
        return self._spec is not None

    @property
    def deps(self) -> list[FutureState]:
        """The states of the tasks this one is computed from (its lineage's)."""
        deps = self._with
        return deps if type(deps) is list else _NO_DEPS

    @deps.setter
    def deps(self, deps: list[FutureState]) -> None:
        if type(self._spec) is int:
            raise ValueError(f"task {self.key!r} of a map piece has no dependencies to set")
        self._with = deps

    def submitted_with(self, piece: MapPiece, row: int) -> None:
        """Keep as lineage the ``row`` of a piece of a map (``piece.spec(key, row)`` gives
        its message; ``MapPiece.keep`` does this for a whole piece): a map's futures need
        not each keep a message, nor their arguments, of their own."""
        self._spec = row
        self._with = piece

    @property
    def error(self) -> tuple[bytes, str] | None:
        """The task's error (pickled exception, traceback text), once it failed."""
        rare = self._rare
        return None if rare is None else rare.error

    @property
    def arguments(self) -> tuple[Any, ...]:
        """Set only for a task with large arguments stored on a worker
        (apportion/stored_args.py): their futures, held as long as this state, so that
        released means freed."""
        rare = self._rare
        if rare is None or rare.arguments is None:
            raise AttributeError(f"task {self.key!r} has no arguments stored on a worker")
        return rare.arguments

    @arguments.setter
    def arguments(self, arguments: tuple[Any, ...]) -> None:
        self._rare_fields().arguments = arguments

    @property
    def data(self) -> Any:
        """The result as it came (pickled) while not loaded and kept by this state."""
        result = self._result
        return result.data if type(result) is _Unloaded else None

    @property
    def _event(self) -> threading.Event | None:
        rare = self._rare
        return None if rare is None else rare.event

    # Called on the client's event-loop thread.
    def finish(self, who_has: list[str], data: bytes | None) -> None:
        self.who_has = who_has
        result = self._result
        if data is not None and (result is _MISSING or type(result) is _Unloaded):
            row = self._spec
            if type(row) is not int or not self._with.keep_result(row, data):
                self._result = _Unloaded(data)
        self._set("finished")

    def fail(self, exception: bytes, traceback: str) -> None:
        self._rare_fields().error = (exception, traceback)
        self._set("error")

    def cancel(self, reason: BaseException | None = None) -> None:
        self._rare_fields().reason = reason or CancelledError(f"task {self.key!r} was cancelled")
        self._set("cancelled")

    def lose(self) -> None:
        """Its data vanished with a worker; the scheduler recomputes it."""
        with self.lock:
            if self.has_value():
                return
            self._pending()

    def restart(self) -> None:
        """It runs again (``Future.retry``): pending, its error forgotten."""
        with self.lock:
            if self._rare is not None:
                self._rare.error = None
            self._pending()

    def _pending(self) -> None:
        # (under the lock)
        self.status = "pending"
        event = self._event
        if event is not None:
            event.clear()

    def _set(self, status: str) -> None:
        with self.lock:
            self.status = status
            rare = self._rare
            if rare is None:
                return  # nothing waits for it
            callbacks, rare.callbacks = rare.callbacks, None
            event = rare.event
        if event is not None:
            event.set()
        if isinstance(callbacks, list):
            for callback in callbacks:
                callback()
        elif callbacks is not None:
            callbacks()

    def add_callback(self, callback: Callable[[], None]) -> None:
        if self.status == "pending":
            rare = self._rare_fields()
            with self.lock:
                if self.status == "pending":
                    callbacks = rare.callbacks
                    if callbacks is None:
                        rare.callbacks = callback
                    elif isinstance(callbacks, list):
                        callbacks.append(callback)
                    else:
                        rare.callbacks = [callbacks, callback]
                    return
        callback()

    def is_done(self) -> bool:
        return self.status != "pending"

    @property
    def event(self) -> threading.Event:
        """An Event set while the state is done (created on first use)."""
        rare = self._rare_fields()
        with self.lock:
            if rare.event is None:
                rare.event = threading.Event()
                if self.status != "pending":
                    rare.event.set()
            return rare.event

    def wait(self, timeout: float | None) -> bool:
        """Block until done; False if ``timeout`` passed first."""
        if self.status != "pending":
            return True
        return self.event.wait(timeout)

    # Called on user threads.
    def has_value(self) -> bool:
        if self._result is not _MISSING:
            return True
        row = self._spec
        if type(row) is not int:
            return False
        at = self._with._result_at
        return at is not None and at[row] != 0

    def value(self) -> Any:
        result = self._result
        if result is _MISSING:
            row = self._spec
            kept = self._with.result(row) if type(row) is int else None
            if kept is not None:
                # (a pickle kept whole begins with its PROTO: read as it says)
                value = pickle.loads(kept, fix_imports=kept[0] == _PROTO)
                self._result = value
                self._with.loaded(row)  # (after: a thread finding it gone finds the value)
                return value
            result = self._result  # loaded (or fetched) by another thread meanwhile?
            if result is _MISSING:
                raise LookupError(self.key)
        if type(result) is _Unloaded:
            value = loads_value(result.data)
            self._result = value
            return value
        return result

    def store(self, data: Any) -> None:
        """Keep a fetched result (unless its value is here already)."""
        result = self._result
        if result is _MISSING or type(result) is _Unloaded:
            self._result = _Unloaded(data)

    def exception(self) -> BaseException:
        """A new exception object on every call, never one kept here: a raised exception
        holds its traceback, whose frames hold the Future that raised it, and a kept one
        would keep that Future (and so its task on the cluster) alive for good."""
        rare = self._rare
        if self.status == "error" and rare is not None and rare.error is not None:
            return loads_exception(*rare.error)
        reason = (rare.reason if rare is not None else None) or CancelledError(self.key)
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
