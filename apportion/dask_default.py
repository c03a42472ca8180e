"""The client as Dask's default scheduler (``dask.config`` ``scheduler``).

Only ``dask.config`` is touched here, and only when Dask is already imported: creating a
client never imports Dask.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apportion.client import Client


class DefaultScheduler:
    """Returned by ``client.as_default()``: Dask computes on the client from then on, or
    only inside ``with client.as_default():``, after which the previous default is back."""

    def __init__(self, client: Client) -> None:
        import dask.config

        self._client = client
        self._previous = dask.config.get("scheduler", None)
        dask.config.set(scheduler=client.get)
        # Graphs built from now on keep their annotations (see dask_graph).
        from apportion.dask_graph import install

        install()

    def __enter__(self) -> Client:
        return self._client

    def __exit__(self, *exc: object) -> None:
        restore(self._client, self._previous)


def on_client_created(client: Client) -> None:
    """Dask users expect a new client to be where ``.compute()`` runs: so it is, when Dask
    is imported (``client.as_default()`` makes it so at any time)."""
    if "dask" in sys.modules:
        DefaultScheduler(client)


def restore(client: Client, previous: Any = None) -> None:
    """Stop being Dask's default scheduler, if this client still is."""
    config = sys.modules.get("dask.config")
    if config is None:
        return
    current = config.get("scheduler", None)  # type: ignore[attr-defined]
    if getattr(current, "__self__", None) is client:
        config.set(scheduler=previous)  # type: ignore[attr-defined]
