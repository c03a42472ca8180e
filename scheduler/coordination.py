"""Coordination primitives kept by the scheduler: Variable, Queue, Event, Lock, Semaphore.

A pure state machine like the scheduler's own: a client's ``coord`` request in, replies
out through the state's outbox. Values are opaque bytes (pickled by the client). A request
that must wait (``Queue.get`` on an empty queue, ``Lock.acquire`` on a held lock, ...) is
parked and answered when it can be, or answered ``{"ok": False}`` when its client gives
up (``cancel``: the client's own timeout). Every request is answered exactly once, so a
client never misses a grant made just before it gave up.

Leases (locks and semaphores) belong to the client that took them: when that client
disconnects they are released, so a crashed holder never blocks the others for good.
After a scheduler restart, reconnecting clients restore the leases they hold and the
events they set (``lease-restore``, ``event-set``); variables and queues start empty.

A value may hold futures (``Variable("v").set(future)``, a queue of futures, a published
dataset): its message names their keys, and the results stay on the cluster while a
variable, queue or dataset holds them (``hold``), and are held for the client that takes
the value before it is answered, so that nothing is forgotten between the two (``hold``
with that client; the client releases them as it drops its futures).

Published datasets (``Client.publish_dataset``) are named values of their own, kept apart
from variables: publishing a name that exists is refused unless asked to override.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
Send = Callable[[str, Message], None]
# hold(wanter, keys) / release(wanter, keys): keep results on the cluster for a wanter.
Hold = Callable[[str, list[str]], None]
# The wanter of the results held by variables, queues and datasets (counted here per key).
HOLDER = "coordination"


@dataclass(frozen=True)
class _Value:
    """A value as the client pickled it, and the keys of the futures inside."""

    data: Any
    keys: tuple[str, ...] = ()

    @classmethod
    def of(cls, message: Message) -> _Value:
        keys = message.get("keys") or ()
        if not isinstance(keys, (list, tuple)) or not all(type(k) is str for k in keys):
            raise CoordinationError(f"'keys' must be a list of keys, got {keys!r}")
        return cls(message["value"], tuple(keys))


@dataclass
class _Waiter:
    client: str
    request_id: int
    action: str
    message: Message


@dataclass
class _Semaphore:
    max_leases: int
    # Leases held, per client (a client may hold several).
    holders: dict[str, int] = field(default_factory=dict)
    waiting: deque[_Waiter] = field(default_factory=deque)

    def held(self) -> int:
        return sum(self.holders.values())


class CoordinationError(ValueError):
    """A request that cannot be done (wrong kind of name, bad limit): answered as an error."""


def _ignore(wanter: str, keys: list[str]) -> None:
    pass


class Coordination:
    def __init__(self, send: Send, hold: Hold = _ignore, release: Hold = _ignore) -> None:
        self._send = send
        self._hold = hold
        self._release = release
        # How many held values hold each key (HOLDER wants it while above zero).
        self.held: dict[str, int] = {}
        self.variables: dict[str, _Value] = {}
        self.queues: dict[str, deque[_Value]] = {}
        self.datasets: dict[str, _Value] = {}
        self.events: set[str] = set()
        self.semaphores: dict[str, _Semaphore] = {}
        # Parked requests by name (variables, queues, events), and by (client, id).
        self.waiting: dict[tuple[str, str], deque[_Waiter]] = {}
        self.parked: dict[tuple[str, int], tuple[str, str]] = {}

    # ------------------------------------------------------------------ entry
    def handle(self, client: str, message: Message) -> None:
        action = str(message.get("action"))
        request_id = message["id"]
        handler = getattr(self, "_on_" + action.replace("-", "_"), None)
        if handler is None:
            self._reply(client, request_id, error=f"unknown coordination action {action!r}")
            return
        try:
            handler(_Waiter(client, request_id, action, message))
        except (CoordinationError, KeyError, TypeError, ValueError) as exc:
            self._reply(client, request_id, error=str(exc))

    def client_left(self, client: str) -> None:
        """Drop the client's parked requests and give back its leases."""
        for key in [k for k in self.parked if k[0] == client]:
            self._unpark(key)
        for name, sem in list(self.semaphores.items()):
            if sem.holders.pop(client, None):
                self._grant_leases(name, sem)
            sem.waiting = deque(w for w in sem.waiting if w.client != client)

    # ---------------------------------------------------------- held results
    def _keep(self, value: _Value) -> _Value:
        new = [k for k in value.keys if k not in self.held]
        for key in value.keys:
            self.held[key] = self.held.get(key, 0) + 1
        if new:
            self._hold(HOLDER, new)
        return value

    def _drop(self, value: _Value | None) -> None:
        if value is None or not value.keys:
            return
        gone = []
        for key in value.keys:
            count = self.held.get(key, 0) - 1
            if count > 0:
                self.held[key] = count
            else:
                self.held.pop(key, None)
                gone.append(key)
        if gone:
            self._release(HOLDER, gone)

    def _answer(self, client: str, request_id: int, value: _Value) -> None:
        """Reply with a value; its results are held for ``client`` first."""
        if value.keys:
            self._hold(client, list(value.keys))
            self._reply(client, request_id, value=value.data, keys=list(value.keys))
        else:
            self._reply(client, request_id, value=value.data)

    # --------------------------------------------------------------- variables
    def _on_variable_set(self, w: _Waiter) -> None:
        name = _name(w.message)
        value = self._keep(_Value.of(w.message))
        self._drop(self.variables.get(name))
        self.variables[name] = value
        self._reply(w.client, w.request_id)
        for waiter in self._take_waiters("variable", name):
            self._answer(waiter.client, waiter.request_id, value)

    def _on_variable_get(self, w: _Waiter) -> None:
        name = _name(w.message)
        if name in self.variables:
            self._answer(w.client, w.request_id, self.variables[name])
        else:
            self._park("variable", name, w)

    def _on_variable_delete(self, w: _Waiter) -> None:
        self._drop(self.variables.pop(_name(w.message), None))
        self._reply(w.client, w.request_id)

    # ---------------------------------------------------------------- datasets
    def _on_dataset_publish(self, w: _Waiter) -> None:
        name = _name(w.message)
        if name in self.datasets and not w.message.get("override"):
            raise CoordinationError(
                f"a dataset named {name!r} is already published: unpublish it first, or "
                "publish with override=True"
            )
        value = self._keep(_Value.of(w.message))
        self._drop(self.datasets.get(name))
        self.datasets[name] = value
        self._reply(w.client, w.request_id)
        for waiter in self._take_waiters("dataset", name):
            self._answer(waiter.client, waiter.request_id, value)

    def _on_dataset_get(self, w: _Waiter) -> None:
        """The dataset; a missing one is answered ``found: False`` at once, unless the
        request asks to wait for it (``wait``: Dask's ``get_dataset(name, timeout=...)``)."""
        name = _name(w.message)
        if name in self.datasets:
            self._answer(w.client, w.request_id, self.datasets[name])
        elif w.message.get("wait"):
            self._park("dataset", name, w)
        else:
            self._reply(w.client, w.request_id, found=False)

    def _on_dataset_delete(self, w: _Waiter) -> None:
        name = _name(w.message)
        if name not in self.datasets:
            raise CoordinationError(f"no dataset named {name!r} is published")
        self._drop(self.datasets.pop(name))
        self._reply(w.client, w.request_id)

    def _on_dataset_list(self, w: _Waiter) -> None:
        self._reply(w.client, w.request_id, names=sorted(self.datasets))

    # ------------------------------------------------------------------ queues
    def _on_queue_put(self, w: _Waiter) -> None:
        name = _name(w.message)
        queue = self.queues.setdefault(name, deque())
        queue.append(self._keep(_Value.of(w.message)))
        self._reply(w.client, w.request_id)
        self._serve_queue(name)

    def _on_queue_get(self, w: _Waiter) -> None:
        name = _name(w.message)
        queue = self.queues.get(name)
        if w.message.get("batch"):
            items = list(queue or ())
            if queue:
                queue.clear()
            keys = [k for item in items for k in item.keys]
            if keys:
                self._hold(w.client, keys)
            self._reply(
                w.client,
                w.request_id,
                values=[i.data for i in items],
                keys=[list(i.keys) for i in items],
            )
            for item in items:
                self._drop(item)
        elif queue:
            self._take_item(w.client, w.request_id, queue.popleft())
        else:
            self._park("queue", name, w)

    def _take_item(self, client: str, request_id: int, item: _Value) -> None:
        self._answer(client, request_id, item)
        self._drop(item)

    def _on_queue_size(self, w: _Waiter) -> None:
        self._reply(w.client, w.request_id, size=len(self.queues.get(_name(w.message), ())))

    def _serve_queue(self, name: str) -> None:
        queue = self.queues.get(name)
        waiters = self.waiting.get(("queue", name))
        while queue and waiters:
            waiter = waiters.popleft()
            del self.parked[(waiter.client, waiter.request_id)]
            self._take_item(waiter.client, waiter.request_id, queue.popleft())
        if waiters is not None and not waiters:
            del self.waiting[("queue", name)]

    # ------------------------------------------------------------------ events
    def _on_event_set(self, w: _Waiter) -> None:
        name = _name(w.message)
        self.events.add(name)
        self._reply(w.client, w.request_id)
        for waiter in self._take_waiters("event", name):
            self._reply(waiter.client, waiter.request_id, value=True)

    def _on_event_clear(self, w: _Waiter) -> None:
        self.events.discard(_name(w.message))
        self._reply(w.client, w.request_id)

    def _on_event_is_set(self, w: _Waiter) -> None:
        self._reply(w.client, w.request_id, value=_name(w.message) in self.events)

    def _on_event_wait(self, w: _Waiter) -> None:
        name = _name(w.message)
        if name in self.events:
            self._reply(w.client, w.request_id, value=True)
        else:
            self._park("event", name, w)

    # ------------------------------------------------------ locks and semaphores
    def _semaphore(self, message: Message) -> tuple[str, _Semaphore]:
        name = _name(message)
        limit = message.get("max_leases", 1)
        if type(limit) is not int or limit < 1:
            raise CoordinationError(f"max_leases must be a whole number >= 1, got {limit!r}")
        sem = self.semaphores.get(name)
        if sem is None:
            sem = self.semaphores[name] = _Semaphore(limit)
        elif sem.max_leases != limit:
            raise CoordinationError(
                f"semaphore {name!r} exists with max_leases={sem.max_leases}, not {limit}: "
                "every user of one name must give the same limit"
            )
        return name, sem

    def _on_lease_acquire(self, w: _Waiter) -> None:
        name, sem = self._semaphore(w.message)
        if sem.held() < sem.max_leases and not sem.waiting:
            sem.holders[w.client] = sem.holders.get(w.client, 0) + 1
            self._reply(w.client, w.request_id, value=True)
        elif w.message.get("blocking", True):
            sem.waiting.append(w)
            self.parked[(w.client, w.request_id)] = ("lease", name)
        else:
            self._reply(w.client, w.request_id, value=False)

    def _on_lease_release(self, w: _Waiter) -> None:
        name, sem = self._semaphore(w.message)
        if not sem.holders.get(w.client):
            raise CoordinationError(
                f"{'lock' if sem.max_leases == 1 else 'semaphore'} {name!r} released by a "
                "client that does not hold it"
            )
        sem.holders[w.client] -= 1
        if not sem.holders[w.client]:
            del sem.holders[w.client]
        self._reply(w.client, w.request_id)
        self._grant_leases(name, sem)

    def _on_lease_restore(self, w: _Waiter) -> None:
        """A client reconnecting after a scheduler restart still holds ``count`` leases:
        booked as they are, even beyond the limit (then others wait until it is below)."""
        name = _name(w.message)
        count = w.message.get("count")
        if type(count) is not int or count < 1:
            raise CoordinationError(f"count must be a whole number >= 1, got {count!r}")
        sem = self.semaphores.get(name)
        if sem is None:
            _, sem = self._semaphore(w.message)
        sem.holders[w.client] = sem.holders.get(w.client, 0) + count
        self._reply(w.client, w.request_id)

    def _on_lease_count(self, w: _Waiter) -> None:
        _, sem = self._semaphore(w.message)
        self._reply(w.client, w.request_id, value=sem.held())

    def _grant_leases(self, name: str, sem: _Semaphore) -> None:
        while sem.waiting and sem.held() < sem.max_leases:
            waiter = sem.waiting.popleft()
            self.parked.pop((waiter.client, waiter.request_id), None)
            sem.holders[waiter.client] = sem.holders.get(waiter.client, 0) + 1
            self._reply(waiter.client, waiter.request_id, value=True)

    # ------------------------------------------------------------------ waiting
    def _on_cancel(self, w: _Waiter) -> None:
        """The client stopped waiting for request ``wait_id``: answer it, if still parked."""
        key = (w.client, int(w.message["wait_id"]))
        if key in self.parked:
            self._unpark(key)
            self._reply(w.client, key[1], ok=False)
        self._reply(w.client, w.request_id)

    def _park(self, kind: str, name: str, w: _Waiter) -> None:
        self.waiting.setdefault((kind, name), deque()).append(w)
        self.parked[(w.client, w.request_id)] = (kind, name)

    def _unpark(self, key: tuple[str, int]) -> None:
        kind, name = self.parked.pop(key)
        if kind == "lease":
            sem = self.semaphores[name]
            sem.waiting = deque(x for x in sem.waiting if (x.client, x.request_id) != key)
            return
        waiters = self.waiting.get((kind, name))
        if waiters is not None:
            self.waiting[(kind, name)] = deque(
                x for x in waiters if (x.client, x.request_id) != key
            )
            if not self.waiting[(kind, name)]:
                del self.waiting[(kind, name)]

    def _take_waiters(self, kind: str, name: str) -> list[_Waiter]:
        waiters = list(self.waiting.pop((kind, name), ()))
        for waiter in waiters:
            del self.parked[(waiter.client, waiter.request_id)]
        return waiters

    def _reply(self, client: str, request_id: int, ok: bool = True, **fields: Any) -> None:
        if "error" in fields:
            ok = False
        self._send(client, {"op": "coord-reply", "id": request_id, "ok": ok, **fields})


def _name(message: Message) -> str:
    name = message.get("name")
    if not isinstance(name, str) or not name:
        raise CoordinationError(f"a coordination name must be a non-empty string, got {name!r}")
    return name
