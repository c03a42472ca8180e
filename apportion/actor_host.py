"""The worker's side of actors (``client.submit(cls, actor=True)``; the proxy is
apportion/actors.py): the objects living on this worker, made and called by tasks.

The object lives as long as the result of the task that made it: the worker holds a
handle (``Held``) that owns it, found here through a weak reference, so the object goes
when the worker drops that result (the last future and proxy of it dropped). A method runs
as a task pinned to the worker, one at a time per actor (a lock: Dask too runs an actor's
methods one at a time).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from apportion.core.context import current_task_key, get_worker

# The objects of the actors this worker holds, by key (owned by their handles).
_objects: weakref.WeakValueDictionary[str, Held] = weakref.WeakValueDictionary()
# Makes a proxy (apportion/actors.py registers its Actor: it needs a client, this must not).
_proxy_factory: Callable[[str, str, str], Any] | None = None


def set_proxy_factory(factory: Callable[[str, str, str], Any]) -> None:
    global _proxy_factory
    _proxy_factory = factory


def proxy(cls_name: str, key: str, address: str) -> Any:
    """A handle unpickled: the proxy of its actor."""
    if _proxy_factory is None:
        raise RuntimeError("import apportion before unpickling an actor")
    return _proxy_factory(cls_name, key, address)


class Held:
    """The worker's result of an actor's task: owns the object; pickled, a proxy."""

    def __init__(self, obj: Any, key: str, address: str) -> None:
        self.obj = obj
        self.key = key
        self.address = address
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:
        return (proxy, (type(self.obj).__name__, self.key, self.address))


def create(cls: type, args: tuple, kwargs: dict) -> Held:
    """The task of ``submit(cls, *args, actor=True)``: makes the object on this worker."""
    key = current_task_key()
    if key is None:
        raise RuntimeError("an actor is made by a task on a worker")
    held = Held(cls(*args, **kwargs), key, get_worker().address)
    _objects[key] = held
    return held


def _held(key: str) -> Held:
    held = _objects.get(key)
    if held is None:
        raise LookupError(
            f"actor {key!r} is gone from its worker (the worker restarted, or every future "
            "and proxy of it was dropped)"
        )
    return held


def call(key: str, name: str, args: tuple, kwargs: dict) -> Any:
    """Run method ``name`` of actor ``key``."""
    held = _held(key)
    with held.lock:
        return getattr(held.obj, name)(*args, **kwargs)


def read(key: str, name: str) -> tuple[bool, Any]:
    """(True, None) for a method of actor ``key``, else (False, the attribute's value)."""
    held = _held(key)
    with held.lock:
        value = getattr(held.obj, name)
    return (True, None) if callable(value) else (False, value)
