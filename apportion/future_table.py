"""What one client knows of its keys: a ``FutureState`` per key, how many of its
``Future`` objects hold each, their lineage, and fetching their results.

The table takes the scheduler's word on its states (handlers on the session's read loop),
releases a key once its last Future is dropped, gives a new scheduler the tasks still
wanted after a reconnect (apportion/lineage.py), and fetches finished results from the
workers holding them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FetchTimeout
from typing import Any

from apportion import config, lineage, shared_memory
from apportion.errors import CancelledError, FrameTooLargeError, SchedulerConnectionError
from apportion.futures import Future, FutureState, collect_futures, rebuild, wait_state
from apportion.protocol import CommClosedError, Message
from apportion.serialize import dumps_exception
from apportion.session import Session, split_submission, task_bytes_limit

logger = logging.getLogger("apportion.client")

# Holders whose who_has lists are shared at most (workers come and go: forgotten past it).
MAX_SHARED_HOLDERS = 1024


def holder_unreachable(address: str, exc: BaseException) -> SchedulerConnectionError:
    """The error of a fetch whose holder's connection failed (fetch_missing waits for the
    result to be made again, or raises it)."""
    return SchedulerConnectionError(f"could not fetch results from worker {address}: {exc}")


class FutureTable:
    """The states of one client's keys; see the module's docstring.

    ``states`` and each state's ``refs`` (how many Futures hold it) are guarded by
    ``lock`` (the session's). A key is in ``states`` while a Future holds its state."""

    def __init__(self, session: Session, client: Any) -> None:
        self.session = session
        # The facade (Client or AsyncClient) the futures made here belong to.
        self.client = client
        self.lock = session.lock
        self.states: dict[str, FutureState] = {}
        # Impure keys: a random prefix per client and a counter (no uuid4 per task).
        self.key_prefix = uuid.uuid4().hex[:20]
        self.key_counter = itertools.count()
        # Each sole holder's who_has list, shared by its results (see _holders).
        self._sole_holders: dict[str, list[str]] = {}
        # Called with a key's state when the key is released while connected (set by
        # whoever must hear of it: the client's stored arguments).
        self.on_forget: Callable[[str, FutureState | None], None] | None = None
        session.on("task-finished", self._finished)
        session.on("task-erred", self._erred)
        session.on("task-cancelled", self._cancelled)
        session.on("task-lost", self._lost)
        session.on("who-has", self._who_has)
        session.on_push(self._pushed)
        session.on_lost(self._cancel_pending)
        session.on_resume(self.re_registration)
        session.on_undeliverable(self._undeliverable)

    def unique_token(self) -> str:
        """A token no other key of this client has (for impure keys)."""
        return f"{self.key_prefix}{next(self.key_counter):012x}"

    # ------------------------------------------------------------ futures
    def future(self, key: str) -> Future:
        """A future of ``key``: of its state here, or of a new one."""
        with self.lock:
            state = self.states.get(key)
            if state is None or state.status == "cancelled":
                state = self.states[key] = FutureState(key)
            return Future(key, self.client, state)

    def known(self, key: str) -> FutureState | None:
        """The state of ``key`` unless there is none or it was cancelled."""
        with self.lock:
            state = self.states.get(key)
        return state if state is not None and state.status != "cancelled" else None

    def retain(self, state: FutureState) -> None:
        with self.lock:
            state.refs += 1

    def release(self, state: FutureState) -> None:
        """One Future of ``state`` is gone; the last one releases its key on the scheduler
        (unless the key has a state of its own since: the cancelled one was replaced)."""
        with self.lock:
            state.refs -= 1
            if state.refs > 0:
                return
            key = state.key
            if self.states.get(key) is not state:
                return
            del self.states[key]
            session = self.session
            if session.closed or session.lost:
                return
            if self.on_forget is not None:
                self.on_forget(key, state)
            session.release_later(key)

    def attach_lineage(self, specs: list[Message]) -> set[str]:
        """Give lineage to states made without ``Client.submit`` (see lineage.attach);
        returns the keys held by futures now."""
        with self.lock:
            lineage.attach(self.states, specs)
            return set(self.states)

    def re_registration(self) -> list[Message]:
        """What a new scheduler hears first: the tasks this client still wants, with the
        tasks they are computed from (called with ``lock`` held)."""
        specs, lineage_only = lineage.re_registration(list(self.states.values()))
        messages: list[Message] = [
            {"op": "submit", "tasks": batch, "recover": True}
            for batch in split_submission(specs, task_bytes_limit(self.session.peer_max_frame) // 2)
            if batch
        ]
        if lineage_only:  # registered for their dependents' sake only
            messages.append({"op": "release", "keys": lineage_only, "recover": True})
        return messages

    # ------------------------------------------------------------ the scheduler's word
    # On the session's loop thread, for every task: kept to a lookup and a call.
    def _finished(self, message: Message) -> None:
        state = self.states.get(message.get("key", ""))
        who_has = self._holders(message["who_has"])
        if state is not None:
            state.finish(who_has, message.get("data"))
        self.session.note_holder(who_has)

    def _holders(self, who_has: list[str]) -> list[str]:
        """``who_has`` as one list shared by every result of the same sole holder: each
        message decodes a list and an address of its own, which a finished state would
        otherwise keep (about 130 bytes a future). States replace the list, never change it."""
        if len(who_has) != 1:
            return who_has
        shared = self._sole_holders.get(who_has[0])
        if shared is not None:
            return shared
        if len(self._sole_holders) >= MAX_SHARED_HOLDERS:
            self._sole_holders.clear()
        self._sole_holders[who_has[0]] = who_has
        return who_has

    def _erred(self, message: Message) -> None:
        state = self.states.get(message.get("key", ""))
        if state is not None:
            state.fail(message["exception"], message.get("traceback") or "")

    def _cancelled(self, message: Message) -> None:
        state = self.states.get(message.get("key", ""))
        if state is not None:
            reason = message.get("reason")
            state.cancel(CancelledError(f"task {state.key!r}: {reason}") if reason else None)

    def _lost(self, message: Message) -> None:
        state = self.states.get(message.get("key", ""))
        if state is not None:
            state.lose()

    def _who_has(self, message: Message) -> None:
        # A copy was made (its holder is retiring): fetch from there.
        state = self.states.get(message.get("key", ""))
        if state is not None:
            state.who_has = list(message["who_has"])

    def _pushed(self, message: Message) -> None:
        """A worker tells us of a result. The scheduler has not yet heard of it, and may
        have told us something since (an error, a cancellation): only a pending state
        takes it."""
        if message.get("op") != "task-finished":
            logger.warning("ignoring unexpected message from a worker: %r", message.get("op"))
            return
        state = self.states.get(message.get("key", ""))
        if state is not None and not state.is_done():
            state.finish(self._holders(message["who_has"]), message.get("data"))

    def _undeliverable(self, message: Message, why: str) -> None:
        """A submission too large for the scheduler's frames: its tasks fail with why."""
        if message.get("op") != "submit":
            return
        error, text = dumps_exception(FrameTooLargeError(why))
        for spec in message.get("tasks", ()):
            state = self.states.get(spec.get("key", ""))
            if state is not None and not state.is_done():
                state.fail(error, text)

    def _cancel_pending(self, reason: str) -> None:
        for state in list(self.states.values()):
            if not state.is_done():
                state.cancel(SchedulerConnectionError(reason))

    # ------------------------------------------------------------ results
    def gather(self, futures: Any, errors: str = "raise") -> Any:
        """Results of futures, in the same structure (a future, list, tuple, dict, nesting)."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
        flat = collect_futures(futures)
        for future in reversed(flat):  # the last first: see futures._wait
            future._wait(None)
        missing = [f for f in flat if f.status == "finished" and not f._state.has_value()]
        if missing:
            self.fetch_missing(missing)
        skipped = object()

        def resolve(future: Future) -> Any:
            if future.status == "finished":
                return self.value_of(future)
            if errors == "skip":
                return skipped
            raise future._exception()

        return rebuild(futures, resolve, skipped)

    async def gather_async(self, futures: Any, errors: str = "raise") -> Any:
        """``gather`` awaited in the caller's running loop (never blocking it)."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
        flat = collect_futures(futures)
        for future in reversed(flat):  # the last first: see futures._wait
            await wait_state(future._state)
        missing = [f for f in flat if f.status == "finished" and not f._state.has_value()]
        if missing:
            await asyncio.wrap_future(self.session.start(self.fetch(missing)))
        skipped = object()

        def resolve(future: Future) -> Any:
            if future.status == "finished":
                return future._state.value()
            if errors == "skip":
                return skipped
            raise future._exception()

        return rebuild(futures, resolve, skipped)

    def value_of(self, future: Future, deadline: float | None = None) -> Any:
        """The result of a finished future, fetched if not here yet."""
        state = future._state
        if not state.has_value():
            self.fetch_missing([future], deadline)
            if state.status != "finished":  # lost, and failed when made again
                raise future._exception()
        return state.value()

    async def result_async(self, future: Future) -> Any:
        """``await future``: its result, fetched without blocking the running loop."""
        await wait_state(future._state)
        if future._state.status != "finished":
            raise future._exception()
        if not future._state.has_value():
            await asyncio.wrap_future(self.session.start(self.fetch([future])))
        return future._state.value()

    def fetch_missing(self, futures: list[Future], deadline: float | None = None) -> None:
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
                if not self._fetch_here(missing, left()):
                    self.session.run(self.fetch(missing), left())
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
                if not again or self.session.lost:
                    raise
                for future in again:
                    future._wait(left())
                futures = [f for f in futures if f._state.status == "finished"]

    def _fetch_here(self, futures: list[Future], timeout: float | None) -> bool:
        """Fetch finished futures' values from the calling thread when they all live on one
        worker whose connection is open and idle: the request leaves at once, without
        waking the I/O thread first (it only reads the reply). False, with nothing sent:
        fetch on the loop (``fetch``)."""
        holders = {f._state.who_has[0] if f._state.who_has else "" for f in futures}
        if len(holders) != 1 or "" in holders:
            return False
        (address,) = holders
        host = shared_memory.host_identity() if config.get("worker.shared-memory") else ""
        pool = self.session.workers
        keys = [f.key for f in futures]
        asked = pool.request_from_thread(address, shared_memory.data_request(keys, host))
        if asked is None:
            return False
        try:
            payloads, segments, unmapped = shared_memory.read_data_reply(asked.result(timeout))
            if unmapped:  # described in shared memory, but not to be mapped here: as bytes
                again = shared_memory.data_request(unmapped, "")
                payloads.update(self.session.run(pool.request(address, again), timeout)["data"])
        except (TimeoutError, FetchTimeout):
            raise  # (an OSError too: not a lost connection)
        except (OSError, CommClosedError) as exc:
            raise holder_unreachable(address, exc) from exc
        self._store(address, [f._state for f in futures], payloads, segments)
        return True

    def _store(
        self,
        address: str,
        states: list[FutureState],
        payloads: dict[str, Any],
        segments: dict[str, shared_memory.Segment],
    ) -> None:
        """Keep the values fetched from ``address`` in their states."""
        for segment in segments.values():
            segment.close_descriptor()  # the mapping is enough here: never shared on
        for state in states:
            data: Any = payloads.get(state.key)  # a Pickled or bytes
            if data is None:
                raise self._gone(state.key, f"worker {address} no longer holds")
            state.store(data)

    async def fetch(self, futures: list[Future]) -> None:
        """On the loop: fetch the results of finished futures from the workers holding them."""
        by_worker: dict[str, list[FutureState]] = {}
        for future in futures:
            state = future._state
            if not state.who_has:
                raise self._gone(future.key, "no worker holds the result of")
            by_worker.setdefault(state.who_has[0], []).append(state)

        # A worker on this host hands over large results as shared memory to map.
        host = shared_memory.host_identity() if config.get("worker.shared-memory") else ""
        pool = self.session.workers

        async def fetch_from(address: str, states: list[FutureState]) -> None:
            try:
                payloads, segments = await shared_memory.get_data(
                    lambda message: pool.request(address, message),
                    [s.key for s in states],
                    host,
                )
            except (OSError, CommClosedError) as exc:
                raise holder_unreachable(address, exc) from exc
            self._store(address, states, payloads, segments)

        if len(by_worker) == 1:  # the usual case: no task of its own, one loop pass fewer
            await fetch_from(*next(iter(by_worker.items())))
        else:
            await asyncio.gather(*(fetch_from(a, s) for a, s in by_worker.items()))

    def _gone(self, key: str, problem: str) -> Exception:
        """The error for a result no worker serves: after the scheduler was lost for good,
        that loss is named (no scheduler is there to have it recomputed)."""
        lost = self.session.lost
        if lost:
            return SchedulerConnectionError(
                f"{lost}; the result of {key!r} had not been fetched, and no scheduler "
                "is left to recompute it"
            )
        return LookupError(f"{problem} {key!r}")
