"""Actors, as dask.distributed's: ``client.submit(Counter, actor=True).result()`` is a
proxy of one ``Counter`` living on one worker; ``counter.increment()`` runs the method
there and returns an ``ActorFuture`` (``.result()``); ``counter.n`` reads an attribute.
Each proxy holds a future of the task that made the object, which lives on its worker
while any does (apportion/actor_host.py).
"""

from __future__ import annotations

from typing import Any

from apportion import actor_host
from apportion.core import task_host
from apportion.core.context import current_task_key
from apportion.default_client import default_client
from apportion.futures import Future


class ActorFuture:
    """The result of an actor's method call, to come."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> Any:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()

    def __repr__(self) -> str:
        return f"<ActorFuture: {self._future.status}>"


class Actor:
    """A proxy of an object living on a worker (see the module's docstring)."""

    def __init__(self, cls_name: str, key: str, address: str) -> None:
        self._cls_name = cls_name
        self._key = key
        self._address = address
        self._client: Any = None
        self._future: Future | None = None
        # In a client's process, a future of it keeps the object on its worker while this
        # proxy lives. In a worker's, the proxy is unpickled off the task's thread (with
        # the task's arguments, or by a peer): it finds its client on the task's thread,
        # at first use.
        if not task_host.in_a_worker():
            try:
                self._connect()
            except ValueError:  # no client in this process yet: at first use
                pass

    def _connect(self) -> Any:
        if self._client is None:
            if task_host.in_a_worker() and current_task_key() is None:
                raise RuntimeError(
                    f"actor {self._key!r} is used on a worker outside its tasks: use it "
                    "inside a task (there the worker's client calls it)"
                )
            self._client = default_client()
            self._future = self._client.future_table.future(self._key)
        return self._client

    def __reduce__(self) -> Any:
        return (Actor, (self._cls_name, self._key, self._address))

    def _submit(self, func: Any, *args: Any) -> Future:
        future: Future = self._connect().submit(func, *args, workers=[self._address], pure=False)
        return future

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or (task_host.in_a_worker() and current_task_key() is None):
            # A worker's own threads look at values (their size, say) and must not call
            # a worker from there; nor does anyone read private names remotely.
            raise AttributeError(name)
        is_method, value = self._submit(actor_host.read, self._key, name).result()
        if not is_method:
            return value

        def method(*args: Any, **kwargs: Any) -> ActorFuture:
            return ActorFuture(self._submit(actor_host.call, self._key, name, args, kwargs))

        return method

    def __repr__(self) -> str:
        return f"<Actor: {self._cls_name}, key={self._key}>"


actor_host.set_proxy_factory(Actor)
