"""The client as Dask's default scheduler (``dask.config`` ``scheduler``).

Only ``dask.config`` is touched here, and only when Dask is already imported: creating a
client never imports Dask.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Protocol


class SchedulerClient(Protocol):
    """What Dask computes on: a client's ``get`` (``Client.get``)."""

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any: ...


_SHUFFLE_KEY = "dataframe.shuffle.method"
# Whether the shuffle method in dask.config is the one set here (then unset again when
# no client is Dask's default any more), not the user's.
_shuffle_set_here = False


class _ClientGet:
    """``client.get`` for ``dask.config``, holding the client weakly: Dask's global
    configuration is no reason for a client to live on."""

    def __init__(self, client: SchedulerClient) -> None:
        self._client = weakref.ref(client)

    @property
    def __self__(self) -> SchedulerClient:
        # Dask asks this for the client (its persist), as of a bound method.
        client = self._client()
        if client is None:
            raise RuntimeError(
                "the apportion client that was Dask's default scheduler is gone: create a "
                "Client (or call client.as_default()) before computing"
            )
        return client

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return self.__self__.get(dsk, keys, **kwargs)


class DefaultScheduler:
    """Returned by ``client.as_default()``: Dask computes on the client from then on, or
    only inside ``with client.as_default():``, after which the previous default is back."""

    def __init__(self, client: SchedulerClient) -> None:
        import dask.config

        self._client = client
        self._previous = dask.config.get("scheduler", None)
        dask.config.set(scheduler=_ClientGet(client))
        # dask.compute lowers dataframes before calling client.get: the shuffle method
        # it picks must suit a cluster (see dask_client.cluster_settings).
        global _shuffle_set_here
        if dask.config.get(_SHUFFLE_KEY, None) is None:
            dask.config.set({_SHUFFLE_KEY: "tasks"})
            _shuffle_set_here = True
        # Graphs built from now on keep their annotations (see dask_graph).
        from apportion.dask_graph import install

        install()

    def __enter__(self) -> SchedulerClient:
        return self._client

    def __exit__(self, *exc: object) -> None:
        restore(self._client, self._previous)


def on_client_created(client: SchedulerClient) -> None:
    """Dask users expect a new client to be where ``.compute()`` runs: so it is, when Dask
    is imported (``client.as_default()`` makes it so at any time)."""
    if "dask" in sys.modules:
        DefaultScheduler(client)


def restore(client: object, previous: Any = None) -> None:
    """Stop being Dask's default scheduler, if this client still is."""
    config = sys.modules.get("dask.config")
    if config is None:
        return
    current = config.get("scheduler", None)
    if isinstance(current, _ClientGet) and current._client() in (client, None):
        config.set(scheduler=previous)
        global _shuffle_set_here
        if not isinstance(previous, _ClientGet) and _shuffle_set_here:
            config.set({_SHUFFLE_KEY: None})
            _shuffle_set_here = False
