"""The user's handle on a cluster: submit work, gather results.

All network I/O runs on a private event-loop thread; public methods are
synchronous and thread-safe. Submissions are queued and flushed to the
scheduler once per loop tick, so ``submit`` in a loop costs little.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FetchTimeout
from operator import itemgetter
from typing import Any

from apportion import cluster_ops, config, shared_memory
from apportion.aio import background, new_event_loop
from apportion.annotations import current as current_annotations
from apportion.auth import token_from_environment
from apportion.dask_default import on_client_created
from apportion.dask_default import restore as restore_dask_default
from apportion.default_client import remember as remember_client
from apportion.errors import CancelledError, SchedulerConnectionError
from apportion.futures import Future, FutureState
from apportion.logs import line_count, recent_lines, show_task_output
from apportion.progress import progress
from apportion.protocol import Comm, CommClosedError, Message, ProtocolError, connect
from apportion.protocol.rpc import ConnectionPool
from apportion.reconnect import reconnect
from apportion.reprs import dashboard_link, summary_html
from apportion.resources import format_resources, validate
from apportion.restrictions import worker_restriction
from apportion.serialize import (
    OUT_OF_BAND_MIN_BYTES,
    FunctionPickleCache,
    Payload,
    content_token,
    dumps_args,
    dumps_data,
    loads_exception,
    loads_value,
    tokenize,
)
from apportion.stored_args import (
    KeptArgument,
    argument_value,
    choose_holder,
    large_arguments,
    replace,
)
from apportion.worker.context import current_task_key
from apportion.worker.stored import stored_argument

logger = logging.getLogger("apportion.client")

# A dropped future's release waits for the next message to the scheduler, or at most this
# long (seconds): releases then cost no thread wake-up and no frame of their own.
RELEASE_DELAY = 0.05
# Bytes of a submitted task besides its function and arguments (key, options, framing):
# generous, so that a split submission's messages always fit their frame.
_SPEC_OVERHEAD = 1024


class NoWorkerWarning(UserWarning):
    """Tasks wait because no connected worker has the resources they demand."""


class _LoopThread:
    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="apportion-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Client:
    """Connect to a scheduler: ``Client("tcp://host:8786")`` or ``Client(cluster)``."""

    def __new__(cls, *args: Any, asynchronous: bool = False, **kwargs: Any) -> Client:
        if asynchronous and not cls.asynchronous:  # Client(..., asynchronous=True)
            from apportion.async_client import AsyncClient

            return object.__new__(AsyncClient)
        return object.__new__(cls)

    def __init__(
        self,
        address: Any = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        asynchronous: bool = False,
    ) -> None:
        """``asynchronous=True``: an ``AsyncClient`` for use inside a running event loop
        (``await Client(..., asynchronous=True)``; see apportion/async_client.py)."""
        if address is None:
            address = os.environ.get("APPORTION_SCHEDULER_ADDRESS")
            if not address:
                raise ValueError(
                    "Client needs an address (tcp://HOST:PORT) or a cluster object; "
                    "or set APPORTION_SCHEDULER_ADDRESS"
                )
        self.cluster = None
        if not isinstance(address, str):
            self.cluster = address
            token = token or getattr(address, "token", None)
            address = address.scheduler_address
        self.scheduler_address: str = address
        self.token = token if token is not None else token_from_environment()
        self._states: dict[str, FutureState] = {}
        self._refs: dict[str, int] = {}
        # Reentrant: a Future's __del__ (which takes it) may run in garbage collection
        # triggered while this thread holds it.
        self._lock = threading.RLock()
        self._outgoing: list[Message] = []
        self._flush_scheduled = False
        self._functions = FunctionPickleCache()
        self._requests: dict[int, asyncio.Future[Message]] = {}
        self._request_ids = itertools.count(1)
        # Impure keys: a random prefix per client and a counter (no uuid4 per task).
        self._key_prefix = uuid.uuid4().hex[:20]
        self._key_counter = itertools.count()
        # Large arguments this client put on workers, by key: the worker holding each.
        self._stored_on: dict[str, str] = {}
        # Their pickles' sizes (an argument of a size stored before is hashed before
        # it is sent: it may be a repeat).
        self._stored_bytes: dict[str, int] = {}
        # Their values, kept until the tasks that took them are done: put on another
        # worker if their holder is lost first (see apportion/stored_args.py).
        self._kept: dict[str, KeptArgument] = {}
        self._closed = False
        # Set when the scheduler is lost for good (reconnecting gave up), with the reason.
        self._lost: str | None = None
        # Why the scheduler refused our messages (its "error" before closing): reconnecting
        # and sending them again would only be refused again.
        self._refused: str | None = None
        self._warned: set[tuple] = set()
        self._io = _LoopThread()
        if self.asynchronous:  # connected when awaited, without blocking the caller's loop
            self._connecting = asyncio.run_coroutine_threadsafe(
                self._connect(timeout), self._io.loop
            )
            return
        try:
            self.id = self._io.run(self._connect(timeout), timeout + 5)
        except BaseException:
            self._closed = True  # nothing left to shut down, now or in __del__
            self._io.stop()
            raise
        on_client_created(self)
        remember_client(self)

    async def _connect(self, timeout: float) -> str:
        self._comm, welcome = await connect(
            self.scheduler_address, "client", self.token, timeout=timeout
        )
        self._comm.allow_thread_writes()
        client_id = str(welcome["client_id"])
        # Set while connected: requests made while reconnecting wait for it.
        self._connected = asyncio.Event()
        self._connected.set()
        self._pool = ConnectionPool(
            "client",
            self.token,
            info={"client_id": client_id},
            on_push=self._on_direct,
            on_closed=self._on_worker_connection_closed,
        )
        # Workers this client connected to (or tried to) so that they tell it of results.
        self._direct_workers: set[str] | None = (
            set() if config.get("client.direct-results") else None
        )
        background(self._read_loop(self._comm))
        self._tick()
        return client_id

    # ------------------------------------------------------------- submission
    def submit(
        self,
        func: Callable[..., Any],
        *args: Any,
        key: str | None = None,
        pure: bool = True,
        retries: int | None = None,
        priority: int | None = None,
        resources: dict[str, float] | None = None,
        workers: str | Iterable[str] | None = None,
        allow_other_workers: bool = False,
        **kwargs: Any,
    ) -> Future:
        """Run ``func(*args, **kwargs)`` on a worker with ``resources`` free; with
        ``workers`` (names or addresses) only on one of those, or preferring them when
        ``allow_other_workers``."""
        options = self._options(resources, retries, priority, workers, allow_other_workers)
        spec, future = self._prepare(func, args, kwargs, key, pure, options, limit=self._limit())
        if spec is not None:
            self._enqueue([spec])
        return future

    def map(
        self,
        func: Callable[..., Any],
        *iterables: Iterable[Any],
        key: str | list[str] | None = None,
        pure: bool = True,
        retries: int | None = None,
        priority: int | None = None,
        resources: dict[str, float] | None = None,
        workers: str | Iterable[str] | None = None,
        allow_other_workers: bool = False,
        **kwargs: Any,
    ) -> list[Future]:
        """Submit ``func`` over zipped iterables; one future per element."""
        options = self._options(resources, retries, priority, workers, allow_other_workers)
        rows = list(zip(*iterables, strict=False))
        keys: list[str | None]
        if isinstance(key, list):
            if len(key) != len(rows):
                raise ValueError(f"map got {len(key)} keys for {len(rows)} inputs")
            keys = list(key)
        else:
            keys = [None] * len(rows)
        specs, futures = [], []
        limit = self._limit()
        for row, explicit in zip(rows, keys, strict=True):
            spec, future = self._prepare(
                func,
                row,
                kwargs,
                explicit,
                pure,
                options,
                prefix=key if isinstance(key, str) else None,
                limit=limit,
            )
            futures.append(future)
            if spec is not None:
                specs.append(spec)
        self._enqueue(specs)
        return futures

    def _options(
        self,
        resources: Any,
        retries: Any,
        priority: Any,
        workers: Any = None,
        allow_other_workers: Any = False,
    ) -> dict[str, Any]:
        annotations = current_annotations()
        resources = annotations.get("resources") if resources is None else resources
        retries = annotations.get("retries", 0) if retries is None else retries
        priority = annotations.get("priority", 0) if priority is None else priority
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an integer, got {priority!r}")
        options = {"resources": validate(resources), "retries": retries, "priority": priority}
        if workers is not None:
            options.update(worker_restriction(workers, allow_other_workers))
        return options

    def _prepare(
        self,
        func: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        key: str | None,
        pure: bool,
        options: dict[str, Any],
        prefix: str | None = None,
        limit: int | None = None,
    ) -> tuple[Message | None, Future]:
        self._check_open()
        if not callable(func):
            raise TypeError(f"first argument must be callable, got {type(func).__name__}")
        func_bytes = self._functions.dumps(func)
        args_bytes, deps = dumps_args(tuple(args), dict(kwargs), Future)
        arguments: tuple[Future, ...] = ()
        kept: dict[str, Any] | None = None
        if len(args_bytes) >= OUT_OF_BAND_MIN_BYTES:
            threshold = int(config.get("client.store-argument-bytes"))
            stored = self._store_arguments(args, kwargs, options, pure, threshold)
            if stored is not None:
                args, kwargs, arguments, kept = stored
                args_bytes, deps = dumps_args(tuple(args), dict(kwargs), Future)
        if key is None:
            name = prefix or getattr(func, "__name__", type(func).__name__)
            if pure:
                # The demand is part of a pure key: the same call placed differently is
                # another task.
                demand = repr(
                    (
                        sorted(options["resources"].items()),
                        options["workers"],
                        options.get("allow_other_workers", False),
                    )
                    if "workers" in options
                    else sorted(options["resources"].items())
                ).encode()
                token = tokenize(func_bytes, args_bytes, demand)
            else:
                token = f"{self._key_prefix}{next(self._key_counter):012x}"
            key = f"{name}-{token}"
        elif not isinstance(key, str):
            raise TypeError(f"key must be a string, got {key!r}")
        if key in deps:
            raise ValueError(
                f"task {key!r} would depend on itself: one of its arguments is the future "
                f"of key {key!r}; give the new task another key"
            )
        if limit is None:
            limit = self._limit()
        if len(func_bytes) + len(args_bytes) > limit:
            raise ValueError(
                f"task {key!r} serializes to {len(func_bytes) + len(args_bytes):,} bytes, more "
                f"than comm.max-frame-bytes allows ({limit:,}): pass large data as the result "
                "of another task (a future) instead of as an argument"
            )
        # Kept as the future's lineage: made of values the garbage collector can stop
        # tracking (a tuple of keys, no empty dict), so that the kept specs cost it nothing.
        spec = {"key": key, "func": func_bytes, "args": args_bytes, "deps": (), **options}
        if deps:
            spec["deps"] = tuple(deps)
        if not options["resources"]:
            del spec["resources"]
        with self._lock:
            states = self._states
            known = states.get(key)
            fresh = known is None or known.status == "cancelled"
            if fresh:
                # The lineage a new scheduler needs after a restart (apportion/lineage.py).
                state = states[key] = FutureState(key)
                state.spec = spec
                if arguments:
                    state.arguments = arguments
                if deps:
                    state.deps = list(filter(None, map(states.get, deps)))  # at C speed
            else:
                state = known  # type: ignore[assignment]
        if kept:
            self._keep(kept, key, state, options)
        future = Future(key, self, state)
        return (spec if fresh else None), future

    def _store_arguments(
        self, args: Any, kwargs: dict, options: dict[str, Any], pure: bool, threshold: int
    ) -> tuple[tuple, dict, tuple[Future, ...], dict[str, Any]] | None:
        """Put the arguments pickling to ``threshold`` bytes or more on a worker that can
        run the task, each as a future of its own (apportion/stored_args.py); returns the
        arguments with those futures in their place, and their values by key (to keep
        until the task is done). None: they go with the task (none
        is that large, no connected worker could run the task, called on the I/O thread,
        which cannot wait for the transfer, or by an AsyncClient, whose caller's event
        loop must not wait for it either)."""
        if self.asynchronous or threading.current_thread() is self._io.thread:
            return None
        found = large_arguments(tuple(args), dict(kwargs), threshold, Future)
        if not found:
            return None
        workers = self._request({"op": "info"})["workers"]  # (AsyncClient's info is a coroutine)
        holder = choose_holder(workers, options["resources"], options)
        if holder is None:
            return None
        futures: dict[int | str, Future] = {}
        values: dict[str, Any] = {}
        for position, value, payload in found:
            try:
                key, known = self._put_argument(holder, value, payload, pure)
            except (OSError, CommClosedError) as exc:
                logger.info(
                    "could not store an argument on %s, sending it with the task: %s", holder, exc
                )
                return None
            values[key] = value
            if known is not None:
                futures[position] = Future(key, self, known)  # stored already: once is enough
                continue
            with self._lock:
                self._stored_on[key] = holder
                self._stored_bytes[key] = len(payload)
            take = self._options({}, 0, options["priority"], holder)
            spec, future = self._prepare(stored_argument, (key,), {}, key, True, take)
            if spec is not None:
                self._enqueue([spec])  # before the task that depends on it
            futures[position] = future
        new_args, new_kwargs = replace(tuple(args), dict(kwargs), futures)
        return new_args, new_kwargs, tuple(futures.values()), values

    def _put_argument(
        self, holder: str, value: Any, payload: Payload, pure: bool
    ) -> tuple[str, FutureState | None]:
        """Put one large argument on ``holder``: its key, and the state of that key when
        this client has it stored already (then nothing is sent). Raises OSError or
        CommClosedError when the worker could not store it.

        A pure argument's key is a hash of its bytes. It is computed while the bytes
        travel, under a name of their own that the worker replaces by the key once known
        (the hash lets go of the GIL, the loop thread sends meanwhile): the hash costs a
        tenth of a transfer's time on one host. When an argument of the same size is
        stored already, it is hashed first instead, so that a repeat is not sent again."""
        kind = type(value).__name__
        if not pure:
            key = f"{kind}-{self._key_prefix}{next(self._key_counter):012x}"
            self._io.run(self._put(holder, key, payload))
            return key, None
        with self._lock:
            same_size = len(payload) in self._stored_bytes.values()
        if same_size:
            key = f"{kind}-{content_token(payload)}"
            known = self._stored_state(key)
            if known is None:
                self._io.run(self._put(holder, key, payload))
            return key, known
        upload = f"upload-{self._key_prefix}{next(self._key_counter):012x}"
        sending = asyncio.run_coroutine_threadsafe(
            self._put(holder, upload, payload), self._io.loop
        )
        try:
            key = f"{kind}-{content_token(payload)}"
        finally:
            sending.result()
        known = self._stored_state(key)
        if known is not None:  # stored by another thread meanwhile
            self._io.loop.call_soon_threadsafe(self._drop_stored, upload, holder)
        else:
            self._io.run(self._name_stored(holder, upload, key))
        return key, known

    def _stored_state(self, key: str) -> FutureState | None:
        with self._lock:
            known = self._states.get(key)
        return known if known is not None and known.status != "cancelled" else None

    def _keep(
        self, values: dict[str, Any], taker: str, state: FutureState, options: dict[str, Any]
    ) -> None:
        """Keep stored arguments (values by key) until the task ``taker`` is done."""
        restriction: dict[str, Any] = {
            k: options[k] for k in ("workers", "allow_other_workers") if k in options
        }
        with self._lock:
            for key, value in values.items():
                kept = self._kept.get(key)
                if kept is None:
                    kept = self._kept[key] = KeptArgument(value, options["resources"], restriction)
                kept.takers.add(taker)
        state.add_callback(lambda: self._taken(taker, list(values)))

    def _taken(self, taker: str, keys: list[str]) -> None:
        """The task ``taker`` is done: the stored arguments no other task waits for are
        no longer kept here (their workers still hold them while their futures live)."""
        with self._lock:
            for key in keys:
                kept = self._kept.get(key)
                if kept is not None:
                    kept.takers.discard(taker)
                    if not kept.takers:
                        del self._kept[key]

    def _restore_lost(self, message: Message) -> Message:
        """On the loop: the scheduler found no worker for these keys. Those of stored
        arguments lost with their worker are put on another one; returns the notice
        without them (the others are the user's to hear of)."""
        keys = message["keys"]
        lost = [key for key in keys if key in self._kept]
        for key in lost:
            background(self._restore(key))
        return {**message, "keys": [key for key in keys if key not in lost]}

    async def _restore(self, key: str) -> None:
        """Put a stored argument whose holder was lost on another worker that could run
        the tasks waiting for it, and have the scheduler take it from there; with no such
        worker connected, its task carries the value itself (through the scheduler, as a
        task's small arguments do), so that it runs on any worker."""
        with self._lock:
            kept = self._kept.get(key)
            state = self._states.get(key)
            lost = self._stored_on.get(key)
        if kept is None or state is None or state.spec is None:
            return
        try:
            workers = (await self._request_async({"op": "info"}))["workers"]
            workers.pop(lost, None)
            holder = choose_holder(workers, kept.demand, kept.options)
            if holder is not None:
                try:
                    await self._put(holder, key, dumps_data(kept.value))
                except (OSError, CommClosedError) as exc:
                    logger.info("could not store %r again on %s: %s", key, holder, exc)
                    holder = None
            spec = self._restored_spec(state.spec, kept.value, holder)
            reply = await self._request_async({"op": "restore-argument", "task": spec})
        except (OSError, CommClosedError, SchedulerConnectionError, RuntimeError) as exc:
            # (RuntimeError: this client was closed meanwhile)
            logger.warning("could not restore the lost argument %r: %s", key, exc)
            return
        if not reply.get("restored"):  # it no longer waits for a worker (its holder is back)
            if holder is not None:
                self._drop_stored(key, holder)
            return
        logger.info("argument %r, lost with worker %s, restored on %s", key, lost, holder)
        with self._lock:
            state.spec = spec  # lineage, should the scheduler restart
            if holder is not None:
                self._stored_on[key] = holder
            else:
                self._stored_on.pop(key, None)

    def _restored_spec(self, spec: Message, value: Any, holder: str | None) -> Message:
        """The task of a stored argument taken from ``holder``, or with no holder,
        carrying its value."""
        spec = {k: v for k, v in spec.items() if k not in ("workers", "allow_other_workers")}
        if holder is not None:
            spec.update(worker_restriction(holder, False))
        else:
            spec["func"] = self._functions.dumps(argument_value)
            spec["args"] = dumps_args((value,), {}, Future)[0]
        return spec

    async def _put(self, address: str, key: str, payload: Payload) -> None:
        reply = await self._pool.request(address, {"op": "put-data", "key": key, "data": payload})
        if reply.get("op") != "stored":
            raise OSError(f"worker {address} did not store {key!r}: {reply!r}")

    async def _name_stored(self, address: str, upload: str, key: str) -> None:
        reply = await self._pool.request(address, {"op": "name-data", "upload": upload, "key": key})
        if reply.get("op") != "named":  # the connection it came through ended meanwhile
            raise OSError(f"worker {address} no longer holds the argument put as {upload!r}")

    def _drop_stored(self, key: str, holder: str) -> None:
        """On the loop: a stored argument's future was released before its task took it."""
        self._pool.send_if_open(holder, {"op": "drop-data", "keys": [key]})

    @staticmethod
    def _limit() -> int:
        """Largest task payload."""
        return int(config.get_immutable("comm.max-frame-bytes")) - 4096

    def _enqueue(self, specs: list[Message]) -> None:
        """Post tasks as ``submit`` messages each well within comm.max-frame-bytes (the
        connection splits a batch of messages into frames, never one message)."""
        if not specs:
            return
        # Submitted by a task (get_client() on a worker): the scheduler knows its parent.
        parent = current_task_key()
        if parent is not None:
            for spec in specs:  # kept with the lineage, for a new scheduler (lineage.py)
                spec["parent"] = parent
        budget = self._limit() // 2
        if _submission_bytes(specs) <= budget:  # the usual case, measured at C speed
            batches = [specs]
        else:
            batches = split_submission(specs, budget)
        for batch in batches:
            message: Message = {"op": "submit", "tasks": batch}
            if parent is not None:
                message["parent"] = parent
            self._post(message)

    def _post(self, message: Message) -> None:
        """Queue a message for the scheduler from any thread; flushed once per loop tick."""
        with self._lock:
            self._outgoing.append(message)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        if threading.get_ident() != self._io.thread.ident and self._send_from_this_thread():
            return
        self._io.loop.call_soon_threadsafe(self._flush)

    def _send_from_this_thread(self) -> bool:
        """Write what is outgoing from the calling thread when the connection is idle: no
        wake-up of the I/O thread on the way out. False: the I/O thread must flush."""
        comm = self._comm
        # The comm's lock first, then ours (as in _flush): batches leave in the order taken.
        with comm.write_lock:
            with self._lock:
                messages, self._outgoing = self._outgoing, []
                self._flush_scheduled = False
            if comm.send_from_thread(messages):
                return True
            with self._lock:
                self._outgoing[:0] = messages
                if self._flush_scheduled:
                    return True  # another thread has it in hand
                self._flush_scheduled = True
            return False

    def _tick(self) -> None:
        """Send releases left waiting (see _release); runs on the loop every RELEASE_DELAY."""
        if self._outgoing:
            self._flush()
        if not self._closed:
            self._io.loop.call_later(RELEASE_DELAY, self._tick)

    def _flush(self) -> None:
        comm = self._comm
        with comm.write_lock:
            with self._lock:
                self._flush_scheduled = False
                if comm.closed:
                    return  # kept for the next scheduler (see apportion/reconnect.py)
                messages, self._outgoing = self._outgoing, []
            if messages:
                comm.send_now(messages)  # already batched by _post: no need to wait a tick

    # ---------------------------------------------------------------- results
    def gather(self, futures: Any, errors: str = "raise") -> Any:
        """Results of futures, in the same structure (a future, list, tuple, dict, nesting)."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
        flat = _collect_futures(futures)
        for future in flat:
            future._wait(None)
        self._fetch_missing([f for f in flat if f.status == "finished"])
        skipped = object()

        def resolve(future: Future) -> Any:
            if future.status == "finished":
                return self._value_of(future)
            if errors == "skip":
                return skipped
            raise future._exception()

        return _rebuild(futures, resolve, skipped)

    def _value_of(self, future: Future, deadline: float | None = None) -> Any:
        state = future._state
        if not state.has_value():
            self._fetch_missing([future], deadline)
            if state.status != "finished":  # lost, and failed when made again
                raise future._exception()
        return state.value()

    def _fetch_missing(self, futures: list[Future], deadline: float | None = None) -> None:
        """Fetch the values of finished futures not here yet (by ``deadline``, a
        time.monotonic(), if given: else TimeoutError)."""

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        while True:
            missing = [f for f in futures if not f._state.has_value()]
            if not missing:
                return
            tried = {f.key: list(f._state.who_has) for f in missing}
            try:
                self._io.run(self._fetch(missing), left())
                return
            except (TimeoutError, FetchTimeout):  # (one class from Python 3.11 on)
                raise TimeoutError(
                    f"the result of {missing[0].key!r} was not fetched in time"
                ) from None
            except SchedulerConnectionError:
                # Its holder was lost meanwhile (the scheduler said so before the fetch
                # ended): it is being made again, or was made again already elsewhere;
                # wait for it and fetch it from there.
                again = [
                    f
                    for f in missing
                    if f._state.status == "pending" or f._state.who_has != tried[f.key]
                ]
                if not again or self._lost:
                    raise
                for future in again:
                    future._wait(left())
                futures = [f for f in futures if f._state.status == "finished"]

    async def _fetch(self, futures: list[Future]) -> None:
        by_worker: dict[str, list[FutureState]] = {}
        for future in futures:
            state = future._state
            if not state.who_has:
                raise self._gone(future.key, "no worker holds the result of")
            by_worker.setdefault(state.who_has[0], []).append(state)

        # A worker on this host hands over large results as shared memory to map.
        host = shared_memory.host_identity() if config.get("worker.shared-memory") else ""

        async def fetch_from(address: str, states: list[FutureState]) -> None:
            try:
                payloads, segments = await shared_memory.get_data(
                    lambda message: self._pool.request(address, message),
                    [s.key for s in states],
                    host,
                )
            except (OSError, CommClosedError) as exc:
                raise SchedulerConnectionError(
                    f"could not fetch results from worker {address}: {exc}"
                ) from exc
            for segment in segments.values():
                segment.close_descriptor()  # the mapping is enough here: never shared on
            for state in states:
                data: Any = payloads.get(state.key)  # a Pickled or bytes
                if data is None:
                    raise self._gone(state.key, f"worker {address} no longer holds")
                state.store(data)

        await asyncio.gather(*(fetch_from(a, s) for a, s in by_worker.items()))

    def _gone(self, key: str, problem: str) -> Exception:
        """The error for a result no worker serves: after the scheduler was lost for good,
        that loss is named (no scheduler is there to have it recomputed)."""
        if self._lost:
            return SchedulerConnectionError(
                f"{self._lost}; the result of {key!r} had not been fetched, and no scheduler "
                "is left to recompute it"
            )
        return LookupError(f"{problem} {key!r}")

    def cancel(self, futures: Iterable[Future]) -> None:
        """Cancel tasks (and what depends on them); their futures raise CancelledError."""
        keys = [f.key for f in _collect_futures(futures)]
        self._post({"op": "cancel", "keys": keys})

    # ----------------------------------------------------------- cluster-wide
    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call ``func`` in every worker process; returns ``{worker_address: result}``."""
        args_bytes, _ = dumps_args(args, kwargs, Future)
        reply = self._request(
            {"op": "run", "func": self._functions.dumps(func), "args": args_bytes}
        )
        results = {}
        for address, outcome in reply["results"].items():
            if "result" in outcome:
                results[address] = loads_value(outcome["result"])
            elif "exception" in outcome:
                raise loads_exception(outcome["exception"], outcome.get("traceback", ""))
            else:
                raise SchedulerConnectionError(outcome.get("error", "worker gave no answer"))
        return results

    def scheduler_info(self) -> dict[str, Any]:
        """Workers (name, resources, used_resources, ...), task counts, waiting demands."""
        reply = self._request({"op": "info"})
        for field in ("op", "id"):
            reply.pop(field, None)
        return reply

    # Observability (apportion/progress.py, apportion/logs.py, apportion/reprs.py).
    def get_scheduler_logs(self, n: int | None = None) -> list[str]:
        """The scheduler's last ``n`` log lines (default: all it keeps), oldest first."""
        return list(self._request({"op": "logs", "n": line_count(n)})["lines"])

    def get_worker_logs(self, n: int | None = None) -> dict[str, list[str]]:
        """Each worker's last ``n`` log lines, by worker name."""
        names = {a: w["name"] for a, w in self.scheduler_info()["workers"].items()}
        lines = self.run(recent_lines, line_count(n))
        return {names.get(address, address): kept for address, kept in lines.items()}

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard, signed in with the token; None if the scheduler serves no HTTP."""
        return dashboard_link(
            self.scheduler_address, self.scheduler_info()["http_port"], self.token
        )

    def progress(self, *futures: Any, **kwargs: Any) -> Any:
        """Progress bars for futures: see ``apportion.progress``."""
        return progress(*futures, **kwargs)

    def _repr_html_(self) -> str:
        info = self.scheduler_info()
        link = dashboard_link(self.scheduler_address, info["http_port"], self.token)
        return summary_html(f"Client {self.id}", self.scheduler_address, link, info)

    def check_invariants(self) -> list[str]:
        """Ask the scheduler to verify its resource accounting; [] when consistent."""
        return list(self._request({"op": "info", "check": True})["problems"])

    def retire_workers(
        self, names: Iterable[str], count: int | None = None, close_workers: bool = True
    ) -> dict[str, Any]:
        """Take up to ``count`` (default: all) of the named workers out of service, gracefully.

        Idle workers are chosen first. They get no new work; their running tasks finish
        and every result still needed that only they hold is copied to a worker staying
        in service. Returns ``{"retired": [names now safe to stop], "kept": {name:
        reason}}`` once that is done, or after ``scheduler.retire-timeout`` seconds; a
        kept worker is back in service. Unknown names raise ValueError. The retired
        workers then close (their processes exit), unless ``close_workers=False``.
        """
        if isinstance(names, str):
            raise TypeError(f"names must be a list of worker names, not one string {names!r}")
        names = list(names)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"worker names must be strings, got {names!r}")
        if count is not None and (type(count) is not int or count < 0):
            raise ValueError(f"count must be an int >= 0 or None (all named), got {count!r}")
        request = {"op": "retire", "names": names, "count": count, "close": close_workers}
        reply = self._request(request, timeout=None)
        if "error" in reply:
            raise ValueError(reply["error"])
        return {"retired": list(reply["retired"]), "kept": dict(reply["kept"])}

    def wait_for_workers(self, n: int = 1, timeout: float | None = None) -> None:
        """Block until at least ``n`` workers are connected."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            count = len(self.scheduler_info()["workers"])
            if count >= n:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"only {count} of {n} workers connected after {timeout}s")
            time.sleep(min(delay, 0.25))  # polling the scheduler, backing off
            delay *= 2

    def _request(self, message: Message, timeout: float | None = 60.0) -> Message:
        self._check_open()
        return self._io.run(self._request_async(message), timeout)

    async def _request_async(self, message: Message) -> Message:
        await self._connected.wait()  # while reconnecting: until connected, or given up
        self._check_open()
        request_id = next(self._request_ids)
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = reply
        self._flush()  # what was queued before (e.g. releases) reaches the scheduler first
        self._comm.send({**message, "id": request_id})
        return await reply

    # ------------------------------------------ more of Dask's API (apportion/cluster_ops.py)
    def set_resources(self, worker: str, resources: dict[str, float]) -> dict[str, float]:
        """Give a worker (name or address) new resource totals at runtime: new placements
        follow them; runs under way keep what they hold."""
        return cluster_ops.set_resources(self, worker, resources)

    def run_on_scheduler(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(*args, **kwargs)`` in the scheduler process; see cluster_ops."""
        return cluster_ops.run_on_scheduler(self, func, *args, **kwargs)

    def upload_file(self, filename: str) -> dict[str, str]:
        """Make a local .py/.zip/.egg/.whl file importable on every worker, now and later."""
        return cluster_ops.upload_file(self, filename)

    def restart(self, timeout: float = 60.0) -> Client:
        """Forget every task (their futures, in every client, raise CancelledError) and
        restart every worker, returning once they are all back."""
        cluster_ops.restart(self, timeout)
        return self

    def get_task_stream(self, start: float | None = None) -> list[dict[str, Any]]:
        """The runs that ended since ``start`` (wall clock), oldest first."""
        return cluster_ops.get_task_stream(self, start)

    # ------------------------------------------------- Dask collections (apportion[dask])
    # Dask accepts a client object as ``scheduler=`` when it is not asynchronous.
    asynchronous = False

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Dask's scheduler function: ``dask.compute(x, scheduler=client.get)``."""
        from apportion import dask_client

        return dask_client.get(self, dsk, keys, **kwargs)

    def compute(self, collections: Any, optimize_graph: bool = True) -> Any:
        """Start computing Dask collections: a future per collection (list in, list out)."""
        from apportion import dask_client

        return dask_client.compute(self, collections, optimize_graph)

    def persist(self, collections: Any, optimize_graph: bool = True, **kwargs: Any) -> Any:
        """The same Dask collections, backed by futures of their chunks on the cluster."""
        from apportion import dask_client

        return dask_client.persist(self, collections, optimize_graph, **kwargs)

    def as_default(self) -> Any:
        """Make this client Dask's default scheduler (also usable as a ``with`` block)."""
        from apportion.dask_default import DefaultScheduler

        return DefaultScheduler(self)

    def scatter(self, data: Any, broadcast: bool = False) -> Any:
        """Futures of local data (a list gives a list, a dict a dict)."""
        from apportion.data import scatter

        return scatter(self, data, broadcast)

    # ------------------------------------------------------- scheduler events
    async def _read_loop(self, comm: Comm) -> None:
        try:
            await comm.serve(self._on_frame)
        except (CommClosedError, ProtocolError) as exc:
            reason = f"connection to scheduler {self.scheduler_address} lost: {exc}"
        except Exception as exc:  # a malformed message
            comm.close()
            reason = f"bad message from scheduler {self.scheduler_address}: {exc!r}"
        if self._refused is not None:
            self._on_lost(
                f"the scheduler at {self.scheduler_address} refused this client's messages "
                f"({self._refused}); not reconnecting, as it would refuse them again"
            )
        elif not self._closed:
            await reconnect(self, reason)

    def _on_frame(self, messages: list[Message]) -> None:
        for message in messages:
            self._on_message(message)

    def _on_message(self, message: Message) -> None:
        op = message["op"]
        state = self._states.get(message.get("key", ""))
        if op == "task-finished":
            if state is not None:
                state.finish(message["who_has"], message.get("nbytes", 0), message.get("data"))
            self._connect_to_holder(message["who_has"])
        elif op == "task-erred":
            if state is not None:
                state.fail(message["exception"], message.get("traceback") or "")
        elif op == "task-cancelled":
            if state is not None:
                reason = message.get("reason")
                state.cancel(CancelledError(f"task {state.key!r}: {reason}") if reason else None)
        elif op == "task-lost":
            if state is not None:
                state.lose()
        elif op == "worker-left":  # removed by the scheduler: fetches from it end
            self._pool.drop(message["address"])
        elif op == "who-has":  # a copy was made (its holder is retiring): fetch from there
            if state is not None:
                state.who_has = list(message["who_has"])
        elif op == "no-worker":
            if self._kept:
                message = self._restore_lost(message)
            if message["keys"]:
                self._warn_no_worker(message)
        elif op == "task-output":
            show_task_output(message)
        elif op in (
            "info-reply",
            "run-reply",
            "retire-reply",
            "logs-reply",
            "replicate-reply",
            "coord-reply",
            "reply",
        ):
            reply = self._requests.pop(message["id"], None)
            if reply is not None and not reply.done():
                reply.set_result(message)
        elif op == "error":
            self._refused = str(message.get("reason"))
            logger.error("scheduler reported: %s", self._refused)

    def _connect_to_holder(self, who_has: list[str]) -> None:
        """Connect to a worker that told the scheduler of a result: from then on it tells
        us of results directly (see Worker._tell_clients)."""
        direct = self._direct_workers
        if direct is None or not who_has or who_has[0] in direct:
            return
        direct.add(who_has[0])
        background(self._pool.open(who_has[0]))

    def _on_worker_connection_closed(self, address: str) -> None:
        # Connect again on its next result: a worker restarted at the same address, say.
        if self._direct_workers is not None:
            self._direct_workers.discard(address)

    def _on_direct(self, message: Message) -> None:
        """A worker tells us of a result. The scheduler has not yet heard of it, and may
        have told us something since (an error, a cancellation): only a pending state
        takes it."""
        if message.get("op") != "task-finished":
            logger.warning("ignoring unexpected message from a worker: %r", message.get("op"))
            return
        state = self._states.get(message.get("key", ""))
        if state is not None and not state.is_done():
            state.finish(message["who_has"], message.get("nbytes", 0), message.get("data"))

    def _warn_no_worker(self, message: Message) -> None:
        shape = tuple(sorted(message["resources"].items()))
        if shape in self._warned:
            return
        self._warned.add(shape)
        need = format_resources(message["resources"])
        text = (
            f"{len(message['keys'])} task(s) need {need}, which no connected worker has: "
            f"{message['why']}"
            if message["resources"]
            else f"{len(message['keys'])} task(s) wait: {message['why']}"
        )
        warnings.warn(text, NoWorkerWarning, stacklevel=1)  # once: a filter silences it all

    def _on_lost(self, reason: str) -> None:
        if self._closed:
            return
        self._lost = reason
        logger.error(reason)
        for reply in self._requests.values():
            if not reply.done():
                reply.set_exception(SchedulerConnectionError(reason))
        self._requests.clear()
        for state in list(self._states.values()):
            if not state.is_done():
                state.cancel(SchedulerConnectionError(reason))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this client is closed")
        if self._lost:
            raise SchedulerConnectionError(self._lost)

    # -------------------------------------------------------- future lifetime
    def _retain(self, key: str) -> None:
        with self._lock:
            self._refs[key] = self._refs.get(key, 0) + 1

    def _release(self, key: str) -> None:
        with self._lock:
            refs = self._refs.get(key, 0) - 1
            if refs > 0:
                self._refs[key] = refs
                return
            self._refs.pop(key, None)
            state = self._states.pop(key, None)
            if self._closed or self._lost:
                return
            if self._stored_on:
                holder = self._stored_on.pop(key, None)
                self._stored_bytes.pop(key, None)
                if holder is not None and state is not None and state.status == "pending":
                    with contextlib.suppress(RuntimeError):  # the loop is closed
                        self._io.loop.call_soon_threadsafe(self._drop_stored, key, holder)
            # Queued in order with everything else, without waking the loop (see _tick);
            # consecutive releases share one message.
            last = self._outgoing[-1] if self._outgoing else None
            if last is not None and last["op"] == "release":
                last["keys"].append(key)
            else:
                self._outgoing.append({"op": "release", "keys": [key]})

    # -------------------------------------------------------------- lifecycle
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        restore_dask_default(self)
        if threading.current_thread() is self._io.thread:
            # Called from our own I/O thread (a callback, or garbage collection there):
            # waiting on that thread would deadlock, so just stop it.
            self._comm.close()
            self._io.loop.stop()
            return

        async def shutdown() -> None:
            self._flush()
            if not self._comm.closed:
                try:
                    await self._comm.write([{"op": "close"}])
                except CommClosedError:
                    pass
            self._comm.close()
            self._pool.close()

        try:
            self._io.run(shutdown(), timeout=5)
        except Exception:
            pass
        self._io.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A finalizer may run on any thread, even another client's I/O thread: never wait
        # here (close() would), just tell our own I/O thread to stop.
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._io.loop.call_soon_threadsafe(self._comm.close)
            self._io.loop.call_soon_threadsafe(self._io.loop.stop)
        except Exception:
            pass  # the loop is already closed, or the interpreter is shutting down

    def __repr__(self) -> str:
        return f"<Client {self.id if hasattr(self, 'id') else '?'} -> {self.scheduler_address}>"


def _submission_bytes(specs: list[Message]) -> int:
    """An upper bound on the encoded size of ``specs``: their function, argument, key and
    dependency bytes plus a generous allowance per task for the rest (options, framing)."""
    return (
        sum(map(len, map(_FUNC, specs)))
        + sum(map(len, map(_ARGS, specs)))
        + sum(map(len, map(_KEY, specs)))
        + sum(map(len, itertools.chain.from_iterable(map(_DEPS, specs))))
        + sum(map(len, map(_DEPS, specs))) * 8
        + len(specs) * _SPEC_OVERHEAD
    )


# Answers to requests (see _request_async), by their op.
_REPLIES = frozenset(
    {"info-reply", "run-reply", "retire-reply", "logs-reply", "coord-reply", "reply"}
)

_FUNC, _ARGS, _KEY, _DEPS = map(itemgetter, ("func", "args", "key", "deps"))


def _spec_bytes(spec: Message) -> int:
    """_submission_bytes of one spec, which may lack ``deps`` (a Dask graph's chunks)."""
    deps = spec.get("deps") or ()
    return (
        len(spec["func"])
        + len(spec["args"])
        + len(spec["key"])
        + sum(map(len, deps))
        + len(deps) * 8
        + _SPEC_OVERHEAD
    )


def split_submission(specs: list[Message], budget: int) -> list[list[Message]]:
    """``specs`` in order, in batches of at most ``budget`` bytes (see _submission_bytes)."""
    batches = []
    start, size = 0, 0
    for i, spec in enumerate(specs):
        cost = _spec_bytes(spec)
        if size + cost > budget and i > start:
            batches.append(specs[start:i])
            start, size = i, 0
        size += cost
    batches.append(specs[start:])
    return batches


def _collect_futures(obj: Any) -> list[Future]:
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


def _rebuild(obj: Any, resolve: Callable[[Future], Any], skipped: object) -> Any:
    if isinstance(obj, Future):
        return resolve(obj)
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [_rebuild(item, resolve, skipped) for item in obj]
        return type(obj)(item for item in items if item is not skipped)
    if isinstance(obj, dict):
        pairs = {k: _rebuild(v, resolve, skipped) for k, v in obj.items()}
        return {k: v for k, v in pairs.items() if v is not skipped}
    return obj
