"""The task that turns a large argument a client put on a worker into a result there.

The client names this function in the small task it submits for a stored argument; the
worker keeps the values (worker/stored.py) and registers its store here, by its address,
so that the function finds it when it runs on that worker.
"""

from __future__ import annotations

from typing import Any, Protocol

from apportion.core.context import get_worker


class Store(Protocol):
    def take(self, key: str) -> Any: ...

    def keys(self) -> list[str]: ...


# Each worker's store, by address: the task function finds its worker's store here.
stores: dict[str, Store] = {}


def stored_argument(key: str) -> Any:
    """The task that turns a stored argument into a result held by this worker."""
    store = stores.get(get_worker().address)
    if store is None:
        raise LookupError(f"no argument is stored on this worker for {key!r}")
    return store.take(key)
