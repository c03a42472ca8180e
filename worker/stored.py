"""Large task arguments a client put on this worker itself, not through the scheduler.

A client submitting a task with a large argument stores that argument here first
(``put-data`` on its connection to this worker), then submits a small task of the same
key, restricted to this worker, whose function (``stored_argument``) takes the value out
of this store: from then on it is an ordinary result, held, served to peers and freed by
the scheduler like any other. A client may put the value under a name of its own first and
give it its key afterwards (``name-data``, on the same connection): it sends the value while
it computes the key, a hash of its bytes. A value nobody takes is dropped when the client says so
(its future was released) or when the client's connection to this worker ends.
"""

from __future__ import annotations

import threading
from typing import Any

from apportion.core.stored import stored_argument as stored_argument
from apportion.core.stored import stores


class StoredArguments:
    """Values put by clients, waiting for their task; thread-safe (task threads take)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[Any, object]] = {}

    def put(self, key: str, value: Any, owner: object) -> None:
        with self._lock:
            self._values[key] = (value, owner)

    def take(self, key: str) -> Any:
        with self._lock:
            entry = self._values.pop(key, None)
        if entry is None:
            raise LookupError(
                f"the argument stored as {key!r} is no longer on this worker (its worker "
                "restarted or left, or the client that stored it disconnected): submit the "
                "task again"
            )
        return entry[0]

    def rename(self, old: str, new: str) -> bool:
        """The value put as ``old`` is kept as ``new`` from now on; False when there is no
        ``old`` (dropped: its client's connection ended)."""
        with self._lock:
            entry = self._values.pop(old, None)
            if entry is not None:
                self._values[new] = entry
        return entry is not None

    def drop(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._values.pop(key, None)

    def drop_from(self, owner: object) -> None:
        """What ``owner`` (a client connection) put and no task took."""
        with self._lock:
            for key in [k for k, (_, o) in self._values.items() if o is owner]:
                del self._values[key]

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._values)


def waiting_keys() -> list[str]:
    """Keys put on this process's workers that no task took yet (for ``client.run``)."""
    return [key for store in list(stores.values()) for key in store.keys()]
