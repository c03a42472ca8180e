"""A client's connection to its scheduler: the spine every client feature sits on.

A ``Session`` owns the event-loop thread all of a client's network I/O runs on, the
connection to the scheduler and the connections to workers (fetching results, storing
arguments, results workers push), the table of requests awaiting their reply, the queue of
outgoing messages (batched: flushed once per loop tick), the read loop that hands each
message from the scheduler to the handler registered for its ``op``, and the way back after
losing the scheduler.

Reconnecting: the session keeps the client's futures pending and retries, with back-off,
the address it was given (a host name is resolved again on every try: on Kubernetes the
scheduler Service's name, never the address of a pod that is gone; a cluster object such as
KubeCluster is asked for the scheduler's address again on every try). The new scheduler
first hears what the registered resume sources give (the tasks the client still wants, with
their lineage; held leases and set events), then what was submitted or released meanwhile.
After ``client.reconnect-timeout`` seconds without a scheduler, the session is lost: its
lost-listeners hear why (pending futures fail with SchedulerConnectionError).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from operator import itemgetter
from typing import Any

from apportion import config
from apportion.aio import background, new_event_loop
from apportion.errors import SchedulerConnectionError
from apportion.protocol import Comm, CommClosedError, Message, ProtocolError, connect
from apportion.protocol.rpc import ConnectionPool
from apportion.serialize import FunctionPickleCache

logger = logging.getLogger("apportion.client")

Handler = Callable[[Message], None]

# A dropped future's release waits for the next message to the scheduler, or at most this
# long (seconds): releases then cost no thread wake-up and no frame of their own.
RELEASE_DELAY = 0.05
# Bytes of a submitted task besides its function and arguments (key, options, framing):
# generous, so that a split submission's messages always fit their frame.
_SPEC_OVERHEAD = 1024
# Reconnecting: seconds before the second try; doubled after each failure, up to MAX_DELAY.
FIRST_DELAY = 0.05
MAX_DELAY = 2.0
# A connection that ends sooner than this after it was made counts as a failed try: the
# next reconnect waits longer (a scheduler that closes us at once is not hammered).
STABLE_AFTER = 10.0
# How long what is still pending on the I/O thread when its loop stops may take to end
# once cancelled (closing a connection): it ends at once but for a peer that does not read.
CANCEL_GRACE_SECONDS = 1.0
# Answers to requests (see start_request), by their op.
REPLY_OPS = frozenset(
    {
        "info-reply",
        "run-reply",
        "retire-reply",
        "logs-reply",
        "replicate-reply",
        "coord-reply",
        "reply",
    }
)


# Bytes of a frame besides a task's function and arguments (framing, key, options).
_FRAME_OVERHEAD = 4096


def task_bytes_limit(peer_limit: int | None = None) -> int:
    """The largest payload (function and arguments) of one task: within our own
    comm.max-frame-bytes and the scheduler's (``peer_limit``, told in its welcome)."""
    own = int(config.get_immutable("comm.max-frame-bytes"))
    return min(own, peer_limit or own) - _FRAME_OVERHEAD


def too_large(what: str, size: int, peer_limit: int | None) -> str:
    """Why ``what`` of ``size`` bytes cannot be sent, naming both sides' limits, and what to
    do about it."""
    own = int(config.get_immutable("comm.max-frame-bytes"))
    scheduler = f"{peer_limit:,}" if peer_limit else "not known yet"
    return (
        f"{what} serializes to {size:,} bytes, more than comm.max-frame-bytes allows "
        f"({task_bytes_limit(peer_limit):,} bytes for a task's function and arguments): "
        f"this client's comm.max-frame-bytes is {own:,}, the scheduler's is {scheduler}; "
        "pass large data as the result of another task (a future) instead of as an "
        "argument, or raise comm.max-frame-bytes on the scheduler and on the client"
    )


def next_reconnect_delay(delay: float, connected_for: float | None) -> float:
    """The wait before the first try of the next reconnect, after a connection that lasted
    ``connected_for`` seconds (None: the first connection): back to FIRST_DELAY after a
    stable one, else doubled (up to MAX_DELAY), so that a scheduler that drops us at once
    is not reconnected to in a tight loop."""
    if connected_for is None or connected_for >= STABLE_AFTER:
        return 0.0
    return min(max(delay, FIRST_DELAY) * 2, MAX_DELAY)


_FUNC, _ARGS, _KEY = map(itemgetter, ("func", "args", "key"))


def submission_bytes(specs: list[Message]) -> int:
    """An upper bound on the encoded size of ``specs``: their function, argument, key and
    dependency bytes plus a generous allowance per task for the rest (options, framing).
    A task without dependencies may leave ``deps`` out."""
    deps = [spec["deps"] for spec in specs if "deps" in spec]
    return (
        sum(map(len, map(_FUNC, specs)))
        + sum(map(len, map(_ARGS, specs)))
        + sum(map(len, map(_KEY, specs)))
        + sum(map(len, itertools.chain.from_iterable(deps)))
        + sum(map(len, deps)) * 8
        + len(specs) * _SPEC_OVERHEAD
    )


def _spec_bytes(spec: Message) -> int:
    """submission_bytes of one spec, which may lack ``deps`` (a Dask graph's chunks)."""
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
    """``specs`` in order, in batches of at most ``budget`` bytes (see submission_bytes)."""
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


class Session:
    """One client's connection to its scheduler; see the module's docstring.

    Thread-safe where it says so: ``post``, ``release_later``, ``request``, ``run`` and
    ``call_soon`` may be called from any thread; handlers run on the session's loop thread.
    """

    def __init__(self, address: str, token: str | None, cluster: Any = None) -> None:
        self.address = address
        self.token = token
        # A cluster object (KubeCluster): asked for the scheduler's address on reconnects.
        self.cluster = cluster
        self.id: str | None = None  # given by the scheduler when connected
        self.tenant = "default"  # which tenant the scheduler took it for (see _connect)
        # Guards the outgoing queue; the client's tables share it (a release is queued in
        # order with the state it drops). Reentrant: a Future's __del__ (which takes it)
        # may run in garbage collection triggered while this thread holds it.
        self.lock = threading.RLock()
        # Each function pickled once (``client.map`` of one function is common).
        self.functions = FunctionPickleCache()
        self.closed = False
        # Set when the scheduler is lost for good (reconnecting gave up), with the reason.
        self.lost: str | None = None
        # Why the scheduler refused our messages (its "error" before closing): reconnecting
        # and sending them again would only be refused again.
        self.refused: str | None = None
        # Why the session may not be used yet (an asynchronous client not awaited yet).
        self.not_ready: str | None = None
        self._outgoing: list[Message] = []
        self._flush_scheduled = False
        self._requests: dict[int, asyncio.Future[Message]] = {}
        self._request_ids = itertools.count(1)
        self._handlers: dict[str, Handler] = dict.fromkeys(REPLY_OPS, self._on_reply)
        self._handlers["error"] = self._on_error
        self._handlers["worker-left"] = self._on_worker_left
        self._on_push: Handler | None = None
        self._lost_listeners: list[Callable[[str], None]] = []
        self._resume_sources: list[Callable[[], list[Message]]] = []
        self._undeliverable_listeners: list[Callable[[Message, str], None]] = []
        # The scheduler's comm.max-frame-bytes, from its welcome (None: not told).
        self.peer_max_frame: int | None = None
        # Reconnecting: when the current connection was made, and the back-off so far.
        self._connected_at: float | None = None
        self._backoff = 0.0
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="apportion-client", daemon=True)
        self.thread.start()

    def _run_loop(self) -> None:
        """The I/O thread: the loop until stopped, then what is still pending on it (a
        connection being made, a fetch) cancelled and let end, here and now: left pending,
        it would be collected at the interpreter's exit, after the modules its cleanup
        needs are gone ("Task was destroyed but it is pending!")."""
        loop = self.loop
        loop.run_forever()
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE_SECONDS))

    # ------------------------------------------------------------ connecting
    def connect(self, timeout: float) -> str:
        """Connect (blocking); the client id the scheduler gave. On failure the session is
        closed and its thread stopped."""
        try:
            return str(self.run(self._connect(timeout), timeout + 5))
        except BaseException:
            self.closed = True  # nothing left to shut down, now or in kill()
            self.stop_thread()
            raise

    def connect_in_background(self, timeout: float) -> concurrent.futures.Future[str]:
        """Start connecting without waiting (for a caller inside an event loop)."""
        return asyncio.run_coroutine_threadsafe(self._connect(timeout), self.loop)

    async def _connect(self, timeout: float) -> str:
        self._comm, welcome = await connect(self.address, "client", self.token, timeout=timeout)
        self._use(self._comm)
        self._comm.allow_thread_writes()
        client_id = str(welcome["client_id"])
        # The tenant whose token this client presented (the cluster's: "default").
        self.tenant = str(welcome.get("tenant", "default"))
        # Set while connected: requests made while reconnecting wait for it.
        self._connected = asyncio.Event()
        self._connected.set()
        self.workers = ConnectionPool(
            "client",
            # A tenant's client presents the token the scheduler gave it for workers.
            welcome.get("worker_token") or self.token,
            info={"client_id": client_id},
            on_push=self._pushed,
            on_closed=self._on_worker_connection_closed,
            thread_writes=True,  # results are fetched from the calling thread
        )
        # Workers this client connected to (or tried to) so that they tell it of results.
        self.direct_workers: set[str] | None = (
            set() if config.get("client.direct-results") else None
        )
        self.id = client_id
        background(self._read_loop(self._comm))
        self._tick()
        return client_id

    # ------------------------------------------------------------ the loop thread
    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the session's loop and wait for its result (from another thread)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def start(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coro`` on the session's loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` on the session's loop, from any thread (nothing once
        the session is closed and its loop with it)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(callback, *args)

    def in_io_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def stop_thread(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            # Its epoll, eventfd and pipes go now, not when (if ever) the loop is collected:
            # a program making many clients would otherwise run out of descriptors.
            self.loop.close()

    def check_open(self) -> None:
        """Raise unless messages can be sent (or queued, while reconnecting)."""
        if self.closed:
            raise RuntimeError("this client is closed")
        if self.not_ready is not None:
            raise RuntimeError(self.not_ready)
        if self.lost:
            raise SchedulerConnectionError(self.lost)

    # ------------------------------------------------------------ registration
    def on(self, op: str, handler: Handler) -> None:
        """Have ``handler`` take every message of this ``op`` from the scheduler (on the
        loop thread; replaces the previous handler of that op)."""
        self._handlers[op] = handler

    def handler(self, op: str) -> Handler | None:
        """The handler registered for ``op``."""
        return self._handlers.get(op)

    def on_push(self, handler: Handler) -> None:
        """Have ``handler`` take the messages workers push to this client (results)."""
        self._on_push = handler

    def on_lost(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` once, should the scheduler be lost for good."""
        self._lost_listeners.append(listener)

    def on_undeliverable(self, listener: Callable[[Message, str], None]) -> None:
        """Call ``listener(message, why)`` (on the loop thread) for a message too large for
        the scheduler's frames: it is not sent (the scheduler would close the connection,
        and the same message would go again after reconnecting)."""
        self._undeliverable_listeners.append(listener)

    def _use(self, comm: Comm) -> None:
        """Take the scheduler's limits from a new connection."""
        self.peer_max_frame = comm.peer_max_frame
        comm.on_oversize = self._oversize
        self._connected_at = self.loop.time()

    def _oversize(self, message: Message, size: int) -> None:
        if not self.in_io_thread():  # cut into frames by a thread writing directly
            self.call_soon(self._oversize, message, size)
            return
        why = too_large(f"a {message.get('op')!r} message", size, self.peer_max_frame)
        logger.error("not sent to the scheduler: %s", why)
        for listener in self._undeliverable_listeners:
            listener(message, why)

    def on_resume(self, source: Callable[[], list[Message]]) -> None:
        """On reconnecting, send what ``source()`` gives before anything else (sources in
        the order registered; called with ``lock`` held)."""
        if source not in self._resume_sources:
            self._resume_sources.append(source)

    # ------------------------------------------------------------ sending
    def post(self, message: Message) -> None:
        """Queue a message for the scheduler from any thread; flushed once per loop tick."""
        with self.lock:
            self._outgoing.append(message)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        if threading.get_ident() != self.thread.ident and self._send_from_this_thread():
            return
        if not self.loop.is_closed():  # closed: the message has nowhere to go
            self.loop.call_soon_threadsafe(self.flush)

    def release_later(self, key: str) -> None:
        """Queue a release of ``key`` in order with everything else, without waking the
        loop: it leaves with the next message, or within RELEASE_DELAY. Consecutive
        releases share one message. Called with ``lock`` held (by the future table, which
        drops the key's state under it)."""
        outgoing = self._outgoing
        last = outgoing[-1] if outgoing else None
        if last is not None and last["op"] == "release":
            last["keys"].append(key)
        else:
            outgoing.append({"op": "release", "keys": [key]})

    def _send_from_this_thread(self) -> bool:
        """Write what is outgoing from the calling thread when the connection is idle: no
        wake-up of the I/O thread on the way out. False: the I/O thread must flush."""
        comm = self._comm
        # The comm's lock first, then ours (as in flush): batches leave in the order taken.
        with comm.write_lock:
            with self.lock:
                messages, self._outgoing = self._outgoing, []
                self._flush_scheduled = False
            if comm.send_from_thread(messages):
                return True
            with self.lock:
                self._outgoing[:0] = messages
                if self._flush_scheduled:
                    return True  # another thread has it in hand
                self._flush_scheduled = True
            return False

    def _tick(self) -> None:
        """Send releases left waiting (see release_later); runs on the loop every
        RELEASE_DELAY."""
        if self._outgoing:
            self.flush()
        if not self.closed:
            self.loop.call_later(RELEASE_DELAY, self._tick)

    def flush(self) -> None:
        """Send what is queued now (on the loop thread)."""
        comm = self._comm
        with comm.write_lock:
            with self.lock:
                self._flush_scheduled = False
                if comm.closed:
                    return  # kept for the next scheduler (see _resume)
                messages, self._outgoing = self._outgoing, []
            if messages:
                comm.send_now(messages)  # already batched by post: no need to wait a tick

    # ------------------------------------------------------------ requests
    def new_request_id(self) -> int:
        return next(self._request_ids)

    def start_request(self, message: Message) -> tuple[int, asyncio.Future[Message]]:
        """On the loop: send ``message`` as a request; its id, and the future of its reply."""
        request_id = next(self._request_ids)
        reply: asyncio.Future[Message] = self.loop.create_future()
        self._requests[request_id] = reply
        self.flush()  # what was queued before (e.g. releases) reaches the scheduler first
        self._comm.send({**message, "id": request_id})
        return request_id, reply

    def request(self, message: Message, timeout: float | None = 60.0) -> Message:
        """Send a request and wait for its reply (from any thread but the loop's)."""
        self.check_open()
        reply: Message = self.run(self.request_async(message), timeout)
        return reply

    async def request_async(self, message: Message) -> Message:
        """On the loop: send a request (once connected) and await its reply."""
        await self._connected.wait()  # while reconnecting: until connected, or given up
        self.check_open()
        _, reply = self.start_request(message)
        return await reply

    def _on_reply(self, message: Message) -> None:
        reply = self._requests.pop(message["id"], None)
        if reply is not None and not reply.done():
            reply.set_result(message)

    def _on_error(self, message: Message) -> None:
        self.refused = str(message.get("reason"))
        logger.error("scheduler reported: %s", self.refused)

    # ------------------------------------------------------------ workers
    def note_holder(self, who_has: list[str]) -> None:
        """A worker told the scheduler of a result: connect to it, so that from then on it
        tells this client of results directly (see Worker._tell_clients)."""
        direct = self.direct_workers
        if direct is None or not who_has or who_has[0] in direct:
            return
        direct.add(who_has[0])
        background(self.workers.open(who_has[0]))

    def _on_worker_connection_closed(self, address: str) -> None:
        # Connect again on its next result: a worker restarted at the same address, say.
        if self.direct_workers is not None:
            self.direct_workers.discard(address)

    def _on_worker_left(self, message: Message) -> None:
        # Removed by the scheduler: fetches from it end.
        self.workers.drop(message["address"])

    def _pushed(self, message: Message) -> None:
        handler = self._on_push
        if handler is not None:
            handler(message)

    # ------------------------------------------------------------ reading
    async def _read_loop(self, comm: Comm) -> None:
        try:
            await comm.serve(self._on_frame)
        except (CommClosedError, ProtocolError) as exc:
            reason = f"connection to scheduler {self.address} lost: {exc}"
        except Exception as exc:  # a malformed message
            comm.close()
            reason = f"bad message from scheduler {self.address}: {exc!r}"
        if self.refused is not None:
            self._on_lost(
                f"the scheduler at {self.address} refused this client's messages "
                f"({self.refused}); not reconnecting, as it would refuse them again"
            )
        elif not self.closed:
            await self._reconnect(reason)

    def _on_frame(self, messages: list[Message]) -> None:
        handlers = self._handlers
        for message in messages:
            handler = handlers.get(message["op"])
            if handler is not None:
                handler(message)

    def _on_lost(self, reason: str) -> None:
        if self.closed:
            return
        self.lost = reason
        logger.error(reason)
        for reply in self._requests.values():
            if not reply.done():
                reply.set_exception(SchedulerConnectionError(reason))
        self._requests.clear()
        for listener in self._lost_listeners:
            listener(reason)

    # ------------------------------------------------------------ reconnecting
    async def _reconnect(self, reason: str) -> None:
        """Reconnect after ``reason`` (on the loop), or be lost."""
        timeout = float(config.get("client.reconnect-timeout"))
        logger.warning(
            "%s; reconnecting for up to %gs (client.reconnect-timeout), futures stay pending",
            reason,
            timeout,
        )
        self._connected.clear()
        # A request's reply is lost with the connection: its caller hears so now.
        for reply in self._requests.values():
            if not reply.done():
                reply.set_exception(SchedulerConnectionError(f"{reason}; no reply came"))
        self._requests.clear()
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout
        connected_for = None if self._connected_at is None else started - self._connected_at
        self._backoff = next_reconnect_delay(self._backoff, connected_for)
        if self._backoff:
            await asyncio.sleep(min(self._backoff, timeout))
        delay = FIRST_DELAY
        problem = reason
        while not self.closed:
            left = deadline - loop.time()
            if left <= 0:
                self._on_lost(
                    f"{reason}; no scheduler answered at {self.address} for "
                    f"{timeout:g}s (client.reconnect-timeout); last try: {problem}"
                )
                self._connected.set()  # waiting requests wake, and fail
                return
            try:
                address = await self._current_address()
                comm, _ = await connect(
                    address,
                    "client",
                    self.token,
                    {"client_id": self.id},
                    timeout=min(left, float(config.get("comm.connect-timeout"))),
                )
            except ConnectionRefusedError as exc:
                # A wrong token stays wrong; our id still known to the scheduler does not.
                if "already connected" not in str(exc):
                    self._on_lost(f"{reason}; reconnecting failed: {exc}")
                    self._connected.set()
                    return
                problem = str(exc)
            except OSError as exc:  # ConnectionError from a cluster object too
                problem = str(exc)
            else:
                self.address = address
                if self.closed:
                    comm.close()
                    return
                try:
                    count = self._resume(comm)
                except CommClosedError as exc:  # that scheduler is gone already: try again
                    problem = str(exc)
                    await asyncio.sleep(delay)
                    continue
                except Exception as exc:  # a bug here must not leave futures pending for good
                    logger.exception("re-registering with the new scheduler failed")
                    comm.close()
                    self._on_lost(
                        f"{reason}; re-registering with the new scheduler failed: {exc!r}"
                    )
                    self._connected.set()
                    return
                logger.warning(
                    "reconnected to scheduler %s after %.1fs; re-registered %d tasks",
                    self.address,
                    loop.time() - started,
                    count,
                )
                return
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, MAX_DELAY)

    async def _current_address(self) -> str:
        """The address to try now: a cluster object (KubeCluster) is asked again each time,
        as a new scheduler pod has a new address; a plain address is resolved again by
        connect."""
        cluster = self.cluster
        if cluster is None:
            return self.address
        loop = asyncio.get_running_loop()
        try:
            # It may ask the Kubernetes API: off the event loop.
            return str(await loop.run_in_executor(None, lambda: cluster.scheduler_address))
        except OSError:
            raise
        except Exception as exc:  # the API unreachable for a while, say: one more failed try
            raise OSError(f"cannot look up the scheduler's address: {exc}") from exc

    def _resume(self, comm: Comm) -> int:
        """Send a new scheduler what the resume sources give, then use its connection;
        the number of tasks re-registered."""
        self._use(comm)  # before the sources size their messages to its limit
        with self.lock:
            messages = [message for source in self._resume_sources for message in source()]
        if messages:
            comm.send_now(messages)  # before anything this client sends from now on
        comm.allow_thread_writes()
        self._comm = comm
        self.flush()  # what was submitted or released meanwhile
        background(self._read_loop(comm))
        self._connected.set()
        return sum(len(m["tasks"]) for m in messages if m["op"] == "submit")

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        """Say goodbye to the scheduler, close every connection, stop the loop thread."""
        if self.closed:
            return
        self.closed = True
        if self.in_io_thread():
            # Called from our own I/O thread (a callback, or garbage collection there):
            # waiting on that thread would deadlock, so just stop it.
            self._comm.close()
            self.loop.stop()
            return

        async def shutdown() -> None:
            self.flush()
            if not self._comm.closed:
                with contextlib.suppress(CommClosedError):
                    await self._comm.write([{"op": "close"}])
            self._comm.close()
            self.workers.close()

        with contextlib.suppress(Exception):
            self.run(shutdown(), timeout=5)
        self.stop_thread()

    def kill(self) -> None:
        """Stop without waiting (from a finalizer, which may run on any thread, even
        another client's loop thread): just tell the loop thread to stop."""
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.call_soon_threadsafe(self._comm.close)
            self.loop.call_soon_threadsafe(self.loop.stop)
        except Exception:
            pass  # the loop is already closed, or the interpreter is shutting down
