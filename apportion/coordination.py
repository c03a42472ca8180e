"""Coordination primitives on the scheduler: ``Variable``, ``Queue``, ``Event``, ``Lock``,
``Semaphore`` (as in dask.distributed; the scheduler's side is scheduler/coordination.py).

Objects of the same name, made by any client or task, share one state on the scheduler.
Values are pickled (anything a task may return), futures included: a future set in a
variable or put in a queue keeps its result on the cluster until the value is replaced,
deleted or taken, and whoever gets the value gets a future of its own
(apportion/datasets.py). A waiting call with a ``timeout`` gives up after it:
``Queue.get`` and ``Variable.get`` then raise ``TimeoutError``; ``Event.wait``,
``Lock.acquire`` and ``Semaphore.acquire`` return False. Leases (locks, semaphores)
belong to the client that took them and are released if it disconnects. After a
scheduler restart the client gives the new scheduler back the leases it holds and the
events it set; variables and queues start empty there.

A Semaphore and a resource are different limits (see the README's "Coming from Dask"):
``resources={"license": 1}`` is counted per worker by the scheduler *before* a task
starts, so no thread waits; ``Semaphore(4, "license")`` is cluster-wide and taken by code
that is already running (inside a task it holds that task's thread and resources while it
waits, unless the task secedes).
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from apportion.client import Client
from apportion.datasets import CoordinationError, ask, pack, unpack
from apportion.default_client import default_client
from apportion.session import Session

Message = dict[str, Any]

__all__ = ["CoordinationError", "Event", "Lock", "Queue", "Semaphore", "Variable"]


# What each session holds here, for a new scheduler after a restart (restored_messages):
# leases by name (max_leases, count), and the events it set last. Weak: a session gone
# takes its books with it.
_leases: weakref.WeakKeyDictionary[Session, dict[str, tuple[int, int]]] = (
    weakref.WeakKeyDictionary()
)
_events: weakref.WeakKeyDictionary[Session, set[str]] = weakref.WeakKeyDictionary()


def _count_lease(session: Session, name: str, max_leases: int, delta: int) -> None:
    _resume_with_books(session)
    held = _leases.setdefault(session, {})
    count = held.get(name, (max_leases, 0))[1] + delta
    if count > 0:
        held[name] = (max_leases, count)
    else:
        held.pop(name, None)


def _resume_with_books(session: Session) -> None:
    """Have ``session`` give a new scheduler its leases and events when it reconnects."""
    if session not in _leases and session not in _events:
        session.on_resume(lambda: restored_messages(session))


def restored_messages(session: Session) -> list[Message]:
    """The requests that give a new scheduler the leases ``session`` holds and the events
    it set (sent first when it reconnects)."""
    messages: list[Message] = [
        {
            "op": "coord",
            "action": "lease-restore",
            "name": name,
            "max_leases": limit,
            "count": count,
            "id": session.new_request_id(),
        }
        for name, (limit, count) in _leases.get(session, {}).items()
    ]
    messages.extend(
        {"op": "coord", "action": "event-set", "name": name, "id": session.new_request_id()}
        for name in sorted(_events.get(session, ()))
    )
    return messages


class _Primitive:
    kind = ""

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        self.name = name or f"{self.kind}-{uuid.uuid4().hex}"
        self.client = client if client is not None else default_client()
        self.session = self.client.session

    def _call(self, action: str, timeout: float | None = None, **fields: Any) -> Message:
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
        message = {"action": action, "name": self.name, **fields}
        session = self.session
        session.check_open()
        reply: Message = session.run(ask(session, message, timeout))
        if "error" in reply:
            raise CoordinationError(reply["error"])
        return reply

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name}>"

    def __reduce__(self) -> Any:
        # Passed to a task, it names the same state there (with the worker's client).
        return (type(self)._rebuild, (self.name, self._state()))

    def _state(self) -> Any:
        return None

    @classmethod
    def _rebuild(cls, name: str, state: Any) -> Any:
        return cls(name=name)


class Variable(_Primitive):
    """A named value: ``set`` by one, ``get`` by any (``get`` waits until it is set)."""

    kind = "variable"

    def set(self, value: Any) -> None:
        self._call("variable-set", **pack(value))

    def get(self, timeout: float | None = None) -> Any:
        reply = self._call("variable-get", timeout)
        if not reply["ok"]:
            raise TimeoutError(f"variable {self.name!r} not set within {timeout}s")
        return unpack(self.client.future_table, reply["value"], reply.get("keys"))

    def delete(self) -> None:
        self._call("variable-delete")


class Queue(_Primitive):
    """A named first-in first-out queue shared by clients and tasks."""

    kind = "queue"

    def put(self, value: Any, timeout: float | None = None) -> None:
        self._call("queue-put", **pack(value))

    def get(self, timeout: float | None = None, batch: bool = False) -> Any:
        """The next item (waiting for one), or with ``batch`` every item there now."""
        reply = self._call("queue-get", None if batch else timeout, batch=batch)
        if not reply["ok"]:
            raise TimeoutError(f"queue {self.name!r} stayed empty for {timeout}s")
        table = self.client.future_table
        if batch:
            keys = reply.get("keys") or [None] * len(reply["values"])
            return [unpack(table, v, k) for v, k in zip(reply["values"], keys, strict=True)]
        return unpack(table, reply["value"], reply.get("keys"))

    def qsize(self) -> int:
        return int(self._call("queue-size")["size"])


class Event(_Primitive):
    """A named flag: ``wait`` until some client or task ``set``s it."""

    kind = "event"

    def set(self) -> None:
        self._call("event-set")
        _resume_with_books(self.session)
        _events.setdefault(self.session, set()).add(self.name)

    def clear(self) -> None:
        self._call("event-clear")
        for names in _events.values():  # whoever set it: cleared for all
            names.discard(self.name)

    def is_set(self) -> bool:
        return bool(self._call("event-is-set")["value"])

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._call("event-wait", timeout).get("value", False))


class Semaphore(_Primitive):
    """At most ``max_leases`` holders at once, cluster-wide (every user of a name must give
    the same ``max_leases``)."""

    kind = "semaphore"

    def __init__(
        self, max_leases: int = 1, name: str | None = None, client: Client | None = None
    ) -> None:
        if type(max_leases) is not int or max_leases < 1:
            raise ValueError(f"max_leases must be a whole number >= 1, got {max_leases!r}")
        self.max_leases = max_leases
        super().__init__(name, client)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take a lease, waiting (up to ``timeout``) while all are taken; False if none."""
        reply = self._call("lease-acquire", timeout, max_leases=self.max_leases, blocking=blocking)
        if reply.get("value", False):
            _count_lease(self.session, self.name, self.max_leases, +1)
            return True
        return False

    def release(self) -> None:
        self._call("lease-release", max_leases=self.max_leases)
        _count_lease(self.session, self.name, self.max_leases, -1)

    def get_value(self) -> int:
        """How many leases are taken now."""
        return int(self._call("lease-count", max_leases=self.max_leases)["value"])

    def close(self) -> None:
        """Give back every lease this client holds on it (as disconnecting would); using it
        again after this is allowed, as Dask's is until its scheduler forgets it."""
        held = _leases.get(self.session, {}).get(self.name, (self.max_leases, 0))[1]
        for _ in range(held):
            self.release()

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _state(self) -> Any:
        return self.max_leases

    @classmethod
    def _rebuild(cls, name: str, state: Any) -> Any:
        return cls(state, name=name)


class Lock(Semaphore):
    """A named mutual-exclusion lock (a semaphore with one lease)."""

    kind = "lock"

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        super().__init__(1, name, client)

    def locked(self) -> bool:
        return self.get_value() > 0

    @classmethod
    def _rebuild(cls, name: str, state: Any) -> Any:
        return cls(name=name)
